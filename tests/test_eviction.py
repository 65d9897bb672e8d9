"""The eviction-policy check (real redis-server): allkeys-* refused with the fix named, noeviction
and volatile-* accepted, the override warned about once per process, and every CLI command that
talks to Redis refusing with one line and exit code 1."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner

from taskcustody import EvictingPolicy, ManualClock, QueueKeys, Settings, check_server, connect
from taskcustody.cli.app import main
from taskcustody.deploy import eviction
from tests.conftest import TEST_SETTINGS
from tests.helpers import make_server
from tests.support.redis_server import (
    RedisServerProcess,
    redis_server_binary,
    throwaway_redis_server,
)

pytestmark = pytest.mark.real_redis

EVICTION_LOG = "taskcustody.eviction"


@pytest.fixture(scope="module")
def policy_server() -> Iterator[RedisServerProcess]:
    """A server of this module's own: its policy is changed by the tests."""
    if redis_server_binary() is None:
        pytest.skip("no redis-server binary")
    with throwaway_redis_server("--maxmemory", "64mb") as server:
        yield server


@pytest.fixture
def fresh_guard(monkeypatch: pytest.MonkeyPatch) -> set[tuple[str, str]]:
    """A process that has warned about nothing yet (the guard is module-level on purpose)."""
    guard: set[tuple[str, str]] = set()
    monkeypatch.setattr(eviction, "_warned", guard)
    return guard


def with_policy(server: RedisServerProcess, policy: str) -> redis.Redis:
    client = connect(server.url, TEST_SETTINGS)
    client.flushall()
    client.config_set("maxmemory-policy", policy)
    return client


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == EVICTION_LOG and r.levelno == logging.WARNING
    ]


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random"])
def test_an_allkeys_policy_is_refused_naming_the_policy_and_the_fix(
    policy_server: RedisServerProcess,
    keys: QueueKeys,
    fresh_guard: set[tuple[str, str]],
    caplog: pytest.LogCaptureFixture,
    policy: str,
) -> None:
    client = with_policy(policy_server, policy)
    with (
        caplog.at_level(logging.INFO, logger=EVICTION_LOG),
        pytest.raises(EvictingPolicy) as refused,
    ):
        check_server(client, keys)
    message = str(refused.value)
    assert refused.value.policy == policy
    assert f"maxmemory-policy is {policy}" in message
    assert "CONFIG SET maxmemory-policy noeviction" in message
    assert "volatile-*" in message and "--allow-evicting-policy" in message
    assert "\n" not in message
    assert warnings_of(caplog) == []  # refused, not warned about


def test_a_server_refuses_to_start_on_an_allkeys_policy_before_claiming_anything(
    policy_server: RedisServerProcess, keys: QueueKeys, fresh_guard: set[tuple[str, str]]
) -> None:
    client = with_policy(policy_server, "allkeys-lru")
    server = make_server(client, keys, "s1", ManualClock())
    with pytest.raises(EvictingPolicy):
        server.start()
    assert server.incarnation is None and client.keys("*") == []


@pytest.mark.parametrize(
    "policy", ["noeviction", "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"]
)
def test_noeviction_and_volatile_policies_are_accepted_silently(
    policy_server: RedisServerProcess,
    keys: QueueKeys,
    fresh_guard: set[tuple[str, str]],
    caplog: pytest.LogCaptureFixture,
    policy: str,
) -> None:
    client = with_policy(policy_server, policy)
    with caplog.at_level(logging.INFO, logger=EVICTION_LOG):
        check_server(client, keys)
        assert eviction.check_eviction_policy(client) == policy
    assert warnings_of(caplog) == [] and fresh_guard == set()


def test_the_override_warns_once_per_process_across_checks_connections_and_servers(
    policy_server: RedisServerProcess,
    keys: QueueKeys,
    fresh_guard: set[tuple[str, str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = with_policy(policy_server, "allkeys-lru")
    allow = Settings(block_timeout=0.05, allow_evicting_policy=True)
    with caplog.at_level(logging.INFO, logger=EVICTION_LOG):
        for _ in range(3):  # three checks on one client
            check_server(client, keys, allow_evicting_policy=True)
        for _ in range(3):  # three fresh connections, as a CLI call or a new pool would have
            other = connect(policy_server.url, allow)
            check_server(other, keys, allow_evicting_policy=True)
            other.close()
        for n in range(2):  # and servers started in this process, each with its own workers
            server = make_server(client, keys, f"s{n}", ManualClock(), workers=2, settings=allow)
            for worker in server.start():
                worker.close()
            server.deregister()
    assert warnings_of(caplog) == [
        f"Redis at 127.0.0.1:{policy_server.port} has maxmemory-policy allkeys-lru: under "
        "memory pressure it may evict a queue or an in-flight list and lose tasks; going on "
        "because the evicting policy was allowed explicitly"
    ]

    # Another evicting policy on the same server is news: warned once more, then no more.
    caplog.clear()
    client.config_set("maxmemory-policy", "allkeys-lfu")
    with caplog.at_level(logging.INFO, logger=EVICTION_LOG):
        for _ in range(3):
            check_server(client, keys, allow_evicting_policy=True)
    assert len(warnings_of(caplog)) == 1 and "allkeys-lfu" in warnings_of(caplog)[0]
    client.config_set("maxmemory-policy", "noeviction")


def test_with_config_renamed_the_policy_is_read_from_info(
    keys: QueueKeys, fresh_guard: set[tuple[str, str]]
) -> None:
    """Managed Redis services often rename or forbid CONFIG; INFO memory still tells the policy."""
    if redis_server_binary() is None:
        pytest.skip("no redis-server binary")
    with throwaway_redis_server(
        "--maxmemory-policy", "allkeys-lru", "--rename-command", "CONFIG", ""
    ) as server:
        client = connect(server.url, TEST_SETTINGS)
        with pytest.raises(redis.ResponseError, match="unknown command"):
            client.config_get("maxmemory-policy")
        assert eviction.read_policy(client) == "allkeys-lru"
        with pytest.raises(EvictingPolicy, match="allkeys-lru"):
            check_server(client, keys)
        client.close()


def test_an_unreadable_policy_is_warned_about_once_and_not_refused(
    policy_server: RedisServerProcess,
    keys: QueueKeys,
    fresh_guard: set[tuple[str, str]],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = with_policy(policy_server, "allkeys-lru")  # which we cannot see

    def refuse(*args: object, **kwargs: object) -> None:
        raise redis.exceptions.NoPermissionError("NOPERM this user has no permissions")

    monkeypatch.setattr(client, "config_get", refuse)
    real_info = client.info
    monkeypatch.setattr(
        client,
        "info",
        lambda section=None, *a, **k: refuse() if section == "memory" else real_info(section),
    )
    with caplog.at_level(logging.INFO, logger=EVICTION_LOG):
        for _ in range(3):
            check_server(client, keys)
        assert eviction.check_eviction_policy(client) == eviction.UNREADABLE
    assert warnings_of(caplog) == [
        f"cannot read maxmemory-policy of Redis at 127.0.0.1:{policy_server.port} (CONFIG GET "
        "and INFO refused); taskcustody needs noeviction or a volatile-* policy: an allkeys-* "
        "policy may evict a queue or an in-flight list and lose tasks"
    ]
    client.config_set("maxmemory-policy", "noeviction")  # the real client still can


# -- the command line --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["worker", "tests.e2e_handler:handle", "--block-timeout", "0.05"],
        ["status"],
        ["enqueue", '{"n": 1}'],
        ["sweep"],
    ],
)
def test_every_cli_command_refuses_an_allkeys_policy_with_one_line_and_exit_1(
    policy_server: RedisServerProcess, fresh_guard: set[tuple[str, str]], command: list[str]
) -> None:
    client = with_policy(policy_server, "allkeys-lru")
    result = CliRunner().invoke(main, [*command, "-q", "tq", "--redis-url", policy_server.url])
    assert result.exit_code == 1, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("Error: Redis maxmemory-policy is allkeys-lru: ")
    assert "CONFIG SET maxmemory-policy noeviction" in line
    assert client.keys("*") == []  # nothing enqueued, claimed or swept
    client.config_set("maxmemory-policy", "noeviction")


@pytest.mark.parametrize("command", [["status"], ["enqueue", '{"n": 1}'], ["sweep"]])
def test_the_cli_override_goes_on(
    policy_server: RedisServerProcess, fresh_guard: set[tuple[str, str]], command: list[str]
) -> None:
    client = with_policy(policy_server, "allkeys-lru")
    result = CliRunner().invoke(
        main, [*command, "-q", "tq", "--redis-url", policy_server.url, "--allow-evicting-policy"]
    )
    assert result.exit_code == 0, result.output
    assert fresh_guard == {(f"127.0.0.1:{policy_server.port}", "allkeys-lru")}
    if command[0] == "enqueue":
        assert client.llen(QueueKeys("tq").queue) == 1
    client.config_set("maxmemory-policy", "noeviction")
