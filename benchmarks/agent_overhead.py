"""What durability costs an agent run: a 3-turn run with 4 tool calls, plain vs on durable_tasks.

    python -m benchmarks.agent_overhead                                   # SQLite + embedded Valkey
    python -m benchmarks.agent_overhead --database-url postgresql+psycopg://postgres@127.0.0.1:5432/test \\
        --redis-url redis://127.0.0.1:6379/0 --runs 30

The run (both frameworks, offline, a scripted model): turn 0 asks for three tools in parallel,
turn 1 for one more, turn 2 answers. Plain is the framework's own run in this process. Durable is
the same agent inside a task, with a dispatcher and a worker running in this process: from the
commit of the run's submit to its announced result (``handle.wait``). ``phases`` splits the
durable run by the runtime's own timestamps (``dt_outbox``, ``dt_attempts``): time inside the
run's attempts, a tool task's hop from its outbox row to its claim, the tool's attempt, and the
resume hop from the last tool's commit to the run's next claim. Database statements are counted at the
driver (psycopg's cursors on PostgreSQL, the engine's cursor on SQLite), except the benchmark's
own reads, and reported per turn. Medians over ``--runs`` runs after one warm-up.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import json
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from typing import Any

import anyio
import sqlalchemy as sa
from sqlmodel import Session

from benchmarks.bench_dt import delete_keys
from durable_tasks import App, Task, TaskContext
from durable_tasks.records import attempts_table, outbox_table, tasks_table

TURNS = 3
_exempt: contextvars.ContextVar[bool] = contextvars.ContextVar("bench_exempt", default=False)
_count = [0]


@contextlib.contextmanager
def exempt() -> Iterator[None]:
    """Statements issued inside are the benchmark's own, not the runtime's."""
    token = _exempt.set(True)
    try:
        yield
    finally:
        _exempt.reset(token)


def _counted(fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _exempt.get():
            _count[0] += 1
        return fn(*args, **kwargs)

    async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _exempt.get():
            _count[0] += 1
        return await fn(*args, **kwargs)

    import inspect

    return async_wrapper if inspect.iscoroutinefunction(fn) else wrapper


def count_statements(app: App) -> None:
    """Count every statement this process sends to the database."""
    if app.engine.dialect.name == "postgresql":
        import psycopg

        for cls in (psycopg.Cursor, psycopg.AsyncCursor, psycopg.ClientCursor, psycopg.AsyncClientCursor):
            for name in ("execute", "executemany"):
                setattr(cls, name, _counted(getattr(cls, name)))
    else:
        sa.event.listen(
            app.engine,
            "before_cursor_execute",
            lambda *a: _count.__setitem__(0, _count[0] + (0 if _exempt.get() else 1)),
        )


# -- the two agents, one script -------------------------------------------------------------------


def pydantic_ai_agent(app: App) -> tuple[Callable[[], Awaitable[str]], Task[str, str]]:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from durable_tasks.integrations.pydantic_ai import DurableTasksDurability

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(1 for m in messages if isinstance(m, ModelResponse))
        if turn == 0:
            return ModelResponse(parts=[ToolCallPart("add", {"a": i, "b": 1}, tool_call_id=f"c{i}") for i in range(3)])
        if turn == 1:
            return ModelResponse(parts=[ToolCallPart("add", {"a": 9, "b": 1}, tool_call_id="c9")])
        return ModelResponse(parts=[TextPart("done")])

    agent: Agent[None, str] = Agent(FunctionModel(model), name="bench_pai", capabilities=[DurableTasksDurability(app)])

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    @app.task(name="bench.pydantic_ai", queue="agents")
    async def run(ctx: TaskContext[str], question: str) -> str:
        return (await agent.run(question)).output

    async def plain() -> str:
        return (await agent.run("go")).output

    return plain, run


def openai_agents_agent(app: App) -> tuple[Callable[[], Awaitable[str]], Task[str, str]]:
    from agents import Agent, ModelResponse, Runner, function_tool, set_tracing_disabled
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    from durable_tasks.integrations.openai_agents import DurableRunner

    set_tracing_disabled(True)

    def call(call_id: str, a: int) -> ResponseFunctionToolCall:
        return ResponseFunctionToolCall(
            type="function_call", call_id=call_id, name="add", arguments=json.dumps({"a": a, "b": 1})
        )

    class Scripted(Model):
        async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
            items = input if isinstance(input, list) else []
            done = sum(1 for i in items if isinstance(i, dict) and i.get("type") == "function_call_output")
            if done == 0:
                output: list[Any] = [call(f"c{i}", i) for i in range(3)]
            elif done == 3:
                output = [call("c9", 9)]
            else:
                text = ResponseOutputText(type="output_text", text="done", annotations=[])
                output = [
                    ResponseOutputMessage(id="m", type="message", role="assistant", status="completed", content=[text])
                ]
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    @function_tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    agent = Agent(name="bench_oai", model=Scripted(), tools=[add])
    runner = DurableRunner(app, agents=[agent])

    @app.task(name="bench.openai_agents", queue="agents")
    async def run(ctx: TaskContext[str], question: str) -> str:
        return str((await runner.run(agent, question)).final_output)

    async def plain() -> str:
        return str((await Runner.run(agent, "go")).final_output)

    return plain, run


# -- measuring ------------------------------------------------------------------------------------


async def measure_plain(plain: Callable[[], Awaitable[str]], runs: int) -> list[float]:
    await plain()  # warm-up
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        await plain()
        times.append(time.perf_counter() - started)
    return times


async def measure_durable(app: App, task: Task[str, str], runs: int) -> tuple[list[float], list[int], list[str]]:
    times: list[float] = []
    statements: list[int] = []
    run_ids: list[str] = []
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: app.run(reaper=False, stop=stop))
        for i in range(runs + 1):
            with Session(app.engine) as session:
                handle = task.submit(session, f"go {i}")
                session.commit()
            before, started = _count[0], time.perf_counter()
            with exempt():  # the result wait is woken by the result's notification, not a poll
                await handle.wait(timeout=120)
            if i:  # the first run warms up
                times.append(time.perf_counter() - started)
                statements.append(_count[0] - before)
                run_ids.append(handle.id)
        stop.set()
    return times, statements, run_ids


def phases(app: App, run_ids: list[str]) -> dict[str, float]:
    """Where a durable run's time goes, from the runtime's own timestamps (medians, ms): inside
    the run's attempts (model turns, journal writes, suspensions), a suspension's tool tasks
    from their outbox row to their claim, the tools' attempts, and the resume: the last tool's
    commit (the run's new outbox row) to the run's next claim."""
    o, a = outbox_table.c, attempts_table.c
    run_attempt, tool_hop, tool_attempt, resume_hop = [], [], [], []
    with exempt(), app.engine.connect() as conn:
        for run_id in run_ids:
            tools = [r.id for r in conn.execute(sa.select(tasks_table.c.id).where(tasks_table.c.parent_id == run_id))]
            ids = [run_id, *tools]
            attempts = sa.select(a.task_id, a.delivery, a.started_at, a.finished_at).where(a.task_id.in_(ids))
            started = {(r.task_id, r.delivery): r for r in conn.execute(attempts)}
            for r in conn.execute(sa.select(o.task_id, o.delivery, o.created_at).where(o.task_id.in_(ids))):
                attempt = started.get((r.task_id, r.delivery))
                if attempt is None or attempt.finished_at is None:
                    continue
                hop = (attempt.started_at - r.created_at).total_seconds() * 1000
                ran = (attempt.finished_at - attempt.started_at).total_seconds() * 1000
                if r.task_id == run_id:
                    run_attempt.append(ran)
                    if r.delivery:
                        resume_hop.append(hop)
                else:
                    tool_hop.append(hop)
                    tool_attempt.append(ran)
    per_run = len(run_ids) or 1
    return {
        "in_run_attempts_ms_per_run": round(sum(run_attempt) / per_run, 1),
        "tool_dispatch_hop_ms": round(statistics.median(tool_hop), 1) if tool_hop else 0.0,
        "tool_attempt_ms": round(statistics.median(tool_attempt), 1) if tool_attempt else 0.0,
        "resume_hop_ms": round(statistics.median(resume_hop), 1) if resume_hop else 0.0,
        "resumes_per_run": round(len(resume_hop) / per_run, 1),
    }


@contextlib.contextmanager
def private_schema(url: str | None) -> Iterator[str | None]:
    """On PostgreSQL, a schema of the benchmark's own (dropped at the end): a shared server's
    tables are left alone."""
    if not url or not url.startswith("postgresql"):
        yield url
        return
    schema = f"dt_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(url)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield (
            sa.engine.make_url(url)
            .update_query_dict({"options": f"-csearch_path={schema}"})
            .render_as_string(hide_password=False)
        )
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with private_schema(args.database_url) as url:
        return await measure(args, url)


async def measure(args: argparse.Namespace, database_url: str | None) -> dict[str, Any]:
    fast = {"poll_interval": args.poll_interval} if args.poll_interval is not None else {}
    # The benchmark's result wait is woken by the announced outcome; its fallback read (a
    # statement that is not the run's) is kept out of the measured window.
    quiet: dict[str, Any] = {"result_poll_initial": timedelta(seconds=60), "result_poll_max": timedelta(seconds=60)}
    namespace = f"bench{uuid.uuid4().hex[:8]}"
    app = App(database_url, args.redis_url, namespace, **fast, **quiet)
    try:
        return await measure_app(app, args)
    finally:
        await app.aclose()
        if args.redis_url:  # a shared server: the run's keys go (the embedded one lives in the run's data dir)
            delete_keys(args.redis_url, namespace)


async def measure_app(app: App, args: argparse.Namespace) -> dict[str, Any]:
    builders = {"pydantic_ai": pydantic_ai_agent, "openai_agents": openai_agents_agent}
    agents = {name: builders[name](app) for name in args.frameworks.split(",")}
    app.create_all()
    count_statements(app)
    report: dict[str, Any] = {
        "database": app.engine.dialect.name,
        "poll_interval_s": app.settings.poll_interval.total_seconds(),
        "runs": args.runs,
        "turns": TURNS,
        "tool_calls": 4,
    }
    for name, (plain, task) in agents.items():
        plain_times = await measure_plain(plain, args.runs)
        durable_times, statements, run_ids = await measure_durable(app, task, args.runs)
        report[name] = {
            "plain_ms": round(statistics.median(plain_times) * 1000, 2),
            "durable_ms": round(statistics.median(durable_times) * 1000, 2),
            "statements_per_turn": round(statistics.median(statements) / TURNS, 1),
            "phases": await anyio.to_thread.run_sync(phases, app, run_ids),
        }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=None, help="default: DT_DATABASE_URL, else SQLite")
    parser.add_argument("--redis-url", default=None, help="default: DT_REDIS_URL, else the embedded Valkey")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--frameworks", default="pydantic_ai,openai_agents")
    parser.add_argument(
        "--poll-interval", type=float, default=None, help="the dispatcher's poll (SQLite has no NOTIFY to wake it)"
    )
    print(json.dumps(anyio.run(main_async, parser.parse_args()), indent=2))


if __name__ == "__main__":
    main()
