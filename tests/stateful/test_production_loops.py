"""The production loop is part of what is verified: the machine runs a worker's
real loop (`Worker.run`: `run_until_stopped`, `run_once`, `release_and_take`, `finish`) with the
model checking every command it sends (verify/loops.py). The real loop conforms; a loop that skips
a step the model requires is caught."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from hypothesis import Phase, settings

from taskcustody.cli.app import main
from taskcustody.verify import server_loop
from taskcustody.verify.machine import RunStats, build_machine
from taskcustody.verify.observation import Mismatch
from taskcustody.verify.run import (
    LOOP_EXAMPLES,
    LOOP_KINDS,
    LOOPS_PART,
    PASSED,
    Options,
    verify,
)
from taskcustody.verify.seeding import DEFAULT_SEED, run_machine
from tests.conftest import Backend

EXAMPLES = 15
STEPS = 20
#: The examples and steps of each loop's machine in `taskcustody verify`'s loops part (its
#: default steps: 40).
VERIFY_LOOPS = {
    kind: {"examples": examples, "steps": steps or Options().steps}
    for kind, examples, steps in LOOP_KINDS
}
#: The seed of the runs that must reach a sweep sparing a fresh registration. In the prefetching
#: loop's machine that needs a slot's take to find the queue empty, its process to be judged dead
#: and a sweep, all before the next tick: rare in its draws (the default seed's examples reach
#: none, seed 3's do). The server loop's machine reaches it at the default seed, and is the one
#: that catches design 9 in `taskcustody verify`.
SPARING_SEEDS = {"prefetch": 3, "server": DEFAULT_SEED}


def _run(
    backend: Backend,
    loop: str = "correct",
    kind: str = "worker",
    examples: int = EXAMPLES,
    implementation: str = "correct",
    steps: int = STEPS,
    seed: int = DEFAULT_SEED,
) -> RunStats:
    """A seeded run (`seeding.DEFAULT_SEED` unless `seed`); a failure is raised as found (not
    shrunk: the test wants the kind of failure, fast)."""
    stats = RunStats()
    machine = build_machine(
        backend.client,
        real_redis=backend.real,
        stats=stats,
        drive_loops=True,
        loop=loop,
        loop_kind=kind,
        implementation=implementation,
    )
    run_machine(
        machine,
        settings(
            stateful_step_count=steps,
            max_examples=examples,
            deadline=None,
            database=None,
            phases=(Phase.explicit, Phase.generate),
            report_multiple_bugs=False,
        ),
        seed,
    )
    return stats


def _ran_and_kept_custody(stats: RunStats, loop: str) -> None:
    """The driven `loop` really ran, lost replies included, and tasks committed with none lost
    or duplicated."""
    assert stats.examples > 0
    assert stats.faults[f"dropped-reply:{loop}"] > 0
    assert stats.tallies["committed"] > 0
    assert stats.tallies["lost"] == 0 and stats.tallies["duplicated"] == 0


def test_the_real_worker_loop_follows_the_model(backend: Backend) -> None:
    stats = _run(backend)
    _ran_and_kept_custody(stats, "loop")
    assert stats.faults["loop-commands"] > 0
    # an idle take (the queue empty) is the model's `arm`: the loop registered and waited
    assert stats.faults["loop-arms"] > 0


def test_a_loop_that_skips_its_reconcile_is_caught(backend: Backend) -> None:
    # (a take or a suspect's take, as the draws fall: either skips the reconcile)
    with pytest.raises(
        Mismatch,
        match=r"loop: .* did take(_suspect)? where the model allows "
        r"only reconcile",
    ):
        _run(backend, loop="loop-skips-reconcile")


def test_the_real_prefetching_loop_follows_the_model(backend: Backend) -> None:
    """`PrefetchingWorker.run` itself, driven (verify/prefetch_loop.py): its pipelines, slot by
    slot, are the model's steps, lost replies included."""
    stats = _run(backend, kind="prefetch")
    _ran_and_kept_custody(stats, "prefetch-loop")
    assert stats.faults["prefetch-loop-commands"] > stats.faults["prefetch-loop-writes"] > 0


def test_a_prefetching_loop_that_skips_its_reconcile_is_caught(backend: Backend) -> None:
    """Caught either way, as the draws fall: the loop's take where the model allows only
    reconcile, or, when the check after a lost reply comes first, the worker the model holds
    dirty and the loop does not (the processes' workers differ)."""
    with pytest.raises(Mismatch) as caught:
        _run(backend, loop="prefetch-skips-reconcile", kind="prefetch", examples=30)
    assert re.match(
        r"loop: worker \d of s\d's prefetching loop did take where the model allows "
        r"only reconcile|conformance: processes: model .* != real ",
        f"{caught.value.kind}: {caught.value.message}",
    ), caught.value


def test_the_real_background_thread_follows_the_model(backend: Backend) -> None:
    """`Server._background` itself, driven (verify/server_loop.py): its heartbeats, sweeps and
    promotions are the model's steps, and it sweeps at the cadence its settings say."""
    stats = _run(backend, kind="server", examples=8)
    assert stats.examples > 0
    assert stats.faults["server-loop-beats"] >= server_loop.MIN_BEATS
    # every run of the thread swept, at least once every sweep period
    assert 0 < stats.faults["server-loop-sweeps"] < stats.faults["server-loop-beats"]
    assert stats.tallies["lost"] == 0 and stats.tallies["duplicated"] == 0


def test_a_background_thread_that_stops_sweeping_is_caught(backend: Backend) -> None:
    with pytest.raises(
        Mismatch,
        match=r"loop: the background thread of s\d did not sweep in 2 "
        r"beats",
    ):
        _run(backend, loop="background-sweeps-once", kind="server", examples=8)


@pytest.mark.parametrize("kind", ["prefetch", "server"])
def test_the_prefetch_and_server_loop_machines_drive_the_sweeps_that_would_forget(
    backend: Backend, kind: str
) -> None:
    """Their registrations age too (`machine.LOOP_BOUNDS`), so no sweep is left out: among those
    driven are sweeps that would forget a dead owner's empty list but for its fresh registration
    (a take pending on the empty queue: a prefetching slot's, or a worker's interleaved with the
    background thread), in the model and in Redis alike."""
    stats = _run(backend, kind=kind, seed=SPARING_SEEDS[kind], **VERIFY_LOOPS[kind])
    assert stats.faults["sweeps-sparing-fresh"] > 0
    assert stats.tallies["lost"] == 0 and stats.tallies["duplicated"] == 0
    if kind == "prefetch":
        # a slot whose script found the queue empty registered its list all the same: `arm`
        assert stats.faults["prefetch-loop-arms"] > 0
    else:
        # a worker's take waited on the empty queue between two of the thread's steps: `arm`
        assert stats.faults["arms-interleaved"] > 0


@pytest.mark.parametrize("kind", ["prefetch", "server"])
def test_a_sweep_that_forgets_a_fresh_registration_is_caught_by_the_prefetch_and_server_loops(
    backend: Backend, kind: str
) -> None:
    """Design 9's bug in the real implementation (`broken.GcWhenEmptyServer`, the named mutant
    `gc-when-empty`): a sweep that ignores the registration's age forgets the fresh list of a
    dead owner's pending take, which the model keeps."""
    with pytest.raises(Mismatch, match=r"conformance: .*registered: model .* != real .*fresh: "):
        _run(
            backend,
            kind=kind,
            implementation="gc-when-empty",
            seed=SPARING_SEEDS[kind],
            **VERIFY_LOOPS[kind],
        )


def test_the_default_verify_run_drives_the_production_loops() -> None:
    """The main job, not only this file, catches a loop that breaks the protocol: the part runs
    unless `--no-loops` says otherwise, with the examples of the default run (`LOOP_EXAMPLES`,
    seeded: the same draws as `taskcustody verify`). The named mutant
    run-once-skips-reconcile is caught here (a `loop` mismatch: take where only reconcile), so
    is prefetch-run-once-skips-reconcile (the same, in the prefetching worker's cycle) and
    background-sweeps-once (the server's background thread: it did not sweep in 2 beats)."""
    assert Options().loops and Options().examples >= LOOP_EXAMPLES
    result = verify(
        Options(examples=LOOP_EXAMPLES, model_check=False, shrink=False, fault_coverage=False)
    )
    _, loops = result.parts
    assert loops.name == LOOPS_PART
    assert loops.outcome == PASSED, loops.message
    assert result.ok
    assert "commands of the worker's loop checked" in loops.covered
    assert re.search(
        r"[1-9][\d,]* writes of the prefetching worker's loop checked", loops.covered
    ), loops.covered
    assert re.search(
        r"[1-9][\d,]* beats of the server's background thread checked", loops.covered
    ), loops.covered
    assert re.search(r"[1-9][\d,]* sweeps that had to spare a fresh registration", loops.covered), (
        loops.covered
    )


def test_the_default_command_line_runs_the_production_loops_and_no_loops_leaves_them_out() -> None:
    args = ["verify", "--no-model-check", "--examples", "3", "--steps", "10", "--quiet"]
    default = CliRunner().invoke(main, args)
    assert default.exit_code == 0, default.output
    assert re.search(rf"^  {LOOPS_PART} +PASSED", default.output, re.M), default.output
    without = CliRunner().invoke(main, [*args, "--no-loops"])
    assert without.exit_code == 0, without.output
    assert LOOPS_PART not in without.output
