"""Pins the fakeredis gaps our code works around. If one of these tests fails, fakeredis fixed the
gap: drop the workaround it names (and this test).

`Worker.take_command` is BRPOPLPUSH on fakeredis and BLMOVE on real Redis, because fakeredis's
BLMOVE does not block on a missing source key while BRPOPLPUSH does.
"""

from __future__ import annotations

import threading
import time

import fakeredis
import pytest
import redis

from taskcustody import (
    ManualClock,
    Producer,
    QueueKeys,
    Server,
    Settings,
    TaskCustodyError,
    connect_fake,
)
from tests.conftest import TEST_SETTINGS


def _push_later(server: fakeredis.FakeServer, key: str, delay: float) -> threading.Thread:
    def push() -> None:
        time.sleep(delay)
        fakeredis.FakeRedis(server=server).lpush(key, b"task")

    t = threading.Thread(target=push, daemon=True)
    t.start()
    return t


def test_fakeredis_blmove_does_not_block_on_a_missing_key() -> None:
    """GAP: BLMOVE returns None at once although another client pushes a moment later. If this
    fails, fakeredis's BLMOVE blocks now: drop the BRPOPLPUSH workaround in
    `Worker.__init__` (`take_command`) and `tests/test_fakeredis_gaps.py`."""
    server = fakeredis.FakeServer()
    client = fakeredis.FakeRedis(server=server)
    pusher = _push_later(server, "q", 0.3)
    started = time.monotonic()
    got = client.blmove("q", "dst", 3, "RIGHT", "LEFT")
    waited = time.monotonic() - started
    pusher.join()
    assert got is None and waited < 0.25, (
        f"fakeredis BLMOVE blocked ({waited:.2f}s) and returned {got!r}: the gap is fixed; "
        "drop the BRPOPLPUSH workaround in Worker.take_command"
    )


def test_fakeredis_brpoplpush_blocks_and_wakes() -> None:
    """The workaround's premise: BRPOPLPUSH blocks and wakes across clients of one FakeServer."""
    server = fakeredis.FakeServer()
    client = fakeredis.FakeRedis(server=server)
    pusher = _push_later(server, "q", 0.2)
    got = client.brpoplpush("q", "dst", 3)
    pusher.join()
    assert got == b"task"
    assert client.lrange("dst", 0, -1) == [b"task"]


def test_worker_uses_the_workaround_only_on_fakeredis() -> None:
    client = connect_fake()
    server = Server(
        client, QueueKeys("gap"), "s1", lambda p: p, settings=TEST_SETTINGS, clock=ManualClock()
    )
    server.claim()
    assert server.make_worker(0).take_command == "BRPOPLPUSH"


def test_fakeredis_has_no_wait_command() -> None:
    """GAP: fakeredis answers WAIT with "unknown command" (and has no replicas to wait for), so
    `Settings.min_replicas` > 0 is refused on fakeredis up front (`replication.refuse_fakeredis`)
    rather than failing on every write. If this fails, fakeredis implements WAIT now: decide
    whether that refusal should go (and this test with it)."""
    client = fakeredis.FakeRedis()
    with pytest.raises(redis.ResponseError, match="unknown command"):
        client.wait(1, 10)


def test_min_replicas_is_refused_on_fakeredis_with_one_clear_error() -> None:
    """The workaround: a producer or worker with min_replicas on fakeredis fails when built,
    naming the reason, instead of raising WAIT's "unknown command" after each write."""
    client = connect_fake()
    settings = Settings(**{**TEST_SETTINGS.__dict__, "min_replicas": 1})
    with pytest.raises(TaskCustodyError, match="fakeredis implements no WAIT"):
        Producer(client, QueueKeys("gap"), settings=settings)
    server = Server(
        client, QueueKeys("gap"), "s1", lambda p: p, settings=settings, clock=ManualClock()
    )
    server.claim()
    with pytest.raises(TaskCustodyError, match="fakeredis implements no WAIT"):
        server.make_worker(0)
    # Without min_replicas nothing changes on fakeredis.
    Producer(client, QueueKeys("gap"), settings=TEST_SETTINGS).enqueue(1)


def test_fakeredis_async_blocking_command_ignores_cancellation() -> None:
    """fakeredis.aioredis: a task cancelled in a blocking BRPOPLPUSH is not cancelled until the
    command's block ends. So on fakeredis an `AsyncServer`'s shutdown waits out its idle workers'
    block timeout; tests/test_async_server.py checks the cancellation of idle takes on real Redis
    only."""
    import asyncio

    import fakeredis.aioredis

    async def main() -> bool:
        client = fakeredis.aioredis.FakeRedis(server=fakeredis.FakeServer())
        take = asyncio.create_task(client.brpoplpush("a", "b", 20))
        for _ in range(5):
            await asyncio.sleep(0)
        take.cancel()
        done, _ = await asyncio.wait([take], timeout=0.2)
        client.connection_pool.reset()  # the blocked socket is abandoned with the loop
        return bool(done)

    assert asyncio.run(main()) is False
