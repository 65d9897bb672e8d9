"""What the protocol refuses: attempts a real process can make that the model never enables.

`enabled_actions` lists what may happen; a real process can also *attempt* things the design
must turn down, and turning them down is behaviour as much as any step is. `refused_attempts`
lists those attempts in a state, each one refused with nothing changed (the state after a refused
attempt is the state before it):

- ``claim_held``: claiming server id ``server`` while a process holds it (its registration has
  not expired: ``deadline > 0``). The claim is enabled only once the registration is gone or
  expired; before that, the CLAIM script refuses.
- ``heartbeat_superseded``: a heartbeat from a process that already knows it was superseded
  (phase ``SUPERSEDED``, not stalled) while the newer incarnation is registered. Its heartbeat
  loop has stopped; a heartbeat it still sent must not take the id back.
- ``drain_live``: a sweep's drain (dead-only) of list ``(server, inc, worker)``, holding tasks,
  whose owner is live (registered as that incarnation, not expired; after a stall and
  re-registration too).
  Every move of such a drain re-checks liveness and moves nothing.

A release by a worker that lost custody is not here: it is an enabled action (``release``) whose
effect, no commit, the model predicts like any other.
"""

from __future__ import annotations

from typing import NamedTuple

from .protocol import Config, is_live
from .state import SUPERSEDED, State

#: The kinds of refused attempt, in the order `refused_attempts` lists them per server.
REFUSALS = ("claim_held", "heartbeat_superseded", "drain_live")


class Attempt(NamedTuple):
    """One attempt the model refuses. ``server``/``proc`` say who (``proc`` indexes
    ``state.processes[server]``; -1: no process, e.g. a claimant); for ``drain_live`` the list
    drained is ``(server, inc, worker)``."""

    name: str
    server: int
    proc: int = -1
    worker: int = -1
    inc: int = -1

    def describe(self) -> str:
        if self.name == "claim_held":
            return f"a new process tries to claim id s{self.server}, held by a live process"
        if self.name == "heartbeat_superseded":
            return f"superseded process s{self.server}#{self.inc} tries to heartbeat"
        return (
            f"a sweep tries to drain inflight:{self.server}:{self.inc}:{self.worker}, "
            "whose owner is live"
        )


def refused_attempts(state: State, config: Config) -> list[Attempt]:
    """Every attempt the model refuses in ``state`` (see the module doc), in a deterministic
    order. None of them is in ``enabled_actions(state, config)``, and a refused attempt changes
    nothing: the model's state after it is ``state``.

    Example: at the start every server's id is held, so claiming it again is refused::

        config = Config(Bounds(tasks=1, servers=1, workers=1, faults=0), variant("correct"))
        refused_attempts(config.initial(), config)    # [Attempt(name='claim_held', server=0)]
    """
    del config  # the refusals do not depend on the bounds or the variant (yet)
    out: list[Attempt] = []
    for s, procs in enumerate(state.processes):
        reg = state.registry[s]
        if reg is not None and reg.deadline > 0:
            out.append(Attempt("claim_held", s))
        for i, proc in enumerate(procs):
            if (
                proc.phase == SUPERSEDED
                and not proc.stalled
                and reg is not None
                and reg.inc != proc.inc
            ):
                out.append(Attempt("heartbeat_superseded", s, i, inc=proc.inc))
    for key, tasks in state.lists:
        reg = state.registry[key[0]]
        # Live and not expired: an expired registration is one the sweep's prune removes first,
        # and then its lists are the sweep's to drain.
        if tasks and is_live(state.registry, key) and reg is not None and reg.deadline > 0:
            out.append(Attempt("drain_live", key[0], worker=key[2], inc=key[1]))
    return out
