"""Where a task is, and the steps that move it: a task's places as a table.

A task of the correct design is in exactly one place at a time (``no_loss`` and
``no_duplication`` in ``invariants.py`` say so at every reachable state).  ``TASK_MOVES`` lists
every (place, step, place after) by which the steps move a task; ``python -m
taskcustody_model.diagram`` draws it, and ``tests/model/test_diagram.py`` checks, over explored
state spaces of the correct design, that every move the effects make is in it and that every row
is made.  A dropped reply of a step moves its task as the step does (Redis ran it).
"""

from __future__ import annotations

from .state import HOLDING, POISONED, WAITING, WIPED, State

WAITING_PLACE = "waiting"  # not enqueued yet (``Bounds.late_tasks``)
QUEUE = "queue"
SUSPECTS = "suspects"  # recovered once at least: taken one per process at a time
SCHEDULED = "scheduled"  # a failed handler's delayed retry
INFLIGHT = "in-flight list"  # a worker's custody: taken, maybe recorded and running
COMMITTED = "committed"
DEAD_LETTERS = "dead letters"  # recovered once too often: a poison pill
WIPED_PLACE = "wiped"  # Redis lost it (restarted empty): counted apart, not the protocol's loss
HANDS = "a worker's hands"  # in no list: only in designs without custody in a list
NOWHERE = "nowhere"  # lost: only in broken designs

#: The places, in the order the diagram lists them.
PLACES = (WAITING_PLACE, QUEUE, SUSPECTS, SCHEDULED, INFLIGHT, COMMITTED, DEAD_LETTERS, WIPED_PLACE)

_RECOVERIES = (
    "reconcile",
    "startup_drain",
    "sweep",
    "drain_step",
    "requeue_stuck_processing_tasks",
)

#: (place, step, place after): every move of a task the steps of the correct design make.
TASK_MOVES: tuple[tuple[str, str, str], ...] = (
    (WAITING_PLACE, "enqueue", QUEUE),
    (QUEUE, "take", INFLIGHT),
    (QUEUE, "release_and_take", INFLIGHT),  # the composite's take half
    (SUSPECTS, "take_suspect", INFLIGHT),
    (SUSPECTS, "release_and_take", INFLIGHT),
    (INFLIGHT, "release", COMMITTED),
    (INFLIGHT, "release_and_take", COMMITTED),  # the composite's release half
    (INFLIGHT, "retry", SCHEDULED),
    (SCHEDULED, "promote", QUEUE),
    (SCHEDULED, "promote", SUSPECTS),  # it has a recovery count: it still runs alone
    # recovery takes a task back from a holder's list: to the queue while recoveries are not
    # counted (``Bounds.max_recoveries`` unset), else to the suspects, or past the limit to the
    # dead letters
    *((INFLIGHT, step, QUEUE) for step in _RECOVERIES),
    *((INFLIGHT, step, SUSPECTS) for step in _RECOVERIES),
    *((INFLIGHT, step, DEAD_LETTERS) for step in _RECOVERIES),
    *((place, "redis_wipe", WIPED_PLACE) for place in (QUEUE, SUSPECTS, SCHEDULED, INFLIGHT)),
)


def place_of(state: State, t: int) -> str:
    """The place of task ``t`` in ``state`` (the first that holds it, in the order of
    ``PLACES``; ``HANDS`` or ``NOWHERE`` if none does)."""
    status = state.status[t] if state.status else -1
    if status == WAITING:
        return WAITING_PLACE
    if t in state.queue:
        return QUEUE
    if t in state.suspects:
        return SUSPECTS
    if t in state.scheduled:
        return SCHEDULED
    if any(t in tasks for _, tasks in state.lists):
        return INFLIGHT
    if state.committed[t]:
        return COMMITTED
    if status == POISONED:
        return DEAD_LETTERS
    if status == WIPED:
        return WIPED_PLACE
    if any(
        w.phase in HOLDING and w.task == t
        for procs in state.processes
        for proc in procs
        for w in proc.workers
    ):
        return HANDS
    return NOWHERE
