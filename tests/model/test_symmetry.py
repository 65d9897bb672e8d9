"""``symmetry.canonical`` is optimised (identity fast paths, two workers compared lazily); it
must give exactly the representative the plain version gave (``reference_canonical.py``) for
every state the checker meets: every successor of every state of a search, for the correct
design under each kind of bound the pinned figures use and for every broken design."""

from __future__ import annotations

import pytest
from taskcustody_model import Bounds
from taskcustody_model import checker as checker_module
from taskcustody_model.checker import check
from taskcustody_model.state import State
from taskcustody_model.symmetry import canonical

from taskcustody.verify.designs import (
    BYSTANDER_BOUNDS,
    CANCEL_BOUNDS,
    POISON_BOUNDS,
    RETRY_BOUNDS,
)
from taskcustody.verify.designs import CHECKER_BOUNDS as VARIANT_BOUNDS

from .reference_canonical import reference_canonical

#: small bounds, one per kind of place the canonical form renames (three workers: the general
#: sort; two processes per id: incarnations and drains; wipes, late tasks, poison pills, retries,
#: cancellations: the per-task places)
CASES = {
    "3x2x2-0faults": (Bounds(3, 2, 2, 0, processes_per_server=1), "correct"),
    "2x2x1-2ppi": (Bounds(2, 2, 1, 1, processes_per_server=2), "correct"),
    "3-workers": (Bounds(2, 1, 3, 1, processes_per_server=2), "correct"),
    "3-servers": (Bounds(2, 3, 1, 1, processes_per_server=1), "correct"),
    "everything-1x2": (Bounds(tasks=2, servers=1, workers=2, faults=2, processes_per_server=1,
                              late_tasks=1, redis_faults=True, max_recoveries=1,
                              handler_failures=True), "correct"),
    "wipes": (Bounds(tasks=2, servers=2, workers=1, faults=2, processes_per_server=1,
                     late_tasks=1, redis_faults=True), "correct"),
    "poison": (POISON_BOUNDS, "recoveries-not-counted"),
    "bystander": (BYSTANDER_BOUNDS, "recovered-to-queue"),
    "retry": (RETRY_BOUNDS, "promote-copies"),
    "cancel": (CANCEL_BOUNDS, "cancelled-release-ran"),
    "unbounded-drain": (VARIANT_BOUNDS, "unbounded-drain"),
    "gc-when-empty": (VARIANT_BOUNDS, "gc-when-empty"),
}


@pytest.mark.parametrize("label", sorted(CASES))
def test_canonical_gives_the_plain_version_s_representative(
        label: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bounds, variant = CASES[label]
    met = [0]
    differ: list[tuple[State, State, State]] = []

    def both(state: State, n_workers: int) -> State:
        fast = canonical(state, n_workers)
        plain = reference_canonical(state, n_workers)
        met[0] += 1
        if fast != plain and len(differ) < 3:
            differ.append((state, fast, plain))
        return plain

    monkeypatch.setattr(checker_module, "canonical", both)
    check(bounds, variant)
    assert not differ, differ
    assert met[0] > 100  # the search met enough states to say something
