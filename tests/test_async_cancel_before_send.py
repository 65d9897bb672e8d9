"""A cancellation that lands before a worker step's command is sent (the
model's `cancel_before_send`): Redis runs nothing, and the asyncio worker, which cannot tell this
from a cancellation with the reply in flight, is dirty -- never ignorant -- and its reconcile
finds its list as it was. Each step is called on its own here (the cycle's release is shielded:
`test_async_cancellation.py`), with a gate that holds the command before it is sent, on both
backends."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio

from taskcustody import AsyncProducer, AsyncWorker, ListOwner, ManualClock, QueueKeys
from taskcustody.core import scripts
from taskcustody.core.envelope import decode
from tests.conftest import TEST_SETTINGS, Backend
from tests.support.aio import Gate, cancel_inside_the_handshake, named, run_with_client

OWNER = ListOwner("s1", 1, "w0")


async def _worker(client: redis.asyncio.Redis, keys: QueueKeys) -> AsyncWorker:
    worker = AsyncWorker(client, keys, OWNER, lambda p: p, ManualClock(), TEST_SETTINGS)
    await worker.register()
    await worker.reconcile()
    return worker


async def _cancel_before_send(worker: AsyncWorker, match: Any, step: Any) -> None:
    """Run `step` with the command `match` accepts held before its send, and cancel it there."""
    inner = worker.conn
    gate = worker.conn = Gate(inner, match, hold="send")
    task = asyncio.ensure_future(step)
    await gate.cancel_at(task)
    with pytest.raises(asyncio.CancelledError):
        await task
    worker.conn = inner


async def _lengths(client: redis.asyncio.Redis, *names: str) -> list[int]:
    return [int(await client.llen(name)) for name in names]


def test_a_take_cancelled_before_its_send_moves_nothing_and_leaves_the_worker_dirty(
    backend: Backend, keys: QueueKeys
) -> None:
    async def test(client: redis.asyncio.Redis) -> None:
        await AsyncProducer(client, keys).enqueue("p")
        worker = await _worker(client, keys)
        registered = await client.zscore(keys.inflight_registry, worker.list_key)
        await _cancel_before_send(worker, named(worker.take_command), worker.take())
        assert worker.dirty  # it cannot tell whether the move happened: never ignorant
        assert await _lengths(client, keys.queue, worker.list_key) == [1, 0]
        # the registration is in the same write: not sent either
        assert await client.zscore(keys.inflight_registry, worker.list_key) == registered
        assert await worker.reconcile() == 0
        assert not worker.dirty
        assert await worker.run_once() is True  # and it takes and runs the task as usual
        assert await _lengths(client, keys.queue, worker.list_key) == [0, 0]
        await worker.close()

    run_with_client(test, backend)


def test_a_suspect_take_cancelled_before_its_send_keeps_the_slot_until_the_reconcile(
    backend: Backend, keys: QueueKeys
) -> None:
    async def test(client: redis.asyncio.Redis) -> None:
        await AsyncProducer(client, keys).enqueue("p")
        await client.lmove(keys.queue, keys.suspects, "RIGHT", "LEFT")
        worker = await _worker(client, keys)
        worker.suspects.maybe_waiting = True
        await _cancel_before_send(
            worker, named("EVALSHA", scripts.TAKE_AND_RECORD_SCRIPT.sha), worker.take_suspect()
        )
        assert worker.dirty
        assert worker.suspects.holder == worker.list_key  # taken before the send, kept
        assert await _lengths(client, keys.suspects, worker.list_key) == [1, 0]
        assert await client.hlen(keys.processing) == 0
        assert await worker.reconcile() == 0
        assert not worker.dirty and worker.suspects.holder is None
        await worker.close()

    run_with_client(test, backend)


def test_a_release_cancelled_before_its_send_leaves_the_task_in_custody_and_the_worker_dirty(
    backend: Backend, keys: QueueKeys
) -> None:
    async def test(client: redis.asyncio.Redis) -> None:
        task_id = await AsyncProducer(client, keys).enqueue("p")
        worker = await _worker(client, keys)
        task = await worker.take()
        assert task is not None
        await worker.record(task)
        outcome = await worker.execute(task)
        await _cancel_before_send(
            worker, named("EVALSHA", scripts.RELEASE_SCRIPT.sha), worker.release(task, outcome)
        )
        assert worker.dirty  # not taken for a release that ran (design 16)
        (raw,) = await client.lrange(worker.list_key, 0, -1)
        assert decode(raw).id == task_id
        assert await client.hlen(keys.processing) == 1
        assert await client.get(keys.committed) is None
        # its reconcile gives the task back (a counted recovery, as after a crash)
        assert await worker.reconcile() == 1
        assert await _lengths(client, worker.list_key) == [0]
        assert sum(await _lengths(client, keys.queue, keys.suspects)) == 1
        await worker.close()

    run_with_client(test, backend)


def test_a_composite_cancelled_before_its_send_moves_nothing_and_leaves_the_worker_dirty(
    backend: Backend, keys: QueueKeys
) -> None:
    async def test(client: redis.asyncio.Redis) -> None:
        await AsyncProducer(client, keys).enqueue_many(["a", "b"])
        worker = await _worker(client, keys)
        task = await worker.take()
        assert task is not None
        await worker.record(task)
        outcome = await worker.execute(task)
        await _cancel_before_send(
            worker,
            named("EVALSHA", scripts.RELEASE_AND_TAKE_SCRIPT.sha),
            worker.release_and_take(task, outcome),
        )
        assert worker.dirty
        assert await _lengths(client, keys.queue, worker.list_key) == [1, 1]
        assert await client.get(keys.committed) is None
        assert await worker.reconcile() == 1
        await worker.close()

    run_with_client(test, backend)


def test_a_cancellation_inside_the_reconnect_handshake_leaves_no_reply_for_the_next_command(
    backend: Backend, keys: QueueKeys
) -> None:
    """Regression: the worker's connection (re)connects before a command is sent; a cancellation
    that lands while the handshake's replies are unread left redis-py's connection "connected"
    with them pending (it cleans up after a Redis error there, not after a cancellation), and the
    next take read a handshake reply as its own: it failed on a stale reply while its task sat in
    its list, with the worker clean -- ignorant. The worker now drops a connection whose handshake
    did not finish."""

    async def test(client: redis.asyncio.Redis) -> None:
        task_id = await AsyncProducer(client, keys).enqueue("p")
        worker = await _worker(client, keys)
        await cancel_inside_the_handshake(worker.conn, worker.take())
        assert worker.dirty
        assert await _lengths(client, keys.queue, worker.list_key) == [1, 0]  # nothing sent
        assert await worker.reconcile() == 0
        taken = await worker.take()
        assert taken is not None and taken.id == task_id
        assert await _lengths(client, keys.queue, worker.list_key) == [0, 1]
        await worker.close()

    run_with_client(test, backend)
