"""The faults: when each may strike (within ``Bounds.faults``) and what it does.

Two kinds.  A fault that strikes *a step* (``fault_companions``): a ``dropped_reply`` loses the
reply of a step whose command has one (``LOSES_REPLY``, each with when its loss is worth
exploring), a ``cancel_before_send`` cuts a ``CANCELLABLE`` worker step short before its command
is sent, a ``retry`` is the release of a failed handler.  Each is offered right after the step it
strikes, and its effect is that step's (``protocol.apply`` runs the step's effect with
``lost=True``) but for ``cancel_before_send``'s own.  A fault that strikes *an actor*
(``worker_faults``, ``process_faults``, ``redis_faults``): a worker crashes, a process stalls or
crashes, Redis restarts empty.
"""

from __future__ import annotations

from collections.abc import Callable

from .action import CANCELLABLE, Action, Config
from .custody import free_slot, prune, settle, with_process, with_worker
from .selection import drain_would_move
from .state import (
    ARMED,
    CLAIMED,
    CRASHED,
    DIRTY,
    ENQUEUED,
    IDLE,
    RECORDED,
    RUNNING,
    STARTING,
    STOPPED,
    SUPERSEDED,
    TAKEN,
    WIPED,
    State,
    Worker,
    list_of,
)

#: When a lost reply of a step is worth exploring: (state, config, the step) -> bool.
Observable = Callable[[State, Config, Action], bool]


def _always(state: State, config: Config, step: Action) -> bool:
    return True


def _reconcile_moves(state: State, config: Config, step: Action) -> bool:
    """A reconcile's lost reply matters only if its drain moves something."""
    proc = state.processes[step.server][step.proc]
    return bool(list_of(state, (step.server, proc.inc, step.worker)))


def _drain_moves(state: State, config: Config, step: Action) -> bool:
    """A drain move's lost reply matters only if the move moves a task."""
    proc = state.processes[step.server][step.proc]
    return drain_would_move(state, proc.drains[0], config.variant)


def _prune_prunes(state: State, config: Config, step: Action) -> bool:
    """A sweep's lost reply (its prune's) matters only if the prune removes somebody."""
    return prune(state.registry) != state.registry


#: The steps whose reply a ``dropped_reply`` may lose, and when that loss is worth exploring.
#: Not here: ``record`` (the record is written and the error ignored: custody is in the list),
#: ``heartbeat`` (the script ran; the process learns of a supersession one beat later), ``arm``
#: (its reply is the take's), the processing sweep and promotion (not faults of the model).
LOSES_REPLY: dict[str, Observable] = {
    "take_suspect": _always,
    "take": _always,
    "release": _always,
    "release_and_take": _always,
    "reconcile": _reconcile_moves,
    "drain_step": _drain_moves,
    "sweep": _prune_prunes,
    "claim": _always,
}


def fault_companions(state: State, config: Config, step: Action) -> list[Action]:
    """The faults that may strike ``step`` (which is enabled in ``state``), in the order they
    are offered: a failed handler's release, a lost reply, a cancellation before the send (not
    of an armed take: its command was sent when it armed)."""
    if state.faults >= config.bounds.faults:
        return []
    out: list[Action] = []
    name = step.name
    if name == "release" and config.bounds.handler_failures:
        out.append(Action("retry", step.server, step.proc, step.worker))
    observable = LOSES_REPLY.get(name)
    if observable is not None and observable(state, config, step):
        out.append(Action("dropped_reply", step.server, step.proc, step.worker, name))
    if (
        config.bounds.cancels_before_send
        and name in CANCELLABLE
        and state.processes[step.server][step.proc].workers[step.worker].phase != ARMED
    ):
        out.append(Action("cancel_before_send", step.server, step.proc, step.worker, name))
    return out


def worker_faults(state: State, config: Config, s: int, i: int, w: int) -> list[Action]:
    """A worker that is neither crashed nor stopped may crash (between two commands)."""
    if state.faults < config.bounds.faults and state.processes[s][i].workers[w].phase not in (
        CRASHED,
        STOPPED,
    ):
        return [Action("crash_worker", s, i, w)]
    return []


def process_faults(state: State, config: Config, s: int, i: int) -> list[Action]:
    """A process may stall (unless stalled already, or superseded) and may crash."""
    if state.faults >= config.bounds.faults:
        return []
    proc = state.processes[s][i]
    out: list[Action] = []
    if not proc.stalled and proc.phase != SUPERSEDED:
        out.append(Action("stall_server", s, i))
    out.append(Action("crash_server", s, i))
    return out


def redis_faults(state: State, config: Config) -> list[Action]:
    """With ``Bounds.redis_faults``, Redis may restart empty."""
    if state.faults < config.bounds.faults and config.bounds.redis_faults:
        return [Action("redis_wipe")]
    return []


#: What other actors do to a worker's phase: (phase, action, phase after).  The worker's own
#: steps, a lost reply's outcome included, are ``worker_steps.WORKER_TRANSITIONS``.
WORKER_INTERRUPTIONS: tuple[tuple[int, str, int], ...] = (
    *((ph, "crash_worker", CRASHED) for ph in (IDLE, ARMED, TAKEN, RECORDED, DIRTY)),
    (IDLE, "cancel_before_send", DIRTY),  # a take cut short: it cannot tell, so reconciles
    (RECORDED, "cancel_before_send", DIRTY),
    (RECORDED, "cancel_before_send", IDLE),  # design 16: a cut-short release taken as run
    (RECORDED, "cancel_before_send", STOPPED),  # its process was superseded
    (RECORDED, "retry", IDLE),
    (RECORDED, "retry", DIRTY),
    (RECORDED, "retry", STOPPED),
    (ARMED, "advance_clock", IDLE),  # a pending take timed out (``Bounds.registration_ages``)
    # a heartbeat finds a newer incarnation: whoever holds nothing stops
    *((ph, "heartbeat", STOPPED) for ph in (IDLE, ARMED, DIRTY)),
    # Redis restarts empty: every connection breaks
    *((ph, "redis_wipe", DIRTY) for ph in (IDLE, ARMED, TAKEN, RECORDED)),
    # (a superseded process's workers that hold nothing stopped already)
    *((ph, "redis_wipe", STOPPED) for ph in (TAKEN, RECORDED)),
)


# --- effects ------------------------------------------------------------------------------------


def crash_worker(state: State, action: Action, config: Config, lost: bool) -> State:
    """A worker neither crashed nor stopped stops between two commands; no ``finally`` runs.
    Its list keeps what it held, for recovery (or its own reconcile, once restarted)."""
    return settle(with_worker(state, action.server, action.proc, action.worker, Worker(CRASHED)))


def crash_server(state: State, action: Action, config: Config, lost: bool) -> State:
    """Any process may crash: it is gone, with its workers; only what it left in Redis
    remains."""
    return with_process(state, action.server, action.proc, None)


def stall_server(state: State, action: Action, config: Config, lost: bool) -> State:
    """A process neither stalled nor superseded stalls: its heartbeat and sweep loops stop
    (its workers run on), so a live server may look dead."""
    s, i = action.server, action.proc
    state = state._replace(stalled_ever=True)
    return with_process(state, s, i, state.processes[s][i]._replace(stalled=True))


def redis_wipe(state: State, action: Action, config: Config, lost: bool) -> State:
    """With ``Bounds.redis_faults``, Redis restarts empty: queue, in-flight lists, both
    registries, processing records, counters and scripts are gone, and every client connection
    breaks."""
    # Tasks that were enqueued and not committed are Redis's loss (``WIPED``), counted apart.
    # Every running worker finds its connection broken: its next command fails, so it is dirty
    # and reconciles before it takes again; a worker that held a task holds one Redis no longer
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
    return settle(
        state._replace(
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
        )
    )


def cancel_before_send(state: State, action: Action, config: Config, lost: bool) -> State:
    """With ``Bounds.cancels_before_send``, a ``CANCELLABLE`` step whose command is not sent yet
    (``action.command``) is cancelled at an await before the send (asyncio's fault): the worker
    is dirty, and nothing moves in Redis.

    No take, no registration, no release, no commit. What the worker did before the send
    stands: a take of a suspect (and a composite that asks for one) took its process's suspect
    slot, which it keeps until it is clean again. The worker cannot
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
    return settle(free_slot(with_worker(state, s, i, w, worker), s, i, w))
