"""Real-server tests for durable_tasks.embedded: no mocks, every server is stopped by pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import sqlalchemy

from durable_tasks.embedded import EmbeddedServerError, ensure_valkey, stop_valkey
from durable_tasks.valkey_keeper import is_valkey, process_start
from tests.embedded_postgres import start_embedded_postgres
from tests.helpers import turns_true

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _is_valkey(pid: int) -> bool:
    try:
        return is_valkey(pid) and bool(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return False


def _wait_gone(pid: int, timeout: float = 6.0) -> bool:
    return turns_true(lambda: not _alive(pid), timeout=timeout)


def _valkey_pids_for(sock: str) -> list[int]:
    """Every live valkey process whose process title names ``sock``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if is_valkey(int(entry.name)) and sock.encode() in cmdline and _alive(int(entry.name)):
                pids.append(int(entry.name))
    return pids


def _state(data_dir: Path) -> dict[str, object]:
    state: dict[str, object] = json.loads((data_dir / "valkey.json").read_text())
    return state


def _users(data_dir: Path) -> dict[str, str | None]:
    users: dict[str, str | None] = json.loads((data_dir / "valkey.json").read_text())["users"]
    return users


def _server_pid(data_dir: Path) -> int:
    return int(str(_state(data_dir)["server_pid"]))


def _sock(url: str) -> str:
    return url.removeprefix("unix://")


@pytest.fixture
def valkey_pids() -> Iterator[list[int]]:
    """Valkey server pids the test started; each is stopped at teardown."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if _alive(pid) and _is_valkey(pid):
            os.kill(pid, signal.SIGTERM)
            if not _wait_gone(pid):
                os.kill(pid, signal.SIGKILL)


def _python(code: str, stdin: int | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, text=True, stdin=stdin, stdout=subprocess.PIPE)


def test_start_answers_ping(tmp_path: Path, valkey_pids: list[int]) -> None:
    url = ensure_valkey(tmp_path)
    valkey_pids.append(_server_pid(tmp_path))

    assert url.startswith("unix://")
    client = redis.Redis.from_url(url)
    try:
        assert client.ping() is True
        client.set("k", "v")
        assert client.get("k") == b"v"
    finally:
        client.close()
    assert str(os.getpid()) in _users(tmp_path)


def test_second_call_reuses_server(tmp_path: Path, valkey_pids: list[int]) -> None:
    url = ensure_valkey(tmp_path)
    pid = _server_pid(tmp_path)
    valkey_pids.append(pid)

    assert ensure_valkey(tmp_path) == url
    assert _server_pid(tmp_path) == pid

    # Another process of the same app, while this process (the owner) is alive.
    child = _python(
        "from pathlib import Path; from durable_tasks.embedded import ensure_valkey;"
        f"print(ensure_valkey(Path({str(tmp_path)!r})))"
    )
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 0
    assert out.strip() == url
    assert _server_pid(tmp_path) == pid
    assert str(os.getpid()) in _users(tmp_path)  # the child, gone, is dropped by the keeper
    assert _valkey_pids_for(_sock(url)) == [pid]


def test_the_server_of_a_killed_keeper_is_replaced_with_its_data(tmp_path: Path, valkey_pids: list[int]) -> None:
    url = ensure_valkey(tmp_path)
    old_pid, keeper = _server_pid(tmp_path), int(str(_state(tmp_path)["owner_pid"]))
    valkey_pids.append(old_pid)
    client = redis.Redis.from_url(url)
    try:
        client.set("survives", "1")
        client.bgrewriteaof()  # on disk before the kill, whatever fsync policy
        assert turns_true(lambda: client.info("persistence")["aof_rewrite_in_progress"] == 0, timeout=10)
    finally:
        client.close()

    os.kill(keeper, signal.SIGKILL)
    assert _wait_gone(keeper)
    # Linux: the server got SIGTERM when its keeper died (PR_SET_PDEATHSIG); elsewhere the next
    # ensure_valkey stops it. Either way a new server, with a keeper, takes over the data.
    new_url = ensure_valkey(tmp_path)
    new_pid = _server_pid(tmp_path)
    valkey_pids.append(new_pid)

    assert new_url == url
    assert new_pid != old_pid
    assert _wait_gone(old_pid, timeout=6.0)
    client = redis.Redis.from_url(url)
    try:
        assert client.get("survives") == b"1"
    finally:
        client.close()


def test_concurrent_calls_start_one_server(tmp_path: Path, valkey_pids: list[int]) -> None:
    code = (
        "import sys; from pathlib import Path;"
        "from durable_tasks.embedded import ensure_valkey;"
        # Imported: say so, and start when the test says go (a line on stdin).
        "print('ready', flush=True); sys.stdin.readline()\n"
        f"print(ensure_valkey(Path({str(tmp_path)!r})), flush=True)\n"
        # Stay alive until the test has looked, so neither child sees a dead owner.
        "sys.stdin.read()"
    )
    children = [_python(code, stdin=subprocess.PIPE) for _ in range(2)]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
        for child in children:  # both at the start line: go
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        urls = []
        for child in children:
            assert child.stdout is not None
            urls.append(child.stdout.readline().strip())
        pid = _server_pid(tmp_path)
        valkey_pids.append(pid)

        assert urls[0] == urls[1] != ""
        assert _valkey_pids_for(_sock(urls[0])) == [pid]
        assert {str(c.pid) for c in children} <= set(_users(tmp_path))
    finally:
        for child in children:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(timeout=30)
            assert child.stdout is not None
            child.stdout.close()


def test_stop_valkey_stops_the_server_only_when_no_other_process_uses_it(
    tmp_path: Path, valkey_pids: list[int]
) -> None:
    ensure_valkey(tmp_path, appendonly=False)
    pid = _server_pid(tmp_path)
    valkey_pids.append(pid)

    assert stop_valkey(tmp_path) is True
    assert _wait_gone(pid, timeout=1.0)
    assert not (tmp_path / "valkey.json").exists()
    assert stop_valkey(tmp_path) is False

    # Another live process (the parent of this one) also uses it: left alone unless forced.
    ensure_valkey(tmp_path)
    pid = _server_pid(tmp_path)
    valkey_pids.append(pid)
    state = _state(tmp_path)
    parent = os.getppid()
    state["users"] = {**_users(tmp_path), str(parent): process_start(parent)}
    (tmp_path / "valkey.json").write_text(json.dumps(state))
    assert stop_valkey(tmp_path) is False
    assert _alive(pid)
    assert set(_users(tmp_path)) == {str(parent)}
    assert stop_valkey(tmp_path, force=True) is True
    assert _wait_gone(pid, timeout=1.0)


def test_long_data_dir_uses_short_socket(tmp_path: Path, valkey_pids: list[int]) -> None:
    data_dir = tmp_path / ("d" * 60) / ("e" * 60)
    url = ensure_valkey(data_dir)
    valkey_pids.append(_server_pid(data_dir))

    assert url.startswith("unix:///tmp/dt-valkey-")
    assert redis.Redis.from_url(url).ping() is True
    # The same dir maps to the same short socket, so it is reused.
    assert ensure_valkey(data_dir) == url


def test_start_failure_raises_with_log(tmp_path: Path) -> None:
    # A directory where the socket should go makes the bind fail.
    (tmp_path / "valkey.sock").mkdir()
    with pytest.raises(EmbeddedServerError, match=r"did not start .* it exited") as info:
        ensure_valkey(tmp_path, timeout=5.0)
    assert "Address already in use" in str(info.value), "the message should carry the log tail"
    assert not (tmp_path / "valkey.json").exists()


def test_embedded_postgres_select_1(tmp_path: Path) -> None:
    url, stop = start_embedded_postgres(tmp_path)
    try:
        assert url.startswith("postgresql+psycopg://")
        engine = sqlalchemy.create_engine(url)
        try:
            with engine.connect() as conn:
                assert conn.execute(sqlalchemy.text("SELECT 1")).scalar_one() == 1
                db = conn.execute(sqlalchemy.text("SELECT current_database()")).scalar_one()
                assert db == "dt_test"
        finally:
            engine.dispose()
    finally:
        stop()
    assert not (tmp_path / "pgdata" / "postmaster.pid").exists()


def test_the_keeper_gives_up_on_a_server_that_cannot_restart(tmp_path: Path, valkey_pids: list[int]) -> None:
    ensure_valkey(tmp_path)
    server, keeper = _server_pid(tmp_path), int(str(_state(tmp_path)["owner_pid"]))
    valkey_pids.append(server)
    os.kill(keeper, signal.SIGSTOP)  # held while the server dies and its AOF is spoiled
    try:
        os.kill(server, signal.SIGKILL)
        assert _wait_gone(server)
        for manifest in (tmp_path / "appendonlydir").glob("*.manifest"):
            manifest.write_text("not a manifest\n")
    finally:
        os.kill(keeper, signal.SIGCONT)
    assert _wait_gone(keeper, timeout=30.0), "the keeper should give up and exit"
    assert not (tmp_path / "valkey.json").exists()
    assert "giving up after 3 failed restarts" in (tmp_path / "keeper.log").read_text()
    with pytest.raises(EmbeddedServerError, match="did not start"):
        ensure_valkey(tmp_path, timeout=5.0)
