"""dramatiq 2.2 with its Redis broker; worker: 1 process, 8 threads (its default thread count)."""

import time

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from peerlib import flush_redis, pace, rec, redis_url

DB = 1
BACKEND = "redis"
broker = RedisBroker(url=redis_url(DB))
dramatiq.set_broker(broker)
CONFIG = "--processes 1 --threads 8 (default threads)"
WORKER_CMD = ["dramatiq", "p_dramatiq", "--processes", "1", "--threads", "8"]


@dramatiq.actor(max_retries=0)
def noop(ts):
    rec(ts)


def reset():
    flush_redis(DB)


def produce(n, rate, warmup=False):
    t0 = time.perf_counter()
    for i in range(n):
        pace(i, t0, rate)
        noop.send(-1.0 if warmup else time.time())
    return time.perf_counter() - t0
