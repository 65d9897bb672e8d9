"""Settings: the defaults, and the constraints checked at construction, with their exact messages
and boundary values (the smallest valid value of each is accepted, the next step down refused)."""

from __future__ import annotations

from typing import Any

import pytest

from taskcustody import Settings


def test_settings_defaults() -> None:
    s = Settings()
    assert (s.block_timeout, s.socket_timeout_margin, s.heartbeat_interval, s.server_ttl,
            s.sweep_interval, s.max_attempts, s.drain_chunk, s.result_ttl, s.shutdown_grace,
            s.track_commits) == (2.0, 3.0, 5.0, 15.0, 10.0, 3, 100, 86_400, 30.0, False)
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
        ({"min_replicas": 1, "replica_timeout": 5.0},
         "replica_timeout must be shorter than the socket timeout"),
        ({"min_replicas": 1, "replica_timeout": 2.5, "block_timeout": 1,
          "socket_timeout_margin": 1.5},
         r"shorter than the socket timeout \(block_timeout \+ socket_timeout_margin = 2.5 s\)"),
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
        ({"heartbeat_interval": 5.0, "server_ttl": 5.0},
         r"^server_ttl must exceed heartbeat_interval$"),
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
    s = Settings(block_timeout=0.001, socket_timeout_margin=0.001, heartbeat_interval=5.0,
                 server_ttl=5.001, max_attempts=1, prefetch=1, drain_chunk=1)
    assert s.socket_timeout == pytest.approx(0.002)
