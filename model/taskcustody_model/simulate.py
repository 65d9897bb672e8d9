"""Simulation beyond the bounds the checker can exhaust: random walks over the model.

Each walk starts from the initial state and has two phases:

1. **Faults allowed**: ``cut`` steps (drawn uniformly from 1 to ``max_depth``), each chosen
   uniformly among the enabled actions, faults included while the budget lasts.
2. **Faults stop**: steps chosen uniformly among the enabled non-fault actions, until a done
   state (``is_done``), a state with no such action, or ``recovery_steps`` steps.

What is checked, on every state and every step of both phases: every safety invariant
(``INVARIANTS``) and the promptness of recovery (``check_transition``), exactly as the checker
does.  The eventual property is checked on each walk's cut point, by the second phase: a walk
whose fault-free continuation ends in a state with nothing left to do that is not done is a
violation (exact: no continuation exists); one that has not reached a done state after
``recovery_steps`` random fault-free steps is reported as a violation too (a sampled verdict: a
different continuation might still recover; with the default limit, far above the length of any
recovery at these sizes, the correct design never trips it).

Unlike the checker, a counterexample is not a shortest one: it is the walk that found it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from .checker import Step, Trace
from .invariants import check_invariants, check_transition, is_done
from .protocol import Config, apply, enabled_actions
from .state import Bounds, State
from .variants import variant as variant_named

#: steps of the faults-allowed phase, at most (each walk draws its own cut, 1 to this)
MAX_DEPTH = 200
#: steps of the fault-free phase before a walk that has not recovered is a violation
RECOVERY_STEPS = 5_000


@dataclass(frozen=True)
class SimulationProgress:
    distinct_states: int
    walks: int
    steps: int
    max_depth: int
    seconds: float


@dataclass(frozen=True)
class SimulationResult:
    ok: bool
    variant: str
    bounds: Bounds
    seed: int
    #: distinct states met, as generated (not reduced by symmetry: a walk never canonicalises)
    distinct_states: int
    walks: int
    steps: int
    #: the longest walk, both phases
    max_depth: int
    seconds: float
    violation: Trace | None
    property: str | None


def simulate(
    bounds: Bounds,
    variant: str = "correct",
    *,
    seed: int = 0,
    seconds: float | None = None,
    max_steps: int | None = None,
    max_depth: int = MAX_DEPTH,
    recovery_steps: int = RECOVERY_STEPS,
    clock: Callable[[], float] = time.monotonic,
    progress: Callable[[SimulationProgress], None] | None = None,
    progress_every: float = 2.0,
) -> SimulationResult:
    """Random walks until a violation, or until ``seconds`` (by ``clock``) or ``max_steps`` steps
    are spent (at least one of the two must be given; a walk under way is finished first only
    if neither budget is spent: the budgets are checked between steps)."""
    if seconds is None and max_steps is None:
        raise ValueError("give a budget: seconds, max_steps or both")
    config = Config(bounds, variant_named(variant))
    rng = random.Random(seed)
    start = clock()
    next_report = start + progress_every
    seen: set[int] = set()
    walks = steps = deepest = 0
    init = config.initial()
    seen.add(hash(init))

    def spent() -> bool:
        return (max_steps is not None and steps >= max_steps) or (
            seconds is not None and clock() - start >= seconds
        )

    def result(violation: Trace | None) -> SimulationResult:
        return SimulationResult(
            ok=violation is None,
            variant=variant,
            bounds=bounds,
            seed=seed,
            distinct_states=len(seen),
            walks=walks,
            steps=steps,
            max_depth=deepest,
            seconds=clock() - start,
            violation=violation,
            property=None if violation is None else violation.property,
        )

    bad = check_invariants(init, config)
    if bad is not None:
        return result(Trace(bad[0], bad[1], init, (), False))
    while not spent():
        walks += 1
        path: list[Step] = []
        state = init
        cut = rng.randint(1, max_depth)
        faults_stop = False
        while True:
            if len(path) >= cut:
                faults_stop = True
            actions = enabled_actions(state, config)
            if faults_stop:
                actions = [a for a in actions if not a.is_fault]
            if not actions:
                # nothing left to do (no fault-free step either): the eventual verdict is exact
                if not is_done(state):
                    return result(
                        Trace(
                            "eventual-recovery",
                            "once faults stop, the protocol has nothing left to do and has not "
                            "committed every task exactly once and cleaned up",
                            init,
                            tuple(path),
                            True,
                        )
                    )
                break
            if faults_stop and is_done(state):
                break
            if faults_stop and len(path) >= cut + recovery_steps:
                return result(
                    Trace(
                        "eventual-recovery",
                        f"once faults stop, {recovery_steps} random protocol steps never reached a "
                        "state where every task committed exactly once and everything is clean "
                        "(a sampled verdict: see taskcustody_model.simulate)",
                        init,
                        tuple(path[:cut]),
                        True,
                    )
                )
            action = actions[rng.randrange(len(actions))]
            broken = check_transition(state, action, config)
            state = apply(state, action, config)
            path.append(Step(action, state))
            steps += 1
            seen.add(hash(state))
            if broken is None:
                broken = check_invariants(state, config)
            if broken is not None:
                return result(Trace(broken[0], broken[1], init, tuple(path), False))
            if progress is not None and steps % 256 == 0 and clock() >= next_report:
                next_report = clock() + progress_every
                progress(
                    SimulationProgress(
                        len(seen), walks, steps, max(deepest, len(path)), clock() - start
                    )
                )
            if spent():
                break
        deepest = max(deepest, len(path))
    return result(None)


def replayable(trace: Trace, config: Config) -> bool:
    """Whether ``trace`` is a run of the model: every step enabled where it is taken and its
    state the one ``apply`` computes (what a simulation's counterexample must be)."""
    state: State = trace.initial
    for step in trace.steps:
        if step.action not in enabled_actions(state, config):
            return False
        state = apply(state, step.action, config)
        if state != step.state:
            return False
    return True
