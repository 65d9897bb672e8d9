"""Retry delays (docs/protocol.md, section 10): a failed attempt waits in the scheduled set, with
exponential backoff and full jitter, until a promotion moves it to the queue in one atomic step.
Time is the injected ManualClock's; nothing sleeps."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from taskcustody import ManualClock, Producer, QueueKeys, Settings, queue_status
from taskcustody.cli.app import main
from taskcustody.core.scheduled import backoff_cap, promote, retry_delay
from taskcustody.core.server import Server
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import dead_letters, ids_in, make_server
from tests.support.redis_server import RedisServerProcess

DELAYED = dataclasses.replace(TEST_SETTINGS, retry_backoff=2.0, retry_backoff_max=10.0)


def _failing(payload: Any) -> None:
    raise RuntimeError("fails")


def _scheduled(client: redis.Redis, keys: QueueKeys) -> list[tuple[str, float]]:
    from taskcustody.core.envelope import decode

    return [
        (decode(raw).id, float(score))
        for raw, score in client.zrange(keys.scheduled, 0, -1, withscores=True)
    ]


# -- the schedule ---------------------------------------------------------------------------------


def test_backoff_doubles_per_attempt_up_to_the_maximum() -> None:
    caps = [backoff_cap(n, DELAYED) for n in range(1, 7)]
    assert caps == [2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
    assert backoff_cap(10_000, DELAYED) == 10.0  # no overflow
    assert backoff_cap(3, TEST_SETTINGS) == 0.0  # retry_backoff=0: at once


def test_full_jitter_stays_within_zero_and_the_cap() -> None:
    assert retry_delay(3, DELAYED, uniform=lambda a, b: a) == 0.0
    assert retry_delay(3, DELAYED, uniform=lambda a, b: b) == 8.0
    assert retry_delay(5, DELAYED, uniform=lambda a, b: b) == 10.0
    draws = [retry_delay(2, DELAYED) for _ in range(500)]
    assert all(0.0 <= d <= 4.0 for d in draws)
    assert min(draws) < 1.0 and max(draws) > 3.0  # spread over the window, not bunched at cap/2


def test_settings_refuse_a_negative_backoff_or_a_maximum_below_it() -> None:
    with pytest.raises(ValueError, match="retry_backoff"):
        Settings(retry_backoff=-1.0)
    with pytest.raises(ValueError, match="retry_backoff_max"):
        Settings(retry_backoff=5.0, retry_backoff_max=1.0)
    assert Settings().retry_backoff > 0  # delays are on by default


# -- the worker schedules, the promotion moves ------------------------------------------------


def test_a_failed_task_is_scheduled_not_taken_before_due_and_promoted_when_due(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock(start=100.0)
    task_id = Producer(client, keys, clock).enqueue({"n": 1})
    server = make_server(client, keys, "s", clock, handler=_failing, settings=DELAYED)
    server.claim()
    worker = server.make_worker(0)
    worker.register()
    try:
        assert worker.run_once() is True
        [(sid, due)] = _scheduled(client, keys)
        assert sid == task_id and 100.0 <= due <= 102.0  # attempt 1: up to retry_backoff
        assert client.llen(keys.queue) == 0 and client.llen(worker.list_key) == 0
        assert queue_status(client, keys, clock.now()).scheduled == 1
        assert worker.run_once(timeout=0.01) is False  # not in the queue: nothing to take
        assert server.promote_due(due - 0.001) == 0  # not due yet
        assert _scheduled(client, keys) == [(task_id, due)]
        clock.advance(2.0)
        assert server.promote_due() == 1
        assert client.zcard(keys.scheduled) == 0 and ids_in(client, keys.queue) == [task_id]
        assert worker.run_once() is True  # attempt 2 fails: scheduled again, later
        [(_, due2)] = _scheduled(client, keys)
        assert clock.now() <= due2 <= clock.now() + 4.0
    finally:
        worker.close()


def test_dead_lettered_after_max_attempts_with_delays(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock(start=100.0)
    task_id = Producer(client, keys, clock).enqueue({"n": 1})
    server = make_server(client, keys, "s", clock, handler=_failing, settings=DELAYED)
    server.claim()
    worker = server.make_worker(0)
    worker.register()
    try:
        for _ in range(DELAYED.max_attempts):
            assert worker.run_once() is True
            clock.advance(DELAYED.retry_backoff_max)
            server.promote_due()
    finally:
        worker.close()
    [letter] = dead_letters(client, keys)
    assert letter["task_id"] == task_id
    assert client.zcard(keys.scheduled) == 0 and client.llen(keys.queue) == 0


def test_retry_backoff_zero_retries_at_once(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue({"n": 1})
    server = make_server(client, keys, "s", clock, handler=_failing, settings=TEST_SETTINGS)
    server.claim()
    worker = server.make_worker(0)
    worker.register()
    try:
        assert worker.run_once() is True
    finally:
        worker.close()
    assert ids_in(client, keys.queue) == [task_id]
    assert not client.exists(keys.scheduled)


def test_promotion_puts_due_retries_behind_the_queued_tasks_and_suspects_on_their_list(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock(start=50.0)
    producer = Producer(client, keys, clock)
    queued = producer.enqueue({"n": 0})
    a, b, c = (
        f'{{"id": "{i}", "payload": 1, "attempts": 1, "enqueued_at": 0}}' for i in ("a", "b", "c")
    )
    client.zadd(keys.scheduled, {a: 10.0, b: 20.0, c: 99.0})
    client.hset(keys.recoveries, "b", 1)  # b has a recovery count: it is a suspect
    assert promote(client, keys, 50.0) == 2
    assert ids_in(client, keys.queue) == ["a", queued]  # behind the queued task
    assert ids_in(client, keys.suspects) == ["b"]
    assert _scheduled(client, keys) == [("c", 99.0)]
    assert promote(client, keys, 50.0) == 0


def test_promotion_moves_at_most_a_batch(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    client.zadd(
        keys.scheduled,
        {
            f'{{"id": "t{i}", "payload": 1, "attempts": 1, "enqueued_at": 0}}': float(i)
            for i in range(5)
        },
    )
    assert promote(client, keys, 100.0, batch=3) == 3
    assert ids_in(client, keys.queue) == ["t2", "t1", "t0"]  # earliest first, each behind
    assert promote(client, keys, 100.0, batch=3) == 2
    assert client.llen(keys.queue) == 5 and client.zcard(keys.scheduled) == 0


def test_two_promoters_move_each_member_exactly_once(backend: Backend, keys: QueueKeys) -> None:
    """Concurrent promotions (two servers' loops, or a loop and `taskcustody sweep`): every
    member ends in the queue once, never twice, never in both places."""
    client = backend.client()
    n = 60
    client.zadd(
        keys.scheduled,
        {
            f'{{"id": "t{i}", "payload": 1, "attempts": 1, "enqueued_at": 0}}': float(i)
            for i in range(n)
        },
    )
    moved: list[int] = []
    barrier = threading.Barrier(2)

    def promoter() -> None:
        own = backend.client()
        barrier.wait()
        total = 0
        for _ in range(n):
            total += promote(own, keys, 1_000.0, batch=7)
        moved.append(total)

    threads = [threading.Thread(target=promoter) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(moved) == n
    ids = ids_in(client, keys.queue)
    assert sorted(ids) == sorted(f"t{i}" for i in range(n)) and len(set(ids)) == n
    assert client.zcard(keys.scheduled) == 0


def test_the_background_loop_promotes(
    backend: Backend, keys: QueueKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's periodic loop promotes at every tick (the take path never does)."""
    client = backend.client()
    clock = ManualClock(start=100.0)
    client.zadd(
        keys.scheduled, {'{"id": "t", "payload": 1, "attempts": 1, "enqueued_at": 0}': 50.0}
    )
    server = make_server(client, keys, "s", clock, settings=DELAYED)
    server.claim()
    calls: list[int] = []
    original = Server.promote_due

    def once(self: Server, now: float | None = None) -> int:
        calls.append(original(self, now))
        self.stop_event.set()
        return calls[-1]

    monkeypatch.setattr(Server, "promote_due", once)
    server._background()
    assert calls == [1] and ids_in(client, keys.queue) == ["t"]


# -- the command line -----------------------------------------------------------------------------


def test_worker_cli_takes_the_backoff_flags(
    real_redis: RedisServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Settings] = []

    def capture(self: Server, **kwargs: Any) -> None:
        seen.append(self.settings)

    monkeypatch.setattr(Server, "run", capture)
    out = CliRunner().invoke(
        main,
        [
            "worker",
            "json:dumps",
            "-q",
            "rd",
            "--redis-url",
            real_redis.url,
            "--retry-backoff",
            "0.5",
            "--retry-backoff-max",
            "7",
        ],
    )
    assert out.exit_code == 0, out.output
    assert (seen[0].retry_backoff, seen[0].retry_backoff_max) == (0.5, 7.0)
    bad = CliRunner().invoke(
        main,
        [
            "worker",
            "json:dumps",
            "-q",
            "rd",
            "--redis-url",
            real_redis.url,
            "--retry-backoff",
            "5",
            "--retry-backoff-max",
            "1",
        ],
    )
    assert bad.exit_code == 2 and "--retry-backoff-max must be >= --retry-backoff" in bad.output


def test_sweep_cli_promotes_due_retries(real_redis: RedisServerProcess) -> None:
    client = redis.Redis.from_url(real_redis.url)
    client.flushall()
    keys = QueueKeys("rd")
    client.zadd(keys.scheduled, {'{"id": "t", "payload": 1, "attempts": 1, "enqueued_at": 0}': 1.0})
    out = CliRunner().invoke(main, ["sweep", "-q", "rd", "--redis-url", real_redis.url])
    assert out.exit_code == 0, out.output
    assert "promoted 1 due retry" in out.output
    assert client.llen(keys.queue) == 1 and client.zcard(keys.scheduled) == 0
