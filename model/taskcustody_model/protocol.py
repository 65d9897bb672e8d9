"""The custody protocol as a state machine: the spec of record.  Read it as tables.

**What a step is.**  Every action is one Redis command (or one Lua script) of one actor, so the
interleavings the checker explores are exactly the interleavings Redis can see.  (``execute``,
the handler, touches no Redis: a crash or any other step just before it or just after it leads
to the same states, so it is folded into ``release``: "execute, then release".)  An ``Action``
names the step and who takes it (``action.py``); a state is plain tuples (``state.py``).  No
I/O anywhere: ``enabled_actions`` lists what may happen next, ``apply`` computes the next state.

**How to read it.**  One table and one composition are the whole machine:

- ``STEPS`` maps every action's name to its *effect*, a function ``(state, action, config,
  lost) -> state`` whose docstring says, in a sentence or two, its guard (when it is enabled)
  and its effect.  ``apply`` is one lookup in it.  ``lost`` is true for a ``dropped_reply``: a
  command that Redis executed but whose reply never reached the caller runs the same effect,
  the Redis side exactly as on success, the caller's side as on an error.
- ``enabled_actions`` asks each actor, in a fixed order, which of its steps are enabled: one
  function per actor.  A worker: ``worker_steps``, which offers the steps its phase's rows of
  ``WORKER_TRANSITIONS`` list (a worker's phases, the steps from each, the phases after) whose
  guard in ``WORKER_GUARDS`` holds.  A server process's own loops: ``process_steps`` (startup
  drain, heartbeat, resume) and ``claim_steps``.  Its sweeper: ``sweeper_steps`` (the sweep
  pass, its drain moves, the processing sweep) and ``promote_steps``.  The world:
  ``environment_steps`` (the clock, the producer).  The faults: ``fault_companions`` strike a
  step (offered right after it), ``worker_faults``, ``process_faults`` and ``redis_faults``
  strike an actor.  Equal states list equal actions, in the same order.

So to know what a step does, find its name in ``STEPS`` and read the function; to know when it
happens, read its actor's function.  The two recovery passes differ in one named parameter,
``include_self`` (``selection.INCLUDE_SELF``, ``selection.lists_to_recover``): the startup drain
(``True``) recovers the lists of earlier incarnations of the process's own server id, the sweep
(``False``) those of owners that are neither live nor itself.  ``python -m
taskcustody_model.diagram`` draws a worker's phases and a task's places from these tables
(``docs/model/phases.md``).

**Conventions.**  The queue's right end is taken next; the drains push recovered tasks back on
the right, so they are taken next (``LMOVE list queue RIGHT RIGHT``); a take pushes on the left
of the own list, so a list's right end is its oldest task.  Faults (``FAULTS``) count against
``Bounds.faults``; everything else is the protocol running, and is what "recovery" may use once
faults stop.  ``config.variant`` changes a step only where its design does (a flag read in the
effect or the guard that models the changed line).
"""

from __future__ import annotations

from .action import (
    CANCELLABLE,
    FAULTS,
    RECOVERY_STEPS,
    SERVER_STEPS,
    WORKER_STEPS,
    Action,
    Config,
    drains_in_steps,
)
from .custody import (
    fresh_incarnation,
    is_dead,
    is_live,
    prune,
    registered_with,
    renewed,
    with_process,
    worker_task,
)
from .environment import advance_clock, enqueue, environment_steps
from .faults import (
    LOSES_REPLY,
    WORKER_INTERRUPTIONS,
    cancel_before_send,
    crash_server,
    crash_worker,
    fault_companions,
    process_faults,
    redis_faults,
    redis_wipe,
    stall_server,
    worker_faults,
)
from .selection import INCLUDE_SELF, collectable, lists_to_recover, pass_selection
from .server_steps import (
    claim,
    claim_steps,
    count_recovery,
    drain_step,
    heartbeat,
    process_steps,
    promote,
    promote_steps,
    requeue_stuck_processing_tasks,
    resume_server,
    startup_drain,
    sweep,
    sweeper_steps,
)
from .state import RUNNING, State
from .worker_steps import (
    WORKER_TRANSITIONS,
    Effect,
    arm,
    reconcile,
    record,
    release,
    release_and_take,
    restart_worker,
    retry,
    take,
    take_suspect,
    worker_steps,
)

__all__ = [
    "CANCELLABLE",
    "FAULTS",
    "INCLUDE_SELF",
    "LOSES_REPLY",
    "RECOVERY_STEPS",
    "SERVER_STEPS",
    "STEPS",
    "WORKER_INTERRUPTIONS",
    "WORKER_STEPS",
    "WORKER_TRANSITIONS",
    "Action",
    "Config",
    "apply",
    "collectable",
    "drains_in_steps",
    "enabled_actions",
    "fresh_incarnation",
    "is_dead",
    "is_live",
    "lists_to_recover",
    "pass_selection",
    "prune",
    "registered_with",
    "renewed",
    "with_process",
    "worker_task",
]

#: Every action's effect, by name, grouped by actor.  A ``dropped_reply`` runs the effect of
#: the command whose reply it loses, with ``lost=True``.
STEPS: dict[str, Effect] = {
    # a worker (worker_steps.py)
    "arm": arm,
    "take": take,
    "take_suspect": take_suspect,
    "record": record,
    "release": release,
    "release_and_take": release_and_take,
    "reconcile": reconcile,
    "restart_worker": restart_worker,
    # a server process's own loops (server_steps.py)
    "claim": claim,
    "startup_drain": startup_drain,
    "heartbeat": heartbeat,
    "count_recovery": count_recovery,
    "resume_server": resume_server,
    # its sweeper (server_steps.py)
    "sweep": sweep,
    "drain_step": drain_step,
    "requeue_stuck_processing_tasks": requeue_stuck_processing_tasks,
    "promote": promote,
    # the world (environment.py)
    "advance_clock": advance_clock,
    "enqueue": enqueue,
    # the faults (faults.py); ``dropped_reply`` is the lost command's own effect
    "retry": retry,
    "cancel_before_send": cancel_before_send,
    "crash_worker": crash_worker,
    "stall_server": stall_server,
    "crash_server": crash_server,
    "redis_wipe": redis_wipe,
}


def apply(state: State, action: Action, config: Config) -> State:
    """The state after ``action`` (which must be enabled in ``state``): its effect in ``STEPS``
    (a fault first counts against ``Bounds.faults``)."""
    if action.is_fault:
        state = state._replace(faults=state.faults + 1)
    lost = action.name == "dropped_reply"
    effect = STEPS.get(action.command if lost else action.name)
    if effect is None:
        raise ValueError(f"unknown action {action!r}")
    return effect(state, action, config, lost)


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

    The order, per server id: each process's workers (each worker's steps, every step followed
    by the faults that strike it, then the worker's crash), the process's own loops and its
    sweeper's (each followed by its faults), the process's stall and crash; then a claim of
    the id.  Last the world's: the clock, the producer, promotions, a Redis wipe.  Workers run
    once the startup drain is done, and keep running while the process is stalled: a stall
    stops the heartbeat and sweep loops, not the workers.

    Example: one task, one worker, no faults; each state offers exactly one next step::

        config = Config(Bounds(tasks=1, servers=1, workers=1, faults=0), variant("correct"))
        state = config.initial()
        enabled_actions(state, config)        # [Action(name='take', server=0, proc=0, ...)]
        state = apply(state, Action("take", 0, 0, 0), config)
        enabled_actions(state, config)        # [Action(name='record', server=0, proc=0, ...)]
    """
    out: list[Action] = []
    for s, procs in enumerate(state.processes):
        for i, proc in enumerate(procs):
            if proc.phase >= RUNNING:
                for w in range(len(proc.workers)):
                    for step in worker_steps(state, config, s, i, w):
                        out.append(step)
                        out.extend(fault_companions(state, config, step))
                    out.extend(worker_faults(state, config, s, i, w))
            for step in process_steps(state, config, s, i) + sweeper_steps(state, config, s, i):
                out.append(step)
                out.extend(fault_companions(state, config, step))
            out.extend(process_faults(state, config, s, i))
        for step in claim_steps(state, config, s):
            out.append(step)
            out.extend(fault_companions(state, config, step))
    out.extend(environment_steps(state, config))
    out.extend(promote_steps(state))
    out.extend(redis_faults(state, config))
    return out
