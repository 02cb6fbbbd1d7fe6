"""The public surface: everything in __all__ exists, and nothing private leaks into it."""

from __future__ import annotations

import durable_tasks


def test_all_names_exist_and_are_public() -> None:
    for name in durable_tasks.__all__:
        assert hasattr(durable_tasks, name), name
        assert not name.startswith("_")


def test_all_is_sorted_and_unique() -> None:
    assert list(durable_tasks.__all__) == sorted(set(durable_tasks.__all__))


def test_every_public_error_derives_from_the_root() -> None:
    for name in durable_tasks.__all__:
        obj = getattr(durable_tasks, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, durable_tasks.DurableTasksError), name


def test_the_issue_contract_names_are_exported() -> None:
    app_methods = {"task", "create_all", "submit", "rerun", "get_task", "dispatch_once", "work", "reap_once", "stats"}
    assert app_methods <= set(dir(durable_tasks.App))
    assert {"App", "TaskContext"} <= set(durable_tasks.__all__)
