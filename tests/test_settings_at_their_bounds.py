"""Settings drawn at and past each bound: either a clean refusal before any task is taken (a
SettingsError from Settings, exit 2 with one `Error:` line naming a flag from `taskcustody
worker`), or a server that claims, takes a task, commits it and stores its result on a REAL
redis-server, readable by results.get_result, then heartbeats and sweeps.

What used to fall between the two: `--result-ttl 99999999999999999` was accepted, and every
release then failed inside the Lua script after counting its task committed; NaN passed every
check; a socket timeout past poll(2)'s int of milliseconds was accepted and wrapped around.

Bounded in time: few examples (each one that is accepted starts a server on the session's
redis-server; prefetch at its bound, 1000 slots, is the slowest, about a second).
"""

from __future__ import annotations

import math
from typing import Any

import click
import pytest
import redis
from click.testing import CliRunner
from hypothesis import event, given, settings
from hypothesis import strategies as st

from taskcustody import (
    ManualClock,
    Producer,
    QueueKeys,
    Server,
    Settings,
    SettingsError,
    connect,
    get_result,
)
from taskcustody.cli.app import main
from taskcustody.core.scripts import MAX_RESULT_TTL
from taskcustody.core.settings import MAX_COUNT, MAX_PREFETCH, MAX_SECONDS, MAX_SOCKET_TIMEOUT
from tests.support.redis_server import RedisServerProcess

pytestmark = pytest.mark.real_redis

EPS = 1e-6
PAST_MAX = MAX_SECONDS + 1e-3
NOT_FINITE = (math.nan, math.inf, -math.inf)

#: Per field: values at its bounds and just past them (with the other fields at their defaults;
#: drawn together, a bound may move, which the property allows for), and what else it refuses.
EDGES: dict[str, tuple[Any, ...]] = {
    "block_timeout": (
        EPS,
        0.0,
        MAX_SOCKET_TIMEOUT - 3.0,
        MAX_SOCKET_TIMEOUT - 2.999,
        PAST_MAX,
        *NOT_FINITE,
    ),
    "socket_timeout_margin": (
        EPS,
        0.0,
        MAX_SOCKET_TIMEOUT - 2.0,
        MAX_SOCKET_TIMEOUT - 1.999,
        *NOT_FINITE,
    ),
    "heartbeat_interval": (EPS, 0.0, 15.0 - EPS, 15.0, PAST_MAX, *NOT_FINITE),
    "server_ttl": (5.0 + EPS, 5.0, MAX_SECONDS, PAST_MAX, *NOT_FINITE),
    "sweep_interval": (EPS, 0.0, MAX_SECONDS, PAST_MAX, *NOT_FINITE),
    "sweep_lease_ttl": (None, 10.0 + EPS, 10.0, MAX_SECONDS, PAST_MAX, *NOT_FINITE),
    "retry_backoff": (0.0, -EPS, 300.0, 300.0 + EPS, *NOT_FINITE),
    "retry_backoff_max": (1.0, 1.0 - EPS, MAX_SECONDS, PAST_MAX, *NOT_FINITE),
    "shutdown_grace": (0.0, -EPS, MAX_SECONDS, PAST_MAX, *NOT_FINITE),
    "registry_grace": (0.0, -EPS, 5.0 + EPS, 5.0, MAX_SECONDS, PAST_MAX, *NOT_FINITE),
    "oom_log_interval": (EPS, 0.0, MAX_SECONDS, PAST_MAX, *NOT_FINITE),
    "replica_timeout": (EPS, 0.0, MAX_SECONDS, PAST_MAX, *NOT_FINITE),
    "max_attempts": (1, 0, MAX_COUNT, MAX_COUNT + 1, 1.5),
    "max_recoveries": (None, 0, -1, MAX_COUNT, MAX_COUNT + 1),
    "drain_chunk": (1, 0, MAX_COUNT, MAX_COUNT + 1),
    "result_ttl": (0, -1, 1, MAX_RESULT_TTL, MAX_RESULT_TTL + 1, 99_999_999_999_999_999),
    "prefetch": (1, 0, MAX_PREFETCH, MAX_PREFETCH + 1),
    "min_replicas": (0, -1, MAX_COUNT, MAX_COUNT + 1),
}


def test_every_numeric_field_has_its_edges() -> None:
    numeric = {name for name, value in vars(Settings()).items() if not isinstance(value, bool)}
    assert set(EDGES) == numeric


@st.composite
def edge_settings(draw: st.DrawFn) -> dict[str, Any]:
    fields = draw(st.lists(st.sampled_from(sorted(EDGES)), min_size=1, max_size=3, unique=True))
    kwargs = {field: draw(st.sampled_from(EDGES[field])) for field in fields}
    if kwargs.get("min_replicas", 0) > 0 and "replica_timeout" not in kwargs:
        # No replica will ever acknowledge: a WAIT of 1 ms returns short at once (the worker
        # logs it and goes on), where the default second would be waited out twice per task.
        kwargs["replica_timeout"] = 0.001
    return kwargs


def cli_args(kwargs: dict[str, Any]) -> list[str] | None:
    """`taskcustody worker` arguments setting `kwargs`, or None if one of them has no option."""
    flags = {
        p.name: max(p.opts, key=len)
        for p in main.commands["worker"].params
        if isinstance(p, click.Option)
    }
    args: list[str] = []
    for field, value in kwargs.items():
        if field not in flags or value is None:
            return None
        args += [flags[field], repr(value) if isinstance(value, float) else str(value)]
    return args


def refused_cleanly(
    url: str, keys: QueueKeys, kwargs: dict[str, Any], error: SettingsError
) -> None:
    """Settings refused `kwargs`, naming one of them; the CLI refuses them as a usage error
    before it takes anything."""
    assert set(error.fields) & set(kwargs) or "socket_timeout_margin" in error.fields, error
    args = cli_args(kwargs)
    if args is None:
        return
    client = redis.Redis.from_url(url)
    try:
        client.flushall()
        task_id = Producer(client, keys).enqueue({"n": 1})
        result = CliRunner().invoke(
            main, ["worker", "json:dumps", "--queue", keys.queue_name, "--redis-url", url, *args]
        )
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output, result.output
        errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and "--" in errors[0], result.output
        # nothing taken, nothing registered
        assert client.llen(keys.queue) == 1 and task_id.encode() in client.lindex(keys.queue, 0)
        assert client.zcard(keys.servers) == 0
    finally:
        client.close()


def commits_and_stores_its_result(url: str, keys: QueueKeys, chosen: Settings) -> None:
    """A server with `chosen` takes a task on the real server, commits it, stores its result;
    then heartbeats and sweeps (the lease's PX, the deadline's score)."""
    client = connect(url, chosen)
    try:
        client.flushall()
        task_id = Producer(client, keys).enqueue({"n": 21})
        server = Server(
            client,
            keys,
            "edge",
            lambda p: {"doubled": 2 * p["n"]},
            settings=chosen,
            clock=ManualClock(),
        )
        (runner,) = server.start()
        try:
            assert runner.run_once()
        finally:
            runner.close()
        assert int(client.get(keys.committed)) == 1
        assert client.llen(keys.queue) == 0
        if chosen.result_ttl:
            assert get_result(client, keys, task_id, timeout=0) == {"doubled": 42}
            assert 0 < client.ttl(keys.result(task_id)) <= chosen.result_ttl
        else:
            assert client.exists(keys.result(task_id)) == 0  # 0: no results stored
        server.heartbeat()
        server.periodic_sweep()
        server.deregister()
    finally:
        client.close()


def refused_cleanly_or_works(url: str, kwargs: dict[str, Any]) -> bool:
    """The property, for one choice of settings. Whether they were accepted."""
    keys = QueueKeys("edges")
    try:
        chosen = Settings(**kwargs)
    except SettingsError as error:
        refused_cleanly(url, keys, kwargs, error)
        return False
    commits_and_stores_its_result(url, keys, chosen)
    return True


@settings(max_examples=40)
@given(kwargs=edge_settings())
def test_settings_at_and_past_their_bounds_are_refused_cleanly_or_work_on_real_redis(
    real_redis: RedisServerProcess, kwargs: dict[str, Any]
) -> None:
    accepted = refused_cleanly_or_works(real_redis.url, kwargs)
    event("accepted: committed on the real server" if accepted else "refused cleanly")


AT_THE_BOUNDS: list[dict[str, Any]] = [
    {"result_ttl": MAX_RESULT_TTL},
    {"block_timeout": MAX_SOCKET_TIMEOUT - 3.0, "registry_grace": 0},
    {"prefetch": MAX_PREFETCH},
    {"max_attempts": MAX_COUNT, "max_recoveries": MAX_COUNT, "drain_chunk": MAX_COUNT},
    {"min_replicas": MAX_COUNT, "replica_timeout": 0.001},
    {"server_ttl": MAX_SECONDS, "sweep_interval": MAX_SECONDS, "shutdown_grace": MAX_SECONDS},
    {
        "sweep_lease_ttl": MAX_SECONDS,
        "oom_log_interval": MAX_SECONDS,
        "retry_backoff_max": MAX_SECONDS,
    },
]
PAST_THE_BOUNDS: list[dict[str, Any]] = [
    {"result_ttl": MAX_RESULT_TTL + 1},
    {"block_timeout": MAX_SOCKET_TIMEOUT - 2.999, "registry_grace": 0},
    {"prefetch": MAX_PREFETCH + 1},
    {"max_attempts": MAX_COUNT + 1, "min_replicas": MAX_COUNT + 1},
    {"server_ttl": PAST_MAX},
]


@pytest.mark.parametrize("kwargs", AT_THE_BOUNDS)
def test_a_worker_at_a_bound_commits_on_real_redis(
    real_redis: RedisServerProcess, kwargs: dict[str, Any]
) -> None:
    """Examples the property meets whatever Hypothesis draws: each bound itself is accepted and
    works."""
    assert refused_cleanly_or_works(real_redis.url, kwargs)


@pytest.mark.parametrize("kwargs", PAST_THE_BOUNDS)
def test_one_past_a_bound_is_refused_cleanly(
    real_redis: RedisServerProcess, kwargs: dict[str, Any]
) -> None:
    assert not refused_cleanly_or_works(real_redis.url, kwargs)
