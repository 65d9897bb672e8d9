"""Bench hygiene: a quick or partial benchmark run never writes over the full run's results
(bench/results/latest.*, which the README quotes)."""

from __future__ import annotations

import pytest

bench_run = pytest.importorskip("bench.run")


@pytest.mark.parametrize(
    ("quick", "partial", "stem"),
    [
        (False, False, "latest"),
        (True, False, "quick"),
        (False, True, "raw/STAMP-partial"),
        (True, True, "raw/STAMP-quick-partial"),
    ],
)
def test_only_the_full_run_writes_latest(quick: bool, partial: bool, stem: str) -> None:
    assert bench_run.results_stem(quick, partial, "STAMP") == stem


def test_the_latency_files_follow_the_same_rule() -> None:
    latency = pytest.importorskip("bench.latency")
    assert latency.latency_stem(False, False, "S") == "latency"
    assert latency.latency_stem(True, False, "S") != "latency"
    assert latency.latency_stem(False, True, "S").startswith("raw/")
