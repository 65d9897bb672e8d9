"""The model drives the real implementation: every action and fault of the model, several
workers on several servers interleaved, on fakeredis and on a real redis-server. After every step
the real Redis state, mapped to the model's terms, must equal the model's state, and every
property must hold on both; at teardown recovery runs until quiescent and the eventual
properties must hold.

Profiles (tests/conftest.py): `dev` and `ci` run 50 examples; `deep` runs 2,000. Steps per
example: `VERIFY_STEPS` (default 40).
"""

from __future__ import annotations

import os

from hypothesis import settings
from taskcustody_model import REFUSALS, Bounds

from taskcustody.verify.aiming import with_faults_also_aimed
from taskcustody.verify.machine import RETRY_BOUNDS, RunStats, build_machine
from taskcustody.verify.refusal_aiming import MINIMUM
from taskcustody.verify.seeding import DEFAULT_SEED, run_machine
from tests.conftest import Backend

STEPS = int(os.environ.get("VERIFY_STEPS", "40"))
#: At least this many examples whatever the profile: the fault-coverage assertions below need them
#: (30 examples may lose no release reply).
MIN_EXAMPLES = 50


def _run(
    backend: Backend,
    faults: tuple[str, ...],
    *,
    prefetching: bool = False,
    min_examples: int = MIN_EXAMPLES,
    bounds: Bounds | None = None,
    refusals: bool = False,
    aimed: bool = False,
) -> RunStats:
    """One run of the machine; then the checks that it did what it claims: examples ran, faults
    of every kind in `faults` fired, tasks committed, none was lost or duplicated. `refusals`:
    the machine also attempts what the model refuses (`machine.with_refusals`). `aimed`: the
    machine also has a rule that aims at each kind of `faults` in turn
    (`aiming.with_faults_also_aimed`, the base's own fault rules still on), so that they fire
    whatever the seed's draws reach (the kinds must be the model's: `aiming.shots`)."""
    stats = RunStats()
    machine = build_machine(
        backend.client,
        real_redis=backend.real,
        stats=stats,
        prefetching=prefetching,
        bounds=bounds,
        refusals=refusals,
    )
    if aimed:
        machine = with_faults_also_aimed(machine, faults)
    # Seeded unless asked otherwise: the fault-coverage assertions below must not depend on the
    # luck of one random run (the deep profile explores at random, with many more examples).
    random = os.environ.get("HYPOTHESIS_PROFILE") == "deep" or bool(os.environ.get("VERIFY_RANDOM"))
    examples = max(min_examples, settings.default.max_examples)
    run_machine(
        machine,
        settings(
            stateful_step_count=STEPS, derandomize=False, database=None, max_examples=examples
        ),
        None if random else DEFAULT_SEED,
    )
    assert stats.examples > 0 and stats.steps > 0
    for kind in faults:
        assert stats.faults[kind] > 0, f"no {kind} fault in {stats.examples} examples"
    assert stats.tallies["committed"] > 0
    assert stats.tallies["lost"] == 0 and stats.tallies["duplicated"] == 0
    return stats


def test_the_implementation_conforms_to_the_model(backend: Backend) -> None:
    # Aimed: which fault kinds the seed's draws reach moves with every change of the machine's
    # rules; the aiming rule reaches each kind whatever the draws. 100 examples: the search
    # reaches a worker step between two moves of a drain.
    stats = _run(
        backend,
        (
            "dropped-reply:take",
            "dropped-reply:release",
            "dropped-reply:release_and_take",
            "crash_worker",
            "crash_server",
            "stall_server",
        ),
        min_examples=100,
        aimed=True,
    )
    # ... and stalled workers stepped in the middle of drains of their lists
    assert stats.steps_during_drains > 0


def test_the_implementation_refuses_what_the_model_refuses(backend: Backend) -> None:
    """The same machine, with one more rule (a subclass, so the run above draws as before): it
    attempts what the model refuses (a claim of a held id, a heartbeat from a superseded process,
    a sweep's drain of a live list), and the implementation must refuse each, Redis unchanged.
    tests/stateful/test_refusals.py shows that an implementation accepting one fails it."""
    stats = _run(
        backend,
        ("dropped-reply:take", "crash_worker", "stall_server"),
        refusals=True,
        min_examples=100,
    )
    # (each kind aimed at in every example where it is in reach: verify/refusal_aiming.py)
    for kind in REFUSALS:
        assert stats.refusals[kind] >= MINIMUM, (
            f"{kind} attempted {stats.refusals[kind]} times in {stats.examples} examples"
        )


def test_the_prefetching_worker_conforms_to_the_model(backend: Backend) -> None:
    """The same machine, with pipelined takes and releases by a process's workers (the
    prefetching worker) among its rules, and replies lost at any slot of a pipeline."""
    _run(
        backend,
        (
            "dropped-reply:prefetching-take",
            "dropped-reply:prefetching-release",
            "crash_worker",
            "stall_server",
        ),
        prefetching=True,
    )


def test_retry_delays_conform_to_the_model(backend: Backend) -> None:
    """The retrying machine: handlers fail (the model's `retry`), the release schedules the
    retry in the scheduled set, and promotions move due retries back (to the suspects list for a
    task with a recovery count), among every other action and fault."""
    stats = _run(
        backend,
        ("retry", "dropped-reply:release", "crash_worker", "stall_server"),
        bounds=RETRY_BOUNDS,
    )
    assert stats.tallies["committed"] > 0
