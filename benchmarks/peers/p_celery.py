"""celery 5.7 on Redis, no result backend; worker: --pool=solo (one process, one task at a time)."""

import time

from celery import Celery
from peerlib import flush_redis, pace, rec, redis_url

DB = 4
BACKEND = "redis"
app = Celery("p_celery", broker=redis_url(DB))
app.conf.worker_hijack_root_logger = False
CONFIG = "--pool=solo (1 process), default prefetch multiplier 4"
WORKER_CMD = ["celery", "-A", "p_celery", "worker", "--pool=solo", "--concurrency=1", "--loglevel=WARNING"]


@app.task(name="noop")
def noop(ts):
    rec(ts)


def reset():
    flush_redis(DB)


def produce(n, rate, warmup=False):
    t0 = time.perf_counter()
    for i in range(n):
        pace(i, t0, rate)
        noop.delay(-1.0 if warmup else time.time())
    return time.perf_counter() - t0
