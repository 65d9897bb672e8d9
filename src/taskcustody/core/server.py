"""A server: an exclusive server id, heartbeats, recovery passes and a pool of worker threads."""

from __future__ import annotations

import logging
import os
import re
import secrets
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType

import redis

from ..deploy.cluster import is_cluster, redirect_kind, slot_owner
from ..deploy.connection import check_server
from ..deploy.oom import OomSpell, is_oom
from ..ops.logs import client_url
from . import recovery, scheduled, scripts
from .clock import Clock, RedisClock
from .errors import RedisOutOfMemory, ServerIdHeld, StoppedBeforeStart, Superseded
from .keys import ListOwner, QueueKeys, check_name
from .prefetch import PrefetchingWorker
from .recovery import RecoveryReport, ServerIdentity
from .settings import Settings
from .suspects import SuspectSlot
from .sweep_lease import SweepLease, holder_name
from .worker import Handler, Worker

log = logging.getLogger("taskcustody.server")


def default_server_id(host: str | None = None, pid: int | None = None) -> str:
    """The default server id: `<host>-<pid>-<4 random hex digits>`, unique per process.

    The host and pid say where the process runs (for `status` and the logs); the random suffix
    keeps the id unique where they do not (containers sharing a host name all run as pid 1).
    A restart is a new id: the dead process's in-flight lists are drained by the first sweep of
    any live server (the restarted one included) once the dead one's lease lapses. A stable id
    (`--server-id`) has the restart drain its own debris at start instead (docs/guides/
    operations.md, "Server ids and restarts")."""
    name = host if host is not None else socket.gethostname()
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", name).strip(".-")[:48] or "host"
    return f"{name}-{os.getpid() if pid is None else pid}-{secrets.token_hex(2)}"


def new_incarnation() -> int:
    """A fresh incarnation: 62 random bits, unique without anything Redis remembers (a Redis
    that restarted empty would start a counter again)."""
    return secrets.randbits(62) | 1


#: The most worker threads one server process runs. Each holds a Redis connection and a thread
#: stack; past this, more processes (each its own server id) serve a fleet better than one.
MAX_WORKER_THREADS = 1024


class Server:
    """A server process's part in the protocol: it holds a server id exclusively, keeps it alive
    with heartbeats, recovers the tasks of dead holders, and runs `workers` worker threads.

    `run` is the whole life: `start` checks Redis, claims the id (a fresh random incarnation;
    refused with `ServerIdHeld` while a live process holds it, or waited for up to
    `wait_for_id` seconds), drains the lists an earlier incarnation of the same id left behind
    (the startup drain), and makes the workers; then one thread per worker runs its cycle under
    a supervisor that restarts a crashed worker (dirty, so it reconciles first), and one
    background thread heartbeats every `Settings.heartbeat_interval` and sweeps every
    `Settings.sweep_interval` (with `Settings.sweep_lease`, only the lease's holder sweeps).
    On `stop` (or SIGTERM/SIGINT with `install_signals`) the workers finish the task in hand,
    then the server deregisters and forgets its empty lists.

    What it guarantees (docs/protocol.md): at most one live process holds a server id; a
    process that claims the id once its holder's lease has lapsed (the holder stalled)
    supersedes it, and the old process stops at its next heartbeat; a sweep drains only the
    lists of servers that are dead by the clock -- never its own incarnation's, never a
    registered live server's -- and prunes before it drains, so every list dead when the pass
    starts is drained in that pass; each drain moves at most as many tasks as the list held
    when it started. With `Settings.prefetch` > 1 each thread runs a `PrefetchingWorker`.

    Example (the README's first queue)::

        client, keys = connect("redis://127.0.0.1:6379/0"), QueueKeys("demo")
        handle = Producer(client, keys).submit({"x": 21})
        Server(client, keys, "demo-1", lambda p: p["x"] * 2).run(until_idle=True)
        handle.result(timeout=5)              # 42

    In production: ``Server(..., workers=8).run(install_signals=True)``, which serves until
    SIGTERM.
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: QueueKeys,
        server_id: str,
        handler: Handler,
        *,
        workers: int = 1,
        settings: Settings | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not 1 <= workers <= MAX_WORKER_THREADS:
            raise ValueError(
                f"a server runs 1 to {MAX_WORKER_THREADS} worker threads, not {workers}"
            )
        self.client = client
        self.keys = keys
        self.server_id = check_name("server id", server_id)
        self.handler = handler
        self.worker_count = workers
        self.settings = settings or Settings()
        self.clock = clock or RedisClock(client, key=keys.queue)
        self.incarnation: int | None = None
        # The injected clock's time of our last registration that Redis accepted (claim or
        # heartbeat); None before the first (ops/metrics.py reports its age).
        self.last_heartbeat: float | None = None
        self.stop_event = threading.Event()
        self.superseded = False
        # What a second SIGINT/SIGTERM calls (with install_signals): exit without cleanup.
        self.force_exit: Callable[[int], object] = os._exit
        # Poison pills: this process runs at most one suspect at a time, whichever worker (or
        # prefetch slot) takes it (suspects.py).
        self.suspect_slot = SuspectSlot()
        # Redis out of memory during start and in the heartbeat loop: back-off and throttled log.
        self.oom = OomSpell(
            log, f"server {self.server_id}", self.clock, self.settings.oom_log_interval
        )

    # -- identity ----------------------------------------------------------------------------

    @property
    def identity(self) -> ServerIdentity:
        if self.incarnation is None:
            raise RuntimeError("claim() the server id first")
        return ServerIdentity(self.server_id, self.incarnation)

    def claim(self) -> int:
        """Take the server id exclusively, with a fresh incarnation; refused while a live process
        holds it."""
        now = self.clock.now()
        candidate = new_incarnation()
        lists = self.list_keys(candidate)
        incarnation, deadline = self.client.eval(
            scripts.CLAIM,
            3 + len(lists),
            self.keys.servers,
            self.keys.incarnations,
            self.keys.inflight_registry,
            *lists,
            self.server_id,
            repr(now),
            repr(now + self.settings.server_ttl),
            candidate,
        )
        if int(incarnation) < 0:
            raise ServerIdHeld(
                f"server id {self.server_id!r} is held by a live process until "
                f"{float(deadline):.3f} (now {now:.3f}); use another id or wait for its lease "
                "to lapse"
            )
        self.incarnation = int(incarnation)
        self.superseded = False
        self.last_heartbeat = now
        return self.incarnation

    def heartbeat(self) -> None:
        """Renew our registration. If it was gone (pruned while we stalled, or Redis lost its
        data), register again, with our in-flight lists; if a newer process holds our id, stop."""
        now = self.clock.now()
        lists = self.list_keys()
        ok = self.client.eval(
            scripts.HEARTBEAT,
            3 + len(lists),
            self.keys.servers,
            self.keys.incarnations,
            self.keys.inflight_registry,
            *lists,
            self.server_id,
            self.identity.incarnation,
            repr(now + self.settings.server_ttl),
            repr(now),
        )
        if not int(ok):
            self.superseded = True
            self.stop_event.set()
            raise Superseded(
                f"server id {self.server_id!r} was claimed by a newer process while this one "
                "stalled; stopping"
            )
        self.last_heartbeat = now

    def deregister(self) -> None:
        if self.incarnation is not None:
            self.client.eval(
                scripts.DEREGISTER,
                2,
                self.keys.servers,
                self.keys.incarnations,
                self.server_id,
                self.incarnation,
            )

    # -- recovery ----------------------------------------------------------------------------

    def startup_drain(self) -> dict[str, int]:
        """Before taking work: drain our own server id's lists (include_self=True), debris of
        earlier runs of this id. Other servers' dead lists are the periodic sweep's."""
        drained = recovery.recover_inflight(
            self.client,
            self.keys,
            self.identity,
            include_self=True,
            chunk=self.settings.drain_chunk,
            recovering=self.recovering(),
        )
        if any(drained.values()):
            self.suspect_slot.maybe_waiting = True  # what we recovered waits as suspects
        return drained

    def recovering(self) -> recovery.Recovering:
        """How this server's recovery steps count poison pills (`Settings.max_recoveries`)."""
        return recovery.Recovering(self.settings.max_recoveries, self.clock.now())

    def sweep(self) -> RecoveryReport:
        """The periodic pass: prune, forget dead empty lists older than the grace, then drain
        lists of dead owners (include_self=False), then the processing sweep."""
        report = recovery.sweep(
            self.client,
            self.keys,
            self.clock.now(),
            self.identity,
            chunk=self.settings.drain_chunk,
            grace=self.settings.registry_grace,
            max_recoveries=self.settings.max_recoveries,
        )
        if any(report.drained_lists.values()) or report.requeued_stuck:
            self.suspect_slot.maybe_waiting = True  # what we recovered waits as suspects
        return report

    @property
    def sweep_lease(self) -> SweepLease:
        holder = holder_name(self.server_id, self.identity.incarnation)
        return SweepLease(self.client, self.keys, holder, self.settings.lease_ttl)

    def periodic_sweep(self) -> RecoveryReport | None:
        """The background loop's sweep: with `Settings.sweep_lease`, only the lease's holder sweeps
        (None: another server holds it), so that one sweep per interval serves the whole fleet."""
        if self.settings.sweep_lease and not self.sweep_lease.acquire_or_renew():
            return None
        return self.sweep()

    def promote_due(self, now: float | None = None) -> int:
        """Move the retries due by `now` (default: the clock's now) from the scheduled set to
        the queue (or the suspects list), in one script; run at every tick of the background
        loop (no lease needed: the ZREM of each member decides who moves it). Returns how many
        moved."""
        moved = scheduled.promote(self.client, self.keys, self.clock.now() if now is None else now)
        if moved:
            self.suspect_slot.maybe_waiting = True  # a promoted suspect may wait
        return moved

    def requeue_stuck_processing_tasks(self) -> tuple[int, int]:
        return recovery.requeue_stuck_processing_tasks(
            self.client, self.keys, self.identity, self.recovering()
        )

    # -- workers -----------------------------------------------------------------------------

    def make_worker(self, index: int) -> Worker:
        return self._worker_named(f"w{index}")

    def worker_ids(self) -> list[str]:
        """The worker ids of our in-flight lists: `w<i>`, or `w<i>p<slot>` when prefetching."""
        if self.settings.prefetch == 1:
            return [f"w{i}" for i in range(self.worker_count)]
        return [
            f"w{i}p{slot}"
            for i in range(self.worker_count)
            for slot in range(self.settings.prefetch)
        ]

    def list_keys(self, incarnation: int | None = None) -> list[str]:
        """The in-flight lists of our incarnation (or of the one given)."""
        inc = self.identity.incarnation if incarnation is None else incarnation
        return [self.keys.inflight(ListOwner(self.server_id, inc, w)) for w in self.worker_ids()]

    def _worker_named(self, worker_id: str) -> Worker:
        owner = ListOwner(self.server_id, self.identity.incarnation, worker_id)
        worker = Worker(self.client, self.keys, owner, self.handler, self.clock, self.settings)
        worker.suspects = self.suspect_slot
        return worker

    def make_runner(self, index: int) -> Worker | PrefetchingWorker:
        """What one worker thread runs: a worker, or with `prefetch` > 1 a prefetching worker of
        that many slots (each its own in-flight list)."""
        if self.settings.prefetch == 1:
            return self.make_worker(index)
        prefix = f"w{index}p"
        return PrefetchingWorker(
            [self._worker_named(w) for w in self.worker_ids() if w.startswith(prefix)]
        )

    def claim_when_free(self, patience: float) -> int:
        """Claim the id, waiting up to `patience` seconds for a previous holder's lease to lapse
        (a restart right after a crash finds the dead process's deadline still in the future).
        While Redis is out of memory (CLAIM's first write, an HSET, is refused) it waits for
        memory, however long: exiting would only have a supervisor restart us into the same
        refusal."""
        waited = 0.0
        step = max(0.05, self.settings.heartbeat_interval / 4)
        while True:
            try:
                incarnation = self.claim()
            except ServerIdHeld:
                if waited >= patience:
                    raise
                if waited == 0:
                    log.info(
                        "server id %r is held by a live process: waiting up to %gs for its "
                        "lease to lapse",
                        self.server_id,
                        patience,
                    )
            except redis.ResponseError as exc:
                self._wait_out_oom(exc, "claiming the server id")
                continue
            else:
                self.oom.recovered()
                return incarnation
            self.stop_event.wait(step)
            if self.stop_event.is_set():
                raise StoppedBeforeStart(
                    f"stopped while waiting for server id {self.server_id!r} to be free"
                )
            waited += step

    def _wait_out_oom(self, exc: redis.ResponseError, doing: str) -> None:
        """Re-raise `exc` unless it is an OOM refusal; for one, wait the back-off pause (raising
        RedisOutOfMemory if stopped meanwhile)."""
        if not is_oom(exc):
            raise exc
        self.stop_event.wait(self.oom.refused(exc))
        if self.stop_event.is_set():
            raise RedisOutOfMemory(
                f"stopped while {doing}: Redis is out of memory ({exc})"
            ) from exc

    def start(self, wait_for_id: float = 0.0) -> list[Worker | PrefetchingWorker]:
        """Check the server, claim the id, drain our debris, register our lists."""
        version = self.prepare(wait_for_id)
        workers = [self.make_runner(i) for i in range(self.worker_count)]
        for worker in workers:
            self.register_waiting_out_oom(worker.register)
        self.oom.recovered()
        self._banner(version)
        return workers

    def register_waiting_out_oom(self, register: Callable[[], None]) -> None:
        """A worker's set-up: a list is registered before it can hold a task, so while Redis is
        out of memory, wait for memory."""
        while True:
            try:
                register()
                return
            except redis.ResponseError as exc:
                self._wait_out_oom(exc, "registering the in-flight lists")

    def prepare(self, wait_for_id: float = 0.0) -> str:
        """`start` but for the workers (the asyncio server makes its own): check the server,
        claim the id, drain our debris. Returns the server's version."""
        version = check_server(
            self.client, self.keys, allow_evicting_policy=self.settings.allow_evicting_policy
        )
        migrated = recovery.migrate_legacy_registry(self.client, self.keys, self.clock.now())
        if migrated:
            log.info("moved %d in-flight list(s) from the version 0.1 registry", migrated)
        self.claim_when_free(wait_for_id)
        try:
            drained = self.startup_drain()
        except redis.ResponseError as exc:
            if not is_oom(exc):
                raise
            # Nothing is lost by going on: what the drain did not move sits in lists of an
            # earlier incarnation of our id, which is not live, so the periodic sweep (the first
            # runs at once) drains them once memory frees.
            log.warning(
                "startup drain refused: Redis is out of memory (%s); the periodic sweep "
                "requeues this id's earlier in-flight lists once memory frees",
                exc,
            )
            drained = {}
        if drained:
            log.info(
                "startup drain requeued %d task(s) from %s",
                sum(drained.values()),
                ", ".join(drained),
            )
        return version

    def _banner(self, version: str) -> None:
        """The start banner: what this process serves, as whom, and where: the URL it was given
        (no password) and, on a cluster, the node that serves the queue's slot (the one its
        workers talk to, whichever node the URL names)."""
        fields: dict[str, object] = {
            "queue": self.keys.queue_name,
            "server_id": self.server_id,
            "incarnation": self.incarnation,
            "workers": self.worker_count,
            "prefetch": self.settings.prefetch,
            "redis_version": version,
            "redis_url": client_url(self.client),
            "shutdown_grace": self.settings.shutdown_grace,
        }
        where = str(fields["redis_url"])
        if is_cluster(self.client):
            slot, node = slot_owner(self.client, self.keys.queue)
            fields.update(cluster_slot=slot, slot_node=node)
            where += f" (Redis Cluster: the queue's slot {slot} is served by {node})"
        log.info(
            "started: queue %s, server id %s, incarnation %s, %d worker(s), prefetch %d, "
            "Redis %s at %s, shutdown grace %gs",
            self.keys.queue_name,
            self.server_id,
            self.incarnation,
            self.worker_count,
            self.settings.prefetch,
            version,
            where,
            self.settings.shutdown_grace,
            extra=fields,
        )

    def run(
        self, until_idle: bool = False, install_signals: bool = False, wait_for_id: float = 0.0
    ) -> None:
        """Run until stopped (SIGTERM/SIGINT with `install_signals`, or `stop_event`).

        The signal handlers come first: a SIGTERM while we wait for the id (`wait_for_id`) or
        drain our debris is a graceful stop, not the default action's death."""
        if install_signals:
            self._install_signal_handlers()
        try:
            workers = self.start(wait_for_id)
        except StoppedBeforeStart as exc:
            log.info("%s: exiting", exc)
            return
        threads = [
            threading.Thread(
                target=self._supervise,
                args=(w, until_idle),
                name=f"taskcustody-{w.owner.worker_id}",
                daemon=True,
            )
            for w in workers
        ]
        background = threading.Thread(
            target=self._background, name="taskcustody-heartbeat", daemon=True
        )
        background.start()
        for t in threads:
            t.start()
        try:
            if until_idle:
                for t in threads:
                    t.join()
                self.stop_event.set()
            else:
                self.stop_event.wait()
        finally:
            self.stop_event.set()
            self._shutdown(threads, workers)
            background.join(timeout=self.settings.socket_timeout + 1)

    def stop(self) -> None:
        self.stop_event.set()

    def on_signal(self, signum: int) -> None:
        """SIGTERM/SIGINT: the first stops us (gracefully), a second exits at once."""
        if self.stop_event.is_set():
            # A second signal: exit at once, as a crash would. The tasks being run stay in
            # custody (in our in-flight lists) and are recovered once our lease lapses.
            log.warning(
                "signal %d again: exiting now; the tasks in flight stay in custody "
                "and are recovered as after a crash",
                signum,
            )
            for handler in logging.getLogger().handlers:
                handler.flush()
            self.force_exit(128 + signum)
            return
        log.info(
            "signal %d: stop taking, finish current tasks within %gs (a second signal "
            "exits at once)",
            signum,
            self.settings.shutdown_grace,
        )
        self.stop_event.set()

    def _install_signal_handlers(self) -> None:
        def handle(signum: int, frame: FrameType | None) -> None:
            self.on_signal(signum)

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def _supervise(self, worker: Worker | PrefetchingWorker, until_idle: bool) -> None:
        """Run a worker; if it dies of an unexpected error, start it again (it reconciles its own
        list first, being dirty)."""
        while not self.stop_event.is_set():
            try:
                worker.run(self.stop_event, until_idle=until_idle)
                return
            except Exception:
                log.exception("worker %s crashed; restarting it", worker.list_key)
                worker.dirty = True
                self.stop_event.wait(1.0)

    def _background(self) -> None:
        next_sweep = 0.0
        waited = 0.0
        while not self.stop_event.is_set():
            try:
                self.heartbeat()
                self.promote_due()
                if waited >= next_sweep:
                    report = self.periodic_sweep()
                    if report is not None and (
                        report.pruned or report.moved or report.requeued_stuck
                    ):
                        log.info(
                            "sweep: pruned %s, moved %d, requeued stuck %d",
                            report.pruned,
                            report.moved,
                            report.requeued_stuck,
                        )
                    next_sweep = waited + self.settings.sweep_interval
            except Superseded:
                log.error("server id %s superseded; stopping", self.server_id)
                return
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("heartbeat/sweep failed: %s", exc)
            except (
                redis.ResponseError,
                redis.exceptions.ClusterError,
                redis.exceptions.RedisClusterException,
            ) as exc:
                if redirect_kind(exc) is not None:
                    # A cluster failing over or resharding (the command did not run; the
                    # cluster client re-reads its slot map): the next beat tries again.
                    log.warning("heartbeat/sweep redirected: %s", exc)
                    self.stop_event.wait(self.settings.heartbeat_interval)
                    waited += self.settings.heartbeat_interval
                    continue
                if not is_oom(exc):
                    raise
                assert isinstance(exc, redis.ResponseError)
                # HEARTBEAT's HSET is refused while memory is full: a spell longer than
                # server_ttl gets us pruned by another server's sweep, and the next heartbeat
                # that works registers us again (or finds us superseded).
                self.oom.refused(exc)
            else:
                self.oom.recovered()
            self.stop_event.wait(self.settings.heartbeat_interval)
            waited += self.settings.heartbeat_interval

    def _shutdown(
        self, threads: list[threading.Thread], workers: list[Worker | PrefetchingWorker]
    ) -> None:
        per_thread = self.settings.shutdown_grace / max(1, len(threads))
        for t in threads:
            t.join(timeout=per_thread)
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck:
            log.warning(
                "grace period over with tasks still running in %s; their tasks stay in "
                "custody and are recovered once we are deregistered",
                stuck,
            )
        try:
            if not self.superseded:
                self.deregister()
            if self.incarnation is not None:
                self.sweep_lease.release()  # the next sweeper need not wait for it to lapse
            for worker, thread in zip(workers, threads, strict=True):
                if not thread.is_alive():
                    for list_key in worker.list_keys:
                        self.client.eval(
                            scripts.FORGET_EMPTY_LIST, 2, list_key, self.keys.inflight_registry
                        )
                    worker.close()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("could not deregister cleanly: %s", exc)
        except redis.ResponseError as exc:
            if not is_oom(exc):
                raise
            log.warning("could not deregister cleanly: %s", exc)
