"""The asyncio server: N concurrent `AsyncWorker`s in one process, under one server id.

The server's part of the protocol (the id's claim with a fresh incarnation, heartbeats, the
startup drain, the periodic sweep and promotion of due retries, deregistration) is the threaded
`Server`'s own code, run in a thread on a `SyncBridge`: the same scripts, sent by this loop's
client. Only the workers and the shutdown are the asyncio server's own.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import redis
import redis.asyncio

from ..core import scripts
from ..core.clock import Clock
from ..core.errors import StoppedBeforeStart
from ..core.keys import ListOwner, QueueKeys
from ..core.server import Server
from ..core.settings import Settings
from .bridge import SyncBridge
from .clock import AsyncRedisClock
from .connection import refuse_unsupported
from .prefetch import AsyncPrefetchingWorker
from .worker import AsyncWorker, _wait

#: What one of the server's concurrent workers runs.
Runner = AsyncWorker | AsyncPrefetchingWorker

log = logging.getLogger("taskcustody.server")


class AsyncServer:
    """A server process on asyncio: an exclusive server id (as `Server`), and `workers` concurrent
    `AsyncWorker`s, each with its own in-flight list and its own connection.

    `run` is the whole life: `start` (check Redis, claim the id, drain this id's debris, make the
    workers), the workers' loops and the background heartbeat/sweep, until `stop` (or
    SIGTERM/SIGINT with `install_signals`). The shutdown cancels the idle workers' takes at once
    (and closes their connections, which ends a take whose cancellation was swallowed; a take
    cancelled with its reply in flight leaves its worker dirty, and its list is reconciled
    back to the queue before deregistering), lets the running handlers finish within
    `Settings.shutdown_grace`, then cancels those still running: each releases its task as a
    failed attempt before the server deregisters.

    With `Settings.prefetch` > 1 each concurrent worker is an `AsyncPrefetchingWorker` of that
    many slots (each its own in-flight list, `w<i>p<slot>`, as the threaded `Server`'s): a batch
    being handled at shutdown runs on within the grace period, as the threaded one's does; once
    cancelled, its running task is released as a failed attempt and those it had not reached are
    requeued unchanged.

    Example::

        client = connect_async("redis://127.0.0.1:6379/0")
        server = AsyncServer(client, QueueKeys("images"), default_server_id(), handler, workers=64)
        await server.run(install_signals=True)
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: QueueKeys,
        server_id: str,
        handler: Callable[[Any], Any],
        *,
        workers: int = 1,
        settings: Settings | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.client = client
        self.keys = keys
        self.handler = handler
        self.settings = settings or Settings()
        refuse_unsupported(client, self.settings)
        self.clock: Clock = clock if clock is not None else AsyncRedisClock(client)
        self.bridge = SyncBridge(client)
        #: The threaded server's identity, heartbeat and recovery, on the bridge.
        self.control = Server(
            cast(redis.Redis, self.bridge),
            keys,
            server_id,
            handler,
            workers=workers,
            settings=self.settings,
            clock=self.clock,
        )
        self.stop_event = asyncio.Event()
        self.workers: list[Runner] = []

    @property
    def server_id(self) -> str:
        return self.control.server_id

    @property
    def incarnation(self) -> int | None:
        return self.control.incarnation

    @property
    def superseded(self) -> bool:
        return self.control.superseded

    def stop(self) -> None:
        self.stop_event.set()
        self.control.stop_event.set()

    def make_worker(self, index: int) -> AsyncWorker:
        return self._worker_named(f"w{index}")

    def _worker_named(self, worker_id: str) -> AsyncWorker:
        owner = ListOwner(self.server_id, self.control.identity.incarnation, worker_id)
        worker = AsyncWorker(self.client, self.keys, owner, self.handler, self.clock, self.settings)
        worker.suspects = self.control.suspect_slot  # one suspect per process
        return worker

    def make_runner(self, index: int) -> Runner:
        """What one concurrent worker runs: a worker, or with `prefetch` > 1 a prefetching
        worker of that many slots, named as the threaded `Server.make_runner`'s."""
        if self.settings.prefetch == 1:
            return self.make_worker(index)
        prefix = f"w{index}p"
        return AsyncPrefetchingWorker(
            [self._worker_named(w) for w in self.control.worker_ids() if w.startswith(prefix)]
        )

    async def start(self, wait_for_id: float = 0.0) -> list[Runner]:
        """Check the server, claim the id, drain our debris, make and register the workers."""
        self.bridge.bind(asyncio.get_running_loop())
        if isinstance(self.clock, AsyncRedisClock):
            await self.clock.resync()
        version = await asyncio.to_thread(self.control.prepare, wait_for_id)
        self.workers = [self.make_runner(i) for i in range(self.control.worker_count)]
        await self.workers[0].register()  # the scripts: once per Redis, not per worker
        for worker in self.workers:
            # Connected now, not in the first take: a cancellation that lands in redis-py's
            # handshake can be swallowed there (AsyncWorker._call checks for that on 3.11+).
            if isinstance(worker, AsyncPrefetchingWorker):
                await worker.connect()
            else:
                await worker.conn.connect()
        self.control._banner(version)
        return self.workers

    async def run(
        self, until_idle: bool = False, install_signals: bool = False, wait_for_id: float = 0.0
    ) -> None:
        """Run until stopped (`stop`, SIGTERM/SIGINT with `install_signals`) or, with
        `until_idle`, until every worker found the queue empty. (`start`ed already: its
        workers are run.)"""
        # The signal handlers first, as the threaded server's `run`: a SIGTERM while `start`
        # waits for the id is a graceful stop.
        if install_signals:
            self._install_signal_handlers()
        try:
            workers = self.workers or await self.start(wait_for_id)
        except StoppedBeforeStart as exc:
            log.info("%s: exiting", exc)
            return
        loops = {
            asyncio.create_task(
                self._supervise(w, until_idle), name=f"taskcustody-{w.owner.worker_id}"
            ): w
            for w in workers
        }
        background = asyncio.create_task(self._background(), name="taskcustody-heartbeat")
        waiting: list[asyncio.Future[Any]] = [asyncio.ensure_future(self.stop_event.wait())]
        if until_idle:
            waiting.append(asyncio.ensure_future(_all(loops)))
        try:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.stop()
            for waiter in waiting:
                waiter.cancel()
            await self._shutdown(loops)
            await background

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()

        def handle(signum: int) -> None:
            self.control.on_signal(signum)  # the first stops, a second exits at once
            self.stop_event.set()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, handle, signum)

    async def _supervise(self, worker: Runner, until_idle: bool) -> None:
        """Run a worker; if it dies of an unexpected error, run it again (dirty: it reconciles
        its own list first)."""
        while not self.stop_event.is_set():
            try:
                await worker.run(self.stop_event, until_idle=until_idle)
                return
            except Exception:
                log.exception("worker %s crashed; restarting it", worker.list_key)
                worker.dirty = True
                await _wait(self.stop_event, 1.0)

    async def _background(self) -> None:
        """The threaded server's heartbeat/promote/sweep loop, in a thread, until we stop (or
        are superseded: then we stop); and the clock's resync."""
        resync = asyncio.create_task(self._resync())
        # A thread of its own, not the loop's default executor, which plain handlers may fill.
        executor = ThreadPoolExecutor(1, thread_name_prefix="taskcustody-heartbeat")
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self.control._background)
        finally:
            resync.cancel()
            executor.shutdown(wait=False)
        if self.control.superseded:
            self.stop_event.set()

    async def _resync(self) -> None:
        clock = self.clock
        if not isinstance(clock, AsyncRedisClock):
            return
        while not self.stop_event.is_set():
            await _wait(self.stop_event, clock.resync_interval)
            try:
                await clock.resync()
            except redis.RedisError as exc:
                log.warning("clock resync failed: %s", exc)

    async def _shutdown(self, loops: dict[asyncio.Task[None], Runner]) -> None:
        """Cancel the idle workers at once; give the busy ones the grace period, then cancel
        them (each releases its task, as a failed attempt, before its loop ends); reconcile the
        lists a cancelled take may have filled; deregister; forget our empty lists.

        An idle worker is also `interrupt`ed: its take's cancellation may be swallowed (by
        redis-py's asyncio timeouts; before Python 3.11 a task cannot tell), which would leave
        its loop blocked until the take's `block_timeout`; the interrupt closes its connections
        and makes its take raise the cancellation whatever became of it."""
        idle = [(task, worker) for task, worker in loops.items() if not worker.busy]
        for task, _ in idle:
            task.cancel()
        for _, worker in idle:
            await worker.interrupt()
        pending = {t for t in loops if not t.done()}
        if pending:
            _, late = await asyncio.wait(pending, timeout=self.settings.shutdown_grace)
            if late:
                log.warning(
                    "grace period over with tasks still running in %s; cancelling them "
                    "(their tasks are released as failed attempts)",
                    sorted(loops[t].list_key for t in late),
                )
                for task in late:
                    task.cancel()
                await asyncio.wait(late)
        for task, worker in loops.items():
            if not task.cancelled() and task.exception() is not None:
                log.error("worker %s stopped with %r", worker.list_key, task.exception())
        try:
            for worker in loops.values():
                if worker.dirty:
                    await worker.reconcile()
            if not self.superseded:
                await asyncio.to_thread(self.control.deregister)
            if self.incarnation is not None:
                await asyncio.to_thread(self.control.sweep_lease.release)
            for worker in loops.values():
                for list_key in worker.list_keys:
                    await self.client.eval(
                        scripts.FORGET_EMPTY_LIST, 2, list_key, self.keys.inflight_registry
                    )
                await worker.close()
        except redis.RedisError as exc:
            log.warning("could not deregister cleanly: %s", exc)


async def _all(tasks: dict[asyncio.Task[None], Runner]) -> None:
    await asyncio.wait(list(tasks))
