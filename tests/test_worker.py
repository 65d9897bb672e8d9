"""The worker's public steps (`Worker`: take, record, execute, release), one property each: one
cycle commits and leaves nothing behind, what a release stores, what a failure records, what a
malformed task is released with, and how the worker's own connection keeps its replies in order.

(Its production loop, `Worker.run`, is tests/test_worker_run_loop.py.)"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from typing import Any

import pytest
import redis

from taskcustody import (
    ListOwner,
    ManualClock,
    Outcome,
    Producer,
    QueueKeys,
    Server,
    Worker,
    WrongKeyType,
)
from taskcustody.core.envelope import new_task
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import dead_letters

OWNER = ListOwner("s1", 1, "w0")


def _worker(
    client: redis.Redis, keys: QueueKeys, clock: ManualClock, handler: Any = lambda p: None
) -> Worker:
    worker = Worker(client, keys, OWNER, handler, clock, TEST_SETTINGS)
    worker.register()
    worker.reconcile()  # a new worker starts dirty; now it is clean
    return worker


def _cycle(client: redis.Redis, keys: QueueKeys, result: Any) -> bytes | None:
    """Run one task whose handler returns `result`; return the stored result."""
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue("p")
    worker = _worker(client, keys, clock, handler=lambda p: result)
    try:
        assert worker.run_once() is True
    finally:
        worker.close()
    assert client.get(keys.committed) == b"1"
    return client.get(keys.result(task_id))  # type: ignore[return-value]


# -- one cycle -----------------------------------------------------------------------------------


def test_one_cycle_commits(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue({"n": 1})
    server = Server(client, keys, "s1", lambda p: p["n"] + 1, settings=TEST_SETTINGS, clock=clock)
    (worker,) = server.start()
    task = worker.take()
    assert task is not None
    worker.record(task)
    release = worker.release(task, worker.execute(task))
    assert release.held and release.action == "committed"
    assert client.llen(keys.queue) == 0
    assert client.llen(worker.list_key) == 0
    assert client.hgetall(keys.processing) == {}
    assert client.hget(keys.commit_log, task.id) == b"1"


# -- what a commit stores ------------------------------------------------------------------------


def test_a_handler_returning_none_stores_json_null(backend: Backend, keys: QueueKeys) -> None:
    # A waiter (results.get_result) must tell "committed, returned None" from "not done yet".
    assert _cycle(backend.client(), keys, None) == b"null"


def test_result_ttl_zero_stores_no_result(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue("p")
    worker = Worker(
        client,
        keys,
        OWNER,
        lambda p: {"big": "result"},
        clock,
        dataclasses.replace(TEST_SETTINGS, result_ttl=0),
    )
    worker.register()
    try:
        assert worker.run_once() is True
    finally:
        worker.close()
    assert client.get(keys.committed) == b"1"
    assert list(client.scan_iter(match=keys.result_prefix + "*")) == []


def test_a_result_expires_after_result_ttl(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue("p")
    worker = Worker(
        client, keys, OWNER, lambda p: 1, clock, dataclasses.replace(TEST_SETTINGS, result_ttl=777)
    )
    worker.register()
    try:
        assert worker.run_once() is True
    finally:
        worker.close()
    assert 0 < client.ttl(keys.result(task_id)) <= 777


def test_a_json_result_is_stored_as_json(backend: Backend, keys: QueueKeys) -> None:
    assert _cycle(backend.client(), keys, {"a": [1, 2.5]}) == b'{"a": [1, 2.5]}'


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_float_is_stored_as_its_repr_not_as_invalid_json(
    backend: Backend, keys: QueueKeys, value: float
) -> None:
    stored = _cycle(backend.client(), keys, value)
    assert stored is not None
    assert json.loads(stored) == {"unserialisable_result": repr(value)}


def test_an_unserialisable_result_is_stored_as_its_repr(backend: Backend, keys: QueueKeys) -> None:
    stored = _cycle(backend.client(), keys, {1, 2})
    assert stored is not None
    assert json.loads(stored) == {"unserialisable_result": "{1, 2}"}


# -- what a failure records ----------------------------------------------------------------------


def test_execute_returns_a_failed_outcome_with_the_exception_text() -> None:
    def handler(payload: Any) -> None:
        raise KeyError("boom")

    worker = Worker(redis.Redis(), QueueKeys("q"), OWNER, handler, ManualClock(), TEST_SETTINGS)
    outcome = worker.execute(new_task({"x": 1}, 0.0, "t1"))
    assert outcome == Outcome(False, None, "KeyError: 'boom'")
    assert outcome.ok is False
    worker.close()


def test_execute_keeps_every_line_of_the_exception_text() -> None:
    def handler(payload: Any) -> None:
        exc = ValueError("first")
        exc.add_note("second line")
        raise exc

    worker = Worker(redis.Redis(), QueueKeys("q"), OWNER, handler, ManualClock(), TEST_SETTINGS)
    outcome = worker.execute(new_task(1, 0.0, "t1"))
    assert outcome == Outcome(False, error="ValueError: first\nsecond line")
    worker.close()


def test_a_dead_letter_carries_raw_error_task_id_and_time(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock(start=1234.5)

    def handler(payload: Any) -> None:
        raise RuntimeError("always")

    producer = Producer(client, keys, clock)
    task_id = producer.enqueue({"n": 1})
    worker = _worker(client, keys, clock, handler)
    try:
        for _ in range(TEST_SETTINGS.max_attempts):
            clock.advance(1.0)
            assert worker.run_once() is True
    finally:
        worker.close()
    [letter] = dead_letters(client, keys)
    assert set(letter) == {"raw", "error", "task_id", "at", "traceback"}
    assert letter["task_id"] == task_id
    assert letter["error"] == "RuntimeError: always"
    assert letter["at"] == 1234.5 + TEST_SETTINGS.max_attempts
    body = json.loads(base64.b64decode(letter["raw"]))
    assert (body["id"], body["attempts"]) == (task_id, TEST_SETTINGS.max_attempts - 1)


def test_an_interrupted_handler_is_released_as_a_failure(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue(1)

    class Interrupt(BaseException):
        pass

    def handler(payload: Any) -> None:
        raise Interrupt

    worker = _worker(client, keys, clock, handler)
    seen: list[Outcome] = []
    original = worker.release

    def spy(task: Any, outcome: Outcome) -> Any:
        seen.append(outcome)
        return original(task, outcome)

    worker.release = spy  # type: ignore[method-assign]
    try:
        with pytest.raises(Interrupt):
            worker.run_once()
    finally:
        worker.close()
    assert seen == [Outcome(False, None, "worker interrupted")]
    assert seen[0].ok is False
    assert client.llen(keys.queue) == 1  # retried, not lost


# -- a malformed task ----------------------------------------------------------------------------


def test_a_malformed_task_is_released_without_a_task_id(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock(start=50.0)
    client.lpush(keys.queue, b"not json at all")
    worker = _worker(client, keys, clock)
    calls: list[tuple[Any, ...]] = []
    original = worker.release_args

    def spy(raw: bytes, task_id: str, action: str, data: str | bytes) -> tuple[Any, ...]:
        args = original(raw, task_id, action, data)
        calls.append(args)
        return args

    worker.release_args = spy  # type: ignore[method-assign]
    try:
        assert worker.take() is None
    finally:
        worker.close()
    [args] = calls
    assert args[11:14] == (b"not json at all", "", "dead")
    assert args[7] == keys.result("-") and args[8] == keys.recoveries
    assert args[9] == keys.suspects and args[10] == keys.scheduled
    [letter] = dead_letters(client, keys)
    assert letter["task_id"] is None
    assert letter["at"] == 50.0
    assert client.llen(worker.list_key) == 0


def test_release_args_name_every_key_in_script_order(keys: QueueKeys) -> None:
    worker = Worker(redis.Redis(), keys, OWNER, lambda p: None, ManualClock(), TEST_SETTINGS)
    args = worker.release_args(b"raw", "", "dead", "{}")
    assert args == (
        10,
        worker.list_key,
        keys.processing,
        keys.queue,
        keys.dead_letters,
        keys.committed,
        keys.commit_log,
        keys.result("-"),
        keys.recoveries,
        keys.suspects,
        keys.scheduled,
        b"raw",
        "",
        "dead",
        "{}",
        TEST_SETTINGS.result_ttl,
        1,
        "",
    )
    assert worker.release_args(b"raw", "t9", "ok", "1")[7] == keys.result("t9")
    worker.close()
    # a delayed retry carries its due time: now + at most the backoff cap of its attempt
    clock = ManualClock(start=100.0)
    settings = dataclasses.replace(TEST_SETTINGS, retry_backoff=2.0, retry_backoff_max=60.0)
    worker = Worker(redis.Redis(), keys, OWNER, lambda p: None, clock, settings)
    later = worker.release_args(b"raw", "t9", "later", '{"attempts": 3}')
    assert later[13] == "later" and 100.0 <= float(later[-1]) <= 100.0 + 8.0
    worker.close()


# -- the worker's own connection -----------------------------------------------------------------


def test_a_wrong_type_queue_names_both_keys(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    client.set(keys.queue, "a string, not a list")
    worker = _worker(client, keys, ManualClock())
    try:
        with pytest.raises(WrongKeyType) as info:
            worker.take()
    finally:
        worker.close()
    message = str(info.value)
    assert message.startswith(
        f"one of {keys.queue}, {worker.list_key} holds the wrong Redis type ("
    )
    assert re.search(r"WRONGTYPE", message)


def test_a_failed_send_marks_the_worker_dirty(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue(1)
    worker = _worker(client, keys, clock)
    try:
        assert worker.dirty is False
        task = worker.take()
        assert task is not None

        def broken(*args: Any) -> None:
            raise redis.ConnectionError("gone")

        worker._conn.send_command = broken  # type: ignore[method-assign]
        with pytest.raises(redis.ConnectionError):
            worker.record(task)
        assert worker.dirty is True
        assert worker._unread_replies == 0
    finally:
        worker.close()


def test_several_deferred_records_are_all_read_before_the_next_reply(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    producer = Producer(client, keys, clock)
    ids = [producer.enqueue(n) for n in range(3)]
    worker = _worker(client, keys, clock)
    try:
        tasks = [worker.take() for _ in ids]
        assert [t.id for t in tasks if t is not None] == ids
        for task in tasks:
            assert task is not None
            worker.record(task)
        worker.flush()
        assert worker._unread_replies == 0
        for task in tasks:
            assert task is not None
            assert client.hget(keys.processing, task.id) is not None
            release = worker.release(task, Outcome(True, task.payload))
            assert release.held is True
            assert release.action == "committed"
        assert client.get(keys.committed) == b"3"
        assert client.hlen(keys.processing) == 0
        assert client.llen(worker.list_key) == 0
    finally:
        worker.close()
