"""`python -m bench.fingerprints`: the fingerprint-quality report behind the collision chance
that `model-check --fingerprints` prints."""

from __future__ import annotations

import pytest
from taskcustody_model.state import Bounds

# (importorskip: the mutation gate's copies hold no bench/)
fingerprints = pytest.importorskip("bench.fingerprints")

SMALL = Bounds(tasks=2, servers=2, workers=1, faults=1, processes_per_server=2)


def test_every_state_met_has_its_own_fingerprint() -> None:
    report = fingerprints.collisions(SMALL)
    assert report["states"] > 1000
    assert report["distinct_fingerprints"] == report["states"]
    for bits in ("24_bits", "28_bits"):
        # a few thousand values in 2**24 buckets: a random hash gives next to no collision
        assert report[bits]["random"] <= 1
        assert report[bits]["low"] <= 5 and report[bits]["high"] <= 5


def test_the_states_met_are_raw_successors_and_canonical_forms() -> None:
    from taskcustody_model import check

    met = fingerprints.states_met(SMALL)
    assert len(met) >= check(SMALL).distinct_states


def test_help_says_what_it_measures(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        fingerprints.main(["--help"])
    assert exited.value.code == 0
    assert "random 64-bit values" in capsys.readouterr().out
