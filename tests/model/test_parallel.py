"""The parallel search (``check(..., jobs=2)``) reaches the sequential search's verdicts: the same
counterexample for every broken design, and for the correct design the same depth and, where the
canonical forms are stable, the same states (see ``taskcustody_model.parallel``)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from taskcustody_model import Bounds, check
from taskcustody_model.cli import model_check
from taskcustody_model.variants import VARIANTS

from taskcustody.verify.designs import DESIGNS

from .searches import check as cached_check

PINNED_AT = {d.name: d.pinned.bounds for d in DESIGNS}


def test_the_parallel_search_explores_exactly_the_sequential_states_at_a_small_bound() -> None:
    bounds = Bounds(tasks=2, servers=2, workers=1, faults=1, processes_per_server=1)
    one, two = check(bounds), check(bounds, jobs=2)
    assert (two.ok, two.distinct_states, two.states_generated, two.depth) == (
        one.ok,
        one.distinct_states,
        one.states_generated,
        one.depth,
    )


@pytest.mark.parametrize(
    "bounds",
    [
        Bounds(tasks=2, servers=2, workers=2, faults=1, processes_per_server=1),
        Bounds(tasks=2, servers=2, workers=1, faults=2, processes_per_server=2),
    ],
    ids=["2x2x2-1fault", "2x2x1-2faults-2procs"],
)
def test_the_parallel_search_accepts_the_correct_design_at_the_same_depth(bounds: Bounds) -> None:
    one, two = check(bounds), check(bounds, jobs=2)
    assert one.ok and two.ok
    assert two.depth == one.depth
    # the canonical forms' tie-breaks make the sequential figures order-dependent (module doc):
    # the parallel search meets a few more representatives, never fewer classes
    assert two.distinct_states >= one.distinct_states


@pytest.mark.parametrize("name", sorted(set(VARIANTS) - {"correct"}))
def test_the_parallel_search_finds_each_broken_design_s_sequential_counterexample(
    name: str,
) -> None:
    bounds = PINNED_AT[name]
    two = check(bounds, name, jobs=2)
    one = cached_check(bounds, name)
    assert two.violation is not None and one.violation is not None
    assert (two.property, len(two.violation), two.distinct_states, two.states_generated) == (
        one.property,
        len(one.violation),
        one.distinct_states,
        one.states_generated,
    )


def test_model_check_takes_jobs_and_refuses_them_with_simulate() -> None:
    runner = CliRunner()
    ok = runner.invoke(
        model_check,
        ["--tasks", "1", "--servers", "1", "--workers", "1", "--faults", "0", "--jobs", "2"],
    )
    assert ok.exit_code == 0, ok.output
    assert "all properties hold within the bounds" in ok.output
    broken = runner.invoke(model_check, ["--variant", "blpop-take", "--jobs", "2"])
    assert broken.exit_code == 1
    bad = runner.invoke(model_check, ["--simulate", "--jobs", "2", "--steps", "1"])
    assert bad.exit_code == 2
    assert "--jobs" in bad.output and "Traceback" not in bad.output


@pytest.mark.parametrize(
    "bounds",
    [
        Bounds(tasks=2, servers=2, workers=1, faults=1, processes_per_server=1),
        Bounds(tasks=2, servers=2, workers=1, faults=2, processes_per_server=2),
    ],
    ids=["2x2x1-1fault", "2x2x1-2faults-2procs"],
)
def test_the_parallel_search_reduces_as_the_sequential_one_does(bounds: Bounds) -> None:
    one, two = check(bounds, reduce=True), check(bounds, jobs=2, reduce=True)
    full = cached_check(bounds)
    assert one.ok and two.ok and two.reduced
    assert two.depth == one.depth
    # fewer states than the unreduced search, and (module doc) at least the sequential classes
    assert one.distinct_states <= two.distinct_states < full.distinct_states
    assert two.states_generated < full.states_generated


@pytest.mark.parametrize("name", ["no-release", "gc-when-empty", "unbounded-drain"])
def test_a_reduced_parallel_search_reports_the_sequential_counterexample(name: str) -> None:
    bounds = PINNED_AT[name]
    two = check(bounds, name, jobs=2, reduce=True)
    one = cached_check(bounds, name)
    assert two.violation is not None and one.violation is not None and not two.reduced
    assert (two.property, two.violation.steps, two.distinct_states) == (
        one.property,
        one.violation.steps,
        one.distinct_states,
    )
