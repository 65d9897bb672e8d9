"""The suspect slot (suspects.py): one suspect per process, held by one worker's list. (That an
equal list key built anew frees it is the regression in
tests/regressions/test_suspect_slot_freed_by_a_restarted_worker.py.)"""

from __future__ import annotations

from taskcustody.core.suspects import SuspectSlot


def test_another_worker_neither_takes_nor_frees_a_held_slot() -> None:
    slot = SuspectSlot()
    assert slot.acquire("q:inflight:s1:7:w0")
    assert not slot.acquire("q:inflight:s1:7:w1")
    slot.release("q:inflight:s1:7:w1")
    assert slot.holder == "q:inflight:s1:7:w0"
