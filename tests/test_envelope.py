"""The task envelope: its exact bytes, the round trip through encode and decode, a retry's
re-encoding, what JSON cannot carry, and the error that names what is wrong with a malformed one
(its reason and its first 80 bytes)."""

from __future__ import annotations

import json

import pytest

from taskcustody import MalformedTask
from taskcustody.core.envelope import decode, encode, new_task


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


def test_malformed_task_message_shows_the_first_80_bytes() -> None:
    raw = bytes(range(65, 65 + 26)) * 4  # 104 bytes, not JSON
    exc = MalformedTask(raw, "why")
    assert str(exc) == f"malformed task envelope (why): {raw[:80]!r}"
    assert (exc.raw, exc.reason) == (raw, "why")


def test_retried_bumps_attempts_and_reencodes() -> None:
    task = new_task({"k": [1]}, 12.5, "t1")
    again = task.retried()
    assert again.attempts == 1
    assert again.raw == b'{"id":"t1","payload":{"k":[1]},"attempts":1,"enqueued_at":12.5}'
    assert decode(again.raw) == again


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_encode_refuses_non_finite_numbers(value: float) -> None:
    with pytest.raises(ValueError, match=r"^payload is not JSON-serialisable: "):
        new_task({"x": value}, 0.0)
