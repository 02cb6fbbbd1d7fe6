"""saq 0.26; worker: --workers 1, concurrency=10 (its default)."""

import asyncio
import time

from peerlib import apace, flush_redis, rec, redis_url
from saq import Queue

DB = 5
BACKEND = "redis"
queue = Queue.from_url(redis_url(DB))
CONFIG = "--workers 1, concurrency=10 (default)"
WORKER_CMD = ["saq", "p_saq.settings", "--workers", "1"]


async def noop(ctx, *, ts):
    rec(ts)


settings = {"queue": queue, "functions": [noop], "concurrency": 10}


def reset():
    flush_redis(DB)


def produce(n, rate, warmup=False):
    async def go():
        q = Queue.from_url(redis_url(DB))
        await q.connect()
        t0 = time.perf_counter()
        for i in range(n):
            await apace(i, t0, rate)
            await q.enqueue("noop", ts=-1.0 if warmup else time.time())
        elapsed = time.perf_counter() - t0
        await q.disconnect()
        return elapsed

    return asyncio.run(go())
