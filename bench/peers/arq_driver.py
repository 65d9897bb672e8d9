"""arq, one worker, burst mode, poll_delay=10 ms (default 500 ms), keep_result=0."""

from __future__ import annotations

import asyncio
import os
from importlib.metadata import version
from typing import Any

from _common import Finish, parse_args, wait_for_go
from arq import create_pool
from arq.connections import RedisSettings
from arq.worker import Worker

args = parse_args(__doc__ or "")
finish = Finish(args.url, args.tasks)
POLL_DELAY = float(os.environ.get("ARQ_POLL_DELAY", "0.01"))


async def noop(ctx: Any, i: int) -> None:
    if args.wait_ms:  # its I/O (--wait-ms); none by default, as before
        await asyncio.sleep(args.wait_ms / 1000)
    finish.tick()


async def main() -> None:
    settings = RedisSettings.from_dsn(args.url)
    pool = await create_pool(settings)
    batch = 200
    for start in range(0, args.tasks, batch):
        await asyncio.gather(
            *(pool.enqueue_job("noop", i) for i in range(start, min(args.tasks, start + batch)))
        )
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(
        None,
        lambda: wait_for_go(
            config=f"burst, poll_delay={POLL_DELAY * 1000:g} ms, max_jobs={args.concurrency}",
            version=version("arq"),
        ),
    )
    finish.exit_when_done()
    worker = Worker(
        functions=[noop],
        redis_settings=settings,
        burst=True,
        poll_delay=POLL_DELAY,
        keep_result=0,
        max_jobs=args.concurrency,
        handle_signals=False,
    )
    finish.begin()
    await worker.main()


asyncio.run(main())
