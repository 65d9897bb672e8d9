"""The prefetching worker: several takes in one round trip, several releases in another.

Each property is the one the single worker has (no loss, no double commit, custody given up in a
`finally`, debris reconciled), checked at every position a pipelined reply can be lost."""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

import pytest
import redis

from taskcustody import ManualClock, Producer, QueueKeys, Settings
from taskcustody.core.errors import WrongKeyType
from taskcustody.core.prefetch import PrefetchingWorker
from taskcustody.verify.faults import FaultInjector, InjectedDrop, install
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import all_custody, commits, dead_letters, ids_in, make_server

PREFETCH = 4
SETTINGS = Settings(**{**TEST_SETTINGS.__dict__, "prefetch": PREFETCH})


def start(
    client: redis.Redis, keys: QueueKeys, handler: Any = lambda p: None, workers: int = 1
) -> list[PrefetchingWorker]:
    runners = make_server(
        client, keys, "s1", ManualClock(), handler, workers=workers, settings=SETTINGS
    ).start()
    assert all(isinstance(r, PrefetchingWorker) for r in runners)
    return runners  # type: ignore[return-value]


def drain(worker: PrefetchingWorker) -> None:
    """Run cycles until one finds the queue empty; a lost reply is survived, as `run` does."""
    for _ in range(100):
        try:
            if not worker.run_once(timeout=0.05):
                return
        except redis.ConnectionError:
            continue
    raise AssertionError("the queue never emptied")


def assert_all_committed_once(client: redis.Redis, keys: QueueKeys, ids: list[str]) -> None:
    assert commits(client, keys) == dict.fromkeys(ids, 1)
    assert client.llen(keys.queue) == 0
    assert sum(all_custody(client, keys).values()) == 0
    assert client.hlen(keys.processing) == 0


def test_a_busy_queue_is_taken_in_batches_and_every_task_commits_once(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    ids = Producer(client, keys, ManualClock()).enqueue_many(list(range(10)))
    (worker,) = start(client, keys)
    seen: list[int] = []
    worker.slots[0].handler = seen.append
    for slot in worker.slots:
        slot.handler = seen.append
    assert worker.run_once(timeout=0.05)
    # One cycle took (and ran) a whole batch, in queue order.
    assert seen == [0, 1, 2, 3]
    drain(worker)
    assert seen == list(range(10))
    assert_all_committed_once(client, keys, ids)


def test_each_task_is_recorded_in_its_own_slot_before_its_handler_runs(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    Producer(client, keys, ManualClock()).enqueue_many(list(range(PREFETCH)))
    records: list[tuple[str, str]] = []

    def handler(payload: Any) -> None:
        lists = {slot.list_key: ids_in(client, slot.list_key) for slot in worker.slots}
        for task_id, value in client.hgetall(keys.processing).items():
            owner = value.decode().partition(" ")[0]
            assert lists[owner] == [task_id.decode()]  # the record names the list holding it
            records.append((task_id.decode(), owner))

    (worker,) = start(client, keys, handler)
    assert worker.run_once(timeout=0.05)
    # Every task of the batch was in custody, with its record, from the first handler on.
    owners = {owner for _, owner in records}
    assert owners == set(worker.list_keys)
    assert len(worker.list_keys) == PREFETCH


def test_an_interrupted_batch_gives_up_custody_of_every_task(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    ids = Producer(client, keys, ManualClock()).enqueue_many(list(range(PREFETCH)))

    def handler(payload: Any) -> None:
        if payload == 1:
            raise KeyboardInterrupt

    (worker,) = start(client, keys, handler)
    with pytest.raises(KeyboardInterrupt):
        worker.run_once(timeout=0.05)
    # Task 0 ran and committed; task 1 was interrupted (a failed attempt, retried); tasks 2 and 3
    # never ran and are back in the queue as they were. Nothing is left in custody.
    assert commits(client, keys) == {ids[0]: 1}
    queued = {
        json.loads(raw)["id"]: json.loads(raw)["attempts"]
        for raw in client.lrange(keys.queue, 0, -1)
    }
    assert queued == {ids[1]: 1, ids[2]: 0, ids[3]: 0}
    assert sum(all_custody(client, keys).values()) == 3
    assert all(client.llen(k) == 0 for k in worker.list_keys)
    assert client.hlen(keys.processing) == 0


@pytest.mark.parametrize("lost", range(PREFETCH))
def test_a_lost_take_reply_loses_nothing(backend: Backend, keys: QueueKeys, lost: int) -> None:
    client = backend.client()
    injector = FaultInjector()
    install(client, injector)
    ids = Producer(client, keys, ManualClock()).enqueue_many(list(range(2 * PREFETCH)))
    ran: Counter[int] = Counter()
    (worker,) = start(client, keys, lambda p: ran.update([p]))
    injector.arm("EVALSHA", connection=worker._conn, skip=lost)
    with pytest.raises(InjectedDrop):
        worker.run_once(timeout=0.05)
    # The slots before the lost reply ran and committed; from the lost one on, the tasks were
    # taken unseen: in custody (debris), not run, not lost.
    assert sorted(ran) == list(range(lost))
    assert sum(all_custody(client, keys).values()) == 2 * PREFETCH - lost
    assert [s.dirty for s in worker.slots] == [i >= lost for i in range(PREFETCH)]
    drain(worker)
    assert_all_committed_once(client, keys, ids)
    assert all(n == 1 for n in ran.values())


@pytest.mark.parametrize("lost", range(PREFETCH))
def test_a_lost_release_reply_commits_nothing_twice(
    backend: Backend, keys: QueueKeys, lost: int
) -> None:
    client = backend.client()
    injector = FaultInjector()
    install(client, injector)
    ids = Producer(client, keys, ManualClock()).enqueue_many(list(range(PREFETCH)))
    (worker,) = start(client, keys)
    # The take pipeline's EVALSHAs answer first; then the releases'.
    injector.arm("EVALSHA", connection=worker._conn, skip=PREFETCH + lost)
    with pytest.raises(InjectedDrop):
        worker.run_once(timeout=0.05)
    # Every release ran (the replies after the lost one are lost too, but Redis ran them).
    assert commits(client, keys) == dict.fromkeys(ids, 1)
    assert [s.dirty for s in worker.slots] == [i >= lost for i in range(PREFETCH)]
    drain(worker)
    assert_all_committed_once(client, keys, ids)


def test_malformed_tasks_in_a_batch_are_dead_lettered_with_their_records(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    good = Producer(client, keys, ManualClock()).enqueue(1)
    # Not JSON; and one the take script records (it has an id) that the worker rejects.
    client.lpush(keys.queue, b"\xff not json")
    client.lpush(keys.queue, json.dumps({"id": "bad", "attempts": "many"}).encode())
    (worker,) = start(client, keys)
    assert worker.run_once(timeout=0.05)
    assert commits(client, keys) == {good: 1}
    letters = dead_letters(client, keys)
    assert [d["task_id"] for d in letters] == [None, None]
    assert sorted(d["error"] for d in letters) == [
        "bad attempts or enqueued_at",
        "not JSON: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte",
    ]
    # The record the take wrote for "bad" went with it: nothing names a list it is not in.
    assert client.hlen(keys.processing) == 0
    assert sum(all_custody(client, keys).values()) == 0


def test_an_empty_queue_falls_back_to_the_blocking_take(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    (worker,) = start(client, keys)
    assert worker.run_once(timeout=0.05) is False
    # A task that arrives is taken by the lead's blocking cycle.
    (task_id,) = Producer(client, keys, ManualClock()).enqueue_many([7])
    ran: list[int] = []
    for slot in worker.slots:
        slot.handler = ran.append
    worker.slots[1].dirty = True  # and a dirty slot reconciles first
    client.lpush(worker.slots[1].list_key, b"debris")
    assert worker.run_once(timeout=0.05)
    assert ran == [7]
    assert commits(client, keys) == {task_id: 1}
    assert not worker.dirty


def test_a_flushed_script_cache_is_survived(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    ids = Producer(client, keys, ManualClock()).enqueue_many(list(range(PREFETCH)))
    (worker,) = start(client, keys)
    client.script_flush()
    assert worker.run_once(timeout=0.05)
    assert_all_committed_once(client, keys, ids)


def test_a_wrong_key_type_is_refused_and_loses_nothing(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    (worker,) = start(client, keys)
    client.set(keys.queue, "not a list")
    with pytest.raises(WrongKeyType):
        worker.run_once(timeout=0.05)
    assert client.get(keys.queue) == b"not a list"
    assert sum(client.llen(k) for k in worker.list_keys) == 0


def test_a_server_with_prefetch_runs_until_idle_and_forgets_its_empty_lists(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    ids = Producer(client, keys, ManualClock()).enqueue_many(list(range(25)))
    server = make_server(client, keys, "s1", ManualClock(), workers=2, settings=SETTINGS)
    done = threading.Thread(target=server.run, kwargs={"until_idle": True})
    done.start()
    done.join(timeout=60)
    assert not done.is_alive()
    assert_all_committed_once(client, keys, ids)
    # 2 threads x 4 slots registered, and all forgotten at a clean shutdown.
    assert client.zcard(keys.inflight_registry) == 0


def test_a_wrong_type_in_one_slots_list_is_refused_after_the_others_are_handled(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    ids = Producer(client, keys, ManualClock()).enqueue_many(list(range(PREFETCH)))
    (worker,) = start(client, keys)
    for slot in worker.slots:
        slot.reconcile()  # (a new slot reconciles before its first take)
    bad = worker.slots[1].list_key
    client.delete(bad)
    client.set(bad, "not a list")
    with pytest.raises(WrongKeyType) as raised:
        worker.run_once(timeout=0.05)
    assert bad in str(raised.value) and keys.queue in str(raised.value)
    # Slot 1's take failed before it moved anything; the other three slots took the next three
    # tasks and ran them; the fourth is still queued.
    assert sorted(commits(client, keys)) == sorted(ids[:3])
    assert ids_in(client, keys.queue) == [ids[3]]


def test_a_failing_handler_in_a_batch_is_retried_and_the_rest_commit(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    ids = Producer(client, keys, ManualClock()).enqueue_many(list(range(3)))

    def handler(payload: Any) -> None:
        if payload == 1:
            raise ValueError("no")

    (worker,) = start(client, keys, handler)
    batch, error = worker.take_all()
    assert error is None
    releases = worker.handle(batch)
    assert [r.action for r in releases] == ["committed", "retried", "committed"]
    assert all(r.held for r in releases)
    assert commits(client, keys) == {ids[0]: 1, ids[2]: 1}
    (requeued,) = client.lrange(keys.queue, 0, -1)
    assert json.loads(requeued)["id"] == ids[1]
    assert json.loads(requeued)["attempts"] == 1


def test_a_release_that_fails_in_redis_marks_its_slot_dirty_and_raises(
    backend: Backend, keys: QueueKeys
) -> None:
    """(A keyspace like this is refused by `check_server` at start; here it changes later.)"""
    client = backend.client()
    Producer(client, keys, ManualClock()).enqueue_many(list(range(2)))
    (worker,) = start(client, keys)
    for slot in worker.slots:
        slot.reconcile()
    batch, _ = worker.take_all()
    client.rpush(keys.committed, "a list where a counter belongs")
    with pytest.raises(redis.ResponseError):
        worker.handle(batch)
    assert [s.dirty for s in worker.slots] == [True, True, False, False]


def test_the_fallback_take_waits_as_long_as_the_caller_asked(
    backend: Backend, keys: QueueKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = backend.client()
    (worker,) = start(client, keys)
    asked: list[float | None] = []
    monkeypatch.setattr(worker.lead, "run_once", lambda timeout=None: asked.append(timeout))
    worker.run_once(timeout=0.25)
    assert asked == [0.25]


def test_run_keeps_cycling_through_idle_cycles_until_stopped(
    backend: Backend, keys: QueueKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = backend.client()
    (worker,) = start(client, keys)
    stop = threading.Event()
    cycles: list[int] = []

    def idle_cycle(timeout: float | None = None) -> bool:
        cycles.append(1)
        if len(cycles) == 3:
            stop.set()
        return False

    monkeypatch.setattr(worker, "run_once", idle_cycle)
    worker.run(stop)
    assert len(cycles) == 3  # an idle cycle does not end `run` unless asked to
    worker.run(threading.Event(), until_idle=True)
    assert len(cycles) == 4


def test_the_lead_is_the_first_slot_and_an_empty_worker_is_refused(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    (worker,) = start(client, keys)
    assert worker.lead is worker.slots[0]
    assert worker.list_key == worker.slots[0].list_key
    assert worker.settings is worker.slots[0].settings
    assert worker.owner == worker.slots[0].owner
    with pytest.raises(ValueError, match=r"^a prefetching worker needs at least one slot$"):
        PrefetchingWorker([])


def test_a_lost_reply_to_a_resent_take_is_survived(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    injector = FaultInjector()
    install(client, injector)
    ids = Producer(client, keys, ManualClock()).enqueue_many(list(range(PREFETCH)))
    (worker,) = start(client, keys)
    client.script_flush()  # every take answers NOSCRIPT and is sent again with EVAL ...
    injector.arm("EVAL", connection=worker._conn, skip=1)  # ... whose second reply is lost
    with pytest.raises(InjectedDrop):
        worker.run_once(timeout=0.05)
    assert commits(client, keys) == {ids[0]: 1}
    assert [s.dirty for s in worker.slots] == [False, True, True, True]
    drain(worker)
    assert_all_committed_once(client, keys, ids)
