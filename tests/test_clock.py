"""Clocks: protocol time is injected; `ManualClock` moves only forward, by steps the test takes;
`RedisClock` follows Redis TIME to the microsecond without a round trip a call (it resyncs every
`resync` seconds of the local monotonic clock, 5 by default)."""

from __future__ import annotations

import pytest

import taskcustody.core.clock as clock_module
from taskcustody import ManualClock, RedisClock
from tests.conftest import Backend


def test_manual_clock_moves_only_forward() -> None:
    clock = ManualClock(10.0)
    clock.advance(2.5)
    assert clock.now() == 12.5
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_manual_clock_advances_by_zero_and_refuses_going_back() -> None:
    clock = ManualClock(start=10.0)
    clock.advance(0)
    assert clock.now() == 10.0
    clock.advance(0.5)
    assert clock.now() == 10.5
    with pytest.raises(ValueError, match=r"^a clock never goes back$"):
        clock.advance(-0.001)
    assert clock.now() == 10.5


class _FakeTimeClient:
    """Answers TIME with a scripted server time, counting the calls."""

    def __init__(self, seconds: int, micros: int) -> None:
        self.reply = (seconds, micros)
        self.calls = 0

    def time(self) -> tuple[int, int]:
        self.calls += 1
        return self.reply


class _Monotonic:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_redis_clock_reads_redis_time_once_per_resync_period() -> None:
    fake = _FakeTimeClient(5_000, 250_000)
    clock = RedisClock(fake, resync=3600)  # type: ignore[arg-type]
    first = clock.now()
    assert abs(first - 5_000.25) < 0.5
    for _ in range(100):
        assert clock.now() >= first
    assert fake.calls == 1


def test_redis_clock_reads_microseconds_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    mono = _Monotonic()
    monkeypatch.setattr(clock_module.time, "monotonic", mono)
    client = _FakeTimeClient(1_700_000_000, 500_000)
    clock = RedisClock(client)  # type: ignore[arg-type]
    assert clock.now() == 1_700_000_000.5
    client.reply = (7, 1)
    assert clock._redis_time() == 7.000001


def test_redis_clock_resyncs_every_five_seconds_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    mono = _Monotonic()
    monkeypatch.setattr(clock_module.time, "monotonic", mono)
    client = _FakeTimeClient(2_000, 0)
    clock = RedisClock(client)  # type: ignore[arg-type]
    assert clock.now() == 2_000.0
    assert client.calls == 1
    mono.t += 4.999
    assert clock.now() == pytest.approx(2_004.999)
    assert client.calls == 1  # no I/O between resyncs
    mono.t += 0.001  # exactly 5 s after the last sync: due
    client.reply = (3_000, 0)
    assert clock.now() == 3_000.0
    assert client.calls == 2


def test_redis_clock_honours_a_custom_resync(monkeypatch: pytest.MonkeyPatch) -> None:
    mono = _Monotonic()
    monkeypatch.setattr(clock_module.time, "monotonic", mono)
    client = _FakeTimeClient(50, 0)
    clock = RedisClock(client, resync=2.0)  # type: ignore[arg-type]
    clock.now()
    mono.t += 2.0
    clock.now()
    assert client.calls == 2


def test_redis_clock_tracks_the_server(backend: Backend) -> None:
    """Within a second of the real server's TIME, read through a real connection."""
    if not backend.real:
        pytest.skip("fakeredis TIME is the local clock")
    client = backend.client()
    seconds, micros = client.time()
    assert abs(RedisClock(client).now() - (seconds + micros / 1_000_000)) < 1.0
