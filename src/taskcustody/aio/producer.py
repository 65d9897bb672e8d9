"""The asyncio producer: `taskcustody.Producer`'s envelopes and LPUSH, awaited."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from ..core.clock import Clock, WallClock
from ..core.envelope import Task, new_task
from ..core.keys import QueueKeys
from ..core.producer import out_of_memory
from ..core.settings import Settings
from ..deploy.oom import is_oom
from ..ops.results import get_result
from .bridge import SyncBridge
from .connection import refuse_unsupported


class AsyncProducer:
    """Puts tasks on a queue from asyncio code (a FastAPI endpoint, say): the same JSON
    envelopes as `Producer`, pushed with one LPUSH per batch, so a batch is queued whole or
    refused whole (`RedisOutOfMemory` when Redis is full).

    Example::

        producer = AsyncProducer(client, QueueKeys("images"))
        task_id = await producer.enqueue({"url": "https://example.com/a.png"})
        handle = await producer.submit({"x": 21})
        await handle.result(timeout=5)
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: QueueKeys,
        clock: Clock | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.client = client
        self.keys = keys
        self.clock = clock or WallClock()  # enqueue time is informational only
        self.settings = settings or Settings()
        refuse_unsupported(client, self.settings)

    async def enqueue(self, payload: Any, task_id: str | None = None) -> str:
        task = new_task(payload, self.clock.now(), task_id)
        await self._push([task], [])
        return task.id

    async def submit(self, payload: Any, task_id: str | None = None) -> AsyncTaskHandle:
        """`enqueue`, returning a handle whose `result` awaits the task's result."""
        return AsyncTaskHandle(
            await self.enqueue(payload, task_id), self.client, self.keys, enqueued=True
        )

    async def enqueue_many(self, payloads: Iterable[Any], batch_size: int = 10_000) -> list[str]:
        """Every payload encoded before anything is sent; one LPUSH per batch."""
        now = self.clock.now()
        tasks = [new_task(p, now) for p in payloads]
        for start in range(0, len(tasks), batch_size):
            await self._push(tasks[start : start + batch_size], [t.id for t in tasks[:start]])
        return [t.id for t in tasks]

    async def _push(self, tasks: list[Task], before: list[str]) -> None:
        try:
            await self.client.lpush(self.keys.queue, *(t.raw for t in tasks))
        except redis.ResponseError as exc:
            if not is_oom(exc):
                raise
            raise out_of_memory(exc, len(tasks), before) from exc


@dataclass(frozen=True)
class AsyncTaskHandle:
    """What `AsyncProducer.submit` returns: the task's id, and `await handle.result(timeout)`."""

    id: str
    client: redis.asyncio.Redis
    keys: QueueKeys
    #: As `TaskHandle.enqueued`: `AsyncProducer.submit` enqueued the task, so `result` skips
    #: the look for an unknown id.
    enqueued: bool = False

    async def result(self, timeout: float | None = 30.0) -> Any:
        """`taskcustody.get_result` (the same polling, in a thread, through `SyncBridge`)."""
        bridge = SyncBridge(self.client, asyncio.get_running_loop())
        return await asyncio.to_thread(
            get_result,
            bridge,  # type: ignore[arg-type]
            self.keys,
            self.id,
            timeout,
            fail_if_unknown=not self.enqueued,
        )
