"""saq under audit: `saq saq_app.settings`. Defaults, except: each job has retries=3 (default 1,
i.e. one attempt: a swept job is aborted, not run again -- saq's documented knob for another
attempt) and timeout=5 s (default 10 s: a job of a dead worker is "stuck", so swept, after 5 s);
the sweep timer is 1 s (default 60 s), but saq's Queue.sweep takes a 60 s lock, so a sweep runs
at most once a minute whatever the timer."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from _record import TASK_SECONDS, record, task_name
from saq import Queue

queue = Queue.from_url(os.environ.get("AUDIT_REDIS_URL", "redis://127.0.0.1:1/0"), name="audit")


async def job(ctx: Any, *, task: str) -> None:
    record("start", task)
    await asyncio.sleep(TASK_SECONDS)
    record("done", task)


settings = {"queue": queue, "functions": [job], "concurrency": 1, "timers": {"sweep": 1}}


async def enqueue(n: int) -> None:
    for i in range(n):
        await queue.enqueue("job", key=task_name(i), task=task_name(i), retries=3, timeout=5)


if __name__ == "__main__" and sys.argv[1] == "enqueue":
    queue = Queue.from_url(sys.argv[2], name="audit")
    asyncio.run(enqueue(int(sys.argv[3])))
