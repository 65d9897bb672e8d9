"""The suspect slot is held by a worker's list, not by one string object: a worker restarted after
a crash (a new object, its list key built anew) frees the slot its predecessor took, at its
reconcile (suspects.py)."""

from __future__ import annotations

from taskcustody.suspects import SuspectSlot


def _key(worker: str) -> str:
    return "".join(["q:inflight:s1:7:", worker])  # built anew, as `QueueKeys.inflight` does


def test_a_restarted_worker_frees_the_slot_its_crashed_predecessor_took() -> None:
    slot = SuspectSlot()
    crashed, restarted = _key("w0"), _key("w0")
    assert crashed == restarted and crashed is not restarted
    assert slot.acquire(crashed)
    assert slot.held_by(restarted) and slot.acquire(restarted)
    slot.release(restarted)
    assert slot.free


def test_another_worker_neither_takes_nor_frees_a_held_slot() -> None:
    slot = SuspectSlot()
    assert slot.acquire(_key("w0"))
    assert not slot.acquire(_key("w1"))
    slot.release(_key("w1"))
    assert slot.holder == _key("w0")
