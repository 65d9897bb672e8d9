"""Cancellation, custody's hardest case in asyncio: a `CancelledError` injected
at each await that matters, deterministically (a gate on the worker's connection holds the command
there, or the handler awaits an event; the test cancels the task once it waits), on both
backends:

- in the handler: the task is released as a failed attempt, before the cancellation propagates;
- between take and record: the same;
- inside the release (before it is even sent): the release still runs to its end (shielded);
- while the take's reply is in flight: the worker is dirty, its list holds the task, and its next
  cycle reconciles it back to the queue before taking (never ignorant).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis.asyncio

from taskcustody import AsyncProducer, AsyncWorker, ListOwner, ManualClock, QueueKeys
from taskcustody.aio import complete
from taskcustody.core import scripts
from taskcustody.core.envelope import decode
from tests.conftest import TEST_SETTINGS, Backend
from tests.support.aio import Gate, named, run_with_client

OWNER = ListOwner("s1", 1, "w0")


async def _worker(client: redis.asyncio.Redis, keys: QueueKeys, handler: Any) -> AsyncWorker:
    worker = AsyncWorker(client, keys, OWNER, handler, ManualClock(), TEST_SETTINGS)
    await worker.register()
    await worker.reconcile()
    return worker


async def _cancelled(task: asyncio.Task[Any]) -> None:
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_cancelled_handler_releases_its_task_as_a_failed_attempt(
    backend: Backend, keys: QueueKeys
) -> None:
    started = asyncio.Event()

    async def handler(payload: Any) -> Any:
        started.set()
        await asyncio.Event().wait()  # never returns: only a cancellation ends it

    async def test(client: redis.asyncio.Redis) -> None:
        task_id = await AsyncProducer(client, keys).enqueue("p")
        worker = await _worker(client, keys, handler)
        cycle = asyncio.create_task(worker.run_once())
        await started.wait()
        cycle.cancel()
        await _cancelled(cycle)
        # released before the cancellation reached us: nothing in custody, retried once
        assert await client.llen(worker.list_key) == 0
        assert await client.hlen(keys.processing) == 0
        (raw,) = await client.lrange(keys.queue, 0, -1)
        assert (decode(raw).id, decode(raw).attempts) == (task_id, 1)
        assert not worker.dirty and not worker.busy
        await worker.close()

    run_with_client(test, backend)


def test_a_cancellation_between_take_and_record_releases_the_task(
    backend: Backend, keys: QueueKeys
) -> None:
    async def test(client: redis.asyncio.Redis) -> None:
        await AsyncProducer(client, keys).enqueue("p")
        worker = await _worker(client, keys, lambda p: "ran")
        gate = worker.conn = Gate(
            worker.conn, named("EVALSHA", scripts.RECORD_SCRIPT.sha), hold="send"
        )
        cycle = asyncio.create_task(worker.run_once())
        await gate.cancel_at(cycle)
        await _cancelled(cycle)
        assert await client.llen(worker.list_key) == 0
        (raw,) = await client.lrange(keys.queue, 0, -1)
        assert decode(raw).attempts == 1  # a failed attempt, never run
        assert await client.get(keys.committed) is None
        await worker.close()

    run_with_client(test, backend)


def test_a_release_cancelled_before_it_is_sent_still_runs_to_its_end(
    backend: Backend, keys: QueueKeys
) -> None:
    async def test(client: redis.asyncio.Redis) -> None:
        task_id = await AsyncProducer(client, keys).enqueue(20)
        worker = await _worker(client, keys, lambda p: p + 1)
        gate = worker.conn = Gate(
            worker.conn, named("EVALSHA", scripts.RELEASE_SCRIPT.sha), hold="send"
        )
        cycle = asyncio.create_task(worker.run_once())
        await gate.cancel_at(cycle)
        await _cancelled(cycle)
        # the cancellation propagated only once the release had run: committed
        assert json.loads(await client.get(keys.result(task_id))) == 21
        assert await client.llen(worker.list_key) == 0
        assert await client.llen(keys.queue) == 0
        assert not worker.dirty
        await worker.close()

    run_with_client(test, backend)


def test_a_cancellation_while_the_takes_reply_is_in_flight_leaves_the_worker_dirty(
    backend: Backend, keys: QueueKeys
) -> None:
    async def test(client: redis.asyncio.Redis) -> None:
        task_id = await AsyncProducer(client, keys).enqueue("p")
        worker = await _worker(client, keys, lambda p: "done")
        gate = worker.conn = Gate(worker.conn, named(worker.take_command), hold="reply")
        take = asyncio.create_task(worker.take())
        await gate.cancel_at(take)
        await _cancelled(take)
        assert worker.dirty  # it may hold a task it never saw: never ignorant
        (raw,) = await client.lrange(worker.list_key, 0, -1)
        assert decode(raw).id == task_id
        # its next cycle reconciles first (the task back to the queue), then takes and runs it
        assert await worker.run_once() is True
        assert not worker.dirty
        assert await client.llen(worker.list_key) == 0
        assert json.loads(await client.get(keys.result(task_id))) == "done"
        await worker.close()

    run_with_client(test, backend)


def test_a_cancelled_composite_step_leaves_the_worker_dirty(
    backend: Backend, keys: QueueKeys
) -> None:
    """`release_and_take`'s reply cut by a cancellation: the release ran and the next task may be
    in our list; dirty, and the reconcile gives it back."""

    async def test(client: redis.asyncio.Redis) -> None:
        await AsyncProducer(client, keys).enqueue_many(["a", "b"])
        worker = await _worker(client, keys, lambda p: p)
        task = await worker.take()
        assert task is not None
        gate = worker.conn = Gate(
            worker.conn, named("EVALSHA", scripts.RELEASE_AND_TAKE_SCRIPT.sha), hold="reply"
        )
        step = asyncio.create_task(worker.release_and_take(task, await worker.execute(task)))
        await gate.cancel_at(step)
        await _cancelled(step)
        assert worker.dirty
        assert await client.llen(worker.list_key) == 1
        assert await worker.reconcile() == 1
        # back where recovery puts a counted task (Settings.max_recoveries): the suspects list
        assert await client.llen(keys.suspects) + await client.llen(keys.queue) == 1
        await worker.close()

    run_with_client(test, backend)


def test_complete_finishes_the_step_and_then_reraises_the_cancellation() -> None:
    async def main() -> None:
        go = asyncio.Event()
        finished: list[str] = []

        async def step() -> str:
            await go.wait()
            finished.append("step")
            return "done"

        async def caller() -> str:
            return await complete(step())

        task = asyncio.create_task(caller())
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.sleep(0)
        assert not task.done()  # still waiting for the step, cancelled or not
        go.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert finished == ["step"]

    asyncio.run(main())
