"""The custody protocol as a state machine: actions, when they are enabled, what they do.

Read this file as the spec.  Every action is one Redis command (or one Lua script), so the
interleavings the checker explores are exactly the interleavings Redis can see.  (``execute``,
the handler, touches no Redis: a crash or any other step just before it or just after it leads
to the same states, so it is folded into ``release``: "execute, then release".)
No I/O here: ``enabled_actions`` lists what may happen next,
``apply`` computes the next state.

Conventions (see ``state.py``):
- the queue's right end is taken next; the drains push recovered tasks back on the right, so they
  are taken next (``LMOVE list queue RIGHT RIGHT``); a take pushes on the left of the own list, so a
  list's right end is its oldest task.
- a *dropped reply* is a command that Redis executed but whose reply never reached the caller:
  the Redis side changes exactly as on success, the caller's side as on an error.
- faults (``FAULTS``) count against ``Bounds.faults``; everything else is the protocol running,
  and is what "recovery" may use once faults stop.
"""

from __future__ import annotations

from typing import NamedTuple

from .state import (
    ARMED,
    CLAIMED,
    CRASHED,
    DIRTY,
    ENQUEUED,
    HOLDING,
    IDLE,
    NO_TASK,
    POISONED,
    RECORDED,
    RUNNING,
    STARTING,
    STOPPED,
    SUPERSEDED,
    TAKEN,
    TTL,
    WAITING,
    WIPED,
    Bounds,
    Drain,
    ListKey,
    Process,
    Registration,
    State,
    Worker,
    initial_state,
    list_of,
    with_list,
)
from .variants import Variant


class Action(NamedTuple):
    """One step.  ``server``/``proc``/``worker`` say who (-1: not applicable); ``proc`` indexes
    ``state.processes[server]``; ``command`` names the command whose reply a ``dropped_reply``
    loses."""

    name: str
    server: int = -1
    proc: int = -1
    worker: int = -1
    command: str = ""
    #: the task a ``promote`` moves (the member that came due), else -1
    task: int = -1

    @property
    def is_fault(self) -> bool:
        return self.name in FAULTS


# The protocol's own steps (worker, then server) ...
# ``release_and_take``: the busy path's one round trip per task, the release of the task just
# handled and the next take in one script (see ``apply``).
WORKER_STEPS = (
    "arm", "take", "take_suspect", "record", "release", "release_and_take", "reconcile",
)
# ``promote``: a due retry moves from the scheduled set to the queue (one script, no lease: run by
# any server's periodic loop or ``taskcustody sweep``, so it needs no live process in the model).
SERVER_STEPS = (
    "count_recovery",
    "claim",
    "startup_drain",
    "heartbeat",
    "sweep",
    "drain_step",
    "requeue_stuck_processing_tasks",
    "promote",
)
# ... what the environment does that is not a fault ...
RECOVERY_STEPS = ("restart_worker", "resume_server", "advance_clock", "enqueue")
# ... and the faults.  ``redis_wipe``: Redis restarts empty (only with ``Bounds.redis_faults``).
# ``retry``: the handler failed and the release's retry branch ran (only with
# ``Bounds.handler_failures``); not a fault of the protocol's, but it counts against the same
# budget, so that once faults stop every task can still commit.
# ``cancel_before_send``: asyncio's cancellation of a worker step before its command is sent
# (only with ``Bounds.cancels_before_send``; ``command`` names the step, as a dropped reply's).
FAULTS = frozenset(
    {"dropped_reply", "crash_worker", "crash_server", "stall_server", "redis_wipe", "retry",
     "cancel_before_send"}
)
#: The worker steps a ``cancel_before_send`` may cut short: every worker command whose reply can
#: be lost, but a reconcile (cut short, it leaves the worker as it was: dirty) and an armed take
#: (its command was sent when it armed).
CANCELLABLE = ("take", "take_suspect", "release", "release_and_take")


class Config(NamedTuple):
    bounds: Bounds
    variant: Variant

    @property
    def drain_steps(self) -> bool:
        return drains_in_steps(self.bounds, self.variant)

    def initial(self) -> State:
        """The initial state within these bounds."""
        return initial_state(self.bounds)


def drains_in_steps(bounds: Bounds, variant: Variant) -> bool:
    """Whether a drain is one step per LMOVE, or a whole pass in one step.

    Every LMOVE of a bounded drain is atomic and takes a task from a dead list to the queue; the
    only thing a finer interleaving adds is *when* each of those moves happens relative to the
    dead list's owner (a stalled worker taking or releasing) and to takers of the queue.  The
    properties do not depend on that for a bounded drain (each move on its own keeps every task
    in exactly one place), so by default a pass is one step, which keeps the state space small.
    An unbounded drain is exactly where the interleaving matters (it never ends under a
    concurrent appender), so that variant drains per move.  ``Bounds.drain_steps=True`` forces
    per-move drains for every variant (slower; used by a slow test).
    """
    if bounds.drain_steps is not None:
        return bounds.drain_steps
    return not variant.drain_bounded


# --- helpers --------------------------------------------------------------------------------


def is_live(registry: tuple[Registration | None, ...], key: ListKey) -> bool:
    """A list is live iff its server is in the registry *as that incarnation*.

    Liveness as recovery sees it is registry membership: right after a prune, membership is
    exactly "deadline > now".  Between passes an expired server still looks live until the next
    prune, which is why the sweep must prune *before* it drains (variant 7).
    """
    reg = registry[key[0]]
    return reg is not None and reg.inc == key[1]


def is_dead(registry: tuple[Registration | None, ...], key: ListKey) -> bool:
    """Dead by the clock: its server is not registered with that incarnation and deadline > now."""
    reg = registry[key[0]]
    return reg is None or reg.inc != key[1] or reg.deadline == 0


def prune(registry: tuple[Registration | None, ...]) -> tuple[Registration | None, ...]:
    """``prune_inactive_servers``: drop every server whose deadline <= now."""
    return tuple(None if r is None or r.deadline == 0 else r for r in registry)


def fresh_incarnation(state: State, server: int) -> int:
    """INCR counter.  Only equality of incarnations matters, so the smallest number that nothing
    in the state mentions any more is as fresh as a counter's next value (and keeps the state
    space finite)."""
    used = set()
    reg = state.registry[server]
    if reg is not None:
        used.add(reg.inc)
    for p in state.processes:
        for proc in p:
            used.update(d.key[1] for d in proc.drains if d.key[0] == server)
    used.update(proc.inc for proc in state.processes[server])
    used.update(k[1] for k, _ in state.lists if k[0] == server)
    used.update(k[1] for k in state.records if k is not None and k[0] == server)
    used.update(k[1] for k in state.registered if k[0] == server)
    inc = 0
    while inc in used:
        inc += 1
    return inc


def _set(t: tuple, i: int, value: object) -> tuple:  # type: ignore[type-arg]
    return (*t[:i], value, *t[i + 1 :])


def with_process(state: State, s: int, i: int, proc: Process | None) -> State:
    """``state`` with process ``i`` of server ``s`` replaced by ``proc`` (removed when None)."""
    procs = state.processes[s]
    new = procs[:i] + ((proc,) if proc is not None else ()) + procs[i + 1 :]
    return state._replace(processes=_set(state.processes, s, new))


def _with_worker(state: State, s: int, i: int, w: int, worker: Worker) -> State:
    proc = state.processes[s][i]
    return with_process(state, s, i, proc._replace(workers=_set(proc.workers, w, worker)))


def registered_with(registered: tuple[ListKey, ...], *keys: ListKey) -> tuple[ListKey, ...]:
    """The registry after ``ZADD``s of ``keys`` (a sorted tuple, so equal sets compare equal)."""
    new = [k for k in keys if k not in registered]
    return tuple(sorted((*registered, *new))) if new else registered


def _register(state: State, config: Config, *keys: ListKey) -> State:
    """``ZADD registry <now>`` of ``keys``: registered, and with ``Bounds.registration_ages``
    fresh (a ZADD of a list already there renews its score)."""
    state = state._replace(registered=registered_with(state.registered, *keys))
    if config.bounds.registration_ages:
        state = state._replace(fresh=registered_with(state.fresh, *keys))
    return state


def _move_to_queue(
    state: State, key: ListKey, count: int, config: Config, by: tuple[int, int]
) -> State:
    """``count`` times ``LMOVE key queue RIGHT RIGHT``, deleting the moved tasks' processing
    records if they name this list, and counting each task's recovery (one Lua chunk of the
    drain): a task recovered once too often goes to the dead letters instead of the queue."""
    tasks = list_of(state, key)
    moved = tasks[len(tasks) - count :][::-1]  # oldest first
    records = state.records
    for t in moved:
        if records[t] == key:
            records = _set(records, t, None)
    state = state._replace(
        lists=with_list(state.lists, key, tasks[: len(tasks) - count]), records=records
    )
    for t in moved:
        state = _recovered(state, t, config, by)
    return state


def _recovered(state: State, t: int, config: Config, by: tuple[int, int]) -> State:
    """Task ``t`` was just taken out of a holder's list by recovery: count it, in the same step,
    and requeue it -- or, past ``max_recoveries``, dead-letter it as a poison pill (a task that
    kills the process that runs it would otherwise walk through the whole fleet)."""
    limit = config.bounds.max_recoveries
    if limit is None or not config.variant.counts_recoveries:
        return state._replace(queue=(*state.queue, t))
    n = state.recoveries[t] + 1
    if n > limit:
        # (the count leaves the hash for the dead letter, which keeps it)
        return state._replace(status=_set(state.status, t, POISONED),
                              recoveries=_set(state.recoveries, t, n))
    if not config.variant.counts_in_recovering_step:
        # design 11: the count is written later, by the recovering process (``count_recovery``)
        s, i = by
        proc = state.processes[s][i]
        state = with_process(state, s, i, proc._replace(
            pending_counts=(*proc.pending_counts, t)))
        return _back(state, t, config)
    state = state._replace(recoveries=_set(state.recoveries, t, n))
    return _back(state, t, config)


def _back(state: State, t: int, config: Config) -> State:
    """Where a counted recovered task goes: the suspects list's far end (it runs alone, never
    again beside the tasks it died with: ``take_suspect``), or in design 12 the queue's take end,
    beside them."""
    if config.variant.suspects_run_alone:
        return state._replace(suspects=(t, *state.suspects))
    return state._replace(queue=(*state.queue, t))


def _free_slot(state: State, s: int, i: int, w: int) -> State:
    """Worker ``w`` is clean again (idle: it holds nothing and its list is empty): if it held
    its process's suspect slot, the slot is free."""
    proc = state.processes[s][i]
    if proc.suspect == w and proc.workers[w].phase == IDLE:
        return with_process(state, s, i, proc._replace(suspect=-1))
    return state


def _settle(state: State) -> State:
    """A superseded process exits once none of its workers holds a task."""
    if not any(
        proc.phase == SUPERSEDED and all(w.phase in (CRASHED, STOPPED) for w in proc.workers)
        for procs in state.processes
        for proc in procs
    ):
        return state
    return state._replace(
        processes=tuple(
            tuple(
                proc
                for proc in procs
                if not (
                    proc.phase == SUPERSEDED
                    and all(w.phase in (CRASHED, STOPPED) for w in proc.workers)
                )
            )
            for procs in state.processes
        )
    )


# --- what may happen next ------------------------------------------------------------


def enabled_actions(state: State, config: Config) -> list[Action]:
    """Every step that may happen next in `state`: the protocol's own steps (each worker's and
    each server process's), the environment's (a worker restarts, a stalled process resumes,
    the clock advances, a late task is enqueued, a due retry is promoted) and, while
    ``config.bounds.faults`` is not used up, the faults (a dropped reply after any command that
    has one, a worker or server crash, a stall, and with their bounds a Redis wipe or a handler
    failure).

    This is the model's whole nondeterminism: the checker explores every action this returns,
    from every reachable state, and the stateful verifier drives the real implementation only
    with actions it returns. It guarantees that `apply` accepts each action it returns, that
    the list is the same for equal states (deterministic order, so a shortest counterexample is
    the same on every run), and that a step the design would refuse (a take while the process
    is still draining, a claim of a registered id) is not in it. ``config.variant`` changes
    which actions exist only where the design does (a BLPOP take has nothing to ``arm``).
    The checker's eventual-recovery property rests on it too: from every reachable state, the
    actions it offers without faults must reach the end (every task committed once, nothing
    left in any list).

    Example: one task, one worker, no faults; each state offers exactly one next step::

        config = Config(Bounds(tasks=1, servers=1, workers=1, faults=0), variant("correct"))
        state = config.initial()
        enabled_actions(state, config)        # [Action(name='take', server=0, proc=0, ...)]
        state = apply(state, Action("take", 0, 0, 0), config)
        enabled_actions(state, config)        # [Action(name='record', server=0, proc=0, ...)]
    """
    v = config.variant
    faults_left = state.faults < config.bounds.faults
    cancels = faults_left and config.bounds.cancels_before_send
    out: list[Action] = []
    add = out.append
    registry = state.registry
    for s, procs in enumerate(state.processes):
        reg = registry[s]
        for i, proc in enumerate(procs):
            # Workers run once the startup drain is done, and keep running while the process is
            # stalled: a stall stops the heartbeat and sweep loops, not the workers.
            if proc.phase >= RUNNING:
                for w, worker in enumerate(proc.workers):
                    ph = worker.phase
                    if ph in (IDLE, ARMED):
                        if state.suspects and proc.phase == RUNNING and proc.suspect < 0:
                            # The process holds no suspect: the worker's non-blocking take from
                            # the suspects list (before its take from the queue; an armed take
                            # times out first, within the block timeout).
                            add(Action("take_suspect", s, i, w))
                            if faults_left:
                                add(Action("dropped_reply", s, i, w, "take_suspect"))
                            if cancels and ph == IDLE:
                                add(Action("cancel_before_send", s, i, w, "take_suspect"))
                        if state.queue and proc.phase == RUNNING:
                            add(Action("take", s, i, w))
                            if faults_left:
                                add(Action("dropped_reply", s, i, w, "take"))
                            if cancels and ph == IDLE:
                                add(Action("cancel_before_send", s, i, w, "take"))
                        elif ph == IDLE and proc.phase == RUNNING and v.take_into_list:
                            # The queue is empty: the take pipeline registers the list and its
                            # BLMOVE blocks until a task arrives.
                            add(Action("arm", s, i, w))
                    elif ph == TAKEN:
                        # A dropped reply on record changes nothing: the record is written and
                        # the error is ignored (custody is in the list).  Not a separate action.
                        add(Action("record", s, i, w))
                    elif ph == RECORDED:
                        add(Action("release", s, i, w))
                        if faults_left and config.bounds.handler_failures:
                            add(Action("retry", s, i, w))
                        if faults_left:
                            add(Action("dropped_reply", s, i, w, "release"))
                        if cancels:
                            add(Action("cancel_before_send", s, i, w, "release"))
                        if proc.phase == RUNNING and (
                            state.queue or (state.suspects and proc.suspect in (-1, w))
                        ):
                            # The composite (one script): the release, then the next take, as
                            # long as there is something to take (else: the plain release).
                            add(Action("release_and_take", s, i, w))
                            if faults_left:
                                add(Action("dropped_reply", s, i, w, "release_and_take"))
                            if cancels:
                                add(Action("cancel_before_send", s, i, w, "release_and_take"))
                    elif ph == DIRTY:
                        add(Action("reconcile", s, i, w))
                        if faults_left and list_of(state, (s, proc.inc, w)):
                            add(Action("dropped_reply", s, i, w, "reconcile"))
                    elif ph == CRASHED and proc.phase == RUNNING:
                        add(Action("restart_worker", s, i, w))
                    if faults_left and ph not in (CRASHED, STOPPED):
                        add(Action("crash_worker", s, i, w))
            if proc.stalled:
                add(Action("resume_server", s, i))
            elif proc.phase != SUPERSEDED:
                # The server's own loops.  A dropped heartbeat reply changes nothing either: the
                # script ran; the process learns of a supersession one beat later.
                # Enabled unless it would renew an already fresh registration of ours: it then
                # re-registers (after a stall) or discovers a newer incarnation.
                if reg != (proc.inc, TTL):
                    add(Action("heartbeat", s, i))
                if proc.pending_counts:
                    add(Action("count_recovery", s, i))
                if proc.phase == CLAIMED:
                    add(Action("startup_drain", s, i))
                elif proc.drains:  # only with per-move drains: else a pass is one step
                    add(Action("drain_step", s, i))
                    if faults_left and _drain_would_move(state, proc.drains[0], v):
                        add(Action("dropped_reply", s, i, -1, "drain_step"))
                if proc.phase == RUNNING:
                    if not proc.drains and _sweep_has_work(state, s, proc, v, config.bounds):
                        add(Action("sweep", s, i))
                        if faults_left and prune(registry) != registry:
                            add(Action("dropped_reply", s, i, -1, "sweep"))
                    if _stuck_records(state, s, proc):
                        add(Action("requeue_stuck_processing_tasks", s, i))
                if faults_left:
                    add(Action("stall_server", s, i))
            if faults_left:
                add(Action("crash_server", s, i))
        # Start (or restart) a process with this id: refused while the id is registered.
        if len(procs) < config.bounds.processes_per_server and (reg is None or reg.deadline == 0):
            add(Action("claim", s))
            if faults_left:
                add(Action("dropped_reply", s, -1, -1, "claim"))
    if _clock_may_advance(state) or (config.bounds.registration_ages
                                     and _tick_ages(state)):
        add(Action("advance_clock"))
    if WAITING in state.status:
        add(Action("enqueue"))
    for t in state.scheduled:
        # any member may be the next to come due (the jittered due times are abstracted away)
        add(Action("promote", task=t))
    if faults_left and config.bounds.redis_faults:
        add(Action("redis_wipe"))
    return out


def _drain_would_move(state: State, d: Drain, v: Variant) -> bool:
    return bool(list_of(state, d.key)) and (not v.drain_bounded or d.moved < d.length)


def _sweep_has_work(state: State, s: int, proc: Process, v: Variant, bounds: Bounds) -> bool:
    registry = state.registry
    return (
        prune(registry) != registry
        or bool(_sweep_selection(state, s, proc, v))
        or bool(collectable(state, s, proc, prune(registry), v, bounds))
        or (bounds.registration_ages and _spares_fresh(state, s, proc))
    )


def _spares_fresh(state: State, s: int, proc: Process) -> bool:
    """With ``Bounds.registration_ages``: a sweep of ``proc`` would forget a list but for its
    fresh registration (empty, not its own, its owner not live). Such a sweep changes nothing,
    but it is where a collection that ignores the age differs: it is enabled, so that the
    stateful run drives it (the checker's state space does not grow: its state is the same)."""
    if not state.fresh:
        return False
    held = {k for k, _ in state.lists}
    registry = prune(state.registry)
    return any(k not in held and k[:2] != (s, proc.inc) and not is_live(registry, k)
               for k in state.fresh)


def collectable(
    state: State,
    s: int,
    proc: Process,
    registry: tuple[Registration | None, ...],
    v: Variant,
    bounds: Bounds,
) -> tuple[ListKey, ...]:
    """The registered lists that a sweep of process ``proc`` of server ``s`` forgets (given the
    pruned registry): empty, not its own, their owner not live, and (the design) no take into
    them still pending.

    The implementation cannot see a pending take; it sees the registration's age.  A take's
    pipeline registers the list (ZADD, score = now) and sends its BLMOVE in the same write, and
    Redis serves or times out a BLMOVE within the block timeout, which the grace exceeds.  So a
    registration older than the grace has no pending take behind it: that is the assumption
    ``Bounds.take_wait_bounded`` (the model's clock has no seconds, so it says it directly).
    Without it, or with a collection that forgets an empty dead list at once (design 9), a pending
    take can fill a list that recovery no longer knows.
    """
    held = {k for k, _ in state.lists}
    if bounds.registration_ages:
        # What the implementation sees: the registration's age. A pending take's is fresh (a
        # tick ends it: ``_aged``), unless takes may outwait the grace.
        fresh = set(state.fresh) if v.gc_waits_for_pending_takes else set()
        return tuple(
            k
            for k in state.registered
            if k not in held and k[:2] != (s, proc.inc) and not is_live(registry, k)
            and k not in fresh
        )
    spare_pending = v.gc_waits_for_pending_takes and bounds.take_wait_bounded
    return tuple(
        k
        for k in state.registered
        if k not in held
        and k[:2] != (s, proc.inc)
        and not is_live(registry, k)
        and not (spare_pending and _take_pending(state, k))
    )


def _take_pending(state: State, key: ListKey) -> bool:
    s, inc, w = key
    return any(p.inc == inc and p.workers[w].phase == ARMED for p in state.processes[s])


def _sweep_selection(state: State, s: int, proc: Process, v: Variant) -> tuple[Drain, ...]:
    """The lists one sweep pass drains, and the registry it leaves."""
    registry = prune(state.registry) if v.prune_before_drain else state.registry
    return tuple(
        Drain(key, len(tasks), 0)
        for key, tasks in state.lists
        if not v.sweep_skips_live or (key[:2] != (s, proc.inc) and not is_live(registry, key))
    )


def _startup_selection(state: State, s: int, proc: Process, v: Variant) -> tuple[Drain, ...]:
    return tuple(
        Drain(key, len(tasks), 0)
        for key, tasks in state.lists
        if v.startup_drains_own and key[0] == s and key[1] != proc.inc
    )


def pass_selection(state: State, action: Action, config: Config) -> set[ListKey]:
    """The lists a ``sweep`` or ``startup_drain`` about to run in ``state`` decides to drain."""
    proc = state.processes[action.server][action.proc]
    if action.name == "sweep":
        drains = _sweep_selection(state, action.server, proc, config.variant)
    else:
        drains = _startup_selection(state, action.server, proc, config.variant)
    return {d.key for d in drains}


def _stuck_records(state: State, s: int, proc: Process) -> list[int]:
    """Tasks whose processing record names a list that is not live (and not our own)."""
    return [
        t
        for t, key in enumerate(state.records)
        if key is not None and key[:2] != (s, proc.inc) and not is_live(state.registry, key)
    ]


def _clock_may_advance(state: State) -> bool:
    """Time passing matters only when it can expire somebody: a registration that no healthy
    process renews (its process crashed or stalled, or its claim's reply was lost).  Ticks while
    every registration is renewed change nothing observable, so they are not generated."""
    for s, reg in enumerate(state.registry):
        if reg is not None and reg.deadline > 0 and not renewed(state, s, reg.inc):
            return True
    return False


def _tick_ages(state: State) -> bool:
    """With ``Bounds.registration_ages``, time passing matters also when it ages a fresh
    registration of a list whose owner no healthy process renews: the collection may forget it
    then. (A take pending in such a process registered its list when it was sent, so the tick
    that ends it is one of these.) The fresh registrations of a renewed owner cannot be collected
    before a tick that expires the owner, which ages them too, and a take pending in a renewed
    process that a tick ends is sent again at once, registering the same list; so ticks for
    them alone are not generated."""
    return any(not renewed(state, k[0], k[1]) for k in state.fresh)


def renewed(state: State, s: int, inc: int) -> bool:
    """Whether a healthy process (running, not stalled, not superseded) holds this registration.

    A healthy server heartbeats much more often than the TTL, so its registration never lapses:
    the model folds those renewals into ``advance_clock`` (a renewal's timing within a tick is
    unobservable: only "deadline > now" is ever compared).  The ``heartbeat`` action is kept for
    the heartbeats that *do* something: re-registering after a stall, discovering a supersession.
    """
    return any(
        p.inc == inc and not p.stalled and p.phase != SUPERSEDED for p in state.processes[s]
    )


# --- what each action does ------------------------------------------------------------


def apply(state: State, action: Action, config: Config) -> State:
    """The state after ``action`` (which must be enabled in ``state``)."""
    v = config.variant
    name = action.name
    s, i, w = action.server, action.proc, action.worker
    if action.is_fault:
        state = state._replace(faults=state.faults + 1)
    if name == "dropped_reply":
        name = action.command
        lost = True
    else:
        lost = False

    if name == "cancel_before_send":
        return _cancelled_before_send(state, action, config)

    if name == "arm":
        # The take pipeline: ZADD registry <now> own-list, then BLMOVE, which blocks (the queue
        # is empty).  Redis serves it as soon as a task arrives: that is the ``take``.
        proc = state.processes[s][i]
        key = (s, proc.inc, w)
        if v.registry_heals:
            state = _register(state, config, key)
        return _with_worker(state, s, i, w, Worker(ARMED))

    if name == "take":
        # BLPOP design (no list): the task leaves Redis with the reply; reply lost, it exists
        # nowhere.  Else the reply lost leaves the task in our list without our knowing: reconcile
        # before the next take (a retried BLMOVE would take a second task and strand the first).
        state, t = _take_from_queue(state, s, i, w, config, into_list=v.take_into_list)
        if lost:
            return _with_worker(state, s, i, w, Worker(DIRTY if v.take_into_list else IDLE))
        return _with_worker(state, s, i, w, Worker(TAKEN, t))

    if name == "take_suspect":
        state, t = _take_suspect(state, s, i, w, config)
        return _with_worker(state, s, i, w, Worker(DIRTY) if lost else Worker(TAKEN, t))

    if name == "record":
        t = state.processes[s][i].workers[w].task
        state = _record(state, s, i, w, t, config, executes=True)
        return _with_worker(state, s, i, w, Worker(RECORDED, t))

    if name in ("release", "retry"):
        # execute: the handler runs (no Redis; it always succeeds here: a failed handler's retry
        # re-enqueues the task, which the protocol treats like any enqueue); then the release,
        # in a finally.
        proc = state.processes[s][i]
        state, debris = _release(state, s, i, w, config, retry=name == "retry",
                                 checks_custody=True)
        if proc.phase == SUPERSEDED:
            worker = Worker(STOPPED)
            if not lost and not debris and proc.suspect == w:
                # clean, as after any release whose end it saw: the suspect slot is free (the
                # worker stops all the same)
                state = with_process(state, s, i, state.processes[s][i]._replace(suspect=-1))
        elif lost and not v.cut_short_release_dirty:
            worker = Worker(IDLE)  # design 16: a release it did not see end taken as one that ran
        elif lost or debris:
            worker = Worker(DIRTY)  # reply lost, or debris left in our list: reconcile first
        else:
            worker = Worker(IDLE)  # held or not, we are done with it; not held = no commit
        return _settle(_free_slot(_with_worker(state, s, i, w, worker), s, i, w))

    if name == "release_and_take":
        # The busy path's cycle (issue 13: one round trip per task).  One script
        # (RELEASE_AND_TAKE): the release of the task just handled, exactly as ``release``; then,
        # only if the own list is empty after it (no debris), the next take: the oldest suspect
        # if this worker may take one (its process holds no suspect, or the slot is this worker's,
        # whose suspect it is releasing now), as ``take_suspect``; else the queue's next task,
        # ``ZADD`` the registration, ``LMOVE queue own-list``, ``HSET`` the record, as ``take``
        # and ``record`` with nothing between them.  Nothing of another client can come between
        # the two halves either: the composite is exactly release, then take, then record, and
        # adds no state the three steps in a row do not reach (tests/model/test_transitions.py
        # keeps the two in step).  What it changes is the fault: a lost reply is a lost reply of
        # both halves.  Redis ran all of it; the worker knows neither whether it committed nor
        # what it holds now, so it is dirty, and its reconcile drains the new task back (and
        # counts that as a recovery, as every reconcile does).  The new task's handler never
        # started, so no execution is counted.  A superseded process takes nothing: it uses the
        # plain release (so does a worker that finds the queue empty, or is stopping).
        proc = state.processes[s][i]
        slot_was_ours = proc.suspect == w
        state, debris = _release(state, s, i, w, config, retry=False,
                                 checks_custody=v.composite_checks_custody)
        t = NO_TASK
        if not debris:
            if state.suspects and proc.suspect in (-1, w):
                # (the slot passes to the new suspect)
                state, t = _take_suspect(state, s, i, w, config)
            elif state.queue:
                state, t = _take_from_queue(
                    state, s, i, w, config,
                    into_list=v.take_into_list and v.composite_takes_into_list,
                )
                if slot_was_ours and not lost:
                    # clean between the halves, and what it takes now is no suspect
                    state = with_process(state, s, i, state.processes[s][i]._replace(suspect=-1))
        if t != NO_TASK:
            state = _record(state, s, i, w, t, config, executes=not lost)
        if lost or debris:
            worker = Worker(DIRTY)
        elif t == NO_TASK:
            worker = Worker(IDLE)  # nothing to take: just the release
        else:
            worker = Worker(RECORDED, t)  # the handler starts
        return _free_slot(_with_worker(state, s, i, w, worker), s, i, w)

    if name == "reconcile":
        # Drain the own list: we hold nothing, so whatever is there is debris (a take whose
        # reply was lost).  Nobody else appends to it, so draining it whole is one bounded drain.
        proc = state.processes[s][i]
        key = (s, proc.inc, w)
        state = _move_to_queue(state, key, len(list_of(state, key)), config, (s, i))
        return _free_slot(_with_worker(state, s, i, w, Worker(DIRTY if lost else IDLE)), s, i, w)

    if name == "crash_worker":
        return _settle(_with_worker(state, s, i, w, Worker(CRASHED)))

    if name == "restart_worker":
        # The supervisor restarts it; it reconciles before its first take.
        return _with_worker(state, s, i, w, Worker(DIRTY))

    if name == "heartbeat":
        proc = state.processes[s][i]
        reg = state.registry[s]
        if reg is None or reg.inc == proc.inc:
            # Ours, or nobody's (we were pruned while stalled, or Redis lost the registry):
            # (re)register; a registration found gone also re-registers our lists.
            if reg is None and v.registry_heals:
                state = _register(state, config,
                                  *((s, proc.inc, w) for w in range(len(proc.workers))))
            return state._replace(
                registry=_set(state.registry, s, Registration(proc.inc, TTL))
            )
        # Superseded by a newer incarnation of our id: stop taking, finish, exit.
        workers = tuple(
            Worker(STOPPED) if wk.phase in (IDLE, DIRTY, ARMED) or proc.phase < RUNNING else wk
            for wk in proc.workers
        )
        proc = proc._replace(phase=SUPERSEDED, drains=(), workers=workers)
        return _settle(with_process(state, s, i, proc))

    if name == "claim":
        # Refused while the id is registered; else a new incarnation takes the id, and (in the
        # same script) its lists are registered: before any of them can hold a task, and so
        # that a status shows idle workers too.  (The old design registered only here; the
        # design registers again with every take.)
        inc = fresh_incarnation(state, s)
        state = _register(state._replace(registry=_set(state.registry, s, Registration(inc, TTL))),
                          config, *((s, inc, w) for w in range(config.bounds.workers)))
        if lost:
            # The claim ran but its reply was lost: the process gives up; the registration
            # stays behind with nobody heart-beating it, and expires (and its lists, empty, are
            # collected).
            return state
        workers = tuple(Worker(IDLE) for _ in range(config.bounds.workers))
        proc = Process(inc, False, CLAIMED, (), workers)
        return state._replace(
            processes=_set(state.processes, s, (*state.processes[s], proc))
        )

    if name == "startup_drain":
        # include_self=True: the earlier incarnations of our id are debris (our own new lists
        # are empty).  Workers start once these drains are done.
        proc = state.processes[s][i]
        drains = _startup_selection(state, s, proc, v)
        proc = proc._replace(phase=STARTING if drains else RUNNING, drains=drains)
        return _finish_pass(with_process(state, s, i, proc), s, i, config)

    if name == "sweep":
        # One pass: prune_inactive_servers, then select every list that is not live and not
        # ours, reading each list's length up front.
        proc = state.processes[s][i]
        drains = _sweep_selection(state, s, proc, v)
        state = state._replace(registry=prune(state.registry))
        if lost:
            drains = ()  # the prune ran; its reply was lost; the pass is abandoned
        else:
            # The garbage collection of the registry (one atomic check-and-ZREM per batch of
            # lists; when in the pass it runs does not matter, since each list is re-checked in
            # the step that forgets it).
            garbage = collectable(state, s, proc, state.registry, v, config.bounds)
            if garbage:
                state = state._replace(
                    registered=tuple(k for k in state.registered if k not in garbage),
                    fresh=tuple(k for k in state.fresh if k not in garbage),
                )
        return _finish_pass(with_process(state, s, i, proc._replace(drains=drains)), s, i, config)

    if name == "drain_step":
        # One LMOVE of the drain in progress (drains are steps so that appenders interleave).
        proc = state.processes[s][i]
        d, rest = proc.drains[0], proc.drains[1:]
        moves = _drain_would_move(state, d, v)
        if moves:
            state = _move_to_queue(state, d.key, 1, config, (s, i))
            d = d._replace(moved=d.moved + 1)
        done = not moves or (v.drain_bounded and d.moved >= d.length)
        drains = rest if done else (d, *rest)
        if lost:
            drains = ()  # the move ran; its reply was lost; the pass is abandoned
            if proc.phase == STARTING:
                proc = proc._replace(phase=CLAIMED)  # the startup drain starts over
        if proc.phase == STARTING and not drains:
            proc = proc._replace(phase=RUNNING)
        return with_process(state, s, i, proc._replace(drains=drains))

    if name == "requeue_stuck_processing_tasks":
        # For each record whose list is not live, one Lua step: LREM the task from that list;
        # only if it was there, push it back to the queue; HDEL the record.
        proc = state.processes[s][i]
        for t in _stuck_records(state, s, proc):
            holder = state.records[t]
            assert holder is not None
            tasks = list_of(state, holder)
            if not v.processing_sweep_removes_custody:
                state = state._replace(queue=(*state.queue, t))  # broken: custody kept too
            elif t in tasks:
                state = state._replace(
                    lists=with_list(state.lists, holder, tuple(x for x in tasks if x != t)),
                )
                state = _recovered(state, t, config, (s, i))
            state = state._replace(records=_set(state.records, t, None))
        return state

    if name == "promote":
        # One script (PROMOTE): ZREM the due member from the scheduled set and, only if that
        # removed it, LPUSH it where a retry goes: the suspects list if it has a recovery count
        # (it still runs alone), else the queue.  Two promoters race only on the ZREM.
        t = action.task
        if v.promotion_moves:
            state = state._replace(scheduled=tuple(x for x in state.scheduled if x != t))
        if (config.bounds.max_recoveries is not None and v.counts_recoveries
                and v.suspects_run_alone and state.recoveries[t] >= 1):
            return state._replace(suspects=(t, *state.suspects))
        return state._replace(queue=(t, *state.queue))

    if name == "count_recovery":
        # design 11's second step: write the counts of what this process recovered
        proc = state.processes[s][i]
        recoveries = state.recoveries
        for t in proc.pending_counts:
            recoveries = _set(recoveries, t, recoveries[t] + 1)
        state = state._replace(recoveries=recoveries)
        return with_process(state, s, i, proc._replace(pending_counts=()))

    if name == "crash_server":
        return with_process(state, s, i, None)

    if name == "stall_server":
        proc = state.processes[s][i]
        state = state._replace(stalled_ever=True)
        return with_process(state, s, i, proc._replace(stalled=True))

    if name == "resume_server":
        proc = state.processes[s][i]
        return with_process(state, s, i, proc._replace(stalled=False))

    if name == "enqueue":
        # The producer's LPUSH of the next task that was not enqueued yet.
        t = state.status.index(WAITING)
        return state._replace(queue=(t, *state.queue), status=_set(state.status, t, ENQUEUED))

    if name == "redis_wipe":
        # Redis restarts empty: queue, in-flight lists, both registries, processing records,
        # counters and scripts are gone, and every client connection breaks.  Tasks that were
        # enqueued and not committed are Redis's loss (``WIPED``), counted apart.  Every running
        # worker finds its connection broken: its next command fails, so it is dirty and
        # reconciles before it takes again; a worker that held a task holds one Redis no longer
        # has, and whatever its release does finds no custody and commits nothing (a superseded
        # process's workers just stop).  Processes keep running; their next heartbeat registers
        # them again, with their lists.
        status = tuple(
            WIPED if st == ENQUEUED and state.committed[t] == 0 else st
            for t, st in enumerate(state.status)
        )
        processes = tuple(
            tuple(
                p._replace(
                    drains=(),
                    phase=CLAIMED if p.phase == STARTING else p.phase,
                    workers=tuple(
                        wk
                        if wk.phase in (CRASHED, STOPPED) or p.phase < RUNNING  # not started
                        else Worker(STOPPED if p.phase == SUPERSEDED else DIRTY)
                        for wk in p.workers
                    ),
                )
                for p in procs
            )
            for procs in state.processes
        )
        return _settle(state._replace(
            queue=(),
            suspects=(),
            scheduled=(),
            lists=(),
            records=(None,) * len(state.records),
            registry=(None,) * len(state.registry),
            registered=(),
            fresh=(),
            recoveries=(0,) * len(state.recoveries),  # the counts were in Redis too
            processes=processes,
            status=status,
            stalled_ever=True,  # every live server looks dead until its next heartbeat
        ))

    if name == "advance_clock":
        state = state._replace(
            registry=tuple(
                None
                if r is None
                else r
                if renewed(state, s, r.inc)
                else r._replace(deadline=max(0, r.deadline - 1))
                for s, r in enumerate(state.registry)
            )
        )
        if config.bounds.registration_ages:
            state = _aged(state, config)
        return state

    raise ValueError(f"unknown action {action!r}")


def _aged(state: State, config: Config) -> State:
    """``Bounds.registration_ages``: a tick ages every registration (none is fresh any more)
    and, if takes are served or time out within the grace (``take_wait_bounded``), ends every
    pending take: whatever was not served timed out (Redis answered nil), and its worker is idle
    again; its production loop sends the take again, which is an ``arm`` (or a ``take``) that
    registers the list again."""
    state = state._replace(fresh=())
    if not config.bounds.take_wait_bounded:
        return state
    processes = state.processes
    for s, procs in enumerate(processes):
        for i, proc in enumerate(procs):
            if any(wk.phase == ARMED for wk in proc.workers):
                state = with_process(state, s, i, proc._replace(workers=tuple(
                    Worker(IDLE) if wk.phase == ARMED else wk for wk in proc.workers)))
    return state


def _cancelled_before_send(state: State, action: Action, config: Config) -> State:
    """asyncio's fault: the step ``action.command`` is cancelled at an await before its command
    is sent. Nothing moves in Redis: no take, no registration, no release, no commit. What the
    worker did before the send stands: a take of a suspect (and a composite that asks for one)
    took its process's suspect slot, which it keeps until it is clean again. The worker cannot
    tell a cancellation before the send from one with the reply in flight (the model's lost
    reply), so it reacts as to that: it is dirty, and reconciles before its next take (which
    finds its list as it was: a task it held goes back to the queue, counted as a recovery, as
    after a crash). A superseded process's worker stops, as after a lost release. Design 16 takes
    a cancelled release for one that ran instead: idle, with its task still in its list."""
    s, i, w = action.server, action.proc, action.worker
    proc = state.processes[s][i]
    command = action.command
    suspect = proc.suspect
    if command == "take_suspect":
        suspect = w
    elif command == "release_and_take":
        held = proc.workers[w].task
        debris = [t for t in list_of(state, (s, proc.inc, w)) if t != held]
        if state.suspects and not debris and proc.suspect in (-1, w):
            suspect = w  # it asks for a suspect: the slot is taken before the send
    if suspect != proc.suspect:
        state = with_process(state, s, i, proc._replace(suspect=suspect))
    if command == "release" and proc.phase == SUPERSEDED:
        worker = Worker(STOPPED)
    elif command == "release" and not config.variant.cut_short_release_dirty:
        worker = Worker(IDLE)
    else:
        worker = Worker(DIRTY)
    return _settle(_free_slot(_with_worker(state, s, i, w, worker), s, i, w))


# --- the worker's scripts (shared by the steps and the composite ``release_and_take``) ---------


def _take_from_queue(
    state: State, s: int, i: int, w: int, config: Config, into_list: bool
) -> tuple[State, int]:
    """The take's Redis side: the queue's next task, and the task."""
    v = config.variant
    proc = state.processes[s][i]
    t = state.queue[-1]
    state = state._replace(queue=state.queue[:-1])
    if into_list:
        # The take pipeline: ZADD registry <now> own-list (so that no task can enter a list
        # recovery does not know, even after Redis lost the registry), then BLMOVE queue
        # own-list RIGHT LEFT: taking and recording who took it is one step.  A pending take
        # (ARMED) registered when it was sent.
        key = (s, proc.inc, w)
        if v.registry_heals and proc.workers[w].phase != ARMED:
            state = _register(state, config, key)
        state = state._replace(lists=with_list(state.lists, key, (t, *list_of(state, key))))
    # else BLPOP (or design 14's composite): the task leaves Redis with the reply
    return state, t


def _take_suspect(state: State, s: int, i: int, w: int, config: Config) -> tuple[State, int]:
    """One script (TAKE_SUSPECT): ZADD registry <now> own-list, LMOVE suspects own-list RIGHT
    LEFT, HSET the processing record.  The process's suspect slot is taken before it is sent and
    is freed only once this worker is clean again (idle, its list known empty)."""
    proc = state.processes[s][i]
    t = state.suspects[-1]
    key = (s, proc.inc, w)
    state = _register(state, config, key)._replace(
        suspects=state.suspects[:-1],
        lists=with_list(state.lists, key, (t, *list_of(state, key))),
        records=_set(state.records, t, key),
    )
    return with_process(state, s, i, proc._replace(suspect=w)), t


def _record(state: State, s: int, i: int, w: int, t: int, config: Config, executes: bool) -> State:
    """One Lua step: HSET the record only if the task is still in our list.  An unconditional
    HSET is wrong: a stalled worker whose task was drained and re-taken elsewhere would overwrite
    the new holder's record with one naming its own list; once its server re-registers that list
    is live again, so no sweep ever deletes the stale record.  (Found by this checker: correct
    variant, 2 tasks, faults=2.)  With the check, a record always names the list that holds its
    task.  (BLPOP design: no list to check.)  ``executes``: the handler starts now (the model
    folds its end into the release)."""
    v = config.variant
    key = (s, state.processes[s][i].inc, w)
    if not v.take_into_list or t in list_of(state, key):
        state = state._replace(records=_set(state.records, t, key))
    if executes and config.bounds.max_recoveries is not None:
        state = state._replace(executions=_set(state.executions, t, state.executions[t] + 1))
    return state


def _release(
    state: State, s: int, i: int, w: int, config: Config, retry: bool, checks_custody: bool
) -> tuple[State, bool]:
    """The release script's Redis side, for the task worker ``w`` holds: LREM own-list task 1;
    HDEL the record if it names this list; commit if (and only if) the task was still ours (or,
    ``retry``, the retry branch).  Returns the state and whether the own list still holds
    something (debris) afterwards: the script returns (held, remaining length).
    ``checks_custody=False``: design 15's composite, which commits whatever its LREM found."""
    v = config.variant
    proc = state.processes[s][i]
    t = proc.workers[w].task
    key = (s, proc.inc, w)
    tasks = list_of(state, key)
    if not v.take_into_list:
        held = True  # BLPOP design: the task is in our hands; nobody else can have it
    elif v.release_removes_custody:
        held = t in tasks
        if held:
            tasks = tuple(x for x in tasks if x != t)
            state = state._replace(lists=with_list(state.lists, key, tasks))
    else:
        held = True  # broken: no LREM, so the script cannot tell, and commits
    if not checks_custody:
        held = True
    if state.records[t] == key:
        state = state._replace(records=_set(state.records, t, None))
    if held and retry:
        # The handler failed: the same script's retry branch ZADDs the task to the scheduled
        # set (score: the due time the worker computed, now + the jittered backoff).  It
        # keeps its recovery count.  The failed execution is bounded by max_attempts, not by
        # max_recoveries, so it does not count towards ``bounded_executions``.
        state = state._replace(scheduled=tuple(sorted({*state.scheduled, t})))
        if config.bounds.max_recoveries is not None:
            state = state._replace(
                executions=_set(state.executions, t, state.executions[t] - 1))
    elif held:
        # a commit also deletes the task's recovery count: a task that completes leaves none
        state = state._replace(
            committed=_set(state.committed, t, state.committed[t] + 1),
            recoveries=_set(state.recoveries, t, 0),
        )
    return state, bool(tasks)


def _finish_pass(state: State, s: int, i: int, config: Config) -> State:
    """Without per-move drains, a pass runs to its end in the step that starts it."""
    if config.drain_steps:
        return state
    while state.processes[s][i].drains:
        state = apply(state, Action("drain_step", s, i), config)
    return state


def worker_task(state: State, s: int, i: int, w: int) -> int:
    """The task a worker believes it holds, or NO_TASK."""
    worker = state.processes[s][i].workers[w]
    return worker.task if worker.phase in HOLDING else NO_TASK
