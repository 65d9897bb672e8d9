"""saq, one worker with its default concurrency (10 coroutines)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from importlib.metadata import version
from typing import Any

from _common import Finish, parse_args, wait_for_go
from saq import Queue, Worker

args = parse_args(__doc__ or "")
finish = Finish(args.url, args.tasks)


async def noop(ctx: Any, *, i: int) -> None:
    finish.tick()


def watch() -> None:
    finish.done.wait()
    finish.report()
    os._exit(0)


async def main() -> None:
    logging.disable(logging.WARNING)
    queue = Queue.from_url(args.url, name="bench")
    await queue.connect()
    batch = 200
    for start in range(0, args.tasks, batch):
        await asyncio.gather(*(
            queue.enqueue("noop", i=i) for i in range(start, min(args.tasks, start + batch))
        ))
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, lambda: wait_for_go(
        config=f"Worker concurrency={args.concurrency}", version=version("saq")))
    threading.Thread(target=watch, daemon=True).start()
    worker = Worker(queue, functions=[("noop", noop)], concurrency=args.concurrency)
    finish.begin()
    await worker.start()


asyncio.run(main())
