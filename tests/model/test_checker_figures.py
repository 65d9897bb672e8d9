"""The checker's figures, pinned from the plain breadth-first checker:
a faster search must explore exactly the same classes of states in the same order, so each
design's verdict, violated property, counterexample length, distinct states, states generated and
depth stay what they were. (A change that merges more symmetric twins would lower the counts
without being wrong: then re-pin them here and say why in the commit.)"""

from __future__ import annotations

import pytest
from taskcustody_model import Bounds
from taskcustody_model import check as search
from taskcustody_model.trace import render_trace

from taskcustody.verify.designs import (
    BYSTANDER_BOUNDS,
    CANCEL_BOUNDS,
    POISON_BOUNDS,
    RETRY_BOUNDS,
)
from taskcustody.verify.designs import (
    CHECKER_BOUNDS as VARIANT_BOUNDS,
)

from .searches import check

#: design -> (bounds, property, counterexample length, distinct states, generated, depth)
BROKEN = {
    "blpop-take": (VARIANT_BOUNDS, "no-loss", 1, 3, 3, 1),
    "no-release": (VARIANT_BOUNDS, "no-duplication", 3, 108, 208, 3),
    "sweep-drains-live": (VARIANT_BOUNDS, "no-double-execution", 3, 80, 141, 3),
    "startup-skips-own": (VARIANT_BOUNDS, "prompt-recovery", 5, 1_164, 3_352, 5),
    "processing-sweep-no-custody": (VARIANT_BOUNDS, "no-duplication", 6, 2_771, 8_645, 6),
    "unbounded-drain": (VARIANT_BOUNDS, "bounded-work", 8, 13_600, 46_775, 8),
    "drain-before-prune": (VARIANT_BOUNDS, "prompt-recovery", 4, 411, 1_081, 4),
    "register-once": (VARIANT_BOUNDS, "registered-custody", 4, 471, 1_265, 4),
    "gc-when-empty": (VARIANT_BOUNDS, "registered-custody", 8, 6_957, 23_936, 8),
    "recoveries-not-counted": (POISON_BOUNDS, "bounded-executions", 8, 4_569, 15_354, 8),
    "count-after-recovery": (POISON_BOUNDS, "bounded-executions", 8, 7_379, 22_649, 8),
    "recovered-to-queue": (BYSTANDER_BOUNDS, "suspects-run-alone", 6, 2_677, 8_022, 6),
    "promote-copies": (RETRY_BOUNDS, "no-duplication", 4, 387, 987, 4),
    "composite-pops-next": (VARIANT_BOUNDS, "no-loss", 3, 111, 211, 3),
    "composite-commits-unheld": (VARIANT_BOUNDS, "no-duplication", 6, 2_782, 8_675, 6),
    # (with asyncio's cancellation before the send)
    "cancelled-release-ran": (CANCEL_BOUNDS, "eventual-recovery", 4, 5_602, 24_836, 18),
}

#: the correct design: bounds -> (distinct states, generated, depth)
CORRECT = {
    "3x2x2-1fault": (Bounds(3, 2, 2, 1, processes_per_server=1), 7_536, 44_202, 17),
    "poison": (POISON_BOUNDS, 26_452, 128_734, 19),
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
        11_053,
        54_718,
        19,
    ),
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
        5_860,
        20_569,
        19,
    ),
    # (asyncio's cancellation before the send, at design 16's bounds)
    "cancels-before-send": (CANCEL_BOUNDS, 5_149, 23_398, 18),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_design_is_found_exactly_as_before(name: str) -> None:
    bounds, prop, length, states, generated, depth = BROKEN[name]
    result = check(bounds, name)
    assert result.violation is not None
    assert (result.property, len(result.violation)) == (prop, length), render_trace(
        result.violation
    )
    assert (result.distinct_states, result.states_generated, result.depth) == (
        states,
        generated,
        depth,
    )


@pytest.mark.parametrize("label", sorted(CORRECT))
def test_the_correct_design_explores_exactly_the_same_states(label: str) -> None:
    bounds, states, generated, depth = CORRECT[label]
    result = check(bounds)
    assert result.ok, result.violation and render_trace(result.violation)
    assert (result.distinct_states, result.states_generated, result.depth) == (
        states,
        generated,
        depth,
    )


#: the correct design, searched with the partial-order reduction (``reduction.py``, what
#: ``model-check`` runs by default): bounds -> (distinct states, generated, depth). Unreduced,
#: the same bounds are ``CORRECT`` above / 194,831 states, 1,468,641 generated, depth 24 at the
#: CI bound.
REDUCED = [
    pytest.param(Bounds(3, 2, 2, 1, processes_per_server=1), 3_867, 15_929, 17, id="3x2x2-1fault"),
    pytest.param(
        Bounds(3, 2, 2, 2, processes_per_server=1),
        125_982,
        693_299,
        24,
        id="ci",
        marks=pytest.mark.slow,
    ),
]


@pytest.mark.parametrize(("bounds", "states", "generated", "depth"), REDUCED)
def test_the_reduced_search_explores_exactly_the_pinned_states(
    bounds: Bounds, states: int, generated: int, depth: int
) -> None:
    result = search(bounds, reduce=True)
    assert result.ok and result.reduced, result.violation and render_trace(result.violation)
    assert (result.distinct_states, result.states_generated, result.depth) == (
        states,
        generated,
        depth,
    )
