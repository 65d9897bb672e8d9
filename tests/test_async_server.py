"""The asyncio server (`AsyncServer`): N concurrent workers in one process, each with its own
in-flight list; the shutdown's three cases (idle takes cancelled at once, running
handlers given the grace period, then cancelled with their tasks released; an idle take whose
cancellation was swallowed, as redis-py's send can on Python 3.10, cut by the shutdown's interrupt);
and a mixed fleet of a threaded and an asyncio server serving one queue, every task committed
exactly once."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import redis.asyncio

from taskcustody import AsyncProducer, AsyncServer, ManualClock, QueueKeys, Server
from taskcustody.core.envelope import decode
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import commits
from tests.support.aio import (
    a_swallowed_idle_take_is_cut,
    blocking,
    finishes,
    gated,
    named,
    run_with_client,
    skip_on_fakeredis,
    started_server,
    stopped_at,
    suspects,
)


def test_n_async_workers_in_one_process_commit_every_task_once(
    backend: Backend, keys: QueueKeys
) -> None:
    running: set[int] = set()
    overlap = 0
    two_at_once = asyncio.Event()

    async def handler(payload: Any) -> Any:
        nonlocal overlap
        running.add(payload)
        overlap = max(overlap, len(running))
        if overlap >= 2:
            two_at_once.set()
        # each waits for a second to run beside it (a guard of 10 s, not a timing assumption)
        await asyncio.wait_for(two_at_once.wait(), 10)
        running.discard(payload)
        return payload

    async def test(client: redis.asyncio.Redis) -> None:
        await AsyncProducer(client, keys).enqueue_many(range(60))
        server = AsyncServer(
            client, keys, "aio-1", handler, workers=4, settings=TEST_SETTINGS, clock=ManualClock()
        )
        await server.run(until_idle=True)
        assert len({w.list_key for w in server.workers}) == 4
        # deregistered, its lists forgotten
        assert await client.zcard(keys.servers) == 0
        assert await client.zcard(keys.inflight_registry) == 0

    run_with_client(test, backend)
    done = commits(backend.client(), keys)
    assert len(done) == 60 and set(done.values()) == {1}
    assert overlap > 1  # the workers ran concurrently


def test_shutdown_cancels_idle_takes_at_once_and_lets_a_running_handler_finish(
    backend: Backend, keys: QueueKeys
) -> None:
    skip_on_fakeredis(backend)
    # Takes that would block for 20 s: the run returns long before, so they were cancelled.
    settings = blocking(TEST_SETTINGS)
    started, finish = asyncio.Event(), asyncio.Event()

    async def handler(payload: Any) -> Any:
        started.set()
        await finish.wait()
        return "finished"

    async def test(client: redis.asyncio.Redis) -> None:
        task_id = await AsyncProducer(client, keys).enqueue("p")
        server = AsyncServer(
            client, keys, "aio-1", handler, workers=3, settings=settings, clock=ManualClock()
        )
        run = asyncio.create_task(server.run())
        await started.wait()
        (busy,) = [w for w in server.workers if w.busy]
        idle = {f"taskcustody-{w.owner.worker_id}" for w in server.workers if not w.busy}
        server.stop()
        # The idle workers' loops end at once (their blocking takes cancelled and cut); the
        # shutdown has then chosen what to cancel, and the running handler holds it open.
        loops = [t for t in asyncio.all_tasks() if t.get_name() in idle]
        done, _ = await asyncio.wait(loops, timeout=10)  # a guard, not a timing assumption
        assert len(done) == len(idle) == 2
        assert not run.done()
        # The running handler's worker is not cut: its connection stays, its release goes on it.
        assert not busy.takes_interrupted and busy.conn.is_connected
        finish.set()
        await finishes(run)  # a guard: idle takes would hold it 20 s
        assert await client.get(keys.result(task_id)) == b'"finished"'
        assert await client.zcard(keys.servers) == 0
        for worker in server.workers:
            assert await client.llen(worker.list_key) == 0

    run_with_client(test, backend, settings)


def test_shutdown_cancels_a_handler_still_running_after_the_grace_and_releases_its_task(
    backend: Backend, keys: QueueKeys
) -> None:
    settings = dataclasses.replace(TEST_SETTINGS, shutdown_grace=0.05)
    started = asyncio.Event()
    cancelled: list[bool] = []

    async def handler(payload: Any) -> Any:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def test(client: redis.asyncio.Redis) -> None:
        task_id = await AsyncProducer(client, keys).enqueue("p")
        server = AsyncServer(
            client, keys, "aio-1", handler, workers=2, settings=settings, clock=ManualClock()
        )
        run = asyncio.create_task(server.run())
        await started.wait()
        server.stop()
        await finishes(run)
        assert cancelled == [True]
        (raw,) = await client.lrange(keys.queue, 0, -1)  # released: a failed attempt
        assert (decode(raw).id, decode(raw).attempts) == (task_id, 1)
        for worker in server.workers:
            assert await client.llen(worker.list_key) == 0
        assert await client.zcard(keys.servers) == 0

    run_with_client(test, backend)


def test_shutdown_reconciles_a_list_a_take_cancelled_with_its_reply_in_flight_filled(
    backend: Backend, keys: QueueKeys
) -> None:
    async def test(client: redis.asyncio.Redis) -> None:
        server, worker = await started_server(client, keys, TEST_SETTINGS)
        # the take runs, its reply is held, the worker idle: the shutdown cancels the take with
        # its reply in flight
        gate = gated(worker, named(worker.take_command), hold="reply")
        task_id = await AsyncProducer(client, keys).enqueue("p")
        await stopped_at(server, gate)
        assert await client.llen(worker.list_key) == 0 and not worker.dirty
        # reconciled before deregistering: back where recovery puts a counted task
        assert await suspects(client, keys) == [task_id]
        assert await client.zcard(keys.servers) == 0

    run_with_client(test, backend)


def test_shutdown_ends_an_idle_take_whose_cancellation_was_swallowed(
    backend: Backend, keys: QueueKeys
) -> None:
    a_swallowed_idle_take_is_cut(backend, keys, TEST_SETTINGS, lambda worker: worker)


def test_shutdown_cutting_a_take_with_its_reply_in_flight_leaves_the_worker_dirty(
    backend: Backend, keys: QueueKeys
) -> None:
    async def test(client: redis.asyncio.Redis) -> None:
        server, worker = await started_server(client, keys, TEST_SETTINGS)
        # the take is sent and runs, its reply unread; the shutdown's cancellation is swallowed
        # there, and its interrupt closes the connection under the read
        gate = gated(worker, named(worker.take_command), hold="read", swallow=True)
        task_id = await AsyncProducer(client, keys).enqueue("p")

        async def held() -> None:
            assert await client.llen(worker.list_key) == 1 and not worker.busy

        await stopped_at(server, gate, held)
        assert await client.llen(worker.list_key) == 0 and not worker.dirty
        # dirty, so reconciled before deregistering: back where recovery puts a counted task
        assert await suspects(client, keys) == [task_id]
        assert await client.get(keys.result(task_id)) is None  # never run
        assert await client.zcard(keys.servers) == 0

    run_with_client(test, backend)


def test_a_threaded_and_an_asyncio_server_serve_one_queue_each_task_committed_once(
    backend: Backend, keys: QueueKeys
) -> None:
    ran: dict[str, set[int]] = {"sync": set(), "async": set()}
    # The threaded workers hold their first tasks until the asyncio side has run one, so that
    # both serve whatever the start-up order (a guard of 10 s, not a timing assumption).
    async_ran = threading.Event()

    def sync_handler(payload: Any) -> Any:
        async_ran.wait(10)
        ran["sync"].add(payload)
        return payload

    async def async_handler(payload: Any) -> Any:
        async_ran.set()
        ran["async"].add(payload)
        await asyncio.sleep(0)
        return payload

    n = 300
    sync_client = backend.client()
    threaded = Server(
        sync_client,
        keys,
        "threads-1",
        sync_handler,
        workers=2,
        settings=TEST_SETTINGS,
        clock=ManualClock(),
    )

    async def test(client: redis.asyncio.Redis) -> None:
        await AsyncProducer(client, keys).enqueue_many(range(n))
        thread = threading.Thread(target=threaded.run, kwargs={"until_idle": True})
        thread.start()
        server = AsyncServer(
            client,
            keys,
            "aio-1",
            async_handler,
            workers=3,
            settings=TEST_SETTINGS,
            clock=ManualClock(),
        )
        await server.run(until_idle=True)
        await asyncio.to_thread(thread.join)

    run_with_client(test, backend)
    done = commits(sync_client, keys)
    assert len(done) == n and set(done.values()) == {1}
    assert ran["sync"] | ran["async"] == set(range(n))
    assert not ran["sync"] & ran["async"]  # nothing ran twice
    assert ran["sync"] and ran["async"]  # both served
