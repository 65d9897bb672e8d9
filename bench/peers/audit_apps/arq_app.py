"""arq under audit: `arq arq_app.WorkerSettings`. Defaults (max_tries 5; a job whose in-progress
key outlives its worker is run again once the key expires), except job_timeout=2 s (default
300 s), which makes the in-progress key expire job_timeout + 10 s = 12 s after a dead worker took
the job, and max_jobs=1 (one task at a time, like every other worker in the audit)."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any, ClassVar

from _record import TASK_SECONDS, record, task_name
from arq.connections import RedisSettings, create_pool


async def job(ctx: Any, task: str) -> None:
    record("start", task)
    await asyncio.sleep(TASK_SECONDS)
    record("done", task)


class WorkerSettings:
    functions: ClassVar = [job]
    redis_settings = RedisSettings.from_dsn(
        os.environ.get("AUDIT_REDIS_URL", "redis://127.0.0.1:1/0")
    )
    job_timeout = 2
    max_jobs = 1


async def enqueue(url: str, n: int) -> None:
    pool = await create_pool(RedisSettings.from_dsn(url))
    for i in range(n):
        await pool.enqueue_job("job", task_name(i), _job_id=task_name(i))
    await pool.aclose()


if __name__ == "__main__" and sys.argv[1] == "enqueue":
    asyncio.run(enqueue(sys.argv[2], int(sys.argv[3])))
