"""wire.Template: the bytes of a command packed once are the bytes redis-py packs for it, and the
worker's release templates change at exactly the positions that change from task to task."""

from __future__ import annotations

import fakeredis
import pytest
import redis

from taskcustody import ManualClock, QueueKeys, Settings, connect_fake
from taskcustody.core import wire
from taskcustody.core.custody import RELEASE_AND_TAKE_CHANGING, RELEASE_CHANGING
from taskcustody.core.worker import Worker
from tests.helpers import make_server


def redis_py_bytes(*args: object) -> bytes:
    """What redis-py sends (with hiredis's packer where it is installed, else its own)."""
    return b"".join(redis.connection.Connection().pack_command(*args))


@pytest.mark.parametrize(
    "args",
    [
        ("EVALSHA", "f" * 40, 2, "k1", "k2", b"raw \x00\xff", "id", 3600, 1.5, ""),
        ("PING",),
        ("SET", "k", "v\r\nwith a newline", "EX", 10),
        ("ZADD", "z", repr(12.25), "member"),
    ],
)
def test_a_template_packs_the_bytes_redis_py_packs(args: tuple[object, ...]) -> None:
    for changing in (set(), {len(args) - 1}, set(range(len(args)))):
        assert wire.Template(args, changing).pack(args) == redis_py_bytes(*args)


def test_a_template_packs_only_the_changing_positions_anew() -> None:
    template = wire.Template(("EVALSHA", "sha", 1, "key", "first"), changing={4})
    assert template.pack(("EVALSHA", "sha", 1, "key", b"second")) == redis_py_bytes(
        "EVALSHA", "sha", 1, "key", b"second"
    )


def test_a_template_refuses_the_wrong_number_of_arguments_and_a_bool() -> None:
    template = wire.Template(("GET", "k"), changing={1})
    with pytest.raises(ValueError):
        template.pack(("GET",))
    with pytest.raises(TypeError):
        wire.bulk(True)


def _worker(settings: Settings) -> Worker:
    client = connect_fake(fakeredis.FakeServer())
    server = make_server(
        client, QueueKeys("tq", prefix="test"), "s1", ManualClock(), settings=settings
    )
    server.claim()
    return server.make_worker(0)


def _changed(a: tuple[object, ...], b: tuple[object, ...]) -> set[int]:
    assert len(a) == len(b)
    return {i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y}


def test_the_release_changes_at_exactly_the_positions_its_template_packs_anew() -> None:
    worker = _worker(Settings(retry_backoff=1.0))
    first = worker.release_args(b"raw-1", "id-1", "ok", "result")
    second = worker.release_args(b"raw-2", "id-2", "later", '{"attempts": 2}')
    assert _changed(first, second) == RELEASE_CHANGING


def test_the_composite_step_changes_at_exactly_the_positions_its_template_packs_anew() -> None:
    worker = _worker(Settings(retry_backoff=1.0))
    sent: list[tuple[object, ...]] = []

    def capture(*args: object, **kwargs: object) -> list[object]:
        sent.append(args)
        return [1, 0, 0]

    worker._call = capture  # type: ignore[method-assign]
    worker._release_and_take_raw(b"raw-1", "id-1", "ok", "result", ("queue", "rec 1", "1.0"))
    worker._release_and_take_raw(
        b"raw-2", "id-2", "later", '{"attempts": 2}', ("suspect", "rec 2", "2.0")
    )
    (a, b) = (args[2:] for args in sent)  # after EVALSHA and the hash
    assert _changed(a, b) == RELEASE_AND_TAKE_CHANGING
    assert len(a) == 1 + 11 + 10  # numkeys, 11 keys, 10 argv
