"""Celery, Redis transport, solo pool, results ignored, no gossip/mingle/heartbeat."""

from __future__ import annotations

import logging

import celery
from _common import Finish, parse_args, wait_for_go
from celery import Celery

args = parse_args(__doc__ or "")
app = Celery("bench", broker=args.url)
app.conf.update(
    task_ignore_result=True,
    task_default_queue="bench",
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    worker_send_task_events=False,
    worker_redirect_stdouts=False,
)
finish = Finish(args.url, args.tasks)


@app.task(name="noop")
def noop(i: int) -> None:
    finish.tick()


def main() -> None:
    logging.disable(logging.WARNING)
    with app.producer_or_acquire() as producer:
        for i in range(args.tasks):
            noop.apply_async((i,), producer=producer)
    wait_for_go(config="Redis transport, solo pool, ignore_result", version=celery.__version__)
    finish.exit_when_done()
    worker = app.Worker(
        pool="solo",
        concurrency=1,
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
        loglevel="ERROR",
        quiet=True,
        queues=["bench"],
    )
    finish.begin()
    worker.start()


main()
