"""The chaos scenarios: each builds a cluster, runs a workload, injects its faults, heals
them, waits for the system to settle and runs the checker.

Every scenario returns an :class:`Outcome`: the checker's counts, what the run exercised
(kills, crashes, fenced-out attempts, reconciled deliveries...) and scenario-specific
expectations that prove the fault really landed. ``tests/chaos/test_chaos.py`` asserts on
them; ``python -m tests.chaos`` prints them.

Size comes from ``DT_CHAOS_TASKS`` (default 300) and ``DT_CHAOS_KILLS`` (default 5); each
scenario uses a fraction of the tasks (``FRACTIONS``). The seed comes from ``DT_CHAOS_SEED``
(otherwise fixed under pytest, random for ``python -m tests.chaos``) and is part of every
outcome, so a failing run can be replayed.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from durable_tasks.failpoints import POINTS
from durable_tasks.policy import suspect_group_limit
from durable_tasks.transport.keys import QueueKeys
from tests.cluster.harness import Cluster as RedisCluster
from tests.cluster.harness import Node as RedisNode
from tests.cluster.harness import start_cluster

from .app import QUEUE, Job
from .checker import CheckResult
from .harness import REPO_ROOT, Cluster, Death, Postgres, RateSubmitter, cluster_on
from .history import read_history
from .mysql import MySql

__all__ = [
    "FAILPOINT_ROLES",
    "FRACTIONS",
    "KNOWN_BUGS",
    "POSTGRES_ONLY",
    "SCENARIOS",
    "Outcome",
    "ScenarioContext",
    "Size",
    "run_scenario",
]

#: Which process each failpoint lives in. The ``journal.*`` points fire only inside a journaled
#: (agent) task, which the chaos app does not run: the kill-and-resume tests of
#: tests/integration/test_agent_frameworks.py arm them instead.
FAILPOINT_ROLES: dict[str, str] = {
    p: {"dispatch": "dispatcher"}.get(p.split(".")[0], p.split(".")[0]) for p in POINTS if not p.startswith("journal.")
}

#: Share of DT_CHAOS_TASKS each scenario submits.
FRACTIONS: dict[str, float] = {
    "worker_kills": 1.0,
    "failpoint": 0.2,
    "dispatcher_xadd_crashes": 0.3,
    "redis_restart": 0.5,
    "postgres_restart": 0.5,
    "duplicate_submissions": 0.3,
    "zombie_worker": 0.3,
    "poison": 0.5,
    "rerun_storm": 0.5,
    "cluster_master_kill": 0.3,
    "key_limit": 0.67,
}


@dataclass(frozen=True, slots=True)
class Size:
    """How big a run is."""

    tasks: int = 300
    kills: int = 5
    settle_timeout: float = 60.0

    @classmethod
    def from_env(cls) -> Size:
        tasks = int(os.environ.get("DT_CHAOS_TASKS", "300"))
        kills = int(os.environ.get("DT_CHAOS_KILLS", "5"))
        return cls(tasks, kills, settle_timeout=max(60.0, tasks / 50))

    def share(self, scenario: str, minimum: int = 20) -> int:
        return max(minimum, int(self.tasks * FRACTIONS[scenario]))


@dataclass(slots=True)
class ScenarioContext:
    """What a scenario runs with."""

    postgres: Postgres | MySql  # the database server (MySQL/MariaDB or PostgreSQL)
    workdir: Path
    size: Size
    seed: int
    log: Callable[[str], None] = lambda _message: None
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)


@dataclass(slots=True)
class Outcome:
    """One scenario's result."""

    name: str
    seed: int
    result: CheckResult
    settle_s: float
    settle_bound_s: float
    elapsed_s: float
    evidence: dict[str, Any] = field(default_factory=dict)
    expectations: list[tuple[str, bool]] = field(default_factory=list)
    workdir: Path | None = None
    skipped: str | None = None
    #: Set when every failure of this outcome is a known library bug (see KNOWN_BUGS).
    known_bug: str | None = None

    @property
    def settled(self) -> bool:
        return self.settle_s <= self.settle_bound_s

    def failures(self) -> list[str]:
        """Why this outcome is not a pass (empty: it passes)."""
        out = []
        if not self.result.clean:
            out.append("checker found anomalies:\n" + self.result.describe())
        if not self.settled:
            out.append(f"not settled within {self.settle_bound_s:.0f}s")
        out += [f"expectation failed: {text}" for text, ok in self.expectations if not ok]
        return out

    def columns(self) -> dict[str, Any]:
        """Extra columns of the summary table."""
        return {**self.evidence, "settle_s": self.settle_s, "elapsed_s": self.elapsed_s}


class _Run:
    """Bookkeeping shared by the scenarios: timing, expectations, the final check."""

    def __init__(self, ctx: ScenarioContext, name: str) -> None:
        self.ctx = ctx
        self.name = name
        self.started = time.monotonic()
        self.expectations: list[tuple[str, bool]] = []
        self.evidence: dict[str, Any] = {}

    def expect(self, text: str, ok: bool) -> None:
        self.expectations.append((text, bool(ok)))

    def finish(
        self,
        cluster: Cluster,
        *,
        settle_timeout: float | None = None,
        tolerate: Callable[[Death], bool] = lambda _death: False,
    ) -> Outcome:
        """Settle, check, and expect that no process exited on its own (except the exits
        ``tolerate`` accepts: the scenario expects those and says why)."""
        bound = settle_timeout or self.ctx.size.settle_timeout
        self.ctx.log(f"{self.name}: settling (bound {bound:.0f}s)")
        settle_s = cluster.settle(timeout=bound)
        time.sleep(0.5)  # a late write would land now: the snapshot comes after a quiet spell
        result = cluster.check()
        # The reconciler's own count (a warning per task it sends again): the rows cannot tell a
        # delivery sent again because Redis lost its entry from one a worker lost before its claim.
        result.stats["reconciled"] = cluster.log_count("dispatching again")
        self.evidence.setdefault("kills", len(cluster.kills()))
        self.evidence.setdefault("crashes", len(cluster.crashes()))
        bad = [d for d in cluster.bad_exits() if not tolerate(d)]
        self.expect(
            f"no runtime process exited on its own ({[(d.name, d.returncode) for d in bad][:5]}; see logs/)", not bad
        )
        if cluster.redis_restarts:
            self.evidence.setdefault("redis_restarts", cluster.redis_restarts)
        self.evidence["outbox_backlog"] = cluster.outbox_backlog()
        # Not an invariant (the fences hold through it), but a bug worth seeing: a deadlock
        # aborts a claim or a lease renewal, and the reaper has to redeliver after the lease.
        # (MySQL's store retries InnoDB's deadlocks, 1213, and logs each.)
        self.evidence["deadlocks"] = cluster.log_count("deadlock detected") + cluster.log_count("InnoDB error 1213")
        return Outcome(
            self.name,
            self.ctx.seed,
            result,
            settle_s,
            bound,
            time.monotonic() - self.started,
            self.evidence,
            self.expectations,
            cluster.workdir,
        )


def _jobs(
    prefix: str, n: int, *, poison: set[int] | None = None, hold: Callable[[], int] | None = None
) -> list[tuple[str, Job]]:
    poison = poison or set()
    return [(f"{prefix}-{i}", Job(sub=i, poison=i in poison, hold_ms=hold() if hold else 0)) for i in range(n)]


def _wait(predicate: Callable[[], bool], timeout: float, poll: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


def _submit_killing_workers(run: _Run, c: Cluster, jobs: list[tuple[str, Job]], k: int, rng: random.Random) -> None:
    """Submit ``jobs`` while SIGKILLing a ready worker ``k`` times at random moments (the
    supervisor restarts each), paced so that the kills come about a second apart: a killed
    worker takes ~2 s to come back."""
    n = len(jobs)
    rate = min(150.0, max(20.0, n / (k * 1.0)))
    submitter = RateSubmitter(c, jobs, rate=rate).start()
    interval = (n / rate) / (k + 1)
    kills = 0
    while kills < k:
        time.sleep(rng.uniform(0.5, 1.5) * interval)
        victims = [p for p in c.procs("worker") if c.is_ready(p)]
        if victims:
            c.kill(rng.choice(victims))
            kills += 1
    submitter.join()
    run.expect(f"at least {k} workers SIGKILLed (got {kills})", len(c.kills()) >= k)


#: Scenarios that reproduce a known library bug every time: expected to fail until it is
#: fixed (empty: a poison task takes no healthy one to the DLQ, since the worker runs a
#: suspect attempt alone; see docs/reliability.md).
KNOWN_BUGS: dict[str, str] = {}

#: Scenarios run on PostgreSQL only: a real Redis Cluster's failover is the same whatever database
#: sits behind it, and the harness crash-restarts only a server it started itself.
POSTGRES_ONLY = frozenset({"cluster_master_kill", "postgres_restart"})


# -- (1) random SIGKILLs of workers ------------------------------------------------------------


def worker_kills(ctx: ScenarioContext) -> Outcome:
    """SIGKILL a random worker every so often while tasks run; the supervisor restarts it."""
    run = _Run(ctx, "worker_kills")
    n, k, rng = ctx.size.share("worker_kills"), ctx.size.kills, ctx.rng
    with cluster_on(ctx.postgres, ctx.workdir / run.name) as c:
        c.start(workers=3)
        _submit_killing_workers(run, c, _jobs("kill", n, hold=lambda: rng.randint(0, 200)), k, rng)
        outcome = run.finish(c)
        run.expect("a kill landed on a task in flight (reclaims > 0)", outcome.result.stats["reclaims"] > 0)
        return outcome


# -- (2) each failpoint, crash*1, in one process -----------------------------------------------


def failpoint(ctx: ScenarioContext, point: str) -> Outcome:
    """Arm ``point=crash*1`` in one process: it SIGKILLs itself inside that window once."""
    name = f"failpoint[{point}]"
    run = _Run(ctx, name)
    role = FAILPOINT_ROLES[point]
    n = ctx.size.share("failpoint")
    with cluster_on(ctx.postgres, ctx.workdir / name.replace("[", "-").rstrip("]")) as c:
        armed = f"{point}=crash*1"
        if role == "worker":
            c.start(workers=0)
            c.spawn("worker", failpoints=armed)
        elif role == "dispatcher":
            c.start(dispatchers=0, workers=1)
            c.spawn("dispatcher", failpoints=armed)
        else:  # the reaper has something to reclaim once a worker dies after claiming
            c.start(workers=0, reapers=0)
            c.spawn("worker", failpoints="worker.after_claim=crash*1")
            c.spawn("reaper", failpoints=armed)
        submitter = RateSubmitter(c, _jobs("fp", n), rate=150).start()
        crashed = _wait(lambda: any(d.failpoints == armed for d in c.crashes(role)), timeout=30)
        run.expect(f"the {role} crashed at {point}", crashed)
        if role == "worker":
            c.spawn("worker")  # a healthy one, now that the armed one has crashed
        submitter.join()
        return run.finish(c)


# -- (3) the dispatcher dies between XADD and mark-SENT, again and again ---------------------


def dispatcher_xadd_crashes(ctx: ScenarioContext) -> Outcome:
    """``dispatch.after_xadd=crash`` for several lives in a row: every republish of a claimed
    row must reuse its dedup key (no reaper here, so nothing trims the stream: the test reads
    every entry ever added)."""
    run = _Run(ctx, "dispatcher_xadd_crashes")
    n = ctx.size.share("dispatcher_xadd_crashes")
    lives = max(3, ctx.size.kills)
    with cluster_on(ctx.postgres, ctx.workdir / run.name, restart_delay=0.0) as c:
        c.start(dispatchers=0, workers=2, reapers=0)
        c.spawn("dispatcher", failpoints="dispatch.after_xadd=crash", failpoint_lives=lives)
        submitter = RateSubmitter(c, _jobs("xadd", n), rate=150).start()
        # The lives are a chain: each starts after the last crash and crashes once it has
        # re-claimed rows whose lease the last one left (no restart delay). A process's start
        # took up to 25 s in make test's four loaded pytest processes: 20 s per life.
        _wait(lambda: len(c.crashes("dispatcher")) >= lives, timeout=30 + 20 * lives)
        submitter.join()
        crashes = len(c.crashes("dispatcher"))
        run.evidence["dispatcher_crashes"] = crashes
        run.expect(f"the dispatcher crashed after XADD {lives} times (got {crashes})", crashes >= lives)
        outcome = run.finish(c)
        per_delivery = Counter((f.get("t"), f.get("g"), f.get("d")) for _, f in c.stream_entries())
        duplicates = sum(count - 1 for count in per_delivery.values() if count > 1)
        run.evidence["stream_entries"] = sum(per_delivery.values())
        run.expect(f"every delivery is in the stream once ({duplicates} extra entries)", duplicates == 0)
        return outcome


# -- (4, 5) Redis restarts ----------------------------------------------------------------------


def redis_restart(ctx: ScenarioContext, aof: bool) -> Outcome:
    """Restart Redis mid-run (SIGKILL, same port and directory), then once more with a
    backlog of published-but-unread entries while the workers are down. Without AOF the
    entries vanish and the reconciler must dispatch each again; with AOF they survive."""
    name = f"redis_restart[{'aof' if aof else 'no-aof'}]"
    run = _Run(ctx, name)
    n = ctx.size.share("redis_restart")
    with cluster_on(ctx.postgres, ctx.workdir / name.replace("[", "-").rstrip("]"), redis_aof=aof) as c:
        c.start(workers=2)
        # Phase A: a restart while everything runs.
        first = _jobs("redis-a", n // 2, hold=lambda: ctx.rng.randint(0, 30))
        rate = 100.0
        submitter = RateSubmitter(c, first, rate=rate).start()
        time.sleep(len(first) / rate * ctx.rng.uniform(0.3, 0.6))
        c.restart_redis()
        submitter.join()
        c.settle(timeout=ctx.size.settle_timeout)
        # Phase B: workers down, a backlog published, then Redis restarts.
        workers = c.procs("worker")
        for w in workers:
            c.kill(w, restart=False)
        backlog = _jobs("redis-b", n - n // 2)
        ids = [c.submit(key, job) for key, job in backlog]
        published = _wait(lambda: set(c.task_states(ids).values()) == {"ENQUEUED"}, timeout=30)
        run.expect("the backlog was published before the restart", published)
        c.restart_redis()
        for w in workers:
            c.bring_up(w.name)
        outcome = run.finish(c)
        reconciled = outcome.result.stats["reconciled"]
        if aof:
            run.expect(f"AOF kept every entry: nothing to reconcile (reconciled {reconciled})", reconciled == 0)
        else:
            run.expect(
                f"the reconciler re-dispatched the lost backlog ({reconciled} >= {len(ids)})", reconciled >= len(ids)
            )
        return outcome


# -- (6) PostgreSQL crash-restarts ---------------------------------------------------------------


def postgres_restart(ctx: ScenarioContext) -> Outcome:
    """Crash-restart PostgreSQL twice mid-run (``pg_ctl restart -m immediate``): every
    connection drops, some mid-commit. Submitters retry with the same idempotency key."""
    run = _Run(ctx, "postgres_restart")
    if not ctx.postgres.restartable:
        outcome = Outcome(run.name, ctx.seed, CheckResult(), 0.0, 0.0, 0.0)
        outcome.skipped = "DT_CHAOS_DATABASE_URL points at a server the harness does not own"
        return outcome
    n = ctx.size.share("postgres_restart")
    with cluster_on(ctx.postgres, ctx.workdir / run.name) as c:
        c.start(workers=2)
        rate = 100.0
        jobs = _jobs("pg", n, hold=lambda: ctx.rng.randint(0, 30))
        submitter = RateSubmitter(c, jobs, rate=rate).start()
        began, duration = time.monotonic(), n / rate
        downtime = 0.0
        for at in (0.3, 0.65):
            time.sleep(max(0.0, duration * at - (time.monotonic() - began)))
            downtime += ctx.postgres.restart()
        submitter.join()
        run.evidence["pg_restarts"] = 2
        run.evidence["pg_downtime_s"] = round(downtime, 2)
        return run.finish(c)


# -- (7) duplicate submissions from concurrent processes -----------------------------------------


def duplicate_submissions(ctx: ScenarioContext) -> Outcome:
    """Three submitter processes race through the same idempotency keys in the same order."""
    run = _Run(ctx, "duplicate_submissions")
    n = ctx.size.share("duplicate_submissions")
    with cluster_on(ctx.postgres, ctx.workdir / run.name) as c:
        c.start(workers=2)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DT_")}
        env |= {
            "DT_DATABASE_URL": c.database_url,
            "DT_REDIS_URL": c.redis_url,
            "DT_NAMESPACE": c.namespace,
            "DT_DATA_DIR": str(c.workdir / "data" / "submitters"),
            "DT_CHAOS_HISTORY_DIR": str(c.history_dir),
            "PYTHONPATH": str(REPO_ROOT),
        }
        start_at = time.time() + 3.0
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for i in range(3):
                log = (c.logs_dir / f"submitter-{i}.log").open("wb")
                cmd = [sys.executable, "-m", "tests.chaos.submitter", "--prefix", "dup", "--count", str(n)]
                procs.append(
                    subprocess.Popen(
                        [*cmd, "--start-at", str(start_at)], cwd=REPO_ROOT, env=env, stdout=log, stderr=log
                    )
                )
                log.close()
            codes = [p.wait(timeout=120 + n / 5) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGKILL)
                    p.wait()
        run.expect(f"every submitter exited 0 ({codes})", codes == [0, 0, 0])
        outcome = run.finish(c)
        created = Counter(
            str(e["key"])
            for e in read_history(c.history_dir)
            if e.get("op") == "submit" and e.get("type") == "ok" and e.get("created")
        )
        wrong = [key for key in (f"dup-{i}" for i in range(n)) if created.get(key, 0) != 1]
        oks = sum(1 for e in read_history(c.history_dir) if e.get("op") == "submit" and e.get("type") == "ok")
        run.evidence["submits_ok"] = oks
        run.expect(f"each key created exactly once ({len(wrong)} keys otherwise: {wrong[:5]})", not wrong)
        return outcome


# -- (8) a zombie worker ----------------------------------------------------------------------


def zombie_worker(ctx: ScenarioContext) -> Outcome:
    """SIGSTOP a worker while it runs tasks, wait until another worker has redone and
    committed them, SIGCONT it: its late commits must be fenced out, its XACKs harmless."""
    run = _Run(ctx, "zombie_worker")
    n = ctx.size.share("zombie_worker")
    holds = 3
    with cluster_on(ctx.postgres, ctx.workdir / run.name) as c:
        c.start(workers=1)
        zombie = c.procs("worker")[0]
        held = [c.submit(f"hold-{i}", Job(sub=100_000 + i, hold_ms=1500)) for i in range(holds)]

        def zombie_runs_them() -> bool:
            running = {
                str(e["task_id"])
                for e in read_history(c.history_dir)
                if e.get("op") == "exec" and e.get("type") == "invoke" and e.get("pid") == zombie.pid
            }
            return set(held) <= running

        run.expect("the zombie started every held task", _wait(zombie_runs_them, timeout=30, poll=0.05))
        c.pause_outside_transactions(zombie)
        c.spawn("worker")
        submitter = RateSubmitter(c, _jobs("zombie", n), rate=150).start()
        redone = _wait(lambda: set(c.task_states(held).values()) == {"SUCCEEDED"}, timeout=30)
        run.expect("another worker finished the held tasks while the zombie slept", redone)
        c.resume(zombie)
        late = _wait(lambda: _fenced_out(c, held) >= holds, timeout=10)
        run.expect(f"the zombie's {holds} late commits were fenced out", late)
        submitter.join()
        outcome = run.finish(c)
        run.expect("the zombie survived its fenced-out commits", zombie.alive())
        writers = {row.pid for row in c.snapshot().audit if row.task_id in held}
        run.expect(f"no final write came from the zombie (writers {writers})", zombie.pid not in writers)
        pel = c.pel_size()
        run.evidence["pel_after"] = pel
        run.expect(f"nothing left pending in the stream ({pel})", pel == 0)
        return outcome


def _fenced_out(c: Cluster, task_ids: list[str]) -> int:
    from durable_tasks.records import attempts_table

    a = attempts_table.c
    query = sa.select(sa.func.count()).where(a.task_id.in_(task_ids), a.outcome == "fenced_out")
    with c.app.runtime.store.read_engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


# -- (9) poison ------------------------------------------------------------------------------


def poison(ctx: ScenarioContext) -> Outcome:
    """A few tasks SIGKILL their worker on every delivery: each must end DEAD in the DLQ after
    max_deliveries (3), and nothing else may."""
    run = _Run(ctx, "poison")
    n = ctx.size.share("poison")
    count = max(2, min(20, n // 75))
    marked = set(ctx.rng.sample(range(n), count))
    with cluster_on(ctx.postgres, ctx.workdir / run.name) as c:
        c.start(workers=3)
        submitter = RateSubmitter(c, _jobs("poison", n, poison=marked), rate=100).start()
        submitter.join()
        outcome = run.finish(c, settle_timeout=ctx.size.settle_timeout + 10 * count)
        crashes = len(c.crashes("worker"))
        run.expect(f"poison killed workers ({crashes} crashes for {count} poison tasks)", crashes >= count)
        return outcome


def poison_collateral(ctx: ScenarioContext) -> Outcome:
    """(9b, deterministic) Four healthy tasks are running on the only worker when a poison
    task arrives: the healthy ones must finish, and only the poison task may be dead-lettered."""
    run = _Run(ctx, "poison_collateral")
    with cluster_on(ctx.postgres, ctx.workdir / run.name) as c:
        c.start(workers=1)
        healthy = [c.submit(f"beside-{i}", Job(sub=i, hold_ms=3000)) for i in range(4)]

        def running() -> bool:
            started = {str(e["task_id"]) for e in read_history(c.history_dir) if e.get("op") == "exec"}
            return set(healthy) <= started

        run.expect("the healthy tasks were running when the poison task arrived", _wait(running, timeout=30))
        poison_id = c.submit("poison-0", Job(sub=99, poison=True))
        limit = c.app.settings.max_deliveries
        # Lost beside the healthy tasks, it becomes a suspect: it runs again in groups of
        # suspects (with the healthy ones, which it takes down each time) that shrink with each
        # loss, uncounted, until it runs alone and dies max_deliveries more times, counted.
        grouped = 0
        while suspect_group_limit(grouped + 1, c.app.settings.concurrency) > 1:
            grouped += 1
        lives = 1 + grouped + limit
        # Its runs are one chain of worker lives (each run kills the only worker, the next run
        # needs the next process to start), beside the four healthy tasks' 3 s each. A worker's
        # start took 14 to 25 s in make test's four loaded processes: allow 20 s per life.
        outcome = run.finish(c, settle_timeout=ctx.size.settle_timeout + 20 * lives)
        runs = sum(
            1
            for e in read_history(c.history_dir)
            if e.get("op") == "exec" and e.get("type") == "invoke" and e.get("task_id") == poison_id
        )
        run.expect(
            f"the poison task ran 1 + {grouped} in groups + max_deliveries ({limit}) times, "
            f"killing its worker each time ({runs})",
            runs == lives,
        )
        return outcome


# -- (10) rerun storms --------------------------------------------------------------------------


def rerun_storm(ctx: ScenarioContext) -> Outcome:
    """Rerun running tasks again and again while their executions are in flight: only the
    last generation's result may land."""
    run = _Run(ctx, "rerun_storm")
    n = ctx.size.share("rerun_storm")
    rng = ctx.rng
    with cluster_on(ctx.postgres, ctx.workdir / run.name) as c:
        c.start(workers=2)
        submitter = RateSubmitter(c, _jobs("rerun", n, hold=lambda: rng.randint(50, 250)), rate=100).start()
        stop = threading.Event()
        errors: list[BaseException] = []

        def storm() -> None:
            from durable_tasks.records import tasks_table

            t = tasks_table.c
            try:
                while not stop.is_set():
                    with c.app.runtime.store.read_engine.connect() as conn:
                        running = list(
                            conn.execute(
                                sa.select(t.id).where(t.namespace == c.namespace, t.state == "RUNNING").limit(20)
                            ).scalars()
                        )
                    for task_id in rng.sample(running, min(len(running), 3)):
                        c.rerun(task_id)
                    time.sleep(0.03)
            except BaseException as exc:
                errors.append(exc)

        stormer = threading.Thread(target=storm, name="chaos-reruns", daemon=True)
        stormer.start()
        submitter.join()
        time.sleep(1.0)
        stop.set()
        stormer.join()
        run.expect(f"the rerun thread ran without errors ({errors[:1]})", not errors)
        outcome = run.finish(c)
        run.expect(f"reruns happened ({outcome.result.stats['reruns']})", outcome.result.stats["reruns"] >= 5)
        run.expect(
            f"a superseded execution was fenced out ({outcome.result.stats['fenced_out']})",
            outcome.result.stats["fenced_out"] >= 1,
        )
        return outcome


# -- (11) a Redis Cluster master dies --------------------------------------------------------------

#: Seconds the victim master acknowledges writes that no replica receives before it dies.
LOSS_WINDOW = 0.6


def cluster_master_kill(ctx: ScenarioContext) -> Outcome:
    """A real 3-master (+3 replica) Redis Cluster, the chaos queue in 3 partitions (one per
    master): SIGKILL the master of one partition while it holds writes no replica has, and a
    worker with it. Its replica is promoted; the reconciler sends again what the failover lost.

    Replication on loopback is too quick to lose anything by chance, so the loss is arranged:
    the workers stall (SIGSTOP, so a backlog builds), the victim's replica is frozen (SIGSTOP,
    shorter than cluster-node-timeout) and its link cut (CLIENT KILL TYPE replica), the
    dispatcher publishes to the master alone for LOSS_WINDOW seconds, then the master is
    SIGKILLed and the replica thawed. The cluster promotes it on its own (node timeout 1 s);
    ``CLUSTER FAILOVER TAKEOVER`` forces it if that has not happened within 10 s."""
    run = _Run(ctx, "cluster_master_kill")
    # The submitter runs until AFTER_FAILOVER jobs went in after the promotion (at most n): the
    # loss window and the failover both need submissions, and on a loaded machine pausing the
    # workers alone can outlast a fixed-size run (no entry reached the victim in the window
    # nor after the failover: the submitter had run out before the cut).
    n, rate, rng = max(3000, ctx.size.share("cluster_master_kill")), 100.0, ctx.rng
    workdir = ctx.workdir / run.name
    nodes = start_cluster(workdir / "redis-cluster")
    try:
        namespace = _namespace_over_every_master(nodes, 3)
        with cluster_on(ctx.postgres, workdir, namespace=namespace, redis_url=nodes.url, partitions=3) as c:
            c.start(workers=2)
            keys = c.stream_keys()
            owners = {key: nodes.master_of(key) for key in keys}
            ports = sorted({node.port for node in owners.values()})
            run.expect(f"the 3 partitions live on 3 different masters ({ports})", len(ports) == 3)
            partition = rng.randrange(len(keys))
            victim = owners[keys[partition]]
            replica = nodes.replica_of(victim)
            submitter = RateSubmitter(c, _jobs("master", n, hold=lambda: rng.randint(0, 50)), rate=rate).start()
            time.sleep(max(0.8, 0.3 * n / rate))
            workers = c.procs("worker")
            cut_ms, killed_ms = _kill_with_unreplicated_writes(c, nodes, victim, replica, submitter)
            c.kill(rng.choice(workers))  # the supervisor restarts it, during the failover
            method = nodes.promote(replica, victim)
            promoted_at = time.time()
            submitter.stop_after(AFTER_FAILOVER)
            submitter.join()

            def refused_during_failover(death: Death) -> bool:
                # A process (re)started during the failover exits 2 ("cannot reach Redis") when
                # the dead master is the cluster client's default node: redis-py cannot
                # initialize the client without it. The supervisor starts it again.
                return death.returncode == 2 and death.at <= promoted_at + 2.0

            outcome = run.finish(c, tolerate=refused_during_failover)
            refusals = [d for d in c.bad_exits() if refused_during_failover(d)]
            served = sum(
                1
                for e in read_history(c.history_dir)
                if e.get("op") == "exec" and e.get("type") == "ok" and killed_ms / 1000 < e["ts"] < promoted_at
            )
            run.evidence |= {
                "execs_in_failover": served,
                "failover": method,
                "failover_s": round(promoted_at - killed_ms / 1000, 1),
                "startup_refusals": len(refusals),
            }
            run.expect(
                f"each tolerated exit was a startup refusal ({len(refusals)})",
                c.log_count("cannot reach Redis") >= len(refusals),
            )
            run.expect(
                f"master :{victim.port} (pid {victim.proc.pid}) was SIGKILLed",
                victim.proc.returncode == -signal.SIGKILL,
            )
            run.expect(f"replica :{replica.port} is now the master", nodes.role(replica) == "master")
            run.expect(
                f"partition {partition} is served by the promoted replica", nodes.master_of(keys[partition]) is replica
            )
            _expect_loss_recovered(run, c, partition, keys[partition], cut_ms, killed_ms)
            return outcome
    finally:
        nodes.stop()


#: Jobs submitted after the failover: enough that each of the 3 partitions takes some
#: (none on a given one: (2/3)^60, about 3e-11).
AFTER_FAILOVER = 60


def _kill_with_unreplicated_writes(
    c: Cluster, nodes: RedisCluster, victim: RedisNode, replica: RedisNode, submitter: RateSubmitter
) -> tuple[float, float]:
    """Stall the workers, freeze ``replica`` and cut its link, let ``victim`` take writes alone
    for LOSS_WINDOW seconds, SIGKILL it, then thaw the replica and resume the workers.
    Returns the wall-clock ms of the cut and of the kill: stream entries between them are lost.
    The submissions wait while the workers are stopped (each outside a transaction), and go on
    before the cut, so the victim takes writes alone."""
    workers = c.procs("worker")
    with submitter.held():
        for w in workers:
            c.pause_outside_transactions(w)
    try:
        nodes.freeze(replica)
        try:
            nodes.cut_replication(victim)
            cut_ms = time.time() * 1000
            time.sleep(LOSS_WINDOW)
            nodes.kill(victim)
            killed_ms = time.time() * 1000
        finally:
            nodes.thaw(replica)
    finally:
        for w in workers:
            c.resume(w)
    return cut_ms, killed_ms


def _namespace_over_every_master(nodes: RedisCluster, partitions: int) -> str:
    """A chaos namespace whose partitions' hash tags fall on ``partitions`` different masters
    (the tag includes the namespace, so a random one often puts two on one master)."""
    for _ in range(1000):
        namespace = f"chaos{uuid.uuid4().hex[:8]}"
        keys = [QueueKeys(namespace, QUEUE, p).stream for p in range(partitions)]
        if len({nodes.master_of(key).port for key in keys}) == partitions:
            return namespace
    raise RuntimeError(f"no namespace spreads {partitions} partitions over {partitions} masters")


def _expect_loss_recovered(run: _Run, c: Cluster, partition: int, stream: str, cut_ms: float, killed_ms: float) -> None:
    """The deliveries the dead master acknowledged after the cut are gone from the promoted
    replica, each was sent again (a later delivery of its task), and the partition took new
    entries after the failover."""
    from durable_tasks.records import outbox_table, tasks_table

    o, t = outbox_table.c, tasks_table.c
    query = sa.select(o.task_id, o.generation, o.delivery, o.stream_id).where(
        o.namespace == c.namespace, o.partition == partition, o.stream_id.is_not(None)
    )
    with c.app.runtime.store.read_engine.connect() as conn:
        rows = conn.execute(query).all()
        deliveries = {
            (r.task_id, r.generation, r.delivery)
            for r in conn.execute(sa.select(o.task_id, o.generation, o.delivery).where(o.namespace == c.namespace))
        }
        lost = [r for r in rows if cut_ms < int(str(r.stream_id).split("-")[0]) <= killed_ms]
        finished = conn.execute(sa.select(t.finished_at).where(t.id.in_([r.task_id for r in lost]))).scalars().all()
    if lost and all(finished):
        last = max(f if f.tzinfo else f.replace(tzinfo=UTC) for f in finished)
        run.evidence["lost_done_s"] = round(last.timestamp() - killed_ms / 1000, 1)
    kept = [r.stream_id for r in lost if c.redis_client.xrange(stream, min=r.stream_id, max=r.stream_id)]
    resent = [r for r in lost if (r.task_id, r.generation, r.delivery + 1) in deliveries]
    after = sum(1 for r in rows if int(str(r.stream_id).split("-")[0]) > killed_ms)
    run.evidence |= {"lost_entries": len(lost), "served_after": after}
    run.expect(f"the dead master acknowledged entries no replica had ({len(lost)})", len(lost) >= 1)
    run.expect(f"none of them survived the failover ({kept[:3]})", not kept)
    run.expect(f"each lost delivery was sent again ({len(resent)} of {len(lost)})", len(resent) == len(lost))
    run.expect(f"partition {partition} took {after} new entries after the failover", after >= 1)


# -- registry ------------------------------------------------------------------------------------


# -- per-key concurrency limit under worker SIGKILLs (durable_tasks.flow) -----------------------


def key_limit(ctx: ScenarioContext) -> Outcome:
    """Limit 1 per concurrency key, 3 workers, tasks over 10 keys, workers SIGKILLed mid-run:
    no two finished executions of one key overlap (the checker's key-over-limit) and every
    task still finishes, so the slot a killed worker held came back when its lease ran out."""
    run = _Run(ctx, "key_limit")
    n, k, rng = ctx.size.share("key_limit", minimum=200), ctx.size.kills, ctx.rng
    with cluster_on(ctx.postgres, ctx.workdir / run.name, settings={"DT_CHAOS_KEY_LIMIT": "1"}) as c:
        c.start(workers=3)
        jobs = [(f"keyed-{i}", Job(sub=i, key=f"user:{i % 10}", hold_ms=rng.randint(0, 40))) for i in range(n)]
        _submit_killing_workers(run, c, jobs, k, rng)
        outcome = run.finish(c, settle_timeout=max(ctx.size.settle_timeout, n / 2))
        keyed = [e for e in read_history(c.history_dir) if e.get("op") == "exec" and e.get("ckey")]
        run.expect("every execution carried its key (the invariant had data)", len(keyed) >= 2 * n)
        return outcome


def _bind(fn: Callable[..., Outcome], *args: Any) -> Callable[[ScenarioContext], Outcome]:
    return lambda ctx: fn(ctx, *args)


SCENARIOS: dict[str, Callable[[ScenarioContext], Outcome]] = {
    "worker_kills": worker_kills,
    **{f"failpoint[{p}]": _bind(failpoint, p) for p in sorted(FAILPOINT_ROLES)},
    "dispatcher_xadd_crashes": dispatcher_xadd_crashes,
    "redis_restart[no-aof]": _bind(redis_restart, False),
    "redis_restart[aof]": _bind(redis_restart, True),
    "postgres_restart": postgres_restart,
    "duplicate_submissions": duplicate_submissions,
    "zombie_worker": zombie_worker,
    "poison": poison,
    "poison_collateral": poison_collateral,
    "rerun_storm": rerun_storm,
    "cluster_master_kill": cluster_master_kill,
    "key_limit": key_limit,
}


def run_scenario(name: str, ctx: ScenarioContext) -> Outcome:
    """Run scenario ``name``."""
    ctx.log(f"{name}: start (seed {ctx.seed}, {ctx.size.tasks} tasks, {ctx.size.kills} kills)")
    outcome = SCENARIOS[name](ctx)
    ctx.log(f"{name}: done in {outcome.elapsed_s:.1f}s, settled in {outcome.settle_s:.1f}s")
    return outcome
