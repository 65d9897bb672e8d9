"""The checker accepts the correct design and finds each broken one, with a shortest trace."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from taskcustody_model import Bounds
from taskcustody_model.cli import model_check
from taskcustody_model.trace import render_trace

from taskcustody.verify.designs import (
    BYSTANDER_BOUNDS,
    CHECKER_BOUNDS,
    DESIGNS,
    POISON_BOUNDS,
    RETRY_BOUNDS,
)

from .searches import check

#: Each broken design's shortest counterexample (property, length) at its bounds: the designs
#: table's (`taskcustody.verify.designs`, `Pinned`), where each is explained.
PINNED = {d.name: (d.pinned.property, d.pinned.length) for d in DESIGNS}
PINNED_AT = {d.name: d.pinned.bounds for d in DESIGNS}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_broken_variant_is_rejected_with_a_shortest_counterexample(name: str) -> None:
    result = check(PINNED_AT[name], name)
    assert not result.ok
    assert result.violation is not None
    prop, length = PINNED[name]
    assert (result.property, len(result.violation)) == (prop, length), render_trace(
        result.violation
    )


def test_correct_ci_bounds_pass_with_eventual_recovery() -> None:
    """The CI exploration: 3 tasks, 2 servers x 2 workers, 2 faults of any kind, one process per
    server id (194,831 distinct states, depth 24; about a minute on 2 cores. Before the composite
    release_and_take: 192,155, depth 29: the composite shortens paths more than it adds states)."""
    result = check(Bounds(tasks=3, servers=2, workers=2, faults=2, processes_per_server=1))
    assert result.ok, result.violation and render_trace(result.violation)
    assert result.distinct_states > 190_000


WIPE_BOUNDS = Bounds(
    tasks=2, servers=2, workers=1, faults=2, processes_per_server=1, late_tasks=1, redis_faults=True
)


def test_correct_passes_with_redis_wipes_among_the_faults() -> None:
    """Redis restarts empty (redis_wipe) among 2 faults, a task enqueued at any moment: every
    task enqueued after the last wipe commits exactly once, nothing is ever in two places
    (11,053 distinct states)."""
    result = check(WIPE_BOUNDS)
    assert result.ok, result.violation and render_trace(result.violation)
    assert result.distinct_states > 10_000


def test_register_once_is_rejected_when_redis_can_be_wiped() -> None:
    result = check(WIPE_BOUNDS, "register-once")
    assert result.violation is not None
    assert (result.property, len(result.violation)) == ("registered-custody", 4), render_trace(
        result.violation
    )


def test_the_gc_is_rejected_when_a_take_may_outwait_its_grace() -> None:
    """The assumption the registry's garbage collection rests on (a take is served or times out
    within the grace of the registration sent with it), broken: the correct design fails the
    same way as design 9."""
    bounds = Bounds(
        tasks=2, servers=2, workers=1, faults=2, processes_per_server=1, take_wait_bounded=False
    )
    result = check(bounds)
    assert result.violation is not None
    # 9 steps: the composite's lost reply puts the other task in a list (10 before the composite:
    # a release, then a take whose reply is lost)
    assert (result.property, len(result.violation)) == ("registered-custody", 9), render_trace(
        result.violation
    )
    assert [s.action.name for s in result.violation.steps][-3:] == [
        "advance_clock",
        "sweep",
        "take",
    ]
    assert "arm" in [s.action.name for s in result.violation.steps]


def test_correct_per_move_drains_pass() -> None:
    result = check(Bounds(tasks=2, servers=2, workers=1, faults=1, drain_steps=True))
    assert result.ok, result.violation and render_trace(result.violation)


@pytest.mark.parametrize(
    "bounds",
    [
        Bounds(tasks=3, servers=2, workers=2, faults=1, processes_per_server=2),
        Bounds(tasks=2, servers=2, workers=1, faults=2, processes_per_server=2),
    ],
    ids=["3x2x2-1fault", "2x2x1-2faults"],
)
def test_correct_with_a_successor_process_per_stalled_server(bounds: Bounds) -> None:
    """A second process claiming the id of a stalled one (what incarnations are for). The full CI
    bound with two processes per id does not finish in 10 minutes; these two do in seconds."""
    result = check(bounds)
    assert result.ok, result.violation and render_trace(result.violation)


def test_cli_exit_codes() -> None:
    runner = CliRunner()
    listing = runner.invoke(model_check, ["--variant", "list"])
    assert listing.exit_code == 0
    assert "composite-pops-next" in listing.output and "composite-commits-unheld" in listing.output
    assert runner.invoke(model_check, ["--variant", "nope"]).exit_code == 2
    assert runner.invoke(model_check, ["--tasks", "0"]).exit_code == 2
    ok = runner.invoke(model_check, ["--tasks", "1", "--servers", "1", "--faults", "1"])
    assert ok.exit_code == 0, ok.output
    bad = runner.invoke(model_check, ["--variant", "no-release"])
    assert bad.exit_code == 1 and "1. server" in bad.output


# -- poison pills (docs/protocol.md, section 9) ---------------------------------------------------


def test_correct_dead_letters_a_task_recovered_too_often_and_bounds_its_executions() -> None:
    """Every task commits once or is dead-lettered as a poison pill (never lost), and none starts
    executing more than max_recoveries + 1 times (26,452 distinct states; 24,332 before
    suspects)."""
    result = check(POISON_BOUNDS)
    assert result.ok, result.violation and render_trace(result.violation)
    assert result.distinct_states > 20_000


@pytest.mark.parametrize("name", ["recoveries-not-counted", "count-after-recovery"])
def test_recovery_that_does_not_count_in_its_own_step_is_rejected(name: str) -> None:
    """Design 10 never counts; design 11 writes the count in a later step, so a second recovery
    can read a count the first has not written yet (or that a crash in between lost). Both let a
    task that keeps losing its holder run a third time: a stalled holder's task is recovered, the
    stalled worker's release-and-take (custody lost, nothing committed) takes it straight back,
    it is recovered again, and the next release-and-take takes it a third time (8 steps; 11
    before the composite, with a release, a take and a record for each)."""
    result = check(POISON_BOUNDS, name)
    assert result.violation is not None
    # (its length is pinned in the designs table:
    # test_broken_variant_is_rejected_with_a_shortest_counterexample)
    assert [s.action.name for s in result.violation.steps].count("release_and_take") == 2


# -- bystanders: a suspect runs alone (docs/protocol.md, section 9) --------------------------------


@pytest.mark.parametrize(
    "faults",
    [
        1,
        # two deaths: a bystander's and a pill's second; 193,860 distinct states, about 2 minutes
        pytest.param(2, marks=pytest.mark.slow),
    ],
)
def test_correct_runs_each_suspect_alone(faults: int) -> None:
    """No process ever holds two tasks with a recovery count at once (suspects-run-alone), with
    every other property, eventual recovery included (9,836 distinct states with one fault)."""
    result = check(BYSTANDER_BOUNDS._replace(faults=faults))
    assert result.ok, result.violation and render_trace(result.violation)
    assert result.distinct_states > (9_000 if faults == 1 else 190_000)


def test_recovered_tasks_requeued_beside_each_other_are_rejected() -> None:
    """Design 12 (recovery requeues on the queue: the design before suspects). Shortest, with
    two faults: two workers' take replies are lost, their reconciles requeue both tasks counted,
    and one server's two workers take both: one process holds two counted tasks, and its next
    death counts the innocent one again. (With one fault: both workers of a server take, it
    stalls, the clock expires it, the other's sweep requeues both, its two workers take them: 7.)"""
    # (the two-fault length is pinned in the designs table:
    # test_broken_variant_is_rejected_with_a_shortest_counterexample)
    one_fault = check(BYSTANDER_BOUNDS._replace(faults=1), "recovered-to-queue")
    assert one_fault.violation is not None
    assert (one_fault.property, len(one_fault.violation)) == ("suspects-run-alone", 7)


# -- retry delays: the scheduled set (docs/protocol.md, section 10) -------------------------------


def test_correct_schedules_and_promotes_failed_handlers_retries() -> None:
    """A failed handler's retry waits in the scheduled set and a promotion moves it back: every
    property holds, eventual recovery included (a scheduled task is somewhere, and not done)."""
    result = check(RETRY_BOUNDS)
    assert result.ok, result.violation and render_trace(result.violation)
    assert result.distinct_states > 190_000


def test_retries_keep_a_suspect_alone_and_bound_its_executions() -> None:
    """With poison-pill detection, a scheduled retry of a counted task is promoted to the
    suspects list: suspects-run-alone and bounded-executions hold with handler failures."""
    result = check(POISON_BOUNDS._replace(handler_failures=True))
    assert result.ok, result.violation and render_trace(result.violation)
    bystanders = check(BYSTANDER_BOUNDS._replace(faults=1, handler_failures=True))
    assert bystanders.ok, bystanders.violation and render_trace(bystanders.violation)


def test_without_handler_failures_nothing_is_ever_scheduled() -> None:
    """The other bounds' state space is unchanged: no retry, so no promotion to copy."""
    assert check(
        Bounds(tasks=2, servers=2, workers=1, faults=2, processes_per_server=1), "promote-copies"
    ).ok


# -- the composite release-and-take (docs/protocol.md, section 2) --------------------------------


@pytest.mark.parametrize(
    "bounds",
    [
        # one server of two workers: the suspect slot shared by a process's workers
        Bounds(
            tasks=2,
            servers=1,
            workers=2,
            faults=2,
            processes_per_server=1,
            late_tasks=1,
            redis_faults=True,
            max_recoveries=1,
            handler_failures=True,
        ),
        # two servers: stalls, so a composite whose release finds custody lost
        Bounds(
            tasks=2,
            servers=2,
            workers=1,
            faults=2,
            processes_per_server=1,
            late_tasks=1,
            redis_faults=True,
            max_recoveries=1,
            handler_failures=True,
        ),
    ],
    ids=["1x2-shared-slot", "2x1-stalls"],
)
def test_correct_with_the_composite_passes_with_wipes_retries_and_suspects(bounds: Bounds) -> None:
    """The composite (release_and_take) beside everything else: Redis wipes, a late task, handler
    failures (retries scheduled and promoted) and poison-pill detection (suspects, the slot):
    every property holds, eventual recovery included (5,860 and 44,466 distinct states)."""
    result = check(bounds)
    assert result.ok, result.violation and render_trace(result.violation)
    assert result.distinct_states > (5_000 if bounds.servers == 1 else 40_000)


def test_the_composite_s_broken_designs_break_in_the_composite() -> None:
    """Designs 14 and 15 differ from the correct design in the composite only: the last step of
    each counterexample is a release_and_take (design 14's with its reply lost)."""
    pops = check(CHECKER_BOUNDS, "composite-pops-next").violation
    assert pops is not None
    last = pops.steps[-1].action
    assert (last.name, last.command) == ("dropped_reply", "release_and_take")
    unheld = check(CHECKER_BOUNDS, "composite-commits-unheld").violation
    assert unheld is not None
    assert unheld.steps[-1].action.name == "release_and_take"
