"""The harness's stepping part: what changes Redis (and the model's state with it).

`Stepping.setup()` makes the model's initial state real; `step(action)` takes an action the model
enables and performs it on the implementation through the public steps its production loop calls
(`Server.claim/startup_drain/heartbeat/sweep/requeue_stuck_processing_tasks/make_worker`,
`Worker.register/reconcile/take/record/execute/release/release_and_take`), arming the fault it
carries, and lets the model predict its effect (`model_step`); `recover()` stops faults and runs
recovery and workers until quiescent. The observation part (`observation.Observation`) reads the
result back and compares: the model predicts, it never copies what the implementation returned.

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

Refusals. `attempt(a)` makes an attempt the model refuses (`refused_attempts`: a claim of an id a
live process holds, a heartbeat from a superseded process, a sweep's drain of a live list) on the
implementation, and raises `Mismatch("refusal", ...)` if the implementation accepts it; the model's
state does not change, so the check after it also says that Redis did not.

Faults. A dropped reply is armed in `faults.FaultInjector` for the command the model names, on
the connection that sends it; Redis really executes it. A worker crash drops the `Worker` object
and closes its connection (an unread deferred reply is discarded); no `finally` runs. A server
crash crashes its workers and stops its heartbeat. Stall and resume are the model's: the harness
stops calling that process's heartbeat and sweeps while its workers go on. Time moves by
`ManualClock.advance`, one model tick at a time.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis
from taskcustody_model import (
    Action,
    Attempt,
    apply,
    check_transition,
    enabled_actions,
    is_done,
    is_live,
    list_of,
    prune,
    refused_attempts,
    renewed,
    with_process,
)
from taskcustody_model.state import (
    ARMED,
    CLAIMED,
    ENQUEUED,
    IDLE,
    POISONED,
    RECORDED,
    RUNNING,
    SUPERSEDED,
    TAKEN,
    TTL,
    WAITING,
    WIPED,
    ListKey,
    Registration,
    State,
)
from taskcustody_model.trace import describe_action

from .. import scripts
from ..core import recovery, scheduled
from ..core.clock import ManualClock
from ..core.envelope import Task
from ..core.errors import ServerIdHeld, Superseded
from ..core.keys import QueueKeys
from ..core.outcome import Outcome
from ..core.producer import Producer
from ..core.server import Server
from ..core.settings import Settings
from . import faults
from .observation import TICK, Mismatch, Observation, ProcSlot, StepRecord, WorkerSlot

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

ServerFactory = Callable[..., Server]


def default_server(client: redis.Redis, keys: QueueKeys, server_id: str, *, settings: Settings,
                   clock: ManualClock, workers: int) -> Server:
    return Server(client, keys, server_id, lambda payload: payload, workers=workers,
                  settings=settings, clock=clock)


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


class Stepping(Observation):
    """Performs the model's actions on the real deployment, and on the model. The run's parts
    (clients, clock, fault injector, slots) are set up by `Harness`."""

    make_client: Callable[[], redis.Redis]
    server_factory: ServerFactory
    settings: Settings
    injector: faults.FaultInjector
    #: with the Redis wipe: flush the script cache too (not on a server that is the user's)
    flush_scripts: bool
    #: on a real server (not fakeredis): replies arrive on a real socket
    real_redis: bool
    counts: Counter[str]  # faults by kind, and other events
    refusals: Counter[str]  # refused attempts (`attempt`) by kind, each refused as the model says
    steps_during_drains: int  # worker steps interleaved between the moves of a drain
    seconds: float  # time spent in steps
    scripts_flushed: bool

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
        scripts.RELEASE_SCRIPT.load(self.admin)
        scripts.RELEASE_AND_TAKE_SCRIPT.load(self.admin)

    def _enqueue(self, t: int) -> None:
        Producer(self.admin, self.keys, self.clock).enqueue({"n": t}, task_id=self.task_id(t))
        self.status[t] = ENQUEUED
        self.enqueued += 1

    def wipe(self) -> None:
        """Delete this run's keys, nothing else (with `--redis-url` the server is the user's)."""
        found = self._keys_starting(self.keys.base + ":")
        if found:
            self.admin.delete(*found)

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

    def model_step(self, action: Action) -> None:
        """The model's side of a step: `action` applied to the model's state, after checking the
        model's step properties on it (the implementation's side is the caller's)."""
        before = self.state
        after = apply(before, action, self.config)
        bad = check_transition(before, action, self.config)
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
        """`action` in words, as the model's traces say it (in the state before it)."""
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

        if command in ("take", "take_suspect", "record", "release", "retry", "release_and_take",
                       "reconcile"):
            self._worker_step(action, command, lost, variant)
        elif name == "promote":
            self._promote(action)
        elif name == "arm":
            self._arm(action)
        elif name == "crash_worker":
            self._crash_worker(self.procs[s][i].workers[w])
            self.model_step(action)
        elif name == "restart_worker":
            slot = self.procs[s][i]
            worker = slot.server.make_worker(w)
            worker.register()
            slot.workers[w] = WorkerSlot(worker)
            self.model_step(action)
        elif name == "crash_server":
            slot = self.procs[s][i]
            for ws in slot.workers:
                self._crash_worker(ws)
            slot.client.close()
            del self.procs[s][i]
            self.model_step(action)
        elif name == "stall_server":
            self.procs[s][i].stalled = True
            self.model_step(action)
        elif name == "resume_server":
            self.procs[s][i].stalled = False
            self.model_step(action)
        elif name == "advance_clock":
            self._advance_clock(action)
        elif name == "enqueue":
            self._enqueue(self.status.index(WAITING))
            self.model_step(action)
        elif name == "redis_wipe":
            self._redis_wipe()
            self.model_step(action)
        elif command == "heartbeat":
            self._heartbeat(action, variant)
        elif command == "claim":
            self._claim_step(action, lost)
        elif command in ("startup_drain", "sweep"):
            self._pass(action, command, lost, drop_at, interleave)
        elif command == "requeue_stuck_processing_tasks":
            queue_before = self.state.queue, self.state.suspects
            self.procs[s][i].server.requeue_stuck_processing_tasks()
            self.model_step(action)
            self._adopt_recovery_order(queue_before)  # the order is not the protocol's to fix
        else:
            raise ValueError(f"the harness cannot perform {action!r}")
        self.settle()

    def _advance_clock(self, action: Action) -> None:
        """One tick. Healthy processes (not stalled, not superseded, holding their id's
        registration) heartbeat far more often than the TTL; the model folds those renewals into
        the tick (`renewed`), so the harness heartbeats them right after the clock moves."""
        beating = []
        for s, slots in enumerate(self.procs):
            reg = self.state.registry[s]
            for slot in slots:
                # (a renewal keeps the deadline where it is: a lapsed registration is renewed
                # only by the model's own `heartbeat` action)
                if reg is not None and reg.deadline == TTL \
                        and renewed(self.state, s, reg.inc) \
                        and slot.model_inc == reg.inc and not slot.stalled \
                        and not slot.server.superseded:
                    beating.append(slot)
        self.clock.advance(TICK)
        for slot in beating:
            slot.server.heartbeat()
        self.model_step(action)
        # With `Bounds.registration_ages` a tick ends every pending take (the model's `arm`):
        # a worker its production loop left armed is idle again (its loop would send the take
        # again: a new `arm`).
        for s, slots in enumerate(self.procs):
            for i, slot in enumerate(slots):
                for w, ws in enumerate(slot.workers):
                    if ws.armed and (i >= len(self.state.processes[s]) or self.state.processes[
                            s][i].workers[w].phase != ARMED):
                        ws.armed = False

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
                    # what the worker loop does after a connection error (on a cluster it
                    # reconnects to the slot's master; the slot did not move)
                    ws.worker.follow_slot(refresh=False)
                    ws.task = ws.outcome = None
                    ws.stage = IDLE
                    if slot.server.superseded:
                        ws.stopped = True

    def _arm(self, action: Action) -> None:
        """A worker's take from the empty queue (`Worker.take_from_queue`): its registration
        goes with the BLMOVE, which waits one block timeout and finds nothing. The model's
        `arm`: the worker is armed (its take pending) until a tick ends it or it takes. Not among
        `enabled` (the step-driven run never leaves a take waiting); the server loop's driver
        interleaves it (verify/server_loop.py)."""
        ws = self.procs[action.server][action.proc].workers[action.worker]
        assert ws.worker is not None
        if ws.worker.take_from_queue() is not None:
            raise Mismatch("take", "the model says the queue is empty; the take took a task")
        self.model_step(action)
        ws.armed = True
        self.counts["arms-interleaved"] += 1

    def _crash_worker(self, ws: WorkerSlot) -> None:
        if ws.worker is not None:
            ws.worker.close()  # whatever reply it had not read is gone with it
        ws.worker = None
        ws.task = None
        ws.crashed = True

    def settle(self) -> None:
        """A superseded process exits once none of its workers holds a task."""
        for procs in self.procs:
            for slot in list(procs):
                if slot.server.superseded and all(
                    ws.crashed or ws.stopped for ws in slot.workers
                ):
                    slot.client.close()
                    procs.remove(slot)

    def _faults_left(self) -> bool:
        return self.state.faults < self.bounds.faults
    # -- worker steps: one step of `Worker.run_once`, in its order ----------------------------

    def _worker_step(self, action: Action, command: str, lost: bool, variant: int) -> None:
        try:
            self._real_worker_step(action, command, lost, variant)
        finally:
            self.injector.disarm_all()
        self.model_step(action)

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
                n = len(list_of(self.state, (s, slot.model_inc, w)))
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
        ws.armed = False  # (a take left waiting by a production loop: this one is served)
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
            self.model_step(Action("promote", task=u))
    # -- refused attempts ----------------------------------------------------------------------

    def refused(self) -> list[Attempt]:
        """The attempts the model refuses now (`refused_attempts`)."""
        return refused_attempts(self.state, self.config)

    def attempt(self, a: Attempt) -> None:
        """Make attempt `a`, one the model refuses, on the implementation; raises
        `Mismatch("refusal", ...)` if it is accepted. The model's state stays as it is (a refused
        attempt changes nothing), so the caller's `check` compares Redis with the state before."""
        if a not in self.refused():
            raise ValueError(f"the model does not refuse {a!r} now")
        started = time.perf_counter()
        actor = f"s{a.server}" + (f"#{a.inc}" if a.name == "heartbeat_superseded" else "")
        self.steps.append(StepRecord(len(self.steps) + 1, Action(a.name, a.server, a.proc,
                                                                 a.worker),
                                     f"{a.describe()} (the model refuses it)", False, actor,
                                     recovery=self.recovering))
        try:
            accepted = self._attempt(a)
        finally:
            self.seconds += time.perf_counter() - started
        if accepted:
            raise Mismatch("refusal", f"the model refuses it; the implementation accepted: "
                                      f"{a.describe()} ({accepted})")
        self.refusals[a.name] += 1

    def _attempt(self, a: Attempt) -> str:
        """The implementation's side of an attempt: "" if it refused, else what it did."""
        if a.name == "claim_held":
            label = f"{self.server_id(a.server)}#{len(self.steps)}"
            client = self._new_client(label)
            try:
                server = self.server_factory(client, self.keys, self.server_id(a.server),
                                             settings=self.settings, clock=self.clock,
                                             workers=self.bounds.workers)
                try:
                    inc = server.claim()
                except ServerIdHeld:
                    return ""
                return f"the claim took the id as incarnation {inc}"
            finally:
                client.close()
        if a.name == "heartbeat_superseded":
            server = self.procs[a.server][a.proc].server
            try:
                server.heartbeat()
            except Superseded:
                return ""
            holder = self.admin.hget(self.keys.incarnations, server.server_id)
            if holder is not None and int(holder) == server.identity.incarnation:
                return "the heartbeat took the id back (renewed the registration)"
            return ("Redis refused the heartbeat, but the process went on as if it had been "
                    "accepted (no Superseded)")
        if a.name == "drain_live":
            key = self._real_key((a.server, a.inc, a.worker))
            moved = recovery.drain_inflight(self.admin, self.keys, key, force=False,
                                            chunk=self.settings.drain_chunk)
            return f"the drain moved {moved} task(s)" if moved else ""
        raise ValueError(f"the harness cannot attempt {a!r}")

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
        self.model_step(Action("heartbeat", action.server, action.proc))

    def _claim_step(self, action: Action, lost: bool) -> None:
        s = action.server
        model_before = self.state
        self.model_step(action)
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

    def _spares_fresh(self, s: int, inc: int, pruned: tuple[Registration | None, ...]) -> bool:
        """Whether a sweep of server `s`'s incarnation `inc` would forget a registered list but
        for its fresh registration (`Bounds.registration_ages`): empty, not its own, its owner
        not live. The sweep where a collection that ignores the age (design 9) forgets what the
        model keeps."""
        held = {k for k, _ in self.state.lists}
        return any(k not in held and k[:2] != (s, inc) and not is_live(pruned, k)
                   for k in self.state.fresh)

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
        pruned = prune(self.state.registry)
        # (with `Bounds.registration_ages` the grace is a tick: fresh registrations are not
        # candidates; else it is 0, and none is fresh)
        gc_candidates = [k for k in self.state.registered
                         if k[:2] != (s, me.inc) and not is_live(pruned, k)
                         and k not in self.state.fresh]
        if command == "sweep" and self._spares_fresh(s, me.inc, pruned):
            self.counts["sweeps-sparing-fresh"] += 1
        self.model_step(action)
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
                self.model_step(Action("dropped_reply", s, i, -1, "drain_step"))
                abandoned = True
            else:
                key = proc.drains[0].key
                held = len(list_of(self.state, key))
                self.model_step(Action("drain_step", s, i))
                # it moved a task (to the queue, or a poison pill to the dead letters): the hook
                # runs on both sides
                if len(list_of(self.state, key)) < held:
                    moves_of[key] += 1
                    if budget > 0 and interleave is not None:
                        between = self._steps_during_drain(key, interleave, budget)
                        budget -= len(between)
                        if between:
                            plan[(self._real_key(key), moves_of[key])] = between
        # Now the implementation. A sweep's first EVAL is the prune; then, if the registry holds
        # lists of owners that are not live (and old enough), one garbage collection per batch
        # of them; then the drains.
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
            self.model_step(Action("requeue_stuck_processing_tasks", s, i))
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
            self.model_step(chosen)
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

    def _order_drains(self, s: int, i: int) -> None:
        """The protocol does not fix the order in which a pass drains its lists; the
        implementation goes by sorted key. The model's pass is ordered the same way, so that the
        k-th move (where a dropped reply may hit) is the same task on both sides."""
        procs = self.state.processes[s]
        if i >= len(procs) or len(procs[i].drains) < 2:
            return
        proc = procs[i]
        ordered = tuple(sorted(proc.drains, key=lambda d: self._real_key(d.key)))
        self.state = with_process(self.state, s, i, proc._replace(drains=ordered))

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
    # -- the end of a run ----------------------------------------------------------------------

    PRIORITY = ("release", "release_and_take", "record", "reconcile",
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
            if self.bounds.registration_ages:
                # (a sweep that only spares fresh registrations changes nothing: not a step
                # towards the end; the next tick ages them)
                options = [a for a in options if a.name != "sweep"
                           or apply(self.state, a, self.config) != self.state]
            if not options:
                raise Mismatch("eventual", "no recovery step is enabled, and the run is not done")
            options.sort(key=lambda a: self.PRIORITY.index(a.name))
            self.step(options[0])
            self.check()
            taken += 1
        self.check_eventual()
        return taken
