"""`taskcustody sweep`: one recovery pass from the command line, garbage collection included."""

from __future__ import annotations

import redis
from click.testing import CliRunner

from taskcustody import QueueKeys
from taskcustody.cli.app import main
from taskcustody.core.keys import ListOwner
from tests.support.redis_server import RedisServerProcess


def test_sweep_forgets_dead_empty_lists_past_the_grace_and_says_how_many(
    real_redis: RedisServerProcess,
) -> None:
    client = redis.Redis.from_url(real_redis.url)
    client.flushall()
    keys = QueueKeys("cli")
    dead = [keys.inflight(ListOwner("gone", 7, f"w{i}")) for i in range(3)]
    client.zadd(keys.inflight_registry, dict.fromkeys(dead, 0.0))  # registered long ago
    held = keys.inflight(ListOwner("gone", 7, "w9"))
    client.zadd(keys.inflight_registry, {held: 0.0})
    client.lpush(held, b'{"id": "t", "payload": 1, "attempts": 0, "enqueued_at": 0}')
    runner = CliRunner()
    out = runner.invoke(
        main, ["sweep", "--queue", "cli", "--redis-url", real_redis.url, "--registry-grace", "60"]
    )
    assert out.exit_code == 0, out.output
    assert "forgot 3 dead empty list(s); requeued 1 task(s) from 1 list(s)" in out.output
    assert client.zrange(keys.inflight_registry, 0, -1) == [held.encode()]  # drained, not yet
    again = runner.invoke(main, ["sweep", "--queue", "cli", "--redis-url", real_redis.url])
    assert "forgot 1 dead empty list(s); requeued 0 task(s)" in again.output
    assert client.zcard(keys.inflight_registry) == 0


def test_sweep_refuses_a_grace_of_zero() -> None:
    out = CliRunner().invoke(main, ["sweep", "--queue", "cli", "--registry-grace", "0"])
    assert out.exit_code == 2 and "--registry-grace" in out.output
