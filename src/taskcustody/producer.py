"""Producers: put task envelopes on the queue (JSON, never pickle)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import redis

from .clock import Clock, WallClock
from .envelope import new_task
from .errors import RedisOutOfMemory
from .keys import QueueKeys
from .oom import is_oom


class Producer:
    def __init__(self, client: redis.Redis, keys: QueueKeys, clock: Clock | None = None) -> None:
        self.client = client
        self.keys = keys
        # Enqueue time is informational only; no protocol decision reads it.
        self.clock = clock or WallClock()

    def enqueue(self, payload: Any, task_id: str | None = None) -> str:
        task = new_task(payload, self.clock.now(), task_id)
        self._push([task.raw], [])
        return task.id

    def enqueue_many(self, payloads: Iterable[Any], batch_size: int = 10_000) -> list[str]:
        """Enqueue many payloads, one LPUSH (one round trip) per batch. Every payload is encoded
        before anything is sent, so a bad payload enqueues nothing of its batch."""
        now = self.clock.now()
        tasks = [new_task(p, now) for p in payloads]
        for start in range(0, len(tasks), batch_size):
            batch = tasks[start : start + batch_size]
            self._push([t.raw for t in batch], [t.id for t in tasks[:start]])
        return [t.id for t in tasks]

    def _push(self, raws: list[bytes], enqueued: list[str]) -> None:
        """One LPUSH. Redis out of memory refuses it whole (nothing of it is enqueued): that is
        RedisOutOfMemory, naming what earlier batches did enqueue, so the caller can retry."""
        try:
            self.client.lpush(self.keys.queue, *raws)
        except redis.ResponseError as exc:
            if not is_oom(exc):
                raise
            done = f"; {len(enqueued)} earlier task(s) were enqueued" if enqueued else ""
            raise RedisOutOfMemory(
                f"Redis is out of memory ({exc}): {len(raws)} task(s) not enqueued{done}; retry "
                "once memory frees", enqueued) from exc
