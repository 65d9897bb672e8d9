"""`queue_status`: what `taskcustody status` shows, and how the command prints it."""

from __future__ import annotations

import json

import pytest
import redis
from click.testing import CliRunner

import taskcustody.cli.app
from taskcustody import ManualClock, Producer, QueueKeys, prune_inactive_servers, queue_status
from taskcustody.cli.app import main
from tests.conftest import Backend
from tests.helpers import make_server
from tests.support.redis_server import RedisServerProcess


def test_status_shows_live_workers_and_dead_lists_that_still_hold_tasks(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue_many([1, 2, 3])
    live = make_server(client, keys, "a", clock, workers=2)
    w0, w1 = live.start()
    assert w0.take(timeout=0.01)
    w1.take(timeout=0.01)  # registers w1's list: it shows, though its take finds nothing
    w1.reconcile()
    dead = make_server(client, keys, "b", clock, workers=2)
    d0, _ = dead.start()
    assert d0.take(timeout=0.01)
    clock.advance(20)
    live.heartbeat()
    prune_inactive_servers(client, keys, clock.now())
    snap = queue_status(client, keys, clock.now())
    # w1's reconcile counted the task it took (a suspect now); b's worker took the last queued one
    assert snap.depth == 0 and snap.suspects == 1
    # Every registered list of a live server, empty ones included (a list is registered by its
    # worker's first take); of a dead one only lists holding tasks.
    assert snap.inflight == {
        f"a#{live.incarnation}": {"w0": 1, "w1": 0},
        f"b#{dead.incarnation}": {"w0": 1},
    }
    assert list(snap.servers) == ["a"] and snap.servers["a"]["registered"]


# -- the `taskcustody status` command ---------------------------------------------------------


def test_a_time_reads_as_utc_iso_and_how_far_from_now() -> None:
    _when = taskcustody.cli.app._when  # the one formatter of `status` and `dead list/show`
    at = 1796505600.0  # 2026-12-05T21:20:00Z
    assert _when(at) == "2026-12-05T21:20:00Z"
    assert _when(at, now=at - 12.2) == "2026-12-05T21:20:00Z (in 12 s)"
    assert _when(at, now=at + 3) == "2026-12-05T21:20:00Z (3 s ago)"
    assert _when(at, now=at + 0.2) == "2026-12-05T21:20:00Z (now)"
    # Past two of a unit, the unit: a dead letter may be days old.
    assert _when(at, now=at + 119) == "2026-12-05T21:20:00Z (119 s ago)"
    assert _when(at, now=at + 600) == "2026-12-05T21:20:00Z (10 min ago)"
    assert _when(at, now=at - 5 * 3600) == "2026-12-05T21:20:00Z (in 5 h)"
    assert _when(at, now=at + 3 * 86400) == "2026-12-05T21:20:00Z (3 d ago)"
    assert _when(None) == "-"


class FixedClock:
    """Stands in for the status command's RedisClock: the relative times printed are exact."""

    NOW = 1796505600.0

    def __init__(self, client: object, key: str | None = None) -> None:
        pass

    def now(self) -> float:
        return self.NOW


def test_status_prints_deadlines_as_utc_times_and_json_keeps_the_epoch_seconds(
    real_redis: RedisServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis.Redis.from_url(real_redis.url)
    client.flushall()
    keys = QueueKeys("st")
    client.zadd(keys.servers, {"live": FixedClock.NOW + 12, "gone": FixedClock.NOW - 3})
    client.hset(keys.incarnations, mapping={"live": 7, "gone": 5})
    monkeypatch.setattr(taskcustody.cli.app, "RedisClock", FixedClock)
    common = ["status", "--queue", "st", "--redis-url", real_redis.url]

    text = CliRunner().invoke(main, common)
    assert text.exit_code == 0, text.output
    assert text.output.splitlines()[1:] == [
        "server gone (incarnation 5): expired, deadline 2026-12-05T21:19:57Z (3 s ago)",
        "server live (incarnation 7): registered, deadline 2026-12-05T21:20:12Z (in 12 s)",
    ]
    as_json = CliRunner().invoke(main, [*common, "--json"])
    assert as_json.exit_code == 0, as_json.output
    servers = json.loads(as_json.output)["servers"]
    assert servers["live"]["deadline"] == FixedClock.NOW + 12
    assert servers["gone"] == {
        "deadline": FixedClock.NOW - 3,
        "incarnation": 5,
        "registered": False,
    }
