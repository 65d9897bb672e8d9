"""The production loop is part of what is verified (issue 14, point 8): the machine runs a worker's
real loop (`Worker.run`: `run_until_stopped`, `run_once`, `release_and_take`, `finish`) with the
model checking every command it sends (verify/loops.py). The real loop conforms; a loop that skips
a step the model requires is caught."""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from taskcustody.verify.machine import RunStats, build_machine
from taskcustody.verify.observation import Mismatch
from taskcustody.verify.run import PASSED, Options, no_local_constants, verify
from tests.conftest import Backend

EXAMPLES = 15
STEPS = 20


def _run(backend: Backend, loop: str = "correct") -> RunStats:
    """A derandomized run; a failure is raised as found (not shrunk: the test wants the kind of
    failure, fast)."""
    stats = RunStats()
    machine = build_machine(backend.client, real_redis=backend.real, stats=stats,
                            drive_loops=True, loop=loop)
    with no_local_constants():
        run_state_machine_as_test(machine, settings=settings(
            stateful_step_count=STEPS, derandomize=True, max_examples=EXAMPLES, deadline=None,
            phases=(Phase.explicit, Phase.generate), report_multiple_bugs=False))
    return stats


def test_the_real_worker_loop_follows_the_model(backend: Backend) -> None:
    stats = _run(backend)
    assert stats.examples > 0
    # the loop really ran, lost replies included, and tasks committed with none lost
    assert stats.faults["loop-commands"] > 0
    assert stats.faults["dropped-reply:loop"] > 0
    assert stats.tallies["committed"] > 0
    assert stats.tallies["lost"] == 0 and stats.tallies["duplicated"] == 0


def test_a_loop_that_skips_its_reconcile_is_caught(backend: Backend) -> None:
    with pytest.raises(Mismatch, match=r"loop: .* did take where the model allows only reconcile"):
        _run(backend, loop="loop-skips-reconcile")


def test_verify_runs_the_production_loops_as_a_part_of_its_own() -> None:
    result = verify(Options(examples=5, steps=15, model_check=False, loops=True,
                            fault_coverage=False))
    assert result.ok
    _, loops = result.parts
    assert loops.name == "production loops" and loops.outcome == PASSED
    assert "commands of the worker's loop checked" in loops.covered
