"""What Redis Cluster (7.0.15) answers a worker while its slot moves, and how the worker rides
through: a failover (CLUSTER FAILOVER) and a live slot migration, on a throwaway local cluster of
3 masters and 3 replicas (tests/support/redis_cluster.py)."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from taskcustody import (
    ManualClock,
    Producer,
    QueueKeys,
    ReplicationTimeout,
    Settings,
    Worker,
    connect,
)
from taskcustody.cli.app import main
from taskcustody.core import scripts
from taskcustody.core.loop import run_until_stopped
from taskcustody.deploy import cluster
from tests.helpers import commits, make_server
from tests.support.redis_cluster import LocalCluster, tags_on_distinct_masters

pytestmark = [pytest.mark.cluster, pytest.mark.real_redis]

SETTINGS = Settings(
    block_timeout=0.2, socket_timeout_margin=3.0, track_commits=True, drain_chunk=10
)


def blocked_blmove(port: int, key: str, out: list[Any]) -> None:
    client = redis.Redis(port=port, socket_timeout=30)
    try:
        out.append(client.execute_command("BLMOVE", key, key + "-x", "RIGHT", "LEFT", 20))
    except redis.RedisError as exc:
        out.append(exc)
    finally:
        client.close()


def blocked_until(port: int, count: int) -> None:
    """Until `count` clients are blocked on `port` (a set-up wait)."""
    client = redis.Redis(port=port)
    try:
        for _ in range(500):
            if int(client.info("clients")["blocked_clients"]) >= count:
                return
            time.sleep(0.01)
    finally:
        client.close()
    raise RuntimeError("the BLMOVE never blocked")


def names(local_cluster: LocalCluster, prefix: str) -> list[str]:
    return tags_on_distinct_masters(local_cluster, prefix)


# -- what Redis answers (pinned: the worker's handling relies on each) -------------------------


def test_a_blmove_blocked_on_a_master_that_fails_over_is_answered_unblocked(
    local_cluster: LocalCluster,
) -> None:
    key = QueueKeys(names(local_cluster, "pinfo")[0]).queue
    master = local_cluster.owner_port(key)
    out: list[Any] = []
    t = threading.Thread(target=blocked_blmove, args=(master, key, out))
    t.start()
    blocked_until(master, 1)
    local_cluster.failover(master)
    t.join(timeout=30)
    assert len(out) == 1 and isinstance(out[0], redis.ResponseError)
    assert str(out[0]).startswith("UNBLOCKED")
    assert cluster.redirect_kind(out[0]) == cluster.MOVED
    # ... and the old master, a replica now, answers MOVED to the new one.
    with pytest.raises(redis.exceptions.MovedError):
        local_cluster.client(master).llen(key)


def test_a_blmove_blocked_while_its_slot_migrates_is_answered_moved_at_the_end(
    local_cluster: LocalCluster,
) -> None:
    key = QueueKeys(names(local_cluster, "pinmig")[0]).queue
    source = local_cluster.owner_port(key)
    target = next(p for p in local_cluster.master_ports() if p != source)
    out: list[Any] = []
    t = threading.Thread(target=blocked_blmove, args=(source, key, out))
    t.start()
    blocked_until(source, 1)
    local_cluster.migrate_slot(local_cluster.keyslot(key), target)
    t.join(timeout=30)
    assert len(out) == 1 and isinstance(out[0], redis.exceptions.MovedError)


def test_a_half_migrated_slot_answers_ask_and_tryagain(local_cluster: LocalCluster) -> None:
    tag = names(local_cluster, "pinhalf")[0]
    queue, other = f"{{{tag}}}:queue", f"{{{tag}}}:list"
    source = local_cluster.owner_port(queue)
    target = next(p for p in local_cluster.master_ports() if p != source)
    slot = local_cluster.keyslot(queue)
    src, dst = local_cluster.client(source), local_cluster.client(target)
    src.lpush(queue, "a")
    dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", local_cluster.node_id(source))
    src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", local_cluster.node_id(target))
    try:
        # queue still here, list absent: a multi-key command is refused, not run
        with pytest.raises(redis.exceptions.TryAgainError):
            src.lmove(queue, other, "RIGHT", "LEFT")
        assert src.llen(queue) == 1
        src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", queue)
        with pytest.raises(redis.exceptions.AskError):
            src.llen(queue)
    finally:
        for node in (dst, src):
            node.execute_command("CLUSTER SETSLOT", slot, "NODE", local_cluster.node_id(target))
        for port in local_cluster.master_ports():
            local_cluster.client(port).execute_command(
                "CLUSTER SETSLOT", slot, "NODE", local_cluster.node_id(target)
            )
        local_cluster.wait_ok()


# -- connecting ---------------------------------------------------------------------------------


def test_connect_detects_a_cluster_from_any_node_a_replica_too(local_cluster: LocalCluster) -> None:
    keys = QueueKeys(names(local_cluster, "conn")[0])
    owner = local_cluster.owner_port(keys.queue)
    replica = local_cluster.replica_of(owner)
    client = connect(f"redis://127.0.0.1:{replica}/0")
    assert cluster.is_cluster(client)
    Producer(client, keys).enqueue({"n": 1})
    assert local_cluster.client(owner).llen(keys.queue) == 1
    assert cluster.route(client, keys.queue) == (
        f"slot {local_cluster.keyslot(keys.queue)} on 127.0.0.1:{owner}"
    )
    assert not cluster.is_cluster(connect(f"redis://127.0.0.1:{replica}/0", cluster=False))


def test_a_workers_own_connection_goes_to_the_master_of_its_slot(
    local_cluster: LocalCluster,
) -> None:
    for name in names(local_cluster, "own"):
        keys = QueueKeys(name)
        client = connect(local_cluster.url(0))
        worker = make_server(client, keys, "s1", ManualClock(), settings=SETTINGS)
        worker.claim()
        w = worker.make_worker(0)
        w._conn.send_command("INFO", "server")  # type: ignore[attr-defined]
        info = w._conn.read_response()  # type: ignore[attr-defined]
        text = info.decode() if isinstance(info, bytes) else str(info)
        assert f"tcp_port:{local_cluster.owner_port(keys.queue)}" in text
        w.close()


def test_the_cli_names_the_slot_and_node_and_never_prints_a_traceback(
    local_cluster: LocalCluster,
) -> None:
    keys = QueueKeys(names(local_cluster, "cli")[0])
    owner = local_cluster.owner_port(keys.queue)
    other = next(p for p in local_cluster.master_ports() if p != owner)
    url = f"redis://127.0.0.1:{other}/0"
    ok = CliRunner().invoke(main, ["status", "-q", keys.queue_name, "--redis-url", url])
    assert ok.exit_code == 0, ok.output
    refused = CliRunner().invoke(
        main, ["status", "-q", keys.queue_name, "--redis-url", url, "--no-cluster"]
    )
    assert refused.exit_code == 1
    slot = local_cluster.keyslot(keys.queue)
    assert f"slot {slot} is served by 127.0.0.1:{owner}" in refused.output
    assert "Traceback" not in refused.output and refused.exception is not None
    assert isinstance(refused.exception, SystemExit)


def test_a_wrong_type_key_on_a_cluster_is_named_with_its_slot_and_node(
    local_cluster: LocalCluster,
) -> None:
    keys = QueueKeys(names(local_cluster, "wt")[0])
    owner = local_cluster.owner_port(keys.queue)
    local_cluster.client(owner).set(keys.queue, "not a list")
    seed = local_cluster.url(0)
    result = CliRunner().invoke(
        main, ["enqueue", "-q", keys.queue_name, "--redis-url", seed, '{"n": 1}']
    )
    assert result.exit_code == 1
    slot = local_cluster.keyslot(keys.queue)
    assert f"(slot {slot} on 127.0.0.1:{owner}) holds a string" in result.output
    assert "Traceback" not in result.output


# -- the worker through a failover and a migration ----------------------------------------------


def _worker(client: redis.Redis, keys: QueueKeys, handler: Any) -> Worker:
    server = make_server(client, keys, "s1", ManualClock(), handler=handler, settings=SETTINGS)
    server.claim()
    w = server.make_worker(0)
    w.register()
    w.pause = lambda seconds: None
    return w


def test_a_release_refused_by_a_failover_is_sent_to_the_new_master_and_commits_once(
    local_cluster: LocalCluster,
) -> None:
    keys = QueueKeys(names(local_cluster, "relfo")[0])
    client = connect(local_cluster.url(0))
    runs: list[Any] = []
    w = _worker(client, keys, runs.append)
    Producer(client, keys).enqueue({"n": 1}, task_id="t1")
    task = w.take(timeout=1)
    assert task is not None
    w.record(task)
    outcome = w.execute(task)
    local_cluster.failover(local_cluster.owner_port(keys.queue))
    release = w.release(task, outcome)  # MOVED, then on the new master
    assert release.held and release.action == "committed"
    assert runs == [{"n": 1}]
    assert commits(client, keys) == {"t1": 1}
    assert client.llen(w.list_key) == 0
    w.close()


def test_a_record_refused_by_a_failover_is_sent_again_before_the_release(
    local_cluster: LocalCluster,
) -> None:
    keys = QueueKeys(names(local_cluster, "recfo")[0])
    client = connect(local_cluster.url(0))
    w = _worker(client, keys, lambda payload: None)
    Producer(client, keys).enqueue({"n": 1}, task_id="t1")
    task = w.take(timeout=1)
    assert task is not None
    new_owner = local_cluster.failover(local_cluster.owner_port(keys.queue))
    w.record(task)  # to the old master: refused (MOVED), its reply deferred
    w.flush()
    assert w._record_refused
    assert client.hget(keys.processing, "t1") is None  # it did not run
    sent: list[tuple[int, str, str]] = []
    real_send = w._send

    def send(*args: Any, **kw: Any) -> None:
        script = args[1] if args[0] == "EVAL" else ""
        sent.append(
            (
                w._conn.port,
                str(args[0]),  # type: ignore[attr-defined]
                "record" if script == scripts.RECORD else "",
            )
        )
        real_send(*args, **kw)

    w._send = send  # type: ignore[method-assign]
    release = w.release(task, w.execute(task))
    assert release.action == "committed"
    # the record went again, to the new master, just before the release that then committed
    first_on_new = [s for s in sent if s[0] == new_owner]
    assert first_on_new[:2] == [
        (new_owner, "EVAL", "record"),
        (new_owner, "EVALSHA", ""),
    ] or first_on_new[:2] == [(new_owner, "EVAL", "record"), (new_owner, "EVAL", "")]
    assert commits(client, keys) == {"t1": 1}
    w.close()


def test_a_worker_loop_resumes_after_a_failover_and_a_live_migration(
    local_cluster: LocalCluster,
) -> None:
    keys = QueueKeys(names(local_cluster, "loop")[0])
    client = connect(local_cluster.url(0))
    executions: list[int] = []

    def handler(payload: Any) -> None:
        executions.append(payload["n"])
        time.sleep(0.005)

    w = _worker(client, keys, handler)
    w.pause = time.sleep
    stop = threading.Event()
    crashed: list[BaseException] = []

    def run() -> None:
        try:
            run_until_stopped(w, stop, until_idle=False, register=w.register)
        except BaseException as exc:
            crashed.append(exc)

    producer = Producer(client, keys)
    producer.enqueue_many({"n": n} for n in range(100))
    t = threading.Thread(target=run)
    t.start()
    try:
        wait_for(lambda: int(client.get(keys.committed) or 0) >= 20)
        local_cluster.failover(local_cluster.owner_port(keys.queue))
        producer.enqueue_many({"n": n} for n in range(100, 200))
        source = local_cluster.owner_port(keys.queue)
        target = next(p for p in local_cluster.master_ports() if p != source)
        local_cluster.migrate_slot(local_cluster.keyslot(keys.queue), target, pause=0.01)
        producer.enqueue_many({"n": n} for n in range(200, 300))
        wait_for(lambda: int(client.get(keys.committed) or 0) >= 300)
    finally:
        stop.set()
        t.join(timeout=30)
    assert not crashed
    done = commits(client, keys)
    assert len(done) == 300 and set(done.values()) == {1}
    assert sorted(set(executions)) == list(range(300))
    assert client.llen(w.list_key) == 0 and client.llen(keys.queue) == 0
    w.close()


def test_a_worker_blocked_on_an_empty_queue_follows_a_failover(
    local_cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Its BLMOVE is answered UNBLOCKED: the loop follows the slot to the new master and takes
    the next task there, instead of crashing."""
    keys = QueueKeys(names(local_cluster, "blk")[0])
    # A block far longer than a failover takes, even on a loaded machine: the take must still be
    # waiting when the failover answers it (no timing luck).
    settings = Settings(block_timeout=30, socket_timeout_margin=5.0, track_commits=True)
    client = connect(local_cluster.url(0), settings)
    runs: list[Any] = []
    server = make_server(client, keys, "s1", ManualClock(), handler=runs.append, settings=settings)
    server.claim()
    w = server.make_worker(0)
    stop = threading.Event()
    crashed: list[BaseException] = []

    def run() -> None:
        try:
            run_until_stopped(w, stop, until_idle=False, register=w.register)
        except BaseException as exc:
            crashed.append(exc)

    owner = local_cluster.owner_port(keys.queue)
    t = threading.Thread(target=run)
    t.start()
    try:
        blocked_until(owner, 1)
        new_owner = local_cluster.failover(owner)
        Producer(client, keys).enqueue({"n": 1}, task_id="t1")
        wait_for(lambda: int(client.get(keys.committed) or 0) >= 1)
    finally:
        stop.set()
        t.join(timeout=30)
    assert not crashed
    assert commits(client, keys) == {"t1": 1} and runs == [{"n": 1}]
    assert w._conn.port == new_owner  # type: ignore[attr-defined]
    # it was the UNBLOCKED reply that moved it (not a socket timeout: 35 s here)
    assert any(
        "UNBLOCKED" in r.getMessage() and "following the slot" in r.getMessage()
        for r in caplog.records
    )
    w.close()


def wait_for(condition: Any, timeout: float = 60.0) -> None:
    """A set-up wait with a generous deadline (so a broken build fails instead of hanging)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached within the deadline")
        time.sleep(0.02)


def test_min_replicas_waits_on_the_master_of_the_queues_slot(local_cluster: LocalCluster) -> None:
    """WAIT names no key: on a cluster it must go where the LPUSH went, and count that master's
    replicas. With the owner's only replica stopped, an enqueue asking for one replica must fail
    (a WAIT sent to another master would count that master's replica and pass)."""
    keys = QueueKeys(names(local_cluster, "wait")[0])
    client = connect(local_cluster.url(0))
    producer = Producer(client, keys, settings=Settings(min_replicas=1, replica_timeout=0.3))
    producer.enqueue({"n": 0})  # the replica is there: confirmed
    replica_port = local_cluster.replica_of(local_cluster.owner_port(keys.queue))
    replica = next(n for n in local_cluster.nodes if n.port == replica_port)
    replica.signal(signal.SIGSTOP)
    try:
        with pytest.raises(ReplicationTimeout):
            producer.enqueue({"n": 1})
    finally:
        replica.signal(signal.SIGCONT)
    local_cluster.wait_ok()
