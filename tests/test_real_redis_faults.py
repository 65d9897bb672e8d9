"""Faults injected into Redis itself (real server only): a blocking take never hangs, and a take
whose reply is lost leaves nothing behind once the worker reconciles."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest
import redis

from taskcustody import ManualClock, Producer, QueueKeys, Settings, connect
from tests.helpers import all_custody, make_server
from tests.support.redis_server import (
    RedisServerProcess,
    redis_server_binary,
    throwaway_redis_server,
)

pytestmark = pytest.mark.real_redis

FAST = Settings(block_timeout=0.2, socket_timeout_margin=0.3, drain_chunk=3, track_commits=True)


@pytest.fixture
def own_server() -> Iterator[RedisServerProcess]:
    """A server of this test's own: it gets paused, stopped and killed."""
    if redis_server_binary() is None:
        pytest.skip("no redis-server binary")
    with throwaway_redis_server() as server:
        yield server


def _take_in_thread(worker: object) -> tuple[threading.Thread, list[BaseException | object]]:
    outcome: list[BaseException | object] = []

    def take() -> None:
        try:
            outcome.append(worker.take())  # type: ignore[attr-defined]
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=take, daemon=True)
    t.start()
    return t, outcome


@pytest.mark.parametrize("fault", ["SIGSTOP", "CLIENT PAUSE"])
def test_take_on_an_unresponsive_server_raises_instead_of_hanging(
    own_server: RedisServerProcess, fault: str
) -> None:
    keys = QueueKeys("faults")
    client = connect(own_server.url, FAST)
    clock = ManualClock()
    Producer(client, keys, clock).enqueue("t")
    (worker,) = make_server(client, keys, "s1", clock, settings=FAST).start()
    worker.reconcile()
    admin = redis.Redis.from_url(own_server.url)
    if fault == "SIGSTOP":
        own_server.signal(signal.SIGSTOP)
    else:
        # WRITE mode pauses BLMOVE (a write) but lets our admin client unpause later.
        admin.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
    t, outcome = _take_in_thread(worker)
    # The socket timeout (0.5 s) must fire; 30 s is only the guard against a real hang.
    t.join(30)
    assert not t.is_alive(), "take hung on an unresponsive server"
    assert isinstance(outcome[0], redis.TimeoutError | redis.ConnectionError), outcome
    assert worker.dirty  # it may have taken the task without seeing it: reconcile first
    if fault == "SIGSTOP":
        own_server.signal(signal.SIGCONT)
    else:
        admin.execute_command("CLIENT", "UNPAUSE")
    # Whatever the server did with the unanswered take, reconciling leaves the task in exactly
    # one place, and the next cycle commits it.
    worker.reconcile()
    (task_id,) = all_custody(client, keys).keys()
    assert all_custody(client, keys)[task_id] == 1
    assert worker.run_once(timeout=0.2)
    assert client.hget(keys.commit_log, task_id) == b"1"


def test_killed_redis_surfaces_as_an_error_and_the_worker_recovers_after_restart(
    own_server: RedisServerProcess,
) -> None:
    keys = QueueKeys("faults")
    client = connect(own_server.url, FAST)
    clock = ManualClock()
    (worker,) = make_server(client, keys, "s1", clock, settings=FAST).start()
    worker.reconcile()
    assert worker.take() is None  # the worker's own connection is open now
    own_server.restart()  # same port, empty dataset (nothing persisted: out of scope)
    with pytest.raises(redis.ConnectionError):
        worker.take()
    assert worker.dirty
    task_id = Producer(client, keys, clock).enqueue("after restart")
    worker.register()
    assert worker.run_once(timeout=0.2)
    assert client.hget(keys.commit_log, task_id) == b"1"
