"""Redis `TIME` for the asyncio API: `now()` costs no I/O (the protocol's steps call it between
awaits), and `resync()` re-measures the offset on the event loop."""

from __future__ import annotations

import time

import redis.asyncio

from ..core.clock import offset


class AsyncRedisClock:
    """`taskcustody.RedisClock` for an asyncio client: one timeline for all hosts. `resync` must
    have run once before `now`; `AsyncServer` runs it at start and then every `resync` seconds
    (with its heartbeat)."""

    def __init__(self, client: redis.asyncio.Redis, resync: float = 5.0) -> None:
        self._client = client
        self.resync_interval = resync
        self._offset: float | None = None
        self._synced_at = 0.0

    async def resync(self) -> None:
        before = time.monotonic()
        seconds, micros = await self._client.time()
        after = time.monotonic()
        self._offset = offset(before, float(seconds) + float(micros) / 1_000_000, after)
        self._synced_at = after

    def due(self) -> bool:
        """Whether the offset is older than the resync interval (or never measured)."""
        return self._offset is None or time.monotonic() - self._synced_at >= self.resync_interval

    def now(self) -> float:
        if self._offset is None:
            raise RuntimeError("AsyncRedisClock: await resync() before the first now()")
        return time.monotonic() + self._offset
