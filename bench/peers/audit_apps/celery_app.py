"""Celery under audit (Redis transport, default prefork pool). Settings, from Celery's docs on
reliability ("Should I use retry or acks_late?", task_reject_on_worker_lost, the Redis
transport's visibility timeout):

* task_acks_late=True: the message is acknowledged after the task ran, not before.
* task_reject_on_worker_lost=True: when the pool child running a task is killed, the message is
  requeued instead of acknowledged as failed. Celery's docs warn it may run a task in a loop; they
  also say it is what makes acks_late survive a killed child, which is the fault we inject.
* visibility_timeout=5 s (default 1 h), unacked_restore_interval=1, unacked_restore_throttle=1:
  a message taken but never acknowledged is restored after 5 s instead of an hour; the docs say a
  task running longer than that is delivered again (our tasks take 0.2 s).
* worker_prefetch_multiplier=1, as the docs advise with acks_late for long tasks.
"""

from __future__ import annotations

import os
import sys
import time

from _record import TASK_SECONDS, record, task_name
from celery import Celery

app = Celery("audit", broker=os.environ.get("AUDIT_REDIS_URL", "redis://127.0.0.1:1/0"))
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_default_queue="audit",
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    broker_transport_options={
        "visibility_timeout": 5,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
)


@app.task(name="audit.job")
def job(task: str) -> None:
    record("start", task)
    time.sleep(TASK_SECONDS)
    record("done", task)


if __name__ == "__main__" and sys.argv[1] == "enqueue":
    app.conf.broker_url = sys.argv[2]
    for i in range(int(sys.argv[3])):
        app.send_task("audit.job", args=[task_name(i)], task_id=task_name(i))
