"""The server's lifecycle (`Server`), driven in-process, from construction to deregistration:
construction and the workers' own connections, claiming a held id, the supervisor that restarts a
crashed worker, the heartbeat/sweep loop, shutdown, `run` (graceful stop included) and the signal
handlers.

Time is injected: `stop_event.wait` is replaced by a function that records the timeout it was
asked for and advances the ManualClock by it, so that "waiting" is a step of the test, never a
sleep. Threads are only joined, with generous timeouts that no assertion depends on.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import fakeredis
import pytest
import redis

from taskcustody import ManualClock, Producer, QueueKeys, Server, Settings, connect_fake
from taskcustody.core.clock import RedisClock
from taskcustody.core.errors import InvalidName, ServerIdHeld, Superseded
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import commits, ids_in, make_server

SERVER_LOG = "taskcustody.server"


@pytest.fixture
def fake() -> redis.Redis:
    return connect_fake(fakeredis.FakeServer())


def server_messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == SERVER_LOG and r.levelno == level]


def drive_waits(
    server: Server,
    clock: ManualClock,
    stop_after: int | None = None,
    only_while_unclaimed: bool = False,
) -> list[float | None]:
    """Replace `server.stop_event.wait` by a recorder that advances the clock by the timeout
    asked for; after `stop_after` waits it sets the (real) event. With `only_while_unclaimed`,
    waits after the server has claimed its id go to the real event (run's own threads)."""
    real_wait = server.stop_event.wait
    asked: list[float | None] = []

    def wait(timeout: float | None = None) -> bool:
        if only_while_unclaimed and server.incarnation is not None:
            return real_wait(timeout)
        asked.append(timeout)
        clock.advance(timeout or 0.0)
        if stop_after is not None and len(asked) >= stop_after:
            server.stop_event.set()
        return server.stop_event.is_set()

    server.stop_event.wait = wait  # type: ignore[method-assign]
    return asked


def hold_id(client: redis.Redis, keys: QueueKeys, clock: ManualClock, server_id: str) -> Server:
    """Another process claims `server_id` at the clock's current time (lease: server_ttl)."""
    other = make_server(client, keys, server_id, clock)
    other.claim()
    return other


# -- construction ------------------------------------------------------------------------------


def test_a_server_needs_at_least_one_worker(fake: redis.Redis, keys: QueueKeys) -> None:
    with pytest.raises(ValueError, match=r"^a server runs 1 to 1024 worker threads, not 0$"):
        Server(fake, keys, "s1", lambda p: None, workers=0)
    assert Server(fake, keys, "s1", lambda p: None, workers=1).worker_count == 1
    with pytest.raises(InvalidName, match=r"^server id 'no spaces' is not allowed"):
        Server(fake, keys, "no spaces", lambda p: None)


def test_a_new_server_has_defaults_and_holds_nothing_yet(
    fake: redis.Redis, keys: QueueKeys
) -> None:
    def handler(payload: object) -> None:
        return None

    server = Server(fake, keys, "s1", handler, workers=3)
    assert server.client is fake and server.keys is keys and server.handler is handler
    assert server.server_id == "s1" and server.worker_count == 3
    assert server.settings == Settings()
    # The production clock is Redis TIME, read through this server's own client.
    assert isinstance(server.clock, RedisClock) and server.clock._client is fake
    assert server.incarnation is None and server.superseded is False
    assert isinstance(server.stop_event, threading.Event) and not server.stop_event.is_set()
    with pytest.raises(RuntimeError, match=r"^claim\(\) the server id first$"):
        server.identity  # noqa: B018

    clock = ManualClock()
    explicit = Server(fake, keys, "s2", handler, settings=TEST_SETTINGS, clock=clock)
    assert explicit.settings is TEST_SETTINGS and explicit.clock is clock
    assert explicit.worker_count == 1


def test_stop_sets_the_stop_event(fake: redis.Redis, keys: QueueKeys) -> None:
    server = make_server(fake, keys, "s1", ManualClock())
    server.stop()
    assert server.stop_event.is_set()


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


# -- claim_when_free ---------------------------------------------------------------------------


def test_claim_when_free_without_patience_refuses_a_held_id_at_once(
    fake: redis.Redis, keys: QueueKeys
) -> None:
    clock = ManualClock()
    hold_id(fake, keys, clock, "s1")
    server = make_server(fake, keys, "s1", clock)
    waits = drive_waits(server, clock)
    with pytest.raises(ServerIdHeld):
        server.claim_when_free(0.0)
    assert waits == [] and server.incarnation is None


def test_claim_when_free_gives_up_once_it_has_waited_its_patience(
    fake: redis.Redis, keys: QueueKeys
) -> None:
    clock = ManualClock()
    hold_id(fake, keys, clock, "s1")  # held until 1015
    server = make_server(fake, keys, "s1", clock)  # heartbeat 5: polls every 5 / 4 = 1.25 s
    waits = drive_waits(server, clock)
    with pytest.raises(ServerIdHeld):
        server.claim_when_free(1.0)
    assert waits == [1.25]  # 0 < 1: wait once; 1.25 >= 1: give up

    waits.clear()
    with pytest.raises(ServerIdHeld):
        server.claim_when_free(3.0)
    assert waits == [1.25, 1.25, 1.25]  # 0, 1.25, 2.5 < 3; 3.75 >= 3

    waits.clear()
    with pytest.raises(ServerIdHeld):
        server.claim_when_free(2.5)
    assert waits == [1.25, 1.25]  # waited exactly its patience: gives up
    assert server.incarnation is None


def test_claim_when_free_claims_as_soon_as_the_old_lease_lapses(
    fake: redis.Redis, keys: QueueKeys
) -> None:
    clock = ManualClock()
    old = hold_id(fake, keys, clock, "s1")  # held until 1015
    server = make_server(fake, keys, "s1", clock)
    waits = drive_waits(server, clock)
    incarnation = server.claim_when_free(60.0)
    assert waits == [1.25] * 12  # 12 * 1.25 = 15: the lease has lapsed
    assert incarnation == server.incarnation and incarnation != old.incarnation
    assert int(fake.hget(keys.incarnations, "s1")) == incarnation


def test_claim_when_free_polls_no_faster_than_every_50_ms(
    fake: redis.Redis, keys: QueueKeys
) -> None:
    clock = ManualClock()
    quick = Settings(heartbeat_interval=0.1, server_ttl=0.3)
    Server(fake, keys, "s1", lambda p: None, settings=quick, clock=clock).claim()
    server = Server(fake, keys, "s1", lambda p: None, settings=quick, clock=clock)
    waits = drive_waits(server, clock)
    with pytest.raises(ServerIdHeld):
        server.claim_when_free(0.1)
    assert waits == [0.05, 0.05]  # 0.1 / 4 = 0.025 is below the 50 ms floor


# -- _supervise --------------------------------------------------------------------------------


class ScriptedWorker:
    """Stands in for a Worker under the supervisor: each run() call takes the next step, an
    exception to raise or None to return."""

    def __init__(self, steps: list[BaseException | None]) -> None:
        self.steps = list(steps)
        self.list_key = "test:tq:inflight:s1:1:w0"
        self.dirty = False
        self.calls: list[tuple[threading.Event, bool, bool]] = []

    def run(self, stop: threading.Event, until_idle: bool = False) -> None:
        self.calls.append((stop, until_idle, self.dirty))
        step = self.steps.pop(0)
        if step is not None:
            raise step


def test_supervisor_restarts_a_crashed_worker_dirty_after_a_one_second_pause(
    fake: redis.Redis, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    server = make_server(fake, keys, "s1", clock)
    waits = drive_waits(server, clock)
    worker = ScriptedWorker([RuntimeError("bug"), KeyError("bug"), None])
    with caplog.at_level(logging.ERROR, logger=SERVER_LOG):
        server._supervise(worker, True)  # type: ignore[arg-type]
    # Every run gets the server's own stop event and the until_idle flag; each restart follows a
    # 1 s pause and finds the worker marked dirty (it reconciles its list before taking again).
    assert worker.calls == [
        (server.stop_event, True, False),
        (server.stop_event, True, True),
        (server.stop_event, True, True),
    ]
    assert waits == [1.0, 1.0]
    assert (
        server_messages(caplog, logging.ERROR)
        == [f"worker {worker.list_key} crashed; restarting it"] * 2
    )
    assert all(r.exc_info for r in caplog.records if r.name == SERVER_LOG)


def test_supervisor_returns_when_the_worker_returns(fake: redis.Redis, keys: QueueKeys) -> None:
    clock = ManualClock()
    server = make_server(fake, keys, "s1", clock)
    waits = drive_waits(server, clock)
    worker = ScriptedWorker([None, RuntimeError("never reached")])
    server._supervise(worker, False)  # type: ignore[arg-type]
    assert worker.calls == [(server.stop_event, False, False)] and waits == []


def test_supervisor_does_not_start_a_worker_once_stopped(
    fake: redis.Redis, keys: QueueKeys
) -> None:
    clock = ManualClock()
    server = make_server(fake, keys, "s1", clock)
    worker = ScriptedWorker([None])
    server.stop()
    server._supervise(worker, True)  # type: ignore[arg-type]
    assert worker.calls == []

    # A crash while stopping is not followed by another start.
    server = make_server(fake, keys, "s2", clock)
    worker = ScriptedWorker([RuntimeError("bug"), None])
    drive_waits(server, clock, stop_after=1)
    server._supervise(worker, True)  # type: ignore[arg-type]
    assert len(worker.calls) == 1 and worker.dirty is True


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


# -- _background: heartbeats and sweeps ----------------------------------------------------------


def spy(obj: Any, name: str, clock: ManualClock) -> list[float]:
    """Record the clock's time at each call of obj.name (the real method still runs)."""
    real = getattr(obj, name)
    times: list[float] = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        times.append(clock.now())
        return real(*args, **kwargs)

    setattr(obj, name, wrapper)
    return times


def test_background_heartbeats_every_interval_and_sweeps_on_its_own_period(
    fake: redis.Redis, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    server = make_server(fake, keys, "s1", clock)  # heartbeat 5, sweep 10, ttl 15
    server.claim()
    heartbeats = spy(server, "heartbeat", clock)
    sweeps = spy(server, "sweep", clock)
    waits = drive_waits(server, clock, stop_after=6)
    with caplog.at_level(logging.INFO, logger=SERVER_LOG):
        server._background()
    assert waits == [5, 5, 5, 5, 5, 5]
    assert heartbeats == [1000, 1005, 1010, 1015, 1020, 1025]
    assert sweeps == [1000, 1010, 1020]  # the first at once, then every 10 s
    assert fake.zscore(keys.servers, "s1") == 1025 + 15  # the last heartbeat's deadline
    assert server_messages(caplog, logging.INFO) == []  # the sweeps found nothing to do


def test_background_sweeps_at_every_heartbeat_when_the_period_is_shorter(
    fake: redis.Redis, keys: QueueKeys
) -> None:
    clock = ManualClock()
    settings = Settings(heartbeat_interval=5, server_ttl=15, sweep_interval=3)
    server = Server(fake, keys, "s1", lambda p: None, settings=settings, clock=clock)
    server.claim()
    sweeps = spy(server, "sweep", clock)
    drive_waits(server, clock, stop_after=3)
    server._background()
    assert sweeps == [1000, 1005, 1010]


def test_background_first_sweep_prunes_a_dead_server_and_requeues_its_tasks(
    backend: Backend, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    client = backend.client()
    clock = ManualClock()
    ids = Producer(client, keys, clock).enqueue_many(["a", "b"])
    dead = make_server(client, keys, "dead", clock)
    (worker,) = dead.start()
    assert worker.take(timeout=0.05) is not None and worker.take(timeout=0.05) is not None
    worker.close()
    clock.advance(20)  # its lease (until 1015) lapses with both tasks in its custody
    server = make_server(client, keys, "s1", clock)
    server.claim()
    drive_waits(server, clock, stop_after=1)
    with caplog.at_level(logging.INFO, logger=SERVER_LOG):
        server._background()
    assert sorted(ids_in(client, keys.suspects)) == sorted(ids)
    assert client.llen(worker.list_key) == 0
    assert client.zscore(keys.servers, "dead") is None
    assert server_messages(caplog, logging.INFO) == [
        "sweep: pruned ['dead'], moved 2, requeued stuck 0"
    ]


def test_background_logs_a_sweep_that_only_pruned(
    fake: redis.Redis, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    hold_id(fake, keys, clock, "gone")  # registered, no lists, no tasks
    clock.advance(20)
    server = make_server(fake, keys, "s1", clock)
    server.claim()
    drive_waits(server, clock, stop_after=1)
    with caplog.at_level(logging.INFO, logger=SERVER_LOG):
        server._background()
    assert fake.zscore(keys.servers, "gone") is None
    assert server_messages(caplog, logging.INFO) == [
        "sweep: pruned ['gone'], moved 0, requeued stuck 0"
    ]


def test_background_logs_a_sweep_that_only_moved(
    fake: redis.Redis, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    Producer(fake, keys, clock).enqueue_many(["a"])
    gone = make_server(fake, keys, "gone", clock)
    (worker,) = gone.start()
    assert worker.take(timeout=0.05) is not None
    worker.close()
    gone.deregister()  # deregistered (nothing left to prune) with a task still in its list
    server = make_server(fake, keys, "s1", clock)
    server.claim()
    drive_waits(server, clock, stop_after=1)
    with caplog.at_level(logging.INFO, logger=SERVER_LOG):
        server._background()
    assert fake.llen(keys.suspects) == 1 and fake.llen(worker.list_key) == 0
    assert server_messages(caplog, logging.INFO) == ["sweep: pruned [], moved 1, requeued stuck 0"]


def test_background_stops_for_good_when_superseded(
    fake: redis.Redis, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    server = make_server(fake, keys, "s1", clock)
    server.claim()
    clock.advance(20)  # we stalled past our lease; a new process took the id
    newer = hold_id(fake, keys, clock, "s1")
    sweeps = spy(server, "sweep", clock)
    waits = drive_waits(server, clock, stop_after=10)
    with caplog.at_level(logging.INFO, logger=SERVER_LOG):
        server._background()
    assert waits == [] and sweeps == []
    assert server.superseded and server.stop_event.is_set()
    assert server_messages(caplog, logging.ERROR) == ["server id s1 superseded; stopping"]
    assert int(fake.hget(keys.incarnations, "s1")) == newer.incarnation


def test_background_rides_out_redis_errors(
    fake: redis.Redis, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    server = make_server(fake, keys, "s1", clock)
    server.claim()
    real_heartbeat = server.heartbeat
    failures: list[Exception] = [redis.ConnectionError("refused"), redis.TimeoutError("slow")]

    def heartbeat() -> None:
        if failures:
            raise failures.pop(0)
        real_heartbeat()

    server.heartbeat = heartbeat  # type: ignore[method-assign]
    sweeps = spy(server, "sweep", clock)
    waits = drive_waits(server, clock, stop_after=3)
    with caplog.at_level(logging.INFO, logger=SERVER_LOG):
        server._background()
    assert server_messages(caplog, logging.WARNING) == [
        "heartbeat/sweep failed: refused",
        "heartbeat/sweep failed: slow",
    ]
    assert waits == [5, 5, 5]
    assert sweeps == [1010]  # the sweep is still due at the first heartbeat that works
    assert fake.zscore(keys.servers, "s1") == 1010 + 15


def test_background_does_nothing_once_stopped(fake: redis.Redis, keys: QueueKeys) -> None:
    clock = ManualClock()
    server = make_server(fake, keys, "s1", clock)
    server.claim()
    clock.advance(5)
    server.stop()
    heartbeats = spy(server, "heartbeat", clock)
    server._background()
    assert heartbeats == [] and fake.zscore(keys.servers, "s1") == 1015


# -- _shutdown ---------------------------------------------------------------------------------


class FakeThread:
    def __init__(self, name: str, alive: bool = False) -> None:
        self.name = name
        self.alive = alive
        self.joins: list[float | None] = []

    def join(self, timeout: float | None = None) -> None:
        self.joins.append(timeout)

    def is_alive(self) -> bool:
        return self.alive


def started(
    client: redis.Redis, keys: QueueKeys, workers: int, grace: float = 30.0
) -> tuple[Server, list[Any], list[list[str]]]:
    settings = Settings(
        block_timeout=0.05, heartbeat_interval=5, server_ttl=15, shutdown_grace=grace
    )
    server = Server(
        client, keys, "s1", lambda p: None, workers=workers, settings=settings, clock=ManualClock()
    )
    ws = server.start()
    closed: list[list[str]] = []
    for w in ws:
        record: list[str] = []
        real_close = w.close

        def close(record: list[str] = record, real_close: Callable[[], None] = real_close) -> None:
            record.append("closed")
            real_close()

        w.close = close  # type: ignore[method-assign]
        closed.append(record)
    return server, ws, closed


def registry(client: redis.Redis, keys: QueueKeys) -> set[str]:
    return {k.decode() for k in client.zrange(keys.inflight_registry, 0, -1)}


def test_shutdown_splits_the_grace_period_deregisters_and_forgets_empty_lists(
    backend: Backend, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    client = backend.client()
    server, workers, closed = started(client, keys, 2, grace=30.0)
    threads = [FakeThread("taskcustody-w0"), FakeThread("taskcustody-w1")]
    with caplog.at_level(logging.INFO, logger=SERVER_LOG):
        server._shutdown(threads, workers)  # type: ignore[arg-type]
    assert [t.joins for t in threads] == [[15.0], [15.0]]
    assert (
        client.zscore(keys.servers, "s1") is None and client.hget(keys.incarnations, "s1") is None
    )
    assert registry(client, keys) == set()
    assert closed == [["closed"], ["closed"]]
    assert server_messages(caplog, logging.WARNING) == []


def test_shutdown_gives_a_single_thread_the_whole_grace_period(
    fake: redis.Redis, keys: QueueKeys
) -> None:
    server, workers, _ = started(fake, keys, 1, grace=12.0)
    thread = FakeThread("taskcustody-w0")
    server._shutdown([thread], workers)  # type: ignore[list-item]
    assert thread.joins == [12.0]


def test_shutdown_leaves_a_stuck_workers_list_registered(
    backend: Backend, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    client = backend.client()
    server, workers, closed = started(client, keys, 2)
    # Both took a task (a take registers its list); w0 finished its task, w1 is stuck on its own.
    Producer(client, keys, ManualClock()).enqueue({"n": 1}, task_id="a")
    Producer(client, keys, ManualClock()).enqueue({"n": 2}, task_id="b")
    done = workers[0].take(timeout=0.05)
    assert done is not None
    workers[0].release(done, workers[0].execute(done))
    assert workers[1].take(timeout=0.05) is not None
    threads = [FakeThread("taskcustody-w0"), FakeThread("taskcustody-w1", alive=True)]
    with caplog.at_level(logging.INFO, logger=SERVER_LOG):
        server._shutdown(threads, workers)  # type: ignore[arg-type]
    assert server_messages(caplog, logging.WARNING) == [
        "grace period over with tasks still running in ['taskcustody-w1']; their tasks stay in "
        "custody and are recovered once we are deregistered"
    ]
    # Deregistered all the same, so that the next sweep anywhere recovers the stuck task.
    assert client.zscore(keys.servers, "s1") is None
    assert registry(client, keys) == {workers[1].list_key}
    assert closed == [["closed"], []]


def test_shutdown_of_a_superseded_server_leaves_the_newer_holder_registered(
    fake: redis.Redis, keys: QueueKeys
) -> None:
    server, workers, closed = started(fake, keys, 1)
    server.superseded = True
    server._shutdown([FakeThread("taskcustody-w0")], workers)  # type: ignore[list-item]
    assert int(fake.hget(keys.incarnations, "s1")) == server.incarnation
    assert fake.zscore(keys.servers, "s1") is not None
    assert registry(fake, keys) == set() and closed == [["closed"]]


@pytest.mark.parametrize("error", [redis.ConnectionError("gone"), redis.TimeoutError("gone")])
def test_shutdown_survives_redis_being_unreachable(
    fake: redis.Redis, keys: QueueKeys, caplog: pytest.LogCaptureFixture, error: Exception
) -> None:
    server, workers, closed = started(fake, keys, 1)

    class Unreachable:
        def eval(self, *args: Any) -> Any:
            raise error

    server.client = Unreachable()  # type: ignore[assignment]
    with caplog.at_level(logging.INFO, logger=SERVER_LOG):
        server._shutdown([FakeThread("taskcustody-w0")], workers)  # type: ignore[list-item]
    assert server_messages(caplog, logging.WARNING) == ["could not deregister cleanly: gone"]
    assert closed == [[]]


def test_shutdown_refuses_mismatched_threads_and_workers(
    fake: redis.Redis, keys: QueueKeys
) -> None:
    server, workers, _ = started(fake, keys, 2)
    with pytest.raises(ValueError):
        server._shutdown([FakeThread("taskcustody-w0")], workers)  # type: ignore[list-item]


# -- run -----------------------------------------------------------------------------------------


class RecordingThread(threading.Thread):
    joins: ClassVar[list[tuple[str, float | None]]] = []

    def join(self, timeout: float | None = None) -> None:
        RecordingThread.joins.append((self.name, timeout))
        super().join(timeout)


@pytest.fixture
def recording_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, Any]]]:
    joins: list[tuple[str, Any]] = []
    monkeypatch.setattr(RecordingThread, "joins", joins)
    monkeypatch.setattr(threading, "Thread", RecordingThread)
    yield joins


def test_run_until_idle_handles_everything_then_shuts_down_cleanly(
    backend: Backend, keys: QueueKeys, recording_threads: list[tuple[str, Any]]
) -> None:
    client = backend.client()
    clock = ManualClock()
    ids = Producer(client, keys, clock).enqueue_many([1, 2, 3, 4, 5])
    seen: list[tuple[str, bool]] = []

    def handler(payload: object) -> None:
        me = threading.current_thread()
        seen.append((me.name, me.daemon))

    server = make_server(client, keys, "s1", clock, handler, workers=2)
    server.run(until_idle=True)
    assert commits(client, keys) == dict.fromkeys(ids, 1)
    assert len(seen) == 5 and all(daemon for _, daemon in seen)
    assert {name for name, _ in seen} <= {"taskcustody-w0", "taskcustody-w1"}
    assert server.stop_event.is_set()
    assert client.zscore(keys.servers, "s1") is None and registry(client, keys) == set()
    # Worker threads: joined until idle, then given the grace period (30 s / 2) in shutdown;
    # the heartbeat thread is waited for at most one socket timeout (+1 s).
    assert recording_threads == [
        ("taskcustody-w0", None),
        ("taskcustody-w1", None),
        ("taskcustody-w0", 15.0),
        ("taskcustody-w1", 15.0),
        ("taskcustody-heartbeat", TEST_SETTINGS.socket_timeout + 1),
    ]


def recording_run(server: Server, stop_from_worker: bool = False) -> list[tuple[str, Any, ...]]:
    """Replace the supervisor and the heartbeat loop by recorders of the thread they run in."""
    calls: list[tuple[str, Any, ...]] = []
    lock = threading.Lock()

    def supervise(worker: Any, until_idle: bool) -> None:
        me = threading.current_thread()
        with lock:
            calls.append(("worker", worker.owner.worker_id, until_idle, me.name, me.daemon))
        if stop_from_worker:
            server.stop()

    def background() -> None:
        me = threading.current_thread()
        with lock:
            calls.append(("background", me.name, me.daemon))

    server._supervise = supervise  # type: ignore[method-assign]
    server._background = background  # type: ignore[method-assign]
    return calls


def test_run_starts_a_daemon_thread_per_worker_and_one_for_the_heartbeat(
    fake: redis.Redis, keys: QueueKeys
) -> None:
    server = make_server(fake, keys, "s1", ManualClock(), workers=2)
    calls = recording_run(server)
    server.run(until_idle=True)
    assert sorted(calls) == [
        ("background", "taskcustody-heartbeat", True),
        ("worker", "w0", True, "taskcustody-w0", True),
        ("worker", "w1", True, "taskcustody-w1", True),
    ]


def test_run_by_default_serves_until_stopped_and_leaves_signals_alone(
    fake: redis.Redis, keys: QueueKeys
) -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    server = make_server(fake, keys, "s1", ManualClock())
    calls = recording_run(server, stop_from_worker=True)
    server.run()
    assert ("worker", "w0", False, "taskcustody-w0", True) in calls
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    assert fake.zscore(keys.servers, "s1") is None


def test_run_refuses_a_held_id_at_once_by_default(fake: redis.Redis, keys: QueueKeys) -> None:
    clock = ManualClock()
    hold_id(fake, keys, clock, "s1")
    server = make_server(fake, keys, "s1", clock)
    calls = recording_run(server)
    waits = drive_waits(server, clock)
    with pytest.raises(ServerIdHeld):
        server.run(until_idle=True)
    assert waits == [] and calls == []


def test_run_waits_for_a_held_id_when_asked_to(fake: redis.Redis, keys: QueueKeys) -> None:
    clock = ManualClock()
    ids = Producer(fake, keys, clock).enqueue_many(["x", "y"])
    hold_id(fake, keys, clock, "s1")  # a crashed predecessor's lease runs until 1015
    server = make_server(fake, keys, "s1", clock)
    waits = drive_waits(server, clock, only_while_unclaimed=True)
    server.run(until_idle=True, wait_for_id=20.0)
    assert waits == [1.25] * 12
    assert commits(fake, keys) == dict.fromkeys(ids, 1)


def test_run_with_install_signals_installs_the_stop_handler(
    fake: redis.Redis, keys: QueueKeys
) -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    server = make_server(fake, keys, "s1", ManualClock())
    calls = recording_run(server)
    try:
        server.run(until_idle=True, install_signals=True)
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler) and handler not in before
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])
    assert len(calls) == 2


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


# -- signal handlers ---------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_handler_stops_taking_and_says_so(
    fake: redis.Redis, keys: QueueKeys, caplog: pytest.LogCaptureFixture, signum: int
) -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    server = make_server(fake, keys, "s1", ManualClock())
    try:
        server._install_signal_handlers()
        term, intr = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
        assert callable(term) and term is intr and term not in before
        assert not server.stop_event.is_set()
        with caplog.at_level(logging.INFO, logger=SERVER_LOG):
            term(signum, None)
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])
    assert server.stop_event.is_set()
    assert server_messages(caplog, logging.INFO) == [
        f"signal {int(signum)}: stop taking, finish current tasks within 30s (a second signal "
        "exits at once)"
    ]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_exits_at_once(
    fake: redis.Redis, keys: QueueKeys, caplog: pytest.LogCaptureFixture, signum: int
) -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    server = make_server(fake, keys, "s1", ManualClock())
    exits: list[int] = []
    server.force_exit = exits.append
    try:
        server._install_signal_handlers()
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler)
        with caplog.at_level(logging.INFO, logger=SERVER_LOG):
            handler(signum, None)
            assert exits == []  # the first one only stops taking
            handler(signum, None)
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])
    assert exits == [128 + int(signum)]
    assert server_messages(caplog, logging.WARNING) == [
        f"signal {int(signum)} again: exiting now; the tasks in flight stay in custody and are "
        "recovered as after a crash"
    ]


def test_heartbeat_after_losing_the_id_raises_and_stops(fake: redis.Redis, keys: QueueKeys) -> None:
    clock = ManualClock()
    server = make_server(fake, keys, "s1", clock)
    server.claim()
    clock.advance(20)
    hold_id(fake, keys, clock, "s1")
    with pytest.raises(
        Superseded,
        match=r"^server id 's1' was claimed by a newer process while "
        r"this one stalled; stopping$",
    ):
        server.heartbeat()
    assert server.superseded and server.stop_event.is_set()
