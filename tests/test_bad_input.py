"""Bad input gets a clear error and loses nothing."""

from __future__ import annotations

import base64

import pytest
import redis
from click.testing import CliRunner

from taskcustody import (
    InvalidName,
    ManualClock,
    Producer,
    QueueKeys,
    RedisTooOld,
    Server,
    Settings,
    WrongKeyType,
    check_server,
)
from taskcustody.cli.app import main
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import commits, dead_letters, ids_in, make_server


def test_old_redis_is_refused_naming_the_version(
    backend: Backend, keys: QueueKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = backend.client()
    monkeypatch.setattr(client, "info", lambda *a, **k: {"redis_version": "6.0.9"})
    with pytest.raises(RedisTooOld, match=r"6\.0\.9"):
        check_server(client, keys)
    with pytest.raises(RedisTooOld):
        make_server(client, keys, "s1", ManualClock()).start()


def test_malformed_envelope_is_dead_lettered_and_the_worker_carries_on(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    good = Producer(client, keys, clock).enqueue("fine")
    client.lpush(keys.queue, b"\xff not json", b'{"payload": "no id"}')
    (worker,) = make_server(client, keys, "s1", clock).start()
    handled = [worker.run_once(timeout=0.05) for _ in range(4)]
    assert handled == [True, False, False, False]  # the good one first (FIFO), then two bad
    assert commits(client, keys) == {good: 1}
    letters = dead_letters(client, keys)
    raws = sorted(base64.b64decode(d["raw"]) for d in letters)
    assert raws == sorted([b"\xff not json", b'{"payload": "no id"}'])
    assert all(d["error"] for d in letters)
    assert client.llen(worker.list_key) == 0 and client.llen(keys.queue) == 0


def test_failing_handler_is_retried_then_dead_lettered_with_the_error(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue("x")
    calls = []

    def handler(payload: object) -> None:
        calls.append(payload)
        raise ValueError("bad payload x")

    (worker,) = make_server(client, keys, "s1", clock, handler).start()
    for _ in range(TEST_SETTINGS.max_attempts + 1):
        worker.run_once(timeout=0.05)
    assert len(calls) == TEST_SETTINGS.max_attempts
    (letter,) = dead_letters(client, keys)
    assert letter["task_id"] == task_id
    assert "ValueError: bad payload x" in letter["error"]
    assert commits(client, keys) == {}
    assert client.llen(keys.queue) == 0 and client.llen(worker.list_key) == 0


def test_key_of_wrong_type_is_named(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    client.set(keys.queue, "oops")
    with pytest.raises(WrongKeyType, match=r"queue.*string.*list"):
        check_server(client, keys)
    assert client.get(keys.queue) == b"oops"  # nothing overwritten


def test_wrong_type_at_take_time_is_named(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    (worker,) = make_server(client, keys, "s1", clock).start()
    client.set(keys.queue, "oops")
    with pytest.raises(WrongKeyType, match="queue"):
        worker.take(timeout=0.05)


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), 0.0, -1.0])
def test_a_take_timeout_that_is_not_a_positive_finite_number_is_refused_before_redis(
    backend: Backend, keys: QueueKeys, timeout: float
) -> None:
    client = backend.client()
    (worker,) = make_server(client, keys, "s1", ManualClock()).start()
    client.rpush(keys.queue, b"untouched")
    with pytest.raises(ValueError, match="take timeout must be a finite number > 0"):
        worker.take(timeout=timeout)
    assert client.lrange(keys.queue, 0, -1) == [b"untouched"]


def test_a_server_with_no_or_too_many_worker_threads_is_refused() -> None:
    for count in (0, 1025):
        with pytest.raises(ValueError, match="1 to 1024 worker threads"):
            Server(redis.Redis(), QueueKeys("q"), "s1", lambda payload: None, workers=count)


@pytest.mark.parametrize("name", ["has space", "a{b}", "a:b", ""])
def test_names_that_would_break_the_key_schema_are_refused(name: str) -> None:
    with pytest.raises(InvalidName):
        QueueKeys(name)


def test_unserialisable_payload_enqueues_nothing(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    with pytest.raises(ValueError, match="JSON"):
        Producer(client, keys).enqueue_many(["ok", {1, 2}])
    assert client.llen(keys.queue) == 0


def test_settings_refuse_a_socket_timeout_that_cannot_exceed_the_block() -> None:
    with pytest.raises(ValueError):
        Settings(block_timeout=0)
    with pytest.raises(ValueError):
        Settings(socket_timeout_margin=0)
    assert Settings(block_timeout=2).socket_timeout > 2


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["worker"],
        ["worker", "nomodule", "--queue", "q"],
        ["worker", "no_such_module_xyz:fn", "--queue", "q"],
        ["worker", "json:no_such_fn", "--queue", "q"],
        ["enqueue", "--queue", "q", "{not json"],
        ["enqueue", "--queue", "bad name", "1"],
        ["status"],
        ["sweep", "--queue", "q", "--bogus"],
    ],
)
def test_cli_misuse_is_a_usage_error(args: list[str]) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "Usage" in result.output or "Error" in result.output


@pytest.mark.parametrize("command", ["worker", "enqueue", "status", "sweep"])
def test_every_command_has_help(command: str) -> None:
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0 and "Usage" in result.output


def test_cli_roundtrip_on_real_redis(real_redis: object) -> None:
    url = real_redis.url  # type: ignore[attr-defined]
    redis.Redis.from_url(url).flushall()
    runner = CliRunner()
    out = runner.invoke(main, ["enqueue", "--queue", "cli", "--redis-url", url, '{"a": 1}', "2"])
    assert out.exit_code == 0, out.output
    ids = out.output.split()
    assert len(ids) == 2
    status = runner.invoke(main, ["status", "--queue", "cli", "--redis-url", url, "--json"])
    assert status.exit_code == 0 and '"depth": 2' in status.output
    sweep = runner.invoke(main, ["sweep", "--queue", "cli", "--redis-url", url])
    assert sweep.exit_code == 0 and "requeued 0" in sweep.output
    client = redis.Redis.from_url(url)
    assert sorted(ids_in(client, QueueKeys("cli").queue)) == sorted(ids)


def test_cli_reports_unreachable_redis_cleanly() -> None:
    from tests.support.redis_server import free_port

    result = CliRunner().invoke(
        main, ["status", "--queue", "q", "--redis-url", f"redis://127.0.0.1:{free_port()}/0"]
    )
    assert result.exit_code == 1
    assert "cannot reach Redis" in result.output


def test_unserialisable_result_still_releases_and_commits(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    task_id = Producer(client, keys, clock).enqueue("x")
    (worker,) = make_server(client, keys, "s1", clock, lambda p: {1, 2}).start()
    assert worker.run_once(timeout=0.05)
    assert commits(client, keys) == {task_id: 1}
    assert client.llen(worker.list_key) == 0
    assert b"unserialisable_result" in client.get(keys.result(task_id))
