"""``symmetry.canonical`` is optimised (identity fast paths, two workers compared lazily); it
must give exactly the representative its plain path gives (``canonical(..., plain=True)``: every
name mapped, every signature sorted, as the version it was optimised from did) for every state the
checker meets: every successor of every state of a search, for the correct design under each kind
of bound the pinned figures use and for every broken design.  The plain path shares the fast one's
definition of the representative (the order of incarnations, workers, servers and tasks), so that
definition is held apart: the representative is a renaming of the state, in the same class
(``exact_canonical``, the least renaming over all renamings, is the same for both), on a sample
of the states; and ``test_checker_figures.py`` pins the figures that depend on its tie-breaks."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from taskcustody_model import Bounds
from taskcustody_model import checker as checker_module
from taskcustody_model.checker import check
from taskcustody_model.state import State
from taskcustody_model.symmetry import canonical, exact_canonical

from taskcustody.verify.designs import (
    BYSTANDER_BOUNDS,
    CANCEL_BOUNDS,
    POISON_BOUNDS,
    RETRY_BOUNDS,
)
from taskcustody.verify.designs import CHECKER_BOUNDS as VARIANT_BOUNDS

#: registrations that age: the places that say which registrations are fresh (``State.fresh``)
AGES = Bounds(tasks=2, servers=2, workers=1, faults=1, late_tasks=1, registration_ages=True)

#: small bounds, one per kind of place the canonical form renames (three workers: the general
#: sort; two processes per id: incarnations and drains; wipes, late tasks, poison pills, retries,
#: cancellations, fresh registrations: the per-task and per-list places)
CASES = {
    "3x2x2-0faults": (Bounds(3, 2, 2, 0, processes_per_server=1), "correct"),
    "2x2x1-2ppi": (Bounds(2, 2, 1, 1, processes_per_server=2), "correct"),
    "3-workers": (Bounds(2, 1, 3, 1, processes_per_server=2), "correct"),
    "3-servers": (Bounds(2, 3, 1, 1, processes_per_server=1), "correct"),
    "everything-1x2": (
        Bounds(
            tasks=2,
            servers=1,
            workers=2,
            faults=2,
            processes_per_server=1,
            late_tasks=1,
            redis_faults=True,
            max_recoveries=1,
            handler_failures=True,
        ),
        "correct",
    ),
    "wipes": (
        Bounds(
            tasks=2,
            servers=2,
            workers=1,
            faults=2,
            processes_per_server=1,
            late_tasks=1,
            redis_faults=True,
        ),
        "correct",
    ),
    "ages": (AGES, "correct"),
    "poison": (POISON_BOUNDS, "recoveries-not-counted"),
    "bystander": (BYSTANDER_BOUNDS, "recovered-to-queue"),
    "retry": (RETRY_BOUNDS, "promote-copies"),
    "cancel": (CANCEL_BOUNDS, "cancelled-release-ran"),
    "unbounded-drain": (VARIANT_BOUNDS, "unbounded-drain"),
    "gc-when-empty": (VARIANT_BOUNDS, "gc-when-empty"),
    "gc-when-empty-ages": (AGES, "gc-when-empty"),
}

#: the cases whose states the exhaustive ``exact_canonical`` renames quickly enough (no three
#: workers, at most two servers of two workers), and one state in how many it checks
EXACT_CASES = sorted(set(CASES) - {"3-workers", "3-servers", "3x2x2-0faults"})
EXACT_EVERY = 20


def search_with(
    label: str, canon: Callable[[State, int], State], monkeypatch: pytest.MonkeyPatch
) -> int:
    """Search case ``label`` with ``canon`` as the checker's canonical form; the states met."""
    bounds, variant = CASES[label]
    met = [0]

    def counted(state: State, n_workers: int) -> State:
        met[0] += 1
        return canon(state, n_workers)

    monkeypatch.setattr(checker_module, "canonical", counted)
    check(bounds, variant)
    assert met[0] > 100  # the search met enough states to say something
    return met[0]


@pytest.mark.parametrize("label", sorted(CASES))
def test_canonical_gives_the_plain_path_s_representative(
    label: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    differ: list[tuple[State, State, State]] = []

    def both(state: State, n_workers: int) -> State:
        fast = canonical(state, n_workers)
        plain = canonical(state, n_workers, plain=True)
        if fast != plain and len(differ) < 3:
            differ.append((state, fast, plain))
        return plain

    search_with(label, both, monkeypatch)
    assert not differ, differ


@pytest.mark.parametrize("label", EXACT_CASES)
def test_the_representative_is_a_renaming_of_the_state(
    label: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sample: list[State] = []

    def sampled(state: State, n_workers: int) -> State:
        if len(sample) < 10_000:
            sample.append(state)
        return canonical(state, n_workers)

    search_with(label, sampled, monkeypatch)
    n_workers = CASES[label][0].workers
    checked = sample[::EXACT_EVERY]
    assert len(checked) >= 5
    for state in checked:
        rep = canonical(state, n_workers)
        assert exact_canonical(rep, n_workers) == exact_canonical(state, n_workers), (state, rep)
