"""Redis out of memory under `noeviction`, on a real redis-server started with `--maxmemory 2mb`.

Memory is filled from the test with one filler key (SETRANGE at an offset: a short command that
allocates past the limit, so the filling itself is never refused) and freed by deleting it. Time
is injected: the stop event records the pauses asked for and runs the test's hook (free memory,
advance the clock) instead of sleeping.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from taskcustody import (
    ManualClock,
    Producer,
    QueueKeys,
    RedisOutOfMemory,
    Settings,
    connect,
    drain_inflight,
)
from taskcustody.cli.app import main
from taskcustody.core import scripts
from taskcustody.core.outcome import Outcome
from taskcustody.core.prefetch import PrefetchingWorker
from taskcustody.core.worker import Worker
from taskcustody.deploy.oom import MAX_PAUSE, OomSpell, is_oom
from tests.conftest import TEST_SETTINGS
from tests.helpers import Stop, all_custody, commits, ids_in, make_server
from tests.support.redis_server import (
    RedisServerProcess,
    redis_server_binary,
    throwaway_redis_server,
)

pytestmark = pytest.mark.real_redis

FILLER = "filler"  # outside every queue's keys
PROBE = "probe"
WORKER_LOG = "taskcustody.worker"
SERVER_LOG = "taskcustody.server"
OOM_TEXT = "command not allowed when used memory > 'maxmemory'."
RELEASE_SHA = scripts.RELEASE_SCRIPT.sha
RELEASE_AND_TAKE_SHA = scripts.RELEASE_AND_TAKE_SCRIPT.sha


@pytest.fixture(scope="module")
def small_server() -> Iterator[RedisServerProcess]:
    if redis_server_binary() is None:
        pytest.skip("no redis-server binary")
    with throwaway_redis_server("--maxmemory", "2mb", "--maxmemory-policy", "noeviction") as s:
        yield s


@pytest.fixture
def admin(small_server: RedisServerProcess) -> Iterator[redis.Redis]:
    """The test's own connection: fills and frees memory, reads state back."""
    client = connect(small_server.url, TEST_SETTINGS)
    client.flushall()
    yield client
    client.flushall()
    client.close()


@pytest.fixture
def client(small_server: RedisServerProcess, admin: redis.Redis) -> Iterator[redis.Redis]:
    """The code under test's client."""
    c = connect(small_server.url, TEST_SETTINGS)
    yield c
    c.close()


def is_full(admin: redis.Redis) -> bool:
    """Does Redis refuse a write that would grow memory? (SADD of a probe, removed again.)"""
    try:
        admin.sadd(PROBE, "x")
    except redis.exceptions.OutOfMemoryError:
        return True
    admin.delete(PROBE)
    return False


def fill(admin: redis.Redis) -> None:
    memory = admin.info("memory")
    admin.setrange(FILLER, int(memory["maxmemory"]) - int(memory["used_memory"]) + 512 * 1024, b"x")
    assert is_full(admin)


def free(admin: redis.Redis) -> None:
    admin.delete(FILLER)
    assert not is_full(admin)


def free_at(
    admin: redis.Redis, n: int, also: Callable[[int], None] = lambda n: None
) -> Callable[[int], None]:
    def hook(k: int) -> None:
        also(k)
        if k == n:
            free(admin)

    return hook


def messages(caplog: pytest.LogCaptureFixture, logger: str, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno == level]


@contextlib.contextmanager
def refused_for_memory() -> Iterator[None]:
    """The block raises an OOM refusal: OutOfMemoryError, or on Redis 6.2 a script error that
    quotes it (`is_oom` knows both)."""
    with pytest.raises(redis.ResponseError) as caught:
        yield
    assert is_oom(caught.value), caught.value


def started_worker(
    client: redis.Redis,
    keys: QueueKeys,
    clock: ManualClock,
    handler: Callable[[Any], Any] = lambda p: None,
    settings: Settings = TEST_SETTINGS,
) -> Worker:
    (worker,) = make_server(client, keys, "s1", clock, handler, settings=settings).start()
    assert isinstance(worker, Worker)
    return worker


# -- what Redis does over its limit (pins the notes in taskcustody/deploy/oom.py) -----------------


def test_over_maxmemory_redis_refuses_our_growing_steps_whole_and_runs_the_release(
    admin: redis.Redis, client: redis.Redis, keys: QueueKeys
) -> None:
    clock = ManualClock()
    a, b = Producer(client, keys, clock).enqueue_many(["a", "b"])
    server = make_server(client, keys, "s1", clock)
    (worker,) = server.start()
    assert isinstance(worker, Worker)
    task = worker.take(timeout=0.05)
    assert task is not None and task.id == a
    worker.record(task)
    worker.flush()
    record = admin.hget(keys.processing, a)
    fill(admin)

    with pytest.raises(RedisOutOfMemory, match=r"^Redis is out of memory \("):
        Producer(client, keys, clock).enqueue("c")  # LPUSH
    with refused_for_memory():
        worker.take(timeout=0.05)  # BLMOVE: refused before it blocks or moves
    with refused_for_memory():  # ZADD first
        admin.eval(
            scripts.TAKE_AND_RECORD,
            4,
            keys.queue,
            worker.list_key,
            keys.processing,
            keys.inflight_registry,
            "v",
            "1",
        )
    with refused_for_memory():  # LMOVE first
        drain_inflight(client, keys, worker.list_key, force=True)
    with refused_for_memory():  # HSET first
        admin.eval(scripts.RECORD, 2, worker.list_key, keys.processing, task.raw, a, "other")
    with refused_for_memory():  # HSET first
        server.heartbeat()
    with refused_for_memory():  # HSET first
        make_server(client, keys, "s2", clock).claim()
    with refused_for_memory():  # a take's registration
        admin.zadd(keys.inflight_registry, {worker.list_key: 1})
    # Reads, deletes and script loads still run.
    assert admin.script_load(scripts.RELEASE) and admin.time() and admin.delete("none") == 0
    assert admin.lrem(keys.queue, 1, b"nothing") == 0 and admin.llen(keys.queue) == 1
    # Each refused step wrote nothing.
    assert ids_in(admin, keys.queue) == [b] and ids_in(admin, worker.list_key) == [a]
    assert admin.hget(keys.processing, a) == record and admin.zscore(keys.servers, "s2") is None

    # RELEASE begins with LREM, which only shrinks memory; after that write Redis lets the rest
    # of the script run (a script never stops half-way for lack of memory): it commits.
    released = worker.release(task, Outcome(True, result={"big": "x" * 1000}))
    assert (released.held, released.action) == (True, "committed")
    assert commits(admin, keys) == {a: 1} and admin.llen(worker.list_key) == 0
    assert admin.hget(keys.processing, a) is None and is_full(admin)

    free(admin)
    Producer(client, keys, clock).enqueue("c")
    assert admin.llen(keys.queue) == 2
    worker.close()


def test_the_composite_step_under_oom_releases_and_takes_the_next_task(
    admin: redis.Redis, client: redis.Redis, keys: QueueKeys
) -> None:
    """RELEASE_AND_TAKE begins with the release's LREM too: under OOM it runs whole, commits and
    moves the next task into custody with its record (the step never stops half-way)."""
    clock = ManualClock()
    first, second = Producer(client, keys, clock).enqueue_many(["a", "b"])
    worker = started_worker(client, keys, clock)
    worker.reconcile()  # clean: a dirty worker's step takes nothing
    task = worker.take(timeout=0.05)
    assert task is not None and task.id == first
    worker.flush()
    fill(admin)
    done, nxt = worker.release_and_take(task, Outcome(True))
    assert done.action == "committed" and nxt is not None and nxt.id == second
    assert is_full(admin) and commits(admin, keys) == {first: 1}
    assert ids_in(admin, worker.list_key) == [second] and admin.llen(keys.queue) == 0
    assert admin.hget(keys.processing, second) is not None
    free(admin)
    worker.close()


@pytest.mark.parametrize("fails", [False, True])
def test_a_release_under_oom_commits_or_requeues_its_task(
    admin: redis.Redis, client: redis.Redis, keys: QueueKeys, fails: bool
) -> None:
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue("t")

    def handler(payload: object) -> None:
        fill(admin)  # memory runs out while the task runs
        if fails:
            raise RuntimeError("boom")

    worker = started_worker(client, keys, clock, handler)
    assert worker.run_once(timeout=0.05) is True
    assert is_full(admin) and admin.llen(worker.list_key) == 0
    if fails:  # retried: back in the queue, attempt counted, under OOM all the same
        assert commits(admin, keys) == {} and ids_in(admin, keys.queue) == [task_id]
    else:
        assert commits(admin, keys) == {task_id: 1} and admin.llen(keys.queue) == 0
    worker.close()


# -- the producer ------------------------------------------------------------------------------


def test_enqueue_under_oom_raises_a_clear_error_and_enqueues_nothing(
    admin: redis.Redis, client: redis.Redis, keys: QueueKeys
) -> None:
    producer = Producer(client, keys)
    fill(admin)
    with pytest.raises(RedisOutOfMemory) as refused:
        producer.enqueue_many(["a", "b", "c"])
    assert str(refused.value) == (
        f"Redis is out of memory ({OOM_TEXT}): 3 task(s) not enqueued; retry once memory frees"
    )
    assert refused.value.enqueued == [] and admin.llen(keys.queue) == 0
    with pytest.raises(RedisOutOfMemory, match=r"1 task\(s\) not enqueued"):
        producer.enqueue("a")
    free(admin)
    producer.enqueue("a")  # the caller's retry
    assert admin.llen(keys.queue) == 1


def test_enqueue_many_names_the_batches_enqueued_before_memory_ran_out(
    admin: redis.Redis, client: redis.Redis, keys: QueueKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    producer = Producer(client, keys)
    real_lpush = client.lpush
    pushes: list[int] = []

    def lpush(*args: Any) -> Any:
        pushes.append(len(args) - 1)
        reply = real_lpush(*args)
        if len(pushes) == 2:
            fill(admin)  # full after the second batch
        return reply

    monkeypatch.setattr(client, "lpush", lpush)
    with pytest.raises(RedisOutOfMemory) as refused:
        producer.enqueue_many(range(7), batch_size=2)
    assert pushes == [2, 2, 2]
    assert "2 task(s) not enqueued; 4 earlier task(s) were enqueued" in str(refused.value)
    assert refused.value.enqueued == ids_in(admin, keys.queue)[::-1]


def test_cli_enqueue_under_oom_exits_1_with_one_line(
    admin: redis.Redis, small_server: RedisServerProcess
) -> None:
    fill(admin)
    result = CliRunner().invoke(
        main, ["enqueue", "-q", "tq", "--redis-url", small_server.url, '{"n": 1}']
    )
    assert result.exit_code == 1, result.output
    # The streaming enqueue says how many tasks were enqueued before the refusal: none here.
    assert result.output.strip().splitlines() == [
        f"Error: Redis is out of memory ({OOM_TEXT}): 1 task(s) not enqueued; retry once "
        "memory frees; no task was enqueued"
    ]
    assert admin.llen(QueueKeys("tq").queue) == 0


# -- a worker ------------------------------------------------------------------------------------


def test_a_worker_waits_out_oom_on_take_and_handles_the_task_once_memory_frees(
    admin: redis.Redis, client: redis.Redis, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue("t")
    ran: list[object] = []
    worker = started_worker(client, keys, clock, ran.append)
    fill(admin)

    def untouched(n: int) -> None:  # while refused: the task stays queued, nothing taken
        assert ids_in(admin, keys.queue) == [task_id] and admin.llen(worker.list_key) == 0

    stop = Stop(free_at(admin, 3, also=untouched))
    with caplog.at_level(logging.INFO, logger=WORKER_LOG):
        worker.run(stop, until_idle=True)  # type: ignore[arg-type]
    assert stop.waits == [0.05, 0.1, 0.2]  # from min(1 s, block_timeout), doubling
    assert ran == ["t"] and commits(admin, keys) == {task_id: 1}
    assert admin.llen(keys.queue) == 0 and admin.llen(worker.list_key) == 0
    (warning,) = messages(caplog, WORKER_LOG, logging.WARNING)  # once: the clock stood still
    assert warning == (
        f"worker {worker.list_key}: Redis is out of memory ({OOM_TEXT}); nothing was written, "
        "waiting for memory to free (1 refusal(s) in this spell; logged at most every 30 s)"
    )
    assert messages(caplog, WORKER_LOG, logging.INFO) == [
        f"worker {worker.list_key}: Redis accepts writes again after 3 refusal(s)"
    ]
    worker.close()


def test_a_worker_logs_an_oom_spell_at_most_once_per_interval_of_its_clock(
    admin: redis.Redis, client: redis.Redis, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue("t")
    worker = started_worker(client, keys, clock)
    fill(admin)
    stop = Stop(free_at(admin, 10, also=lambda n: clock.advance(10)))
    with caplog.at_level(logging.INFO, logger=WORKER_LOG):
        worker.run(stop, until_idle=True)  # type: ignore[arg-type]
    # Refusals at 1000, 1010, ..., 1090: logged at 1000, 1030, 1060, 1090.
    warnings = messages(caplog, WORKER_LOG, logging.WARNING)
    assert [w.split("(")[-2].split(" ")[0] for w in warnings] == ["1", "4", "7", "10"]
    assert stop.waits == pytest.approx(
        [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, MAX_PAUSE, MAX_PAUSE, MAX_PAUSE]
    )
    assert commits(admin, keys) == {task_id: 1}
    worker.close()


def test_a_release_refused_by_oom_keeps_the_task_in_custody_and_it_is_committed_once(
    admin: redis.Redis, client: redis.Redis, keys: QueueKeys
) -> None:
    """Redis 7 runs RELEASE under OOM (it writes first with LREM); a server that refused it would
    leave the task in our list, uncommitted. Injected here: the worker must not crash, not commit,
    and once memory frees put the task back (reconcile) and commit it exactly once."""
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue("t")
    runs: list[object] = []

    def handler(payload: object) -> None:
        runs.append(payload)
        if len(runs) == 1:
            fill(admin)

    worker = started_worker(client, keys, clock, handler)
    real_call = worker._call
    refusals = [1]

    def call(*args: Any, **kwargs: Any) -> Any:
        # the release, alone or with the next take (the loop's busy cycle): both start with LREM
        if args[:2] in (("EVALSHA", RELEASE_SHA), ("EVALSHA", RELEASE_AND_TAKE_SHA)) and refusals:
            refusals.pop()
            real_call("PING")  # the deferred record's reply comes first, as it would
            raise redis.exceptions.OutOfMemoryError(OOM_TEXT)
        return real_call(*args, **kwargs)

    worker._call = call  # type: ignore[method-assign]

    def in_custody(n: int) -> None:
        # Refused release (1st pause), then refused reconcile (2nd): the task sits in our list,
        # once, uncommitted.
        assert ids_in(admin, worker.list_key) == [task_id] and admin.llen(keys.queue) == 0
        assert commits(admin, keys) == {} and all_custody(admin, keys) == {task_id: 1}

    stop = Stop(free_at(admin, 2, also=in_custody))
    worker.run(stop, until_idle=True)  # type: ignore[arg-type]
    assert stop.waits == [0.05, 0.1]
    assert runs == ["t", "t"]  # run again after the reconcile requeued it
    assert commits(admin, keys) == {task_id: 1}
    assert admin.llen(keys.queue) == 0 and admin.llen(worker.list_key) == 0
    worker.close()


def test_a_dirty_worker_waits_out_oom_on_its_reconcile_before_taking_anything(
    admin: redis.Redis, client: redis.Redis, keys: QueueKeys
) -> None:
    clock = ManualClock()
    debris, fresh = Producer(client, keys, clock).enqueue_many(["debris", "fresh"])
    worker = started_worker(client, keys, clock)
    # A take whose reply was lost: the task sits in our list, and we are dirty.
    admin.lmove(keys.queue, worker.list_key, "RIGHT", "LEFT")
    worker.dirty = True
    fill(admin)

    def nothing_taken(n: int) -> None:
        assert ids_in(admin, worker.list_key) == [debris] and ids_in(admin, keys.queue) == [fresh]
        assert worker.dirty

    stop = Stop(free_at(admin, 2, also=nothing_taken))
    worker.run(stop, until_idle=True)  # type: ignore[arg-type]
    assert stop.waits == [0.05, 0.1]
    assert commits(admin, keys) == {debris: 1, fresh: 1}
    assert admin.llen(worker.list_key) == 0 and admin.llen(keys.queue) == 0
    worker.close()


def test_a_worker_takes_nothing_while_memory_is_full_and_takes_once_it_frees(
    admin: redis.Redis, client: redis.Redis, keys: QueueKeys
) -> None:
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue("t")
    server = make_server(client, keys, "s1", clock)
    server.claim()  # registers the worker's list
    worker = server.make_worker(0)
    fill(admin)
    clock.advance(5)

    def refused(n: int) -> None:  # the take (its registration and its BLMOVE) wrote nothing
        assert ids_in(admin, keys.queue) == [task_id] and admin.llen(worker.list_key) == 0
        assert admin.zscore(keys.inflight_registry, worker.list_key) == clock.now() - 5

    stop = Stop(free_at(admin, 2, also=refused))
    worker.run(stop, until_idle=True)  # type: ignore[arg-type]
    assert stop.waits == [0.05, 0.1]
    # the take that went through registered the list again, in the same write
    assert admin.zscore(keys.inflight_registry, worker.list_key) == clock.now()
    assert commits(admin, keys) == {task_id: 1}
    worker.close()


def test_a_worker_stopped_while_memory_is_full_takes_nothing(
    admin: redis.Redis, client: redis.Redis, keys: QueueKeys
) -> None:
    Producer(client, keys).enqueue("t")
    server = make_server(client, keys, "s1", ManualClock())
    server.claim()
    worker = server.make_worker(0)
    fill(admin)
    stop = Stop()
    stop.hook = lambda n: stop.set()
    worker.run(stop)  # type: ignore[arg-type]
    assert stop.waits == [0.05]
    assert admin.llen(worker.list_key) == 0 and admin.llen(keys.queue) == 1
    worker.close()


def test_a_prefetching_worker_waits_out_oom_and_commits_every_task_once(
    admin: redis.Redis, client: redis.Redis, keys: QueueKeys
) -> None:
    clock = ManualClock()
    ids = Producer(client, keys, clock).enqueue_many(range(5))
    settings = dataclasses.replace(TEST_SETTINGS, prefetch=3)
    (runner,) = make_server(client, keys, "s1", clock, settings=settings).start()
    assert isinstance(runner, PrefetchingWorker)
    fill(admin)
    stop = Stop(free_at(admin, 2))
    runner.run(stop, until_idle=True)  # type: ignore[arg-type]
    assert stop.waits == [0.05, 0.1]
    assert commits(admin, keys) == dict.fromkeys(ids, 1)
    assert all_custody(admin, keys) == {}
    runner.close()


# -- a server ------------------------------------------------------------------------------------


def test_a_server_start_waits_for_memory_to_claim_its_id(
    admin: redis.Redis, client: redis.Redis, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    server = make_server(client, keys, "s1", ManualClock())
    fill(admin)
    stop = Stop(free_at(admin, 2))
    server.stop_event = stop  # type: ignore[assignment]
    with caplog.at_level(logging.INFO, logger=SERVER_LOG):
        (worker,) = server.start()
    assert stop.waits == [1.0, 2.0]
    assert server.incarnation is not None and admin.zscore(keys.servers, "s1") is not None
    assert len(messages(caplog, SERVER_LOG, logging.WARNING)) == 1
    worker.close()


def test_a_server_stopped_while_waiting_to_claim_says_so(
    admin: redis.Redis, client: redis.Redis, keys: QueueKeys
) -> None:
    server = make_server(client, keys, "s1", ManualClock())
    fill(admin)
    stop = Stop()
    stop.hook = lambda n: stop.set()
    server.stop_event = stop  # type: ignore[assignment]
    with pytest.raises(
        RedisOutOfMemory,
        match=r"^stopped while claiming the server id: Redis "
        r"is out of memory",
    ):
        server.start()
    assert server.incarnation is None


def test_a_startup_drain_refused_by_oom_leaves_the_debris_to_the_sweep(
    admin: redis.Redis, client: redis.Redis, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue("t")
    (old,) = make_server(client, keys, "s1", clock).start()
    assert isinstance(old, Worker)
    assert old.take(timeout=0.05) is not None  # then this incarnation dies with it
    old.close()
    clock.advance(20)  # its lease lapses

    server = make_server(client, keys, "s1", clock)
    real_claim = server.claim_when_free

    def claim_then_fill(patience: float) -> int:
        incarnation = real_claim(patience)
        fill(admin)
        return incarnation

    server.claim_when_free = claim_then_fill  # type: ignore[method-assign]
    stop = Stop()
    server.stop_event = stop  # type: ignore[assignment]
    with caplog.at_level(logging.INFO, logger=SERVER_LOG):
        (worker,) = server.start()  # the drain is refused; the server starts all the same
    assert stop.waits == []
    free(admin)
    warning = messages(caplog, SERVER_LOG, logging.WARNING)[0]
    assert warning.startswith("startup drain refused: Redis is out of memory (")
    assert OOM_TEXT in warning  # (Redis 7 names the refusal; 6.2 quotes it in a script error)
    assert warning.endswith(
        "the periodic sweep requeues this id's earlier in-flight lists once memory frees"
    )
    assert ids_in(admin, old.list_key) == [task_id]  # not lost: still in the old list

    report = server.sweep()  # what the background loop does first
    assert report.drained_lists == {old.list_key: 1}
    assert worker.run_once(timeout=0.05) is True
    assert commits(admin, keys) == {task_id: 1} and all_custody(admin, keys) == {}
    worker.close()


def test_the_heartbeat_loop_rides_out_oom_logs_once_per_interval_and_beats_again(
    admin: redis.Redis, client: redis.Redis, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    server = make_server(client, keys, "s1", clock)  # heartbeat 5, sweep 10, ttl 15
    server.claim()
    fill(admin)

    def hook(n: int) -> None:
        clock.advance(5)
        if n == 7:
            free(admin)
        if n == 9:
            stop.set()

    stop = Stop(hook)
    server.stop_event = stop  # type: ignore[assignment]
    with caplog.at_level(logging.INFO, logger=SERVER_LOG):
        server._background()
    # Refused at 1000, 1005, ..., 1030 (logged at 1000 and 1030); beats again at 1035 and 1040.
    assert stop.waits == [5] * 9
    warnings = messages(caplog, SERVER_LOG, logging.WARNING)
    assert [w.split("(")[-2].split(" ")[0] for w in warnings] == ["1", "7"]
    assert messages(caplog, SERVER_LOG, logging.INFO) == [
        "server s1: Redis accepts writes again after 7 refusal(s)"
    ]
    assert admin.zscore(keys.servers, "s1") == 1040 + 15


@pytest.mark.parametrize("prefetch", [1, 3])
def test_a_running_server_rides_out_oom_and_finishes_the_work_once_memory_frees(
    admin: redis.Redis,
    client: redis.Redis,
    keys: QueueKeys,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    prefetch: int,
) -> None:
    clock = ManualClock()
    ids = Producer(client, keys, clock).enqueue_many(range(6))
    settings = dataclasses.replace(TEST_SETTINGS, prefetch=prefetch)
    server = make_server(client, keys, "s1", clock, workers=2, settings=settings)
    real_start = server.start

    def start_then_fill(wait_for_id: float = 0.0) -> Any:
        workers = real_start(wait_for_id)
        fill(admin)  # memory runs out as the threads start
        return workers

    server.start = start_then_fill  # type: ignore[method-assign]
    crashes: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: crashes.append(args.exc_value))
    freed = threading.Event()
    lock = threading.Lock()
    worker_waits: list[float | None] = []
    real_wait = server.stop_event.wait

    def wait(timeout: float | None = None) -> bool:
        if threading.current_thread().name == "taskcustody-heartbeat":
            # Generous timeouts that no assertion depends on: the heartbeat thread waits for
            # memory to be freed, then for the stop.
            (real_wait if freed.is_set() else freed.wait)(60)
            return server.stop_event.is_set()
        with lock:
            worker_waits.append(timeout)
            if len(worker_waits) == 4:
                free(admin)
                freed.set()
        return server.stop_event.is_set()

    server.stop_event.wait = wait  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO):
        server.run(until_idle=True)
    assert crashes == [] and freed.is_set()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no crash, no restart
    assert commits(admin, keys) == dict.fromkeys(ids, 1)
    assert all_custody(admin, keys) == {}


# -- the pieces ----------------------------------------------------------------------------------


def test_is_oom_knows_the_error_by_class_and_by_its_code() -> None:
    assert is_oom(redis.exceptions.OutOfMemoryError(OOM_TEXT))
    assert is_oom(redis.ResponseError(f"OOM {OOM_TEXT}"))  # an older redis-py's plain error
    assert is_oom(
        redis.ResponseError(  # Redis 6.2, refusing a write inside a script
            "Error running script (call to f_7edf): @user_script:2: @user_script: 2: -OOM command "
            "not allowed when used memory > 'maxmemory'."
        )
    )
    assert not is_oom(redis.ResponseError("WRONGTYPE Operation against a key"))
    assert not is_oom(redis.ResponseError("ERR OOM in the middle"))
    assert not is_oom(redis.ConnectionError("OOM"))


def test_an_oom_spell_flapping_around_the_limit_still_logs_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    spell = OomSpell(logging.getLogger("test.oom"), "w", clock, interval=30)
    with caplog.at_level(logging.INFO, logger="test.oom"):
        for _ in range(5):  # refused, recovered, refused... every 10 s
            assert spell.refused(RuntimeError("x")) == 1.0  # the back-off restarts each spell
            spell.recovered()
            clock.advance(10)
    levels = [r.levelno for r in caplog.records]
    # Warned at 1000 and 1030; the end of a spell is told only after a warned one.
    assert levels == [logging.WARNING, logging.INFO, logging.WARNING, logging.INFO]


def test_an_oom_spell_whose_clock_fails_does_not_log_and_does_not_raise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        def now(self) -> float:
            raise redis.ConnectionError("gone")

    spell = OomSpell(logging.getLogger("test.oom"), "w", Broken(), interval=30)
    with caplog.at_level(logging.INFO, logger="test.oom"):
        assert spell.refused(RuntimeError("x")) == 1.0
    assert caplog.records == []


def test_settings_refuse_a_non_positive_oom_log_interval() -> None:
    with pytest.raises(ValueError, match="oom_log_interval"):
        Settings(oom_log_interval=0)
    assert Settings().oom_log_interval == 30.0 and Settings().allow_evicting_policy is False
