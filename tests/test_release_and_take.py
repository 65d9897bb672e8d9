"""The composite step (`Worker.release_and_take`, script RELEASE_AND_TAKE): the release of the task
just handled and the take of the next one, in one atomic step and one round trip, on both
backends. Each test asserts where every task is afterwards, as the protocol says it must be."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis

from taskcustody import ManualClock, Producer, QueueKeys, Settings, Worker
from taskcustody.core.envelope import Task
from taskcustody.core.outcome import Outcome
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import (
    all_custody,
    commits,
    dead_letters,
    ids_in,
    make_server,
    parse_record_owner,
)

SETTINGS = Settings(**{**TEST_SETTINGS.__dict__, "track_commits": True})


def started(
    backend: Backend,
    keys: QueueKeys,
    payloads: list[Any],
    workers: int = 1,
    settings: Settings = SETTINGS,
) -> tuple[redis.Redis, list[Worker], list[str]]:
    client = backend.client()
    clock = ManualClock()
    ids = Producer(client, keys, clock).enqueue_many(payloads)
    server = make_server(client, keys, "s1", clock, workers=workers, settings=settings)
    found = server.start()
    assert all(isinstance(w, Worker) for w in found)
    for w in found:
        w.reconcile()
    return client, found, ids  # type: ignore[return-value]


def count_writes(worker: Worker) -> list[int]:
    """Count the worker's socket writes on its own connection (each round trip starts with one)."""
    conn: Any = worker._conn
    conn.connect()
    counter = [0]
    send = conn.send_packed_command  # (send_command sends through it too)

    def counting(*args: Any, **kwargs: Any) -> None:
        counter[0] += 1
        send(*args, **kwargs)

    conn.send_packed_command = counting
    return counter


def test_it_commits_the_task_and_takes_the_next_into_custody_with_its_record(
    backend: Backend, keys: QueueKeys
) -> None:
    client, (worker,), (first, second) = started(backend, keys, ["a", "b"])
    task = worker.take(timeout=1)
    assert task is not None and task.id == first
    worker.record(task)
    done, nxt = worker.release_and_take(task, Outcome(True, "r"))
    assert done.held and done.action == "committed"
    assert nxt is not None and nxt.id == second and nxt.payload == "b"
    assert commits(client, keys) == {first: 1}
    # the next task is in our list, and only there, with a record naming our list
    assert ids_in(client, worker.list_key) == [second]
    assert all_custody(client, keys) == {second: 1}
    assert parse_record_owner(client, keys, second) == worker.list_key
    assert client.hget(keys.processing, first) is None
    assert client.zscore(keys.inflight_registry, worker.list_key) is not None
    assert not worker.dirty


def test_on_an_empty_queue_it_is_only_the_release(backend: Backend, keys: QueueKeys) -> None:
    client, (worker,), (only,) = started(backend, keys, ["a"])
    task = worker.take(timeout=1)
    assert task is not None
    worker.record(task)
    done, nxt = worker.release_and_take(task, Outcome(True))
    assert nxt is None and done.action == "committed"
    assert commits(client, keys) == {only: 1}
    assert client.llen(worker.list_key) == 0 and not worker.dirty


def test_a_failed_attempt_is_retried_and_the_next_task_taken(
    backend: Backend, keys: QueueKeys
) -> None:
    settings = Settings(**{**SETTINGS.__dict__, "retry_backoff": 0.0})
    client, (worker,), (first, second) = started(backend, keys, ["a", "b"], settings=settings)
    task = worker.take(timeout=1)
    assert task is not None and task.id == first
    done, nxt = worker.release_and_take(task, Outcome(False, error="boom"))
    assert done.action == "retried"
    assert nxt is not None and nxt.id == second
    # the retry went to the queue's far end; the next task is ours
    assert ids_in(client, keys.queue) == [first] and ids_in(client, worker.list_key) == [second]


def test_it_takes_nothing_when_the_release_leaves_debris(backend: Backend, keys: QueueKeys) -> None:
    client, (worker,), (_first, second) = started(backend, keys, ["a", "b"])
    task = worker.take(timeout=1)
    assert task is not None
    client.rpush(worker.list_key, b"debris")  # what a lost earlier reply could leave
    done, nxt = worker.release_and_take(task, Outcome(True))
    assert nxt is None and done.held and done.remaining == 1
    assert worker.dirty  # so the next cycle reconciles before it takes anything
    assert ids_in(client, keys.queue) == [second]


def test_a_dirty_worker_takes_nothing(backend: Backend, keys: QueueKeys) -> None:
    client, (worker,), (_first, second) = started(backend, keys, ["a", "b"])
    task = worker.take(timeout=1)
    assert task is not None
    worker.dirty = True
    done, nxt = worker.release_and_take(task, Outcome(True))
    assert nxt is None and done.action == "committed"
    assert ids_in(client, keys.queue) == [second] and client.llen(worker.list_key) == 0


def test_it_commits_nothing_without_custody_and_still_takes_the_next(
    backend: Backend, keys: QueueKeys
) -> None:
    """Our list was drained while we ran the task (we were judged dead): no commit; the task
    is the queue's again, and the step takes it back as our next task (the drain pushed it on the
    take end), to run it again under custody."""
    client, (worker,), (first, second) = started(backend, keys, ["a", "b"])
    task = worker.take(timeout=1)
    assert task is not None and task.id == first
    client.lmove(worker.list_key, keys.queue, "RIGHT", "RIGHT")  # a sweep's drain
    done, nxt = worker.release_and_take(task, Outcome(True))
    assert not done.held and done.action == "lost-custody"
    assert commits(client, keys) == {}
    assert nxt is not None and nxt.id == first
    assert all_custody(client, keys) == {first: 1, second: 1}


def test_a_lost_reply_loses_both_answers_and_the_reconcile_gives_the_next_task_back(
    backend: Backend, keys: QueueKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, (worker,), (first, second) = started(backend, keys, ["a", "b"])
    task = worker.take(timeout=1)
    assert task is not None
    worker.flush()

    def lost(*args: Any, **kwargs: Any) -> Any:
        raise redis.ConnectionError("reply lost")

    monkeypatch.setattr(worker._conn, "read_response", lost)
    with pytest.raises(redis.ConnectionError):
        worker.release_and_take(task, Outcome(True))
    monkeypatch.undo()
    assert worker.dirty
    # Redis ran the whole step: committed, and the next task is in our list
    assert commits(client, keys) == {first: 1}
    assert ids_in(client, worker.list_key) == [second]
    worker.follow_slot()  # a lost connection: reconnect
    assert worker.reconcile() == 1
    # back where recovery puts a task (counted: the suspects list), and nowhere else
    assert all_custody(client, keys) == {second: 1} and client.llen(worker.list_key) == 0
    assert client.hget(keys.processing, second) is None


def test_it_runs_again_after_the_script_cache_was_flushed(
    backend: Backend, keys: QueueKeys
) -> None:
    client, (worker,), (_first, second) = started(backend, keys, ["a", "b"])
    task = worker.take(timeout=1)
    assert task is not None
    worker.flush()
    client.script_flush()
    done, nxt = worker.release_and_take(task, Outcome(True))
    assert done.action == "committed" and nxt is not None and nxt.id == second


def test_it_prefers_a_waiting_suspect_while_the_process_holds_none(
    backend: Backend, keys: QueueKeys
) -> None:
    client, (w0, _w1), (first, second) = started(backend, keys, ["a", "b"], workers=2)
    task = w0.take(timeout=1)
    assert task is not None and task.id == first
    # a suspect waits (recovered once), and w0 learns of it
    client.lpush(keys.suspects, client.rpop(keys.queue))
    client.hset(keys.recoveries, second, 1)
    w0.suspects.maybe_waiting = True
    _done, nxt = w0.release_and_take(task, Outcome(True))
    assert nxt is not None and nxt.id == second
    assert w0.suspects.held_by(w0.list_key)
    assert client.llen(keys.suspects) == 0


def test_it_takes_from_the_queue_while_another_worker_of_the_process_holds_a_suspect(
    backend: Backend, keys: QueueKeys
) -> None:
    client, (w0, w1), (first, second, third) = started(backend, keys, ["a", "b", "c"], workers=2)
    task = w0.take(timeout=1)
    assert task is not None and task.id == first
    client.lpush(keys.suspects, client.rpop(keys.queue))  # `second` is a suspect now
    client.hset(keys.recoveries, second, 1)
    assert w0.suspects.acquire(w1.list_key)  # w1 holds the process's suspect
    w0.suspects.maybe_waiting = True
    _done, nxt = w0.release_and_take(task, Outcome(True))
    assert nxt is not None and nxt.id == third  # from the queue, not the suspect
    assert ids_in(client, keys.suspects) == [second]
    assert w0.suspects.held_by(w1.list_key)


def test_a_malformed_next_envelope_is_dead_lettered(backend: Backend, keys: QueueKeys) -> None:
    client, (worker,), (first,) = started(backend, keys, ["a"])
    client.lpush(keys.queue, b"not json")
    task = worker.take(timeout=1)
    assert task is not None and task.id == first
    done, nxt = worker.release_and_take(task, Outcome(True))
    assert nxt is None and done.action == "committed"
    (letter,) = dead_letters(client, keys)
    assert letter["task_id"] is None
    assert client.llen(worker.list_key) == 0 and client.llen(keys.queue) == 0


def test_a_busy_worker_pays_one_round_trip_per_task(backend: Backend, keys: QueueKeys) -> None:
    client, (worker,), ids = started(backend, keys, list(range(20)))
    writes = count_writes(worker)
    worker.take_next = lambda: True
    while worker.run_once(timeout=0.1):
        pass
    assert commits(client, keys) == dict.fromkeys(ids, 1)
    # 20 tasks: one blocking take (its registration in the same write) and the record of what it
    # took, then one step per task (the last finds the queue empty), then a take that times out.
    assert writes[0] == 1 + 1 + 20 + 1


def test_the_run_loop_finishes_the_task_it_took_when_stopped(
    backend: Backend, keys: QueueKeys
) -> None:
    """Stopped right after a release took the next task: the loop runs that task and releases it
    without taking another, so nothing stays in custody."""
    client, (worker,), ids = started(backend, keys, ["a", "b", "c"])
    stop = threading.Event()
    seen: list[Any] = []
    worker.handler = seen.append
    composite = worker.release_and_take

    def then_stop(task: Task, outcome: Outcome) -> tuple[Any, Task | None]:
        out = composite(task, outcome)
        stop.set()  # stopped between the step that took "b" and the loop's next check
        return out

    worker.release_and_take = then_stop  # type: ignore[method-assign]
    worker.run(stop)
    assert seen == ["a", "b"]
    assert commits(client, keys) == {ids[0]: 1, ids[1]: 1}
    assert client.llen(worker.list_key) == 0 and ids_in(client, keys.queue) == [ids[2]]


def test_a_stop_during_the_handler_takes_nothing_more(backend: Backend, keys: QueueKeys) -> None:
    client, (worker,), ids = started(backend, keys, ["a", "b"])
    stop = threading.Event()
    worker.handler = lambda payload: stop.set()
    worker.run(stop)
    assert commits(client, keys) == {ids[0]: 1}
    assert client.llen(worker.list_key) == 0 and ids_in(client, keys.queue) == [ids[1]]


def test_run_once_alone_is_one_whole_cycle(backend: Backend, keys: QueueKeys) -> None:
    client, (worker,), ids = started(backend, keys, ["a", "b"])
    assert worker.run_once(timeout=1)
    assert commits(client, keys) == {ids[0]: 1}
    assert client.llen(worker.list_key) == 0 and ids_in(client, keys.queue) == [ids[1]]


def test_next_task_is_a_task(backend: Backend, keys: QueueKeys) -> None:
    _, (worker,), _ = started(backend, keys, ["a", "b"])
    task = worker.take(timeout=1)
    assert task is not None
    _, nxt = worker.release_and_take(task, Outcome(True))
    assert isinstance(nxt, Task) and nxt.attempts == 0


PARSERS = ["python", "hiredis"]


@pytest.mark.parametrize("parser", PARSERS)
def test_the_busy_cycle_runs_with_either_reply_parser(
    real_redis: Any, keys: QueueKeys, parser: str
) -> None:
    """hiredis parses the replies when it is installed (the `fast` extra: redis-py picks it by
    itself); without it, redis-py's own parser does, and the cycle is the same."""
    from redis._parsers import _HiredisParser, _RESP2Parser
    from redis.utils import HIREDIS_AVAILABLE

    if parser == "hiredis" and not HIREDIS_AVAILABLE:
        pytest.skip("hiredis is not installed")
    backend = Backend("real", real_redis.url)
    backend.client().flushdb()  # (the `backend` fixture's clean start)
    client, (worker,), ids = started(backend, keys, list(range(30)))
    if HIREDIS_AVAILABLE:
        assert isinstance(worker._conn._parser, _HiredisParser)  # type: ignore[attr-defined]
    pool = client.connection_pool
    worker.close()
    worker._conn = pool.connection_class(
        **{
            **pool.connection_kwargs,
            "parser_class": _HiredisParser if parser == "hiredis" else _RESP2Parser,
        }
    )
    worker.take_next = lambda: True
    while worker.run_once(timeout=0.1):
        pass
    assert commits(client, keys) == dict.fromkeys(ids, 1)
    assert client.llen(worker.list_key) == 0
