"""The partial-order reduction (``taskcustody_model/reduction.py``) is sound: its claims hold on
every state of unreduced searches at small bounds, and both searches give every design the same
verdict."""

from __future__ import annotations

import pytest
from taskcustody_model import VARIANTS, Bounds, Config, apply, check, enabled_actions, variant
from taskcustody_model.checker import _search
from taskcustody_model.invariants import check_invariants, check_transition, is_done
from taskcustody_model.protocol import Action
from taskcustody_model.reduction import eligible, progress
from taskcustody_model.state import State
from taskcustody_model.symmetry import canonical

from taskcustody.verify.designs import DESIGNS

PINNED_AT = {d.name: d.pinned.bounds for d in DESIGNS}

#: small bounds at which the fault budget is spent in many ways: stalls beside successors (2
#: processes per id), crashes, lost replies, per-move drains, Redis wipes, handler failures
SMALL = {
    "2x1x1-2faults-2ppi": Bounds(tasks=2, servers=1, workers=1, faults=2, processes_per_server=2),
    "2x1x2-1fault-2ppi": Bounds(tasks=2, servers=1, workers=2, faults=1, processes_per_server=2),
    "2x2x1-1fault-2ppi": Bounds(tasks=2, servers=2, workers=1, faults=1, processes_per_server=2),
    "1x1x1-2faults-2ppi-drain-steps": Bounds(
        tasks=1, servers=1, workers=1, faults=2, processes_per_server=2, drain_steps=True
    ),
    "wipes-late": Bounds(
        tasks=1,
        servers=2,
        workers=1,
        faults=1,
        processes_per_server=2,
        late_tasks=1,
        redis_faults=True,
    ),
    "retries": Bounds(
        tasks=2, servers=2, workers=1, faults=1, processes_per_server=2, handler_failures=True
    ),
}

Agent = tuple[str, int, int, int, str, int]


def _agent(state: State, action: Action) -> Agent:
    """``action`` with its process named by incarnation, not by its index (a process that exits
    moves the ones after it)."""
    inc = state.processes[action.server][action.proc].inc if action.proc >= 0 else -1
    return (action.name, action.server, inc, action.worker, action.command, action.task)


def _find(state: State, agent: Agent, config: Config) -> Action | None:
    for action in enabled_actions(state, config):
        if _agent(state, action) == agent:
            return action
    return None


def _verdicts(state: State, config: Config) -> tuple[object, ...]:
    """What the properties say of ``state``: the invariants, ``is_done``, and the transition
    property of each sweep or startup drain it enables (by its agent)."""
    steps = {
        _agent(state, a): check_transition(state, a, config) is None
        for a in enabled_actions(state, config)
        if a.name in ("sweep", "startup_drain")
    }
    bad = check_invariants(state, config)
    return (None if bad is None else bad[0], is_done(state), steps)


def _invisible(before: State, after: State, config: Config) -> bool:
    """The same invariants broken and ``is_done`` the same, and each sweep or startup drain
    enabled before still enabled, breaking the transition property iff it did. (The step may
    enable new ones, e.g. a resumed process's own loop: those are steps of the full graph too.)"""
    bad, done, steps = _verdicts(before, config)
    bad_after, done_after, steps_after = _verdicts(after, config)
    assert isinstance(steps, dict) and isinstance(steps_after, dict)
    return (bad, done) == (bad_after, done_after) and all(
        steps_after.get(agent) == ok for agent, ok in steps.items()
    )


def _claims_hold(bounds: Bounds, name: str) -> int:
    """Every state of the unreduced search whose fault budget is spent: each eligible step is
    invisible (the properties say the same of the state after it), raises ``progress`` by one,
    and commutes with every other enabled step, which leaves it enabled and eligible (so it stays
    independent on every path without it, by induction over the search). Returns how many
    eligible steps were checked."""
    config = Config(bounds, variant(name))
    init = canonical(config.initial(), bounds.workers)
    seen = {init}
    todo = [init]
    checked = 0
    while todo:
        st = todo.pop()
        if check_invariants(st, config) is not None:
            continue
        actions = enabled_actions(st, config)
        spent = st.faults >= bounds.faults
        for a in actions:
            if spent and eligible(st, a, config):
                checked += 1
                after = apply(st, a, config)
                assert _invisible(st, after, config), a
                assert progress(after) == progress(st) + 1, a
                for b in actions:
                    if b == a:
                        continue
                    b_then = apply(st, b, config)
                    a_again = _find(b_then, _agent(st, a), config)
                    assert a_again is not None, (a, b)
                    assert eligible(b_then, a_again, config), (a, b)
                    b_again = _find(after, _agent(st, b), config)
                    assert b_again is not None, (a, b)
                    assert apply(after, b_again, config) == apply(b_then, a_again, config), (a, b)
            nxt = canonical(apply(st, a, config), bounds.workers)
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return checked


@pytest.mark.parametrize("label", sorted(SMALL))
def test_the_eligible_steps_commute_and_change_no_property(label: str) -> None:
    assert _claims_hold(SMALL[label], "correct") > 0


@pytest.mark.parametrize(
    "name",
    [
        "sweep-drains-live",
        "unbounded-drain",
        "gc-when-empty",
        "register-once",
        "composite-commits-unheld",
    ],
)
def test_the_claims_hold_for_broken_designs_too(name: str) -> None:
    _claims_hold(SMALL["2x2x1-1fault-2ppi"], name)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_reduced_search_gives_every_design_the_same_verdict(name: str) -> None:
    """The reduced search on its own (before ``check`` searches a violation again) agrees with
    the unreduced one on whether, and which property, breaks: at two small bounds, and for a
    broken design at the bounds its counterexample is pinned at."""
    cases = [SMALL["2x1x1-2faults-2ppi"], SMALL["2x1x2-1fault-2ppi"]]
    if name != "correct":
        cases.append(PINNED_AT[name])
    for bounds in cases:
        full = _search(bounds, name, None, 2.0, True, 1, False)
        reduced = _search(bounds, name, None, 2.0, True, 1, True)
        assert (reduced.ok, reduced.property) == (full.ok, full.property), (name, bounds)
        if full.ok:
            assert reduced.distinct_states <= full.distinct_states


def test_check_reports_the_unreduced_counterexample() -> None:
    bounds = PINNED_AT["gc-when-empty"]
    reduced = check(bounds, "gc-when-empty", reduce=True)
    full = check(bounds, "gc-when-empty")
    assert not reduced.reduced and reduced.violation is not None and full.violation is not None
    assert (reduced.property, len(reduced.violation), reduced.distinct_states) == (
        full.property,
        len(full.violation),
        full.distinct_states,
    )
