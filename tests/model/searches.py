"""One search per bounds and design in a test run: several tests read the same search (a
design's pinned counterexample, the shape of its trace, the checker's pinned figures), and the
searches are the slowest part of the suite."""

from __future__ import annotations

import functools

from taskcustody_model import Bounds, CheckResult
from taskcustody_model import check as search


@functools.cache
def check(bounds: Bounds, variant: str = "correct") -> CheckResult:
    """`taskcustody_model.check(bounds, variant)`, searched once per test run."""
    return search(bounds, variant)
