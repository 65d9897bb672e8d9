"""RQ under audit: the job function the default `rq worker` (fork per job) runs, and the
enqueuer. Jobs carry Retry(max=3): RQ's documented way to run a job again after a failure,
including a work horse killed mid-job and a job found abandoned by the maintenance task."""

from __future__ import annotations

import sys
import time

from _record import TASK_SECONDS, record, task_name


def job(task: str) -> None:
    record("start", task)
    time.sleep(TASK_SECONDS)
    record("done", task)


def enqueue(url: str, n: int) -> None:
    import redis
    from rq import Queue, Retry

    queue = Queue("audit", connection=redis.Redis.from_url(url))
    for i in range(n):
        queue.enqueue(
            "rq_app.job",
            task_name(i),
            job_id=task_name(i),
            retry=Retry(max=3),
            job_timeout=5,
            result_ttl=600,
        )


if __name__ == "__main__" and sys.argv[1] == "enqueue":
    enqueue(sys.argv[2], int(sys.argv[3]))
