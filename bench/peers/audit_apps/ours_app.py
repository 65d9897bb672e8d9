"""taskcustody under audit: the handler `taskcustody worker ours_app:handle` runs, and the
enqueuer (`python ours_app.py enqueue URL N`)."""

from __future__ import annotations

import sys
import time
from typing import Any

from _record import TASK_SECONDS, record, task_name


def handle(payload: Any) -> None:
    record("start", payload)
    time.sleep(TASK_SECONDS)
    record("done", payload)


def enqueue(url: str, n: int) -> None:
    import redis

    import taskcustody

    client = redis.Redis.from_url(url)
    taskcustody.Producer(client, taskcustody.QueueKeys("audit")).enqueue_many(
        [task_name(i) for i in range(n)]
    )


if __name__ == "__main__" and sys.argv[1] == "enqueue":
    enqueue(sys.argv[2], int(sys.argv[3]))
