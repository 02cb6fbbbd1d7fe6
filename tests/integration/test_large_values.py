"""Values up to the size the settings allow are stored whole on every database: a payload and a
result at ``max_payload_bytes``, many large results in one group commit, and a journal step's
result past 64 KiB; a step's result or a signal's payload over the limit is refused in one line.

MySQL's TEXT holds 65,535 bytes, less than a payload may have, and a server without strict
mode cuts a longer value short without a word. So on MySQL the JSON columns are MEDIUMTEXT
(16 MiB), a group commit splits its results into statements that fit the server's
``max_allowed_packet``, a ``max_payload_bytes`` above what MEDIUMTEXT holds is refused when
the App opens its database, and doctor reports a packet or an sql_mode that would not do."""

from __future__ import annotations

import base64
import json
import random
import time
import tracemalloc
from collections.abc import Callable
from datetime import timedelta

import anyio
import pytest
import sqlalchemy as sa
from sqlmodel import Session

from durable_tasks import App, ConfigurationError, SignalError, TaskContext, TaskState, current_journal
from durable_tasks.records import StepRecord, payloads_table, tasks_table
from durable_tasks.store.engine import read_only
from durable_tasks.store.execution import ClaimRequest, ExecutionClaim
from durable_tasks.store.mysql import MEDIUMTEXT_BYTES
from durable_tasks.store.mysql import _problems as mysql_problems
from durable_tasks.store.payloads import INLINE_PAYLOAD_BYTES
from tests.helpers import run_until, run_until_quiet

pytestmark = pytest.mark.anyio

steps = StepRecord.__table__.c  # type: ignore[attr-defined]


def text_of(size: int, seed: int) -> str:
    """``size`` characters that do not compress (random bytes in base64)."""
    return base64.b64encode(random.Random(seed).randbytes(size))[:size].decode()


async def test_a_payload_and_a_result_at_the_size_limit_are_stored_whole(app: App) -> None:
    body = text_of(app.settings.max_payload_bytes - 8, seed=1)  # its JSON: a list of one string

    @app.task(name="reverse", queue="large")
    def reverse(ctx: TaskContext[list[str]], parts: list[str]) -> list[str]:
        return [parts[0][::-1]]

    with Session(app.engine) as session:
        handle = app.submit(session, "reverse", [body])
        session.commit()
    assert await app.dispatch_once() == 1
    assert await app.work(max_tasks=1, timeout=timedelta(seconds=60)) == 1
    info = app.get_task(handle.id)
    assert info.state == TaskState.SUCCEEDED
    assert info.payload == [body]
    assert info.result == [body[::-1]]


async def test_a_group_commit_of_large_results_writes_them_all(make_app: Callable[..., App]) -> None:
    """Twenty results of 900 KB go in one group commit: 18 MB, over MariaDB's max_allowed_packet
    (16 MiB) if it were one statement."""
    app = make_app(concurrency=32)
    started, all_started = [0], anyio.Event()
    try:

        @app.task(name="large_result", queue="large")
        async def large_result(ctx: TaskContext[int], seed: int) -> str:
            result = text_of(900_000, seed)
            started[0] += 1
            if started[0] == 20:
                all_started.set()
            await all_started.wait()  # all twenty end together: one group commit
            return result

        with Session(app.engine) as session:
            handles = [app.submit(session, "large_result", seed) for seed in range(20)]
            session.commit()
        assert await app.dispatch_once() == 20
        assert await app.work(max_tasks=20, timeout=timedelta(seconds=120)) == 20
        for seed, handle in enumerate(handles):
            info = app.get_task(handle.id)
            assert (info.state, info.attempt) == (TaskState.SUCCEEDED, 1)
            assert info.result == text_of(900_000, seed)
    finally:
        await app.aclose()


async def test_a_step_result_past_64_kib_is_recorded_whole_and_replayed(app: App) -> None:
    long = text_of(300_000, seed=2)
    seen: list[tuple[int, str]] = []

    @app.task(name="stepper", queue="large", max_attempts=2)
    async def stepper(ctx: TaskContext[int], n: int) -> int:
        assert ctx.journal is not None
        value = await ctx.journal.step("fetch", lambda: long if ctx.attempt == 1 else "computed again")
        seen.append((ctx.attempt, value))
        if ctx.attempt == 1:
            raise RuntimeError("failed after the step: the next attempt replays it")
        return len(value)

    with Session(app.engine) as session:
        handle = app.submit(session, "stepper", 1)
        session.commit()
    await run_until(app, lambda: app.get_task(handle.id).state == TaskState.SUCCEEDED)
    assert seen == [(1, long), (2, long)]
    assert app.get_task(handle.id).result == len(long)
    with read_only(app.engine).connect() as conn:
        stored = conn.execute(sa.select(steps.result).where(steps.task_id == handle.id)).scalar_one()
    assert stored == f'"{long}"'


@pytest.mark.parametrize("database_url", ["mysql"], indirect=True)  # the others store up to 1 GB
def test_a_payload_limit_over_what_mysql_stores_is_refused_in_one_line(
    database_url: str, redis_url: str, namespace: str
) -> None:
    over = App(database_url, redis_url, namespace, max_payload_bytes=MEDIUMTEXT_BYTES + 1)
    with pytest.raises(ConfigurationError, match="set DT_MAX_PAYLOAD_BYTES to 16777215 or less") as raised:
        over.create_all()
    assert "\n" not in str(raised.value)
    at_limit = App(database_url, redis_url, namespace, max_payload_bytes=MEDIUMTEXT_BYTES)
    at_limit.create_all()
    assert at_limit.runtime.store_opened
    at_limit.runtime.store.close()


@pytest.mark.parametrize("database_url", ["mysql"], indirect=True)
async def test_doctor_says_when_a_value_of_the_limit_does_not_fit_the_servers_packet(
    database_url: str, redis_url: str, namespace: str
) -> None:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            packet = int(conn.execute(sa.text("SELECT @@max_allowed_packet")).scalar_one())
    finally:
        engine.dispose()
    if packet >= MEDIUMTEXT_BYTES + 64 * 1024:  # MySQL 8's default is 64 MiB
        pytest.skip(f"max_allowed_packet is {packet:,} bytes: every max_payload_bytes MySQL stores fits in it")
    for limit, expected in ((1024 * 1024, False), (min(packet, MEDIUMTEXT_BYTES), True)):
        app = App(database_url, redis_url, namespace, max_payload_bytes=limit)
        try:
            problems = {p.check: p for p in (await app.runtime.store.facts()).problems}
        finally:
            await app.aclose()
        assert ("max_allowed_packet" in problems) is expected, (limit, packet)
        if expected:
            assert problems["max_allowed_packet"].severe
            assert "Raise max_allowed_packet" in problems["max_allowed_packet"].message


@pytest.mark.parametrize("database_url", ["mysql"], indirect=True)
def test_doctor_says_when_the_server_would_cut_a_long_value_short(database_url: str) -> None:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            assert "sql_mode" not in {p.check for p in mysql_problems(conn, 1024 * 1024)}
            conn.execute(sa.text("SET SESSION sql_mode = 'NO_ENGINE_SUBSTITUTION'"))
            [problem] = [p for p in mysql_problems(conn, 1024 * 1024) if p.check == "sql_mode"]
    finally:
        engine.dispose()
    assert problem.severe
    assert "Add STRICT_TRANS_TABLES" in problem.message


async def test_a_step_result_over_the_limit_fails_the_task_in_one_line_and_records_nothing(
    make_app: Callable[..., App],
) -> None:
    app = make_app(max_payload_bytes=100_000)
    try:

        @app.task(name="too_long_step", queue="large", max_attempts=3)
        async def too_long_step(ctx: TaskContext[int], n: int) -> int:
            assert ctx.journal is not None
            return len(await ctx.journal.step("fetch", lambda: text_of(100_000, seed=3)))

        with Session(app.engine) as session:
            handle = app.submit(session, "too_long_step", 1)
            session.commit()
        await run_until(app, lambda: app.get_task(handle.id).state == TaskState.FAILED)
        info = app.get_task(handle.id)
    finally:
        await app.aclose()
    assert (info.error_type, info.attempt) == ("ResultNotSerializableError", 1)  # not retried: it would fail again
    assert info.error_message is not None
    assert "over max_payload_bytes=100000" in info.error_message
    assert "\n" not in info.error_message
    with read_only(app.engine).connect() as conn:
        assert conn.execute(sa.select(steps.slot).where(steps.task_id == handle.id)).all() == []


async def test_a_signal_over_the_limit_is_refused_and_delivers_nothing(make_app: Callable[..., App]) -> None:
    app = make_app(max_payload_bytes=1_000)
    try:

        @app.task(name="waits", queue="large")
        async def waits(ctx: TaskContext[int], n: int) -> str:
            assert ctx.journal is not None
            return str(await ctx.journal.wait_signal("answer"))

        with Session(app.engine) as session:
            handle = app.submit(session, "waits", 1)
            session.commit()
        with pytest.raises(SignalError, match="over max_payload_bytes=1000") as raised:
            app.signal(handle.id, "answer", text_of(1_000, seed=4))
        assert "\n" not in str(raised.value)
        assert app.signal(handle.id, "answer", "short")  # the refused one took no slot: this one is first
    finally:
        await app.aclose()


async def test_a_dispatcher_pass_reads_large_payloads_one_at_a_time_and_still_checks_them(
    make_app: Callable[..., App],
) -> None:
    """The claim carries payloads up to INLINE_PAYLOAD_BYTES (a pass of 500 payloads of 1 MB
    held 500 MB, and the dispatcher peaked at 1 GB); a larger one is read alone when checked,
    so a stored payload that no longer validates is still dead-lettered, with the reason."""
    app = make_app(publish_on_commit=False)
    try:

        @app.task(name="echo", queue="large")
        def echo(ctx: TaskContext[list[str]], parts: list[str]) -> int:
            return len(parts[0])

        large, small = text_of(INLINE_PAYLOAD_BYTES + 1, seed=5), "short"
        with Session(app.engine) as session:
            handles = [app.submit(session, "echo", [body]) for body in (large, small, large)]
            session.commit()
        with app.engine.begin() as conn:  # the third no longer validates: an object, not a list
            conn.execute(sa.delete(payloads_table).where(payloads_table.c.task_id == handles[2].id))
            conn.execute(
                sa.update(tasks_table).where(tasks_table.c.id == handles[2].id).values(payload=f'{{"x": "{large}"}}')
            )
        store = app.runtime.store
        leased = await store.lease_outbox(
            app.settings.namespace, now=app.clock(), lease=timedelta(seconds=30), limit=10, watermark=None
        )
        assert {row.task_id: row.payload_json for row in leased} == {
            handles[0].id: None,
            handles[1].id: '["short"]',
            handles[2].id: None,
        }
        now = app.clock()
        await store.settle_outbox(sent=[], dead=[], retry=[], held=leased, now=now, release_at=now)  # given back
        assert await app.dispatch_once() == 3  # two sent, one dead
        dead = app.get_task(handles[2].id)
        assert dead.state == TaskState.DEAD
        assert dead.error_message is not None
        assert "no longer validates" in dead.error_message
        assert await app.work(max_tasks=2, timeout=timedelta(seconds=60)) == 2
        assert [app.get_task(h.id).result for h in handles[:2]] == [len(large), len(small)]
    finally:
        await app.aclose()


async def test_a_worker_holds_large_payloads_within_its_payload_memory(make_app: Callable[..., App]) -> None:
    """A claim carries payloads up to INLINE_PAYLOAD_BYTES; a larger one is read when the
    worker's payload_memory has room for it (at the default concurrency a worker held every
    claimed payload of 1 MB: 1.1 GB). Five payloads of 90 KB in a budget of 200,000 bytes run two
    at a time, and one larger than the budget runs alone; each handler gets its whole payload."""
    app = make_app(payload_memory=200_000, concurrency=32)
    running: dict[int, int] = {}  # seed -> payload size, for the handlers running now
    seen: list[dict[int, int]] = []  # `running` as each handler found it when it started
    pair = anyio.Event()
    try:

        @app.task(name="measure", queue="large")
        async def measure(ctx: TaskContext[list[str]], parts: list[str]) -> int:
            seed = int(parts[1])
            running[seed] = len(parts[0])
            seen.append(dict(running))
            if len(running) == 2:
                pair.set()
            with anyio.move_on_after(10):  # the first two wait for each other: the budget holds two
                await pair.wait()
            await anyio.sleep(0.05)  # long enough for a third to start beside them, were it let in
            del running[seed]
            return len(parts[0])

        sizes = [90_000] * 5 + [300_000]
        bodies = [text_of(size, seed=seed) for seed, size in enumerate(sizes)]
        with Session(app.engine) as session:
            handles = [app.submit(session, "measure", [body, str(seed)]) for seed, body in enumerate(bodies)]
            session.commit()
        with app.engine.connect() as conn:  # submit keeps each payload's size: no claim measures it
            t = tasks_table.c
            stored = dict(conn.execute(sa.select(t.id, t.payload_bytes).where(t.id.in_([h.id for h in handles]))).all())
            conn.execute(  # as dt_submit and older code write a task: the claim measures the payload
                sa.update(tasks_table)
                .where(t.id == handles[1].id)
                .values(payload_bytes=None, payload=json.dumps([bodies[1], "1"], separators=(",", ":")))
            )
            conn.execute(sa.delete(payloads_table).where(payloads_table.c.task_id == handles[1].id))
            conn.commit()
        assert [stored[h.id] for h in handles] == [len(body) + 8 for body in bodies]  # ["…","0"]
        claims = await app.runtime.store.claim_executions(
            app.settings.namespace,
            [ClaimRequest(h.id, 0, 0) for h in handles[:2]],
            worker_id="probe",
            now=app.clock(),
            lease=timedelta(seconds=0),  # expires at once: the worker claims them again
        )
        assert [(c.payload_json, c.payload_size) for c in claims if isinstance(c, ExecutionClaim)] == [
            (None, len(bodies[0]) + 8),
            (None, len(bodies[1]) + 8),
        ]
        assert await app.dispatch_once() == 6
        assert await app.work(max_tasks=6, timeout=timedelta(seconds=60)) == 6
        assert [app.get_task(h.id).result for h in handles] == sizes
        assert max(len(r) for r in seen) == 2
        assert all(sum(r.values()) <= 200_000 or len(r) == 1 for r in seen), seen
    finally:
        await app.aclose()


async def test_a_running_task_holds_its_large_payload_once_not_its_text_too(make_app: Callable[..., App]) -> None:
    """Once a large payload is decoded its JSON text goes: while the handler runs, the process
    holds one block of the payload's size (the decoded value), which ``payload_memory`` counts,
    not two. Counted with tracemalloc, every allocation of at least half the payload's size."""
    app = make_app()
    size = 1_000_000  # under max_payload_bytes (1 MiB)
    large_blocks: list[int] = []
    try:

        def large_now() -> int:
            return sum(1 for trace in tracemalloc.take_snapshot().traces if trace.size >= size // 2)

        @app.task(name="hold", queue="large")
        def hold(ctx: TaskContext[str], body: str) -> int:
            # The text was read on a worker thread, which hands it to the loop before it drops
            # its own reference: wait for that (ms), not for a fixed time. A text kept while the
            # handler runs (the defect) stays for the whole wait.
            deadline = time.monotonic() + 5
            while (count := large_now()) > 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            large_blocks.append(count)
            return len(body)

        with Session(app.engine) as session:
            handle = app.submit(session, "hold", text_of(size - 2, seed=7))
            session.commit()
        assert await app.dispatch_once() == 1
        tracemalloc.start()
        try:
            assert await app.work(max_tasks=1, timeout=timedelta(seconds=60)) == 1
        finally:
            tracemalloc.stop()
        assert app.get_task(handle.id).result == size - 2
        assert large_blocks == [1]  # the decoded payload; its text was dropped once decoded
    finally:
        await app.aclose()


async def test_every_submit_path_keeps_the_payload_size_in_bytes(make_app: Callable[..., App]) -> None:
    """submit, submit_many and a suspension's children write ``payload_bytes``, UTF-8 bytes (not
    characters), so no claim measures a payload; text outside ASCII takes more bytes than
    characters."""
    app = make_app()
    try:

        @app.task(name="text", queue="large")
        def text(ctx: TaskContext[str], body: str) -> int:
            return len(body)

        @app.task(name="parent", queue="large")
        async def parent(ctx: TaskContext[str], body: str) -> int:
            journal = current_journal()
            assert journal is not None
            return int(await journal.child(text, body + "é"))  # a suspension's child

        with Session(app.engine) as session:
            single = app.submit(session, "text", "naïve ✓")
            batch = app.registry["text"].submit_many(session, [("ascii", None), ("日本語", None)])
            root = app.submit(session, "parent", "€")
            session.commit()
        await run_until_quiet(app)
        assert app.get_task(root.id).result == 2
        t = tasks_table.c
        with app.engine.connect() as conn:
            rows = conn.execute(
                sa.select(t.id, t.payload, t.payload_bytes).where(t.namespace == app.settings.namespace)
            )
            sizes = {task_id: (size, len(payload.encode()), len(payload)) for task_id, payload, size in rows}
        [child] = set(sizes) - {single.id, batch[0].id, batch[1].id, root.id}
        assert all(size == utf8 for size, utf8, _ in sizes.values()), sizes
        assert all(size > chars for size, _, chars in (sizes[single.id], sizes[batch[1].id], sizes[child]))
    finally:
        await app.aclose()
