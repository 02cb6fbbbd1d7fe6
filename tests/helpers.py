"""Small typed helpers shared by tests.

Waiting: a test never sleeps a fixed time in place of a condition. It waits for the
condition with a deadline (:func:`wait_until`, or :func:`block_until` in a sync test), and it
makes time pass instead of waiting for it: the App's :class:`~durable_tasks.FrozenClock` moves
database leases and due times, and ``XCLAIM ... IDLE`` gives a Redis entry the idle time of a
consumer that stopped long ago (:func:`outlive_lease`).
"""

from __future__ import annotations

import asyncio
import fcntl
import inspect
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import redis
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, FrozenClock, Task, TaskContext, TaskHandle, current_journal
from durable_tasks.clock import system_clock
from durable_tasks.records import attempts_table, outbox_table, steps_table, tasks_table
from durable_tasks.store.engine import read_only
from durable_tasks.store.execution import ClaimRequest, ExecutionClaim
from durable_tasks.transport.keys import CONSUMER_GROUP, QueueKeys
from durable_tasks.transport.messages import StreamEntry, parse_delivery
from durable_tasks.views import QueueStats

#: The repository's root: the working directory of the CLI processes the tests start.
ROOT = Path(__file__).resolve().parents[1]

#: Settings of a test App: leases, polls and backoffs in fractions of a second.
FAST: dict[str, Any] = {
    "heartbeat_interval": timedelta(milliseconds=300),
    "lease_timeout": timedelta(seconds=1),
    "poll_interval": timedelta(milliseconds=100),
    "read_block": timedelta(milliseconds=100),
    "backoff_initial": timedelta(milliseconds=50),
    "backoff_max": timedelta(milliseconds=200),
    "backoff_jitter": timedelta(0),
    "retry_backoff_initial": timedelta(0),
    "retry_backoff_max": timedelta(0),
    "reconcile_grace": timedelta(0),
}
#: How often a wait checks its condition again.
POLL_S = 0.02
#: How often a probe of INFORMATION_SCHEMA.INNODB_TRX (or INNODB_LOCK_WAITS) may ask: InnoDB
#: serves them from one server-wide cache it refreshes only when the last read of it is over
#: 0.1 s old, so a probe asking more often reads its first snapshot for ever.
INNODB_TRX_POLL_S = 0.15
#: The turn file of this machine's readers of INNODB_TRX (:func:`innodb_trx_turn`).
_INNODB_TRX_TURN = Path(tempfile.gettempdir()) / "dt-tests-innodb-trx.turn"


@contextmanager
def innodb_trx_turn() -> Iterator[None]:
    """Around one read of INNODB_TRX (or INNODB_LOCK_WAITS) that must see the server as it is
    now. Its cache is refreshed only when nobody read it for 0.1 s, whoever reads: two probes in
    two test processes, each asking every 0.15 s, kept it stale between them until both timed
    out. So the readers of the test processes on this machine take turns under a file lock, each
    reading no sooner than 0.11 s after the last one finished."""
    with open(_INNODB_TRX_TURN, "a+", encoding="ascii") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)
        try:
            turn.seek(0)
            last = float(turn.read() or 0)
            time.sleep(max(0.0, last + 0.11 - time.time()))
            yield
        finally:
            turn.seek(0)
            turn.truncate()
            turn.write(repr(time.time()))
            turn.flush()
            fcntl.flock(turn, fcntl.LOCK_UN)


#: ``make test-full`` (DT_TEST_FULL=1): the full matrices, where ``make test`` runs a slice.
FULL = os.environ.get("DT_TEST_FULL") == "1"


async def wait_until(
    condition: Callable[[], object | Awaitable[object]],
    *,
    timeout: float = 30,
    what: str | None = None,
    poll: float = POLL_S,
) -> None:
    """Return as soon as ``condition()`` (sync or async) is true, asking every ``poll`` seconds;
    fail the test, naming ``what``, if it is still false after ``timeout`` seconds."""
    deadline = anyio.current_time() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        if anyio.current_time() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        await anyio.sleep(poll)


def block_until(
    condition: Callable[[], object], *, timeout: float = 30, what: str | None = None, poll: float = POLL_S
) -> None:
    """:func:`wait_until` for a sync test (no event loop running)."""
    anyio.run(partial(wait_until, condition, timeout=timeout, what=what, poll=poll))


async def run_until(app: App, done: Callable[[], object], *, timeout: float = 60, reaper: bool = True) -> None:
    """Run the App's loops (``app.run``) until ``done()`` holds, failing after ``timeout``
    seconds, then stop them the way a deployment does (in-flight tasks finish)."""
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(app.run, reaper=reaper, stop=stop))
        await wait_until(done, timeout=timeout, what=f"{getattr(done, '__name__', 'the condition')} while running")
        stop.set()


async def aturns_true(condition: Callable[[], object | Awaitable[object]], *, timeout: float) -> bool:
    """Whether ``condition()`` (sync or async) turns true within ``timeout`` seconds, for a test
    that reports a timeout itself (with a log's tail, say)."""
    with anyio.move_on_after(timeout):
        await wait_until(condition, timeout=timeout + 1)
        return True
    return False


def turns_true(condition: Callable[[], object], *, timeout: float) -> bool:
    """Whether ``condition()`` turns true within ``timeout`` seconds, for sync code that acts on
    the answer (a teardown that escalates to SIGKILL, say) rather than failing the test."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


async def make_idle(app: App, idle: timedelta) -> int:
    """Give every pending entry of the app's queues the idle time ``idle``, as if its consumer
    had stopped that long ago; returns how many entries there were.

    ``XCLAIM ... IDLE`` to the consumer that holds the entry (so nothing changes hands), with
    ``JUSTID`` so that Redis's delivery counter is not touched.
    """
    transport = app.runtime.transport()
    client: Any = transport.client
    aged = 0
    for queue in app.runtime.queues():
        for stream, _, _ in transport.streams(queue):
            if not await client.exists(stream):
                continue
            pending = await client.xpending_range(stream, CONSUMER_GROUP, min="-", max="+", count=100_000)
            idle_ms = int(idle.total_seconds() * 1000)
            for p in pending:
                await client.xclaim(
                    stream, CONSUMER_GROUP, p["consumer"], 0, [p["message_id"]], idle=idle_ms, justid=True
                )
            aged += len(pending)
    return aged


async def outlive_lease(app: App) -> int:
    """Make the app's workers look dead for longer than the lease, without waiting: the App's
    FrozenClock moves past the lease (database leases expire) and every pending entry looks
    idle that long (:func:`make_idle`). Returns how many entries are pending."""
    clock = app.clock
    assert isinstance(clock, FrozenClock), "outlive_lease needs an App built with clock=FrozenClock()"
    gone = app.settings.lease_timeout + timedelta(seconds=1)
    # From the wall clock if it is ahead: a worker in another process took its lease on it.
    clock.now = max(clock.now, system_clock()) + gone
    return await make_idle(app, gone)


@contextmanager
def private_schema(postgres_url: str, prefix: str = "dt_test") -> Iterator[str]:
    """A new, empty schema on the PostgreSQL server of ``postgres_url``: yields the URL whose
    connections use it (``search_path``), and drops it with everything in it afterwards."""
    base = sa.make_url(postgres_url).difference_update_query(["options"])
    if base.drivername == "postgresql":
        base = base.set(drivername="postgresql+psycopg")
    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(base)
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        try:
            yield base.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)
        finally:
            with admin.begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
    finally:
        admin.dispose()


def delete_namespace_keys(redis_url: str, *namespaces: str) -> int:
    """Delete the Redis keys of ``namespaces`` (and nothing else: the server is shared) in one
    walk of the server's keys; how many went."""
    wanted = {f"dt:{{{namespace}:" for namespace in namespaces}
    if not wanted:
        return 0
    match = f"{next(iter(wanted))}*" if len(wanted) == 1 else "dt:{*"  # one: Redis filters
    client = redis.Redis.from_url(redis_url)
    deleted = 0
    try:
        for key in client.scan_iter(match=match, count=1000):
            name = key.decode() if isinstance(key, bytes) else str(key)
            if name[: name.find(":", 4) + 1] in wanted:
                deleted += int(client.delete(key))
    finally:
        client.close()
    return deleted


def submit(app: App, task: Task[Any, Any] | str, payload: Any, **options: Any) -> str:
    """Submit one ``task`` in a transaction of its own, committed; its id. ``options`` are
    :meth:`App.submit`'s."""
    [handle] = submit_all(app, task, [payload], **options)
    return handle.id


def submit_all(
    app: App, task: Task[Any, Any] | str, payloads: Iterable[Any], *, keys: Iterable[str | None] = (), **options: Any
) -> list[TaskHandle]:
    """Submit one ``task`` per payload in one committed transaction (with ``keys`` as their
    idempotency keys, in order); their handles, in order."""
    key_list = list(keys)
    with Session(app.engine) as session:
        handles = [
            app.submit(session, task, payload, idempotency_key=key_list[i] if key_list else None, **options)
            for i, payload in enumerate(payloads)
        ]
        session.commit()
    return handles


def keys(app: App, queue: str = "jobs") -> QueueKeys:
    """The Redis keys of ``queue`` in the app's namespace."""
    return QueueKeys(app.settings.namespace, queue)


async def entries(app: App, stream: str) -> list[tuple[str, dict[str, str]]]:
    """Every entry of ``stream`` as (id, fields)."""
    raw: Any = await app.runtime.transport().client.xrange(stream)
    return [(str(i), {str(k): str(v) for k, v in (f or {}).items()}) for i, f in raw or []]


async def claim_entry(
    app: App, entry: StreamEntry, worker_id: str, *, lease: timedelta | None = None
) -> ExecutionClaim | None:
    """Take the execution fence for ``entry`` as worker ``worker_id`` would (None: refused)."""
    d = parse_delivery(entry.fields)
    [claim] = await app.runtime.store.claim_executions(
        app.settings.namespace,
        [ClaimRequest(d.task_id, d.generation, d.delivery)],
        worker_id=worker_id,
        now=app.clock(),
        lease=lease or app.settings.lease_timeout,
    )
    return claim if isinstance(claim, ExecutionClaim) else None


async def die_running_alone(app: App, entry: StreamEntry, worker_id: str = "doomed-worker") -> ExecutionClaim:
    """Claim ``entry`` and mark its attempt solo, as a worker does right before it runs a
    suspect, and then do nothing more (the worker "died"): once the lease runs out the reaper
    charges the loss to the task (with max_deliveries=1, it is dead-lettered)."""
    claim = await claim_entry(app, entry, worker_id)
    assert claim is not None
    await app.runtime.store.mark_solo(claim, now=app.clock())
    return claim


def queue_busy(stats: QueueStats) -> bool:
    """Whether a queue's statistics say work is left (what a caller waiting for a drain reads)."""
    return bool(stats.outbox_backlog or stats.queue_delay_s or stats.running or stats.pel_size or stats.stream_lag)


async def run_until_quiet(app: App, timeout: float = 60) -> None:
    """Run a dispatcher and a worker until nothing is left to do, twice in a row: no pending
    outbox row, no task waiting in a stream or running, no unacknowledged entry.

    A loop of short ``work(timeout=...)`` calls is not a drain: a call that times out cancels
    the tasks still running and leaves their entries pending for a reaper, so on a loaded
    machine the loop could stop with work left. Here the worker runs until the queues are
    quiet and then stops the way a deployment does (in-flight tasks finish).
    """
    stop = anyio.Event()
    with anyio.fail_after(timeout):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(app.run, reaper=False, stop=stop))
            quiet = 0
            while quiet < 2:
                await anyio.sleep(0.1)
                stats = (await app.stats()).values()
                busy = any(queue_busy(s) for s in stats)
                quiet = 0 if busy else quiet + 1
            stop.set()


def first_attempt(
    namespace: str, task_id: str, now: datetime, *, name: str = "noop", queue: str = "jobs"
) -> ExecutionClaim:
    """The claim of a task's first attempt (generation 0, delivery 0) as a worker holds it, for
    calling a store's statements directly."""
    return ExecutionClaim(
        namespace=namespace, task_id=task_id, name=name, queue=queue, generation=0, attempt=1, delivery=0,
        max_attempts=3, failures=0, payload_json="0", idempotency_key=None, traceparent=None, shadow=False,
        created_at=now, enqueued_at=now, worker_id="w",
    )  # fmt: skip


async def run_tree(app: App, run_id: str) -> str:
    """What a test that expected a run to finish prints when it did not: the run and its
    children (state, generation, delivery, attempts), the run's journal, every outbox row of
    them, and the queues' statistics now. For a failure seen only in full runs."""
    t, s, o, a = tasks_table.c, steps_table.c, outbox_table.c, attempts_table.c
    with app.runtime.store.read_engine.connect() as conn:
        ids = [run_id, *conn.execute(sa.select(t.id).where(t.parent_id == run_id).order_by(t.created_at)).scalars()]
        lines = [
            f"task {r.id} {r.name} {r.state} g{r.generation} d{r.delivery} a{r.attempt} enq={r.enqueued_at}"
            for r in conn.execute(sa.select(tasks_table).where(t.id.in_(ids)).order_by(t.created_at))
        ]
        lines += [
            f"step g{r.generation} {r.slot} done={r.done} child={r.child_task_id} state={r.child_state}"
            for r in conn.execute(sa.select(steps_table).where(s.task_id == run_id).order_by(s.id))
        ]
        lines += [
            f"outbox {r.task_id} g{r.generation} d{r.delivery} {r.state} due={r.next_attempt_at} sent={r.sent_at}"
            for r in conn.execute(sa.select(outbox_table).where(o.task_id.in_(ids)).order_by(o.id))
        ]
        lines += [
            f"attempt {r.task_id} g{r.generation} a{r.attempt} {r.outcome} {r.retry_reason or ''}"
            for r in conn.execute(sa.select(attempts_table).where(a.task_id.in_(ids)).order_by(a.id))
        ]
    lines += [f"stats {queue}: {stats}" for queue, stats in (await app.stats()).items()]
    return "\n".join(lines)


@contextmanager
def cli_process(*args: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
    """``python -m durable_tasks ARGS`` as a child process from the repository's root (output
    piped as text, stderr into stdout; ``env`` default: this process's); killed when the block
    leaves it still running."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_tasks", *args],
        cwd=ROOT,
        env=dict(os.environ) if env is None else env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def assert_running(proc: subprocess.Popen[str]) -> None:
    """Fail with the process's output if it has exited."""
    assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""


def child_env_of(app: App, data_dir: Path) -> dict[str, str]:
    """The environment of a child process that runs ``app``'s runtime: this process's without
    its ``DT_*`` and ``AGENT_*`` variables, plus the App's database, Redis and namespace, the
    repository on ``PYTHONPATH``, and leases, polls and backoffs in fractions of a second."""
    s = app.settings
    assert s.database_url is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DT_", "AGENT_"))}
    return env | {
        "PYTHONPATH": str(ROOT),
        "DT_DATABASE_URL": s.database_url,
        "DT_REDIS_URL": app.redis_url,
        "DT_NAMESPACE": s.namespace,
        "DT_DATA_DIR": str(data_dir),
        "DT_LEASE_TIMEOUT": "1",
        "DT_HEARTBEAT_INTERVAL": "0.3",
        "DT_REAPER_INTERVAL": "0.5",
        "DT_POLL_INTERVAL": "0.1",
        "DT_READ_BLOCK": "0.1",
        "DT_RETRY_BACKOFF_INITIAL": "0",
        "DT_RETRY_BACKOFF_MAX": "0",
        "DT_BACKOFF_JITTER": "0",
    }


def doubling_app(make_app: Callable[..., App], **overrides: Any) -> App:
    """A test App (``make_app(**overrides)``) with one task, ``double`` on queue ``jobs``:
    ``n -> 2 * n``."""
    app = make_app(**overrides)

    @app.task(name="double", queue="jobs")
    def double(ctx: TaskContext[int], n: int) -> int:
        return 2 * n

    return app


def register_fan(app: App, branches: int) -> Task[int, int]:
    """Register ``double`` (``n -> 2 * n``) and ``fan`` on queue ``jobs``: ``fan(n)`` starts
    ``double(n + i)`` for each of ``branches`` branches in parallel (each branch asks for the
    journal itself, in a task of ``asyncio.gather``'s) and returns the sum; returns ``fan``."""

    @app.task(name="double", queue="jobs")
    def double(ctx: TaskContext[int], n: int) -> int:
        return 2 * n

    @app.task(name="fan", queue="jobs")
    async def fan(ctx: TaskContext[int], n: int) -> int:
        async def branch(i: int) -> int:
            journal = current_journal()
            assert journal is not None
            return int(await journal.child(double, n + i, label=f"double:{i}"))

        return sum(await asyncio.gather(*(branch(i) for i in range(branches))))

    return fan


@contextmanager
def statements_on(engine: sa.Engine, keep: Callable[[str], bool] = lambda _statement: True) -> Iterator[list[str]]:
    """The SQL statements ``engine`` sends while the block runs (those ``keep`` accepts)."""
    seen: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if keep(statement):
            seen.append(statement)

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


def reads_tasks(statement: str) -> bool:
    """Whether ``statement`` reads dt_tasks (a BEGIN, as SQLite's driver sends, is not a read)."""
    return statement.lstrip().upper().startswith("SELECT") and "dt_tasks" in statement


def outbox_row(app: App, task_id: str) -> sa.Row[Any]:
    """The task's one outbox row, as the database has it now."""
    with read_only(app.engine).connect() as conn:
        return conn.execute(sa.select(outbox_table).where(outbox_table.c.task_id == task_id)).one()


def task_row(app: App, task_id: str) -> sa.Row[Any]:
    """The task's row, as the database has it now."""
    with read_only(app.engine).connect() as conn:
        return conn.execute(sa.select(tasks_table).where(tasks_table.c.id == task_id)).one()
