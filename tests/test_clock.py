"""Clocks: protocol time is injected; RedisClock follows Redis TIME without a round trip a call."""

from __future__ import annotations

import pytest

from taskcustody import ManualClock, RedisClock
from tests.conftest import Backend


def test_manual_clock_moves_only_forward() -> None:
    clock = ManualClock(10.0)
    clock.advance(2.5)
    assert clock.now() == 12.5
    with pytest.raises(ValueError):
        clock.advance(-1)


class CountingTime:
    def __init__(self, start: float) -> None:
        self.calls = 0
        self.start = start

    def time(self) -> tuple[int, int]:
        self.calls += 1
        return int(self.start), 250_000


def test_redis_clock_reads_redis_time_once_per_resync_period() -> None:
    fake = CountingTime(5_000.0)
    clock = RedisClock(fake, resync=3600)  # type: ignore[arg-type]
    first = clock.now()
    assert abs(first - 5_000.25) < 0.5
    for _ in range(100):
        assert clock.now() >= first
    assert fake.calls == 1


def test_redis_clock_tracks_the_server(backend: Backend) -> None:
    if not backend.real:
        pytest.skip("fakeredis TIME is the local clock")
    client = backend.client()
    seconds, micros = client.time()
    assert abs(RedisClock(client).now() - (seconds + micros / 1e6)) < 1.0
