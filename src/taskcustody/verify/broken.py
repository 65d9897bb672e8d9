"""DEMONSTRATIONS ONLY: the broken designs of `docs/protocol.md` (section 7), as subclasses of
Server and Worker.

Never use these classes: each one is a plausible change that breaks a property of the protocol.
They exist to show what goes wrong (`taskcustody verify --variant NAME` prints the counterexample)
and to prove the checker's power: the conformance machine must fail on every one of them, with a
short counterexample (`tests/stateful/test_finds_broken_designs.py`).

Which class demonstrates which design is said by the designs table (`designs.DESIGNS`); `BROKEN`
is built from it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import redis

from ..core import recovery, scripts
from ..core.clock import Clock
from ..core.envelope import Task, decode
from ..core.keys import QueueKeys
from ..core.outcome import Release
from ..core.recovery import RecoveryReport
from ..core.server import Server
from ..core.settings import Settings
from ..core.worker import Worker
from .designs import DESIGNS, design


class BlpopTakeWorker(Worker):
    """1. The old design: BRPOP takes the task out of Redis into the worker's hands and the
    processing record is written afterwards. A lost reply destroys the task."""

    def _take_from_queue(self, block: float) -> Task | None:
        # (the take from the queue, whichever way it is called: `take`, `take_from_queue`)
        try:
            reply = self._call("BRPOP", self.keys.queue, block)
        except (redis.ConnectionError, redis.TimeoutError):
            self.dirty = True
            raise
        return None if reply is None else decode(reply[1])

    def release(self, task: Task, outcome: Any) -> Release:
        self._call(
            "EVAL",
            _COMMIT_WITHOUT_CUSTODY,
            3,
            self.keys.processing,
            self.keys.committed,
            self.keys.commit_log,
            task.id,
        )
        return Release(True, 0, "committed")

    def release_and_take(self, task: Task, outcome: Any) -> tuple[Release, Task | None]:
        return self.release(task, outcome), None  # (this design takes only with BRPOP)


_COMMIT_WITHOUT_CUSTODY = """
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('INCR', KEYS[2])
redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
return 1
"""


class NoReleaseWorker(Worker):
    """2. The release forgets the LREM: the task stays in custody after it committed, and the
    next drain of the list runs it again."""

    def _send_release(self, args: tuple[Any, ...], script: scripts.Script) -> Any:
        # (RELEASE and RELEASE_AND_TAKE share the release's text)
        source = script.source.replace(
            "local held = redis.call('LREM', own, 1, raw)", "local held = 1"
        )
        return self._call("EVAL", source, *args)


def _collect_garbage(server: Server) -> list[str]:
    """The sweep's garbage collection of the registry, as the real sweep does it after its prune
    (a demonstration changes one thing, not this)."""
    client, keys = server.client, server.keys
    return recovery.forget_dead_empty_lists(
        client,
        keys,
        recovery.registrations(client, keys),
        recovery.live_owners(client, keys),
        server.identity,
        server.clock.now() - server.settings.registry_grace,
    )


class _DemoServer(Server):
    worker_class: type[Worker] = Worker

    def make_worker(self, index: int) -> Worker:
        from ..core.keys import ListOwner

        owner = ListOwner(self.server_id, self.identity.incarnation, f"w{index}")
        worker = self.worker_class(
            self.client, self.keys, owner, self.handler, self.clock, self.settings
        )
        worker.suspects = self.suspect_slot
        return worker


class BlpopTakeServer(_DemoServer):
    worker_class = BlpopTakeWorker


class NoReleaseServer(_DemoServer):
    worker_class = NoReleaseWorker


class SweepDrainsLiveServer(Server):
    """3. The periodic sweep drains every list, its own and live servers' included
    (`include_self` wrong one way, and no liveness check): a live worker's task goes back to the
    queue while it executes it."""

    def sweep(self) -> RecoveryReport:
        report = RecoveryReport()
        report.pruned = recovery.prune_inactive_servers(self.client, self.keys, self.clock.now())
        report.forgotten_lists = _collect_garbage(self)
        for key in recovery.registered_lists(self.client, self.keys):
            moved = recovery.drain_inflight(
                self.client,
                self.keys,
                key,
                force=True,
                chunk=self.settings.drain_chunk,
                recovering=self.recovering(),
            )
            if moved:
                report.drained_lists[key] = moved
        report.requeued_stuck, report.stale_records = self.requeue_stuck_processing_tasks()
        return report


class StartupSkipsOwnServer(Server):
    """4. The startup drain skips the own id's lists (`include_self` wrong the other way): debris
    of the previous run of this id is not recovered when the server starts."""

    def startup_drain(self) -> dict[str, int]:
        return {}


_REQUEUE_KEEPING_CUSTODY = scripts.REQUEUE_STUCK.replace(
    "    redis.call('LREM', holder_list, 1, raw)\n", ""
)


class ProcessingSweepNoCustodyServer(Server):
    """5. The processing sweep requeues a stuck task without removing it from its holder's list:
    the task is queued and in custody at once, and a drain queues it a second time."""

    def requeue_stuck_processing_tasks(self) -> tuple[int, int]:
        with _swapped(scripts, "REQUEUE_STUCK", _REQUEUE_KEEPING_CUSTODY):
            return super().requeue_stuck_processing_tasks()


def _unbounded_drain(
    client: redis.Redis,
    keys: QueueKeys,
    list_key: str,
    *,
    force: bool,
    chunk: int = 100,
    length: int | None = None,
    recovering: recovery.Recovering = recovery.NOT_COUNTING,
) -> int:
    """6. Drains until the list is empty, whatever length was read up front: no end while
    something keeps appending."""
    owner = keys.owner_of(list_key)
    moved = 0
    while int(client.llen(list_key)) > 0:
        step = int(
            client.eval(
                scripts.DRAIN_CHUNK,
                8,
                list_key,
                keys.queue,
                keys.processing,
                keys.servers,
                keys.incarnations,
                keys.recoveries,
                keys.dead_letters,
                keys.suspects,
                chunk,
                owner.server_id,
                owner.incarnation,
                "force" if force else "dead-only",
                *recovering.argv(),
            )[0]
        )
        if step <= 0:
            break
        moved += step
        # The same verification hook as the real drain's: a stalled worker may append here.
        if recovery.between_drain_chunks is not None:
            recovery.between_drain_chunks(list_key)
    return moved


@contextlib.contextmanager
def _swapped(module: Any, name: str, replacement: Any) -> Iterator[None]:
    """Run the real code with one piece swapped (demonstrations only; not thread-safe)."""
    original = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, original)


class UnboundedDrainServer(Server):
    """6. A drain that loops until the list is empty (see `_unbounded_drain`)."""

    def sweep(self) -> RecoveryReport:
        with _swapped(recovery, "drain_inflight", _unbounded_drain):
            return super().sweep()

    def startup_drain(self) -> dict[str, int]:
        with _swapped(recovery, "drain_inflight", _unbounded_drain):
            return super().startup_drain()


class RegisterOnceWorker(Worker):
    """8. The old design's take: the list was registered once, when the process started, and a
    take does not register it again."""

    def registration(self) -> tuple[Any, ...] | None:
        return None


class RegisterOnceServer(_DemoServer):
    """8. ... and a heartbeat that finds its registration gone registers only the server, not
    its lists: after Redis lost its data, or a sweep forgot a list, takes fill lists that
    recovery cannot find."""

    worker_class = RegisterOnceWorker

    def list_keys(self, incarnation: int | None = None) -> list[str]:
        if incarnation is None:  # the heartbeat's lists: none
            return []
        return super().list_keys(incarnation)  # the claim's: registered once, as before


class GcWhenEmptyServer(Server):
    """9. The registry's garbage collection forgets a dead list as soon as it is empty, however
    young its registration (no grace): a take sent before the owner was judged dead can still
    fill it. The step-driven stateful run cannot show this one: its takes never wait on an empty
    queue (its grace is 0 already, see `harness.VERIFY_SETTINGS`); the model check finds it, and
    the loop-driven runs (registrations that age, a grace of one tick: the worker's loop's, the
    prefetching loop's and the server loop's machines) catch the same bug in the real
    implementation (the named mutant `gc-when-empty`; tests/stateful/test_registration_ages.py
    and test_production_loops.py drive this class through them)."""

    def sweep(self) -> RecoveryReport:
        """The server's own sweep, its grace 0 (what it does after the pass is the real one's:
        poison-pill counting, the suspects' hint)."""
        settings = self.settings
        self.settings = dataclasses.replace(settings, registry_grace=0.0)
        try:
            return super().sweep()
        finally:
            self.settings = settings


class RecoveriesNotCountedServer(Server):
    """10. Recovery never counts what it takes back from a dead holder: a task that kills every
    process that runs it is recovered, and run again, for ever."""

    def __init__(self, *args: Any, settings: Settings, **kwargs: Any) -> None:
        super().__init__(
            *args, settings=dataclasses.replace(settings, max_recoveries=None), **kwargs
        )


_DRAIN_TO_QUEUE = scripts.DRAIN_CHUNK.replace(
    "    redis.call('LMOVE', inflight, suspects, 'RIGHT', 'LEFT')\n",
    "    redis.call('LMOVE', inflight, queue, 'RIGHT', 'RIGHT')\n",
)
_REQUEUE_TO_QUEUE = scripts.REQUEUE_STUCK.replace(
    "      redis.call('LPUSH', suspects, raw)\n", "      redis.call('RPUSH', queue, raw)\n"
)
# That both replacements hit their line is checked by tests/test_named_mutant_anchors.py, not by
# an assert here: a named mutant of the same lines would make this module fail to import, which
# the mutation gate rightly refuses to count as a kill.


class RecoveredToQueueWorker(Worker):
    """12. A reconcile puts what it counts back on the queue, like the drains below."""

    def reconcile(self) -> int:
        with _swapped(scripts, "DRAIN_CHUNK", _DRAIN_TO_QUEUE):
            return super().reconcile()


class RecoveredToQueueServer(_DemoServer):
    """12. Recovery puts a counted task back at the queue's take end (the design before
    suspects), beside the tasks that died with it: the next process takes them together again,
    and an innocent task shares every death of a poison pill."""

    worker_class = RecoveredToQueueWorker

    def startup_drain(self) -> dict[str, int]:
        with _swapped(scripts, "DRAIN_CHUNK", _DRAIN_TO_QUEUE):
            return super().startup_drain()

    def sweep(self) -> RecoveryReport:
        with (
            _swapped(scripts, "DRAIN_CHUNK", _DRAIN_TO_QUEUE),
            _swapped(scripts, "REQUEUE_STUCK", _REQUEUE_TO_QUEUE),
        ):
            return super().sweep()

    def requeue_stuck_processing_tasks(self) -> tuple[int, int]:
        with _swapped(scripts, "REQUEUE_STUCK", _REQUEUE_TO_QUEUE):
            return super().requeue_stuck_processing_tasks()


class DrainBeforePruneServer(Server):
    """7. The sweep drains before it prunes: a server that expired since the last pass is still
    registered when the drain looks, so its lists wait a whole period longer."""

    def sweep(self) -> RecoveryReport:
        report = RecoveryReport()
        report.drained_lists = recovery.recover_inflight(
            self.client,
            self.keys,
            self.identity,
            include_self=False,
            chunk=self.settings.drain_chunk,
            recovering=self.recovering(),
        )
        report.pruned = recovery.prune_inactive_servers(self.client, self.keys, self.clock.now())
        report.forgotten_lists = _collect_garbage(self)
        report.requeued_stuck, report.stale_records = self.requeue_stuck_processing_tasks()
        return report


class PromoteCopiesServer(Server):
    """13. The promotion of a due retry LPUSHes it on the queue without the ZREM: the member
    stays scheduled, so the task is in two places and the next promotion runs it again."""

    def promote_due(self, now: float | None = None) -> int:
        script = scripts.PROMOTE.replace(
            "  if redis.call('ZREM', scheduled, raw) == 1 then\n", "  if true then\n"
        )
        assert script != scripts.PROMOTE
        keys = self.keys
        moved = self.client.eval(
            script,
            4,
            keys.scheduled,
            keys.queue,
            keys.suspects,
            keys.recoveries,
            repr(self.clock.now() if now is None else now),
            100,
        )
        return int(moved)


class CompositePopsNextWorker(Worker):
    """14. The composite step takes the next task out of the queue into its reply (RPOP), not
    into the in-flight list: one round trip per task like the real step, but the task it took has
    no custody. A lost reply loses it, as in design 1."""

    def _send_release(self, args: tuple[Any, ...], script: scripts.Script) -> Any:
        if script != scripts.RELEASE_AND_TAKE_SCRIPT:
            return super()._send_release(args, script)
        source = scripts.RELEASE_AND_TAKE.replace(
            "local taken = redis.call('LMOVE', source, own, 'RIGHT', 'LEFT')",
            "local taken = redis.call('RPOP', source)",
        )
        source = source.replace("  redis.call('HSET', processing, id, record)\n", "")
        return self._call("EVAL", source, *args)


class CompositeCommitsUnheldWorker(Worker):
    """15. The composite step's release commits whether or not the task was still in the own
    list: a worker judged dead (stalled) commits a task that recovery already put back."""

    def _send_release(self, args: tuple[Any, ...], script: scripts.Script) -> Any:
        if script != scripts.RELEASE_AND_TAKE_SCRIPT:
            return super()._send_release(args, script)
        return self._call("EVAL", script.source.replace("if held == 1 then", "if true then"), *args)


class CompositePopsNextServer(_DemoServer):
    worker_class = CompositePopsNextWorker


class CompositeCommitsUnheldServer(_DemoServer):
    worker_class = CompositeCommitsUnheldWorker


def _demonstrations() -> dict[str, type[Server]]:
    """Each design's demonstration, by the class name the table gives (`designs.DESIGNS`); a
    name the table gives that is not a class here fails the import."""
    classes = globals()
    return {d.name: classes[d.demo] for d in DESIGNS if d.demo is not None}


BROKEN: dict[str, type[Server]] = _demonstrations()


def server_factory(name: str) -> Callable[..., Server]:
    """A harness server factory building the named broken design's demonstration (the real
    server for "correct", and for a design with none: `designs.Design.no_demo`)."""
    cls: type[Server] = Server if name == "correct" else BROKEN.get(design(name).name, Server)

    def make(
        client: redis.Redis,
        keys: QueueKeys,
        server_id: str,
        *,
        settings: Settings,
        clock: Clock,
        workers: int,
    ) -> Server:
        return cls(
            client,
            keys,
            server_id,
            lambda payload: payload,
            workers=workers,
            settings=settings,
            clock=clock,
        )

    return make
