"""The server's lifecycle: threads, graceful shutdown, supervisor restarts."""

from __future__ import annotations

import threading

from taskcustody import ManualClock, Producer, QueueKeys
from tests.conftest import Backend
from tests.helpers import commits, make_server


def test_graceful_stop_finishes_the_current_task_then_deregisters(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    first, second = Producer(client, keys, clock).enqueue_many(["first", "second"])
    inside, leave = threading.Event(), threading.Event()

    def handler(payload: object) -> None:
        inside.set()
        assert leave.wait(30)

    server = make_server(client, keys, "s1", clock, handler)
    runner = threading.Thread(target=server.run, daemon=True)
    runner.start()
    assert inside.wait(30)
    server.stop()  # what SIGTERM does: stop taking ...
    leave.set()  # ... and the task in hand still finishes
    runner.join(30)
    assert not runner.is_alive()
    assert commits(client, keys) == {first: 1}
    # Not taken after the stop: still pending, in no one's custody.
    assert client.llen(keys.queue) == 1
    assert client.zcard(keys.servers) == 0 and client.hlen(keys.incarnations) == 0
    assert client.zcard(keys.inflight_registry) == 0  # its empty lists were forgotten
    assert second not in commits(client, keys)


def test_worker_that_dies_of_an_unexpected_error_is_restarted(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    ids = Producer(client, keys, clock).enqueue_many(["a", "b", "c"])
    server = make_server(client, keys, "s1", clock)
    (worker,) = server.start()
    real_execute = worker.execute
    crashes = []

    def crash_once(task: object) -> object:
        if not crashes:
            crashes.append(task)
            raise RuntimeError("worker bug, not a handler error")
        return real_execute(task)  # type: ignore[arg-type]

    worker.execute = crash_once  # type: ignore[method-assign]
    # The supervisor restarts the worker after the crash (no real pause between attempts here);
    # the worker is marked dirty, so it reconciles its own list before taking again.
    server.stop_event.wait = lambda timeout=None: False  # type: ignore[method-assign]
    server._supervise(worker, until_idle=True)
    assert crashes
    assert commits(client, keys) == dict.fromkeys(ids, 1)
    assert client.llen(worker.list_key) == 0 and client.llen(keys.queue) == 0


def test_workers_own_connections_do_not_exhaust_the_clients_pool(
    backend: Backend, keys: QueueKeys
) -> None:
    """Each worker holds a connection of its own for life; taking them from the client's pool
    used to hit redis-py's pool limit once a process had made enough workers."""
    client = backend.client()
    clock = ManualClock()
    server = make_server(client, keys, "s1", clock)
    server.claim()
    workers = [server.make_worker(i) for i in range(120)]
    try:
        for worker in workers:
            assert worker.take(timeout=0.01) is None
        assert client.ping()  # the pool itself still has room
    finally:
        for worker in workers:
            worker.close()
