"""The suspect slot is held by a worker's in-flight list key, not by a string object: a worker
restarted after a crash is a new object whose list key is equal to its predecessor's but built
anew, and its reconcile must free the slot its predecessor held. Compared by identity, the slot
stayed held by the dead worker for the life of the process, which then never ran a suspect again
(found by verify's fault-coverage part: a suspect's holder crashed, was restarted, and its
reconcile dead-lettered the suspect; the model freed the slot, the implementation did not)."""

from __future__ import annotations

from taskcustody import ManualClock, Producer, QueueKeys
from taskcustody.core.suspects import SuspectSlot
from tests.conftest import Backend
from tests.helpers import make_server


def test_the_slot_is_released_by_an_equal_key_that_is_another_object() -> None:
    slot = SuspectSlot()
    held, equal = "tc:{q}:inflight:s1:7:w0", "".join(["tc:{q}:inflight:", "s1:7:w0"])
    assert held == equal and held is not equal
    assert slot.acquire(held)
    assert slot.held_by(equal) and slot.acquire(equal)
    slot.release(equal)
    assert slot.free


def test_a_restarted_workers_reconcile_frees_the_slot_its_crashed_predecessor_held(
    backend: Backend,
) -> None:
    client, keys, clock = backend.client(), QueueKeys("slot"), ManualClock()
    server = make_server(client, keys, "s1", clock)
    server.claim()
    server.startup_drain()
    Producer(client, keys, clock).enqueue({"n": 1}, task_id="t1")
    client.lmove(keys.queue, keys.suspects, "RIGHT", "LEFT")  # as a recovery puts a suspect
    first = server.make_worker(0)
    first.register()
    first.suspects.maybe_waiting = True
    assert first.take_suspect() is not None
    assert server.suspect_slot.held_by(first.list_key)
    first.close()  # it crashes holding the suspect: no release, no clean-up
    second = server.make_worker(0)  # the restarted worker: a new object, the same list
    second.register()
    second.reconcile()
    assert server.suspect_slot.free, f"still held by {server.suspect_slot.holder}"
