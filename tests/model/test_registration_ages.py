"""Registrations that age (``Bounds.registration_ages``, off by default; docs/protocol.md,
section 8): a registration (ZADD, score = now) is fresh when made and old once the clock
advances; the registry's garbage collection forgets only old ones, which is what the
implementation checks (the score against now - grace, the grace being one tick). A tick ends
every pending take (``ARMED``): Redis served it before, or timed it out, and the worker's loop
sends it again (``arm``, which registers the list again).

This is what the loop-driven stateful run uses (``machine.LOOP_BOUNDS``, a harness grace of one
tick), so that Redis and the model agree on which lists a sweep may forget: the checker accepts
the correct design with it and rejects design 9 (``gc-when-empty``), whose collection forgets a
registration however young."""

from __future__ import annotations

from taskcustody_model import Action, Bounds, Config, apply, enabled_actions, initial_state, variant
from taskcustody_model.invariants import check_invariants
from taskcustody_model.state import ARMED, IDLE, State

from .searches import check

#: 1 task, enqueued late (so that it can arrive while a take waits), 2 servers of 1 worker, 1
#: fault: the smallest bounds that show design 9 with registrations that age.
AGES = Bounds(tasks=1, servers=2, workers=1, faults=1, late_tasks=1, registration_ages=True)
CFG = Config(AGES, variant("correct"))


def step(
    state: State, name: str, s: int = -1, i: int = -1, w: int = -1, cfg: Config = CFG
) -> State:
    action = Action(name, s, i, w)
    assert action in enabled_actions(state, cfg), f"{action} not enabled"
    after = apply(state, action, cfg)
    assert check_invariants(after, cfg) is None, check_invariants(after, cfg)
    return after


def test_it_is_off_by_default_so_the_other_bounds_keep_their_state_space() -> None:
    off = Config(AGES._replace(registration_ages=False), CFG.variant)
    st = initial_state(off.bounds)
    assert st.fresh == ()
    st = step(step(st, "arm", 0, 0, 0, cfg=off), "stall_server", 0, 0, cfg=off)
    st = step(st, "advance_clock", cfg=off)
    assert st.fresh == () and st.processes[0][0].workers[0].phase == ARMED


def test_a_registration_is_fresh_until_the_clock_advances() -> None:
    st = initial_state(AGES)
    assert st.fresh == st.registered  # the claims registered every list just now
    st = step(step(st, "stall_server", 0, 0), "advance_clock")
    assert st.fresh == ()
    st = step(st, "arm", 0, 0, 0)  # the take's pipeline registers the list again
    assert st.fresh == ((0, 0, 0),)


def test_a_tick_ends_a_pending_take_and_the_loop_sends_it_again() -> None:
    st = step(initial_state(AGES), "stall_server", 0, 0)
    st = step(st, "arm", 0, 0, 0)
    st = step(st, "advance_clock")
    assert st.processes[0][0].workers[0].phase == IDLE  # Redis timed the BLMOVE out
    assert Action("arm", 0, 0, 0) in enabled_actions(st, CFG)


def test_the_sweep_forgets_an_old_registration_and_spares_a_fresh_one() -> None:
    st = step(step(initial_state(AGES), "stall_server", 0, 0), "advance_clock")
    old = step(st, "sweep", 1, 0)  # s0 expired; its empty list was registered a tick ago
    assert (0, 0, 0) not in old.registered
    fresh = step(step(st, "arm", 0, 0, 0), "sweep", 1, 0)  # its take registered it just now
    assert (0, 0, 0) in fresh.registered
    # design 9 forgets it all the same
    naive = CFG._replace(variant=variant("gc-when-empty"))
    forgot = apply(apply(st, Action("arm", 0, 0, 0), naive), Action("sweep", 1, 0), naive)
    assert (0, 0, 0) not in forgot.registered


def test_the_checker_accepts_the_correct_design_with_registrations_that_age() -> None:
    result = check(AGES)
    assert result.ok, result.violation
    # (2.5 times the 819 classes of the same bounds without the ages: a registration's age and a
    # tick that ends a pending take are state the other bounds abstract away)
    assert (result.distinct_states, result.depth) == (2_052, 15)


def test_the_checker_rejects_design_9_with_registrations_that_age() -> None:
    """Its shortest counterexample (6 steps): s0 stalls and expires; its worker, still running,
    sends a take on the empty queue (registering its list); s1's sweep prunes s0 and forgets the
    list at once, though its registration is fresh; a task arrives, and Redis serves the pending
    take into the forgotten list. (Without the ages, the take is sent before the stall: 8 steps
    at the checker's bounds; here a take sent before the tick times out at the tick.)"""
    result = check(AGES, "gc-when-empty")
    assert not result.ok and result.violation is not None
    assert result.property == "registered-custody"
    assert [s.action.name for s in result.violation.steps] == [
        "stall_server",
        "advance_clock",
        "arm",
        "sweep",
        "enqueue",
        "take",
    ]


def test_takes_that_outwait_the_grace_break_the_correct_design_too() -> None:
    """The assumption the collection rests on (``take_wait_bounded``): without it a pending take
    outlives the tick, its registration ages, and the correct design's sweep forgets the list."""
    result = check(AGES._replace(take_wait_bounded=False))
    assert result.property == "registered-custody" and result.violation is not None
    assert len(result.violation) == 6


def test_a_sweep_that_only_spares_a_fresh_registration_is_enabled_and_changes_nothing() -> None:
    """That sweep is where a collection that ignores the age differs, so the stateful run must be
    able to drive it; the model's state after it is the state before."""
    st = step(
        step(step(initial_state(AGES), "stall_server", 0, 0), "advance_clock"), "sweep", 1, 0
    )  # s0 pruned, its old registration forgotten
    assert Action("sweep", 1, 0) not in enabled_actions(st, CFG)  # nothing to do
    st = step(st, "arm", 0, 0, 0)
    sweep = Action("sweep", 1, 0)
    assert sweep in enabled_actions(st, CFG)
    assert apply(st, sweep, CFG) == st
    off = Config(AGES._replace(registration_ages=False), CFG.variant)
    assert sweep not in enabled_actions(st._replace(fresh=()), off)
