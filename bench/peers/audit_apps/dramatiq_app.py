"""dramatiq under audit: its Redis broker (messages acknowledged after the actor ran, unacked
messages of a worker whose heartbeat stops are requeued by any broker's maintenance). Shortened
timeouts: heartbeat_timeout 3 s (default 60 s) and maintenance_chance 1,000,000 per million
(default 1,000: maintenance on every fetch instead of one in a thousand), so that a dead worker's
messages are requeued within seconds."""

from __future__ import annotations

import os
import sys
import time

import dramatiq
from _record import TASK_SECONDS, record, task_name
from dramatiq.brokers.redis import RedisBroker

broker = RedisBroker(
    url=os.environ.get("AUDIT_REDIS_URL", "redis://127.0.0.1:1/0"),
    heartbeat_timeout=3000,
    maintenance_chance=1_000_000,
)
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="audit", max_retries=3)
def job(task: str) -> None:
    record("start", task)
    time.sleep(TASK_SECONDS)
    record("done", task)


if __name__ == "__main__" and sys.argv[1] == "enqueue":
    for i in range(int(sys.argv[3])):
        job.send(task_name(i))
