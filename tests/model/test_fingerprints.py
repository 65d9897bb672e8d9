"""The checker's hash compaction (``check(..., fingerprints=True)``, ``model-check
--fingerprints``): the same search in a fraction of the memory, a violation searched again with
states stored, and the chance of a collision reported."""

from __future__ import annotations

import tracemalloc

import pytest
from click.testing import CliRunner
from taskcustody_model import VARIANTS, Bounds, CheckResult, check
from taskcustody_model.checker import Progress, _search
from taskcustody_model.cli import model_check

from taskcustody.verify.designs import DESIGNS

PINNED_AT = {d.name: d.pinned.bounds for d in DESIGNS}

SMALL = (
    Bounds(tasks=3, servers=2, workers=2, faults=1, processes_per_server=1),
    Bounds(tasks=2, servers=1, workers=1, faults=2, processes_per_server=2),
    Bounds(
        tasks=2,
        servers=2,
        workers=1,
        faults=1,
        processes_per_server=2,
        late_tasks=1,
        redis_faults=True,
    ),
)


def _figures(result: CheckResult) -> tuple[object, ...]:
    return (
        result.ok,
        result.property,
        result.distinct_states,
        result.states_generated,
        result.depth,
    )


@pytest.mark.parametrize("reduce", [False, True])
@pytest.mark.parametrize("bounds", SMALL)
def test_fingerprints_explore_what_stored_states_explore(bounds: Bounds, reduce: bool) -> None:
    """No collision at these bounds, so every figure is the exact search's (a state merged with
    another by a collision would leave its own successors out of the counts)."""
    exact = check(bounds, reduce=reduce)
    hashed = check(bounds, reduce=reduce, fingerprints=True)
    assert _figures(hashed) == _figures(exact)
    assert exact.fingerprints == 0
    # the canonical states, and the raw successors remembered as their aliases
    assert hashed.fingerprints > hashed.distinct_states


@pytest.mark.parametrize("name", sorted(set(VARIANTS) - {"correct"}))
def test_a_fingerprinted_search_breaks_where_the_exact_one_does(name: str) -> None:
    """On its own (before ``check`` searches again), the fingerprinted search names the same
    property at the bounds the design's counterexample is pinned at."""
    bounds = PINNED_AT[name]
    exact = _search(bounds, name, None, 2.0, True, 1, False)
    hashed = _search(bounds, name, None, 2.0, True, 1, False, True)
    assert not exact.ok
    assert (hashed.ok, hashed.property) == (False, exact.property)
    assert hashed.violation is None  # no states kept, so no trace: check() searches again


def test_check_reports_the_exact_counterexample() -> None:
    bounds = PINNED_AT["gc-when-empty"]
    told: list[Progress] = []
    hashed = check(bounds, "gc-when-empty", fingerprints=True, reduce=True, progress=told.append)
    exact = check(bounds, "gc-when-empty")
    # the property the first search broke is told before the second starts
    assert [(p.phase, p.broken) for p in told if p.phase == "again"] == [("again", exact.property)]
    assert hashed.violation is not None and exact.violation is not None
    assert hashed.fingerprints == 0 and not hashed.reduced
    assert _figures(hashed) == _figures(exact)
    assert hashed.violation.steps == exact.violation.steps


def test_fingerprints_take_a_fraction_of_the_memory() -> None:
    # (small: tracemalloc slows the search tenfold; measured 738 KB against 160 KB)
    bounds = Bounds(tasks=2, servers=2, workers=1, faults=1, processes_per_server=1)
    peaks = []
    for fingerprints in (False, True):
        tracemalloc.start()
        try:
            check(bounds, fingerprints=fingerprints)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    exact, hashed = peaks
    assert hashed * 3 < exact, peaks


def test_the_collision_bound_counts_pairs_of_fingerprints() -> None:
    result = check(SMALL[0], fingerprints=True)

    def bound(k: int) -> float:
        return CheckResult(**{**result.__dict__, "fingerprints": k}).collision_bound

    assert bound(0) == bound(1) == 0.0
    assert bound(2) == pytest.approx(2.0**-64)
    assert bound(2**32 + 1) == pytest.approx(0.5, rel=1e-6)
    assert bound(2**40) == 1.0  # (a chance, so clamped)


def test_a_collision_leaves_states_unexplored() -> None:
    """What the reported chance is about: with 8-bit fingerprints, states that share one are
    taken for one, and their futures are not explored."""
    bounds = SMALL[0]
    exact = _search(bounds, "correct", None, 2.0, True, 1, False)
    weak = _search(
        bounds, "correct", None, 2.0, True, 1, False, True, fingerprint=lambda s: hash(s) & 0xFF
    )
    assert weak.fingerprints <= 256
    assert weak.distinct_states < exact.distinct_states


def test_model_check_prints_the_fingerprints_and_refuses_them_with_jobs() -> None:
    runner = CliRunner()
    out = runner.invoke(model_check, ["--tasks", "2", "--faults", "1", "--fingerprints"])
    assert out.exit_code == 0, out.output
    assert "hash-compacted: " in out.output and "is about " in out.output
    broken = runner.invoke(model_check, ["--variant", "no-release", "--fingerprints"])
    assert broken.exit_code == 1
    assert "no-duplication broke after " in broken.stderr
    assert "searching again with every state stored" in broken.stderr
    assert "property violated: no-duplication" in broken.stdout
    refused = runner.invoke(model_check, ["--fingerprints", "--jobs", "2"])
    assert refused.exit_code == 2
    assert "--fingerprints: not with --jobs" in refused.output
    assert "Traceback" not in refused.output
