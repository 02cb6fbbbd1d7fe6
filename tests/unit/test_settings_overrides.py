"""``App(**overrides)`` is typed by SettingsOverrides: it must name every setting, with its type."""

from __future__ import annotations

import types
import typing
from datetime import timedelta
from typing import Any, get_type_hints

import pytest
from pydantic import ValidationError

from durable_tasks import App, Settings, SettingsOverrides
from durable_tasks.errors import ConfigurationError

POSITIONAL = {"database_url", "redis_url", "namespace"}  # App's own parameters


def _members(annotation: Any) -> set[Any]:
    """The types a (possibly Annotated, possibly union) annotation admits."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return {m for arg in typing.get_args(annotation) for m in _members(arg)}
    return {typing.get_origin(annotation) or annotation}


def test_every_setting_is_a_keyword_of_app_and_nothing_else() -> None:
    assert set(get_type_hints(SettingsOverrides)) == set(Settings.model_fields) - POSITIONAL


def test_each_keyword_admits_the_settings_type() -> None:
    overrides = get_type_hints(SettingsOverrides)
    for name, field in Settings.model_fields.items():
        if name in POSITIONAL:
            continue
        assert _members(field.annotation) <= _members(overrides[name]), name


def test_the_keywords_reach_the_settings() -> None:
    app = App("sqlite:///unused.sqlite3", "redis://127.0.0.1:1", "kw", lease_timeout=timedelta(seconds=42))
    assert app.settings.lease_timeout == timedelta(seconds=42)


def test_a_redis_url_whose_port_is_not_a_number_is_refused_at_once_without_repeating_it() -> None:
    with pytest.raises(ValidationError) as raised:
        Settings(redis_url="redis://dt:s3cret@None:None/0")
    assert "redis_url's port is not a number" in str(raised.value)
    assert "s3cret" not in str(raised.value)
    with pytest.raises(ValidationError, match="port is not a number"):
        Settings(redis_url="redis+cluster://h1:7000,h2:x/0")
    for fine in ("unix:///tmp/valkey.sock", "rediss+cluster://u:p@h1:7000,h2:7001,h3/0?ssl_cert_reqs=none"):
        assert Settings(redis_url=fine).redis_url == fine


@pytest.mark.parametrize(
    ("concurrency", "handler_threads", "threads"), [(1000, None, 1000), (1000, 512, 512), (100, 512, 100), (64, 8, 8)]
)
def test_a_workers_sync_handlers_get_at_most_handler_threads_and_never_more_than_its_concurrency(
    tmp_path: Any, concurrency: int, handler_threads: int | None, threads: int
) -> None:
    from durable_tasks.worker import Worker

    app = App(f"sqlite:///{tmp_path}/t.sqlite3", "redis://127.0.0.1:1", "kw", handler_threads=handler_threads)
    worker = Worker(app.runtime, concurrency=concurrency)
    assert worker._handler_threads.limit == threads  # the pool tests/unit/test_handler_threads.py holds to it


def test_handler_threads_below_one_is_refused_with_a_typed_error() -> None:
    with pytest.raises(ConfigurationError, match="handler_threads"):
        App("sqlite:///unused.sqlite3", "redis://127.0.0.1:1", "kw", handler_threads=0)
