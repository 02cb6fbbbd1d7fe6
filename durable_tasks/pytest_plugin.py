"""pytest fixtures for testing an application's tasks; opt in from a ``conftest.py``::

    pytest_plugins = ["durable_tasks.pytest_plugin"]

(or ``pytest -p durable_tasks.pytest_plugin``). Nothing is registered unless you do.

In-process, no servers (:mod:`durable_tasks.testing`):

- ``dt_inline``: ``runner = dt_inline(app)`` runs ``app`` inline until the test ends
  (:func:`~durable_tasks.testing.run_inline` with the same keyword arguments).

The real runtime on real servers, as production runs it:

- ``dt_database_url`` (session): ``DT_TEST_DATABASE_URL`` when set, else a SQLite file of the
  session;
- ``dt_redis_url`` (session): ``DT_TEST_REDIS_URL`` when set, else an embedded Valkey started
  for the session and stopped after it;
- ``dt_namespace``: a namespace of the test's own (tests share the servers, not their keys);
  its Redis keys are deleted after the test;
- ``dt_running``: ``dt_running(app)`` runs ``app``'s dispatcher, worker and reaper
  (:meth:`App.run <durable_tasks.App.run>`) in a background thread until the test ends
  (:func:`~durable_tasks.testing.running`).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from .app import App
from .testing import InlineRunner, run_inline, running

__all__ = ["dt_database_url", "dt_inline", "dt_namespace", "dt_redis_url", "dt_running"]


@pytest.fixture(scope="session")
def dt_database_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``DT_TEST_DATABASE_URL``, or a SQLite file shared by the session's tests."""
    url = os.environ.get("DT_TEST_DATABASE_URL")
    if url:
        return url
    return f"sqlite:///{tmp_path_factory.mktemp('durable_tasks') / 'tests.sqlite3'}"


@pytest.fixture(scope="session")
def dt_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``DT_TEST_REDIS_URL``, or an embedded Valkey for the session (stopped after it)."""
    url = os.environ.get("DT_TEST_REDIS_URL")
    if url:
        yield url
        return
    from .embedded import ensure_valkey, stop_valkey

    data_dir: Path = tmp_path_factory.mktemp("durable_tasks_valkey")
    yield ensure_valkey(data_dir)
    stop_valkey(data_dir)


@pytest.fixture
def dt_namespace(dt_redis_url: str) -> Iterator[str]:
    """A namespace no other test uses; its Redis keys are deleted after the test."""
    namespace = f"test-{uuid.uuid4().hex[:12]}"
    yield namespace
    client: Any = redis.Redis.from_url(dt_redis_url)
    try:
        keys = list(client.scan_iter(match=f"dt:{{{namespace}:*", count=500))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def dt_inline() -> Iterator[Callable[..., InlineRunner]]:
    """``dt_inline(app, **options)``: :func:`~durable_tasks.testing.run_inline` until the test ends."""
    with contextlib.ExitStack() as stack:
        yield lambda app, **options: stack.enter_context(run_inline(app, **options))


@pytest.fixture
def dt_running() -> Iterator[Callable[..., None]]:
    """``dt_running(app, **run_options)``: the App's runtime in a thread until the test ends."""
    with contextlib.ExitStack() as stack:

        def start(app: App, **options: Any) -> None:
            stack.enter_context(running(app, **options))

        yield start
