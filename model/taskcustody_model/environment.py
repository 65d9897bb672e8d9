"""What the world does that is no fault: Redis's clock expiring registrations, and the producer
enqueueing a late task.  (A stalled process resuming and a crashed worker restarting are their
actors' steps; a due retry's promotion is the sweeper's.)"""

from __future__ import annotations

from .action import Action, Config
from .custody import renewed, set_at, with_process
from .selection import clock_may_advance, tick_ages
from .state import ARMED, ENQUEUED, IDLE, WAITING, State, Worker


def environment_steps(state: State, config: Config) -> list[Action]:
    """The clock advances when a tick matters (it can expire a registration nobody renews, or,
    with ``Bounds.registration_ages``, age one); the producer enqueues while a task waits."""
    out: list[Action] = []
    if clock_may_advance(state) or (config.bounds.registration_ages and tick_ages(state)):
        out.append(Action("advance_clock"))
    if WAITING in state.status:
        out.append(Action("enqueue"))
    return out


def advance_clock(state: State, action: Action, config: Config, lost: bool) -> State:
    """When a tick matters (``environment_steps``), one tick: every registration no healthy
    process renews expires (its relative deadline drops to 0, until the next prune); renewed ones
    stay (their heartbeats are folded in here)."""
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
        state = aged(state, config)
    return state


def aged(state: State, config: Config) -> State:
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
                state = with_process(
                    state,
                    s,
                    i,
                    proc._replace(
                        workers=tuple(
                            Worker(IDLE) if wk.phase == ARMED else wk for wk in proc.workers
                        )
                    ),
                )
    return state


def enqueue(state: State, action: Action, config: Config, lost: bool) -> State:
    """A task waits to be enqueued: the producer's ``LPUSH`` of the next one."""
    t = state.status.index(WAITING)
    return state._replace(queue=(t, *state.queue), status=set_at(state.status, t, ENQUEUED))
