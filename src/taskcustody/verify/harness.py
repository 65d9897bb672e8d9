"""The conformance machine's core: the model drives the real implementation, step by step.

One `Harness` holds a model state (`taskcustody_model`) and a real deployment (servers and workers
of `taskcustody`, on one Redis, all on one `ManualClock`). `step(action)` takes an action the
model enables, performs it on the implementation through the public steps its production loop
calls (`Server.claim/startup_drain/heartbeat/sweep/requeue_stuck_processing_tasks/make_worker`,
`Worker.register/reconcile/take/record/execute/release`), and lets the model predict its effect.
`check()` then reads the real Redis state back, maps it to the model's terms and compares: the
model predicts, it never copies what the implementation returned.

Granularity. Model actions are single Redis commands; some implementation steps are several
commands (`sweep` = prune, then drains, then the processing sweep; `startup_drain` and
`reconcile` = drains). Such a step runs to completion inside one harness step, and the model
takes the same walk (`sweep` and then every `drain_step` of the pass, then the processing sweep).
A dropped reply can hit any command of such a step: the model is told which one (the k-th move of
a drain).

Inside a pass, one interleaving is the harness's too: between two moves of a drain, the owner of
the list being drained (a worker of a stalled process, still running though judged dead) may take,
record or release (`step(..., interleave=...)`; at most `MAX_STEPS_DURING_A_PASS`). A take then
appends to the list while it is drained: a drain bounded by the length read up front ends, one that
loops until the list is empty (design 6) does not. The model walks the same interleaving (its
`drain_step`s with the worker's actions between them) and predicts the outcome; the implementation
gets the worker's steps from `recovery.between_drain_chunks`, which its drain calls after every
chunk. Every other interleaving inside a pass is the model checker's job (it explores all of them).

Faults. A dropped reply is armed in `faults.FaultInjector` for the command the model names, on
the connection that sends it; Redis really executes it. A worker crash drops the `Worker` object
and closes its connection (an unread deferred reply is discarded); no `finally` runs. A server
crash crashes its workers and stops its heartbeat. Stall and resume are the model's: the harness
stops calling that process's heartbeat and sweeps while its workers go on. Time moves by
`ManualClock.advance`, one model tick at a time.

The mapping. Model tasks `0..n-1` are task ids `t0..`; model server `s` is server id `s<s>`; model
incarnations are renamed real ones (the model reuses the smallest free number, Redis counts up:
the harness keeps the renaming, fixed at each claim). Registrations map to relative deadlines in
ticks. Worker phases come from the implementation's own flags (`Worker.dirty`, `Server.superseded`)
and from what its steps returned.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from taskcustody_model import protocol as _model_protocol
from taskcustody_model import state as _model_state
from taskcustody_model.invariants import check_invariants, check_transition, is_done
from taskcustody_model.protocol import Action, Config, apply, enabled_actions
from taskcustody_model.state import (
    CLAIMED,
    CRASHED,
    DIRTY,
    ENQUEUED,
    IDLE,
    POISONED,
    RECORDED,
    RUNNING,
    STOPPED,
    SUPERSEDED,
    TAKEN,
    TTL,
    WAITING,
    WIPED,
    Bounds,
    ListKey,
    Process,
    Registration,
    State,
    initial_state,
    list_of,
)
from taskcustody_model.state import (
    Worker as ModelWorker,
)
from taskcustody_model.variants import variant as model_variant

from .. import cluster, recovery, scheduled, scripts
from ..clock import ManualClock
from ..envelope import Task
from ..errors import ServerIdHeld, Superseded
from ..keys import ListOwner, QueueKeys
from ..producer import Producer
from ..recovery import parse_record
from ..server import Server
from ..settings import Settings
from ..worker import Outcome, Worker
from . import faults

#: Older model versions had a separate `execute` step (phase EXECUTED); newer ones execute inside
#: `release`. The harness follows whichever the model has.
EXECUTED: int | None = getattr(_model_state, "EXECUTED", None)

#: One model tick of the clock, in seconds. Server TTL = the model's TTL in ticks.
TICK = 5.0

#: Settings whose timing matches the model: deadlines are whole ticks, a drain moves one task per
#: command (the model's `drain_step`), takes on an empty queue return after 50 ms.
VERIFY_SETTINGS = Settings(
    block_timeout=0.05, socket_timeout_margin=2.0, heartbeat_interval=TICK * 0.8,
    server_ttl=TICK * TTL, sweep_interval=TICK, max_attempts=3, drain_chunk=1,
    track_commits=True, registry_grace=0,
)


#: The worker steps that may run between two moves of a drain (by the owner of the list being
#: drained), and how many of them one pass may contain. The bound is what makes a broken drain
#: that loops until the list is empty end in the harness: once the planned steps are spent nothing
#: appends any more, the real drain empties the list, and the model (whose drain stops at the
#: length it read up front) disagrees.
STEPS_DURING_A_DRAIN = ("take", "record", "release")
MAX_STEPS_DURING_A_PASS = 3

#: Chooses one of the worker steps the model enables between two moves of a drain, or None to let
#: the drain go on (the stateful machine draws it, so that it shrinks).
Interleave = Callable[[list[Action]], Action | None]


def _with_proc(state: State, s: int, i: int, proc: Process) -> State:
    procs = state.processes[s]
    new = (*procs[:i], proc, *procs[i + 1:])
    return state._replace(processes=(*state.processes[:s], new, *state.processes[s + 1:]))


class Mismatch(AssertionError):
    """The real state and the model's prediction differ, or a property failed."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


ServerFactory = Callable[..., Server]


def default_server(client: redis.Redis, keys: QueueKeys, server_id: str, *, settings: Settings,
                   clock: ManualClock, workers: int) -> Server:
    return Server(client, keys, server_id, lambda payload: payload, workers=workers,
                  settings=settings, clock=clock)


@dataclass
class WorkerSlot:
    """The harness's view of one worker of one process: the Worker object and where it is in
    its cycle (what its steps returned)."""

    worker: Worker | None
    task: Task | None = None
    stage: int = IDLE  # TAKEN/RECORDED/EXECUTED while holding
    outcome: Outcome | None = None
    crashed: bool = False
    stopped: bool = False

    def phase(self) -> int:
        if self.crashed:
            return CRASHED
        if self.stopped:
            return STOPPED
        if self.task is not None:
            return self.stage
        assert self.worker is not None
        return DIRTY if self.worker.dirty else IDLE


@dataclass
class ProcSlot:
    server: Server
    client: redis.Redis
    label: str
    real_inc: int
    model_inc: int
    phase: int = CLAIMED
    stalled: bool = False
    workers: list[WorkerSlot] = field(default_factory=list)


@dataclass
class StepRecord:
    """One step of a run, for reports: the action and who/what it touched."""

    index: int
    action: Action
    text: str
    fault: bool
    #: who acted, for sequence diagrams: "s0#1 w0" (server 0, model incarnation 1, worker 0),
    #: "s0#1" (that server process), "s0" (a claim of id s0) or "" (the clock)
    actor: str = ""
    #: the states after the step, the model's and Redis's read back in the model's terms, as the
    #: check after it saw them (None: no check ran after this step, e.g. a step inside a pass)
    model: State | None = None
    real: State | None = None
    #: a step of `Harness.recover` (faults have stopped), not one the machine chose
    recovery: bool = False


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


class Harness:
    def __init__(
        self,
        make_client: Callable[[], redis.Redis],
        bounds: Bounds | None = None,
        *,
        server_factory: ServerFactory = default_server,
        settings: Settings = VERIFY_SETTINGS,
        keys: QueueKeys | None = None,
        real_redis: bool = False,
        flush_scripts: bool = True,
    ) -> None:
        self.bounds = bounds or Bounds(tasks=3, servers=2, workers=2, faults=3)
        # A Redis wipe flushes the script cache too, unless the server is somebody else's
        # (`verify --redis-url`): there it only deletes this run's keys.
        self.flush_scripts = flush_scripts
        # The model drains per move (`drain_step`), whatever its default: `_pass` walks a pass
        # move by move, to drop the k-th move's reply and to interleave worker steps between
        # moves. Between two harness steps no pass is in progress, so nothing else changes.
        self.config = Config(self.bounds._replace(drain_steps=True), model_variant("correct"))
        self.make_client = make_client
        self.server_factory = server_factory
        # Poison-pill detection as the model's bounds have it.
        self.settings = dataclasses.replace(settings, max_recoveries=self.bounds.max_recoveries)
        if getattr(self.bounds, "handler_failures", False):
            # A failed handler's retry waits in the scheduled set (the model's `retry`), and the
            # model has no attempt limit: every failure is a fault, so the budget bounds them.
            self.settings = dataclasses.replace(
                self.settings, retry_backoff=TICK, retry_backoff_max=8 * TICK,
                max_attempts=self.bounds.faults + 2)
        self.keys = keys or QueueKeys("verify", prefix="tcv")
        self.real_redis = real_redis
        self.clock = ManualClock(start=1_000.0)
        self.injector = faults.FaultInjector()
        self.admin = make_client()  # reads state back; never faulted
        self.state: State = initial_state(self.bounds)
        self.procs: list[list[ProcSlot]] = [[] for _ in range(self.bounds.servers)]
        # real incarnation -> model incarnation, per server
        self.names: list[dict[int, int]] = [{} for _ in range(self.bounds.servers)]
        self.steps: list[StepRecord] = []
        self.counts: Counter[str] = Counter()  # faults by kind, and other events
        self.enqueued = 0
        self.recovered = 0  # tasks moved back to the queue by recovery (model-counted)
        self.steps_during_drains = 0  # worker steps interleaved between the moves of a drain
        self.seconds = 0.0
        self.recovering = False  # in `recover`: its steps are marked so in the step records
        # Ghost records, kept outside Redis (a wipe cannot touch them): per task, enqueued /
        # waiting / wiped, and the commits read back before each wipe.
        self.status = list(self.state.status)
        self.commits_before_wipes: Counter[int] = Counter()
        self.scripts_flushed = False

    # -- naming --------------------------------------------------------------------------------

    def server_id(self, s: int) -> str:
        return f"s{s}"

    @staticmethod
    def task_id(t: int) -> str:
        return f"t{t}"

    @staticmethod
    def task_index(task_id: str) -> int:
        return int(task_id[1:])

    def list_key(self, key: tuple[str, int, str]) -> ListKey:
        sid, real_inc, wid = key
        s = int(sid[1:])
        model_inc = self.names[s].get(real_inc)
        if model_inc is None:
            raise Mismatch("mapping", f"in-flight list of unknown incarnation {key}")
        return (s, model_inc, int(wid[1:]))

    # -- setup ---------------------------------------------------------------------------------

    def setup(self) -> None:
        """The model's initial state, made real: every task enqueued (t0 first, so it is taken
        first), every server claimed, startup-drained, its workers registered and reconciled."""
        self.wipe()
        # Workers release with EVALSHA and fall back to EVAL on NOSCRIPT. Load the scripts up
        # front, so that a dropped release reply is always the reply of a release that ran.
        self._load_release_scripts()
        for t, status in enumerate(self.status):
            if status == ENQUEUED:
                self._enqueue(t)
        for s in range(self.bounds.servers):
            slot = self._claim(s, expect_model_inc=0)
            slot.server.startup_drain()
            self._start_workers(slot)
        self.check()

    def _load_release_scripts(self) -> None:
        self.admin.script_load(scripts.RELEASE)
        self.admin.script_load(scripts.RELEASE_AND_TAKE)

    def _enqueue(self, t: int) -> None:
        Producer(self.admin, self.keys, self.clock).enqueue({"n": t}, task_id=self.task_id(t))
        self.status[t] = ENQUEUED
        self.enqueued += 1

    def wipe(self) -> None:
        """Delete this run's keys, nothing else (with `--redis-url` the server is the user's)."""
        found = self._keys_starting(self.keys.base + ":")
        if found:
            self.admin.delete(*found)

    def _keys_starting(self, prefix: str) -> list[bytes]:
        """This run's keys that start with `prefix` (all in one slot: on a cluster node they are
        listed with CLUSTER GETKEYSINSLOT, never KEYS or SCAN; see cluster.tag_keys)."""
        return cluster.tag_keys(self.admin, self.keys.queue, prefix)

    def _new_client(self, label: str) -> redis.Redis:
        client = self.make_client()
        faults.install(client, self.injector, label)
        return client

    def _claim(self, s: int, expect_model_inc: int) -> ProcSlot:
        label = f"{self.server_id(s)}#{len(self.steps)}"
        client = self._new_client(label)
        server = self.server_factory(client, self.keys, self.server_id(s), settings=self.settings,
                                     clock=self.clock, workers=self.bounds.workers)
        try:
            real_inc = server.claim()
        except BaseException:
            client.close()
            raise
        self._name(s, real_inc, expect_model_inc)
        slot = ProcSlot(server, client, label, real_inc, expect_model_inc)
        self.procs[s].append(slot)
        return slot

    def _name(self, s: int, real_inc: int, model_inc: int) -> None:
        for r, m in list(self.names[s].items()):
            if m == model_inc and r != real_inc:
                del self.names[s][r]  # the model reuses a number nothing mentions any more
        self.names[s][real_inc] = model_inc

    def _start_workers(self, slot: ProcSlot) -> None:
        """What `Server.start` and `Worker.run` do before the first take: make each worker,
        register its list, reconcile (a new worker is dirty; its list is new and empty)."""
        slot.workers = []
        for w in range(self.bounds.workers):
            worker = slot.server.make_worker(w)
            worker.register()
            worker.reconcile()
            slot.workers.append(WorkerSlot(worker))
        slot.phase = RUNNING

    # -- stepping ------------------------------------------------------------------------------

    def enabled(self) -> list[Action]:
        """The model's enabled actions, minus the mid-pass ones (`drain_step`: passes run whole
        inside one step; its dropped reply is chosen with the pass, see `step`)."""
        return [a for a in enabled_actions(self.state, self.config)
                if a.name not in ("drain_step", "arm") and a.command != "drain_step"]

    def _model(self, action: Action) -> None:
        before = self.state
        after = apply(before, action, self.config)
        # The model's step properties take (before, action, config) -- or, in older versions,
        # (before, action, after).
        step_check: Any = check_transition
        if "config" in inspect.signature(step_check).parameters:
            bad = step_check(before, action, self.config)
        else:
            bad = step_check(before, action, after)
        if bad is not None:
            raise Mismatch(f"model:{bad[0]}", bad[1])
        self.state = after

    def step(self, action: Action, *, drop_at: int = 0, variant: int = 0,
             interleave: Interleave | None = None) -> None:
        """Perform `action` on both sides. `drop_at` k > 0 with `sweep`/`startup_drain`: the reply
        of the pass's k-th move is lost (if the pass makes that many). `variant` picks among
        equivalent ways to inject a fault (which command of a release loses its reply).
        `interleave`, with `sweep`/`startup_drain`: after each move of a drain, offered the worker
        steps the list's owner may take then (see the module doc); None lets the drain go on."""
        started = time.perf_counter()
        self.steps.append(StepRecord(len(self.steps) + 1, action, self.describe(action),
                                     action.is_fault, actor_of(action, self.state),
                                     recovery=self.recovering))
        try:
            self._step(action, drop_at, variant, interleave)
        finally:
            self.seconds += time.perf_counter() - started

    def describe(self, action: Action) -> str:
        from taskcustody_model.trace import describe_action

        return describe_action(action, self.state)

    def _step(self, action: Action, drop_at: int, variant: int,
              interleave: Interleave | None = None) -> None:
        name = action.name
        s, i, w = action.server, action.proc, action.worker
        if action.is_fault:
            kind = f"dropped-reply:{action.command}" if name == "dropped_reply" else name
            self.counts[kind] += 1
        lost = name == "dropped_reply"
        command = action.command if lost else name

        if command in ("take", "take_suspect", "record", "execute", "release", "retry",
                       "release_and_take", "reconcile"):
            self._worker_step(action, command, lost, variant)
        elif name == "promote":
            self._promote(action)
        elif name == "crash_worker":
            self._crash_worker(self.procs[s][i].workers[w])
            self._model(action)
        elif name == "restart_worker":
            slot = self.procs[s][i]
            worker = slot.server.make_worker(w)
            worker.register()
            slot.workers[w] = WorkerSlot(worker)
            self._model(action)
        elif name == "crash_server":
            slot = self.procs[s][i]
            for ws in slot.workers:
                self._crash_worker(ws)
            slot.client.close()
            del self.procs[s][i]
            self._model(action)
        elif name == "stall_server":
            self.procs[s][i].stalled = True
            self._model(action)
        elif name == "resume_server":
            self.procs[s][i].stalled = False
            self._model(action)
        elif name == "advance_clock":
            self._advance_clock(action)
        elif name == "enqueue":
            self._enqueue(self.status.index(WAITING))
            self._model(action)
        elif name == "redis_wipe":
            self._redis_wipe()
            self._model(action)
        elif command == "heartbeat":
            self._heartbeat(action, variant)
        elif command == "claim":
            self._claim_step(action, lost)
        elif command in ("startup_drain", "sweep"):
            self._pass(action, command, lost, drop_at, interleave)
        elif command == "requeue_stuck_processing_tasks":
            queue_before = self.state.queue, self.state.suspects
            self.procs[s][i].server.requeue_stuck_processing_tasks()
            self._model(action)
            self._adopt_recovery_order(queue_before)  # the order is not the protocol's to fix
        else:
            raise ValueError(f"the harness cannot perform {action!r}")
        self._settle()

    def _advance_clock(self, action: Action) -> None:
        """One tick. Healthy processes (not stalled, not superseded, holding their id's
        registration) heartbeat far more often than the TTL; the model folds those renewals into
        the tick (if its version does: `_renewed`), so the harness heartbeats them right after
        the clock moves."""
        renewed = getattr(_model_protocol, "_renewed", None)
        beating = []
        if renewed is not None:
            for s, slots in enumerate(self.procs):
                reg = self.state.registry[s]
                for slot in slots:
                    # (a renewal keeps the deadline where it is: a lapsed registration is
                    # renewed only by the model's own `heartbeat` action)
                    if reg is not None and reg.deadline == TTL \
                            and renewed(self.state, s, reg.inc) \
                            and slot.model_inc == reg.inc and not slot.stalled \
                            and not slot.server.superseded:
                        beating.append(slot)
        self.clock.advance(TICK)
        for slot in beating:
            slot.server.heartbeat()
        self._model(action)

    def _redis_wipe(self) -> None:
        """Redis restarts empty. On the Redis side: this run's keys deleted (all of Redis is
        ours on fakeredis and on a throwaway server), the script cache flushed, and every
        connection of the run closed. On the clients' side, what a broken connection does to
        each: the harness's workers wait between steps, not inside a command, so it applies the
        effect their next command would meet -- the worker is dirty (`Worker.take`/`release`
        mark it so on a connection error), its unread replies are gone, and a task in its hands
        is one Redis no longer has; a superseded process's workers stop."""
        commits = self._redis_commits()
        for t, n in commits.items():
            self.commits_before_wipes[t] += n
        for t, status in enumerate(self.observe().status):
            if status == POISONED:  # it ended before the wipe, in a dead letter
                self.status[t] = POISONED
        for t, status in enumerate(self.status):
            if status == ENQUEUED and self.commits_before_wipes[t] == 0:
                self.status[t] = WIPED
        self.wipe()
        if self.flush_scripts:
            self.admin.script_flush()
            self.scripts_flushed = True
        for procs in self.procs:
            for slot in procs:
                slot.client.connection_pool.disconnect()
                for ws in slot.workers:
                    if ws.worker is None or ws.crashed or ws.stopped:
                        continue
                    ws.worker.close()
                    ws.worker._unread_replies = 0
                    ws.worker.dirty = True
                    ws.task = ws.outcome = None
                    ws.stage = IDLE
                    if slot.server.superseded:
                        ws.stopped = True

    def _redis_commits(self) -> dict[int, int]:
        """Commits per task, as Redis's commit log has them now."""
        return {self.task_index(_text(k)): int(v)
                for k, v in self.admin.hgetall(self.keys.commit_log).items()}

    def _crash_worker(self, ws: WorkerSlot) -> None:
        if ws.worker is not None:
            ws.worker.close()  # whatever reply it had not read is gone with it
        ws.worker = None
        ws.task = None
        ws.crashed = True

    def _settle(self) -> None:
        """A superseded process exits once none of its workers holds a task."""
        for procs in self.procs:
            for slot in list(procs):
                if slot.server.superseded and all(
                    ws.crashed or ws.stopped for ws in slot.workers
                ):
                    slot.client.close()
                    procs.remove(slot)

    # -- worker steps: one step of `Worker.run_once`, in its order ----------------------------

    def _worker_step(self, action: Action, command: str, lost: bool, variant: int) -> None:
        try:
            self._real_worker_step(action, command, lost, variant)
        finally:
            self.injector.disarm_all()
        self._model(action)

    def _real_worker_step(self, action: Action, command: str, lost: bool, variant: int) -> None:
        """The implementation's side of a worker step (the caller steps the model)."""
        s, i, w = action.server, action.proc, action.worker
        slot = self.procs[s][i]
        ws = slot.workers[w]
        worker = ws.worker
        assert worker is not None
        conn = worker._conn
        if command == "take":
            # the model's take is the queue's; a suspect's take is a step of its own
            self._take(ws, command, lost, worker.take_command,
                       lambda: worker.take_from_queue(timeout=self.settings.block_timeout))
        elif command == "take_suspect":
            # The model enables it when the suspects list holds a task and the process's slot
            # is free: the worker's hint may still say none wait (it learns at its next release
            # or timed-out take); the step is the take the worker then makes.
            worker.suspects.maybe_waiting = True
            self._take(ws, command, lost, "EVALSHA", worker.take_suspect)
        elif command == "record":
            assert ws.task is not None
            worker.record(ws.task)
            ws.stage = RECORDED
            if self.real_redis or self.scripts_flushed:
                # The record's reply is read with the release's; read it now so that what we
                # read back next is not a race against our own socket, and so that a record
                # refused with NOSCRIPT (the script cache went with a wipe) is sent again as
                # EVAL now, not with the release.
                worker.flush()
        elif command == "execute":
            assert ws.task is not None
            ws.outcome = worker.execute(ws.task)
            assert EXECUTED is not None
            ws.stage = EXECUTED
        elif command in ("release", "retry"):
            assert ws.task is not None
            if command == "retry":  # the handler fails: the release's retry branch
                ws.outcome = Outcome(False, error="handler failed (injected by verify)")
            if ws.outcome is None:  # the model's release includes the handler's execution
                ws.outcome = worker.execute(ws.task)
            assert ws.outcome is not None
            if lost:
                # The release's reply, or the deferred record reply read just before it: either
                # way the script ran and the worker cannot know whether it committed.
                # (Both are EVALSHA: the record is a script too.) After a wipe flushed the script
                # cache, the scripts are loaded again first: a NOSCRIPT reply is of a release that
                # did not run, and losing it is no lost reply of the model's.
                if self.scripts_flushed:
                    self._load_release_scripts()
                unread = worker._unread_replies
                skip = 0 if variant % 2 and unread else unread
                self.injector.arm("EVALSHA", connection=conn, skip=skip)
            task, outcome = ws.task, ws.outcome
            ws.task = ws.outcome = None
            try:
                worker.release(task, outcome)
            except redis.ConnectionError:
                if not lost:
                    raise
            if slot.server.superseded:
                ws.stopped = True  # `Worker.run` checks the stop event before its next cycle
        elif command == "release_and_take":
            self._release_and_take(action, ws, lost, variant)
        elif command == "reconcile":
            if lost:
                # the reply of the last move of the drain (the model moves the whole list)
                n = len(self._model_list(s, slot.model_inc, w))
                self.injector.arm("EVAL", label=slot.label, skip=n - 1)
            try:
                worker.reconcile()
            except redis.ConnectionError:
                worker.dirty = True  # `Worker.run` marks the worker dirty on any Redis error
                if not lost:
                    raise

    def _release_and_take(self, action: Action, ws: WorkerSlot, lost: bool,
                          variant: int) -> None:
        """The composite step (`Worker.release_and_take`): the release of the task the worker
        holds and, in the same script, the take of the next one with its record. The model takes
        a waiting suspect when the process's slot is free (or the worker's own). The worker's hint
        (does a suspect wait?) is set to what the model knows, so that it asks for a suspect
        exactly then: a worker that asks takes the slot before it sends, and keeps it after a lost
        reply until its reconcile, as the model's take_suspect does."""
        worker = ws.worker
        assert worker is not None and ws.task is not None
        if ws.outcome is None:  # the model's release includes the handler's execution
            ws.outcome = worker.execute(ws.task)
        proc = self.state.processes[action.server][action.proc]
        key = (action.server, proc.inc, action.worker)
        debris = set(list_of(self.state, key)) - {proc.workers[action.worker].task}
        worker.suspects.maybe_waiting = (bool(self.state.suspects) and not debris
                                         and proc.suspect in (-1, action.worker))
        if lost:
            # the step's reply, or the deferred record reply read just before it (as a release)
            if self.scripts_flushed:
                self._load_release_scripts()
            unread = worker._unread_replies
            self.injector.arm("EVALSHA", connection=worker._conn,
                              skip=0 if variant % 2 and unread else unread)
        task, outcome = ws.task, ws.outcome
        ws.task = ws.outcome = None
        try:
            _, taken = worker.release_and_take(task, outcome)
        except redis.ConnectionError:
            if not lost:
                raise
            return
        if lost:
            raise Mismatch("fault", "the dropped release_and_take reply did not surface")
        if taken is None:
            raise Mismatch("release_and_take", "the model predicts a task; the step took none")
        ws.task, ws.stage = taken, RECORDED

    def _take(self, ws: WorkerSlot, command: str, lost: bool, armed: str,
              take: Callable[[], Task | None]) -> None:
        """One take by the real worker (`take`), with its reply dropped (`armed` is the command
        whose reply the injector drops on the worker's connection) when `lost`."""
        worker = ws.worker
        assert worker is not None
        if lost:
            self.injector.arm(armed, connection=worker._conn)
        try:
            task = take()
        except redis.ConnectionError:
            task = None
            if not lost:
                raise
        else:
            if lost:
                raise Mismatch("fault", f"the dropped {command} reply did not surface")
        if task is not None:
            ws.task, ws.stage = task, TAKEN
        elif not lost:
            raise Mismatch(command, "the model predicts a task; the take returned None")

    def _promote(self, action: Action) -> None:
        """The model promotes one member, any one (due times are abstracted away). Redis
        promotes every member due by `now`: the harness promotes with `now` = the chosen
        member's due time, and the model walks one `promote` per member that was due, in the
        order the script moves them (earliest first)."""
        t = action.task
        reply: Any = self.admin.zrange(self.keys.scheduled, 0, -1, withscores=True)
        members = [(self._tid(raw), float(score)) for raw, score in reply]
        due_at = next((score for u, score in members if u == t), None)
        if due_at is None:
            raise Mismatch("promote", f"task {t} is not in the scheduled set")
        due = [u for u, score in members if score <= due_at]
        slot = next((p for procs in self.procs for p in procs), None)
        if slot is not None:
            slot.server.promote_due(due_at)
        else:  # no process left: `taskcustody sweep` promotes
            scheduled.promote(self.admin, self.keys, due_at)
        for u in due[:scheduled.PROMOTE_BATCH]:
            self._model(Action("promote", task=u))

    def _tid(self, raw: bytes | str) -> int:
        from ..envelope import decode

        return self.task_index(decode(raw if isinstance(raw, bytes) else raw.encode()).id)

    def _model_list(self, s: int, inc: int, w: int) -> tuple[int, ...]:
        for k, tasks in self.state.lists:
            if k == (s, inc, w):
                return tasks
        return ()

    # -- server steps --------------------------------------------------------------------------

    def _heartbeat(self, action: Action, variant: int) -> None:
        slot = self.procs[action.server][action.proc]
        reg = self.state.registry[action.server]
        supersedes = reg is not None and reg.inc != slot.model_inc
        lost = action.name == "dropped_reply"
        if lost or (variant % 3 == 2 and not supersedes):
            # A lost heartbeat reply changes nothing (the model has no separate action): the
            # script ran. Injected here for realism; `Server._background` logs and goes on.
            self.injector.arm("EVAL", label=slot.label)
            self.counts["dropped-reply:heartbeat"] += 1
        try:
            slot.server.heartbeat()
        except Superseded:
            for ws in slot.workers:
                if ws.task is None and not ws.crashed:
                    ws.stopped = True
            if slot.phase != RUNNING:  # superseded before its workers started
                slot.workers = [WorkerSlot(None, stopped=True)
                                for _ in range(self.bounds.workers)]
            slot.phase = SUPERSEDED
        except redis.ConnectionError:
            pass
        self.injector.disarm_all()
        self._model(Action("heartbeat", action.server, action.proc))

    def _claim_step(self, action: Action, lost: bool) -> None:
        s = action.server
        model_before = self.state
        self._model(action)
        if lost:
            reg = self.state.registry[s]
            assert reg is not None
            label = f"{self.server_id(s)}#{len(self.steps)}"
            client = self._new_client(label)
            server = self.server_factory(client, self.keys, self.server_id(s),
                                         settings=self.settings, clock=self.clock,
                                         workers=self.bounds.workers)
            self.injector.arm("EVAL", label=label)
            try:
                server.claim()
            except redis.ConnectionError:
                pass
            else:
                raise Mismatch("fault", "the dropped claim reply did not surface")
            finally:
                self.injector.disarm_all()
                client.close()
            # The new incarnation is in Redis; the process never learnt its number. Name it.
            real = self.admin.hget(self.keys.incarnations, self.server_id(s))
            if real is not None:
                self._name(s, int(real), reg.inc)
            return
        new = [p for p in self.state.processes[s] if p not in model_before.processes[s]]
        try:
            self._claim(s, expect_model_inc=new[-1].inc)
        except ServerIdHeld as exc:
            raise Mismatch("claim", f"the model lets server {s} claim its id; Redis refused: "
                                    f"{exc}") from exc

    def _pass(self, action: Action, command: str, lost: bool, drop_at: int,
              interleave: Interleave | None = None) -> None:
        """A whole sweep pass or startup drain: the implementation runs it in one call; the
        model walks it (`sweep`/`startup_drain`, every `drain_step`, then for a sweep the
        processing sweep). With `drop_at` = k, the k-th move's reply is lost. With `interleave`,
        the owner of a list being drained may step between two of its moves (module doc)."""
        s, i = action.server, action.proc
        slot = self.procs[s][i]
        server = slot.server
        # The model first: it says how many moves the pass makes, so we know where to drop, and
        # which worker steps run after which move: {(real list key, n-th move of it): steps}.
        queue_before = self.state.queue, self.state.suspects
        me = self.state.processes[s][i]
        pruned = _model_protocol.prune(self.state.registry)
        gc_candidates = [k for k in self.state.registered
                         if k[:2] != (s, me.inc) and not _model_protocol.is_live(pruned, k)]
        self._model(action)
        self._order_drains(s, i)
        procs = self.state.processes[s]
        # The length each drain of the pass reads up front: its bound (bounded work).
        bounds = {self._real_key(d.key): (d.key, d.length)
                  for d in (procs[i].drains if i < len(procs) else ())}
        moves = 0
        abandoned = lost
        plan: dict[tuple[str, int], list[Action]] = {}
        moves_of: Counter[ListKey] = Counter()
        budget = MAX_STEPS_DURING_A_PASS if interleave is not None else 0
        while not abandoned:
            procs = self.state.processes[s]
            proc = procs[i] if i < len(procs) else None
            if proc is None or not proc.drains:
                break
            moves += 1
            if moves == drop_at and self._faults_left():
                self.counts["dropped-reply:drain_step"] += 1
                self._model(Action("dropped_reply", s, i, -1, "drain_step"))
                abandoned = True
            else:
                key = proc.drains[0].key
                held = len(self._model_list(*key))
                self._model(Action("drain_step", s, i))
                # it moved a task (to the queue, or a poison pill to the dead letters): the hook
                # runs on both sides
                if len(self._model_list(*key)) < held:
                    moves_of[key] += 1
                    if budget > 0 and interleave is not None:
                        between = self._steps_during_drain(key, interleave, budget)
                        budget -= len(between)
                        if between:
                            plan[(self._real_key(key), moves_of[key])] = between
        # Now the implementation. A sweep's first EVAL is the prune; then, if the registry holds
        # lists of owners that are not live, one garbage collection per batch of them (the
        # harness's grace is 0: every registration is old enough); then the drains.
        evals_before = 0
        if command == "sweep":
            evals_before = 1 + -(-len(gc_candidates) // recovery.BATCH)
        if lost:
            self.injector.arm("EVAL", label=slot.label)
        elif abandoned:
            self.injector.arm("EVAL", label=slot.label, skip=evals_before + moves - 1)
        failed = False
        hook_before = recovery.between_drain_chunks
        real_moves: Counter[str] = Counter()  # per list; one move per chunk (`drain_chunk=1`)
        recovery.between_drain_chunks = self._drain_hook(plan, real_moves)
        try:
            if command == "sweep":
                report = server.sweep()
                self.recovered += report.moved + report.requeued_stuck
            else:
                drained = server.startup_drain()
                self.recovered += sum(drained.values())
        except redis.ConnectionError:
            failed = True
        finally:
            recovery.between_drain_chunks = hook_before
            self.injector.disarm_all()
        if failed and not (lost or abandoned):
            raise Mismatch("fault", f"{command} failed with no fault injected")
        if (lost or abandoned) and not failed:
            raise Mismatch("fault", f"{command}: the dropped reply did not surface (the pass made "
                                    "fewer moves than the model predicts)")
        for real_key, n in real_moves.items():
            if real_key in bounds and n > bounds[real_key][1]:
                key, length = bounds[real_key]
                raise Mismatch("real:bounded-work",
                               f"a drain of inflight:{key[0]}:{key[1]}:{key[2]} made {n} moves; "
                               f"the list held {length} when it started")
        if command == "startup_drain":
            if failed:
                slot.phase = CLAIMED
            else:
                self._start_workers(slot)
        elif not failed:
            # The implementation's sweep ends with the processing sweep; so does the model's walk.
            self._model(Action("requeue_stuck_processing_tasks", s, i))
        self._adopt_recovery_order(queue_before)

    def _steps_during_drain(self, key: ListKey, interleave: Interleave,
                            budget: int) -> list[Action]:
        """The model's side of the hook, right after a move out of `key`: the worker steps of the
        list's owner that `interleave` picks (at most `budget`), applied to the model."""
        done: list[Action] = []
        while len(done) < budget:
            options = [
                a for a in enabled_actions(self.state, self.config)
                if a.name in STEPS_DURING_A_DRAIN and (a.server, a.worker) == (key[0], key[2])
                and self.state.processes[a.server][a.proc].inc == key[1]
                # Not a superseded process: its release could make it exit, and renumber the
                # processes in the middle of the pass.
                and self.state.processes[a.server][a.proc].phase == RUNNING
            ]
            if not options:
                break
            chosen = interleave(options)
            if chosen is None:
                break
            self.steps.append(StepRecord(
                len(self.steps) + 1, chosen,
                f"{self.describe(chosen)} (between two moves of the drain of "
                f"inflight:{key[0]}:{key[1]}:{key[2]})",
                False, actor_of(chosen, self.state)))
            self._model(chosen)
            done.append(chosen)
        self.steps_during_drains += len(done)
        return done

    def _drain_hook(self, plan: dict[tuple[str, int], list[Action]],
                    moved: Counter[str]) -> Callable[[str], None]:
        """The implementation's side: `recovery.between_drain_chunks` for one pass, counting the
        moves per list in `moved` and performing the planned worker steps after the n-th move out
        of a list. Steps are planned only for the moves the model makes, so a drain that moves
        more finds nothing more to run there, and ends."""

        def between_drain_chunks(list_key: str) -> None:
            moved[list_key] += 1
            for a in plan.pop((list_key, moved[list_key]), ()):
                self._real_worker_step(a, a.name, False, 0)

        return between_drain_chunks

    def _real_key(self, key: ListKey) -> str:
        s, model_inc, w = key
        real = {m: r for r, m in self.names[s].items()}.get(model_inc, -1)
        return self.keys.inflight(ListOwner(self.server_id(s), real, f"w{w}"))

    def _order_drains(self, s: int, i: int) -> None:
        """The protocol does not fix the order in which a pass drains its lists; the
        implementation goes by sorted key. The model's pass is ordered the same way, so that the
        k-th move (where a dropped reply may hit) is the same task on both sides."""
        procs = self.state.processes[s]
        if i >= len(procs) or len(procs[i].drains) < 2:
            return
        proc = procs[i]
        ordered = tuple(sorted(proc.drains, key=lambda d: self._real_key(d.key)))
        self.state = _with_proc(self.state, s, i, proc._replace(drains=ordered))

    def _adopt_recovery_order(
        self, before: tuple[tuple[int, ...], tuple[int, ...]]
    ) -> None:
        """The processing sweep requeues stuck tasks in the order Redis lists the processing
        hash; the model goes by task number. The protocol fixes neither. If one pass requeued
        the same *set* of tasks on both sides, the model adopts the real order of that segment;
        any other difference is left for `check` to report. The same for the suspects list,
        whose recovered tasks are pushed on its left (the queue's on its right)."""
        queue_before, suspects_before = before
        model_q = self.state.queue
        if model_q[: len(queue_before)] == queue_before:
            real_q = self.observe_queue()
            if (real_q[: len(queue_before)] == queue_before
                    and sorted(real_q[len(queue_before):])
                    == sorted(model_q[len(queue_before):])):
                self.state = self.state._replace(queue=real_q)
        model_s, n = self.state.suspects, len(suspects_before)
        if model_s[len(model_s) - n:] == suspects_before:
            real_s = self.observe_queue(self.keys.suspects)
            if (real_s[len(real_s) - n:] == suspects_before
                    and sorted(real_s[: len(real_s) - n]) == sorted(model_s[: len(model_s) - n])):
                self.state = self.state._replace(suspects=real_s)

    def observe_queue(self, key: str | None = None) -> tuple[int, ...]:
        """The queue (or the suspects list), as task numbers."""
        from ..envelope import decode

        raws = self.admin.lrange(key or self.keys.queue, 0, -1)
        return tuple(self.task_index(decode(r if isinstance(r, bytes) else r.encode()).id)
                     for r in raws)

    def _faults_left(self) -> bool:
        return self.state.faults < self.bounds.faults

    # -- reading Redis back, in the model's terms ---------------------------------------------

    def observe(self) -> State:
        """The real state, mapped to the model's terms."""
        keys = self.keys
        pipe = self.admin.pipeline(transaction=False)
        pipe.lrange(keys.queue, 0, -1)
        pipe.zrange(keys.inflight_registry, 0, -1)
        pipe.hgetall(keys.processing)
        pipe.hgetall(keys.commit_log)
        pipe.zrange(keys.servers, 0, -1, withscores=True)
        pipe.hgetall(keys.incarnations)
        pipe.hgetall(keys.recoveries)
        pipe.lrange(keys.dead_letters, 0, -1)
        pipe.zrange(keys.scheduled, 0, -1)
        (queue_raw, registry_raw, processing, commits, servers, incs, counts,
         dead, scheduled_raw) = pipe.execute()
        list_keys = self._keys_starting(keys.inflight_prefix)
        n = self.bounds.tasks

        def tid(raw: bytes | str) -> int:
            from ..envelope import decode

            return self.task_index(decode(raw if isinstance(raw, bytes) else raw.encode()).id)

        queue = tuple(tid(r) for r in queue_raw)
        registered = tuple(sorted(self._model_key(_text(k)) for k in registry_raw))
        lists: list[tuple[ListKey, tuple[int, ...]]] = []
        for k in sorted(_text(k) for k in list_keys):
            owner = keys.owner_of(k)
            tasks = tuple(tid(r) for r in self.admin.lrange(k, 0, -1))
            if tasks:
                lists.append((self.list_key((owner.server_id, owner.incarnation,
                                             owner.worker_id)), tasks))
        lists.sort()
        records: list[ListKey | None] = [None] * n
        for task_id, value in processing.items():
            list_key, _ = parse_record(value)
            owner = keys.owner_of(list_key)
            records[self.task_index(_text(task_id))] = self.list_key(
                (owner.server_id, owner.incarnation, owner.worker_id))
        committed = [0] * n
        for task_id, count in commits.items():
            committed[self.task_index(_text(task_id))] = int(count)
        total = int(self.admin.get(keys.committed) or 0)
        if total != sum(committed):
            raise Mismatch("commits", f"committed counter {total} != commit log {committed}")
        for t, before in self.commits_before_wipes.items():
            committed[t] += before
        registry: list[Registration | None] = [None] * self.bounds.servers
        now = self.clock.now()
        zset = {_text(m): float(score) for m, score in servers}
        hincs = {_text(k): int(v) for k, v in incs.items()}
        if set(zset) != set(hincs):
            raise Mismatch("registry", f"servers {sorted(zset)} vs incarnations {sorted(hincs)}")
        for sid, deadline in zset.items():
            s = int(sid[1:])
            model_inc = self.names[s].get(hincs[sid])
            if model_inc is None:
                raise Mismatch("mapping", f"server {sid} registered as unknown incarnation")
            rel = (deadline - now) / TICK
            if abs(rel - round(rel)) > 1e-6:
                raise Mismatch("clock", f"deadline of {sid} is not a whole tick away: {rel}")
            registry[s] = Registration(model_inc, max(0, round(rel)))
        processes = tuple(
            tuple(self._observe_proc(p) for p in self.procs[s])
            for s in range(self.bounds.servers)
        )
        recoveries = [0] * n
        for name, count in counts.items():
            if ":" not in _text(name):  # (`<id>:from` names the holders that died)
                recoveries[self.task_index(_text(name))] = int(count)
        status = list(self.status)
        for entry in dead:
            letter = json.loads(entry)
            if letter.get("poison"):
                t = self.task_index(letter["task_id"])
                status[t] = POISONED
                # the dead letter keeps the count its recoveries reached
                recoveries[t] = int(letter["recoveries"])
        return State(
            queue=queue, suspects=self.observe_queue(keys.suspects), lists=tuple(lists),
            records=tuple(records), committed=tuple(committed),
            registry=tuple(registry), processes=processes, faults=self.state.faults,
            stalled_ever=self.state.stalled_ever, registered=registered,
            status=tuple(status), recoveries=tuple(recoveries),
            # a ghost of the model (handler starts), not Redis state: see `check`
            executions=self.state.executions,
            scheduled=tuple(sorted(tid(r) for r in scheduled_raw)),
        )

    def _model_key(self, real_key: str) -> ListKey:
        owner = self.keys.owner_of(real_key)
        return self.list_key((owner.server_id, owner.incarnation, owner.worker_id))

    def _observe_proc(self, slot: ProcSlot) -> Process:
        if slot.phase == RUNNING or slot.phase == SUPERSEDED or slot.workers:
            workers = tuple(
                ModelWorker(ws.phase(), self.task_index(ws.task.id) if ws.task else -1)
                for ws in slot.workers
            )
        else:
            workers = tuple(ModelWorker(IDLE) for _ in range(self.bounds.workers))
        phase = SUPERSEDED if slot.server.superseded else slot.phase
        # The suspect slot, by the worker whose list key holds it.
        holder = slot.server.suspect_slot.holder
        suspect = next((w for w in range(self.bounds.workers) if holder == self.keys.inflight(
            ListOwner(slot.server.server_id, slot.real_inc, f"w{w}"))), -1)
        # Passes run whole inside one step: between steps, no process is mid-pass.
        return Process(slot.model_inc, slot.stalled, phase, (), workers, suspect=suspect)

    def check(self) -> None:
        """After every step: the real state equals the model's, and every property holds on
        both."""
        real = self.observe()
        model = self.state
        if self.steps:  # for the report: what this check saw after the last step
            self.steps[-1].model, self.steps[-1].real = model, real
        for name, have in (("model", model), ("real", real)):
            bad = check_invariants(have, self.config)
            if bad is not None:
                raise Mismatch(f"{name}:{bad[0]}", bad[1])
        if real != model:
            raise Mismatch("conformance", diff(model, real))

    # -- the end of a run ----------------------------------------------------------------------

    PRIORITY = ("release", "release_and_take", "execute", "record", "reconcile",
                "restart_worker", "resume_server", "heartbeat", "startup_drain",
                "requeue_stuck_processing_tasks", "sweep", "promote", "take_suspect", "take",
                "claim", "enqueue", "advance_clock")

    def recover(self, limit: int = 2_000) -> int:
        """Faults stop; recovery and workers run until quiescent (the model's `is_done`).
        Returns the steps taken; raises `Mismatch` if the run does not get there."""
        self.injector.disarm_all()
        self.recovering = True
        taken = 0
        while not is_done(self.state):
            if taken >= limit:
                raise Mismatch("eventual", f"not quiescent after {limit} recovery steps")
            options = [a for a in self.enabled() if not a.is_fault]
            if not options:
                raise Mismatch("eventual", "no recovery step is enabled, and the run is not done")
            options.sort(key=lambda a: self.PRIORITY.index(a.name))
            self.step(options[0])
            self.check()
            taken += 1
        self.check_eventual()
        return taken

    def check_eventual(self) -> None:
        """Every task committed exactly once; queue, in-flight lists and records empty."""
        keys = self.keys
        commits = Counter(self.commits_before_wipes)
        commits.update(self._redis_commits())
        status = self.observe().status
        want = {t: 0 if st in (WIPED, POISONED) else 1 for t, st in enumerate(status)}
        have = {t: commits[t] for t in want}
        if have != want:
            raise Mismatch("eventual", f"commits per task {have}, want {want} (exactly one "
                                       "each, none for a task Redis itself lost or a poison "
                                       "pill)")
        if self.admin.llen(keys.queue):
            raise Mismatch("eventual", "the queue is not empty")
        if self.admin.llen(keys.suspects):
            raise Mismatch("eventual", "the suspects list is not empty")
        if self.admin.zcard(keys.scheduled):
            raise Mismatch("eventual", "the scheduled set is not empty")
        for k in recovery.registered_lists(self.admin, keys):
            if self.admin.llen(k):
                raise Mismatch("eventual", f"in-flight list {k} is not empty")
        if self.admin.hlen(keys.processing):
            raise Mismatch("eventual", "processing records remain")

    def close(self) -> None:
        for procs in self.procs:
            for slot in procs:
                for ws in slot.workers:
                    if ws.worker is not None:
                        ws.worker.close()
                slot.client.close()
        self.admin.close()

    # -- figures -------------------------------------------------------------------------------

    def tallies(self) -> dict[str, int]:
        """Jepsen-style counts of this run, read from Redis."""
        state = self.observe()
        commits = dict(enumerate(state.committed))
        places: Counter[int] = Counter(state.queue + state.suspects + state.scheduled)
        for _, tasks in state.lists:
            places.update(tasks)
        ours = [t for t, st in enumerate(state.status) if st == ENQUEUED]
        lost = sum(1 for t in ours if commits[t] == 0 and places[t] == 0)
        return {
            "enqueued": self.enqueued,
            "committed": sum(1 for v in commits.values() if v >= 1),
            "lost": lost,
            # twice in Redis, committed twice, or committed and still queued or in custody
            # (it would run again)
            "duplicated": sum(
                1 for t in range(self.bounds.tasks)
                if places[t] > 1 or commits[t] > 1 or (commits[t] >= 1 and places[t] >= 1)
            ),
            "double-assigned": _double_assigned(state),
            "recovered": self.recovered,
            # enqueued, then lost by Redis itself in a wipe: not the protocol's loss
            "lost-by-redis": sum(1 for st in self.status if st == WIPED),
            # recovered once too often: dead-lettered as a poison pill (an end, like a commit)
            "poison-pills": sum(1 for st in state.status if st == POISONED),
        }


def actor_of(action: Action, state: State) -> str:
    """The lifeline an action belongs to (see `StepRecord.actor`), named from the state before
    it."""
    if action.server < 0:
        return ""
    who = f"s{action.server}"
    if action.proc >= 0:
        who += f"#{state.processes[action.server][action.proc].inc}"
    if action.worker >= 0:
        who += f" w{action.worker}"
    return who


def _double_assigned(state: State) -> int:
    held: Counter[int] = Counter(
        w.task for procs in state.processes for p in procs for w in p.workers
        if w.phase in (TAKEN, RECORDED) or (EXECUTED is not None and w.phase == EXECUTED)
    )
    return sum(1 for v in held.values() if v > 1)


def diff(model: State, real: State) -> str:
    lines = []
    for name in State._fields:
        a, b = getattr(model, name), getattr(real, name)
        if a != b:
            lines.append(f"{name}: model {a!r} != real {b!r}")
    return "; ".join(lines) or "equal"
