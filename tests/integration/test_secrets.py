"""No password from a URL in any output: every CLI command, on every way its connections can
fail, and the runtime's logs and spans while Redis goes away under it.

The commands are read from the Typer app, so a command added later is swept too; a command
that takes no App must be named in :data:`NO_APP` (it reads no URL).
"""

from __future__ import annotations

import functools
import logging
import signal
import sys
import traceback
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
import typer.main
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlmodel import Session
from typer.core import TyperGroup
from typer.testing import CliRunner

from durable_tasks import App, TaskContext, TaskState
from durable_tasks.cli import cli
from tests.helpers import FAST, wait_until
from tests.servers import free_port, private_redis

CANARY = "Canary-pw-7f3a9c"
APP_SPEC = "tests.apps.cli_app:app"

#: Commands that load no App, hence read no database or Redis URL.
NO_APP = {("demo",)}


@dataclass(frozen=True, slots=True)
class Command:
    path: tuple[str, ...]
    argv: tuple[str, ...]


#: Sample values for a command's other arguments: what they are does not matter, the
#: connection fails first (or the command says the thing is not there).
SAMPLES = {"task_id": "no-such-task", "queue": "cli", "entry": "0-1", "part": "judge"}


def leaf_commands() -> list[Command]:
    """Every command of the ``durable-tasks`` app that takes an App, with arguments to run it."""
    found: list[Command] = []

    def walk(group: Any, path: tuple[str, ...]) -> None:
        if isinstance(group, TyperGroup):
            for name, sub in sorted(group.commands.items()):
                walk(sub, (*path, name))
            return
        params = {p.name: p for p in group.params}
        if "app" not in params:
            assert path in NO_APP, f"`{' '.join(path)}` takes no App: sweep it here, or name it in NO_APP"
            return
        argv: list[str] = list(path)
        for name, param in params.items():
            value = APP_SPEC if name == "app" else SAMPLES.get(str(name), "x")
            if param.param_type_name == "argument":  # APP first, then the command's own
                argv.append(value)
            elif param.required:
                argv += [param.opts[0], value]
            elif name == "yes":  # a command asking for confirmation
                argv.append(param.opts[0])
        found.append(Command(path, tuple(argv)))

    walk(typer.main.get_command(cli), ())
    return found


def closed_port() -> int:
    return free_port()  # nobody listens there: connections are refused at once


def failures(postgres_url: str) -> dict[str, dict[str, str]]:
    """Each way a connection fails, as DT_* values, every URL carrying the canary password."""
    pg = sa.engine.make_url(postgres_url).set(password=CANARY)

    def db(url: sa.URL) -> str:
        return url.render_as_string(hide_password=False)

    good_redis = "redis://127.0.0.1:6379/0"
    return {
        "redis-refused": {
            "DT_DATABASE_URL": db(pg),
            "DT_REDIS_URL": f"redis://dt:{CANARY}@127.0.0.1:{closed_port()}/0",
        },
        "redis-wrong-password": {"DT_DATABASE_URL": db(pg), "DT_REDIS_URL": f"redis://dt:{CANARY}@127.0.0.1:6379/0"},
        "redis-cluster-refused": {
            "DT_DATABASE_URL": db(pg),
            "DT_REDIS_URL": f"redis+cluster://dt:{CANARY}@127.0.0.1:{closed_port()},127.0.0.1:{closed_port()}/0",
        },
        "tls-redis-refused": {
            "DT_DATABASE_URL": db(pg),
            "DT_REDIS_URL": f"rediss://:{CANARY}@127.0.0.1:{closed_port()}/0?ssl_cert_reqs=none",
        },
        "database-refused": {"DT_DATABASE_URL": db(pg.set(port=closed_port())), "DT_REDIS_URL": good_redis},
        "database-missing": {"DT_DATABASE_URL": db(pg.set(database="dt_no_such_database")), "DT_REDIS_URL": good_redis},
        # postgres:// is read as postgresql://: this fails on the closed port, not on the scheme.
        "postgres-scheme-refused": {
            "DT_DATABASE_URL": f"postgres://postgres:{CANARY}@127.0.0.1:{closed_port()}/test",
            "DT_REDIS_URL": good_redis,
        },
    }


@pytest.fixture
def canary_env(
    monkeypatch: pytest.MonkeyPatch, namespace: str, tmp_path: Path
) -> Iterator[Callable[[dict[str, str]], None]]:
    def configure(values: dict[str, str]) -> None:
        env = {"DT_NAMESPACE": namespace, "DT_DATA_DIR": str(tmp_path / "data"), "DT_STARTUP_WAIT": "0", **values}
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        sys.modules.pop("tests.apps.cli_app", None)  # re-read the environment

    yield configure
    sys.modules.pop("tests.apps.cli_app", None)


def test_the_sweep_finds_the_commands_that_connect() -> None:
    paths = {c.path for c in leaf_commands()}
    assert {("status",), ("run",), ("doctor",), ("init-db",), ("dlq", "list"), ("tasks", "show")} <= paths


@pytest.mark.parametrize("mode", sorted(failures("postgresql://postgres@127.0.0.1:5432/test")))
def test_no_command_prints_or_logs_a_password_when_its_connections_fail(
    mode: str,
    postgres_url: str,
    canary_env: Callable[[dict[str, str]], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    runner = CliRunner()
    leaks: list[str] = []
    dumped: list[str] = []
    failed: list[tuple[str, ...]] = []
    for command in leaf_commands():
        canary_env(failures(postgres_url)[mode])
        caplog.clear()
        result = runner.invoke(cli, list(command.argv), env={"COLUMNS": "200"})
        # A typed error ends as SystemExit (no traceback printed); anything else escaped
        escaped = (
            ""
            if isinstance(result.exception, SystemExit) or result.exc_info is None
            else ("".join(traceback.format_exception(*result.exc_info)))
        )
        seen = {"output": result.output, "log": caplog.text, "traceback": escaped}
        leaks += [f"{' '.join(command.path)} ({where})" for where, text in seen.items() if CANARY in text]
        raised = result.exception is not None and not isinstance(result.exception, SystemExit)
        if raised or "Traceback" in result.output:
            dumped.append(f"{' '.join(command.path)}: {(escaped or result.output).strip().splitlines()[-1]}")
        if result.exit_code != 0:
            failed.append(command.path)
    assert ("status",) in failed, f"{mode} did not make `status` fail: the mode tests nothing"
    assert not leaks, f"{mode}: the password shows in {leaks}"
    assert not dumped, f"{mode}: a traceback instead of one line from {dumped}"


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # another module may have installed one first
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.clear()


def leaked_in_spans(exporter: InMemorySpanExporter) -> list[str]:
    """Names of finished spans whose attributes or events carry the canary."""
    found = []
    for span in exporter.get_finished_spans():
        texts = [str(v) for v in (span.attributes or {}).values()]
        for event in span.events:
            texts += [event.name, *(str(v) for v in (event.attributes or {}).values())]
        texts.append(str(span.status.description))
        if any(CANARY in text for text in texts):
            found.append(span.name)
    return found


@pytest.mark.anyio
async def test_the_runtime_keeps_the_passwords_out_of_logs_and_spans_when_redis_dies_under_it(
    postgres_url: str,
    namespace: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    spans: InMemorySpanExporter,
) -> None:
    caplog.set_level(logging.DEBUG)
    database = sa.engine.make_url(postgres_url).set(password=CANARY).render_as_string(hide_password=False)
    with private_redis(tmp_path / "redis", "--requirepass", CANARY) as server:
        timings: dict[str, Any] = dict(FAST)
        app = App(database, f"redis://:{CANARY}@127.0.0.1:{server.port}/0", namespace, data_dir=tmp_path, **timings)
        app.create_all()

        @app.task(name="secrets.echo", queue="jobs")
        def echo(ctx: TaskContext[int], n: int) -> int:
            return n

        def submit(n: int) -> str:
            with Session(app.engine) as s:
                task_id = echo.submit(s, n).id
                s.commit()
            return task_id

        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: app.run(stop=stop))
            first = submit(1)
            await wait_until(lambda: app.get_task(first).state == TaskState.SUCCEEDED, timeout=20, what="a task to run")
            server.stop(signal.SIGKILL)
            submit(2)

            def complained(logger: str) -> bool:
                return any(r.name.startswith(logger) and r.levelno >= logging.WARNING for r in caplog.records)

            for loop in ("durable_tasks.dispatcher", "durable_tasks.worker", "durable_tasks.reaper"):
                await wait_until(
                    functools.partial(complained, loop), timeout=20, what=f"{loop} to report the lost Redis"
                )
            stop.set()
        await app.aclose()
    assert CANARY not in caplog.text
    assert spans.get_finished_spans(), "no span was recorded: nothing was checked"
    assert not leaked_in_spans(spans)


@pytest.mark.anyio
async def test_the_runtime_keeps_the_passwords_out_of_errors_logs_and_spans_when_the_database_is_unreachable(
    redis_url: str, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, spans: InMemorySpanExporter
) -> None:
    caplog.set_level(logging.DEBUG)
    database = f"postgresql+psycopg://postgres:{CANARY}@127.0.0.1:{closed_port()}/test"
    app = App(database, redis_url, namespace, data_dir=tmp_path)

    @app.task(name="secrets.echo", queue="jobs")
    def echo(ctx: TaskContext[int], n: int) -> int:
        return n

    raised: list[str] = []
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "check_connections": app.check_connections,
        "dispatch_once": app.dispatch_once,
        "work": lambda: app.work(max_tasks=1, timeout=timedelta(seconds=0.5)),
        "reap_once": app.reap_once,
        "stats": app.stats,
    }
    for name, call in calls.items():
        try:
            await call()
        except Exception as exc:
            raised.append(f"{name}: " + "".join(traceback.format_exception(exc)))
    sync_calls: dict[str, Callable[[], object]] = {"create_all": app.create_all, "get_task": lambda: app.get_task("x")}
    for name, sync_call in sync_calls.items():
        try:
            sync_call()
        except Exception as exc:
            raised.append(f"{name}: " + "".join(traceback.format_exception(exc)))
    await app.aclose()
    assert raised, "nothing failed: the database was reachable?"
    assert not [text.splitlines()[0] for text in raised if CANARY in text]
    assert CANARY not in caplog.text
    assert not leaked_in_spans(spans)
