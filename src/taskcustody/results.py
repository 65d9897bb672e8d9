"""Results: wait for a task to commit and read what its handler returned.

A worker's release stores the handler's return value as JSON under `P:{Q}:result:<task id>`, with
a TTL of `Settings.result_ttl` seconds (default one day; 0 stores no results), in the same Lua
step that commits the task. `get_result` polls that key with a bounded backoff (10 ms doubling to
1 s): no change to the release script, and an idle waiter costs Redis one small pipeline a second.

A task that was dead-lettered has no result: `get_result` raises TaskFailed with its error as soon
as a poll sees it among the newest DEAD_WINDOW dead letters, and at the latest at the timeout,
when it looks through the whole dead-letter list once before raising ResultTimeout.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from .clock import Clock
from .deadletters import DeadLetter, list_dead_letters, parse
from .errors import ResultTimeout, TaskFailed
from .keys import QueueKeys
from .redis_errors import named_errors

FIRST_PAUSE = 0.01
MAX_PAUSE = 1.0
#: Dead letters read per poll, from the newest: a task that fails while we wait is among them
#: unless more than this many tasks failed within one pause.
DEAD_WINDOW = 100


class MonotonicClock:
    """Local monotonic seconds: a timeout is a local matter, not the queue's shared time."""

    def now(self) -> float:
        return time.monotonic()


def decode_result(stored: bytes) -> Any:
    """A stored result is JSON (a value JSON cannot hold was stored as {"unserialisable_result":
    its repr}). Workers older than `get_result` stored nothing when a handler returned None: a
    waiter on such a task times out."""
    return json.loads(stored)


def _failed(task_id: str, letters: list[DeadLetter]) -> TaskFailed | None:
    for letter in letters:
        if letter.task_id == task_id:
            return TaskFailed(task_id, letter.error, letter.attempts)
    return None


def get_result(client: redis.Redis, keys: QueueKeys, task_id: str,
               timeout: float | None = 30.0, *, clock: Clock | None = None,
               sleep: Callable[[float], None] = time.sleep) -> Any:
    """Block until task `task_id` commits and return its handler's return value.

    Raises TaskFailed if the task was dead-lettered, ResultTimeout if `timeout` seconds pass first
    (None: wait for ever; 0: look once). `clock` and `sleep` are injected by tests."""
    clock = clock or MonotonicClock()
    deadline = None if timeout is None else clock.now() + timeout
    pause = FIRST_PAUSE
    result_key = keys.result(task_id)
    while True:
        with named_errors(client, keys, result_key, keys.dead_letters):
            pipe = client.pipeline(transaction=False)
            pipe.get(result_key)
            pipe.lrange(keys.dead_letters, 0, DEAD_WINDOW - 1)
            stored, newest = pipe.execute()
        if stored is not None:
            return decode_result(stored)
        failure = _failed(task_id, [parse(entry) for entry in newest])
        if failure is not None:
            raise failure
        now = clock.now()
        if deadline is not None and now >= deadline:
            failure = _failed(task_id, list_dead_letters(client, keys))
            if failure is not None:
                raise failure
            raise ResultTimeout(
                f"no result for task {task_id} within {timeout:g} s: it is still queued or "
                "running, or its result expired (result_ttl), or no such task committed")
        sleep(pause if deadline is None else min(pause, deadline - now))
        pause = min(pause * 2, MAX_PAUSE)


@dataclass(frozen=True)
class TaskHandle:
    """What `Producer.submit` returns: the task's id, and a way to wait for its result."""

    id: str
    client: redis.Redis
    keys: QueueKeys

    def result(self, timeout: float | None = 30.0, *, clock: Clock | None = None,
               sleep: Callable[[float], None] = time.sleep) -> Any:
        """`get_result` for this task."""
        return get_result(self.client, self.keys, self.id, timeout, clock=clock, sleep=sleep)
