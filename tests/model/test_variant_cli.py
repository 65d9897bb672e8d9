"""`model-check --variant NAME` checks a design at its own bounds: with no other flag, every broken
design is rejected with the counterexample its row pins, and the first line says which bounds ran;
`--variant list` shows each design's bounds and counterexample; a flag replaces one bound."""

from __future__ import annotations

import re
from typing import Any

import pytest
from click.testing import CliRunner, Result
from taskcustody_model import Bounds, CheckResult
from taskcustody_model import cli as cli_module
from taskcustody_model.cli import model_check
from taskcustody_model.trace import describe_bounds
from taskcustody_model.variants import DEFAULT_BOUNDS, POISON_BOUNDS, RETRY_BOUNDS, VARIANTS

from .searches import check

BROKEN = [name for name, v in VARIANTS.items() if name != "correct"]
VIOLATION = re.compile(r"^property violated: ([\w-]+): ", re.M)
#: a numbered step of the trace (an eventual-recovery trace ends with a numbered line that is no
#: step: "faults stop: no sequence of protocol steps from here recovers every task")
STEP = re.compile(r"^(\d+)\. (?!faults stop)", re.M)


def invoke(*argv: str) -> Result:
    return CliRunner().invoke(model_check, list(argv))


def own_line(bounds: Bounds) -> str:
    return f"bounds: {describe_bounds(bounds)} (the design's own; flags override)"


@pytest.mark.parametrize("name", BROKEN)
def test_a_broken_design_is_rejected_at_its_own_bounds_with_its_pinned_counterexample(
    name: str,
) -> None:
    """No flag but the design's name: the run is at the design's bounds, says so first, exits 1,
    and breaks the property its row pins in as many steps as the row says (the pin `--variant
    list` shows)."""
    v = VARIANTS[name]
    result = invoke("--variant", name)
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == own_line(v.own_bounds)
    prop = VIOLATION.search(result.stdout)
    assert prop is not None and v.counterexample is not None
    steps = [int(n) for n in STEP.findall(result.stdout)]
    assert (prop.group(1), max(steps)) == v.counterexample


def test_each_broken_design_pins_a_counterexample_and_the_correct_one_none() -> None:
    assert VARIANTS["correct"].counterexample is None
    assert VARIANTS["correct"].own_bounds == DEFAULT_BOUNDS
    for name in BROKEN:
        assert VARIANTS[name].counterexample is not None, name


def test_the_listing_shows_every_design_with_its_bounds_and_counterexample() -> None:
    result = invoke("--variant", "list")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 2 * len(VARIANTS)
    for (head, detail), v in zip(
        zip(lines[::2], lines[1::2], strict=True), VARIANTS.values(), strict=True
    ):
        assert head.split(maxsplit=1) == [v.name, v.description]
        bounds, found = detail.strip().removeprefix("bounds: ").split("; ")
        assert bounds == describe_bounds(v.own_bounds), v.name
        if v.counterexample is None:
            assert found == "no counterexample"
        else:
            prop, length = v.counterexample
            assert found == f"counterexample: {prop}, {length} step{'s' if length != 1 else ''}"


def test_an_unknown_variant_is_one_line_and_exit_2() -> None:
    result = invoke("--variant", "no-such-design")
    assert result.exit_code == 2
    assert len(result.output.splitlines()) == 1, result.output
    assert "'no-such-design'" in result.output and "no-release" in result.output


#: What the stand-in checker answers: a search of a state space of a few states.
TINY = Bounds(tasks=1, servers=1, workers=1, faults=0, processes_per_server=1)


class Searches:
    """Stands in for the checker: records the bounds each run asks for, and answers with a tiny
    search that passes, so that these tests of which bounds run cost no search of their own."""

    def __init__(self) -> None:
        self.asked: list[tuple[Bounds, str]] = []

    def __call__(self, bounds: Bounds, variant: str, **_: Any) -> CheckResult:
        self.asked.append((bounds, variant))
        return check(TINY)


@pytest.fixture
def searches(monkeypatch: pytest.MonkeyPatch) -> Searches:
    s = Searches()
    monkeypatch.setattr(cli_module, "check", s)
    return s


def test_the_correct_design_runs_at_the_unchanged_defaults(searches: Searches) -> None:
    """The defaults are those of the CI exploration, which passes
    (`test_checker.py::test_correct_ci_bounds_pass_with_eventual_recovery`)."""
    ci = Bounds(tasks=3, servers=2, workers=2, faults=2, processes_per_server=1)
    assert ci == DEFAULT_BOUNDS
    result = invoke()
    assert result.exit_code == 0, result.output
    assert searches.asked == [(DEFAULT_BOUNDS, "correct")]
    assert result.stdout.splitlines()[0] == own_line(DEFAULT_BOUNDS)


@pytest.mark.parametrize(
    ("argv", "bounds", "named"),
    [
        (
            ("--variant", "promote-copies", "--faults", "1", "--no-handler-failures"),
            RETRY_BOUNDS._replace(faults=1, handler_failures=False),
            "--faults --no-handler-failures",
        ),
        (
            ("--variant", "recoveries-not-counted", "--max-recoveries", "off", "--tasks", "2"),
            POISON_BOUNDS._replace(max_recoveries=None, tasks=2),
            "--tasks --max-recoveries",
        ),
        (
            (
                "--variant",
                "cancelled-release-ran",
                "--no-cancels-before-send",
                "--takes-outwait-grace",
            ),
            VARIANTS["cancelled-release-ran"].own_bounds._replace(
                cancels_before_send=False, take_wait_bounded=False
            ),
            "--takes-outwait-grace --no-cancels-before-send",
        ),
        (
            (
                "--variant",
                "no-release",
                "--processes-per-server",
                "1",
                "--redis-faults",
                "--late-tasks",
                "1",
                "--atomic-drains",
            ),
            VARIANTS["no-release"].own_bounds._replace(
                processes_per_server=1, redis_faults=True, late_tasks=1, drain_steps=False
            ),
            "--processes-per-server --atomic-drains --late-tasks --redis-faults",
        ),
    ],
    ids=["turn-off", "recoveries-off", "cancels-off-grace-on", "four-more"],
)
def test_a_flag_replaces_one_of_the_design_s_bounds_and_is_named(
    searches: Searches, argv: tuple[str, ...], bounds: Bounds, named: str
) -> None:
    result = invoke(*argv, "--no-eventual")
    assert searches.asked == [(bounds, argv[1])], result.output
    assert result.stdout.splitlines()[0] == (
        f"bounds: {describe_bounds(bounds)} ({named} from the command line, the rest the "
        "design's own)"
    )


def test_late_tasks_are_checked_against_the_tasks_the_run_has(searches: Searches) -> None:
    """The design's own tasks count: recoveries-not-counted has one task, so two late are too
    many, and nothing is searched."""
    result = invoke("--variant", "recoveries-not-counted", "--late-tasks", "2")
    assert result.exit_code == 2
    assert "--late-tasks" in result.output and searches.asked == []
