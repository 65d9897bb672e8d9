"""Injected time: protocol code asks a Clock, never the wall clock."""

from __future__ import annotations

import threading
import time
from typing import Protocol

import redis


class Clock(Protocol):
    def now(self) -> float:
        """Seconds, on one timeline shared by every server of the queue."""
        ...


class WallClock:
    """The local wall clock: for single-host deployments and tools."""

    def now(self) -> float:
        return time.time()


class RedisClock:
    """Redis `TIME`: one timeline for all hosts, whatever their clocks say (production default)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def now(self) -> float:
        seconds, micros = self._client.time()
        return float(seconds) + float(micros) / 1_000_000


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
