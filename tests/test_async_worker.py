"""The asyncio worker's public steps (`AsyncWorker`, the threaded `Worker`'s steps as coroutines),
on both backends: one cycle commits and leaves nothing behind; a failure retries; the composite
step takes the next task; a malformed task is dead-lettered; both APIs build the same commands;
`async def` and plain handlers both run; the producer's envelopes are the threaded producer's."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio

from taskcustody import (
    AsyncProducer,
    AsyncWorker,
    ListOwner,
    ManualClock,
    Outcome,
    Producer,
    QueueKeys,
    Worker,
)
from taskcustody.core.envelope import decode, new_task
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import commits
from tests.support.aio import run_with_client

OWNER = ListOwner("s1", 1, "w0")


async def clean_worker(
    client: redis.asyncio.Redis,
    keys: QueueKeys,
    handler: Callable[[Any], Any] = lambda p: None,
    clock: ManualClock | None = None,
) -> AsyncWorker:
    worker = AsyncWorker(client, keys, OWNER, handler, clock or ManualClock(), TEST_SETTINGS)
    await worker.register()
    assert worker.dirty  # a new worker starts dirty, as the threaded one
    await worker.reconcile()
    return worker


def test_one_async_cycle_commits_and_leaves_nothing_in_custody(
    backend: Backend, keys: QueueKeys
) -> None:
    async def handler(payload: Any) -> Any:
        await asyncio.sleep(0)
        return {"double": payload * 2}

    async def test(client: redis.asyncio.Redis) -> None:
        task_id = await AsyncProducer(client, keys).enqueue(21)
        worker = await clean_worker(client, keys, handler)
        task = await worker.take()
        assert task is not None and task.id == task_id
        assert await client.lrange(worker.list_key, 0, -1) == [task.raw]
        await worker.record(task)
        assert await client.hget(keys.processing, task_id) is not None
        done = await worker.release(task, await worker.execute(task))
        assert (done.held, done.action, done.remaining) == (True, "committed", 0)
        assert await client.llen(worker.list_key) == 0
        assert await client.hlen(keys.processing) == 0
        assert json.loads(await client.get(keys.result(task_id))) == {"double": 42}
        assert not worker.dirty
        await worker.close()

    run_with_client(test, backend)
    assert commits(backend.client(), keys) == {next(iter(commits(backend.client(), keys))): 1}


def test_a_plain_handler_runs_in_a_thread_not_on_the_loop(
    backend: Backend, keys: QueueKeys
) -> None:
    threads: list[threading.Thread] = []

    def handler(payload: Any) -> Any:
        threads.append(threading.current_thread())
        return payload

    async def test(client: redis.asyncio.Redis) -> None:
        await AsyncProducer(client, keys).enqueue("p")
        worker = await clean_worker(client, keys, handler)
        assert await worker.run_once() is True
        await worker.close()

    run_with_client(test, backend)
    assert threads and threads[0] is not threading.main_thread()


def test_a_failing_async_handler_is_retried_with_its_attempt_counted(
    backend: Backend, keys: QueueKeys
) -> None:
    async def handler(payload: Any) -> Any:
        raise RuntimeError("boom")

    async def test(client: redis.asyncio.Redis) -> None:
        await AsyncProducer(client, keys).enqueue("p")
        worker = await clean_worker(client, keys, handler)
        task = await worker.take()
        assert task is not None
        outcome = await worker.execute(task)
        assert outcome == Outcome(False, error="RuntimeError: boom")
        done = await worker.release(task, outcome)
        assert done.action == "retried"
        (raw,) = await client.lrange(keys.queue, 0, -1)
        assert decode(raw).attempts == 1
        await worker.close()

    run_with_client(test, backend)


def test_release_and_take_takes_the_next_task_with_its_record(
    backend: Backend, keys: QueueKeys
) -> None:
    async def test(client: redis.asyncio.Redis) -> None:
        first, second = await AsyncProducer(client, keys).enqueue_many(["a", "b"])
        worker = await clean_worker(client, keys)
        task = await worker.take()
        assert task is not None and task.id == first
        done, nxt = await worker.release_and_take(task, Outcome(True, 1))
        assert done.action == "committed"
        assert nxt is not None and nxt.id == second
        assert await client.lrange(worker.list_key, 0, -1) == [nxt.raw]
        assert await client.hget(keys.processing, second) is not None
        done, none = await worker.release_and_take(nxt, Outcome(True, 2))
        assert done.action == "committed" and none is None
        await worker.close()

    run_with_client(test, backend)


def test_a_malformed_task_is_dead_lettered_and_the_take_returns_none(
    backend: Backend, keys: QueueKeys
) -> None:
    async def test(client: redis.asyncio.Redis) -> None:
        await client.lpush(keys.queue, b"not json")
        worker = await clean_worker(client, keys)
        assert await worker.take() is None
        assert await client.llen(worker.list_key) == 0
        (letter,) = await client.lrange(keys.dead_letters, 0, -1)
        assert json.loads(letter)["task_id"] is None
        await worker.close()

    run_with_client(test, backend)


def test_an_idle_take_returns_none_after_its_timeout(backend: Backend, keys: QueueKeys) -> None:
    async def test(client: redis.asyncio.Redis) -> None:
        worker = await clean_worker(client, keys)
        assert await worker.take(timeout=0.05) is None
        assert await worker.run_once(timeout=0.05) is False
        # registered by the take, in the same write
        assert await client.zscore(keys.inflight_registry, worker.list_key) is not None
        await worker.close()

    run_with_client(test, backend)


def test_both_workers_build_the_same_release_and_take_commands(
    backend: Backend, keys: QueueKeys
) -> None:
    clock = ManualClock()
    task = new_task({"x": 1}, clock.now())
    sync = Worker(backend.client(), keys, OWNER, lambda p: None, clock, TEST_SETTINGS)

    async def test(client: redis.asyncio.Redis) -> None:
        aio = AsyncWorker(client, keys, OWNER, lambda p: None, clock, TEST_SETTINGS)
        for outcome in (Outcome(True, 3), Outcome(False, error="e")):
            assert aio.verdict(task, outcome) == sync.verdict(task, outcome)
            action, data = sync.verdict(task, outcome)
            assert aio.release_args(task.raw, task.id, action, data) == sync.release_args(
                task.raw, task.id, action, data
            )
        assert aio._take_args(1.0) == sync._take_args(1.0)
        assert aio.registration() == sync.registration()
        aio.suspects.maybe_waiting = sync.suspects.maybe_waiting = True  # each its own slot
        args = aio.acquire_suspect_take()
        assert args is not None and args == sync.acquire_suspect_take()
        await aio.close()

    run_with_client(test, backend)
    sync.close()


def test_the_async_producer_writes_the_threaded_producers_envelope(
    backend: Backend, keys: QueueKeys
) -> None:
    clock = ManualClock()

    async def test(client: redis.asyncio.Redis) -> None:
        await AsyncProducer(client, keys, clock).enqueue({"a": 1}, task_id="t1")

    run_with_client(test, backend)
    Producer(backend.client(), keys, clock).enqueue({"a": 1}, task_id="t1")
    first, second = backend.client().lrange(keys.queue, 0, -1)
    assert first == second


def test_the_async_api_refuses_what_it_does_not_serve_yet(keys: QueueKeys) -> None:
    import dataclasses

    async def test(client: redis.asyncio.Redis) -> None:
        with pytest.raises(ValueError, match="min_replicas"):
            AsyncProducer(client, keys, settings=dataclasses.replace(TEST_SETTINGS, min_replicas=1))

    import fakeredis

    run_with_client(test, Backend("fakeredis", None, fakeredis.FakeServer()))
