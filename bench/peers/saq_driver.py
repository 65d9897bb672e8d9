"""saq, one worker with its default concurrency (10 coroutines)."""

from __future__ import annotations

import asyncio
import logging
from importlib.metadata import version
from typing import Any

from _common import Finish, parse_args, wait_for_go
from saq import Queue, Worker

args = parse_args(__doc__ or "")
finish = Finish(args.url, args.tasks)


async def noop(ctx: Any, *, i: int) -> None:
    if args.wait_ms:  # its I/O (--wait-ms); none by default, as before
        await asyncio.sleep(args.wait_ms / 1000)
    finish.tick()


async def main() -> None:
    logging.disable(logging.WARNING)
    queue = Queue.from_url(args.url, name="bench")
    await queue.connect()
    batch = 200
    for start in range(0, args.tasks, batch):
        await asyncio.gather(
            *(queue.enqueue("noop", i=i) for i in range(start, min(args.tasks, start + batch)))
        )
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(
        None,
        lambda: wait_for_go(
            config=f"Worker concurrency={args.concurrency}", version=version("saq")
        ),
    )
    finish.exit_when_done()
    worker = Worker(queue, functions=[("noop", noop)], concurrency=args.concurrency)
    finish.begin()
    await worker.start()


asyncio.run(main())
