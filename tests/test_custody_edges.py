"""Edges of the protocol's critical steps that the main custody tests (tests/test_custody.py) do
not pin, one property each:

take blocks and uses BLMOVE; reconcile drains the own list while the server is live; a drain ends
when the list is shorter than its budget and stays bounded under a finite appender; a dead-only
drain never touches a live list; live_owners; the processing sweep's counts; the release's dirty
flag and its report; the startup drain's log and distinct worker lists; which lists a recovery
pass selects by registration liveness (the startup drain only our own id's, the sweep never our
own incarnation's nor a live server's, with no round trip for them); NOSCRIPT falls back to EVAL.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
import redis

from taskcustody import (
    ManualClock,
    Outcome,
    Producer,
    QueueKeys,
    ServerIdentity,
    ServerIdHeld,
    Settings,
    WrongKeyType,
    drain_inflight,
    prune_inactive_servers,
    recover_inflight,
)
from taskcustody.core import scripts
from taskcustody.core.recovery import live_owners, parse_record, requeue_stuck_processing_tasks
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import commits, dead_letters, ids_in, make_server


class EvalCounter:
    """Counts the client's EVALs of one script, and stops a runaway loop with an error."""

    def __init__(self, client: redis.Redis, script: str, limit: int = 50) -> None:
        self.calls = 0
        self._real = client.eval
        self._script = script
        self._limit = limit
        client.eval = self  # type: ignore[method-assign]

    def __call__(self, script: str, *args: Any) -> Any:
        if script == self._script:
            self.calls += 1
            assert self.calls <= self._limit, "runaway loop: too many script calls"
        return self._real(script, *args)


def _push_later(
    backend: Backend, keys: QueueKeys, delay: float
) -> tuple[threading.Thread, list[str]]:
    ids: list[str] = []

    def push() -> None:
        time.sleep(delay)
        ids.append(Producer(backend.client(), keys, ManualClock()).enqueue("late"))

    t = threading.Thread(target=push, daemon=True)
    t.start()
    return t, ids


# -- take ---------------------------------------------------------------------------------------


def test_take_blocks_until_a_task_arrives(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    (worker,) = make_server(client, keys, "s1", ManualClock()).start()
    worker.reconcile()
    pusher, ids = _push_later(backend, keys, 0.3)
    task = worker.take(timeout=5)  # much longer than the settings' 50 ms block
    pusher.join()
    assert task is not None and [task.id] == ids
    assert ids_in(client, worker.list_key) == ids


def test_run_once_blocks_for_its_own_timeout(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    (worker,) = make_server(client, keys, "s1", ManualClock()).start()
    pusher, ids = _push_later(backend, keys, 0.3)
    assert worker.run_once(timeout=5)
    pusher.join()
    assert commits(client, keys) == {ids[0]: 1}


def test_take_on_real_redis_is_one_blmove(real_redis: Any, keys: QueueKeys) -> None:
    client = redis.Redis.from_url(real_redis.url)
    client.flushall()
    Producer(client, keys, ManualClock()).enqueue("x")
    (worker,) = make_server(client, keys, "s1", ManualClock()).start()
    client.config_resetstat()
    assert worker.take(timeout=1)
    stats = client.info("commandstats")
    assert stats.get("cmdstat_blmove", {}).get("calls") == 1, sorted(stats)
    assert "cmdstat_brpoplpush" not in stats


def test_wrong_type_of_the_own_list_is_named(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    Producer(client, keys, ManualClock()).enqueue("x")
    (worker,) = make_server(client, keys, "s1", ManualClock()).start()
    worker.reconcile()
    client.set(worker.list_key, "oops")
    with pytest.raises(WrongKeyType, match="inflight:s1"):
        worker.take(timeout=0.05)


def test_malformed_task_is_logged(
    backend: Backend, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    client = backend.client()
    client.lpush(keys.queue, b"not json")
    (worker,) = make_server(client, keys, "s1", ManualClock()).start()
    with caplog.at_level(logging.WARNING, logger="taskcustody.worker"):
        assert worker.run_once(timeout=0.05) is False
    assert any(
        r.getMessage().startswith("dead-lettering a malformed task: ")
        and "not json" in r.getMessage()
        for r in caplog.records
    ), caplog.text


# -- reconcile and the drain ------------------------------------------------------------------


def test_reconcile_drains_own_debris_while_the_server_is_live(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    ids = Producer(client, keys, clock).enqueue_many(list(range(7)))
    server = make_server(client, keys, "s1", clock)
    (worker,) = server.start()
    worker.reconcile()
    for _ in range(7):  # seven takes whose replies were "lost": debris in a live list
        assert worker.take(timeout=1)
    counter = EvalCounter(client, scripts.DRAIN_CHUNK)
    worker.dirty = True
    assert worker.reconcile() == 7
    assert worker.dirty is False
    assert counter.calls == 3  # drain_chunk is 3: ceil(7 / 3) steps
    assert client.llen(worker.list_key) == 0
    assert sorted(ids_in(client, keys.suspects)) == sorted(ids)  # a reconcile counts too


def test_a_dead_only_drain_never_touches_a_live_list(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue("x")
    (worker,) = make_server(client, keys, "live", clock).start()
    task = worker.take(timeout=1)
    assert task
    assert drain_inflight(client, keys, worker.list_key, force=False) == 0
    assert ids_in(client, worker.list_key) == [task.id]


def test_drain_ends_when_the_list_is_shorter_than_its_budget(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue_many(["a", "b"])
    (worker,) = make_server(client, keys, "dead", clock).start()
    assert worker.take(timeout=1) and worker.take(timeout=1)
    # The list shrinks between the LLEN and the moves (a release in between): budget 5, 2 there.
    client.llen = lambda key: 5  # type: ignore[method-assign, assignment, misc]
    counter = EvalCounter(client, scripts.DRAIN_CHUNK, limit=10)
    clock.advance(TEST_SETTINGS.server_ttl + 1)
    prune_inactive_servers(client, keys, clock.now())
    assert drain_inflight(client, keys, worker.list_key, force=False, chunk=3) == 2
    assert counter.calls == 2  # one step moved 2, the next moved nothing: stop


def test_drain_is_bounded_under_a_finite_appender(backend: Backend, keys: QueueKeys) -> None:
    """Like the custody test, but the appender stops: an unbounded drain would end too, having
    moved more than the list held at the start."""
    client = backend.client()
    appender = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue_many(list(range(40)))
    (worker,) = make_server(client, keys, "dead", clock).start()
    for _ in range(7):
        assert worker.take(timeout=1)
    appended = 0

    def eval_then_append(*args: Any) -> Any:
        nonlocal appended
        if appended < 20:
            appender.lmove(keys.queue, worker.list_key, "LEFT", "LEFT")
            appended += 1
        return real_eval(*args)

    real_eval = client.eval
    clock.advance(TEST_SETTINGS.server_ttl + 1)
    prune_inactive_servers(client, keys, clock.now())
    client.eval = eval_then_append  # type: ignore[method-assign]
    moved = drain_inflight(client, keys, worker.list_key, force=False, chunk=3)
    assert moved == 7
    assert client.llen(worker.list_key) == appended == 3


def test_default_drain_chunk_is_100(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue_many(list(range(101)))
    dead = make_server(client, keys, "dead", clock, settings=Settings(block_timeout=0.05))
    (worker,) = dead.start()
    for _ in range(101):
        assert worker.take(timeout=1)
    live = make_server(client, keys, "live", clock)
    clock.advance(TEST_SETTINGS.server_ttl + 1)
    live.claim()
    prune_inactive_servers(client, keys, clock.now())
    counter = EvalCounter(client, scripts.DRAIN_CHUNK)
    me = live.identity
    assert recover_inflight(client, keys, me, include_self=False) == {worker.list_key: 101}
    assert counter.calls == 2


# -- recovery selection -----------------------------------------------------------------------


def test_live_owners_are_the_registered_incarnations(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    a = make_server(client, keys, "a", clock)
    b = make_server(client, keys, "b", clock)
    a.claim()
    clock.advance(5)
    b.claim()
    assert live_owners(client, keys) == {a.identity, b.identity}
    clock.advance(TEST_SETTINGS.server_ttl - 5)  # a's deadline is now: pruned; b's is later
    assert prune_inactive_servers(client, keys, clock.now()) == ["a"]
    assert live_owners(client, keys) == {ServerIdentity("b", b.identity.incarnation)}
    client.hdel(keys.incarnations, "b")  # registered without an incarnation: not live
    assert live_owners(client, keys) == set()


def test_sweep_drains_every_dead_list_in_chunks(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue_many(list(range(8)))
    workers = []
    for name in ("d1", "d2"):
        (w,) = make_server(client, keys, name, clock).start()
        for _ in range(4):
            assert w.take(timeout=1)
        workers.append(w)
    live = make_server(client, keys, "live", clock)
    live.start()
    clock.advance(TEST_SETTINGS.server_ttl + 1)
    live.heartbeat()
    counter = EvalCounter(client, scripts.DRAIN_CHUNK)
    report = live.sweep()
    assert report.drained_lists == {w.list_key: 4 for w in workers}
    assert counter.calls == 4  # drain_chunk 3: two steps per list of 4


def test_processing_sweep_counts_requeued_and_stale_records(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue_many(["mine", "a", "b", "gone"])
    me = make_server(client, keys, "me", clock)
    dead = make_server(client, keys, "dead", clock, workers=1)
    (mw,) = me.start()
    (dw,) = dead.start()
    mine = mw.take(timeout=1)
    assert mine
    mw.record(mine)  # our own record comes first: it must be skipped, not end the pass
    mw._call("PING")
    held = [dw.take(timeout=1) for _ in range(3)]
    assert all(held)
    for t in held:
        dw.record(t)  # type: ignore[arg-type]
    dw._call("PING")
    client.lrem(dw.list_key, 1, held[2].raw)  # type: ignore[union-attr]  # stale record
    clock.advance(TEST_SETTINGS.server_ttl + 1)
    me.heartbeat()
    prune_inactive_servers(client, keys, clock.now())
    assert requeue_stuck_processing_tasks(client, keys, me.identity) == (2, 1)
    assert client.hkeys(keys.processing) == [mine.id.encode()]


def test_parse_record() -> None:
    assert parse_record(b"list:key 12.5") == ("list:key", 12.5)
    assert parse_record("list:key") == ("list:key", 0.0)


# -- release ------------------------------------------------------------------------------------


def test_release_reports_and_dirty_flag(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue_many(["a", "b", "c"])
    (worker,) = make_server(client, keys, "s1", clock).start()
    worker.reconcile()
    first = worker.take(timeout=1)
    assert first
    assert worker.release(first, Outcome(True)).held
    late = worker.release(first, Outcome(True))  # a second release finds nothing: no commit
    assert (late.held, late.remaining, late.action) == (False, 0, "lost-custody")
    assert commits(client, keys) == {first.id: 1}
    second = worker.take(timeout=1)
    debris = worker.take(timeout=1)  # a second task in the list: debris for this release
    assert second and debris
    release = worker.release(second, Outcome(False, error="x"))
    assert (release.held, release.remaining, release.action) == (True, 1, "retried")
    assert worker.dirty is True
    worker.reconcile()
    assert worker.dirty is False
    task = worker.take(timeout=1)
    assert task
    release = worker.release(task, Outcome(True))
    assert (release.held, release.remaining, release.action) == (True, 0, "committed")
    assert worker.dirty is False


def test_release_on_the_last_attempt_dead_letters(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    settings = Settings(block_timeout=0.05, max_attempts=1, track_commits=False)
    Producer(client, keys, clock).enqueue("x")
    (worker,) = make_server(client, keys, "s1", clock, settings=settings).start()
    task = worker.take(timeout=1)
    assert task
    assert worker.release(task, Outcome(False, error="boom")).action == "dead-lettered"
    Producer(client, keys, clock).enqueue("y")
    task = worker.take(timeout=1)
    assert task and worker.release(task, Outcome(True)).action == "committed"
    assert client.hlen(keys.commit_log) == 0  # track_commits off: no commit log


def test_interrupted_task_on_its_last_attempt_is_dead_lettered_as_interrupted(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    settings = Settings(block_timeout=0.05, max_attempts=1)
    task_id = Producer(client, keys, clock).enqueue("x")

    def handler(payload: object) -> None:
        raise KeyboardInterrupt

    (worker,) = make_server(client, keys, "s1", clock, handler, settings=settings).start()
    with pytest.raises(KeyboardInterrupt):
        worker.run_once(timeout=1)
    (letter,) = dead_letters(client, keys)
    assert letter["task_id"] == task_id and letter["error"] == "worker interrupted"


def test_a_release_whose_reply_is_lost_makes_the_worker_dirty(
    backend: Backend, keys: QueueKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue("x")
    (worker,) = make_server(client, keys, "s1", clock).start()
    worker.reconcile()
    task = worker.take(timeout=1)
    assert task and worker.dirty is False

    def lost(*args: Any, **kwargs: Any) -> Any:
        raise redis.ConnectionError("reply lost")

    monkeypatch.setattr(worker._conn, "read_response", lost)
    with pytest.raises(redis.ConnectionError):
        worker.release(task, Outcome(True))
    assert worker.dirty is True


# -- server startup -----------------------------------------------------------------------------


def test_start_gives_each_worker_its_own_list_and_logs_the_drain(
    backend: Backend, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue_many(["a", "b"])
    first = make_server(client, keys, "s1", clock, workers=2)
    w0, w1 = first.start()
    assert w0.list_key != w1.list_key
    assert w0.take(timeout=1) and w1.take(timeout=1)
    clock.advance(TEST_SETTINGS.server_ttl + 1)
    second = make_server(client, keys, "s1", clock, workers=2)
    with caplog.at_level(logging.INFO, logger="taskcustody.server"):
        second.start()
    (message,) = [r.getMessage() for r in caplog.records if "startup drain" in r.getMessage()]
    assert message.startswith("startup drain requeued 2 task(s) from ")
    assert w0.list_key in message and ", " + w1.list_key in message


def test_refusal_names_the_lease(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    make_server(client, keys, "s1", clock).claim()
    with pytest.raises(ServerIdHeld, match="wait for its lease to lapse"):
        make_server(client, keys, "s1", clock).claim()


# -- recovery passes: which lists, and how many round trips -------------------------------------


def test_sweep_skips_own_and_live_lists_without_a_round_trip_and_drains_the_rest(
    backend: Backend, keys: QueueKeys
) -> None:
    """Sorted, our own list ("a") and a live server's ("b") come before the dead one ("c"): both
    are skipped without calling the drain, and the pass goes on to drain "c"."""
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue_many(["ta", "tb", "tc"])
    servers = {name: make_server(client, keys, name, clock) for name in "abc"}
    held = {}
    for name, server in servers.items():
        (w,) = server.start()
        task = w.take(timeout=1)
        assert task
        w.record(task)
        w._call("PING")
        held[name] = (w, task)
    clock.advance(TEST_SETTINGS.server_ttl + 1)
    servers["a"].heartbeat()
    servers["b"].heartbeat()
    counter = EvalCounter(client, scripts.DRAIN_CHUNK)
    report = servers["a"].sweep()
    assert report.pruned == ["c"]
    assert report.drained_lists == {held["c"][0].list_key: 1}
    assert counter.calls == 1  # only the dead list was drained
    assert ids_in(client, held["a"][0].list_key) == [held["a"][1].id]
    assert ids_in(client, held["b"][0].list_key) == [held["b"][1].id]
    # The live records stay; the drained task's record went with it.
    assert sorted(client.hkeys(keys.processing)) == sorted(
        [held["a"][1].id.encode(), held["b"][1].id.encode()]
    )


def test_a_server_that_re_registers_mid_pass_is_not_drained(
    backend: Backend, keys: QueueKeys
) -> None:
    """The dead-only drain re-checks liveness inside its atomic step: a stalled server that
    heart-beats between the selection and the drain keeps its list."""
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue("x")
    stalled = make_server(client, keys, "stalled", clock)
    (ws,) = stalled.start()
    task = ws.take(timeout=1)
    assert task
    me = make_server(client, keys, "me", clock)
    clock.advance(TEST_SETTINGS.server_ttl + 1)
    me.claim()
    prune_inactive_servers(client, keys, clock.now())
    real_eval = client.eval

    def resume_first(script: str, *args: Any) -> Any:
        if script == scripts.DRAIN_CHUNK:
            client.eval = real_eval  # type: ignore[method-assign]
            stalled.heartbeat()
        return real_eval(script, *args)

    client.eval = resume_first  # type: ignore[method-assign]
    assert recover_inflight(client, keys, me.identity, include_self=False) == {}
    assert ids_in(client, ws.list_key) == [task.id]


def test_default_chunks_of_the_sweep_and_the_startup_drain(
    backend: Backend, keys: QueueKeys
) -> None:
    from taskcustody import sweep

    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue_many(list(range(101)))
    (worker,) = make_server(client, keys, "dead", clock).start()
    for _ in range(101):
        assert worker.take(timeout=1)
    live = make_server(client, keys, "live", clock)
    clock.advance(TEST_SETTINGS.server_ttl + 1)
    live.claim()
    counter = EvalCounter(client, scripts.DRAIN_CHUNK)
    assert sweep(client, keys, clock.now(), live.identity).drained_lists == {worker.list_key: 101}
    assert counter.calls == 2


def test_startup_drain_uses_the_configured_chunk(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue_many(list(range(7)))
    (worker,) = make_server(client, keys, "s1", clock).start()
    for _ in range(7):
        assert worker.take(timeout=1)
    clock.advance(TEST_SETTINGS.server_ttl + 1)
    again = make_server(client, keys, "s1", clock)
    again.claim()
    counter = EvalCounter(client, scripts.DRAIN_CHUNK)
    assert again.startup_drain() == {worker.list_key: 7}
    assert counter.calls == 3  # drain_chunk 3


def test_drain_inflight_default_chunk_is_100(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue_many(list(range(101)))
    (worker,) = make_server(client, keys, "dead", clock).start()
    for _ in range(101):
        assert worker.take(timeout=1)
    counter = EvalCounter(client, scripts.DRAIN_CHUNK)
    assert drain_inflight(client, keys, worker.list_key, force=True) == 101
    assert counter.calls == 2


def test_processing_sweep_counts_a_stale_record_before_a_requeue(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue_many(["stale", "stuck"])
    me = make_server(client, keys, "me", clock)
    dead = make_server(client, keys, "dead", clock)
    me.start()
    (dw,) = dead.start()
    first, second = dw.take(timeout=1), dw.take(timeout=1)
    assert first and second
    dw.record(first)  # recorded first, then gone from the list: its record is stale
    dw.record(second)
    dw._call("PING")
    client.lrem(dw.list_key, 1, first.raw)
    clock.advance(TEST_SETTINGS.server_ttl + 1)
    me.heartbeat()
    prune_inactive_servers(client, keys, clock.now())
    assert requeue_stuck_processing_tasks(client, keys, me.identity) == (1, 1)


def test_start_refuses_a_held_id_at_once_by_default(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    make_server(client, keys, "s1", clock).start()
    intruder = make_server(client, keys, "s1", clock)
    waits: list[object] = []
    intruder.stop_event.wait = lambda timeout=None: waits.append(timeout)  # type: ignore[method-assign, assignment, func-returns-value]
    with pytest.raises(ServerIdHeld):
        intruder.start()
    assert waits == []  # no patience unless asked for


# -- recovery by registration liveness: whose lists each pass may touch ---------------------


def test_startup_drain_touches_only_our_own_id(backend: Backend, keys: QueueKeys) -> None:
    """Other servers' dead lists are the periodic sweep's, not the startup drain's."""
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue_many(["mine", "theirs"])
    (old,) = make_server(client, keys, "s1", clock).start()
    (other,) = make_server(client, keys, "other", clock).start()
    mine, theirs = old.take(timeout=1), other.take(timeout=1)
    assert mine and theirs
    clock.advance(TEST_SETTINGS.server_ttl + 1)
    prune_inactive_servers(client, keys, clock.now())  # both dead and deregistered
    again = make_server(client, keys, "s1", clock)
    again.claim()
    assert again.startup_drain() == {old.list_key: 1}
    assert ids_in(client, other.list_key) == [theirs.id]


def test_a_pruned_server_sweeping_never_drains_its_own_lists(
    backend: Backend, keys: QueueKeys
) -> None:
    """A stalled server resumes and sweeps before its next heartbeat: its own prune deregisters
    it, but its own incarnation's lists and records are its running workers' -- never drained."""
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue("x")
    stalled = make_server(client, keys, "s1", clock)
    (worker,) = stalled.start()
    task = worker.take(timeout=1)
    assert task
    worker.record(task)
    worker.flush()
    clock.advance(TEST_SETTINGS.server_ttl + 1)
    report = stalled.sweep()
    assert report.pruned == ["s1"]
    assert report.drained_lists == {} and report.requeued_stuck == 0
    assert stalled.requeue_stuck_processing_tasks() == (0, 0)
    assert ids_in(client, worker.list_key) == [task.id]
    assert client.hexists(keys.processing, task.id)


def test_no_drain_round_trip_for_any_of_many_live_servers(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue_many(list(range(4)))
    servers = [make_server(client, keys, f"s{i}", clock) for i in range(4)]
    for server in servers:
        (w,) = server.start()
        assert w.take(timeout=1)
    assert len(live_owners(client, keys)) == 4
    counter = EvalCounter(client, scripts.DRAIN_CHUNK)
    assert servers[0].sweep().drained_lists == {}
    assert counter.calls == 0


def test_record_and_release_survive_a_flushed_script_cache(
    backend: Backend, keys: QueueKeys
) -> None:
    """NOSCRIPT means the script did not run, so falling back to EVAL is safe and must work."""
    client = backend.client()
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue("x")
    (worker,) = make_server(client, keys, "s1", clock).start()
    task = worker.take(timeout=1)
    assert task
    client.script_flush()
    worker.record(task)
    worker.flush()
    assert client.hexists(keys.processing, task_id)
    client.script_flush()
    release = worker.release(task, Outcome(True))
    assert (release.held, release.remaining, release.action) == (True, 0, "committed")
    assert commits(client, keys) == {task_id: 1}
    assert not client.hexists(keys.processing, task_id)


def test_startup_recovery_is_forced_even_for_our_live_incarnation(
    backend: Backend, keys: QueueKeys
) -> None:
    """include_self=True drains every list of our id without the liveness re-check (forced): at
    startup our id's lists cannot belong to anyone else live."""
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue("x")
    server = make_server(client, keys, "s1", clock)
    (worker,) = server.start()
    assert worker.take(timeout=1)  # debris in our live incarnation's list
    assert recover_inflight(client, keys, server.identity, include_self=True) == {
        worker.list_key: 1
    }
