"""Simulation (random walks beyond the checker's bounds): every property on every state, budgets
in steps or by an injected clock, counterexamples that replay, the CLI's exit codes."""

from __future__ import annotations

import itertools

import pytest
from click.testing import CliRunner
from taskcustody_model import Bounds, Config
from taskcustody_model.cli import model_check
from taskcustody_model.simulate import SimulationProgress, replayable, simulate
from taskcustody_model.trace import render_trace
from taskcustody_model.variants import variant

#: the sizes of `taskcustody model-check --simulate` in the README (beyond the exhaustive bound)
LARGE = Bounds(tasks=6, servers=3, workers=3, faults=4, processes_per_server=1)


@pytest.mark.parametrize(
    ("name", "prop"),
    [
        ("no-release", "no-duplication"),
        ("drain-before-prune", "prompt-recovery"),
        ("register-once", "registered-custody"),
    ],
)
def test_simulation_finds_a_broken_design_with_a_walk_that_replays(name: str, prop: str) -> None:
    result = simulate(LARGE, name, seed=0, max_steps=20_000)
    assert not result.ok
    assert result.violation is not None
    assert result.property == prop, render_trace(result.violation)
    assert result.steps < 20_000
    assert replayable(result.violation, Config(LARGE, variant(name)))


def test_simulation_passes_the_correct_design_for_a_step_budget() -> None:
    result = simulate(LARGE, seed=0, max_steps=15_000)
    assert result.ok, result.violation and render_trace(result.violation)
    assert result.steps == 15_000
    assert result.walks > 100 and result.max_depth > 20
    assert 1_000 < result.distinct_states <= result.steps + 1


def test_simulation_is_deterministic_for_a_seed() -> None:
    runs = [
        simulate(LARGE, "processing-sweep-no-custody", seed=3, max_steps=20_000) for _ in range(2)
    ]
    assert runs[0].violation is not None
    assert runs[0].violation == runs[1].violation
    assert (runs[0].steps, runs[0].walks) == (runs[1].steps, runs[1].walks)


def test_the_seconds_budget_and_progress_follow_the_injected_clock() -> None:
    ticks = itertools.count()
    reports: list[SimulationProgress] = []
    result = simulate(
        LARGE,
        seed=0,
        seconds=3_000,
        clock=lambda: float(next(ticks)),
        progress=reports.append,
        progress_every=500,
    )
    assert result.ok
    # one clock reading per step (the budget), a few more per walk and per report
    assert 1_000 < result.steps < 3_000
    assert reports and all(b.steps > a.steps for a, b in itertools.pairwise(reports))


def test_a_walk_that_has_not_recovered_within_the_limit_is_an_eventual_violation() -> None:
    """With no fault-free steps allowed after the cut, the first walk whose cut is not a done
    state is reported, as an eventual violation at its cut."""
    result = simulate(LARGE, seed=0, max_steps=1_000, recovery_steps=0)
    assert result.violation is not None
    assert result.property == "eventual-recovery" and result.violation.eventual
    assert "faults stop" in render_trace(result.violation)


def test_a_budget_is_required() -> None:
    with pytest.raises(ValueError, match="budget"):
        simulate(LARGE)


def test_cli_simulate_exit_codes() -> None:
    runner = CliRunner()
    small = ["--simulate", "--tasks", "3", "--servers", "2", "--workers", "2", "--faults", "2"]
    ok = runner.invoke(model_check, [*small, "--steps", "2000"])
    assert ok.exit_code == 0, ok.output
    assert "walks" in ok.output and "all properties hold on every walk" in ok.output
    bad = runner.invoke(model_check, [*small, "--steps", "20000", "--variant", "no-release"])
    assert bad.exit_code == 1, bad.output
    assert "property violated: no-duplication" in bad.output and "1. server" in bad.output
    assert runner.invoke(model_check, ["--seconds", "5"]).exit_code == 2
    assert runner.invoke(model_check, ["--simulate", "--no-eventual"]).exit_code == 2
    assert runner.invoke(model_check, ["--simulate", "--steps", "0"]).exit_code == 2


def test_the_tracked_time_to_find_covers_every_broken_design() -> None:
    """bench/results/time_to_find.json (`python -m bench.checker --time-to-find`) lists every
    broken design, each found by every seed: a design added without rerunning it fails here."""
    import json
    from pathlib import Path

    from taskcustody_model.variants import VARIANTS

    path = Path(__file__).resolve().parents[2] / "bench" / "results" / "time_to_find.json"
    data = json.loads(path.read_text())
    assert set(data["designs"]) == set(VARIANTS) - {"correct"}
    for name, row in data["designs"].items():
        assert row["found"] == row["seeds"] == data["seeds"] >= 10, name
        assert row["median_steps"] > 0


def test_the_time_to_find_table_has_a_row_per_design() -> None:
    checker = pytest.importorskip("bench.checker")
    data = {
        "bounds": checker.SIMULATION_BOUNDS,
        "seeds": 2,
        "budget_seconds": 5.0,
        "designs": {
            "no-release": {
                "extras": {},
                "found": 2,
                "seeds": 2,
                "properties": ["no-duplication"],
                "median_steps": 7.5,
                "median_seconds": 0.01,
                "max_seconds": 0.02,
                "median_trace_length": 7,
            },
            "promote-copies": {
                "extras": {"handler_failures": True},
                "found": 0,
                "seeds": 2,
                "properties": [],
                "median_steps": None,
                "median_seconds": None,
                "max_seconds": None,
                "median_trace_length": None,
            },
        },
    }
    table = checker.time_to_find_markdown(data, "cmd", "now")
    assert "| no-release | - | 2/2 | no-duplication | 8 | 0.01 | 0.02 | 7 |" in table
    assert "| promote-copies | handler_failures=True | 0/2 |  | - | - | - | - |" in table
