"""Regression: the production loops' driver read Redis back while the worker's record (sent, its
reply left unread for the next command) had not yet run on a real server: a `records` mismatch
(model: recorded; Redis: none) in
`tests/stateful/test_production_loops.py::test_the_real_worker_loop_follows_the_model[real]` with
both cores busy. `loops.await_answer` waits until Redis has answered and leaves the reply to the
worker.

Made certain here by pausing Redis's writes (CLIENT PAUSE WRITE holds the record's script): the
thread that awaits the answer cannot return before the pause is lifted, so what it reads next
has the record. Without the wait it returns at once, while the pause still holds the record."""

from __future__ import annotations

import threading

import pytest
import redis

from taskcustody import ListOwner, ManualClock, Producer, QueueKeys, Worker
from taskcustody.core.outcome import Outcome
from taskcustody.verify.loops import await_answer
from tests.conftest import TEST_SETTINGS
from tests.support.redis_server import RedisServerProcess

pytestmark = pytest.mark.real_redis


def test_the_read_after_awaiting_the_answer_sees_the_record(real_redis: RedisServerProcess) -> None:
    keys = QueueKeys("awaits-the-record")
    client = redis.Redis.from_url(real_redis.url)
    admin = redis.Redis.from_url(real_redis.url)
    reader = redis.Redis.from_url(real_redis.url)
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue("p")
    worker = Worker(client, keys, ListOwner("s0", 1, "w0"), lambda p: None, clock, TEST_SETTINGS)
    try:
        worker.register()
        worker.reconcile()
        task = worker.take_from_queue(timeout=1.0)
        assert task is not None and task.id == task_id
        admin.client_pause(60_000, all=False)  # WRITE: the record's script waits for the unpause
        try:
            worker.record(task)  # sent; its reply is read with the next command's
            seen: list[object] = []

            def awaits() -> None:
                await_answer(worker, real_redis=True)
                seen.append(reader.hget(keys.processing, task_id))

            thread = threading.Thread(target=awaits)
            thread.start()
            # Without the wait the thread is done here, having read no record (the pause holds
            # it); with it, it cannot be done before the unpause below.
            thread.join(timeout=0.5)
            assert seen == [], "read Redis back before Redis answered the record"
        finally:
            admin.client_unpause()
        thread.join(timeout=60)
        assert not thread.is_alive()
        assert seen and seen[0] is not None  # the record, in Redis, once answered
        # The reply was left to the worker: its release reads it as its own, and its own
        # reply is the release's (the replies are still in step).
        release = worker.release(task, Outcome(True))
        assert (release.held, release.remaining, release.action) == (True, 0, "committed")
    finally:
        worker.close()
        for c in (client, admin, reader):
            c.close()


def test_a_worker_is_answered_only_once_redis_has_run_its_record(
    real_redis: RedisServerProcess,
) -> None:
    keys = QueueKeys("answered")
    client = redis.Redis.from_url(real_redis.url)
    admin = redis.Redis.from_url(real_redis.url)
    Producer(client, keys, ManualClock()).enqueue("p")
    worker = Worker(
        client, keys, ListOwner("s0", 1, "w0"), lambda p: None, ManualClock(), TEST_SETTINGS
    )
    try:
        worker.register()
        worker.reconcile()
        task = worker.take_from_queue(timeout=1.0)
        assert task is not None
        assert worker.answered(timeout=0.0)  # nothing sent is unread
        admin.client_pause(60_000, all=False)  # WRITE: holds the record's script
        try:
            worker.record(task)
            assert not worker.answered(timeout=0.2)  # the pause holds it for 60 s
        finally:
            admin.client_unpause()
        assert worker.answered(timeout=60)
        assert worker.release(task, Outcome(True)).action == "committed"
    finally:
        worker.close()
        for c in (client, admin):
            c.close()
