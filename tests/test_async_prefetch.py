"""The asyncio prefetching worker (`AsyncPrefetchingWorker`, `Settings.prefetch` > 1 in an
`AsyncServer`): the threaded `PrefetchingWorker`'s pipelines and batch semantics, and a
cancellation injected at each await that matters, on both backends:

- in a handler: the batch's releases still run (the cancelled task as a failed attempt, the tasks
  not reached requeued unchanged, as the threaded worker when interrupted);
- while the take pipeline's replies are in flight: every slot dirty, the tasks in their lists,
  reconciled back before the next take (never ignorant);
- before the release pipeline is sent: it runs to its end (shielded) and commits.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis.asyncio

from taskcustody import (
    AsyncProducer,
    AsyncWorker,
    ListOwner,
    ManualClock,
    Producer,
    QueueKeys,
    Settings,
)
from taskcustody.aio import AsyncPrefetchingWorker
from taskcustody.core import scripts
from taskcustody.core.envelope import decode
from taskcustody.core.prefetch import PrefetchingWorker
from taskcustody.core.worker import Worker
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import all_custody, commits
from tests.support.aio import Gate, cancel_inside_the_handshake, run_with_client

PREFETCH = 4
SETTINGS = Settings(**{**TEST_SETTINGS.__dict__, "prefetch": PREFETCH})


async def _worker(
    client: redis.asyncio.Redis, keys: QueueKeys, handler: Any
) -> AsyncPrefetchingWorker:
    clock = ManualClock()
    worker = AsyncPrefetchingWorker(
        [
            AsyncWorker(client, keys, ListOwner("s1", 1, f"w0p{i}"), handler, clock, SETTINGS)
            for i in range(PREFETCH)
        ]
    )
    await worker.register()
    await worker.reconcile()
    return worker


def _queue_take(keys: QueueKeys) -> Any:
    """Matches a pipelined take from the queue (not the take of a suspect)."""
    return lambda args: (
        args[0] == "EVALSHA"
        and args[1] == scripts.TAKE_AND_RECORD_SCRIPT.sha
        and args[3] == keys.queue
    )


async def _queued(client: redis.asyncio.Redis, keys: QueueKeys) -> dict[str, int]:
    """The queue's tasks: id -> attempts."""
    return {decode(raw).id: decode(raw).attempts for raw in await client.lrange(keys.queue, 0, -1)}


async def _in_custody(client: redis.asyncio.Redis, worker: AsyncPrefetchingWorker) -> int:
    return sum([await client.llen(k) for k in worker.list_keys])


def test_a_busy_queue_is_taken_in_batches_and_every_task_commits_once(
    backend: Backend, keys: QueueKeys
) -> None:
    seen: list[int] = []

    async def handler(payload: Any) -> Any:
        seen.append(payload)
        return payload

    async def test(client: redis.asyncio.Redis) -> None:
        ids = await AsyncProducer(client, keys).enqueue_many(range(10))
        worker = await _worker(client, keys, handler)
        assert await worker.run_once(timeout=0.05)
        assert seen == [0, 1, 2, 3]  # one cycle took and ran a whole batch, in queue order
        while await worker.run_once(timeout=0.05):
            pass
        assert seen == list(range(10))
        assert await _in_custody(client, worker) == 0
        assert await client.hlen(keys.processing) == 0
        assert len(ids) == 10
        await worker.close()

    run_with_client(test, backend)
    assert set(commits(backend.client(), keys).values()) == {1}
    assert len(commits(backend.client(), keys)) == 10


def test_the_async_and_the_threaded_prefetching_worker_build_the_same_pipelines(
    backend: Backend, keys: QueueKeys
) -> None:
    """The sans-IO half is shared: the same slots give the same take commands."""
    clock = ManualClock()
    owners = [ListOwner("s1", 1, f"w0p{i}") for i in range(PREFETCH)]
    threaded = PrefetchingWorker(
        [Worker(backend.client(), keys, o, print, clock, SETTINGS) for o in owners]
    )

    async def test(client: redis.asyncio.Redis) -> None:
        asyncio_one = AsyncPrefetchingWorker(
            [AsyncWorker(client, keys, o, print, clock, SETTINGS) for o in owners]
        )
        assert asyncio_one.take_commands() == threaded.take_commands()
        assert asyncio_one.list_keys == threaded.list_keys

    run_with_client(test, backend)
    threaded.close()


def test_a_cancelled_handler_releases_its_batch_as_the_threaded_worker_does_when_interrupted(
    backend: Backend, keys: QueueKeys
) -> None:
    started = asyncio.Event()

    async def handler(payload: Any) -> Any:
        if payload == 1:
            started.set()
            await asyncio.Event().wait()  # only a cancellation ends it
        return payload

    async def test(client: redis.asyncio.Redis) -> None:
        ids = await AsyncProducer(client, keys).enqueue_many(range(PREFETCH))
        worker = await _worker(client, keys, handler)
        cycle = asyncio.create_task(worker.run_once(timeout=0.05))
        await started.wait()
        cycle.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cycle
        # Released before the cancellation reached us: task 0 committed, task 1 a failed
        # attempt, tasks 2 and 3 (never reached) back in the queue as they were.
        assert await _queued(client, keys) == {ids[1]: 1, ids[2]: 0, ids[3]: 0}
        assert await _in_custody(client, worker) == 0
        assert await client.hlen(keys.processing) == 0
        assert not worker.dirty and not worker.busy
        await worker.close()
        return None

    run_with_client(test, backend)
    assert list(commits(backend.client(), keys).values()) == [1]


def test_a_cancellation_while_the_take_pipelines_replies_are_in_flight_leaves_every_slot_dirty(
    backend: Backend, keys: QueueKeys
) -> None:
    ran: list[int] = []

    async def handler(payload: Any) -> Any:
        ran.append(payload)
        return payload

    async def test(client: redis.asyncio.Redis) -> None:
        await AsyncProducer(client, keys).enqueue_many(range(PREFETCH))
        worker = await _worker(client, keys, handler)
        # The first slot's reply is read and held: all four takes ran, none is handled.
        gate = worker.conn = Gate(worker.conn, _queue_take(keys), hold="reply")
        cycle = asyncio.create_task(worker.run_once(timeout=0.05))
        await gate.cancel_at(cycle)
        with pytest.raises(asyncio.CancelledError):
            await cycle
        assert ran == []
        assert all(slot.dirty for slot in worker.slots)  # never ignorant of what it may hold
        assert await _in_custody(client, worker) == PREFETCH
        # The next cycles reconcile every list first (back to where recovery puts a counted
        # task), then take and run each task once.
        while await worker.run_once(timeout=0.05):
            pass
        assert sorted(ran) == list(range(PREFETCH))
        assert not worker.dirty
        assert await _in_custody(client, worker) == 0
        await worker.close()

    run_with_client(test, backend)
    done = commits(backend.client(), keys)
    assert len(done) == PREFETCH and set(done.values()) == {1}


@pytest.mark.parametrize("hold", ["send", "reply"])
def test_a_release_pipeline_cancelled_before_it_is_sent_or_read_still_runs_to_its_end(
    backend: Backend, keys: QueueKeys, hold: str
) -> None:
    async def test(client: redis.asyncio.Redis) -> None:
        ids = await AsyncProducer(client, keys).enqueue_many(range(PREFETCH))
        worker = await _worker(client, keys, lambda p: p + 1)
        gate = worker.conn = Gate(
            worker.conn, lambda a: a[1] == scripts.RELEASE_SCRIPT.sha, hold=hold
        )
        cycle = asyncio.create_task(worker.run_once(timeout=0.05))
        await gate.cancel_at(cycle)
        with pytest.raises(asyncio.CancelledError):
            await cycle
        # the cancellation propagated only once the releases had run: all committed
        for n, task_id in enumerate(ids):
            assert json.loads(await client.get(keys.result(task_id))) == n + 1
        assert await _in_custody(client, worker) == 0
        assert await client.llen(keys.queue) == 0
        assert not worker.dirty
        await worker.close()

    run_with_client(test, backend)


def test_a_lost_take_pipeline_reply_leaves_that_slot_and_the_later_ones_dirty(
    backend: Backend, keys: QueueKeys
) -> None:
    """A connection lost after the second reply: the first two slots' tasks run and commit,
    the later slots are dirty and reconcile theirs; nothing is lost or run twice."""
    ran: list[int] = []

    async def handler(payload: Any) -> Any:
        ran.append(payload)
        return payload

    class CutAfter:
        def __init__(self, conn: Any, replies: int) -> None:
            self.inner, self.left, self.armed = conn, replies, True

        async def read_response(self, **kwargs: Any) -> Any:
            if self.armed and self.left == 0:
                self.armed = False
                await self.inner.disconnect()
                raise redis.ConnectionError("cut by the test")
            self.left -= 1
            return await self.inner.read_response(**kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    async def test(client: redis.asyncio.Redis) -> None:
        await AsyncProducer(client, keys).enqueue_many(range(2 * PREFETCH))
        worker = await _worker(client, keys, handler)
        worker.conn = CutAfter(worker.conn, 2)
        with pytest.raises(redis.ConnectionError):
            await worker.run_once(timeout=0.05)
        assert ran == [0, 1]
        assert [s.dirty for s in worker.slots] == [False, False, True, True]
        while await worker.run_once(timeout=0.05):
            pass
        await worker.close()

    run_with_client(test, backend)
    client = backend.client()
    done = commits(client, keys)
    assert len(done) == 2 * PREFETCH and set(done.values()) == {1}
    assert sorted(ran) == list(range(2 * PREFETCH))
    assert sum(all_custody(client, keys).values()) == 0


def test_only_the_lead_slot_makes_a_connection_of_its_own(
    backend: Backend, keys: QueueKeys
) -> None:
    """The other slots never send a command themselves (the pipelines do): no connection is made
    for them (redis-py's Connection() costs ~2 ms, 1 s for 64 workers x 8 slots)."""

    async def test(client: redis.asyncio.Redis) -> None:
        await AsyncProducer(client, keys).enqueue_many(range(2 * PREFETCH))
        worker = await _worker(client, keys, lambda p: p)
        while await worker.run_once(timeout=0.05):
            pass
        assert [s._own_conn is not None for s in worker.slots] == [True] + [False] * (PREFETCH - 1)
        await worker.close()

    run_with_client(test, backend)


def test_an_empty_queue_falls_back_to_the_leads_blocking_take(
    backend: Backend, keys: QueueKeys
) -> None:
    async def test(client: redis.asyncio.Redis) -> None:
        worker = await _worker(client, keys, lambda p: p)
        assert await worker.run_once(timeout=0.05) is False
        Producer(backend.client(), keys).enqueue("late")
        assert await worker.run_once(timeout=0.05) is True
        assert await _in_custody(client, worker) == 0
        await worker.close()

    run_with_client(test, backend)
    assert len(commits(backend.client(), keys)) == 1


def test_a_cancellation_inside_the_pipeline_connections_handshake_leaves_every_slot_dirty(
    backend: Backend, keys: QueueKeys
) -> None:
    """Regression (as AsyncWorker's in tests/test_async_cancel_before_send.py): the pipelines'
    connection (re)connects before a pipeline is sent; a cancellation that lands while the
    handshake's replies are unread left redis-py's connection "connected" with them pending, and
    every slot clean, so the next take pipeline read a handshake reply as slot 0's. The
    connection is now broken until its handshake is done, and the slots dirty: nothing was sent,
    but the worker cannot tell."""

    async def handler(payload: Any) -> Any:
        return payload

    async def test(client: redis.asyncio.Redis) -> None:
        await AsyncProducer(client, keys).enqueue_many(range(PREFETCH))
        worker = await _worker(client, keys, handler)
        await cancel_inside_the_handshake(worker.conn, worker.take_all())
        assert all(slot.dirty for slot in worker.slots)
        assert len(await _queued(client, keys)) == PREFETCH  # nothing was sent
        assert await _in_custody(client, worker) == 0
        assert await worker.reconcile() == 0
        batch, error = await worker.take_all()
        assert error is None
        assert len(batch.raws) == PREFETCH and await _in_custody(client, worker) == PREFETCH
        await worker.close()

    run_with_client(test, backend)
