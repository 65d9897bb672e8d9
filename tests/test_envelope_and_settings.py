"""The task envelope and the settings' constraints, exactly: found by the mutation gate
(mutation/), these pin the messages and boundaries that the custody tests pass through without
looking at."""

from __future__ import annotations

import json

import pytest

from taskcustody import MalformedTask, Settings
from taskcustody.envelope import decode, encode, new_task


def test_new_task_round_trips() -> None:
    task = new_task({"n": 1}, 12.5, task_id="t1")
    assert task.raw == b'{"id":"t1","payload":{"n":1},"attempts":0,"enqueued_at":12.5}'
    assert encode(task) == task.raw
    assert decode(task.raw) == task
    again = task.retried()
    assert (again.id, again.attempts, again.payload, again.enqueued_at) == ("t1", 1, {"n": 1}, 12.5)
    assert json.loads(again.raw)["attempts"] == 1
    assert len(new_task(None, 0.0).id) == 32  # a uuid4 hex id when none is given


def test_encode_refuses_what_json_cannot_carry() -> None:
    with pytest.raises(ValueError, match="payload is not JSON-serialisable: "):
        new_task({1, 2}, 0.0)
    with pytest.raises(ValueError, match="payload is not JSON-serialisable: "):
        new_task(float("nan"), 0.0)


def test_decode_defaults() -> None:
    task = decode(b'{"id": "x"}')
    assert (task.id, task.payload, task.attempts, task.enqueued_at) == ("x", None, 0, 0.0)
    assert isinstance(task.enqueued_at, float)
    assert decode(b'{"id": "x", "enqueued_at": 3}').enqueued_at == 3.0


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\xff", "not JSON: "),
        (b"{not json", "not JSON: "),
        (b"[1, 2]", "not a JSON object"),
        (b'{"payload": 1}', "no id"),
        (b'{"id": ""}', "no id"),
        (b'{"id": 7}', "no id"),
        (b'{"id": "x", "attempts": "1"}', "bad attempts or enqueued_at"),
        (b'{"id": "x", "enqueued_at": "now"}', "bad attempts or enqueued_at"),
    ],
)
def test_decode_names_what_is_wrong(raw: bytes, reason: str) -> None:
    with pytest.raises(MalformedTask) as info:
        decode(raw)
    assert info.value.raw == raw
    assert info.value.reason.startswith(reason)
    assert str(info.value) == f"malformed task envelope ({info.value.reason}): {raw[:80]!r}"


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
