"""Regression (found by the conformance machine on fakeredis and real Redis; the model checker
found the same hole): `Worker.record` is an unconditional HSET. A stalled worker whose task was
drained and re-taken by a new incarnation records *after* the new holder did, and overwrites the
new holder's processing record with one naming its own (dead) list. The model records only if the
task is still in the recording worker's list (one Lua step); the implementation must do the same.

Fixed: the record is now a Lua step that writes only while the task is in the worker's list
(`scripts.RECORD`); this walk fails without it.
"""

from __future__ import annotations

from taskcustody_model.protocol import Action
from taskcustody_model.state import Bounds

from taskcustody.verify.harness import Harness
from tests.conftest import Backend

# (action, drop_at, variant), as the walk that found it ran them.
STEPS = [
    (("crash_server", 0, 0, -1, ""), 0, 2),
    (("dropped_reply", 1, 0, 0, "take"), 0, 5),
    (("stall_server", 1, 0, -1, ""), 0, 3),
    (("take", 1, 0, 1, ""), 0, 0),
    (("reconcile", 1, 0, 0, ""), 0, 0),
    (("advance_clock", -1, -1, -1, ""), 0, 4),
    (("record", 1, 0, 1, ""), 0, 0),
    (("take", 1, 0, 0, ""), 0, 4),
    (("claim", 1, -1, -1, ""), 0, 2),
    (("release", 1, 0, 1, ""), 0, 1),
    (("claim", 0, -1, -1, ""), 0, 2),
    (("record", 1, 0, 0, ""), 0, 0),
    (("take", 1, 0, 1, ""), 0, 2),
    (("release", 1, 0, 0, ""), 0, 1),
    (("resume_server", 1, 0, -1, ""), 0, 2),
    (("heartbeat", 1, 0, -1, ""), 0, 0),
    (("startup_drain", 1, 1, -1, ""), 1, 5),
    (("take", 1, 1, 1, ""), 0, 4),
    (("startup_drain", 0, 0, -1, ""), 0, 1),
    (("record", 1, 1, 1, ""), 0, 2),
    # the stalled incarnation's worker records task 2, which the new incarnation now holds
    (("record", 1, 0, 1, ""), 0, 4),
]


def test_a_stale_worker_does_not_overwrite_the_holders_record(backend: Backend) -> None:
    h = Harness(
        backend.client, Bounds(tasks=3, servers=2, workers=2, faults=3), real_redis=backend.real
    )
    try:
        h.setup()
        for action, drop_at, variant in STEPS:
            h.step(Action(*action), drop_at=drop_at, variant=variant)
            h.check()
    finally:
        h.close()
