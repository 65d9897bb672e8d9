"""dramatiq, Redis broker, one worker process with N worker threads (default middleware)."""

from __future__ import annotations

import os
import threading

import dramatiq
from _common import Finish, parse_args, wait_for_go
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker

args = parse_args(__doc__ or "")
broker = RedisBroker(url=args.url)
dramatiq.set_broker(broker)
finish = Finish(args.url, args.tasks)


@dramatiq.actor(queue_name="bench", max_retries=0)
def noop(i: int) -> None:
    finish.tick()


def main() -> None:
    for i in range(args.tasks):
        noop.send(i)
    wait_for_go(
        config=f"RedisBroker, {args.concurrency} worker threads", version=dramatiq.__version__
    )
    finish.begin()
    worker = Worker(broker, worker_threads=args.concurrency, worker_timeout=100)
    worker.start()
    finish.done.wait()
    finish.report()
    threading.Thread(target=worker.stop, daemon=True).start()
    os._exit(0)


main()
