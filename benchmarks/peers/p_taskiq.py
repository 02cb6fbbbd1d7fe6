"""taskiq 0.13 + taskiq-redis 1.2 RedisStreamBroker; worker: 1 process, default max_async_tasks."""

import asyncio
import time

from peerlib import apace, flush_redis, rec, redis_url
from taskiq_redis import RedisStreamBroker

DB = 3
BACKEND = "redis"
broker = RedisStreamBroker(url=redis_url(DB))
CONFIG = "RedisStreamBroker, --workers 1, default max_async_tasks"
WORKER_CMD = ["taskiq", "worker", "p_taskiq:broker", "--workers", "1"]


@broker.task
async def noop(ts):
    rec(ts)


def reset():
    flush_redis(DB)


def produce(n, rate, warmup=False):
    async def go():
        await broker.startup()
        t0 = time.perf_counter()
        for i in range(n):
            await apace(i, t0, rate)
            await noop.kiq(-1.0 if warmup else time.time())
        elapsed = time.perf_counter() - t0
        await broker.shutdown()
        return elapsed

    return asyncio.run(go())
