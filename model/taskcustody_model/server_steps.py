"""A server process's steps and its sweeper's: guards (``process_steps``, ``sweeper_steps``,
``claim_steps``, ``promote_steps``) and effects.

A process claims its server id, runs its startup drain (``include_self=True``), and then, while
its workers run, heartbeats and sweeps (``include_self=False``): see ``selection.py`` for what
each pass selects.  A stall stops the heartbeat and sweep loops, not the workers; a superseded
process runs none of them (its workers finish, then it exits).
"""

from __future__ import annotations

from .action import Action, Config
from .custody import (
    fresh_incarnation,
    move_to_queue,
    prune,
    recovered,
    register,
    set_at,
    settle,
    with_process,
)
from .selection import (
    INCLUDE_SELF,
    collectable,
    drain_would_move,
    lists_to_recover,
    stuck_records,
    sweep_has_work,
)
from .state import (
    ARMED,
    CLAIMED,
    DIRTY,
    IDLE,
    RUNNING,
    STARTING,
    STOPPED,
    SUPERSEDED,
    TTL,
    Process,
    Registration,
    State,
    Worker,
    list_of,
    with_list,
)

#: Not a process (yet, or any more): before its claim, after its crash or exit.
NO_PROCESS = -1
#: A superseded process exits once none of its workers holds a task (``custody.settle``, run by
#: whichever step stops its last worker): the row of ``PROCESS_TRANSITIONS`` that no step makes.
EXIT = "exit"
_ALIVE = (CLAIMED, STARTING, RUNNING)

#: (phase, step, phase after): a server process's life, every step that acts on a process in
#: each phase (those that keep the phase too, so that every process step has a row).  Guards are
#: ``process_steps`` and ``sweeper_steps``; ``tests/model/test_diagram.py`` checks over explored
#: state spaces that every change the effects make is listed.
PROCESS_TRANSITIONS: tuple[tuple[int, str, int], ...] = (
    (NO_PROCESS, "claim", CLAIMED),  # its reply lost: no process, a registration left behind
    (CLAIMED, "startup_drain", RUNNING),  # nothing to drain, or a pass in one step
    (CLAIMED, "startup_drain", STARTING),  # per-move drains: the moves follow
    (STARTING, "drain_step", STARTING),
    (STARTING, "drain_step", RUNNING),
    (STARTING, "drain_step", CLAIMED),  # its reply lost: the startup drain starts over
    (RUNNING, "drain_step", RUNNING),
    (RUNNING, "sweep", RUNNING),
    (RUNNING, "requeue_stuck_processing_tasks", RUNNING),
    # design 11: the counts a running process's recoveries owe
    (RUNNING, "count_recovery", RUNNING),
    *((ph, "heartbeat", ph) for ph in _ALIVE),  # renews, or registers again
    *((ph, "heartbeat", SUPERSEDED) for ph in _ALIVE),  # a newer incarnation holds the id
    *((ph, "stall_server", ph) for ph in _ALIVE),  # its loops stop, its workers run on
    *((ph, "resume_server", ph) for ph in _ALIVE),
    (STARTING, "redis_wipe", CLAIMED),  # its drains are gone: the startup drain starts over
    *((ph, "crash_server", NO_PROCESS) for ph in (*_ALIVE, SUPERSEDED)),
    (SUPERSEDED, EXIT, NO_PROCESS),
)


# --- guards -------------------------------------------------------------------------------------


def process_steps(state: State, config: Config, s: int, i: int) -> list[Action]:
    """The process's own loops: a stalled one can only resume; a superseded one runs none.
    Else a heartbeat unless it would only renew an already fresh registration of ours (it then
    re-registers after a stall, or discovers a newer incarnation); the write of recovery counts
    it owes (design 11); and, once claimed, its startup drain."""
    proc = state.processes[s][i]
    if proc.stalled:
        return [Action("resume_server", s, i)]
    if proc.phase == SUPERSEDED:
        return []
    out: list[Action] = []
    if state.registry[s] != (proc.inc, TTL):
        out.append(Action("heartbeat", s, i))
    if proc.pending_counts:
        out.append(Action("count_recovery", s, i))
    if proc.phase == CLAIMED:
        out.append(Action("startup_drain", s, i))
    return out


def sweeper_steps(state: State, config: Config, s: int, i: int) -> list[Action]:
    """The recovery loops of a process that is neither stalled nor superseded: the next move
    of a pass in progress (only with per-move drains: else a pass is one step); once running, a
    sweep pass when it has work (something to prune, drain or forget), and the processing sweep
    when a record names a list that is not live."""
    proc = state.processes[s][i]
    if proc.stalled or proc.phase == SUPERSEDED:
        return []
    out: list[Action] = []
    if proc.phase != CLAIMED and proc.drains:
        out.append(Action("drain_step", s, i))
    if proc.phase == RUNNING:
        if not proc.drains and sweep_has_work(state, s, proc, config.variant, config.bounds):
            out.append(Action("sweep", s, i))
        if stuck_records(state, s, proc):
            out.append(Action("requeue_stuck_processing_tasks", s, i))
    return out


def claim_steps(state: State, config: Config, s: int) -> list[Action]:
    """Start (or restart) a process with id ``s``: refused while the id is registered, and at
    most ``Bounds.processes_per_server`` at once."""
    reg = state.registry[s]
    if len(state.processes[s]) < config.bounds.processes_per_server and (
        reg is None or reg.deadline == 0
    ):
        return [Action("claim", s)]
    return []


def promote_steps(state: State) -> list[Action]:
    """Any scheduled retry may be the next to come due (the jittered due times are abstracted
    away); any server's periodic loop promotes it, so it needs no live process here."""
    return [Action("promote", task=t) for t in state.scheduled]


# --- the server process's effects ---------------------------------------------------------------


def claim(state: State, action: Action, config: Config, lost: bool) -> State:
    """The id is not registered: a new incarnation takes it and, in the same script, registers
    its workers' lists (before any can hold a task).  Reply lost: the process gives up, and the
    registration it leaves expires (its lists, empty, are collected)."""
    # (The old design registered only here; the design registers again with every take.)
    s = action.server
    inc = fresh_incarnation(state, s)
    state = register(
        state._replace(registry=set_at(state.registry, s, Registration(inc, TTL))),
        config,
        *((s, inc, w) for w in range(config.bounds.workers)),
    )
    if lost:
        return state
    workers = tuple(Worker(IDLE) for _ in range(config.bounds.workers))
    proc = Process(inc, False, CLAIMED, (), workers)
    return state._replace(processes=set_at(state.processes, s, (*state.processes[s], proc)))


def heartbeat(state: State, action: Action, config: Config, lost: bool) -> State:
    """Registered as us, or not at all: (re)register (a registration found gone also
    re-registers our lists).  A newer incarnation holds the id: we are superseded, stop taking,
    finish and exit.  (A lost reply changes nothing: we learn of a supersession one beat later.)"""
    s, i = action.server, action.proc
    proc = state.processes[s][i]
    reg = state.registry[s]
    if reg is None or reg.inc == proc.inc:
        # Ours, or nobody's (we were pruned while stalled, or Redis lost the registry).
        if reg is None and config.variant.registry_heals:
            state = register(state, config, *((s, proc.inc, w) for w in range(len(proc.workers))))
        return state._replace(registry=set_at(state.registry, s, Registration(proc.inc, TTL)))
    workers = tuple(
        Worker(STOPPED) if wk.phase in (IDLE, DIRTY, ARMED) or proc.phase < RUNNING else wk
        for wk in proc.workers
    )
    proc = proc._replace(phase=SUPERSEDED, drains=(), workers=workers)
    return settle(with_process(state, s, i, proc))


def count_recovery(state: State, action: Action, config: Config, lost: bool) -> State:
    """The process owes recovery counts (design 11 only: its recoveries did not write them):
    write them, in a step of their own, after the step that recovered the tasks."""
    s, i = action.server, action.proc
    proc = state.processes[s][i]
    recoveries = state.recoveries
    for t in proc.pending_counts:
        recoveries = set_at(recoveries, t, recoveries[t] + 1)
    state = state._replace(recoveries=recoveries)
    return with_process(state, s, i, proc._replace(pending_counts=()))


def resume_server(state: State, action: Action, config: Config, lost: bool) -> State:
    """A stalled process resumes (its loops run again; its next heartbeat tells it where it
    stands)."""
    s, i = action.server, action.proc
    return with_process(state, s, i, state.processes[s][i]._replace(stalled=False))


# --- the sweeper's effects: the passes, their moves, promotion -----------------------------------


def startup_drain(state: State, action: Action, config: Config, lost: bool) -> State:
    """Claimed: select the earlier incarnations' lists of our own id (``include_self=True``:
    debris, since our own new lists are empty) and drain them; the workers start once the
    drains are done."""
    s, i = action.server, action.proc
    proc = state.processes[s][i]
    drains = lists_to_recover(
        state, s, proc, config.variant, include_self=INCLUDE_SELF["startup_drain"]
    )
    proc = proc._replace(phase=STARTING if drains else RUNNING, drains=drains)
    return finish_pass(with_process(state, s, i, proc), s, i, config)


def sweep(state: State, action: Action, config: Config, lost: bool) -> State:
    """Running, with work: one pass prunes expired servers, selects every list neither live nor
    ours (``include_self=False``) with its length read up front, collects the registry's dead
    empty lists and drains the selection.  Prune's reply lost: the pass is abandoned."""
    v = config.variant
    s, i = action.server, action.proc
    proc = state.processes[s][i]
    drains = lists_to_recover(state, s, proc, v, include_self=INCLUDE_SELF["sweep"])
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
    return finish_pass(with_process(state, s, i, proc._replace(drains=drains)), s, i, config)


def drain_step(state: State, action: Action, config: Config, lost: bool) -> State:
    """A pass in progress: one ``LMOVE`` of its first drain (drains are steps so that appenders
    interleave); a drain ends when its list is empty or, bounded, after the moves it read up
    front.  Reply lost: the pass is abandoned (a startup drain starts over)."""
    v = config.variant
    s, i = action.server, action.proc
    proc = state.processes[s][i]
    d, rest = proc.drains[0], proc.drains[1:]
    moves = drain_would_move(state, d, v)
    if moves:
        state = move_to_queue(state, d.key, 1, config, (s, i))
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


def finish_pass(state: State, s: int, i: int, config: Config) -> State:
    """Without per-move drains, a pass runs to its end in the step that starts it."""
    if config.drain_steps:
        return state
    while state.processes[s][i].drains:
        state = drain_step(state, Action("drain_step", s, i), config, False)
    return state


def requeue_stuck_processing_tasks(
    state: State, action: Action, config: Config, lost: bool
) -> State:
    """A record names a list that is not live (and not ours): for each, one Lua step removes
    the task from that list and, only if it was there, requeues it (counted); the record goes."""
    v = config.variant
    s, i = action.server, action.proc
    proc = state.processes[s][i]
    for t in stuck_records(state, s, proc):
        holder = state.records[t]
        assert holder is not None
        tasks = list_of(state, holder)
        if not v.processing_sweep_removes_custody:
            state = state._replace(queue=(*state.queue, t))  # broken: custody kept too
        elif t in tasks:
            state = state._replace(
                lists=with_list(state.lists, holder, tuple(x for x in tasks if x != t)),
            )
            state = recovered(state, t, config, (s, i))
        state = state._replace(records=set_at(state.records, t, None))
    return state


def promote(state: State, action: Action, config: Config, lost: bool) -> State:
    """A scheduled retry came due: one script ``ZREM``s it and, only if that removed it,
    ``LPUSH``es it where a retry goes: the suspects list if it has a recovery count (it still
    runs alone), else the queue.  Two promoters race only on the ``ZREM``."""
    v = config.variant
    t = action.task
    if v.promotion_moves:
        state = state._replace(scheduled=tuple(x for x in state.scheduled if x != t))
    if (
        config.bounds.max_recoveries is not None
        and v.counts_recoveries
        and v.suspects_run_alone
        and state.recoveries[t] >= 1
    ):
        return state._replace(suspects=(t, *state.suspects))
    return state._replace(queue=(t, *state.queue))
