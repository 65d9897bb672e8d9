"""The sweep lease: one sweeper at a time (sweep load linear in the fleet).

Protocol time is a ManualClock and "waiting" is a recorded `stop_event.wait`, as in
test_server_lifecycle.py. The lease's own expiry is Redis's PX timer (real time), so these tests
give it an hour and stand in for its lapse by deleting the key: nothing here depends on how fast
the test runs, short of an hour's stall.
"""

from __future__ import annotations

import dataclasses

import pytest
import redis

from taskcustody import ManualClock, Producer, QueueKeys, Server, Settings
from taskcustody.core.sweep_lease import SweepLease, holder_name
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import ids_in, make_server
from tests.test_server_lifecycle import drive_waits, spy

HOUR = 3600.0
LEASED = dataclasses.replace(TEST_SETTINGS, sweep_lease_ttl=HOUR)  # heartbeat 5, sweep 10
UNLEASED = dataclasses.replace(TEST_SETTINGS, sweep_lease=False)


def fleet(
    client: redis.Redis, keys: QueueKeys, clock: ManualClock, n: int, settings: Settings = LEASED
) -> list[Server]:
    servers = [make_server(client, keys, f"s{i}", clock, settings=settings) for i in range(n)]
    for server in servers:
        server.claim()
    return servers


def lease_holder(client: redis.Redis, keys: QueueKeys) -> str | None:
    value = client.get(keys.sweep_lease)
    return None if value is None else value.decode()


def lapse(client: redis.Redis, keys: QueueKeys) -> None:
    """What Redis does when the lease's PX timer runs out: the key is gone."""
    assert client.delete(keys.sweep_lease) == 1


def holding_tasks(
    client: redis.Redis, keys: QueueKeys, clock: ManualClock, server: Server, payloads: list[str]
) -> tuple[list[str], str]:
    """Give `server` a worker holding every task of `payloads` in its list; (ids, list key)."""
    ids = Producer(client, keys, clock).enqueue_many(payloads)
    worker = server.make_worker(0)
    worker.register()
    for _ in payloads:
        assert worker.take(timeout=0.05) is not None
    worker.close()
    assert client.llen(keys.queue) == 0
    return ids, worker.list_key


# -- settings --------------------------------------------------------------------------------------


def test_the_lease_is_on_by_default_and_lasts_three_sweep_periods() -> None:
    assert Settings().sweep_lease is True
    assert Settings().lease_ttl == 30.0  # sweep 10, heartbeat 5
    # The loop wakes every heartbeat: a 3 s sweep interval sweeps every 5 s, a 7 s one every 10 s.
    assert Settings(sweep_interval=3).sweep_period == 5.0
    assert Settings(sweep_interval=7).lease_ttl == 30.0
    assert Settings(sweep_lease_ttl=10.5).lease_ttl == 10.5
    # 2.1 / 0.3 is 7.000000000000001 in floats: still seven wakes, not eight.
    fast = Settings(heartbeat_interval=0.3, server_ttl=1, sweep_interval=2.1)
    assert fast.sweep_period == pytest.approx(2.1)


@pytest.mark.parametrize("ttl", [10.0, 9.0, 0.0, -1.0])
def test_a_lease_no_longer_than_the_sweep_period_is_refused(ttl: float) -> None:
    with pytest.raises(ValueError, match=r"^sweep_lease_ttl must exceed the sweep period"):
        Settings(sweep_lease_ttl=ttl)


def test_a_lease_needs_a_positive_ttl_and_pexpire_gets_whole_milliseconds(
    keys: QueueKeys, backend: Backend
) -> None:
    client = backend.client()
    with pytest.raises(ValueError, match=r"^the sweep lease's ttl must be > 0$"):
        SweepLease(client, keys, "s1:1", 0)
    assert SweepLease(client, keys, "s1:1", 0.0001).ttl_ms == 1
    lease = SweepLease(client, keys, "s1:1", 2.5)
    assert lease.ttl_ms == 2500
    assert lease.acquire_or_renew() is True
    # Redis expires it on its own timer: at most the ttl from now.
    assert 0 < client.pttl(keys.sweep_lease) <= 2500
    assert lease_holder(client, keys) == "s1:1"


# -- who sweeps ----------------------------------------------------------------------------------


def test_only_one_of_several_servers_sweeps_per_interval(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    servers = fleet(client, keys, clock, 4)
    sweeps = [spy(server, "sweep", clock) for server in servers]
    for _ in range(3):  # three intervals; every server's loop reaches its sweep once in each
        reports = [server.periodic_sweep() for server in servers]
        assert [r is not None for r in reports] == [True, False, False, False]
        clock.advance(10)
    assert sweeps == [[1000, 1010, 1020], [], [], []]
    assert lease_holder(client, keys) == holder_name("s0", servers[0].identity.incarnation)


def test_background_loops_sweep_only_while_they_hold_the_lease(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    first, second = fleet(client, keys, clock, 2)
    first_sweeps = spy(first, "sweep", clock)
    second_sweeps = spy(second, "sweep", clock)
    second_beats = spy(second, "heartbeat", clock)
    drive_waits(first, clock, stop_after=4)
    first._background()
    drive_waits(second, clock, stop_after=4)
    second._background()
    assert first_sweeps == [1000, 1010]
    # The other server still heartbeats every interval; it only leaves the sweeping to the holder.
    assert second_sweeps == [] and second_beats == [1020, 1025, 1030, 1035]
    assert client.zscore(keys.servers, "s1") == 1035 + 15


def test_with_the_switch_off_every_server_sweeps_every_interval(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    servers = fleet(client, keys, clock, 3, settings=UNLEASED)
    sweeps = [spy(server, "sweep", clock) for server in servers]
    for _ in range(2):
        assert all(server.periodic_sweep() is not None for server in servers)
        clock.advance(10)
    assert sweeps == [[1000, 1010]] * 3
    assert client.exists(keys.sweep_lease) == 0


# -- the holder dies -----------------------------------------------------------------------------


def test_when_the_holder_dies_another_takes_the_lease_and_recovers_its_tasks(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    holder, other = fleet(client, keys, clock, 2)
    ids, dead_list = holding_tasks(client, keys, clock, holder, ["a", "b", "c"])
    assert holder.periodic_sweep() is not None
    # The holder dies here: no more heartbeats or renewals. Its registration lapses at 1015 ...
    clock.advance(20)
    other.heartbeat()
    # ... but while its lease stands, nobody sweeps, and its tasks stay where they are.
    assert other.periodic_sweep() is None
    assert ids_in(client, keys.queue) == [] and client.llen(dead_list) == 3
    lapse(client, keys)
    report = other.periodic_sweep()
    assert report is not None and report.pruned == ["s0"] and report.moved == 3
    assert sorted(ids_in(client, keys.suspects)) == sorted(ids)
    assert client.llen(dead_list) == 0
    assert lease_holder(client, keys) == holder_name("s1", other.identity.incarnation)


def test_a_non_holder_death_is_recovered_by_the_holder(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    holder, doomed = fleet(client, keys, clock, 2)
    assert holder.periodic_sweep() is not None
    ids, dead_list = holding_tasks(client, keys, clock, doomed, ["a", "b"])
    clock.advance(20)  # the doomed server's registration (until 1015) lapses
    holder.heartbeat()
    report = holder.periodic_sweep()
    assert report is not None and report.pruned == ["s1"] and report.moved == 2
    assert sorted(ids_in(client, keys.suspects)) == sorted(ids) and client.llen(dead_list) == 0


def test_a_new_incarnation_of_the_holders_id_does_not_inherit_its_lease(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    (old,) = fleet(client, keys, clock, 1)
    assert old.periodic_sweep() is not None
    clock.advance(20)  # the old process died; a restart claims the id afresh
    (new,) = fleet(client, keys, clock, 1)
    assert new.identity.incarnation != old.identity.incarnation
    assert new.periodic_sweep() is None
    assert lease_holder(client, keys) == holder_name("s0", old.identity.incarnation)


# -- renewal and release ---------------------------------------------------------------------------


def test_renewal_extends_only_our_own_lease(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    holder, other = fleet(client, keys, clock, 2)
    assert holder.sweep_lease.acquire_or_renew() is True
    client.pexpire(keys.sweep_lease, 60_000)  # a minute left of the hour
    assert other.sweep_lease.acquire_or_renew() is False
    assert client.pttl(keys.sweep_lease) <= 60_000  # not extended by a server that lacks it
    assert lease_holder(client, keys) == holder.sweep_lease.holder
    assert holder.sweep_lease.acquire_or_renew() is True
    assert client.pttl(keys.sweep_lease) > 60_000  # extended to the full hour again
    assert lease_holder(client, keys) == holder.sweep_lease.holder


def test_release_gives_up_only_our_own_lease(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    holder, other = fleet(client, keys, clock, 2)
    assert other.sweep_lease.release() is False  # nothing to release
    assert holder.sweep_lease.acquire_or_renew() is True
    assert other.sweep_lease.release() is False
    assert lease_holder(client, keys) == holder.sweep_lease.holder
    assert holder.sweep_lease.release() is True
    assert client.exists(keys.sweep_lease) == 0


def test_shutdown_releases_our_lease_and_the_next_server_takes_it_at_once(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    holder, other = fleet(client, keys, clock, 2)
    assert holder.periodic_sweep() is not None
    other._shutdown([], [])  # a server that does not hold the lease leaves it alone
    assert lease_holder(client, keys) == holder.sweep_lease.holder
    third = make_server(client, keys, "s9", clock, settings=LEASED)
    third.claim()
    assert third.periodic_sweep() is None
    holder._shutdown([], [])
    assert client.exists(keys.sweep_lease) == 0
    assert third.periodic_sweep() is not None
    assert lease_holder(client, keys) == third.sweep_lease.holder


def test_a_superseded_holder_still_releases_its_lease_on_shutdown(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    (server,) = fleet(client, keys, clock, 1)
    assert server.periodic_sweep() is not None
    server.superseded = True
    server._shutdown([], [])
    assert client.exists(keys.sweep_lease) == 0


def test_shutdown_before_claiming_touches_no_lease(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    (holder,) = fleet(client, keys, clock, 1)
    assert holder.periodic_sweep() is not None
    make_server(client, keys, "never-claimed", clock, settings=LEASED)._shutdown([], [])
    assert lease_holder(client, keys) == holder.sweep_lease.holder
