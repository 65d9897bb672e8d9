"""`Settings.min_replicas` on a real primary with a real replica: an enqueue is acknowledged only
once the replica holds it, a short WAIT is an error for the producer and a logged shortfall for a
worker (which still commits every task once), and each take and release adds exactly one WAIT
and no round trip.

"Stopped" replica: SIGSTOPped. The primary still counts it connected but it acknowledges nothing,
so every WAIT returns 0 after its timeout (the state a lagging replica is in).
"""

from __future__ import annotations

import functools
import json
import logging
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from taskcustody import (
    ManualClock,
    Outcome,
    Producer,
    QueueKeys,
    ReplicationTimeout,
    Settings,
    Worker,
    connect,
)
from taskcustody.cli.app import main
from taskcustody.core.prefetch import PrefetchingWorker
from taskcustody.deploy.replication import WARN_INTERVAL, Shortfalls
from tests.conftest import TEST_SETTINGS
from tests.helpers import commits, ids_in, make_server
from tests.support.enqueue_command import Lines, payload_lines, running, start_enqueue
from tests.support.redis_server import (
    RedisServerProcess,
    redis_server_binary,
    throwaway_primary_and_replica,
    wait_for_replication_link,
)


# A replica that runs answers a WAIT within milliseconds; the generous timeout (and the socket
# timeout above it) keeps a loaded machine from turning that into a shortfall.
# (Built when a test asks, not at import: a settings check that a mutant breaks must fail the
# tests that need these, not the collection of the whole suite.)
@functools.cache
def replicated() -> Settings:
    return Settings(
        **{
            **TEST_SETTINGS.__dict__,
            "socket_timeout_margin": 10.0,
            "min_replicas": 1,
            "replica_timeout": 5.0,
        }
    )


# Against a stopped replica: every WAIT returns short after 50 ms.
@functools.cache
def impatient() -> Settings:
    return Settings(**{**TEST_SETTINGS.__dict__, "min_replicas": 1, "replica_timeout": 0.05})


@functools.cache
def unreplicated() -> Settings:
    return Settings(**{**replicated().__dict__, "min_replicas": 0})


class Pair:
    def __init__(self, primary: RedisServerProcess, replica: RedisServerProcess) -> None:
        self.primary = primary
        self.replica = replica
        self.stopped = False

    def client(self, settings: Settings | None = None) -> redis.Redis:
        settings = settings or replicated()
        return connect(self.primary.url, settings)

    def replica_client(self) -> redis.Redis:
        return connect(self.replica.url, replicated())

    def stop_replica(self) -> None:
        """SIGSTOP the replica, and return once the kernel reports it stopped (state T), so that
        it cannot acknowledge anything the test writes afterwards."""
        self.replica.signal(signal.SIGSTOP)
        self.stopped = True
        stat = Path(f"/proc/{self.replica.pid}/stat")
        for _ in range(10_000):
            if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "T":
                return
            time.sleep(0.001)
        raise RuntimeError("the replica did not stop")

    def waits(self) -> int:
        """WAIT commands the primary ran since the last CONFIG RESETSTAT."""
        stats = self.client().info("commandstats")
        return int(stats.get("cmdstat_wait", {}).get("calls", 0))


@pytest.fixture(scope="module")
def replicated_servers() -> Iterator[tuple[RedisServerProcess, RedisServerProcess]]:
    if redis_server_binary() is None:
        pytest.skip("no redis-server binary")
    with throwaway_primary_and_replica() as servers:
        yield servers


@pytest.fixture
def pair(replicated_servers: tuple[RedisServerProcess, RedisServerProcess]) -> Iterator[Pair]:
    primary, replica = replicated_servers
    p = Pair(primary, replica)
    client = p.client()
    client.flushall()
    # Setup, not an assertion about speed: start every test from a replica that has caught up.
    assert client.wait(1, 30_000) == 1, "the replica did not catch up"
    client.config_resetstat()
    yield p
    if p.stopped:
        replica.signal(signal.SIGCONT)
        wait_for_replication_link(primary, replica)


def count_writes(conn: Any) -> list[int]:
    """Wrap a connection's socket writes with a counter: each round trip starts with one. The
    connection is opened first, so its handshake is not counted."""
    conn.connect()
    counter = [0]
    send = conn.send_packed_command

    def counting(*args: Any, **kwargs: Any) -> None:
        counter[0] += 1
        send(*args, **kwargs)

    conn.send_packed_command = counting
    return counter


def one_worker(
    client: redis.Redis,
    keys: QueueKeys,
    settings: Settings,
    handler: Callable[[Any], Any] = lambda p: None,
) -> Worker:
    (worker,) = make_server(client, keys, "s1", ManualClock(), handler, settings=settings).start()
    assert isinstance(worker, Worker)
    return worker


pytestmark = pytest.mark.real_redis


# -- the producer --------------------------------------------------------------------------------


def test_an_acknowledged_enqueue_is_on_the_replica(pair: Pair, keys: QueueKeys) -> None:
    task_id = Producer(pair.client(), keys, settings=replicated()).enqueue({"job": 1})
    # No waiting here: WAIT returned 1, so the replica had applied the LPUSH already.
    assert ids_in(pair.replica_client(), keys.queue) == [task_id]
    assert pair.waits() == 1


def test_an_enqueue_the_replica_does_not_acknowledge_raises_and_says_the_task_is_queued(
    pair: Pair, keys: QueueKeys
) -> None:
    client = pair.client(impatient())
    pair.stop_replica()
    with pytest.raises(ReplicationTimeout) as caught:
        Producer(client, keys, settings=impatient()).enqueue({"job": 1}, task_id="t1")
    short = caught.value
    assert (short.acknowledged, short.wanted, short.unconfirmed) == (0, 1, ["t1"])
    assert "0 of 1 replica(s)" in str(short) and "ARE in the primary's queue" in str(short)
    # Never undone: the task is in the primary's queue and will run.
    assert ids_in(client, keys.queue) == ["t1"]


def test_enqueue_many_stops_at_the_first_unacknowledged_batch_naming_every_task(
    pair: Pair, keys: QueueKeys
) -> None:
    client = pair.client(impatient())
    pair.stop_replica()
    with pytest.raises(ReplicationTimeout) as caught:
        Producer(client, keys, settings=impatient()).enqueue_many(range(5), batch_size=2)
    short = caught.value
    assert (len(short.confirmed), len(short.unconfirmed), len(short.unsent)) == (0, 2, 3)
    assert sorted(ids_in(client, keys.queue)) == sorted(short.unconfirmed)
    assert pair.waits() == 1


def test_an_enqueue_is_one_round_trip_with_or_without_min_replicas(
    pair: Pair, keys: QueueKeys
) -> None:
    writes = {}
    for settings in (unreplicated(), replicated()):
        client = pair.client(settings)
        producer = Producer(client, keys, settings=settings)
        producer.enqueue(0)  # opens the pooled connection
        conn = client.connection_pool.get_connection("LPUSH")  # (redis-py 5 needs a name)
        counter = count_writes(conn)
        client.connection_pool.release(conn)
        producer.enqueue(1)
        writes[settings.min_replicas] = counter[0]
    assert writes == {0: 1, 1: 1}
    assert pair.waits() == 2  # the two enqueues with min_replicas=1, none without


def test_cli_enqueue_exits_1_printing_the_ids_the_primary_holds(
    pair: Pair, keys: QueueKeys
) -> None:
    pair.stop_replica()
    result = CliRunner().invoke(
        main,
        [
            "enqueue",
            "--queue",
            "cliq",
            "--redis-url",
            pair.primary.url,
            "--min-replicas",
            "1",
            "--replica-timeout",
            "0.05",
            "1",
            "2",
        ],
    )
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    printed = result.stdout.split()
    assert sorted(printed) == sorted(ids_in(pair.client(), QueueKeys("cliq").queue))
    assert len(printed) == 2
    assert "0 of 1 replica(s)" in result.stderr


def test_cli_enqueue_from_stdin_exits_1_having_printed_every_id_the_primary_holds(
    pair: Pair,
) -> None:
    # 3 s: ample for a running replica's acknowledgement, and within the socket timeout.
    with running(
        start_enqueue("streamq", pair.primary.url, "--min-replicas", "1", "--replica-timeout", "3")
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        printed = Lines(proc.stdout)
        printed.start()
        proc.stdin.write(payload_lines(0, 3))
        proc.stdin.flush()
        printed.wait_for(3, "the ids of the tasks the replica acknowledged, stdin still open")
        pair.stop_replica()
        proc.stdin.write(payload_lines(3, 5))
        proc.stdin.close()
        assert proc.wait(timeout=60) == 1
        printed.join(timeout=60)
        stderr = proc.stderr.read().decode()

    in_queue = list(reversed(ids_in(pair.client(), QueueKeys("streamq").queue)))
    assert printed.lines == in_queue
    assert len(in_queue) == 5
    assert "Traceback" not in stderr
    assert "0 of 1 replica(s)" in stderr
    assert f"5 task(s) enqueued, the last {in_queue[-1]} (stdin line 5)" in stderr


@pytest.mark.parametrize(
    "command", [["enqueue", "--queue", "q", "1"], ["worker", "json:dumps", "--queue", "q"]]
)
def test_a_replica_timeout_longer_than_the_socket_timeout_is_a_usage_error(
    command: list[str],
) -> None:
    result = CliRunner().invoke(main, [*command, "--min-replicas", "1", "--replica-timeout", "9"])
    assert result.exit_code == 2
    # named as the flag the user typed (cli._settings)
    assert "Error: --replica-timeout must be shorter than the socket timeout" in result.output
    assert "Traceback" not in result.output


# -- the worker ----------------------------------------------------------------------------------


def _cycle(worker: Worker) -> None:
    task = worker.take(timeout=1)
    assert task is not None
    worker.record(task)
    worker.release(task, worker.execute(task))


def test_a_take_and_a_release_each_add_one_wait_and_no_round_trip(
    pair: Pair, keys: QueueKeys
) -> None:
    writes = {}
    for settings in (unreplicated(), replicated()):
        client = pair.client(settings)
        client.flushall()
        Producer(client, keys).enqueue_many([1, 2])
        worker = one_worker(client, keys, settings)
        counter = count_writes(worker._conn)
        before = pair.waits()
        task = worker.take(timeout=1)
        assert task is not None
        assert pair.waits() - before == settings.min_replicas  # the take's
        worker.record(task)
        release = worker.release(task, worker.execute(task))
        assert release.action == "committed"
        assert pair.waits() - before == 2 * settings.min_replicas  # and the release's
        # take, record (sent without waiting), release: three writes either way.
        writes[settings.min_replicas] = counter[0]
        assert worker.replicas.count == 0
        # The reply stream is still in step: the next cycle works.
        _cycle(worker)
        assert commits(client, keys) == dict.fromkeys(commits(client, keys), 1)
        assert task.id in commits(client, keys) and len(commits(client, keys)) == 2
        worker.close()
    assert writes == {0: 3, 1: 3}


def test_a_release_answered_noscript_reads_its_wait_and_stays_in_step(
    pair: Pair, keys: QueueKeys
) -> None:
    client = pair.client()
    Producer(client, keys).enqueue_many([1, 2])
    worker = one_worker(client, keys, replicated())
    task = worker.take(timeout=1)
    assert task is not None
    worker.record(task)
    worker.flush()
    client.script_flush()  # the release's EVALSHA is answered NOSCRIPT, with its WAIT after it
    before = pair.waits()
    assert worker.release(task, Outcome(True)).action == "committed"
    assert pair.waits() - before == 2  # the EVALSHA's WAIT, then the EVAL's
    _cycle(worker)  # had the first WAIT's reply been left unread, this would read it as a task
    assert commits(client, keys) == dict.fromkeys(commits(client, keys), 1)
    assert len(commits(client, keys)) == 2
    assert worker.replicas.count == 0


def test_a_worker_whose_replica_is_stopped_commits_every_task_once_and_warns_once(
    pair: Pair, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    client = pair.client(impatient())
    ids = Producer(client, keys).enqueue_many([1, 2, 3])
    ran: list[Any] = []
    worker = one_worker(client, keys, impatient(), ran.append)
    pair.stop_replica()
    with caplog.at_level(logging.WARNING, logger="taskcustody.replication"):
        while worker.run_once(timeout=0.05):
            pass
    assert sorted(ran) == [1, 2, 3]
    assert commits(client, keys) == dict.fromkeys(ids, 1)
    assert client.llen(keys.queue) == 0 and client.llen(worker.list_key) == 0
    # Three takes, three releases and the last, empty take: every WAIT returned short.
    assert worker.replicas.count == 7
    warnings = [r for r in caplog.records if r.name == "taskcustody.replication"]
    assert len(warnings) == 1  # the clock did not move: one warning per interval
    assert "after a take, got 0 of 1 replica(s) within 0.05 s" in warnings[0].getMessage()


def test_a_short_wait_after_a_release_is_named_as_such_and_the_commit_stands(
    pair: Pair, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    client = pair.client(impatient())
    task_id = Producer(client, keys).enqueue(1)
    worker = one_worker(client, keys, impatient())
    clock = worker.clock
    assert isinstance(clock, ManualClock)
    worker.reconcile()  # a new worker starts dirty
    pair.stop_replica()
    with caplog.at_level(logging.WARNING, logger="taskcustody.replication"):
        task = worker.take(timeout=1)
        assert task is not None and worker.replicas.count == 1
        clock.advance(WARN_INTERVAL)
        worker.record(task)
        release = worker.release(task, worker.execute(task))
    assert release.action == "committed"
    assert not worker.dirty  # a short WAIT is no reason to drain our list
    assert commits(client, keys) == {task_id: 1}
    assert worker.replicas.count == 2
    messages = [r.getMessage() for r in caplog.records if r.name == "taskcustody.replication"]
    assert len(messages) == 2
    assert "after a take" in messages[0] and "The take stands on the primary" in messages[0]
    assert "after a release" in messages[1] and "The release stands" in messages[1]


def test_a_prefetching_worker_ends_each_pipeline_with_one_wait_and_no_round_trip(
    pair: Pair, keys: QueueKeys
) -> None:
    writes = {}
    for base in (unreplicated(), replicated()):
        settings = Settings(**{**base.__dict__, "prefetch": 4})
        client = pair.client(settings)
        client.flushall()
        ids = Producer(client, keys).enqueue_many(range(4))
        (runner,) = make_server(client, keys, "s1", ManualClock(), settings=settings).start()
        assert isinstance(runner, PrefetchingWorker)
        counter = count_writes(runner._conn)
        before = pair.waits()
        batch, error = runner.take_all()
        assert error is None and len(batch.raws) == 4
        assert pair.waits() - before == settings.min_replicas
        runner.handle(batch)
        assert pair.waits() - before == 2 * settings.min_replicas
        assert commits(client, keys) == dict.fromkeys(ids, 1)
        assert runner.replicas.count == 0
        writes[settings.min_replicas] = counter[0]
        runner.close()
    assert writes == {0: 2, 1: 2}


def test_a_prefetching_worker_whose_replica_is_stopped_commits_every_task_once(
    pair: Pair, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(**{**impatient().__dict__, "prefetch": 4})
    client = pair.client(settings)
    ids = Producer(client, keys).enqueue_many(range(6))
    clock = ManualClock()
    (runner,) = make_server(client, keys, "s1", clock, settings=settings).start()
    assert isinstance(runner, PrefetchingWorker)
    pair.stop_replica()
    with caplog.at_level(logging.WARNING, logger="taskcustody.replication"):
        batch, error = runner.take_all()
        assert error is None and len(batch.raws) == 4
        clock.advance(WARN_INTERVAL)
        runner.handle(batch)
    messages = [r.getMessage() for r in caplog.records if r.name == "taskcustody.replication"]
    assert len(messages) == 2
    assert "after a take" in messages[0] and "after a release" in messages[1]
    while runner.run_once(timeout=0.05):
        pass
    assert commits(client, keys) == dict.fromkeys(ids, 1)
    assert client.llen(keys.queue) == 0
    assert runner.replicas.count >= 4  # two batches (4 + 2): a take and a release pipeline each


# -- the shortfall log (no Redis) ----------------------------------------------------------------


def test_short_waits_are_counted_and_logged_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    shortfalls = Shortfalls(replicated(), clock, "w0")
    with caplog.at_level(logging.WARNING, logger="taskcustody.replication"):
        shortfalls.check(1, "take")  # enough replicas: nothing
        shortfalls.check(0, "take")
        shortfalls.check(
            redis.ResponseError("ERR WAIT cannot be used with replica instances"), "release"
        )
        clock.advance(WARN_INTERVAL - 0.001)
        shortfalls.check(0, "release")
        clock.advance(0.001)
        shortfalls.check(0, "take")
    assert shortfalls.count == 4
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert messages[0].startswith("worker w0: 1 WAIT(s)")
    assert messages[1].startswith("worker w0: 3 WAIT(s)")  # the two it held back, and this one


def test_when_a_replicated_cycle_returns_its_commit_is_on_the_replica(
    pair: Pair, keys: QueueKeys
) -> None:
    client = pair.client()
    task_id = Producer(client, keys).enqueue(1)
    worker = one_worker(client, keys, replicated(), lambda p: {"double": p * 2})
    assert worker.run_once(timeout=1)
    # No waiting here: the release's WAIT returned 1, so the replica has the commit.
    replica = pair.replica_client()
    stored = replica.get(keys.result(task_id))
    assert stored is not None and json.loads(stored) == {"double": 2}
    assert commits(replica, keys) == {task_id: 1}
