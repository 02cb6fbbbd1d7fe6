"""The worker's side of flow control: ask Redis which deliveries may start (admit.lua), step
the others aside (a new delivery due later, in the database), hold and free concurrency slots.

A worker whose tasks declare no limit never calls any of this (:attr:`FlowGate.active`): the
path of a task without limits has no extra round trip.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from ..store.deferral import Deferral
from ..store.execution import ExecutionClaim
from ..transport.messages import Delivery, StreamEntry
from .policy import CONCURRENCY_RETRY, Limit, TaskFlow

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from ..clock import Clock
    from ..settings import Settings
    from ..store import Store
    from ..tasks import Task
    from ..transport.streams import RedisStreamsTransport


class FlowRuntime(Protocol):
    """What the gate uses of the :class:`~durable_tasks.runtime.Runtime` that owns it."""

    settings: Settings
    clock: Clock
    registry: Mapping[str, Task[Any, Any]]

    @property
    def store(self) -> Store: ...

    def transport(self) -> RedisStreamsTransport: ...


__all__ = ["FlowGate", "FlowKeys", "FlowRuntime", "Holder", "holder"]

logger = logging.getLogger(__name__)

#: Tries of one deferral transaction (a deadlock with a dispatcher's mark is rolled back whole).
_DEFER_TRIES = 3


class FlowKeys:
    """Redis keys of flow control in one namespace; all share the tag ``{<ns>:flow}``."""

    def __init__(self, namespace: str) -> None:
        self.tag = f"{{{namespace}:flow}}"

    @property
    def settings(self) -> str:
        """The hash of run-time limit settings (limit name -> JSON)."""
        return f"dt:{self.tag}:limits"

    def tat(self, limit: str) -> str:
        """A rate limit's theoretical arrival time (GCRA)."""
        return f"dt:{self.tag}:tat:{limit}"

    def slots(self, limit: str, key: str | None) -> str:
        """A concurrency limit's running attempts for one concurrency key."""
        return f"dt:{self.tag}:slots:{limit}:{key or ''}"


#: One delivery, which holds slots: (task id, generation, delivery).
Holder = tuple[str, int, int]


def holder(d: Delivery | ExecutionClaim) -> Holder:
    """The delivery a claim or an entry is (a rerun's generation beside the old one is another)."""
    return (d.task_id, d.generation, d.delivery)


def member(d: Delivery) -> str:
    """What holds a slot: one delivery (admitting it again after a crash takes no second slot)."""
    return f"{d.task_id}:{d.generation}:{d.delivery}"


class FlowGate:
    """Admission for the deliveries of one worker."""

    def __init__(self, runtime: FlowRuntime) -> None:
        self.runtime = runtime
        self.keys = FlowKeys(runtime.settings.namespace)
        self._held: dict[Holder, list[tuple[str, str]]] = {}  # delivery -> (slots key, member)
        self._active = False
        self._active_at = -1
        self._background: set[asyncio.Task[None]] = set()  # slot releases, the renewal loop
        self._renewing = False

    def flow_of(self, name: str) -> TaskFlow | None:
        """The flow declaration of task ``name`` when it has limits (else None)."""
        task = self.runtime.registry.get(name)
        return task.flow if task is not None and task.flow.limited else None

    @property
    def active(self) -> bool:
        """Whether any registered task has a limit (looked at again when tasks are added)."""
        registry = self.runtime.registry
        if self._active_at != len(registry):
            self._active = any(t.flow.limited for t in registry.values())
            self._active_at = len(registry)
        return self._active

    @property
    def holding(self) -> bool:
        """Whether this worker holds any concurrency slot."""
        return bool(self._held)

    async def admit(self, deliveries: Sequence[Delivery]) -> list[float]:
        """Per delivery: 0 if it may start now (its slots are taken), else the seconds to wait.
        Deliveries of tasks without limits are admitted without asking."""
        keys: list[str] = [self.keys.settings]
        index: dict[str, int] = {}
        requests: list[dict[str, Any]] = []
        asked: list[int] = []
        lease_ms = int(self.runtime.settings.lease_timeout.total_seconds() * 1000)

        def key_index(key: str) -> int:
            if key not in index:
                keys.append(key)
                index[key] = len(keys)  # Lua's KEYS are 1-based
            return index[key]

        for i, d in enumerate(deliveries):
            flow = self.flow_of(d.name)
            if flow is None:
                continue
            checks: list[list[Any]] = []
            for limit in flow.limits:
                checks += _checks(limit, d, self.keys, key_index)
            requests.append({"m": member(d), "c": checks})
            asked.append(i)
        waits = [0.0] * len(deliveries)
        if not requests:
            return waits
        args: list[str | int] = [lease_ms, int(CONCURRENCY_RETRY.total_seconds() * 1000), json.dumps(requests)]
        replies = await self.runtime.transport().run_script("admit", keys, args)
        for i, request, wait_ms in zip(asked, requests, replies, strict=True):
            if int(wait_ms) > 0:
                waits[i] = int(wait_ms) / 1000 * (1 + random.random() / 10)
            else:
                slots = [(keys[c[1] - 1], request["m"]) for c in request["c"] if c[0] == "c"]
                if slots:
                    self._held[holder(deliveries[i])] = slots
        if self._held and not self._renewing:
            self._renewing = True
            self._spawn(self._renew())
        return waits

    async def defer(self, deliveries: Sequence[tuple[Delivery, float]]) -> None:
        """Step refused deliveries aside: each gets a new delivery due after its wait."""
        now = self.runtime.clock()
        rows = [Deferral(d.task_id, d.generation, d.delivery, now + timedelta(seconds=w)) for d, w in deliveries]
        await self.runtime.store.defer_deliveries(self.runtime.settings.namespace, rows, now=now)

    async def _step_aside(
        self,
        refused: Sequence[tuple[tuple[StreamEntry, Delivery, Span], float]],
        ack: Callable[[Sequence[tuple[str, str]]], Awaitable[None]],
    ) -> bool:
        """Defer refused deliveries, then acknowledge their entries; True when both held. A
        deferral is one transaction: tried again after a conflict (a deadlock) rolled it back."""
        for attempt in range(_DEFER_TRIES):
            try:
                await self.defer([(d, wait) for (_, d, _), wait in refused])
                await ack([(e.stream, e.entry_id) for (e, _, _), _ in refused])
                return True
            except Exception as exc:  # pending: the reaper redelivers them, still uncounted
                if attempt + 1 == _DEFER_TRIES:
                    logger.warning("deferring %d deliveries over their limits failed: %s", len(refused), exc)
                await anyio.sleep(0.05 * (attempt + 1))
        return False

    def release_soon(self, holders: Iterable[Holder]) -> None:
        """Free the slots of these deliveries (their attempts ended, or never started): they are
        no longer held (nor renewed) when this returns, and leave Redis in the background, in a
        task of the event loop that outlives a cancelled caller. Nothing when they hold none (a
        task without a concurrency limit costs a dictionary lookup)."""
        if self._held:
            slots = [slot for who in holders for slot in self._held.pop(who, ())]
            if slots:
                self._spawn(self._free(slots))

    def release_when_done(self, task: asyncio.Task[Any], claim: ExecutionClaim) -> None:
        """Free the slots of ``claim``'s delivery when ``task`` (its attempt) ends however it
        ends, cancelled before it ever ran included (a ``finally`` in it would not run then)."""
        if self._held and (who := holder(claim)) in self._held:
            task.add_done_callback(lambda _: self.release_soon([who]))

    def unclaimed(self, batch: Sequence[tuple[Any, Delivery, Any]], claims: Sequence[object] | None = None) -> None:
        """Free the slots of admitted deliveries that will not run: those whose claim was refused
        (stale, no task), or all of them when none was claimed (``claims`` None)."""
        if self._held:
            outcomes = [None] * len(batch) if claims is None else claims
            self.release_soon(
                holder(d) for (_, d, _), c in zip(batch, outcomes, strict=True) if not isinstance(c, ExecutionClaim)
            )

    async def release(self, holders: Sequence[Holder]) -> None:
        """Free the slots of these deliveries now."""
        await self._free([slot for who in holders for slot in self._held.pop(who, ())])

    async def _free(self, slots: Sequence[tuple[str, str]]) -> None:
        if not slots:
            return
        pipe = self.runtime.transport().client.pipeline(transaction=False)
        for key, who in slots:
            pipe.zrem(key, who)
        try:
            await pipe.execute()
        except Exception as exc:  # the slots free themselves when their lease runs out
            logger.warning("freeing %d concurrency slots failed (%s); they expire with their lease", len(slots), exc)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _renew(self) -> None:
        """Keep held slots alive while their attempts run, as their leases are renewed
        (renew_slots.lua, on the server's clock like admission); ends when none is held."""
        lease_ms = int(self.runtime.settings.lease_timeout.total_seconds() * 1000)
        try:
            while self._held:
                await anyio.sleep(lease_ms / 3000)
                held = [slot for slots in self._held.values() for slot in slots]
                if not held:
                    break
                try:
                    await self.runtime.transport().run_script(
                        "renew_slots", [key for key, _ in held], [lease_ms, *(who for _, who in held)]
                    )
                except Exception as exc:  # they expire with their lease; the next round tries again
                    logger.warning("renewing %d concurrency slots failed: %s", len(held), exc)
        finally:
            self._renewing = False

    async def admit_entries(
        self,
        batch: list[tuple[StreamEntry, Delivery, Span]],
        end: Callable[..., None],
        ack: Callable[[Sequence[tuple[str, str]]], Awaitable[None]],
    ) -> list[tuple[StreamEntry, Delivery, Span]]:
        """The part of a read batch that may start now; the rest is stepped aside (deferred,
        then acknowledged, ended ``deferred``) or, on an outage, left pending for the reaper.
        Without any limit declared, the batch as it is, with no round trip."""
        if not self.active:
            return batch
        try:
            waits = await self.admit([d for _, d, _ in batch])
        except Exception as exc:
            logger.warning("flow admission failed (%s); %d entries stay pending", exc, len(batch))
            for _, _, span in batch:
                end(span, "unadmitted", settled=False)
            return []
        refused = [(item, wait) for item, wait in zip(batch, waits, strict=True) if wait > 0]
        admitted = [item for item, wait in zip(batch, waits, strict=True) if wait == 0]
        if refused:
            try:
                settled = await self._step_aside(refused, ack)
            except BaseException:  # cancelled (the worker stops): the admitted never reach it
                self.release_soon(holder(d) for _, d, _ in admitted)
                raise
            for (_, _, span), _ in refused:
                end(span, "deferred", settled=settled)
        return admitted


def _checks(limit: Limit, d: Delivery, keys: FlowKeys, key_index: Any) -> list[list[Any]]:
    out: list[list[Any]] = []
    if limit.rate is not None:
        out.append(["r", key_index(keys.tat(limit.name)), limit.name, limit.rate.interval_ms, limit.burst])
    if limit.concurrency is not None:
        out.append(["c", key_index(keys.slots(limit.name, d.concurrency_key)), limit.name, limit.concurrency, 0])
    return out
