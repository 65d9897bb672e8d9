"""Settings validation, the key schema, the clocks, the envelope and the producer's batching:
exact messages, boundary values and exact mappings (pinned against surviving mutants)."""

from __future__ import annotations

import re
from typing import Any

import pytest

import taskcustody.clock as clock_module
from taskcustody import (
    InvalidName,
    ListOwner,
    MalformedTask,
    ManualClock,
    Producer,
    QueueKeys,
    RedisClock,
    Settings,
)
from taskcustody.envelope import decode, new_task
from tests.conftest import Backend
from tests.helpers import make_server

# -- Settings ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"block_timeout": 0}, r"^block_timeout must be > 0 \(0 would block forever\)$"),
        ({"block_timeout": -1.0}, r"^block_timeout must be > 0 \(0 would block forever\)$"),
        ({"socket_timeout_margin": 0}, r"^socket_timeout_margin must be > 0$"),
        ({"heartbeat_interval": 5.0, "server_ttl": 5.0},
         r"^server_ttl must exceed heartbeat_interval$"),
        ({"max_attempts": 0}, r"^max_attempts must be >= 1$"),
        ({"prefetch": 0}, r"^prefetch must be >= 1$"),
        ({"drain_chunk": 0}, r"^drain_chunk must be >= 1$"),
    ],
)
def test_settings_reject_bad_values_with_exact_messages(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Settings(**overrides)


def test_settings_accept_the_smallest_valid_values() -> None:
    s = Settings(block_timeout=0.001, socket_timeout_margin=0.001, heartbeat_interval=5.0,
                 server_ttl=5.001, max_attempts=1, prefetch=1, drain_chunk=1)
    assert s.socket_timeout == pytest.approx(0.002)


# -- QueueKeys -----------------------------------------------------------------------------------


def test_owner_of_accepts_bytes_and_str(keys: QueueKeys) -> None:
    owner = ListOwner("srv-1", 7, "w.3")
    key = keys.inflight(owner)
    assert keys.owner_of(key) == owner
    assert keys.owner_of(key.encode()) == owner


def test_owner_of_names_the_foreign_key(keys: QueueKeys) -> None:
    other = QueueKeys("other", prefix="test").inflight(ListOwner("s", 1, "w"))
    expected = f"{other!r} is not an in-flight list of queue 'tq'"
    with pytest.raises(InvalidName, match=f"^{re.escape(expected)}$"):
        keys.owner_of(other)
    with pytest.raises(InvalidName, match=f"^{re.escape(expected)}$"):
        keys.owner_of(other.encode())


def test_all_fixed_keys_is_the_exact_type_map(keys: QueueKeys) -> None:
    assert keys.all_fixed_keys() == {
        "test:{tq}:queue": "list",
        "test:{tq}:suspects": "list",
        "test:{tq}:scheduled": "zset",
        "test:{tq}:inflight-registry": "zset",
        "test:{tq}:inflight-lists": "set",
        "test:{tq}:servers": "zset",
        "test:{tq}:incarnations": "hash",
        "test:{tq}:processing": "hash",
        "test:{tq}:recoveries": "hash",
        "test:{tq}:dead": "list",
        "test:{tq}:committed": "string",
        "test:{tq}:commits": "hash",
        "test:{tq}:sweep-lease": "string",
    }


def test_all_fixed_keys_match_the_types_a_live_queue_creates(
    backend: Backend, keys: QueueKeys
) -> None:
    """Every fixed key, once the queue has used it, holds exactly the type the map names."""
    client = backend.client()
    clock = ManualClock()
    producer = Producer(client, keys, clock)
    producer.enqueue_many(["ok", "fail", "later", "suspect", "waiting"])

    def handler(payload: Any) -> str:
        if payload == "fail":
            raise RuntimeError("no")
        return "done"

    # max_attempts=2 with a retry delay: the failing task waits in the scheduled set; a malformed
    # entry, taken first, is dead-lettered.
    client.rpush(keys.queue, "not json")
    settings = Settings(block_timeout=0.05, socket_timeout_margin=2.0, heartbeat_interval=5,
                        server_ttl=15, max_attempts=2, drain_chunk=3, track_commits=True,
                        retry_backoff=1.0)
    server = make_server(client, keys, "s1", clock, handler=handler, settings=settings)
    server.claim()
    assert server.sweep_lease.acquire_or_renew()
    worker = server.make_worker(0)
    worker.register()
    try:
        assert worker.take() is None  # the malformed entry: a dead letter
        assert worker.run_once() is True
        assert worker.run_once() is True
        # two tasks whose holder dies: its restart reconciles them (counted recoveries: suspects)
        assert worker.take() is not None
        assert worker.take() is not None
        worker.reconcile()  # ... and the next take takes one of them, the other one waits
        task = worker.take()
        assert task is not None
        worker.record(task)
        worker.flush()
    finally:
        worker.close()
    # The version 0.1 registry exists only where 0.1 ran; a starting server migrates it away.
    client.sadd(keys.legacy_inflight_registry, "left-by-0.1")
    for key, want in keys.all_fixed_keys().items():
        assert client.type(key) == want.encode(), key


# -- clocks --------------------------------------------------------------------------------------


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


def test_redis_clock_on_a_real_server(backend: Backend) -> None:
    if not backend.real:
        pytest.skip("fakeredis TIME is the local clock")
    client = backend.client()
    seconds, micros = client.time()
    now = RedisClock(client).now()
    assert abs(now - (seconds + micros / 1_000_000)) < 60


# -- the envelope and its errors -----------------------------------------------------------------


def test_malformed_task_message_shows_the_first_80_bytes() -> None:
    raw = bytes(range(65, 65 + 26)) * 4  # 104 bytes, not JSON
    exc = MalformedTask(raw, "why")
    assert str(exc) == f"malformed task envelope (why): {raw[:80]!r}"
    assert (exc.raw, exc.reason) == (raw, "why")


def test_retried_bumps_attempts_and_reencodes() -> None:
    task = new_task({"k": [1]}, 12.5, "t1")
    again = task.retried()
    assert again.attempts == 1
    assert again.raw == b'{"id":"t1","payload":{"k":[1]},"attempts":1,"enqueued_at":12.5}'
    assert decode(again.raw) == again


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_encode_refuses_non_finite_numbers(value: float) -> None:
    with pytest.raises(ValueError, match=r"^payload is not JSON-serialisable: "):
        new_task({"x": value}, 0.0)


# -- the producer --------------------------------------------------------------------------------


def test_enqueue_many_sends_one_lpush_per_10000_tasks(backend: Backend, keys: QueueKeys) -> None:
    if backend.real:
        pytest.skip("batching is client-side; one backend suffices")
    client = backend.client()
    sizes: list[int] = []
    original = client.lpush

    def counting(name: str, *values: Any) -> Any:
        sizes.append(len(values))
        return original(name, *values)

    client.lpush = counting  # type: ignore[method-assign]
    ids = Producer(client, keys, ManualClock()).enqueue_many(range(10_001))
    assert sizes == [10_000, 1]
    assert len(ids) == len(set(ids)) == 10_001
    assert client.llen(keys.queue) == 10_001


def test_enqueue_many_respects_an_explicit_batch_size(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    sizes: list[int] = []
    original = client.lpush

    def counting(name: str, *values: Any) -> Any:
        sizes.append(len(values))
        return original(name, *values)

    client.lpush = counting  # type: ignore[method-assign]
    Producer(client, keys, ManualClock()).enqueue_many(range(5), batch_size=2)
    assert sizes == [2, 2, 1]

