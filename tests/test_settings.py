"""Settings: the defaults, and the constraints checked at construction, with their exact messages
and boundary values (the smallest valid value of each is accepted, the next step down refused)."""

from __future__ import annotations

import dataclasses
import math
import re
import subprocess
import sys
from typing import Any

import pytest

from taskcustody import Settings, SettingsError
from taskcustody.core.scripts import MAX_RESULT_TTL
from taskcustody.core.settings import MAX_COUNT, MAX_PREFETCH, MAX_SECONDS, MAX_SOCKET_TIMEOUT


def test_settings_defaults() -> None:
    s = Settings()
    assert (
        s.block_timeout,
        s.socket_timeout_margin,
        s.heartbeat_interval,
        s.server_ttl,
        s.sweep_interval,
        s.max_attempts,
        s.drain_chunk,
        s.result_ttl,
        s.shutdown_grace,
        s.track_commits,
    ) == (2.0, 3.0, 5.0, 15.0, 10.0, 3, 100, 86_400, 30.0, False)
    assert s.socket_timeout == 5.0
    assert (s.min_replicas, s.replica_timeout, s.replica_timeout_ms) == (0, 1.0, 1000)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"block_timeout": 0}, "block_timeout must be > 0"),
        ({"block_timeout": -1}, "block_timeout must be > 0"),
        ({"socket_timeout_margin": 0}, "socket_timeout_margin must be > 0"),
        ({"server_ttl": 5, "heartbeat_interval": 5}, "server_ttl must exceed heartbeat_interval"),
        ({"max_attempts": 0}, "max_attempts must be >= 1"),
        ({"drain_chunk": 0}, "drain_chunk must be >= 1"),
        ({"min_replicas": -1}, "min_replicas must be >= 0"),
        ({"replica_timeout": 0}, "replica_timeout must be > 0"),
        (
            {"min_replicas": 1, "replica_timeout": 5.0},
            "replica_timeout must be shorter than the socket timeout",
        ),
        (
            {
                "min_replicas": 1,
                "replica_timeout": 2.5,
                "block_timeout": 1,
                "socket_timeout_margin": 1.5,
            },
            r"shorter than the socket timeout \(block_timeout \+ socket_timeout_margin = 2.5 s\)",
        ),
    ],
)
def test_settings_refuse(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_timeout": 0.001},
        {"socket_timeout_margin": 0.001},
        {"server_ttl": 5.001, "heartbeat_interval": 5},
        {"max_attempts": 1},
        {"drain_chunk": 1},
        {"min_replicas": 0},
        {"min_replicas": 1, "replica_timeout": 4.999},
        # Without min_replicas no WAIT is sent: the timeout need not fit the socket's.
        {"min_replicas": 0, "replica_timeout": 60.0},
    ],
)
def test_settings_accept_the_boundaries(kwargs: dict[str, float]) -> None:
    Settings(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("seconds", "ms"), [(1.0, 1000), (0.05, 50), (0.0004, 1), (0.0015, 2)])
def test_replica_timeout_is_sent_in_whole_milliseconds_never_0(seconds: float, ms: int) -> None:
    # WAIT's timeout is in milliseconds, and 0 would block forever.
    assert Settings(replica_timeout=seconds).replica_timeout_ms == ms


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"block_timeout": 0}, r"^block_timeout must be > 0 \(0 would block forever\)$"),
        ({"block_timeout": -1.0}, r"^block_timeout must be > 0 \(0 would block forever\)$"),
        ({"socket_timeout_margin": 0}, r"^socket_timeout_margin must be > 0$"),
        (
            {"heartbeat_interval": 5.0, "server_ttl": 5.0},
            r"^server_ttl must exceed heartbeat_interval$",
        ),
        ({"max_attempts": 0}, r"^max_attempts must be >= 1$"),
        ({"prefetch": 0}, r"^prefetch must be >= 1$"),
        ({"drain_chunk": 0}, r"^drain_chunk must be >= 1$"),
    ],
)
def test_settings_reject_bad_values_with_exact_messages(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Settings(**overrides)


def test_settings_accept_the_smallest_valid_values() -> None:
    s = Settings(
        block_timeout=0.001,
        socket_timeout_margin=0.001,
        heartbeat_interval=5.0,
        server_ttl=5.001,
        max_attempts=1,
        prefetch=1,
        drain_chunk=1,
    )
    assert s.socket_timeout == pytest.approx(0.002)


# -- the bounds of what Redis, a socket and the scripts accept -----------------------------------

DURATIONS = (
    "block_timeout",
    "socket_timeout_margin",
    "heartbeat_interval",
    "server_ttl",
    "sweep_interval",
    "sweep_lease_ttl",
    "retry_backoff",
    "retry_backoff_max",
    "shutdown_grace",
    "registry_grace",
    "oom_log_interval",
    "replica_timeout",
)
COUNTS = ("max_attempts", "max_recoveries", "drain_chunk", "result_ttl", "prefetch", "min_replicas")


def test_the_numeric_fields_are_the_durations_and_the_counts() -> None:
    """A numeric field added to Settings must be bounded here too."""
    numeric = {
        f.name
        for f in dataclasses.fields(Settings)
        if not isinstance(getattr(Settings(), f.name), bool)
    }
    assert numeric == set(DURATIONS) | set(COUNTS)


@pytest.mark.parametrize("field", DURATIONS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "2", None, True])
def test_a_duration_that_is_not_a_finite_number_is_refused_naming_the_field(
    field: str, value: object
) -> None:
    if value is None and field == "sweep_lease_ttl":
        return  # None: the default lease of 3 sweep periods
    with pytest.raises(SettingsError, match=rf"^{field} must be a finite number of seconds") as e:
        Settings(**{field: value})
    assert e.value.fields == (field,)


@pytest.mark.parametrize("field", COUNTS)
@pytest.mark.parametrize("value", [1.5, 2.0, math.nan, "3", True])
def test_a_count_that_is_not_a_whole_number_is_refused_naming_the_field(
    field: str, value: object
) -> None:
    with pytest.raises(SettingsError, match=rf"^{field} must be a whole number"):
        Settings(**{field: value})


#: What the other fields must be for a duration to reach MAX_SECONDS.
AT_MAX_SECONDS: dict[str, dict[str, Any]] = {
    "block_timeout": {"socket_timeout_margin": 0.5, "registry_grace": 0},
    "socket_timeout_margin": {"block_timeout": 0.5, "registry_grace": 0},
    "heartbeat_interval": {},
    "server_ttl": {},
    "sweep_interval": {},
    "sweep_lease_ttl": {},
    "retry_backoff": {"retry_backoff_max": MAX_SECONDS},
    "retry_backoff_max": {},
    "shutdown_grace": {},
    "registry_grace": {},
    "oom_log_interval": {},
    "replica_timeout": {},
}


@pytest.mark.parametrize("field", DURATIONS)
def test_no_duration_may_exceed_what_a_socket_or_a_thread_can_wait(field: str) -> None:
    others = AT_MAX_SECONDS[field]
    if field == "heartbeat_interval":
        # server_ttl must exceed it and may not exceed MAX_SECONDS itself: the largest
        # heartbeat is just under the bound
        Settings(heartbeat_interval=MAX_SECONDS - 1, server_ttl=MAX_SECONDS)
    elif field in ("block_timeout", "socket_timeout_margin"):
        Settings(**{field: MAX_SOCKET_TIMEOUT - 0.5}, **others)
    else:
        Settings(**{field: MAX_SECONDS}, **others)
    with pytest.raises(SettingsError, match=rf"^{field} must be at most 2147483 s "):
        Settings(**{field: MAX_SECONDS + 0.001}, **others)


def test_the_socket_timeout_may_not_exceed_the_longest_wait_of_poll() -> None:
    at = Settings(block_timeout=MAX_SOCKET_TIMEOUT - 3.0, registry_grace=0)
    assert at.socket_timeout == MAX_SOCKET_TIMEOUT == 2_147_483.0
    with pytest.raises(SettingsError) as e:
        Settings(block_timeout=MAX_SOCKET_TIMEOUT - 2.999, registry_grace=0)
    assert str(e.value).startswith(
        "block_timeout + socket_timeout_margin (the socket timeout, 2147483.001 s) must be at "
        "most 2147483 s"
    )
    assert e.value.fields == ("block_timeout", "socket_timeout_margin")


def test_the_reported_block_timeout_is_refused_for_the_socket_before_the_grace() -> None:
    """`--block-timeout 1e9` was refused for the registry grace, a consequence; the cause is
    that no socket waits that long."""
    with pytest.raises(SettingsError, match=r"^block_timeout must be at most 2147483 s"):
        Settings(block_timeout=1e9)


@pytest.mark.skipif(sys.platform != "linux", reason="poll(2)'s int timeout, as seen on Linux")
def test_a_socket_timeout_past_the_bound_wraps_around_in_python() -> None:
    """Why MAX_SOCKET_TIMEOUT: CPython accepts a longer socket timeout and then passes poll(2) its
    milliseconds cast to a C int, which wraps: 2**32 ms + 1 ms waits 1 ms. (A subprocess, so
    that a Python that fixed this blocks there, not here: the test then fails at its timeout and
    the bound may be relaxed.)"""
    code = (
        "import socket\n"
        "a, b = socket.socketpair()\n"
        f"a.settimeout({(2**32 + 1) / 1000!r})\n"
        "try:\n    a.recv(1)\nexcept TimeoutError:\n    print('fired at once')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "fired at once", out


def test_result_ttl_is_refused_past_what_redis_set_ex_accepts() -> None:
    assert Settings(result_ttl=MAX_RESULT_TTL).result_ttl == 10**15
    assert Settings(result_ttl=0).result_ttl == 0  # no results
    with pytest.raises(SettingsError, match=r"^result_ttl must be at most 1000000000000000 s"):
        Settings(result_ttl=MAX_RESULT_TTL + 1)
    # the value of the report: Redis refuses its EX ("invalid expire time in 'set' command")
    with pytest.raises(SettingsError, match=r"^result_ttl must be at most"):
        Settings(result_ttl=99_999_999_999_999_999)


@pytest.mark.parametrize("field", ["max_attempts", "max_recoveries", "drain_chunk", "min_replicas"])
def test_a_count_may_not_exceed_what_a_lua_number_holds_exactly(field: str) -> None:
    assert getattr(Settings(**{field: MAX_COUNT}), field) == 2**53
    with pytest.raises(SettingsError, match=rf"^{field} must be at most 2\*\*53"):
        Settings(**{field: MAX_COUNT + 1})


def test_prefetch_is_bounded() -> None:
    assert Settings(prefetch=MAX_PREFETCH).prefetch == 1000
    with pytest.raises(SettingsError, match=r"^prefetch must be at most 1000"):
        Settings(prefetch=MAX_PREFETCH + 1)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"heartbeat_interval": 0}, "heartbeat_interval must be > 0"),
        ({"sweep_interval": 0}, "sweep_interval must be > 0"),
        ({"shutdown_grace": -1}, "shutdown_grace must be >= 0"),
        ({"registry_grace": -1}, "registry_grace must be >= 0"),
        (
            {"retry_backoff": 2, "retry_backoff_max": 1},
            "retry_backoff_max must be >= retry_backoff",
        ),
    ],
)
def test_the_lower_bounds_nothing_checked_before(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=rf"^{re.escape(message)}"):
        Settings(**overrides)


def test_a_settings_error_is_a_value_error_that_names_its_fields() -> None:
    with pytest.raises(ValueError) as e:
        Settings(server_ttl=5, heartbeat_interval=5)
    error = e.value
    assert isinstance(error, SettingsError)
    assert error.fields == ("server_ttl", "heartbeat_interval")
    assert str(error) == "server_ttl must exceed heartbeat_interval"
    assert (
        error.render({"server_ttl": "--server-ttl", "heartbeat_interval": "--heartbeat-interval"})
        == "--server-ttl must exceed --heartbeat-interval"
    )
    # a field left out keeps its name; values are not fields
    refused = SettingsError("{a} is {b} ({n} s)", n="3")
    assert refused.fields == ("a", "b")
    assert refused.render({"a": "--a"}) == "--a is b (3 s)"
