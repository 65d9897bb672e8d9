"""`taskcustody verify --max-seconds N`: the time budget stops a run cleanly between parts, model
check reports and stateful examples, says what it covered, and never cuts a counterexample short.

Time is a clock the tests move themselves (at a model-check report, after the k-th example), so
nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner
from taskcustody_model import Bounds

from taskcustody.cli.app import main
from taskcustody.verify import cli as verify_cli
from taskcustody.verify.budget import Budget, BudgetSpent
from taskcustody.verify.machine import RunStats
from taskcustody.verify.run import (
    FAILED,
    LOOPS_PART,
    PARTIAL,
    PASSED,
    SKIPPED,
    Options,
    verify,
)

#: 5,149 states: more than one model-check report (one every 512 states with a budget).
SMALL_MODEL = Bounds(2, 2, 1, 2, processes_per_server=1)


class StepClock:
    """A clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("seconds", [0.0, -1.0, math.nan])
def test_a_budget_must_be_positive_seconds(seconds: float) -> None:
    with pytest.raises(ValueError, match="> 0"):
        Budget(seconds)


def test_a_budget_is_spent_when_its_clock_says_so() -> None:
    clock = StepClock()
    budget = Budget(10, clock)
    budget.check()
    assert not budget.spent() and budget.remaining() == 10
    clock.now = 10
    assert budget.spent() and budget.remaining() == 0
    with pytest.raises(BudgetSpent):
        budget.check()
    assert not Budget(None, clock).spent() and Budget(None, clock).remaining() == math.inf


def test_the_stateful_part_stops_between_examples_and_says_how_many_ran() -> None:
    clock = StepClock()

    def after_example(stats: RunStats) -> None:
        if stats.examples == 3:
            clock.now = 100.0  # spent: the run must end before a 4th example starts

    result = verify(
        Options(examples=50, steps=10, model_check=False, fault_coverage=False),
        on_example=after_example,
        budget=Budget(10, clock),
    )
    assert result.ok and result.partial
    assert result.stats.examples == 3 and result.stats.steps > 0
    part, loops = result.parts
    assert part.outcome == PARTIAL
    assert part.covered == f"3 examples run (50 asked for), {result.stats.steps:,} steps"
    assert loops.name == LOOPS_PART and loops.outcome == SKIPPED


def test_a_run_cut_short_explores_the_first_examples_of_the_run_without_a_budget() -> None:
    """The same examples, in the same order: a budget changes how far a run goes, never where
    (so the reproduce line, which has no budget, finds what the budgeted run found)."""
    full: list[tuple[int, int]] = []
    verify(
        Options(examples=6, steps=15, model_check=False, fault_coverage=False),
        on_example=lambda s: full.append((s.steps, sum(s.faults.values()))),
    )
    clock = StepClock()
    cut: list[tuple[int, int]] = []

    def after_example(stats: RunStats) -> None:
        cut.append((stats.steps, sum(stats.faults.values())))
        if stats.examples == 3:
            clock.now = 100.0

    verify(
        Options(examples=6, steps=15, model_check=False, fault_coverage=False),
        on_example=after_example,
        budget=Budget(10, clock),
    )
    assert len(cut) == 3 and len(full) > 3 and cut == full[:3]


def test_the_model_check_stops_at_a_progress_report_and_the_stateful_part_is_skipped() -> None:
    clock = StepClock()

    def at_report(_: object) -> None:
        clock.now = 100.0

    result = verify(
        Options(examples=5, steps=10, model_bounds=SMALL_MODEL, fault_coverage=False),
        on_model=at_report,
        budget=Budget(10, clock),
    )
    assert result.ok and result.partial and result.model is None
    model, stateful, loops = result.parts
    assert model.name == "model check" and model.outcome == SKIPPED
    assert "stopped by the time budget" in model.message and "states" in model.covered
    assert stateful.outcome == SKIPPED and "--max-seconds 10" in stateful.message
    assert loops.outcome == SKIPPED and "--max-seconds 10" in loops.message
    assert result.stats.examples == 0


def test_without_a_budget_every_part_runs_to_the_end() -> None:
    result = verify(Options(examples=4, steps=10, model_bounds=SMALL_MODEL, fault_coverage=False))
    assert result.ok and not result.partial
    assert [p.outcome for p in result.parts] == [PASSED, PASSED, PASSED]
    # (at least those asked for: Hypothesis may run a few more, as the draws fall)
    assert result.stats.examples >= 4


def test_a_counterexample_found_is_shrunk_and_reported_even_once_the_budget_is_spent() -> None:
    clock = StepClock()

    def after_example(stats: RunStats) -> None:
        clock.now += 100.0  # spent after every example, shrinking's included

    result = verify(
        Options(examples=30, steps=15, model_check=False, variant="blpop-take"),
        on_example=after_example,
        budget=Budget(10, clock),
    )
    assert not result.ok and result.failure is not None
    [part] = result.parts
    assert part.outcome == FAILED and result.failure.kind in part.message


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["verify", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize("value", ["-1", "0", "abc", "nan"])
def test_a_bad_budget_exits_2_with_one_error_line(value: str) -> None:
    code, out = run("--max-seconds", value, "--quiet")
    assert code == 2, out
    errors = [line for line in out.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "--max-seconds" in errors[0] and "> 0" in errors[0]
    assert "Traceback" not in out


def test_a_run_cut_short_exits_0_and_says_partial_everywhere(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clock = StepClock()
    monkeypatch.setattr(verify_cli, "CLOCK", clock)
    original = verify_cli._Progress.on_example

    def on_example(self: verify_cli._Progress, stats: RunStats) -> None:
        original(self, stats)
        if stats.examples == 2:
            clock.now = 1_000.0

    monkeypatch.setattr(verify_cli._Progress, "on_example", on_example)
    page, junit = tmp_path / "run.html", tmp_path / "run.xml"
    code, out = run(
        "--examples",
        "40",
        "--steps",
        "10",
        "--quiet",
        "--no-model-check",
        "--max-seconds",
        "60",
        "--report",
        str(page),
        "--junit-xml",
        str(junit),
        "--no-fault-coverage",
    )
    assert code == 0, out
    assert "PARTIAL" in out and "VERIFIED" not in out
    assert "2 examples run (40 asked for)" in out
    assert "coverage: PARTIAL (0 of 2 parts run to the end)" in out
    html = page.read_text(encoding="utf-8")
    assert "Parts (PARTIAL" in html and "2 examples run (40 asked for)" in html
    assert html.rstrip().endswith("</body></html>")
    case, loops = ET.parse(junit).getroot().iter("testcase")
    assert case.find("failure") is None and case.find("skipped") is None
    assert "2 examples run (40 asked for)" in (case.findtext("system-out") or "")
    assert "partial" in (case.findtext("system-out") or "")
    assert loops.get("name", "").startswith(LOOPS_PART) and loops.find("skipped") is not None


def test_the_help_says_what_the_budget_does() -> None:
    code, out = run("--help")
    assert code == 0
    assert "--max-seconds" in out and "PARTIAL" in out and "--junit-xml" in out
