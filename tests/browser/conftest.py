"""A real stack for the dashboard's browser tests: PostgreSQL, Redis, the dashboard served by
``durable-tasks web`` (read-write and read-only), the runtime by ``durable-tasks run``, and
Debian's Chromium driven by Playwright.

Skipped, with the reason, where Chromium or Playwright is missing (``.ci/run`` installs both).
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis

from durable_tasks import App
from tests.helpers import turns_true
from tests.servers import free_port

CHROMIUM = os.environ.get("DT_TEST_CHROMIUM", "/usr/bin/chromium")
APP = "tests.apps.web_app:app"
#: Long enough that a refresh seen within it was woken by NOTIFY, not by the poll.
LIVE_POLL_S = 30.0


def _playwright() -> Any:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed: pip install -e '.[dev]'")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium chromium-driver")
    return sync_playwright


def wait_until(condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout`` seconds (no
    event loop of our own: Playwright's sync API keeps one in this thread)."""
    assert turns_true(condition, timeout=timeout), f"timed out after {timeout:.0f} s waiting for {what}"


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


class Stack:
    """The servers of one test module and the environment they share."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.processes: list[subprocess.Popen[bytes]] = []
        self.url = ""
        self.read_only_url = ""

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "durable_tasks", *args], env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        self.processes.append(process)
        return process

    def serve(self, *extra: str) -> str:
        port = free_port()
        self.spawn(f"web-{port}", "web", APP, "--port", str(port), *extra)
        return f"http://127.0.0.1:{port}"

    def app(self) -> App:
        """An App of this stack for the test process itself (submits, waits, reads)."""
        from tests.apps import web_app

        return web_app.app

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture(scope="module")
def stack(postgres_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    _playwright()
    import uuid

    namespace = f"w{uuid.uuid4().hex[:12]}"
    logs = tmp_path_factory.mktemp("web-logs")
    env = os.environ | {
        "DT_DATABASE_URL": postgres_url,
        "DT_REDIS_URL": redis_url,
        "DT_NAMESPACE": namespace,
        "DT_DATA_DIR": str(logs / "data"),
        "DT_LEASE_TIMEOUT": "0.5",
        "DT_HEARTBEAT_INTERVAL": "0.1",
        "DT_POLL_INTERVAL": "0.2",
        "DT_READ_BLOCK": "0.1",
        "DT_RETRY_BACKOFF_INITIAL": "0",
        "DT_RETRY_BACKOFF_MAX": "0",
        "DT_MAX_DELIVERIES": "1",
        "DT_REAPER_INTERVAL": "0.5",
        "DT_STARTUP_WAIT": "0",
        "PYTHONPATH": os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("DT_WEB_USER", None)
    env.pop("DT_WEB_PASSWORD", None)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            if key.startswith("DT_"):
                mp.setenv(key, value)  # the test's own App (tests.apps.web_app) reads them too
        mp.delitem(sys.modules, "tests.apps.web_app", raising=False)
        s = Stack(env, logs)
        s.app().create_all()
        try:
            s.url = s.serve("--poll-interval", str(LIVE_POLL_S))
            s.read_only_url = s.serve("--read-only")
            for url in (s.url, s.read_only_url):
                probe = url + "/static/app.js"
                wait_until(partial(_answers, probe), timeout=60, what=f"the dashboard at {url}")
            yield s
        finally:
            s.stop()
            sys.modules.pop("tests.apps.web_app", None)
            client = redis.Redis.from_url(redis_url)
            for key in client.scan_iter(match=f"dt:{{{namespace}:*", count=1000):
                client.delete(key)
            client.close()


@pytest.fixture(scope="module")
def browser(stack: Stack) -> Iterator[Any]:
    with _playwright()() as p:
        chromium = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking"],
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    the_page = context.new_page()
    the_page.on("dialog", lambda dialog: dialog.accept())
    yield the_page
    context.close()
