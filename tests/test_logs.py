"""Logs: the start banner, one line per retry, dead letter, lost custody, poison
pill and recovered task (each with the task id, also as the JSON line's `task_id` field), and the
CLI's --log-level / --log-format."""

from __future__ import annotations

import json
import logging
import sys

import pytest
import redis

from taskcustody import ManualClock, Producer, QueueKeys, Settings, connect
from taskcustody.core.envelope import encode, new_task
from taskcustody.core.keys import ListOwner
from taskcustody.core.recovery import Recovering, drain_inflight
from taskcustody.core.server import Server
from taskcustody.ops.logs import JsonFormatter, client_url, configure, redact_url
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import make_server
from tests.support.redis_server import RedisServerProcess, free_port


def lines(caplog: pytest.LogCaptureFixture, logger: str, level: int | None = None) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == logger and (level is None or r.levelno == level)
    ]


def with_task_id(caplog: pytest.LogCaptureFixture, task_id: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "task_id", None) == task_id]


# -- the banner ----------------------------------------------------------------------------------


def test_the_banner_names_queue_id_incarnation_workers_prefetch_redis_and_url(
    real_redis: RedisServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    client = connect(real_redis.url, TEST_SETTINGS)
    client.flushall()
    keys = QueueKeys("banner")
    settings = Settings(**{**vars(TEST_SETTINGS), "prefetch": 2})
    server = make_server(client, keys, "s1", ManualClock(), workers=3, settings=settings)
    with caplog.at_level(logging.INFO, logger="taskcustody"):
        workers = server.start()
    for w in workers:
        w.close()
    version = client.info("server")["redis_version"]
    assert lines(caplog, "taskcustody.server", logging.INFO) == [
        f"started: queue banner, server id s1, incarnation {server.incarnation}, 3 worker(s), "
        f"prefetch 2, Redis {version} at redis://127.0.0.1:{real_redis.port}/0, shutdown grace "
        "30s"
    ]
    (banner,) = [r for r in caplog.records if r.name == "taskcustody.server"]
    assert banner.redis_version == version and banner.server_id == "s1"  # type: ignore[attr-defined]


def test_a_url_in_a_log_line_never_shows_the_password() -> None:
    assert redact_url("redis://:s3cret@h:6380/2") == "redis://:***@h:6380/2"
    assert redact_url("rediss://alice:s3cret@[::1]:6380/0") == "rediss://alice:***@[::1]:6380/0"
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"
    # No connection is made: the client's own settings are read.
    client = redis.Redis.from_url("redis://alice:s3cret@db.example:6380/4")
    assert client_url(client) == "redis://alice:***@db.example:6380/4"
    assert "s3cret" not in client_url(redis.Redis.from_url("redis://:s3cret@h/0"))
    assert client_url(redis.Redis(unix_socket_path="/run/r.sock")) == "unix:///run/r.sock?db=0"


# -- per task: retry, dead letter, lost custody, recovery ----------------------------------------


def fail(payload: object) -> None:
    raise RuntimeError(f"boom {payload}")


def test_a_retry_and_a_dead_letter_each_log_one_line_with_the_task_id(
    backend: Backend, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    client = backend.client()
    task_id = Producer(client, keys).enqueue("x")
    (worker,) = make_server(client, keys, "s1", ManualClock(), fail).start()
    with caplog.at_level(logging.INFO, logger="taskcustody"):
        for _ in range(TEST_SETTINGS.max_attempts):
            assert worker.run_once(timeout=0.05)
    worker.close()
    assert lines(caplog, "taskcustody.worker") == [
        f"task {task_id} failed (attempt 1 of 3), requeued for a retry: RuntimeError: boom x",
        f"task {task_id} failed (attempt 2 of 3), requeued for a retry: RuntimeError: boom x",
        f"task {task_id} dead-lettered: RuntimeError: boom x",
    ]
    assert [r.levelno for r in with_task_id(caplog, task_id)] == [
        logging.WARNING,
        logging.WARNING,
        logging.ERROR,
    ]


def test_a_delayed_retry_says_it_was_scheduled(
    backend: Backend, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    client = backend.client()
    task_id = Producer(client, keys).enqueue("x")
    settings = Settings(**{**vars(TEST_SETTINGS), "retry_backoff": 2.0})
    (worker,) = make_server(client, keys, "s1", ManualClock(), fail, settings=settings).start()
    with caplog.at_level(logging.INFO, logger="taskcustody"):
        assert worker.run_once(timeout=0.05)
    worker.close()
    assert lines(caplog, "taskcustody.worker") == [
        f"task {task_id} failed (attempt 1 of 3), scheduled for a retry after its backoff: "
        "RuntimeError: boom x"
    ]
    assert client.zcard(keys.scheduled) == 1


def test_a_commit_is_logged_at_debug_only(
    backend: Backend, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    client = backend.client()
    task_id = Producer(client, keys).enqueue("ok")
    (worker,) = make_server(client, keys, "s1", ManualClock()).start()
    with caplog.at_level(logging.INFO, logger="taskcustody"):
        assert worker.run_once(timeout=0.05)
    assert with_task_id(caplog, task_id) == []
    Producer(client, keys).enqueue("ok")
    with caplog.at_level(logging.DEBUG, logger="taskcustody"):
        assert worker.run_once(timeout=0.05)
    worker.close()
    assert [
        r.getMessage().split(" committed")[1]
        for r in caplog.records
        if getattr(r, "action", None) == "committed"
    ] == [f" by {worker.list_key}"]


def test_lost_custody_and_the_startup_drain_each_log_one_line_with_the_task_id(
    backend: Backend, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    client = backend.client()
    task_id = Producer(client, keys).enqueue("slow")
    holder: list[str] = []

    def judged_dead_meanwhile(payload: object) -> str:
        # While the handler runs, recovery takes the task back (as if we had been judged dead).
        drain_inflight(client, keys, holder[0], force=True)
        return "late"

    (worker,) = make_server(client, keys, "s1", ManualClock(), judged_dead_meanwhile).start()
    holder.append(worker.list_key)
    with caplog.at_level(logging.INFO, logger="taskcustody"):
        assert worker.run_once(timeout=0.05)
    worker.close()
    assert [(r.name, r.levelno, r.getMessage()) for r in with_task_id(caplog, task_id)] == [
        (
            "taskcustody.recovery",
            logging.INFO,
            f"recovery (startup drain): task {task_id} moved from {worker.list_key} to the queue",
        ),
        (
            "taskcustody.worker",
            logging.WARNING,
            f"task {task_id}: lost custody in {worker.list_key} (judged dead meanwhile: recovery "
            "took it back): this run's result is not committed",
        ),
    ]


def test_the_sweep_logs_each_task_it_requeues_from_a_dead_server(
    backend: Backend, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    client = backend.client()
    clock = ManualClock()
    dead = make_server(client, keys, "dead", clock, workers=1)
    (w,) = dead.start()
    w.close()
    ids = Producer(client, keys).enqueue_many(["a", "b", "c", "d"])
    # The dead server took all four into its list (one chunk of 3, then 1: drain_chunk is 3).
    for _ in ids:
        client.lmove(keys.queue, w.list_key, "RIGHT", "LEFT")
    clock.advance(TEST_SETTINGS.server_ttl + 1)
    live = make_server(client, keys, "live", clock)
    live.claim()
    with caplog.at_level(logging.INFO, logger="taskcustody"):
        report = live.sweep()
    assert report.moved == 4
    # Recovery counts (poison-pill detection), so what it takes back goes to the suspects list.
    where = keys.suspects if live.settings.max_recoveries is not None else "the queue"
    assert lines(caplog, "taskcustody.recovery") == [
        f"recovery (sweep): task {i} moved from {w.list_key} to {where}" for i in ids
    ]


def test_a_poison_pill_line_carries_the_task_id_field(
    real_redis: RedisServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    client = connect(real_redis.url, TEST_SETTINGS)
    client.flushall()
    keys = QueueKeys("pills")
    owner = ListOwner("gone", 7, "w0")
    task = new_task("kills its holder", 0.0)
    client.lpush(keys.inflight(owner), encode(task))
    with caplog.at_level(logging.INFO, logger="taskcustody"):
        drain_inflight(
            client, keys, keys.inflight(owner), force=True, recovering=Recovering(max_recoveries=0)
        )
    (record,) = with_task_id(caplog, task.id)
    assert record.levelno == logging.ERROR and record.getMessage().startswith(
        f"poison pill: task {task.id} dead-lettered from {keys.inflight(owner)}"
    )


def test_without_info_logging_a_drain_reads_nothing_extra(
    backend: Backend, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    client = backend.client()
    owner = ListOwner("gone", 7, "w0")
    client.lpush(keys.inflight(owner), encode(new_task("x", 0.0)))
    calls: list[str] = []
    real_lrange = client.lrange

    def lrange(*args: object) -> object:
        calls.append("lrange")
        return real_lrange(*args)  # type: ignore[arg-type]

    client.lrange = lrange  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="taskcustody"):
        assert drain_inflight(client, keys, keys.inflight(owner), force=True) == 1
    assert calls == []


def test_prefetching_workers_log_retries_too(
    backend: Backend, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    client = backend.client()
    ids = Producer(client, keys).enqueue_many(["p", "q"])
    settings = Settings(**{**vars(TEST_SETTINGS), "prefetch": 2})
    server = Server(client, keys, "s1", fail, workers=1, settings=settings, clock=ManualClock())
    (runner,) = server.start()
    with caplog.at_level(logging.INFO, logger="taskcustody"):
        while runner.run_once(timeout=0.05) and len(lines(caplog, "taskcustody.worker")) < 2:
            pass
    runner.close()
    got = lines(caplog, "taskcustody.worker")
    assert sorted(got) == sorted(
        f"task {i} failed (attempt 1 of 3), requeued for a retry: RuntimeError: boom {p}"
        for i, p in zip(ids, ["p", "q"], strict=True)
    )


# -- formats ---------------------------------------------------------------------------------


def test_the_json_format_is_one_object_per_line_with_the_extra_fields() -> None:
    record = logging.LogRecord(
        "taskcustody.worker", logging.WARNING, __file__, 1, "task %s failed", ("abc",), None
    )
    record.task_id = "abc"
    out = json.loads(JsonFormatter().format(record))
    assert out["message"] == "task abc failed" and out["task_id"] == "abc"
    assert out["level"] == "warning" and out["logger"] == "taskcustody.worker"
    assert out["time"].endswith("+00:00")
    try:
        raise ValueError("inside")
    except ValueError:
        record.exc_info = sys.exc_info()
    assert "ValueError: inside" in json.loads(JsonFormatter().format(record))["exc"]


def test_configure_replaces_the_root_handlers_and_checks_its_arguments() -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        handler = configure("warning", "json")
        assert root.handlers == [handler] and root.level == logging.WARNING
        assert isinstance(handler.formatter, JsonFormatter)
        with pytest.raises(ValueError, match="log level"):
            configure("loud")
        with pytest.raises(ValueError, match="log format"):
            configure("info", "xml")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


class Interrupt(BaseException):
    """What a SIGINT or a thread's death looks like to a handler: not an Exception."""


def test_an_interrupted_batch_logs_the_task_it_ran_and_the_one_it_never_reached(
    backend: Backend, keys: QueueKeys, caplog: pytest.LogCaptureFixture
) -> None:
    client = backend.client()
    first, second = Producer(client, keys).enqueue_many(["p", "q"])

    def interrupted(payload: object) -> None:
        raise Interrupt

    settings = Settings(**{**vars(TEST_SETTINGS), "prefetch": 2})
    server = Server(
        client, keys, "s1", interrupted, workers=1, settings=settings, clock=ManualClock()
    )
    (runner,) = server.start()
    with caplog.at_level(logging.INFO, logger="taskcustody"), pytest.raises(Interrupt):
        runner.run_once(timeout=0.05)
    runner.close()
    assert lines(caplog, "taskcustody.worker") == [
        f"task {first} failed (attempt 1 of 3), requeued for a retry: worker interrupted",
        f"task {second} requeued as it was: not run: the worker stopped before it reached this "
        "task",
    ]


def test_the_worker_command_leaves_no_logging_behind_when_invoked_in_process() -> None:
    from click.testing import CliRunner

    from taskcustody.cli.app import main

    root = logging.getLogger()
    before = root.handlers[:], root.level
    # Fails at once (nothing listens on that port), after the command configured its logging.
    result = CliRunner().invoke(
        main,
        [
            "worker",
            "json:dumps",
            "-q",
            "q",
            "--redis-url",
            f"redis://127.0.0.1:{free_port()}/0",
            "--log-level",
            "debug",
        ],
    )
    assert result.exit_code == 1
    assert (root.handlers[:], root.level) == before
