"""Aiming at a refusal: the shortest walk of harness steps, planned on the
model, to a state where the model refuses an attempt of a given kind; and the gate on how often
each kind was attempted.

The machine with refusals (`machine.with_refusals`) attempts what the model refuses
(`taskcustody_model.refused_attempts`) when its draws reach a state where such an attempt is
possible. A claim of a held id is possible almost always and a sweep's drain of a live list as
soon as a worker holds a task; a heartbeat from a superseded process needs a stall, the clock
moved past the registration's lease, a new process's claim of the id, the resume and the
heartbeat that tells the old process it was superseded: a walk that random draws rarely take.
So the machine does not wait for it: it plans, on the model, a walk of ordinary harness steps
from the current state to one where an attempt of a kind not yet made in this example is
possible (`walk_to_refusal`), performs each step on the implementation, checked, and makes the
attempt.

Breadth first over a few actions (`WALK`), so the walk is a shortest one, and bounded
(`MAX_DEPTH`, `MAX_STATES`): a kind out of reach (the fault budget spent before a stall, say) is
not aimed at again in that example. The planner mirrors what a harness step does to the model
(`aiming.after`: a pass runs whole).

The gate: the refusal part of `taskcustody verify` (its stateful part on the real
implementation) must attempt each kind at least `MINIMUM` times over its examples (once per
`EXAMPLES_PER_ATTEMPT` examples in a smaller run), or the run fails with "REFUSAL COVERAGE NOT
MET" and the counts (`judge`).
"""

from __future__ import annotations

from collections.abc import Mapping

from taskcustody_model import REFUSALS, Action, Attempt, Config, State, refused_attempts

from .aiming import shortest_walk
from .fault_coverage import CountGate, count_html, count_lines

#: The harness steps a walk is made of: enough to hold a task (a live owner's list), to stall a
#: process until its lease lapses and claim its id anew (a held id, a superseded process) and to
#: resume it and let it learn of that (its heartbeat). No wipe, no lost reply, no crash: each is
#: a fault kind of its own, and the fault budget is the stall's.
WALK = (
    "take",
    "record",
    "release",
    "stall_server",
    "advance_clock",
    "claim",
    "startup_drain",
    "resume_server",
    "heartbeat",
)
MAX_DEPTH = 10
MAX_STATES = 3_000

#: The order the machine aims at the kinds not yet attempted in an example: the one random draws
#: rarely reach first (its walk needs a stall, so it must come while the fault budget lasts).
AIM_ORDER = ("heartbeat_superseded", "drain_live", "claim_held")
assert sorted(AIM_ORDER) == sorted(REFUSALS)

#: Each kind must be attempted at least this many times over the refusal part's examples ...
MINIMUM = 3
#: ... or once per this many examples in a smaller run (a run of a few short examples, a smoke
#: test, may not reach every kind in each: the gate is for the default run's 200).
EXAMPLES_PER_ATTEMPT = 10


def minimum_for(examples: int) -> int:
    """The gate's minimum for a run of `examples` examples."""
    return min(MINIMUM, examples // EXAMPLES_PER_ATTEMPT)


def attempts(state: State, config: Config, kind: str) -> list[Attempt]:
    """The attempts of `kind` the model refuses in `state` (empty: none possible here)."""
    return [a for a in refused_attempts(state, config) if a.name == kind]


def walk_to_refusal(state: State, config: Config, kind: str) -> list[Action] | None:
    """A shortest walk of harness steps (`WALK`) from `state` to a state where an attempt of
    `kind` is refused ([] if one is possible now); None if there is none within the planner's
    bounds."""
    if kind not in REFUSALS:
        raise ValueError(f"unknown refusal kind {kind!r}; known: {', '.join(REFUSALS)}")
    return shortest_walk(
        state,
        config,
        lambda s: bool(attempts(s, config, kind)),
        lambda a: a.name in WALK,
        MAX_DEPTH,
        MAX_STATES,
    )


class RefusalCoverage(CountGate):
    """How often each kind of refused attempt was made, and what falls short."""

    def summary(self) -> str:
        counts = ", ".join(f"{k} {n}" for k, n in self.counts.items())
        if self.ok:
            return f"each kind attempted at least {self.minimum} times ({counts})"
        return f"REFUSAL COVERAGE NOT MET: {'; '.join(self.short)} (counts: {counts})"


def judge(counts: Mapping[str, int], minimum: int = MINIMUM) -> RefusalCoverage:
    """The gate: every kind of `REFUSALS` attempted (and refused) at least `minimum` times."""
    own = {k: int(counts.get(k, 0)) for k in REFUSALS}
    cov = RefusalCoverage(own, minimum)
    cov.short = [
        f"{k} attempted {n} times, fewer than the minimum {minimum}"
        for k, n in own.items()
        if n < minimum
    ]
    return cov


def coverage_lines(cov: RefusalCoverage) -> list[str]:
    """The terminal report's section: every kind's count, marked where it falls short."""
    return count_lines(
        f"refusal coverage (each kind attempted >= {cov.minimum} times)", cov.counts, cov.short
    )


def coverage_html(cov: RefusalCoverage) -> str:
    return count_html(
        "Refusal coverage",
        f"each kind of attempt the model refuses made at least {cov.minimum} times",
        cov.counts,
        cov.short,
    )
