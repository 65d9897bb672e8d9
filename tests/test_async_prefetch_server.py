"""`AsyncServer` with `Settings.prefetch` > 1: N asyncio prefetching workers in one process, each
slot its own in-flight list named as the threaded server's; the shutdown's cases with a
cancellation injected there (idle takes cancelled at once; a batch being handled runs on within the
grace period, its prefetched tasks included, as the threaded `PrefetchingWorker`'s does; then it is
cancelled: the running task released as a failed attempt, the ones not reached requeued unchanged;
a take pipeline cancelled with its replies in flight is reconciled before deregistering; a take
whose cancellation was swallowed, as redis-py's send can on Python 3.10, is cut by the shutdown's
interrupt, the lead's blocking take and a take pipeline alike); and a mixed fleet of a threaded and
an asyncio prefetching server on one queue, each task committed once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import redis.asyncio

from taskcustody import AsyncProducer, AsyncServer, ManualClock, QueueKeys, Server, Settings
from taskcustody.aio import AsyncPrefetchingWorker
from taskcustody.core import scripts
from taskcustody.core.envelope import decode
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import all_custody, commits
from tests.support.aio import (
    Match,
    a_swallowed_idle_take_is_cut,
    blocking,
    finishes,
    gated,
    in_custody,
    run_with_client,
    skip_on_fakeredis,
    started_server,
    stopped_at,
    suspects,
)

PREFETCH = 4
SETTINGS = dataclasses.replace(TEST_SETTINGS, prefetch=PREFETCH)


async def _started(
    client: redis.asyncio.Redis, keys: QueueKeys, settings: Settings
) -> tuple[AsyncServer, AsyncPrefetchingWorker]:
    """`started_server`'s server and worker: a prefetching one."""
    server, worker = await started_server(client, keys, settings)
    assert isinstance(worker, AsyncPrefetchingWorker)
    return server, worker


async def _queued(client: redis.asyncio.Redis, keys: QueueKeys) -> dict[str, int]:
    return {decode(raw).id: decode(raw).attempts for raw in await client.lrange(keys.queue, 0, -1)}


def test_n_prefetching_workers_in_one_process_commit_every_task_once(
    backend: Backend, keys: QueueKeys
) -> None:
    async def handler(payload: Any) -> Any:
        await asyncio.sleep(0)
        return payload

    async def test(client: redis.asyncio.Redis) -> None:
        await AsyncProducer(client, keys).enqueue_many(range(100))
        server = AsyncServer(
            client, keys, "aio-1", handler, workers=3, settings=SETTINGS, clock=ManualClock()
        )
        await server.run(until_idle=True)
        assert all(isinstance(w, AsyncPrefetchingWorker) for w in server.workers)
        # each slot its own list, named as the threaded server's (w<i>p<slot>)
        assert sorted(s.owner.worker_id for w in server.workers for s in w.slots) == sorted(
            server.control.worker_ids()
        )
        assert len({k for w in server.workers for k in w.list_keys}) == 3 * PREFETCH
        assert await client.zcard(keys.servers) == 0
        assert await client.zcard(keys.inflight_registry) == 0

    run_with_client(test, backend, SETTINGS)
    done = commits(backend.client(), keys)
    assert len(done) == 100 and set(done.values()) == {1}


def test_shutdown_cancels_idle_takes_and_lets_a_batch_finish_with_its_prefetched_tasks(
    backend: Backend, keys: QueueKeys
) -> None:
    skip_on_fakeredis(backend)
    # Takes that would block for 20 s: the run returns long before, so they were cancelled.
    settings = blocking(SETTINGS)
    started, finish = asyncio.Event(), asyncio.Event()
    ran: list[int] = []

    async def handler(payload: Any) -> Any:
        if payload == 0:
            started.set()
            await finish.wait()
        ran.append(payload)
        return payload

    async def test(client: redis.asyncio.Redis) -> None:
        ids = await AsyncProducer(client, keys).enqueue_many(range(3))
        server = AsyncServer(
            client, keys, "aio-1", handler, workers=3, settings=settings, clock=ManualClock()
        )
        run = asyncio.create_task(server.run())
        await started.wait()
        (busy,) = [w for w in server.workers if w.busy]
        idle = {f"taskcustody-{w.owner.worker_id}" for w in server.workers if not w.busy}
        assert idle  # (the first pipeline to run takes the whole batch: two idle workers)
        server.stop()
        # The idle workers' loops end at once (their blocking takes cancelled and cut); the
        # shutdown has then chosen what to cancel, and the batch being handled holds it open.
        loops = [t for t in asyncio.all_tasks() if t.get_name() in idle]
        done, _ = await asyncio.wait(loops, timeout=10)  # a guard, not a timing assumption
        assert len(done) == len(idle)
        assert not run.done()
        # The batch's worker is not cut: its pipelines' connection stays, for the releases.
        assert isinstance(busy, AsyncPrefetchingWorker)
        assert not busy.takes_interrupted and not busy.lead.takes_interrupted
        assert busy.conn.is_connected
        finish.set()
        await finishes(run)  # a guard: idle takes would hold it 20 s
        # The batch ran whole, its prefetched tasks included, as the threaded worker's does.
        assert sorted(ran) == [0, 1, 2]
        for task_id in ids:
            assert await client.get(keys.result(task_id)) is not None
        assert await in_custody(client, server) == 0
        assert await client.zcard(keys.servers) == 0

    run_with_client(test, backend, settings)


def test_shutdown_cancels_a_batch_still_running_after_the_grace_and_releases_every_task(
    backend: Backend, keys: QueueKeys
) -> None:
    settings = dataclasses.replace(SETTINGS, shutdown_grace=0.05)
    started = asyncio.Event()
    cancelled: list[int] = []

    async def handler(payload: Any) -> Any:
        if payload == 1:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(payload)
                raise
        return payload

    async def test(client: redis.asyncio.Redis) -> None:
        ids = await AsyncProducer(client, keys).enqueue_many(range(PREFETCH))
        server = AsyncServer(
            client, keys, "aio-1", handler, workers=1, settings=settings, clock=ManualClock()
        )
        run = asyncio.create_task(server.run())
        await started.wait()
        server.stop()
        await finishes(run)
        assert cancelled == [1]
        # Task 0 committed; task 1 released as a failed attempt; tasks 2 and 3, prefetched but
        # never reached, requeued as they were (the threaded worker's NOT_REACHED).
        assert await client.get(keys.result(ids[0])) == b"0"
        assert await _queued(client, keys) == {ids[1]: 1, ids[2]: 0, ids[3]: 0}
        assert await in_custody(client, server) == 0
        assert await client.hlen(keys.processing) == 0
        assert await client.zcard(keys.servers) == 0

    run_with_client(test, backend, settings)


def _take_pipeline(keys: QueueKeys) -> Match:
    """Matches the take pipeline's takes from the queue (a prefetching worker's batch)."""
    return lambda a: a[1] == scripts.TAKE_AND_RECORD_SCRIPT.sha and a[3] == keys.queue


def _stopped_at_the_take_pipeline(
    backend: Backend, keys: QueueKeys, settings: Settings, hold: str, swallow: bool
) -> None:
    """Two tasks queued; the shutdown lands at the idle worker's take pipeline (its takes held at
    `hold`; the cancellation swallowed there with `swallow`). The lists the takes filled are
    reconciled before deregistering: the tasks are back where recovery puts a counted task, never
    run."""

    async def test(client: redis.asyncio.Redis) -> None:
        server, worker = await _started(client, keys, settings)
        gate = gated(worker, _take_pipeline(keys), hold, swallow)
        ids = await AsyncProducer(client, keys).enqueue_many(range(2))

        async def idle() -> None:
            assert not worker.busy

        await stopped_at(server, gate, idle)
        assert not worker.dirty
        assert await in_custody(client, server) == 0
        assert await suspects(client, keys) == sorted(ids)
        for task_id in ids:
            assert await client.get(keys.result(task_id)) is None  # never run
        assert await client.zcard(keys.servers) == 0

    run_with_client(test, backend, settings)


def test_shutdown_reconciles_the_lists_a_take_pipeline_cancelled_in_flight_filled(
    backend: Backend, keys: QueueKeys
) -> None:
    # the takes ran, the first reply held: the shutdown cancels the pipeline with its replies
    # in flight
    _stopped_at_the_take_pipeline(backend, keys, SETTINGS, "reply", swallow=False)


def test_shutdown_ends_an_idle_blocking_take_whose_cancellation_was_swallowed(
    backend: Backend, keys: QueueKeys
) -> None:
    # the queue is empty: the lead's blocking take
    a_swallowed_idle_take_is_cut(backend, keys, SETTINGS, lambda worker: worker.lead)


def test_shutdown_ends_a_take_pipeline_whose_cancellation_was_swallowed(
    backend: Backend, keys: QueueKeys
) -> None:
    skip_on_fakeredis(backend)
    # The pipeline about to be sent: its cancellation is swallowed and the takes sent; without
    # the interrupt the worker would go on (to a batch, or to the lead's blocking take when the
    # queue is empty, which would hold the run 20 s), so it is dirty and reconciled.
    _stopped_at_the_take_pipeline(backend, keys, blocking(SETTINGS), "send", swallow=True)


def test_a_threaded_and_an_asyncio_prefetching_server_serve_one_queue_each_task_once(
    backend: Backend, keys: QueueKeys
) -> None:
    ran: dict[str, list[int]] = {"sync": [], "async": []}
    # The threaded workers hold their first tasks until the asyncio side has run one, so that
    # both serve whatever the start-up order (a guard of 10 s, not a timing assumption).
    async_ran = threading.Event()

    def sync_handler(payload: Any) -> Any:
        async_ran.wait(10)
        ran["sync"].append(payload)
        return payload

    async def async_handler(payload: Any) -> Any:
        async_ran.set()
        ran["async"].append(payload)
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
        settings=SETTINGS,
        clock=ManualClock(),
    )

    async def test(client: redis.asyncio.Redis) -> None:
        await AsyncProducer(client, keys).enqueue_many(range(n))
        thread = threading.Thread(target=threaded.run, kwargs={"until_idle": True})
        thread.start()
        server = AsyncServer(
            client, keys, "aio-1", async_handler, workers=3, settings=SETTINGS, clock=ManualClock()
        )
        await server.run(until_idle=True)
        await asyncio.to_thread(thread.join)

    run_with_client(test, backend, SETTINGS)
    done = commits(sync_client, keys)
    assert len(done) == n and set(done.values()) == {1}
    every = ran["sync"] + ran["async"]
    assert sorted(every) == list(range(n))  # each ran once, on one side
    assert ran["sync"] and ran["async"]  # both served
    assert sum(all_custody(sync_client, keys).values()) == 0
