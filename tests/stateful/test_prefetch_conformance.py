"""The prefetching worker conforms to the model: every position where a pipelined reply can be
lost, on both backends, each followed by the model's check and a recovery to quiescence.

(The state machine also drives prefetching takes and releases among all its other rules; this
test walks the loss positions exhaustively, so none of them depends on a random draw.)
"""

from __future__ import annotations

import itertools

import pytest
from taskcustody_model.state import Bounds

from taskcustody.verify import prefetching
from taskcustody.verify.harness import Harness
from tests.conftest import Backend

WORKERS = 3
BOUNDS = Bounds(tasks=4, servers=2, workers=WORKERS, faults=WORKERS)
POSITIONS = [None, *range(WORKERS)]


LOSSES = list(itertools.product(POSITIONS, POSITIONS))


@pytest.mark.parametrize(("take_lost", "release_lost"), LOSSES)
def test_prefetching_steps_match_the_model(
    backend: Backend, take_lost: int | None, release_lost: int | None
) -> None:
    h = Harness(backend.client, BOUNDS, real_redis=backend.real)
    try:
        h.setup()
        prefetching.prefetching_take(h, 0, 0, take_lost)
        h.check()
        holding = prefetching.holders(h, 0, 0)
        assert len(holding) == (WORKERS if take_lost is None else take_lost)
        if release_lost is not None and release_lost >= len(holding):
            release_lost = None
        if holding:
            prefetching.prefetching_release(h, 0, 0, release_lost)
            h.check()
        h.recover()
        h.check()
        tallies = h.tallies()
        assert tallies["committed"] == BOUNDS.tasks
        assert tallies["lost"] == tallies["duplicated"] == tallies["double-assigned"] == 0
        lost_slots = (0 if take_lost is None else WORKERS - take_lost) + (
            0 if release_lost is None else len(holding) - release_lost
        )
        assert sum(h.counts.values()) == lost_slots
    finally:
        h.close()


def test_a_loss_is_refused_when_a_slot_would_find_the_queue_empty(backend: Backend) -> None:
    """The model has no single action for a dirty worker with an empty list; the harness says so
    rather than mapping it wrongly."""
    h = Harness(
        backend.client, Bounds(tasks=1, servers=1, workers=2, faults=2), real_redis=backend.real
    )
    try:
        h.setup()
        with pytest.raises(ValueError, match="a task for every slot"):
            prefetching.prefetching_take(h, 0, 0, 0)
    finally:
        h.close()
