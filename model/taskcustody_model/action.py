"""What a step is: ``Action`` (who does what), ``Config`` (bounds and design), and the names.

Data only; what each action needs and does is in ``protocol.py`` and the step modules it lists.
"""

from __future__ import annotations

from typing import NamedTuple

from .state import Bounds, State, initial_state
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
# handled and the next take in one script.
WORKER_STEPS = (
    "arm",
    "take",
    "take_suspect",
    "record",
    "release",
    "release_and_take",
    "reconcile",
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
    {
        "dropped_reply",
        "crash_worker",
        "crash_server",
        "stall_server",
        "redis_wipe",
        "retry",
        "cancel_before_send",
    }
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
