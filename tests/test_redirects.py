"""Cluster redirects in the worker's loop and release, without a cluster: the replies are
scripted. (tests/test_cluster_redirects.py pins what real Redis Cluster answers, and drives the
same paths through a real failover and migration.)"""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest
import redis

from taskcustody import ManualClock, Producer, QueueKeys, Worker, connect_fake
from taskcustody.core.loop import run_until_stopped
from taskcustody.core.worker import REDIRECT_ATTEMPTS
from taskcustody.deploy import cluster
from tests.test_worker_run_loop import Stop, new_worker, script

MOVED = redis.exceptions.MovedError("9450 127.0.0.1:7102")
UNBLOCKED = redis.ResponseError(
    "UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)"
)
ASK = redis.exceptions.AskError("9450 127.0.0.1:7103")
TRYAGAIN = redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot")


@pytest.fixture
def worker() -> Worker:
    return new_worker(connect_fake(fakeredis.FakeServer()), QueueKeys("tq", prefix="test"))


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (MOVED, cluster.MOVED),
        (UNBLOCKED, cluster.MOVED),
        (ASK, cluster.BUSY),
        (TRYAGAIN, cluster.BUSY),
        (redis.exceptions.ClusterDownError("down"), cluster.BUSY),
        (redis.ResponseError("WRONGTYPE x"), None),
        (redis.ResponseError("ERR script"), None),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_redirects_are_told_from_other_errors(error: Exception, kind: str | None) -> None:
    assert cluster.redirect_kind(error) == kind


@pytest.mark.parametrize(
    "error", [MOVED, UNBLOCKED, ASK, TRYAGAIN], ids=lambda e: str(e).split()[0]
)
def test_a_redirect_never_crashes_the_loop_and_the_next_cycle_reconciles(
    worker: Worker, error: Exception
) -> None:
    stop = Stop()
    followed: list[bool] = []
    worker.follow_slot = lambda refresh=True: followed.append(refresh)  # type: ignore[method-assign]
    dirty = script(worker, stop, [error, error, True])
    run_until_stopped(worker, stop, until_idle=False)
    # The cycles after each redirect start dirty (reconcile first); nothing was raised.
    assert dirty == [True, True, True, False]
    assert len(stop.waits) == 2
    # MOVED / UNBLOCKED: the slot map is re-read and the connection moves; ASK/TRYAGAIN: not.
    assert len(followed) == (2 if cluster.redirect_kind(error) == cluster.MOVED else 0)


def test_redirect_pauses_grow_bounded_with_jitter_and_reset_after_a_cycle(worker: Worker) -> None:
    stop = Stop()
    worker.follow_slot = lambda refresh=True: None  # type: ignore[method-assign]
    script(worker, stop, [TRYAGAIN] * 12 + [True, TRYAGAIN])
    run_until_stopped(worker, stop, until_idle=False)
    pauses = [w for w in stop.waits if w is not None]
    assert len(pauses) == 13
    spell = pauses[:12]
    assert all(0 < p <= cluster.MAX_BACKOFF for p in spell)
    assert spell[0] <= cluster.FIRST_BACKOFF
    assert max(spell) > cluster.MAX_BACKOFF / 2  # it grew
    assert pauses[12] <= cluster.FIRST_BACKOFF  # a cycle that worked ended the spell
    assert len(set(spell[-4:])) > 1  # jitter: capped pauses still differ


def test_a_non_redirect_error_still_propagates(worker: Worker) -> None:
    stop = Stop()
    script(worker, stop, [redis.ResponseError("ERR something else")])
    with pytest.raises(redis.ResponseError, match="something else"):
        run_until_stopped(worker, stop, until_idle=False)


def test_a_redirected_release_is_sent_again_and_commits_once_without_rerunning_the_handler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = connect_fake(fakeredis.FakeServer())
    keys = QueueKeys("tq", prefix="test")
    w = new_worker(client, keys)
    w.register()
    runs: list[object] = []
    w.handler = runs.append
    pauses: list[float] = []
    w.pause = pauses.append
    refusals: list[Exception] = [TRYAGAIN, ASK, MOVED]
    real_call = w._call

    def call(*args: object, **kw: object) -> object:
        # A refused release did not run: refuse it before sending anything.
        if args and args[0] in ("EVALSHA", "EVAL") and args[2] == 10 and refusals:  # RELEASE
            w._send("PING")  # keeps the reply count honest for the deferred record
            w._unread_replies -= 1
            w._conn.read_response()  # type: ignore[no-untyped-call]
            raise refusals.pop(0)
        return real_call(*args, **kw)

    monkeypatch.setattr(w, "_call", call)
    followed: list[bool] = []
    real_follow = w.follow_slot
    monkeypatch.setattr(
        w, "follow_slot", lambda refresh=True: (followed.append(refresh), real_follow(refresh))
    )
    Producer(client, keys, ManualClock()).enqueue({"n": 1}, task_id="t1")
    assert w.run_once(timeout=0.01)
    assert runs == [{"n": 1}]  # the handler ran once
    assert len(pauses) == 3 and len(followed) == 1  # one back-off per refusal; MOVED followed
    assert int(client.get(keys.committed) or 0) == 1
    assert client.hget(keys.commit_log, "t1") == b"1"
    assert client.llen(w.list_key) == 0


def test_a_release_refused_too_often_is_left_to_the_loop(
    monkeypatch: pytest.MonkeyPatch, worker: Worker
) -> None:
    pauses: list[float] = []
    worker.pause = pauses.append

    def refused(*args: object, **kw: object) -> object:
        raise TRYAGAIN

    monkeypatch.setattr(worker, "_call", refused)
    with pytest.raises(redis.exceptions.TryAgainError):
        worker._release_raw(b"{}", "t1", "ok", "")
    assert len(pauses) == REDIRECT_ATTEMPTS


@pytest.mark.parametrize(
    "error",
    [
        TRYAGAIN,
        redis.exceptions.ClusterDownError("The cluster is down"),
        redis.exceptions.ClusterError("TTL exhausted."),
        redis.exceptions.SlotNotCoveredError("slot 9450 not covered"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_the_heartbeat_loop_rides_out_a_resharding_or_failing_over_cluster(
    error: Exception,
) -> None:
    """A heartbeat refused by a redirect did not run: the loop logs it and beats again at the
    next interval, instead of ending (a server whose heartbeat thread died would be judged dead
    while its workers run)."""
    from tests.test_server_lifecycle import drive_waits

    client = connect_fake(fakeredis.FakeServer())
    keys = QueueKeys("tq", prefix="test")
    clock = ManualClock()
    server = new_worker_server(client, keys, clock)
    beats: list[float] = []
    real = server.heartbeat

    def heartbeat() -> None:
        beats.append(clock.now())
        if len(beats) == 2:
            raise error
        real()

    server.heartbeat = heartbeat  # type: ignore[method-assign]
    drive_waits(server, clock, stop_after=4)
    server._background()
    assert beats == [1000, 1005, 1010, 1015]  # every beat tried, the loop alive after the refusal
    assert client.zscore(keys.servers, "s1") == 1015 + 15


@pytest.mark.parametrize(
    "error",
    [
        redis.exceptions.ClusterError("TTL exhausted."),
        redis.exceptions.SlotNotCoveredError("not covered"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_cluster_client_giving_up_is_not_a_worker_crash(worker: Worker, error: Exception) -> None:
    stop = Stop()
    worker.follow_slot = lambda refresh=True: None  # type: ignore[method-assign]
    dirty = script(worker, stop, [error, True])
    run_until_stopped(worker, stop, until_idle=False)
    assert dirty == [True, True, False]


def new_worker_server(client: redis.Redis, keys: QueueKeys, clock: ManualClock) -> Any:
    from tests.helpers import make_server

    server = make_server(client, keys, "s1", clock)
    server.claim()
    return server
