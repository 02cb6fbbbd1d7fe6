"""arq 0.28; worker with its defaults (max_jobs=10, poll_delay=0.5 s)."""

import asyncio
import time

from arq import create_pool
from arq.connections import RedisSettings
from peerlib import apace, flush_redis, rec, redis_url

DB = 2
BACKEND = "redis"
SETTINGS = RedisSettings.from_dsn(redis_url(DB))
CONFIG = "defaults: max_jobs=10, poll_delay=0.5s"
WORKER_CMD = ["arq", "p_arq.WorkerSettings"]


async def noop(ctx, ts):
    rec(ts)


class WorkerSettings:
    functions = [noop]  # noqa: RUF012
    redis_settings = SETTINGS


def reset():
    flush_redis(DB)


def produce(n, rate, warmup=False):
    async def go():
        pool = await create_pool(SETTINGS)
        t0 = time.perf_counter()
        for i in range(n):
            await apace(i, t0, rate)
            await pool.enqueue_job("noop", -1.0 if warmup else time.time())
        elapsed = time.perf_counter() - t0
        await pool.aclose()
        return elapsed

    return asyncio.run(go())
