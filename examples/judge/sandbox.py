"""Run an untrusted Python submission against a problem's test cases, under limits.

Each test case runs in a fresh interpreter (``-I -S``: isolated mode, no site-packages) in a
fresh temporary directory, with an environment holding nothing but ``PATH`` and ``LANG`` (no
secrets, no proxy settings), and with resource limits on address space (memory), CPU time,
written file size (output) and open files. The wall clock is enforced by the parent.

The limits are set by a tiny launcher that calls ``resource.setrlimit`` and then ``exec``\\ s the
submission, rather than by ``preexec_fn``: the judge runs inside a worker's thread pool, and
CPython documents ``preexec_fn`` as unsafe when the parent has threads (the child can deadlock
on a lock another thread held at fork time). Limits survive ``exec``, so the effect is the same.

This is resource control, not a security boundary: the child can still open sockets and read
world-readable files. Production judges add a container, namespaces or seccomp (nsjail,
gVisor, isolate) and an unprivileged user around the same interface.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from pydantic import BaseModel, ConfigDict

from .models import Problem, Verdict

__all__ = [
    "MAX_CODE_BYTES",
    "OUTPUT_LIMIT_BYTES",
    "SANDBOX_ENV",
    "STARTUP_ALLOWANCE_S",
    "CaseResult",
    "Execution",
    "JudgeAbortedError",
    "JudgeFunction",
    "JudgeResult",
    "compile_error",
    "judge_submission",
    "outputs_match",
    "run_python",
    "worst_case_seconds",
]

#: Largest accepted source, in UTF-8 bytes.
MAX_CODE_BYTES = 64 * 1024
#: Largest file (stdout and stderr included) a submission may write.
OUTPUT_LIMIT_BYTES = 1024 * 1024
#: Wall-clock allowance for starting the two interpreters (launcher, then submission).
STARTUP_ALLOWANCE_S = 0.25
#: The whole environment a submission sees: nothing from the judge's own environment.
SANDBOX_ENV: dict[str, str] = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}

# Runs in the child before the submission: set the limits, then replace itself with the submission.
_LAUNCHER = """\
import os, resource, sys
address_space, cpu_seconds, file_size, script = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
os.execv(sys.executable, [sys.executable, "-I", "-S", "-B", "-X", "utf8", script])
"""

_INTERPRETER_FLAGS = ("-I", "-S", "-B", "-X", "utf8")


class CaseResult(BaseModel):
    """The outcome of one test case. ``message`` never echoes test data: for a runtime error it
    is the exception's type only (a submission could otherwise raise its hidden input)."""

    model_config = ConfigDict(frozen=True)

    case: int
    verdict: Verdict
    time_ms: int
    message: str | None = None


class JudgeResult(BaseModel):
    """A submission's verdict: the first failing case decides it; the score counts passed cases."""

    model_config = ConfigDict(frozen=True)

    verdict: Verdict
    score: int
    passed: int
    total: int
    details: list[CaseResult]
    message: str | None = None


class JudgeAbortedError(Exception):
    """Judging stopped between test cases because the caller asked (e.g. the attempt was fenced out)."""


class JudgeFunction(Protocol):
    """The shape of :func:`judge_submission` (tests substitute their own)."""

    def __call__(
        self, problem: Problem, code: str, *, should_stop: Callable[[], bool] | None = None
    ) -> JudgeResult: ...


@dataclass(frozen=True, slots=True)
class Execution:
    """What one run of a program produced."""

    stdout: str
    stderr: str
    returncode: int
    timed_out: bool
    wall_ms: int


def compile_error(code: str) -> str | None:
    """Why ``code`` cannot be run (too large, or does not compile), or None if it compiles."""
    size = len(code.encode("utf-8", "surrogatepass"))
    if size > MAX_CODE_BYTES:
        return f"source is {size} bytes, over the limit of {MAX_CODE_BYTES}"
    try:
        compile(code, "solution.py", "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"{type(exc).__name__}: {exc.msg} (line {exc.lineno})"
    except (ValueError, OverflowError, RecursionError, MemoryError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def outputs_match(actual: str, expected: str) -> bool:
    """Compare line by line, ignoring trailing whitespace on each line and trailing blank lines."""
    return _normalize(actual) == _normalize(expected)


def _normalize(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def run_python(code: str, stdin: str, *, time_limit_ms: int, memory_limit_mb: int) -> Execution:
    """Run ``code`` once with ``stdin`` as its input, under the sandbox's limits."""
    wall_s = time_limit_ms / 1000 + STARTUP_ALLOWANCE_S
    cpu_s = math.ceil(time_limit_ms / 1000) + 1
    address_space = memory_limit_mb * 1024 * 1024
    with (
        tempfile.TemporaryDirectory(prefix="judge-", ignore_cleanup_errors=True) as workdir,
        tempfile.TemporaryFile() as stdin_file,
        tempfile.TemporaryFile() as stdout_file,
        tempfile.TemporaryFile() as stderr_file,
    ):
        Path(workdir, "solution.py").write_text(code, encoding="utf-8")
        stdin_file.write(stdin.encode("utf-8"))
        stdin_file.seek(0)
        command = [
            sys.executable,
            *_INTERPRETER_FLAGS,
            "-c",
            _LAUNCHER,
            str(address_space),
            str(cpu_s),
            str(OUTPUT_LIMIT_BYTES),
            "solution.py",
        ]
        started = time.monotonic()
        proc = subprocess.Popen(
            command,
            stdin=stdin_file,
            stdout=stdout_file,
            stderr=stderr_file,
            cwd=workdir,
            env=dict(SANDBOX_ENV),
            close_fds=True,
            start_new_session=True,  # its own process group: killing it reaches any children too
        )
        timed_out = False
        try:
            returncode = proc.wait(timeout=wall_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            returncode = proc.wait()
        finally:
            if proc.returncode is None:  # interrupted while waiting: never leave it running
                _kill_group(proc.pid)
                proc.wait()
        wall_ms = round((time.monotonic() - started) * 1000)
        _kill_group(proc.pid)  # whatever it left behind in its group
        return Execution(
            stdout=_read(stdout_file),
            stderr=_read(stderr_file),
            returncode=returncode,
            timed_out=timed_out,
            wall_ms=wall_ms,
        )


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _read(file: IO[bytes]) -> str:
    file.seek(0)
    return file.read(OUTPUT_LIMIT_BYTES + 1).decode("utf-8", "replace")


def _classify(run: Execution, expected: str) -> tuple[Verdict, str | None]:
    if run.timed_out or run.returncode == -signal.SIGXCPU:
        return Verdict.TIME_LIMIT_EXCEEDED, None
    if "MemoryError" in run.stderr[-2000:]:
        return Verdict.MEMORY_LIMIT_EXCEEDED, None
    if run.returncode == -signal.SIGKILL:  # not our kill (that sets timed_out): the OOM killer
        return Verdict.MEMORY_LIMIT_EXCEEDED, "killed"
    if run.returncode != 0:
        return Verdict.RUNTIME_ERROR, _runtime_error_message(run)
    if not outputs_match(run.stdout, expected):
        return Verdict.WRONG_ANSWER, None
    return Verdict.ACCEPTED, None


def _runtime_error_message(run: Execution) -> str:
    if run.returncode < 0:
        try:
            return f"killed by {signal.Signals(-run.returncode).name}"
        except ValueError:
            return f"killed by signal {-run.returncode}"
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    if lines:
        name = lines[-1].split(":", 1)[0].strip()
        if name.replace(".", "").replace("_", "").isalnum() and len(name) <= 100:
            return name
    return f"exit code {run.returncode}"


def worst_case_seconds(problem: Problem) -> float:
    """The longest judging ``problem`` can take (every case running into its wall-clock limit)."""
    return len(problem.tests) * (problem.time_limit_ms / 1000 + STARTUP_ALLOWANCE_S)


def judge_submission(problem: Problem, code: str, *, should_stop: Callable[[], bool] | None = None) -> JudgeResult:
    """Judge ``code`` against every test case of ``problem`` (a pure function of its inputs).

    The verdict is that of the first failing case (Accepted if none fails); ``score`` is the
    percentage of passed cases. ``should_stop`` is polled between cases: when it returns True
    the run raises :class:`JudgeAbortedError` instead of finishing work nobody will use.
    """
    total = len(problem.tests)
    if total == 0:
        raise ValueError(f"problem {problem.id!r} has no test cases")
    reason = compile_error(code)
    if reason is not None:
        return JudgeResult(verdict=Verdict.COMPILE_ERROR, score=0, passed=0, total=total, details=[], message=reason)
    details: list[CaseResult] = []
    for index, case in enumerate(problem.tests, start=1):
        if should_stop is not None and should_stop():
            raise JudgeAbortedError(f"stopped before case {index} of {total}")
        run = run_python(
            code, case["input"], time_limit_ms=problem.time_limit_ms, memory_limit_mb=problem.memory_limit_mb
        )
        verdict, message = _classify(run, case["expected"])
        details.append(CaseResult(case=index, verdict=verdict, time_ms=run.wall_ms, message=message))
    passed = sum(1 for d in details if d.verdict is Verdict.ACCEPTED)
    first_failure = next((d for d in details if d.verdict is not Verdict.ACCEPTED), None)
    return JudgeResult(
        verdict=Verdict.ACCEPTED if first_failure is None else first_failure.verdict,
        score=passed * 100 // total,
        passed=passed,
        total=total,
        details=details,
        message=None if first_failure is None else first_failure.message,
    )
