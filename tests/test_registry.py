"""The registry of in-flight lists heals itself and stays bounded.

Healing: the claim registers a new incarnation's lists, every take registers its list again (in
the same write as its BLMOVE), and a heartbeat that finds its server's registration gone registers
the server and its lists again -- so a task never sits in a list recovery cannot find, even after
Redis lost its data or a sweep forgot the list. Bounded: a sweep forgets every dead owner's empty
list whose last registration is older than the grace, a hundred lists per round trip.

Time is a ManualClock throughout: a registration's score is the clock's time, so every assertion
about "when" is exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
import redis

from taskcustody import (
    ListOwner,
    ManualClock,
    Producer,
    QueueKeys,
    Server,
    ServerIdHeld,
    Superseded,
    WrongKeyType,
    prune_inactive_servers,
)
from taskcustody.core import recovery, scripts
from taskcustody.core.prefetch import PrefetchingWorker
from taskcustody.core.recovery import (
    BATCH,
    forget_dead_empty_lists,
    live_owners,
    migrate_legacy_registry,
    registrations,
)
from taskcustody.core.worker import Worker
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import all_custody, commits, ids_in, make_server
from tests.support.redis_server import RedisServerProcess

GRACE = TEST_SETTINGS.registry_grace
TTL = TEST_SETTINGS.server_ttl


# -- reading what went over the wire -------------------------------------------------------------

Command = list[bytes]


def parse_commands(packed: bytes) -> list[Command]:
    """The commands of one write, as redis-py packs them: RESP arrays of bulk strings."""
    commands: list[Command] = []
    pos = 0
    while pos < len(packed):
        assert packed[pos : pos + 1] == b"*", packed[pos : pos + 20]
        end = packed.index(b"\r\n", pos)
        count, pos = int(packed[pos + 1 : end]), end + 2
        args: Command = []
        for _ in range(count):
            assert packed[pos : pos + 1] == b"$", packed[pos : pos + 20]
            end = packed.index(b"\r\n", pos)
            size, pos = int(packed[pos + 1 : end]), end + 2
            args.append(packed[pos : pos + size])
            pos += size + 2
        commands.append(args)
    return commands


class WriteLog:
    """Every socket write of the connections watched, each as the commands it carried. The sync
    client reads a write's replies before it writes again, so one write is one round trip."""

    def __init__(self) -> None:
        self.writes: list[list[Command]] = []

    def watch(self, conn: Any) -> None:
        send = conn.send_packed_command

        def recording(command: Any, check_health: bool = True) -> None:
            chunks = [command] if isinstance(command, bytes | str) else command
            packed = b"".join(c.encode() if isinstance(c, str) else bytes(c) for c in chunks)
            self.writes.append(parse_commands(packed))
            send(command, check_health)

        conn.send_packed_command = recording

    def watch_pool(self, client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
        """Watch every connection the client's pool hands out from now on. The pool connects a
        connection (handshake included) before handing it out, so handshakes are not counted."""
        pool = client.connection_pool
        get = pool.get_connection
        watched: set[int] = set()

        def getting(*args: Any, **kwargs: Any) -> Any:
            conn = get(*args, **kwargs)
            if id(conn) not in watched:
                watched.add(id(conn))
                self.watch(conn)
            return conn

        monkeypatch.setattr(pool, "get_connection", getting)

    def clear(self) -> None:
        self.writes.clear()

    def script_calls(self, script: str) -> list[Command]:
        """Every EVAL of `script` (recovery calls its scripts with EVAL, by text)."""
        return [
            c for w in self.writes for c in w if c[0].upper() == b"EVAL" and c[1] == script.encode()
        ]

    def writes_calling(self, script: str) -> list[list[Command]]:
        return [
            w
            for w in self.writes
            if any(c[0].upper() == b"EVAL" and c[1] == script.encode() for c in w)
        ]

    def writes_carrying(self, name: bytes) -> list[list[Command]]:
        return [w for w in self.writes if any(c[0].upper() == name for c in w)]


# -- set-up helpers ------------------------------------------------------------------------------


def owned(keys: QueueKeys, server: Server) -> dict[str, float]:
    """Our lists in the registry, with their registration times."""
    regs = registrations(server.client, keys)
    return {k: t for k, t in regs.items() if k in server.list_keys()}


def put_task_into(client: redis.Redis, keys: QueueKeys, list_key: str, clock: ManualClock) -> str:
    """A task that sits in `list_key`, as a take would have left it."""
    task_id = Producer(client, keys, clock).enqueue({"in": list_key})
    assert client.lmove(keys.queue, list_key, "RIGHT", "LEFT") is not None
    return task_id


def dead_list(keys: QueueKeys, i: int) -> str:
    """The list of a server that never heartbeats (so it is never live)."""
    return keys.inflight(ListOwner(f"gone{i:03d}", 7, "w0"))


@pytest.fixture
def real(real_redis: RedisServerProcess) -> Iterator[Backend]:
    """The throwaway redis-server alone: for what only a real socket shows."""
    b = Backend("real", real_redis.url)
    b.client().flushall()
    yield b


# -- 1. the claim --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefetch", "worker_ids"),
    [(1, ["w0", "w1"]), (3, ["w0p0", "w0p1", "w0p2", "w1p0", "w1p1", "w1p2"])],
    ids=["plain", "prefetch3"],
)
def test_a_claim_registers_every_list_of_the_new_incarnation_at_the_claim_time(
    backend: Backend, keys: QueueKeys, prefetch: int, worker_ids: list[str]
) -> None:
    client = backend.client()
    clock = ManualClock()
    clock.advance(7)
    server = make_server(
        client, keys, "s1", clock, workers=2, settings=replace(TEST_SETTINGS, prefetch=prefetch)
    )
    incarnation = server.claim()
    expected = {keys.inflight(ListOwner("s1", incarnation, w)): clock.now() for w in worker_ids}
    assert registrations(client, keys) == expected


def test_a_refused_claim_registers_nothing(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    make_server(client, keys, "s1", clock, workers=2).claim()
    before = registrations(client, keys)
    clock.advance(TTL / 2)  # the holder's lease still runs
    with pytest.raises(ServerIdHeld):
        make_server(client, keys, "s1", clock, workers=2).claim()
    assert registrations(client, keys) == before


# -- 2. every take -------------------------------------------------------------------------------


def claimed_worker(
    client: redis.Redis, keys: QueueKeys, clock: ManualClock, server_id: str = "s1"
) -> tuple[Server, Worker]:
    server = make_server(client, keys, server_id, clock)
    server.claim()
    worker = server.make_worker(0)
    worker.register()
    worker.reconcile()  # clean: its first take is an ordinary one
    return server, worker


def test_every_take_registers_its_list_again_at_the_take_time_even_after_the_registry_was_lost(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    _, worker = claimed_worker(client, keys, clock)
    task_id = Producer(client, keys, clock).enqueue("t")
    clock.advance(3)
    client.delete(keys.inflight_registry)  # Redis lost it (or a sweep forgot the list)
    task = worker.take(timeout=0.05)
    assert task is not None and task.id == task_id
    # The task's list is registered, at the take's time: recovery can find it.
    assert registrations(client, keys) == {worker.list_key: clock.now()}
    assert all_custody(client, keys) == {task_id: 1}
    worker.release(task, worker.execute(task))
    clock.advance(4)
    task_id2 = Producer(client, keys, clock).enqueue("t2")
    task2 = worker.take(timeout=0.05)
    assert task2 is not None and task2.id == task_id2
    assert registrations(client, keys) == {worker.list_key: clock.now()}  # again, newer


def test_a_take_on_an_empty_queue_still_registers_its_list(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    _, worker = claimed_worker(client, keys, clock)
    clock.advance(3)
    client.delete(keys.inflight_registry)
    assert worker.take(timeout=0.05) is None
    # A task enqueued while the BLMOVE waits would land in this list: it must be registered.
    assert registrations(client, keys) == {worker.list_key: clock.now()}


@pytest.mark.real_redis
def test_a_takes_registration_and_its_blmove_go_out_in_one_write(
    real: Backend, keys: QueueKeys
) -> None:
    client = real.client()
    clock = ManualClock()
    _, worker = claimed_worker(client, keys, clock)
    task_id = Producer(client, keys, clock).enqueue("t")
    clock.advance(3)
    worker._conn.connect()  # type: ignore[no-untyped-call]  # its handshake is not the take
    log = WriteLog()
    log.watch(worker._conn)
    task = worker.take(timeout=0.05)
    assert task is not None and task.id == task_id
    # ONE write: no stall can separate the registration from the BLMOVE behind it.
    assert log.writes == [
        [
            [
                b"ZADD",
                keys.inflight_registry.encode(),
                repr(clock.now()).encode(),
                worker.list_key.encode(),
            ],
            [b"BLMOVE", keys.queue.encode(), worker.list_key.encode(), b"RIGHT", b"LEFT", b"0.05"],
        ]
    ]


def test_a_failed_registration_makes_the_take_raise_and_the_next_reconcile_requeues_the_task(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    _, worker = claimed_worker(client, keys, clock)
    task_id = Producer(client, keys, clock).enqueue("t")
    client.delete(keys.inflight_registry)
    client.set(keys.inflight_registry, "not a sorted set")  # the ZADD fails, the BLMOVE runs
    assert not worker.dirty
    with pytest.raises(WrongKeyType):
        worker.take(timeout=0.05)
    # The move happened into a list nobody registered: the worker knows it holds debris.
    assert ids_in(client, worker.list_key) == [task_id]
    assert worker.dirty
    client.delete(keys.inflight_registry)  # the operator repairs the key
    handled: list[Any] = []
    worker.handler = handled.append
    # The next cycle reconciles first (the task goes back to the queue), then takes it again.
    assert worker.run_once(timeout=0.05)
    assert handled == ["t"] and commits(client, keys) == {task_id: 1}
    assert client.llen(worker.list_key) == 0 and client.llen(keys.queue) == 0


def test_the_reconcile_after_a_failed_registration_puts_the_task_back_in_the_queue(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    _, worker = claimed_worker(client, keys, clock)
    task_id = Producer(client, keys, clock).enqueue("t")
    client.delete(keys.inflight_registry)
    client.set(keys.inflight_registry, "not a sorted set")
    with pytest.raises(WrongKeyType):
        worker.take(timeout=0.05)
    assert worker.reconcile() == 1
    # the reconcile counts what it moves: a suspect
    assert ids_in(client, keys.suspects) == [task_id] and client.llen(worker.list_key) == 0
    assert not worker.dirty


# -- 4. the prefetching worker's pipelined take ---------------------------------------------------


def test_a_pipelined_take_registers_every_slots_list_even_after_the_registry_was_lost(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    server = make_server(client, keys, "s1", clock, settings=replace(TEST_SETTINGS, prefetch=3))
    (runner,) = server.start()
    assert isinstance(runner, PrefetchingWorker)
    ids = Producer(client, keys, clock).enqueue_many(["a", "b"])  # fewer tasks than slots
    clock.advance(3)
    client.delete(keys.inflight_registry)
    batch, error = runner.take_all()
    assert error is None
    assert sorted(task_id for _, _, task_id in batch.raws) == sorted(ids)
    # Every slot's list, including the one that got nothing, at the take's time.
    assert registrations(client, keys) == dict.fromkeys(runner.list_keys, clock.now())
    assert all_custody(client, keys) == dict.fromkeys(ids, 1)


# -- 5. the heartbeat ----------------------------------------------------------------------------


def wipe(client: redis.Redis, keys: QueueKeys, clock: ManualClock) -> None:
    client.flushall()  # Redis restarted empty


def pruned_while_stalled(client: redis.Redis, keys: QueueKeys, clock: ManualClock) -> None:
    clock.advance(TTL + 1)
    assert prune_inactive_servers(client, keys, clock.now()) == ["s1"]


@pytest.mark.parametrize("loss", [wipe, pruned_while_stalled], ids=["wipe", "pruned"])
def test_a_heartbeat_that_finds_its_registration_gone_registers_the_server_and_its_lists_again(
    backend: Backend,
    keys: QueueKeys,
    loss: Callable[[redis.Redis, QueueKeys, ManualClock], None],
) -> None:
    client = backend.client()
    clock = ManualClock()
    server = make_server(client, keys, "s1", clock, workers=2)
    incarnation = server.claim()
    loss(client, keys, clock)
    clock.advance(2)
    server.heartbeat()
    assert client.zscore(keys.servers, "s1") == clock.now() + TTL
    assert client.hget(keys.incarnations, "s1") == str(incarnation).encode()
    assert registrations(client, keys) == dict.fromkeys(server.list_keys(), clock.now())
    assert not server.superseded


def test_a_normal_heartbeat_leaves_the_registration_times_alone(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    server = make_server(client, keys, "s1", clock, workers=2)
    server.claim()
    worker = server.make_worker(0)
    worker.register()
    clock.advance(2)
    worker.take(timeout=0.05)  # w0's registration is newer than w1's
    before = registrations(client, keys)
    assert len(set(before.values())) == 2
    clock.advance(3)
    server.heartbeat()
    # Only takes refresh a registration: a heartbeat refreshing it would keep a list that no
    # take can fill any more (a worker thread that died) young forever.
    assert registrations(client, keys) == before
    assert client.zscore(keys.servers, "s1") == clock.now() + TTL


def test_a_superseded_heartbeat_registers_nothing(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    old = make_server(client, keys, "s1", clock)
    old.claim()
    clock.advance(TTL + 1)  # old stalls past its lease; a new process takes the id
    make_server(client, keys, "s1", clock).claim()
    client.zrem(keys.inflight_registry, *old.list_keys())  # say a sweep forgot old's lists
    before = registrations(client, keys)
    clock.advance(1)
    with pytest.raises(Superseded):
        old.heartbeat()
    assert old.superseded
    assert registrations(client, keys) == before


# -- 6. incarnations -----------------------------------------------------------------------------


def test_claims_after_a_lapsed_lease_and_after_a_wipe_get_new_incarnations_without_a_counter(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    first = make_server(client, keys, "s1", clock).claim()
    clock.advance(TTL + 1)
    second = make_server(client, keys, "s1", clock).claim()
    client.flushall()  # a counter kept in Redis would start again here
    third = make_server(client, keys, "s1", clock).claim()
    fresh = make_server(client, keys, "s2", clock).claim()
    assert len({first, second, third, fresh}) == 4
    # Nothing but the claim's own keys was written: no incarnation counter.
    assert {k.decode() for k in client.keys("*")} == {
        keys.servers,
        keys.incarnations,
        keys.inflight_registry,
    }
    assert not client.exists(f"{keys.base}:incarnation-counter")
    assert client.hget(keys.incarnations, "s1") == str(third).encode()


# -- 7. garbage collection -----------------------------------------------------------------------


def dead_server(client: redis.Redis, keys: QueueKeys, clock: ManualClock) -> tuple[Server, str]:
    """A server with one worker that claims now and then never heartbeats again."""
    server = make_server(client, keys, "dead", clock)
    server.claim()
    (list_key,) = server.list_keys()
    return server, list_key


def sweeper_now(client: redis.Redis, keys: QueueKeys, clock: ManualClock) -> Server:
    sweeper = make_server(client, keys, "sweeper", clock)
    sweeper.claim()
    return sweeper


def test_a_sweep_forgets_a_dead_owners_empty_list_older_than_the_grace(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    _, gone = dead_server(client, keys, clock)
    clock.advance(GRACE + 1)
    sweeper = sweeper_now(client, keys, clock)
    report = sweeper.sweep()
    assert report.pruned == ["dead"]
    assert report.forgotten_lists == [gone]
    assert set(registrations(client, keys)) == set(sweeper.list_keys())


@pytest.mark.parametrize(
    ("age", "forgotten"),
    [(GRACE, True), (GRACE - 0.5, False)],
    ids=["exactly-the-grace", "younger"],
)
def test_a_dead_empty_list_is_forgotten_only_once_its_registration_is_as_old_as_the_grace(
    backend: Backend, keys: QueueKeys, age: float, forgotten: bool
) -> None:
    client = backend.client()
    clock = ManualClock()
    _, gone = dead_server(client, keys, clock)
    clock.advance(age)  # past the dead server's lease either way
    report = sweeper_now(client, keys, clock).sweep()
    assert report.pruned == ["dead"]
    assert report.forgotten_lists == ([gone] if forgotten else [])
    assert (gone in registrations(client, keys)) is not forgotten


def test_a_dead_list_holding_a_task_is_drained_not_forgotten_and_forgotten_on_a_later_sweep(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    dead, gone = dead_server(client, keys, clock)
    task_id = Producer(client, keys, clock).enqueue("t")
    worker = dead.make_worker(0)
    worker.register()
    worker.reconcile()
    assert worker.take(timeout=0.05) is not None  # ...and dies holding it
    clock.advance(GRACE + 1)
    sweeper = sweeper_now(client, keys, clock)
    first = sweeper.sweep()
    assert first.forgotten_lists == []  # not empty when the collection looked
    assert first.drained_lists == {gone: 1}
    assert ids_in(client, keys.suspects) == [task_id]
    assert gone in registrations(client, keys)
    second = sweeper.sweep()
    assert second.forgotten_lists == [gone]
    assert second.drained_lists == {}
    assert gone not in registrations(client, keys)


def test_a_sweep_spares_a_live_servers_old_empty_lists_without_spending_a_script_call(
    backend: Backend, keys: QueueKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = backend.client()
    clock = ManualClock()
    alive = make_server(client, keys, "alive", clock, workers=3)
    alive.claim()
    clock.advance(GRACE + 1)
    alive.heartbeat()
    sweeper = sweeper_now(client, keys, clock)
    lists = alive.list_keys()
    assert all(registrations(client, keys)[k] <= clock.now() - GRACE for k in lists)  # old
    log = WriteLog()
    log.watch_pool(client, monkeypatch)
    report = sweeper.sweep()
    assert report.pruned == [] and report.forgotten_lists == []
    assert set(lists) <= set(registrations(client, keys))
    # Live lists are not even candidates: a live fleet's lists cost the collection nothing.
    assert log.script_calls(scripts.FORGET_DEAD_EMPTY_LISTS) == []


def test_a_sweep_spares_the_sweepers_own_lists_even_when_it_was_pruned(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    sweeper = sweeper_now(client, keys, clock)
    clock.advance(GRACE + 1)  # it stalled past its lease: its own sweep prunes it
    report = sweeper.sweep()
    assert report.pruned == ["sweeper"]
    # Old, empty, and its owner not live: only being the sweeper's own spares them. Its workers
    # may resume taking (and do register again), but the sweeper knows they are not dead.
    assert report.forgotten_lists == []
    assert set(registrations(client, keys)) == set(sweeper.list_keys())


def registered_again(
    client: redis.Redis, keys: QueueKeys, dead: Server, clock: ManualClock, list_key: str
) -> None:
    client.zadd(keys.inflight_registry, {list_key: clock.now()})  # a take's ZADD


def filled(
    client: redis.Redis, keys: QueueKeys, dead: Server, clock: ManualClock, list_key: str
) -> None:
    put_task_into(client, keys, list_key, clock)  # a take's BLMOVE


def owner_live_again(
    client: redis.Redis, keys: QueueKeys, dead: Server, clock: ManualClock, list_key: str
) -> None:
    # Registered again without touching the list's score (a heartbeat would refresh it too).
    client.zadd(keys.servers, {"dead": clock.now() + TTL})
    client.hset(keys.incarnations, "dead", str(dead.identity.incarnation))


def nothing(
    client: redis.Redis, keys: QueueKeys, dead: Server, clock: ManualClock, list_key: str
) -> None:
    pass


@pytest.mark.parametrize(
    ("meanwhile", "spared"),
    [(nothing, False), (registered_again, True), (filled, True), (owner_live_again, True)],
    ids=["unchanged", "re-registered", "filled", "owner-live"],
)
def test_the_collection_rechecks_each_list_inside_its_atomic_step(
    backend: Backend, keys: QueueKeys, meanwhile: Callable[..., None], spared: bool
) -> None:
    client = backend.client()
    clock = ManualClock()
    dead, gone = dead_server(client, keys, clock)
    clock.advance(GRACE + 1)
    sweeper = sweeper_now(client, keys, clock)
    prune_inactive_servers(client, keys, clock.now())
    stale, live = registrations(client, keys), live_owners(client, keys)
    meanwhile(client, keys, dead, clock, gone)  # between the client's read and the script
    forgotten = forget_dead_empty_lists(
        client, keys, stale, live, sweeper.identity, clock.now() - GRACE
    )
    assert forgotten == ([] if spared else [gone])
    assert (gone in registrations(client, keys)) is spared


# -- 8. batching and the bound -------------------------------------------------------------------

MANY = 250


def register_dead_lists(
    client: redis.Redis, keys: QueueKeys, clock: ManualClock, n: int
) -> list[str]:
    lists = [dead_list(keys, i) for i in range(n)]
    client.zadd(keys.inflight_registry, dict.fromkeys(lists, clock.now()))
    return lists


def test_a_sweep_forgets_many_dead_empty_lists_a_hundred_per_script_call(
    backend: Backend, keys: QueueKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock()
    client = backend.client()
    lists = register_dead_lists(client, keys, clock, MANY)
    clock.advance(GRACE + 1)
    sweeper = sweeper_now(client, keys, clock)
    log = WriteLog()
    log.watch_pool(client, monkeypatch)
    report = sweeper.sweep()
    assert sorted(report.forgotten_lists) == sorted(lists)
    calls = log.script_calls(scripts.FORGET_DEAD_EMPTY_LISTS)
    assert len(calls) == math.ceil(MANY / BATCH) == 3
    # each call carries up to BATCH lists (its numkeys counts 3 fixed keys too)
    assert [int(c[2]) - 3 for c in calls] == [100, 100, 50]
    assert len(log.writes_calling(scripts.FORGET_DEAD_EMPTY_LISTS)) == 3  # 3 round trips
    assert set(registrations(client, keys)) == set(sweeper.list_keys())


def sweep_cost(log: WriteLog, sweeper: Server) -> tuple[int, recovery.RecoveryReport]:
    log.clear()
    report = sweeper.sweep()
    return len(log.writes), report


def test_a_sweep_reads_many_lengths_in_batches_and_the_registry_is_then_bounded(
    backend: Backend, keys: QueueKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock()
    client = backend.client()
    log = WriteLog()
    log.watch_pool(client, monkeypatch)

    # The cost of a sweep over a registry that never held a dead list (another queue).
    other = QueueKeys("baseline", prefix="test")
    baseline, _ = sweep_cost(log, sweeper_now(client, other, clock))

    lists = register_dead_lists(client, keys, clock, MANY)
    busy = lists[::50]
    assert len(busy) == 5
    ids = {put_task_into(client, keys, k, clock) for k in busy}
    clock.advance(1)  # registrations still young: nothing to forget yet
    sweeper = sweeper_now(client, keys, clock)

    cost, report = sweep_cost(log, sweeper)
    assert report.forgotten_lists == []
    assert report.drained_lists == dict.fromkeys(busy, 1)
    assert set(ids_in(client, keys.suspects)) == ids
    # The 250 lengths: three pipelined round trips, nothing read per list outside them.
    llen_writes = log.writes_carrying(b"LLEN")
    assert [len(w) for w in llen_writes] == [100, 100, 50]
    assert all(c[0].upper() == b"LLEN" for w in llen_writes for c in w)
    assert len(log.script_calls(scripts.DRAIN_CHUNK)) == len(busy)  # empty lists cost no drain
    assert cost == baseline + 3 + len(busy)

    clock.advance(GRACE)
    sweeper.heartbeat()
    cost, report = sweep_cost(log, sweeper)
    assert sorted(report.forgotten_lists) == sorted(lists)  # the drained ones too, now empty
    assert len(log.script_calls(scripts.FORGET_DEAD_EMPTY_LISTS)) == 3
    assert log.writes_carrying(b"LLEN") == []
    assert set(registrations(client, keys)) == set(sweeper.list_keys())

    # Bounded: what is left costs a sweep no more than a registry that never grew.
    cost, report = sweep_cost(log, sweeper)
    assert report.forgotten_lists == [] and report.drained_lists == {}
    assert cost == baseline


# -- 9. the 0.1 registry -------------------------------------------------------------------------


def test_a_starting_server_moves_the_legacy_registry_into_the_sorted_set(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    holding, empty, both = (keys.inflight(ListOwner("old", 3, w)) for w in ("w0", "w1", "w2"))
    task_id = put_task_into(client, keys, holding, clock)
    client.sadd(keys.legacy_inflight_registry, holding, empty, both)
    client.zadd(keys.inflight_registry, {both: clock.now()})  # already registered, earlier
    earlier = clock.now()
    clock.advance(5)
    server = make_server(client, keys, "s1", clock)
    server.start()
    assert not client.exists(keys.legacy_inflight_registry)
    assert registrations(client, keys) == {
        holding: clock.now(),
        empty: clock.now(),
        both: earlier,
        **dict.fromkeys(server.list_keys(), clock.now()),
    }
    # ...and a dead owner's migrated list is recovered like any other.
    report = server.sweep()
    assert report.drained_lists == {holding: 1}
    assert ids_in(client, keys.suspects) == [task_id]

    # A second start finds nothing to move and changes no migrated registration.
    migrated = {k: registrations(client, keys)[k] for k in (holding, empty, both)}
    clock.advance(5)
    assert migrate_legacy_registry(client, keys, clock.now()) == 0
    make_server(client, keys, "s2", clock).start()
    assert {k: registrations(client, keys)[k] for k in migrated} == migrated
    assert not client.exists(keys.legacy_inflight_registry)


# -- 10. end to end: a stalled owner resumes ------------------------------------------------------


def test_a_stalled_owner_whose_list_was_forgotten_registers_it_again_with_its_next_take(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    dead, stalled_list = dead_server(client, keys, clock)
    worker = dead.make_worker(0)
    worker.register()
    worker.reconcile()
    clock.advance(GRACE + 1)  # the owner stalls
    sweeper = sweeper_now(client, keys, clock)
    assert sweeper.sweep().forgotten_lists == [stalled_list]

    # It resumes and takes, not knowing it was judged dead.
    task_id = Producer(client, keys, clock).enqueue("t")
    clock.advance(1)
    sweeper.heartbeat()
    assert worker.take(timeout=0.05) is not None
    assert registrations(client, keys)[stalled_list] == clock.now()
    assert all_custody(client, keys) == {task_id: 1}  # the task is where recovery can see it

    # Its owner dies for good: the next sweep recovers the task.
    clock.advance(5)
    sweeper.heartbeat()
    report = sweeper.sweep()
    assert report.forgotten_lists == []
    assert report.drained_lists == {stalled_list: 1}
    assert ids_in(client, keys.suspects) == [task_id]


# -- a take's own timeout ------------------------------------------------------------------------
# The collection is safe because Redis serves or times out a take's BLMOVE before its
# registration ages past the grace. A per-call timeout that does not keep to that would let a
# stalled worker's pending BLMOVE put a task into a list a sweep has just forgotten (seen on real
# Redis: take(timeout=120) sent, the worker stalled, a sweep 61 s later forgot the empty list, an
# enqueue then landed in it, unregistered). So `take` refuses it, as Settings refuses the same
# block_timeout; 0 would block forever.


@pytest.mark.parametrize(
    "timeout",
    [0, -1, GRACE - TEST_SETTINGS.socket_timeout_margin],
    ids=["zero", "negative", "as-long-as-the-grace-allows"],
)
def test_a_take_refuses_a_timeout_that_could_outlast_the_registry_grace(
    backend: Backend, keys: QueueKeys, timeout: float
) -> None:
    client = backend.client()
    clock = ManualClock()
    _, worker = claimed_worker(client, keys, clock)
    task_id = Producer(client, keys, clock).enqueue("t")  # so that a take sent returns at once
    client.delete(keys.inflight_registry)
    with pytest.raises(ValueError, match="timeout"):
        worker.take(timeout=timeout)
    # Refused before anything was sent: nothing registered, nothing moved, the worker clean.
    assert ids_in(client, keys.queue) == [task_id] and client.llen(worker.list_key) == 0
    assert registrations(client, keys) == {} and not worker.dirty


def test_a_take_accepts_a_timeout_the_registry_grace_covers(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    _, worker = claimed_worker(client, keys, clock)
    task_id = Producer(client, keys, clock).enqueue("t")
    just_under = GRACE - TEST_SETTINGS.socket_timeout_margin - 0.5
    task = worker.take(timeout=just_under)
    assert task is not None and task.id == task_id


def test_without_a_grace_a_take_accepts_any_positive_timeout(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    server = make_server(
        client, keys, "s1", clock, settings=replace(TEST_SETTINGS, registry_grace=0)
    )
    server.claim()
    worker = server.make_worker(0)
    task_id = Producer(client, keys, clock).enqueue("t")
    task = worker.take(timeout=10 * GRACE)  # verify's setting: nothing is ever collected by age
    assert task is not None and task.id == task_id
