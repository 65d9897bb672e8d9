"""RQ, SimpleWorker (no fork per job), burst mode, result_ttl=0."""

from __future__ import annotations

import redis
import rq
from _common import Finish, parse_args, wait_for_go
from rq import Queue, SimpleWorker

args = parse_args(__doc__ or "")
finish = Finish(args.url, args.tasks)


def noop(i: int) -> None:
    finish.tick()


def main() -> None:
    conn = redis.Redis.from_url(args.url)
    queue = Queue("bench", connection=conn)
    batch = 1000
    for start in range(0, args.tasks, batch):
        queue.enqueue_many(
            [
                Queue.prepare_data(noop, args=(i,), result_ttl=0)
                for i in range(start, min(args.tasks, start + batch))
            ]
        )
    wait_for_go(config="SimpleWorker, burst, result_ttl=0", version=rq.__version__)
    finish.exit_when_done()
    worker = SimpleWorker([queue], connection=conn)
    finish.begin()
    worker.work(burst=True, logging_level="ERROR")
    finish.done.wait(30)


main()
