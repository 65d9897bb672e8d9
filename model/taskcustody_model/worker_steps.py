"""A worker's steps: its phases as a table, each step's guard and its effect.

``WORKER_TRANSITIONS`` is the worker's life as data: every (phase, step, phase after) that the
worker's own steps make, a lost reply's outcome included.  ``worker_steps`` offers a worker
exactly the steps listed from its phase, in the table's order, whose guard (``WORKER_GUARDS``)
holds; the effect then computes which of the listed phases it ends in.  What other actors do to
a worker (a crash, a cancellation, a supersession, a wipe, a tick ending a pending take) is
``faults.WORKER_INTERRUPTIONS``.  ``tests/model/test_diagram.py`` checks, over explored state
spaces, that every phase change the effects make is in one of the two tables, and
``python -m taskcustody_model.diagram`` draws them (``docs/model/phases.md``).
"""

from __future__ import annotations

from collections.abc import Callable

from .action import Action, Config
from .custody import (
    free_slot,
    move_to_queue,
    record_script,
    register,
    release_script,
    settle,
    take_from_queue,
    take_suspect_script,
    with_process,
    with_worker,
)
from .state import (
    ARMED,
    CRASHED,
    DIRTY,
    IDLE,
    NO_TASK,
    RECORDED,
    RUNNING,
    STOPPED,
    SUPERSEDED,
    TAKEN,
    Process,
    State,
    Worker,
    list_of,
)

#: An effect: the state after the action, given whether its reply was lost (``dropped_reply``).
Effect = Callable[[State, Action, Config, bool], State]
#: A worker step's guard beyond its phase: (state, config, server, process, worker).
Guard = Callable[[State, Config, int, Process, int], bool]

#: (phase, step, phase after): every phase change a worker's own steps make.  The order of the
#: steps from one phase is the order they are offered in.
WORKER_TRANSITIONS: tuple[tuple[int, str, int], ...] = (
    (IDLE, "take_suspect", TAKEN),
    (IDLE, "take_suspect", DIRTY),  # its reply lost: reconcile first
    (IDLE, "take", TAKEN),
    (IDLE, "take", DIRTY),  # its reply lost: the task is in the own list, unknown to the worker
    (IDLE, "take", IDLE),  # BLPOP design, its reply lost: the task is nowhere
    (IDLE, "arm", ARMED),
    (ARMED, "take_suspect", TAKEN),
    (ARMED, "take_suspect", DIRTY),
    (ARMED, "take", TAKEN),
    (ARMED, "take", DIRTY),
    (TAKEN, "record", RECORDED),
    (RECORDED, "release", IDLE),
    (RECORDED, "release", DIRTY),  # its reply lost, or debris left in the own list
    (RECORDED, "release", STOPPED),  # its process was superseded
    (RECORDED, "release_and_take", RECORDED),  # the next task's handler starts
    (RECORDED, "release_and_take", DIRTY),
    (DIRTY, "reconcile", IDLE),
    (DIRTY, "reconcile", DIRTY),  # its reply lost
    (CRASHED, "restart_worker", DIRTY),
)


def steps_from(phase: int) -> tuple[str, ...]:
    """The steps ``WORKER_TRANSITIONS`` lists from ``phase``, in order, each once."""
    out: list[str] = []
    for ph, step, _after in WORKER_TRANSITIONS:
        if ph == phase and step not in out:
            out.append(step)
    return tuple(out)


# --- guards: when a step may happen, beyond the worker's phase ---------------------------------


def _always(state: State, config: Config, s: int, proc: Process, w: int) -> bool:
    return True


def _may_take_suspect(state: State, config: Config, s: int, proc: Process, w: int) -> bool:
    """A suspect waits and the process (running) holds none: the worker's non-blocking take from
    the suspects list comes before its take from the queue (an armed take times out first,
    within the block timeout)."""
    return bool(state.suspects) and proc.phase == RUNNING and proc.suspect < 0


def _may_take(state: State, config: Config, s: int, proc: Process, w: int) -> bool:
    """The queue holds a task and the process is running (not still draining, not superseded)."""
    return bool(state.queue) and proc.phase == RUNNING


def _may_arm(state: State, config: Config, s: int, proc: Process, w: int) -> bool:
    """The queue is empty: the take pipeline registers the list and its BLMOVE blocks until a
    task arrives.  A BLPOP take has nothing to arm."""
    return not state.queue and proc.phase == RUNNING and config.variant.take_into_list


def _may_release_and_take(state: State, config: Config, s: int, proc: Process, w: int) -> bool:
    """The composite is the running process's busy path: only while there is something to take
    (else the plain release)."""
    return proc.phase == RUNNING and (
        bool(state.queue) or (bool(state.suspects) and proc.suspect in (-1, w))
    )


def _may_restart(state: State, config: Config, s: int, proc: Process, w: int) -> bool:
    """The supervisor restarts a crashed worker of a running process."""
    return proc.phase == RUNNING


WORKER_GUARDS: dict[str, Guard] = {
    "take_suspect": _may_take_suspect,
    "take": _may_take,
    "arm": _may_arm,
    "record": _always,  # a dropped reply on record changes nothing: custody is in the list
    "release": _always,
    "release_and_take": _may_release_and_take,
    "reconcile": _always,
    "restart_worker": _may_restart,
}

#: phase -> the steps offered from it, in order (read off ``WORKER_TRANSITIONS`` once)
_FROM: dict[int, tuple[str, ...]] = {
    ph: steps_from(ph) for ph in (IDLE, DIRTY, TAKEN, RECORDED, CRASHED, STOPPED, ARMED)
}


def worker_steps(state: State, config: Config, s: int, i: int, w: int) -> list[Action]:
    """The steps worker ``w`` of process ``i`` of server ``s`` may take next: those the table
    lists from its phase whose guard holds.  (Its faults are ``faults.py``'s.)"""
    proc = state.processes[s][i]
    out: list[Action] = []
    for name in _FROM[proc.workers[w].phase]:
        if WORKER_GUARDS[name](state, config, s, proc, w):
            out.append(Action(name, s, i, w))
    return out


# --- effects ------------------------------------------------------------------------------------


def arm(state: State, action: Action, config: Config, lost: bool) -> State:
    """Idle, queue empty: the take pipeline ``ZADD``s the own list to the registry and sends a
    ``BLMOVE`` that blocks; Redis serves it (``take``) as soon as a task arrives."""
    s, i, w = action.server, action.proc, action.worker
    key = (s, state.processes[s][i].inc, w)
    if config.variant.registry_heals:
        state = register(state, config, key)
    return with_worker(state, s, i, w, Worker(ARMED))


def take(state: State, action: Action, config: Config, lost: bool) -> State:
    """Idle or armed, a task queued, process running: ``BLMOVE queue own-list`` (the queue's
    next task); the worker holds it.  Reply lost: it is in the own list unknown to the worker,
    which must reconcile first; in the BLPOP design it exists nowhere."""
    # (a retried BLMOVE would take a second task and strand the first: hence dirty)
    v = config.variant
    s, i, w = action.server, action.proc, action.worker
    state, t = take_from_queue(state, s, i, w, config, into_list=v.take_into_list)
    if lost:
        return with_worker(state, s, i, w, Worker(DIRTY if v.take_into_list else IDLE))
    return with_worker(state, s, i, w, Worker(TAKEN, t))


def take_suspect(state: State, action: Action, config: Config, lost: bool) -> State:
    """Idle or armed, a suspect waiting, the process holding none: one script moves the oldest
    suspect into the own list and records it; the process's suspect slot is the worker's."""
    s, i, w = action.server, action.proc, action.worker
    state, t = take_suspect_script(state, s, i, w, config)
    return with_worker(state, s, i, w, Worker(DIRTY) if lost else Worker(TAKEN, t))


def record(state: State, action: Action, config: Config, lost: bool) -> State:
    """Taken: the processing record is written (only if the task is still in the own list) and
    the handler starts."""
    s, i, w = action.server, action.proc, action.worker
    t = state.processes[s][i].workers[w].task
    state = record_script(state, s, i, w, t, config, executes=True)
    return with_worker(state, s, i, w, Worker(RECORDED, t))


def _release(state: State, action: Action, config: Config, lost: bool, retry: bool) -> State:
    v = config.variant
    s, i, w = action.server, action.proc, action.worker
    proc = state.processes[s][i]
    state, debris = release_script(state, s, i, w, config, retry=retry, checks_custody=True)
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
    return settle(free_slot(with_worker(state, s, i, w, worker), s, i, w))


def release(state: State, action: Action, config: Config, lost: bool) -> State:
    """Recorded: the handler ran (no Redis: folded in here), then the release script commits
    the task if and only if it was still in the own list.  The worker is idle after it, dirty if
    it did not see the end or debris is left, stopped if its process was superseded."""
    return _release(state, action, config, lost, retry=False)


def retry(state: State, action: Action, config: Config, lost: bool) -> State:
    """Recorded, with ``Bounds.handler_failures``: the handler failed and the release's retry
    branch schedules the task (a delayed retry) instead of committing it."""
    return _release(state, action, config, lost, retry=True)


def release_and_take(state: State, action: Action, config: Config, lost: bool) -> State:
    """Recorded, process running, something to take: one script releases the task just handled
    exactly as ``release`` and, only if the own list is empty after it, takes and records the
    next (a suspect if the worker may take one, else the queue's next task), whose handler
    starts.  Reply lost: the worker knows neither, so it is dirty."""
    # The busy path's cycle: one round trip per task.  Nothing of another client can come
    # between the two halves: the composite is exactly release, then take, then record, and
    # adds no state the three steps in a row do not reach (tests/model/test_transitions.py
    # keeps the two in step).  What it changes is the fault: a lost reply is a lost reply of
    # both halves, and the worker's reconcile drains the new task back (counted as a recovery,
    # as every reconcile does).  The new task's handler never started, so no execution is
    # counted.  A superseded process takes nothing: it uses the plain release (so does a worker
    # that finds the queue empty, or is stopping).
    v = config.variant
    s, i, w = action.server, action.proc, action.worker
    proc = state.processes[s][i]
    slot_was_ours = proc.suspect == w
    state, debris = release_script(
        state, s, i, w, config, retry=False, checks_custody=v.composite_checks_custody
    )
    t = NO_TASK
    if not debris:
        if state.suspects and proc.suspect in (-1, w):
            # (the slot passes to the new suspect)
            state, t = take_suspect_script(state, s, i, w, config)
        elif state.queue:
            state, t = take_from_queue(
                state,
                s,
                i,
                w,
                config,
                into_list=v.take_into_list and v.composite_takes_into_list,
            )
            if slot_was_ours and not lost:
                # clean between the halves, and what it takes now is no suspect
                state = with_process(state, s, i, state.processes[s][i]._replace(suspect=-1))
    if t != NO_TASK:
        state = record_script(state, s, i, w, t, config, executes=not lost)
    if lost or debris:
        worker = Worker(DIRTY)
    elif t == NO_TASK:
        worker = Worker(IDLE)  # nothing to take: just the release
    else:
        worker = Worker(RECORDED, t)  # the handler starts
    return free_slot(with_worker(state, s, i, w, worker), s, i, w)


def reconcile(state: State, action: Action, config: Config, lost: bool) -> State:
    """Dirty: drain the own list back to the queue (the worker holds nothing, so whatever is
    there is debris of a take whose reply was lost); then idle, or still dirty if the reply was
    lost.  Nobody else appends to the list, so draining it whole is one bounded drain."""
    s, i, w = action.server, action.proc, action.worker
    key = (s, state.processes[s][i].inc, w)
    state = move_to_queue(state, key, len(list_of(state, key)), config, (s, i))
    return free_slot(with_worker(state, s, i, w, Worker(DIRTY if lost else IDLE)), s, i, w)


def restart_worker(state: State, action: Action, config: Config, lost: bool) -> State:
    """Crashed, process running: the supervisor restarts the worker, dirty (it reconciles before
    its first take)."""
    return with_worker(state, action.server, action.proc, action.worker, Worker(DIRTY))
