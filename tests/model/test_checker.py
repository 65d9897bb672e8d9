"""The checker accepts the correct design and finds each broken one, with a shortest trace."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from taskcustody_model import Bounds, check
from taskcustody_model.cli import model_check
from taskcustody_model.trace import render_trace

# The length of each broken design's shortest counterexample at the CI bounds below.
PINNED = {
    "blpop-take": ("no-loss", 1),
    "no-release": ("no-duplication", 3),
    "sweep-drains-live": ("no-double-execution", 3),
    "startup-skips-own": ("prompt-recovery", 5),
    "processing-sweep-no-custody": ("no-duplication", 6),
    "unbounded-drain": ("bounded-work", 8),
    "drain-before-prune": ("prompt-recovery", 4),
}

VARIANT_BOUNDS = Bounds(tasks=3, servers=2, workers=2, faults=2)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_broken_variant_is_rejected_with_a_shortest_counterexample(name: str) -> None:
    result = check(VARIANT_BOUNDS, name)
    assert not result.ok
    assert result.violation is not None
    prop, length = PINNED[name]
    assert (result.property, len(result.violation)) == (prop, length), render_trace(
        result.violation
    )


def test_correct_ci_bounds_pass_with_eventual_recovery() -> None:
    """The CI exploration: 3 tasks, 2 servers x 2 workers, 2 faults of any kind, one process per
    server id (about a minute on 2 cores; 42,418 distinct states, depth 25)."""
    result = check(Bounds(tasks=3, servers=2, workers=2, faults=2, processes_per_server=1))
    assert result.ok, result.violation and render_trace(result.violation)
    assert result.distinct_states > 40_000


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
    assert runner.invoke(model_check, ["--variant", "list"]).exit_code == 0
    assert runner.invoke(model_check, ["--variant", "nope"]).exit_code == 2
    assert runner.invoke(model_check, ["--tasks", "0"]).exit_code == 2
    ok = runner.invoke(model_check, ["--tasks", "1", "--servers", "1", "--faults", "1"])
    assert ok.exit_code == 0, ok.output
    bad = runner.invoke(model_check, ["--variant", "no-release"])
    assert bad.exit_code == 1 and "1. server" in bad.output
