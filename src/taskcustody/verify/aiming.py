"""Aiming at a fault kind: the shortest walk of harness steps, planned on the model, to a state
where a given fault can be injected.

The fault-coverage part (`fault_coverage.py`) must see every fault kind, and a lost reply of every
command that can lose one, many times per run. Some of them are enabled only in short windows
that random rules rarely hit (a suspect's take needs a task recovered with a count; a sweep's lost
reply needs a registration that lapsed), so the part's machine does not wait for them: it plans,
on the model, a walk of ordinary harness steps (crashes and stalls included; no wipe and no lost
reply, each a kind of its own) from the current state to one where the aimed-at fault is enabled,
and the machine performs each step on the implementation, checked, before the fault. Breadth
first, so the walk is a shortest one, and bounded (`MAX_DEPTH`, `MAX_STATES`): a fault out of
reach is simply not aimed at this time.

The planner mirrors what a harness step does to the model (`Stepping._step`): a sweep or a startup
drain is a whole pass (every `drain_step`, and for a sweep the processing sweep after it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from taskcustody_model import Action, Config, State, apply, enabled_actions, list_of
from taskcustody_model.protocol import FAULTS
from taskcustody_model.state import RUNNING

from .faults import DROPPED_REPLY
from .observation import Mismatch

#: A kind of fault the coverage counts: a fault action's name ("crash_worker"), or
#: "dropped-reply:<command>" for a lost reply of that command (the harness's count keys).
DROPPED = "dropped-reply:"

MAX_DEPTH = 8
#: kinds an aiming rule tries in turn before it gives up (each out of reach: no walk)
TRIES = 3
MAX_STATES = 1_500

#: Harness steps a walk never takes: a wipe empties Redis (the walk would aim at nothing), a lost
#: reply (every one of them is a kind aimed at in its own right: walks that lose a take's reply
#: on the way to a reconcile's would make the take's count the sum of both), and the mid-pass
#: steps, which run inside a pass.
_NOT_ON_A_WALK = (
    "redis_wipe",
    "dropped_reply",
    "drain_step",
    "arm",
    "count_recovery",
    "promote",
    "retry",
)


class Shot(NamedTuple):
    """How to inject an aimed-at fault: the harness step, and its `drop_at` / `variant`."""

    action: Action
    drop_at: int = 0
    variant: int = 0


def harness_actions(state: State, config: Config) -> list[Action]:
    """The steps the harness performs in `state` (its `enabled`, without mid-pass steps)."""
    return [
        a
        for a in enabled_actions(state, config)
        if a.name not in ("drain_step", "arm") and a.command != "drain_step"
    ]


def after(state: State, action: Action, config: Config) -> State:
    """The model's state after the harness performs `action` (a pass runs whole)."""
    state = apply(state, action, config)
    if action.name in ("sweep", "startup_drain"):
        s, i = action.server, action.proc
        for _ in range(64):
            procs = state.processes[s]
            if i >= len(procs) or not procs[i].drains:
                break
            state = apply(state, Action("drain_step", s, i), config)
        if action.name == "sweep":
            state = apply(state, Action("requeue_stuck_processing_tasks", s, i), config)
    return state


def shots(state: State, config: Config, kind: str) -> list[Shot]:
    """The ways to inject a fault of `kind` in `state` (empty: not enabled here)."""
    actions = harness_actions(state, config)
    if not kind.startswith(DROPPED):
        return [Shot(a) for a in actions if a.name == kind]
    command = kind[len(DROPPED) :]
    if command == "drain_step":
        # the first move of a pass loses its reply (`Stepping._pass`, drop_at=1)
        out = []
        for a in actions:
            if a.name in ("sweep", "startup_drain"):
                mid = apply(state, a, config)
                if any(
                    b.name == "dropped_reply" and b.command == "drain_step"
                    for b in enabled_actions(mid, config)
                ):
                    out.append(Shot(a, drop_at=1))
        return out
    if command == "heartbeat":
        # the model has no action for it (the script ran); the harness drops it with variant 2
        # of a heartbeat that does not supersede (`Stepping._heartbeat`)
        return [
            Shot(a, variant=2)
            for a in actions
            if a.name == "heartbeat"
            and (reg := state.registry[a.server]) is not None
            and reg.inc == state.processes[a.server][a.proc].inc
        ]
    return [Shot(a) for a in actions if a.name == "dropped_reply" and a.command == command]


def walk_to(state: State, config: Config, kind: str) -> list[Action] | None:
    """A shortest walk of harness steps from `state` to a state where a fault of `kind` can be
    injected ([] if it can be now); None if there is none within the planner's bounds."""
    return shortest_walk(
        state,
        config,
        lambda s: bool(shots(s, config, kind)),
        lambda a: not (a.name in _NOT_ON_A_WALK or (a.name in FAULTS and kind == a.name)),
    )


def with_aimed_faults(
    base: type[RuleBasedStateMachine], kinds: Sequence[str], copies: int = 1
) -> type[RuleBasedStateMachine]:
    """`base` and a rule that aims at the next fault kind of `kinds`: it walks (`walk_to`) to a
    state where that fault can be injected, each step of the walk performed on the
    implementation and checked, and injects it. `copies`: how many such rules (Hypothesis draws a
    rule uniformly among those enabled, so each copy adds to the aimed rule's weight against the
    base's rules).

    A subclass, so that `base` keeps its rules (one more rule would change what every seeded run
    of it draws)."""

    kind_list = list(kinds)

    class AimingMachine(base):  # type: ignore[valid-type, misc]
        """... and aims at fault kinds in turn (`_next_kind`), so that every kind fires about
        as often as any other: the base's own fault rules are off (their preconditions ask
        `_has`), so that the fault budget goes to the aimed-at kinds. Every other rule of the
        base is as it was, and the base's invariant checks every property after every rule."""

        def _has(self, name: str, command: str = "") -> bool:
            return name not in FAULTS and bool(super()._has(name, command))

        def _next_kind(self, data: st.DataObject) -> str:
            """The kinds in turn, from one drawn at the example's first aim: every kind is
            first in an example as often as any other (the first aim has the whole fault budget
            and the tasks still to take), and an example spreads its budget over several."""
            at = getattr(self, "_aim_at", None)
            if at is None:
                # (Hypothesis draws small numbers far more often than others: the steps before
                # the first aim spread the start over the kinds)
                drawn = data.draw(st.integers(0, 255), label="first kind aimed at")
                at = (drawn + len(self.h.steps)) % len(kind_list)
            self._aim_at = (at + 1) % len(kind_list)
            return kind_list[at]

        def _aim(self, data: st.DataObject) -> None:
            for _ in range(TRIES):
                kind = self._next_kind(data)
                walk = walk_to(self.h.state, self.h.config, kind)
                if walk is not None:
                    break
            else:
                return
            if not walked(self, walk):
                return
            options = shots(self.h.state, self.h.config, kind)
            if not options:
                return
            shot = options[data.draw(st.integers(0, len(options) - 1), label="which")]
            variant = shot.variant
            if kind.startswith(DROPPED) and shot.action.name == "dropped_reply":
                variant = data.draw(st.integers(0, 5), label="variant")
            self.failed = True
            self.h.step(shot.action, drop_at=shot.drop_at, variant=variant)
            self.failed = False

        @invariant()
        def injected_faults_are_the_counted_ones(self) -> None:
            """Every lost reply the harness counts was injected (the injector fired it), and
            none fired uncounted."""
            counted = sum(n for k, n in self.h.counts.items() if k.startswith(DROPPED))
            fired = self.h.injector.counts[DROPPED_REPLY]
            if counted != fired:
                self.failed = True
                raise Mismatch(
                    "fault-count",
                    f"the harness counted {counted} lost replies; the injector dropped {fired}",
                )

    for n in range(copies):

        def aim(self: Any, data: st.DataObject) -> None:
            self._aim(data)

        aim = precondition(lambda self: self.h.state.faults < self.h.bounds.faults)(aim)

        aim.__name__ = f"aim_at_a_fault_{n}"
        setattr(AimingMachine, aim.__name__, rule(data=st.data())(aim))
    AimingMachine.__name__ = f"Aiming{base.__name__}"
    return AimingMachine


def with_faults_also_aimed(
    base: type[RuleBasedStateMachine], kinds: Sequence[str], copies: int = 1
) -> type[RuleBasedStateMachine]:
    """`with_aimed_faults`, with the base's own fault rules left on: the base's run as it is
    (every fault kind drawn), and on top of it rules that aim at each kind of `kinds` in turn, so
    that a test asserting that these kinds fired does not depend on which examples the base's
    draws happen to reach (tests/stateful/test_conformance.py); and a rule that aims at a sweep
    whose drain moves a task out of a list whose owner (a stalled process's worker) can step
    right then, and lets it step between the moves (`with_drain_aimed`)."""
    aiming = with_drain_aimed(with_aimed_faults(base, kinds, copies))

    class AlsoAimingMachine(aiming):  # type: ignore[valid-type, misc]
        """... with the base's fault rules on (its `_has`, not the aiming one's)."""

        def _has(self, name: str, command: str = "") -> bool:
            return bool(base._has(self, name, command))  # type: ignore[attr-defined]

    AlsoAimingMachine.__name__ = f"AlsoAiming{base.__name__}"
    return AlsoAimingMachine


#: The steps of a walk to a drain with its owner stepping: hold a task, stall, let the lease lapse.
_DRAIN_WALK = ("take", "record", "stall_server", "advance_clock")


def shortest_walk(
    state: State,
    config: Config,
    goal: Callable[[State], bool],
    allowed: Callable[[Action], bool],
    max_depth: int = MAX_DEPTH,
    max_states: int = MAX_STATES,
) -> list[Action] | None:
    """A shortest walk (breadth first) of harness steps that `allowed` accepts from `state` to
    one where `goal` holds ([] if it holds now); None if there is none within `max_depth` steps
    and `max_states` states."""
    if goal(state):
        return []
    seen = {state}
    frontier: deque[tuple[State, tuple[Action, ...]]] = deque([(state, ())])
    while frontier:
        current, path = frontier.popleft()
        if len(path) >= max_depth:
            continue
        for a in harness_actions(current, config):
            if not allowed(a):
                continue
            nxt = after(current, a, config)
            if nxt in seen:
                continue
            if goal(nxt):
                return [*path, a]
            if len(seen) >= max_states:
                return None
            seen.add(nxt)
            frontier.append((nxt, (*path, a)))
    return None


def drain_with_owner_steps(state: State, config: Config) -> Action | None:
    """A sweep the harness can perform in `state` whose pass moves a task out of a list whose
    owner, a worker of a stalled process that is still running, may then take, record or release
    (`Stepping._steps_during_drain`); None if there is none."""
    for a in harness_actions(state, config):
        if a.name != "sweep":
            continue
        s, i = a.server, a.proc
        mid = apply(state, a, config)
        for _ in range(64):
            procs = mid.processes[s]
            if i >= len(procs) or not procs[i].drains:
                break
            key = procs[i].drains[0].key
            held = len(list_of(mid, key))
            mid = apply(mid, Action("drain_step", s, i), config)
            if len(list_of(mid, key)) < held and any(
                b.name in ("take", "record", "release")
                and (b.server, b.worker) == (key[0], key[2])
                and mid.processes[b.server][b.proc].inc == key[1]
                and mid.processes[b.server][b.proc].phase == RUNNING
                for b in enabled_actions(mid, config)
            ):
                return a
    return None


def aim_at_a_drain(machine: Any) -> None:
    """Walks (planned on the model) to a state where a sweep's drain moves a task out of a list
    whose owner can step right then (`drain_with_owner_steps`), each step of the walk performed
    on the implementation and checked, and performs that sweep with the owner stepping between
    its moves (the first step it may take, each time, up to the harness's bound)."""
    walk = shortest_walk(
        machine.h.state,
        machine.h.config,
        lambda s: drain_with_owner_steps(s, machine.h.config) is not None,
        lambda a: a.name in _DRAIN_WALK,
    )
    if walk is None:
        machine._no_drain_walk = True  # (not again in this example)
        return
    if not walked(machine, walk):
        return
    sweep = drain_with_owner_steps(machine.h.state, machine.h.config)
    if sweep is not None:
        machine._step(sweep, interleave=lambda options: options[0])


def walked(machine: Any, walk: Sequence[Action]) -> bool:
    """Performs `walk` (planned on the model) on `machine`'s implementation, step by step, every
    property checked after each step; False if a step of it is not enabled when its turn comes
    (the harness re-ordered what it read back): the walk ends there. Shared by the aiming rules
    here and the refusal machine's (`machine.with_refusals`)."""
    for action in walk:
        if action not in machine.h.enabled():
            return False
        machine._step(action)
        machine.failed = True  # every property, after every step of the walk
        machine.h.check()
        machine.failed = False
    return True


def with_drain_aimed(base: type[RuleBasedStateMachine]) -> type[RuleBasedStateMachine]:
    """`base` and a rule that aims, once per example, at a drain with its owner stepping
    (`aim_at_a_drain`): what catches a drain that loops until its list is empty (design 6),
    whatever the draws (`designs.Stateful.aim_at_drains`)."""

    class DrainAimingMachine(base):  # type: ignore[valid-type, misc]
        """... and aims at a drain with its owner stepping."""

        @precondition(
            lambda self: (
                not self.h.steps_during_drains and not getattr(self, "_no_drain_walk", False)
            )
        )
        @rule()
        def aim_at_a_drain_with_its_owner_stepping(self) -> None:
            aim_at_a_drain(self)

    DrainAimingMachine.__name__ = f"DrainAiming{base.__name__}"
    return DrainAimingMachine
