"""The processes the CLI starts tune the garbage collector; everything else leaves it alone."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_tasks import App, ConfigurationError
from durable_tasks.cli import serve as serve_module
from durable_tasks.process import gc_thresholds, tune_gc
from durable_tasks.settings import Settings


@pytest.fixture
def pristine_gc() -> Iterator[tuple[int, int, int]]:
    """Python's collector as this test process had it, given back afterwards."""
    threshold = gc.get_threshold()
    gc.unfreeze()
    yield threshold
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_tune_gc_freezes_what_startup_left_and_raises_only_the_young_threshold(
    pristine_gc: tuple[int, int, int],
) -> None:
    tune_gc(Settings(gc_young_threshold=4321))
    assert gc.get_threshold() == (4321, *pristine_gc[1:])
    assert gc.get_freeze_count() > 1000  # the modules, classes and functions loaded so far


def test_a_worker_with_thousands_in_flight_collects_the_middle_generation_less_often(
    pristine_gc: tuple[int, int, int],
) -> None:
    tune_gc(Settings(gc_young_threshold=4321, concurrency=10_000))
    assert gc.get_threshold() == (4321, 100, pristine_gc[2])


@pytest.mark.parametrize(
    ("concurrency", "middle"), [(1, 10), (512, 10), (1_000, 10), (1_999, 19), (5_000, 50), (10_000, 100)]
)
def test_the_middle_threshold_scales_with_concurrency_and_never_drops_below_pythons(
    concurrency: int, middle: int
) -> None:
    assert gc_thresholds(5_000, concurrency, (700, 10, 10)) == (5_000, middle, 10)
    assert gc_thresholds(5_000, concurrency, (700, 200, 7)) == (5_000, 200, 7)


def test_zero_leaves_the_collector_as_it_was(pristine_gc: tuple[int, int, int]) -> None:
    tune_gc(Settings(gc_young_threshold=0))
    assert gc.get_threshold() == pristine_gc
    assert gc.get_freeze_count() == 0


def test_a_negative_threshold_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="gc_young_threshold"):
        App(f"sqlite:///{tmp_path / 'x.db'}", "redis://127.0.0.1:6379/0", gc_young_threshold=-1)


@pytest.mark.parametrize(
    ("settings", "young", "middle"),
    [({"gc_young_threshold": 2345}, 2345, None), ({"concurrency": 5_000}, 5_000, 50)],
    ids=["young threshold", "a worker's concurrency"],
)
def test_the_cli_tunes_the_process_before_it_starts_the_runtime(
    settings: dict[str, Any],
    young: int,
    middle: int | None,
    pristine_gc: tuple[int, int, int],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = App(f"sqlite:///{tmp_path / 'x.db'}", "redis://127.0.0.1:6379/0", **settings)
    seen: list[tuple[int, int, int]] = []

    def runtime_would_start(func: Callable[[], Any]) -> None:
        seen.append(gc.get_threshold())

    monkeypatch.setattr("durable_tasks.cli.serve.anyio.run", runtime_would_start)
    serve_module.serve(app, ["worker"])
    assert seen == [(young, pristine_gc[1] if middle is None else middle, pristine_gc[2])]


def test_building_an_app_does_not_touch_the_collector(pristine_gc: tuple[int, int, int], tmp_path: Path) -> None:
    App(f"sqlite:///{tmp_path / 'x.db'}", "redis://127.0.0.1:6379/0", gc_young_threshold=2345)
    assert gc.get_threshold() == pristine_gc
    assert gc.get_freeze_count() == 0
