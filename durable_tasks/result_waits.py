"""An App's result waits: the hub of this process (made on the first wait), the read behind
it, and what a wait returns or raises (see :mod:`durable_tasks.waiting` for how it waits)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import redis
from sqlalchemy.exc import SQLAlchemyError

from .errors import DatabaseUnavailableError, TaskCancelledError, TaskFailedError, TaskNotFoundError
from .outcome import TaskOutcome, encode_outcomes
from .records import TaskState
from .store.ids import is_task_id_shaped
from .transport.cluster_url import is_cluster_url, sync_cluster_client
from .transport.keys import outcome_channel
from .waiting import ResultHub, Subscription, await_outcome, wait_outcome

if TYPE_CHECKING:
    from .runtime import Runtime
    from .tasks import TaskHandle

__all__ = ["ResultWaits"]

#: A close's wake-up of the hub (a publish) gives up after this long: the hub's tick ends the wait.
_WAKE_TIMEOUT_S = 0.5


class ResultWaits:
    """Waits for the outcomes of one App's tasks (one per App)."""

    def __init__(self, runtime: Runtime, *, redis_url: Callable[[], str]) -> None:
        self._runtime = runtime
        self._settings = runtime.settings
        self._redis_url = redis_url
        self._registry = runtime.registry
        self._lock = threading.Lock()
        self._hub: tuple[int, ResultHub] | None = None  # (pid, hub): a forked child makes its own

    # -- the hub ---------------------------------------------------------------------------

    def hub(self) -> ResultHub:
        """This process's hub (its thread and subscription start with the first wait)."""
        with self._lock:
            if self._hub is None or self._hub[0] != os.getpid():
                s = self._settings
                hub = ResultHub(
                    channel=outcome_channel(s.namespace),
                    connect=self._subscribe if self._runtime.subscribes_to_results else None,
                    read=self._read,
                    poll_initial=s.result_poll_initial.total_seconds(),
                    poll_max=s.result_poll_max.total_seconds(),
                    wake=self._publish_nothing if self._runtime.subscribes_to_results else None,
                )
                self._hub = (os.getpid(), hub)
            return self._hub[1]

    def _client(self, single_node: dict[str, Any] | None = None, **options: Any) -> Any:
        """A sync client of the App's Redis, a cluster's when it is one, with ``options``
        (``single_node``'s too on a single node)."""
        url = self._redis_url()
        if self._settings.redis_cluster or is_cluster_url(url):
            return sync_cluster_client(url, **options)
        return redis.Redis.from_url(url, **options, **(single_node or {}))

    def _subscribe(self) -> Subscription:
        client = self._client({"health_check_interval": 30}, decode_responses=True, socket_connect_timeout=2)
        pubsub: Subscription = client.pubsub()
        return pubsub

    def _publish_nothing(self) -> None:
        """A message of no outcome on the outcome channel, on a connection of its own: the
        hub's thread, blocked reading its subscription, returns (every subscriber of the
        namespace reads the message and finds nothing in it)."""
        client = self._client(socket_timeout=_WAKE_TIMEOUT_S, socket_connect_timeout=_WAKE_TIMEOUT_S)
        try:
            client.publish(outcome_channel(self._settings.namespace), encode_outcomes((), inline_bytes=0))
        finally:
            client.close()

    def _read(self, task_ids: Any) -> dict[str, TaskOutcome]:
        try:
            return self._runtime.store.read_outcomes(self._settings.namespace, list(task_ids))
        except SQLAlchemyError as exc:
            raise DatabaseUnavailableError(f"cannot read awaited tasks: {type(exc).__name__}") from exc

    def close(self) -> None:
        """Stop this process's hub thread and subscription (a later wait starts them again)."""
        with self._lock:
            held, self._hub = self._hub, None
        if held is not None and held[0] == os.getpid():
            held[1].close()

    # -- waiting ---------------------------------------------------------------------------

    def identity(self, task_id: str) -> tuple[str, int]:
        """The task's name and current generation; TaskNotFoundError if there is none."""
        try:
            found = (
                self._runtime.store.read_identity(self._settings.namespace, task_id)
                if is_task_id_shaped(task_id)
                else None
            )
        except SQLAlchemyError as exc:
            raise DatabaseUnavailableError(f"cannot read task {task_id}: {type(exc).__name__}") from exc
        if found is None:
            raise TaskNotFoundError(f"no task {task_id!r} in namespace {self._settings.namespace!r}")
        return found

    def result(self, handle: TaskHandle, timeout: timedelta | float | None) -> Any:
        """Block until the handle's task settles (see :meth:`TaskHandle.result`)."""
        outcome = wait_outcome(self.hub(), self._read, handle.id, handle.generation, _seconds(timeout))
        return self._value(handle.name, outcome)

    async def wait(self, handle: TaskHandle, timeout: timedelta | float | None) -> Any:
        """Wait on the event loop until the handle's task settles (see :meth:`TaskHandle.wait`)."""
        outcome = await await_outcome(self.hub(), self._read, handle.id, handle.generation, _seconds(timeout))
        return self._value(handle.name, outcome)

    def _value(self, name: str, outcome: TaskOutcome) -> Any:
        if outcome.state == TaskState.SUCCEEDED:
            task = self._registry.get(name)
            raw = outcome.result_json if outcome.result_json is not None else "null"
            return task.result_adapter.validate_json(raw) if task is not None else json.loads(raw)
        error = TaskCancelledError if outcome.state == TaskState.CANCELLED else TaskFailedError
        detail = f": {outcome.error_type}: {outcome.error_message}" if outcome.error_type else ""
        raise error(
            f"task {outcome.task_id} ended {outcome.state}{detail}",
            task_id=outcome.task_id,
            generation=outcome.generation,
            state=str(outcome.state),
            error_type=outcome.error_type,
            error_message=outcome.error_message,
        )


def _seconds(timeout: timedelta | float | None) -> float | None:
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    return None if timeout is None else float(timeout)
