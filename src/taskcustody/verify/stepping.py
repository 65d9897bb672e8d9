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

Layout: `Stepping` is built in layers, each a module with one job: stepping_base.py (set-up and
the model's side of a step), worker_steps.py (a worker's steps), recovery_passes.py (sweeps and
startup drains); this module dispatches each action to them and holds the rest (the clock, the
wipe, server steps, refused attempts, the end of a run).
"""

from __future__ import annotations

import time
from typing import Any

import redis
from taskcustody_model import (
    Action,
    Attempt,
    apply,
    is_done,
    refused_attempts,
    renewed,
)
from taskcustody_model.state import (
    ARMED,
    ENQUEUED,
    IDLE,
    POISONED,
    RUNNING,
    SUPERSEDED,
    TTL,
    WAITING,
    WIPED,
)

from ..core import recovery, scheduled
from ..core.errors import ServerIdHeld, Superseded
from .observation import TICK, Mismatch, StepRecord, WorkerSlot
from .recovery_passes import MAX_STEPS_DURING_A_PASS, STEPS_DURING_A_DRAIN, RecoveryPasses
from .stepping_base import VERIFY_SETTINGS, Interleave, ServerFactory, actor_of, default_server

__all__ = [
    "MAX_STEPS_DURING_A_PASS",
    "STEPS_DURING_A_DRAIN",
    "VERIFY_SETTINGS",
    "Interleave",
    "ServerFactory",
    "Stepping",
    "actor_of",
    "default_server",
]


class Stepping(RecoveryPasses):
    """Performs the model's actions on the real deployment, and on the model. The run's parts
    (clients, clock, fault injector, slots) are set up by `Harness`."""

    # -- stepping ------------------------------------------------------------------------------

    def step(
        self,
        action: Action,
        *,
        drop_at: int = 0,
        variant: int = 0,
        interleave: Interleave | None = None,
    ) -> None:
        """Perform `action` on both sides. `drop_at` k > 0 with `sweep`/`startup_drain`: the reply
        of the pass's k-th move is lost (if the pass makes that many). `variant` picks among
        equivalent ways to inject a fault (which command of a release loses its reply).
        `interleave`, with `sweep`/`startup_drain`: after each move of a drain, offered the worker
        steps the list's owner may take then (see the module doc); None lets the drain go on."""
        started = time.perf_counter()
        self.steps.append(
            StepRecord(
                len(self.steps) + 1,
                action,
                self.describe(action),
                action.is_fault,
                actor_of(action, self.state),
                recovery=self.recovering,
            )
        )
        try:
            self._step(action, drop_at, variant, interleave)
        finally:
            self.seconds += time.perf_counter() - started

    def _step(
        self, action: Action, drop_at: int, variant: int, interleave: Interleave | None = None
    ) -> None:
        name = action.name
        s, i, w = action.server, action.proc, action.worker
        if action.is_fault:
            kind = f"dropped-reply:{action.command}" if name == "dropped_reply" else name
            self.counts[kind] += 1
        lost = name == "dropped_reply"
        command = action.command if lost else name

        if command in (
            "take",
            "take_suspect",
            "record",
            "release",
            "retry",
            "release_and_take",
            "reconcile",
        ):
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
                if (
                    reg is not None
                    and reg.deadline == TTL
                    and renewed(self.state, s, reg.inc)
                    and slot.model_inc == reg.inc
                    and not slot.stalled
                    and not slot.server.superseded
                ):
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
                    if ws.armed and (
                        i >= len(self.state.processes[s])
                        or self.state.processes[s][i].workers[w].phase != ARMED
                    ):
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
        for u in due[: scheduled.PROMOTE_BATCH]:
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
        self.steps.append(
            StepRecord(
                len(self.steps) + 1,
                Action(a.name, a.server, a.proc, a.worker),
                f"{a.describe()} (the model refuses it)",
                False,
                actor,
                recovery=self.recovering,
            )
        )
        try:
            accepted = self._attempt(a)
        finally:
            self.seconds += time.perf_counter() - started
        if accepted:
            raise Mismatch(
                "refusal",
                f"the model refuses it; the implementation accepted: {a.describe()} ({accepted})",
            )
        self.refusals[a.name] += 1

    def _attempt(self, a: Attempt) -> str:
        """The implementation's side of an attempt: "" if it refused, else what it did."""
        if a.name == "claim_held":
            label = f"{self.server_id(a.server)}#{len(self.steps)}"
            client = self._new_client(label)
            try:
                server = self.server_factory(
                    client,
                    self.keys,
                    self.server_id(a.server),
                    settings=self.settings,
                    clock=self.clock,
                    workers=self.bounds.workers,
                )
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
            return (
                "Redis refused the heartbeat, but the process went on as if it had been "
                "accepted (no Superseded)"
            )
        if a.name == "drain_live":
            key = self._real_key((a.server, a.inc, a.worker))
            moved = recovery.drain_inflight(
                self.admin, self.keys, key, force=False, chunk=self.settings.drain_chunk
            )
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
                slot.workers = [WorkerSlot(None, stopped=True) for _ in range(self.bounds.workers)]
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
            server = self.server_factory(
                client,
                self.keys,
                self.server_id(s),
                settings=self.settings,
                clock=self.clock,
                workers=self.bounds.workers,
            )
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
            raise Mismatch(
                "claim", f"the model lets server {s} claim its id; Redis refused: {exc}"
            ) from exc

    # -- the end of a run ----------------------------------------------------------------------

    PRIORITY = (
        "release",
        "release_and_take",
        "record",
        "reconcile",
        "restart_worker",
        "resume_server",
        "heartbeat",
        "startup_drain",
        "requeue_stuck_processing_tasks",
        "sweep",
        "promote",
        "take_suspect",
        "take",
        "claim",
        "enqueue",
        "advance_clock",
    )

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
                options = [
                    a
                    for a in options
                    if a.name != "sweep" or apply(self.state, a, self.config) != self.state
                ]
            if not options:
                raise Mismatch("eventual", "no recovery step is enabled, and the run is not done")
            options.sort(key=lambda a: self.PRIORITY.index(a.name))
            self.step(options[0])
            self.check()
            taken += 1
        self.check_eventual()
        return taken
