"""Injected time: protocol code asks a Clock, never the wall clock."""

from __future__ import annotations

import threading
import time
from typing import Protocol

import redis

from ..deploy.cluster import node_client


class Clock(Protocol):
    def now(self) -> float:
        """Seconds, on one timeline shared by every server of the queue."""
        ...


def offset(before: float, remote: float, after: float) -> float:
    """Redis time minus local monotonic time, from a TIME sent at `before` and answered at
    `after`: Redis read its clock somewhere inside the round trip; assume the middle."""
    return remote - (before + after) / 2


class WallClock:
    """The local wall clock: for single-host deployments and tools."""

    def now(self) -> float:
        return time.time()


class RedisClock:
    """Redis `TIME`: one timeline for all hosts, whatever their clocks say (production default).

    Asking Redis on every call would add a round trip to every task (the processing record's
    start time), so the offset between Redis time and the local monotonic clock is measured once
    and re-measured every `resync` seconds; in between, now() costs no I/O.
    """

    def __init__(self, client: redis.Redis, resync: float = 5.0, key: str | None = None) -> None:
        self._client = client
        self._resync = resync
        # On a cluster, TIME goes to the master owning `key`'s slot (the queue's): every server
        # of the queue then reads one node's clock (a cluster client would pick any node).
        self._key = key
        self._lock = threading.Lock()
        self._offset: float  # set by the first now(): _synced_at starts as None
        self._synced_at: float | None = None

    def _redis_time(self) -> float:
        client = self._client if self._key is None else node_client(self._client, self._key)
        seconds, micros = client.time()
        return float(seconds) + float(micros) / 1_000_000

    def now(self) -> float:
        local = time.monotonic()
        with self._lock:
            if self._synced_at is None or local - self._synced_at >= self._resync:
                before = time.monotonic()
                remote = self._redis_time()
                after = time.monotonic()
                self._offset = offset(before, remote, after)
                self._synced_at = after
                local = after
            return local + self._offset


class ManualClock:
    """A clock that moves only when told to (tests, the model, `verify`)."""

    def __init__(self, start: float = 1_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock never goes back")
        with self._lock:
            self._now += seconds
