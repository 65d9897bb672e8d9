"""Custody on fakeredis and on a real redis-server: the properties, step by step."""

from __future__ import annotations

import threading

import pytest

from taskcustody import (
    ManualClock,
    Outcome,
    Producer,
    QueueKeys,
    drain_inflight,
    prune_inactive_servers,
)
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import all_custody, commits, ids_in, make_server, parse_record_owner


def _run_in_thread(fn: object) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)  # type: ignore[arg-type]
    t.start()
    return t


@pytest.mark.parametrize("fails", [False, True], ids=["success", "failure"])
def test_task_is_in_flight_while_handler_runs_and_gone_after_release(
    backend: Backend, keys: QueueKeys, fails: bool
) -> None:
    client = backend.client()
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue({"job": 1})
    inside, leave = threading.Event(), threading.Event()

    def handler(payload: object) -> str:
        inside.set()
        assert leave.wait(30), "test never released the handler"
        if fails:
            raise RuntimeError("boom")
        return "done"

    server = make_server(client, keys, "s1", clock, handler)
    (worker,) = server.start()
    t = _run_in_thread(lambda: worker.run_once(timeout=5))
    assert inside.wait(30)
    # Held inside the task body: the task is in this worker's list and nowhere else.
    assert ids_in(client, worker.list_key) == [task_id]
    assert client.llen(keys.queue) == 0
    assert client.hexists(keys.processing, task_id)
    leave.set()
    t.join(30)
    assert not t.is_alive()
    assert client.llen(worker.list_key) == 0
    assert not client.hexists(keys.processing, task_id)
    if fails:
        # Retried: back in the queue with one more attempt, never committed.
        assert ids_in(client, keys.queue) == [task_id]
        assert commits(client, keys) == {}
    else:
        assert commits(client, keys) == {task_id: 1}
        assert client.get(keys.result(task_id)) == b'"done"'


def test_release_happens_even_when_the_worker_is_interrupted(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue(1)

    def handler(payload: object) -> None:
        raise KeyboardInterrupt  # not an ordinary handler error: it escapes execute()

    (worker,) = make_server(client, keys, "s1", clock, handler).start()
    with pytest.raises(KeyboardInterrupt):
        worker.run_once(timeout=1)
    assert client.llen(worker.list_key) == 0
    assert ids_in(client, keys.queue) == [task_id]


def test_startup_drain_requeues_own_debris(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    ids = Producer(client, keys, clock).enqueue_many(["a", "b", "c"])
    first = make_server(client, keys, "s1", clock, workers=2)
    w0, w1 = first.start()
    t0, t1 = w0.take(), w1.take()
    assert t0 and t1
    w0.record(t0)
    # Another server dies too, holding the third task.
    (other,) = make_server(client, keys, "other", clock).start()
    t2 = other.take()
    assert t2
    # The process dies here (no release). Its id's lease lapses; it restarts with the same id.
    clock.advance(TEST_SETTINGS.server_ttl + 1)
    second = make_server(client, keys, "s1", clock, workers=2)
    second.claim()
    drained = second.startup_drain()
    assert drained == {w0.list_key: 1, w1.list_key: 1}
    # recovered, so counted (max_recoveries is on by default): suspects, each to run alone
    assert sorted(ids_in(client, keys.suspects)) == sorted([t0.id, t1.id])
    assert client.llen(w0.list_key) == 0 and client.llen(w1.list_key) == 0
    assert client.hlen(keys.processing) == 0
    # The startup drain is about our own id only: the other dead server's list is the periodic
    # sweep's (after a prune), not ours to touch at startup.
    assert ids_in(client, other.list_key) == [t2.id]
    second.sweep()
    assert sorted(ids_in(client, keys.suspects)) == sorted(ids)


def test_periodic_sweep_spares_live_lists_and_drains_expired_on_same_pass(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue_many(["a", "b", "c"])
    alive = make_server(client, keys, "alive", clock)
    dying = make_server(client, keys, "dying", clock)
    (wa,) = alive.start()
    (wd,) = dying.start()
    ta, td = wa.take(), wd.take()
    assert ta and td
    # Nobody's deadline has passed: the sweep touches nothing, our own list included.
    report = alive.sweep()
    assert report.pruned == [] and report.moved == 0
    assert ids_in(client, wa.list_key) == [ta.id]
    assert ids_in(client, wd.list_key) == [td.id]
    # "dying" stops heart-beating; "alive" keeps going. Past dying's deadline, one pass prunes
    # it and drains its list -- the same pass, not the next.
    clock.advance(TEST_SETTINGS.server_ttl - 1)
    alive.heartbeat()
    clock.advance(2)
    report = alive.sweep()
    assert report.pruned == ["dying"]
    assert report.drained_lists == {wd.list_key: 1}
    assert ids_in(client, wa.list_key) == [ta.id]  # the live list: untouched
    assert td.id in ids_in(client, keys.suspects)  # recovered: a suspect
    # A second sweep by the other server would not touch alive's list either.
    assert all_custody(client, keys)[ta.id] == 1


def test_drain_is_bounded_under_a_concurrent_appender(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    appender = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue_many(list(range(20)))
    dead = make_server(client, keys, "dead", clock)
    (worker,) = dead.start()
    for _ in range(7):
        assert worker.take(timeout=1)
    start_len = client.llen(worker.list_key)
    clock.advance(TEST_SETTINGS.server_ttl + 1)
    assert prune_inactive_servers(client, keys, clock.now()) == ["dead"]
    # Something keeps appending to the list between the drain's steps (drain_chunk is 3).
    real_eval = client.eval
    appended = 0

    def eval_then_append(*args: object) -> object:
        nonlocal appended
        appender.lmove(keys.queue, worker.list_key, "RIGHT", "LEFT")
        appended += 1
        return real_eval(*args)  # type: ignore[arg-type]

    client.eval = eval_then_append  # type: ignore[method-assign]
    moved = drain_inflight(client, keys, worker.list_key, force=False, chunk=3)
    assert moved == start_len == 7
    assert appended == 3  # ceil(7 / 3) chunks, then it stopped
    assert client.llen(worker.list_key) == appended


def test_second_process_with_a_live_server_id_is_refused(backend: Backend, keys: QueueKeys) -> None:
    from taskcustody import ServerIdHeld

    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue("x")
    first = make_server(client, keys, "s1", clock)
    (w,) = first.start()
    task = w.take()
    assert task
    intruder = make_server(client, keys, "s1", clock)
    with pytest.raises(ServerIdHeld, match="s1"):
        intruder.start()
    # Refused before draining anything: the first one's task is still in its custody.
    assert ids_in(client, w.list_key) == [task.id]
    assert w.release(task, Outcome(True)).held


def test_stalled_worker_loses_custody_and_does_not_commit(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue("x")
    stalled = make_server(client, keys, "stalled", clock)
    other = make_server(client, keys, "other", clock)
    (ws,) = stalled.start()
    (wo,) = other.start()
    task = ws.take()
    assert task
    ws.record(task)
    # "stalled" stops heart-beating while its worker keeps executing; "other" judges it dead.
    clock.advance(TEST_SETTINGS.server_ttl + 1)
    other.heartbeat()
    assert other.sweep().drained_lists == {ws.list_key: 1}
    retaken = wo.take()
    assert retaken and retaken.id == task_id
    # The stalled worker finishes: its release reports lost custody and commits nothing.
    late = ws.release(task, Outcome(True))
    assert not late.held and late.action == "lost-custody"
    assert commits(client, keys) == {}
    assert wo.release(retaken, Outcome(True)).held
    assert commits(client, keys) == {task_id: 1}


def test_superseded_server_learns_it_at_its_next_heartbeat(
    backend: Backend, keys: QueueKeys
) -> None:
    from taskcustody import Superseded

    client = backend.client()
    clock = ManualClock()
    old = make_server(client, keys, "s1", clock)
    old.start()
    clock.advance(TEST_SETTINGS.server_ttl + 1)
    new = make_server(client, keys, "s1", clock)
    new.start()
    assert new.incarnation != old.incarnation
    with pytest.raises(Superseded):
        old.heartbeat()
    assert old.stop_event.is_set()
    new.heartbeat()  # the new holder is unaffected


def test_processing_sweep_requeues_dead_owners_task_once(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue("x")
    dead = make_server(client, keys, "dead", clock)
    live = make_server(client, keys, "live", clock)
    (wd,) = dead.start()
    live.start()
    task = wd.take()
    assert task
    wd.record(task)
    wd.flush()  # read the deferred record reply: the record is written
    clock.advance(TEST_SETTINGS.server_ttl + 1)
    live.heartbeat()
    prune_inactive_servers(client, keys, clock.now())
    assert live.requeue_stuck_processing_tasks() == (1, 0)
    # And the drain, running after it, finds nothing left to requeue: no duplicate.
    report = live.sweep()
    assert report.moved == 0
    assert all_custody(client, keys)[task_id] == 1
    assert client.hlen(keys.processing) == 0


def test_processing_sweep_leaves_live_owners_alone(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue("x")
    a = make_server(client, keys, "a", clock)
    b = make_server(client, keys, "b", clock)
    (wa,) = a.start()
    b.start()
    task = wa.take()
    assert task
    wa.record(task)
    wa.flush()
    assert b.requeue_stuck_processing_tasks() == (0, 0)
    assert ids_in(client, wa.list_key) == [task.id]
    assert client.hexists(keys.processing, task.id)


def test_drain_leaves_a_list_alone_while_its_owner_is_registered(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue("x")
    (worker,) = make_server(client, keys, "s1", clock).start()
    assert worker.take()
    # Expired, but not yet pruned: still registered, so a dead-only drain moves nothing.
    clock.advance(TEST_SETTINGS.server_ttl + 1)
    assert drain_inflight(client, keys, worker.list_key, force=False) == 0
    assert client.llen(worker.list_key) == 1
    prune_inactive_servers(client, keys, clock.now())
    assert drain_inflight(client, keys, worker.list_key, force=False) == 1


def test_stale_record_never_overwrites_the_new_holders(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue("x")
    stalled = make_server(client, keys, "stalled", clock)
    other = make_server(client, keys, "other", clock)
    (ws,) = stalled.start()
    (wo,) = other.start()
    task = ws.take()
    assert task
    clock.advance(TEST_SETTINGS.server_ttl + 1)
    other.heartbeat()
    other.sweep()
    retaken = wo.take()
    assert retaken and retaken.id == task.id
    wo.record(retaken)
    wo.flush()
    # The stalled worker records late: its task is no longer in its list, so nothing is written.
    ws.record(task)
    ws.flush()
    assert parse_record_owner(client, keys, task.id) == wo.list_key
    assert wo.release(retaken, Outcome(True)).held
    assert not ws.release(task, Outcome(True)).held
    assert client.hlen(keys.processing) == 0
