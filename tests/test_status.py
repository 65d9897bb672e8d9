"""`queue_status`: what `taskcustody status` shows."""

from __future__ import annotations

from taskcustody import ManualClock, Producer, QueueKeys, prune_inactive_servers, queue_status
from tests.conftest import Backend
from tests.helpers import make_server


def test_status_shows_live_workers_and_dead_lists_that_still_hold_tasks(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue_many([1, 2, 3])
    live = make_server(client, keys, "a", clock, workers=2)
    w0, w1 = live.start()
    assert w0.take(timeout=0.01)
    w1.take(timeout=0.01)  # registers w1's list: it shows, though its take finds nothing
    w1.reconcile()
    dead = make_server(client, keys, "b", clock, workers=2)
    d0, _ = dead.start()
    assert d0.take(timeout=0.01)
    clock.advance(20)
    live.heartbeat()
    prune_inactive_servers(client, keys, clock.now())
    snap = queue_status(client, keys, clock.now())
    # w1's reconcile counted the task it took (a suspect now); b's worker took the last queued one
    assert snap.depth == 0 and snap.suspects == 1
    # Every registered list of a live server, empty ones included (a list is registered by its
    # worker's first take); of a dead one only lists holding tasks.
    assert snap.inflight == {
        f"a#{live.incarnation}": {"w0": 1, "w1": 0},
        f"b#{dead.incarnation}": {"w0": 1},
    }
    assert list(snap.servers) == ["a"] and snap.servers["a"]["registered"]
