"""`taskcustody enqueue -` streams stdin: however it stops (Ctrl-C, SIGTERM, a closed stdout, a bad
line), the ids it printed are exactly the tasks in Redis, and stderr says how many and the last.

On real Redis, the command a subprocess fed through a pipe the test controls. A signal lands
wherever the command happens to be (reading, pushing, printing): the claims hold wherever that
is, so that no outcome depends on timing.
"""

from __future__ import annotations

import re
import signal
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from taskcustody import Producer, QueueKeys, connect
from taskcustody.cli.app import main
from taskcustody.cli.enqueue import STREAM_BATCH
from taskcustody.core.envelope import decode
from tests.support.enqueue_command import (
    Feeder,
    Lines,
    enqueue_argv,
    payload_lines,
    running,
    start_enqueue,
)
from tests.support.redis_server import RedisServerProcess
from tests.support.worker_command import worker_env

pytestmark = pytest.mark.real_redis

#: Lines fed to a command that is stopped mid-way: far more than it prints before the test
#: stops it, far more than a pipe holds (64 KiB: about 2,000 ids).
FED = 20_000

ID = "[0-9a-f]{32}"


@pytest.fixture
def queue_name(real_redis: RedisServerProcess) -> Iterator[str]:
    name = f"stream-{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.Redis.from_url(real_redis.url)
    client.delete(QueueKeys(name).queue)
    client.close()


def queued(url: str, queue_name: str) -> list[tuple[str, object]]:
    """(id, payload) of every task in the queue, oldest first (LPUSH puts the newest at the
    head)."""
    client = connect(url)
    try:
        tasks = [decode(raw) for raw in client.lrange(QueueKeys(queue_name).queue, 0, -1)]
    finally:
        client.close()
    return [(task.id, task.payload) for task in reversed(tasks)]


def the_line(stderr: bytes, pattern: str) -> re.Match[str]:
    """stderr is exactly one line, and it matches `pattern`."""
    text = stderr.decode()
    assert "Traceback" not in text, text
    assert text.count("\n") == 1, text
    match = re.fullmatch(pattern, text.rstrip("\n"))
    assert match is not None, text
    return match


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_stream_leaves_exactly_the_printed_ids_in_the_queue(
    real_redis: RedisServerProcess, queue_name: str, signum: signal.Signals
) -> None:
    with running(start_enqueue(queue_name, real_redis.url)) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        # stdin stays open: the command can only end through the signal.
        feeder = Feeder(proc.stdin, payload_lines(0, FED), close=False)
        printed = Lines(proc.stdout)
        feeder.start()
        printed.start()
        printed.wait_for(1_000, "ids printed while stdin is open")
        proc.send_signal(signum)
        assert proc.wait(timeout=60) == 128 + signum
        printed.join(timeout=60)
        stderr = proc.stderr.read()

    in_queue = queued(real_redis.url, queue_name)
    assert printed.lines == [task_id for task_id, _ in in_queue]
    # The queue holds the input's first lines, in order: the rest is what is left to enqueue.
    assert [payload for _, payload in in_queue] == [{"n": n} for n in range(len(in_queue))]
    line = the_line(
        stderr,
        rf"Interrupted \({signum.name}\): (\d+) task\(s\) enqueued, the last "
        rf"({ID}) \(stdin line (\d+)\); nothing after it was enqueued",
    )
    assert int(line[1]) == len(in_queue) >= 1_000
    assert line[2] == printed.lines[-1]
    assert int(line[3]) == len(in_queue)


def test_a_signal_while_redis_runs_a_batch_waits_for_its_ids_to_be_printed(
    real_redis: RedisServerProcess, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window the subprocess test above rarely hits, made certain: SIGINT arrives once Redis
    has run the second batch's LPUSH, before the producer returns. Raised there, it would leave
    500 tasks in Redis whose ids nobody saw."""
    lpush = Producer._lpush
    pushes: list[int] = []

    def lpush_then_interrupt(self: Producer, *args: Any, **kwargs: Any) -> None:
        lpush(self, *args, **kwargs)
        pushes.append(1)
        if len(pushes) == 2:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(Producer, "_lpush", lpush_then_interrupt)
    result = CliRunner().invoke(
        main,
        ["enqueue", "--queue", queue_name, "--redis-url", real_redis.url, "-"],
        input=payload_lines(0, 3 * STREAM_BATCH),
    )

    in_queue = queued(real_redis.url, queue_name)
    assert result.exit_code == 130, result.output
    assert len(in_queue) == 2 * STREAM_BATCH
    assert result.stdout.split() == [task_id for task_id, _ in in_queue]
    assert result.stderr == (
        f"Interrupted (SIGINT): {2 * STREAM_BATCH} task(s) enqueued, the "
        f"last {in_queue[-1][0]} (stdin line {2 * STREAM_BATCH}); nothing "
        "after it was enqueued\n"
    )


def test_a_closed_stdout_stops_the_stream_quietly_and_says_how_many_were_enqueued(
    real_redis: RedisServerProcess, queue_name: str
) -> None:
    with running(start_enqueue(queue_name, real_redis.url)) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        Feeder(proc.stdin, payload_lines(0, FED), close=True).start()
        # `| head -n 5`: five ids read, then the reader is gone.
        first = [proc.stdout.readline().decode().strip() for _ in range(5)]
        proc.stdout.close()
        assert proc.wait(timeout=60) == 141
        stderr = proc.stderr.read()

    line = the_line(
        stderr,
        rf"stdout closed \(not every id enqueued was printed\): (\d+) "
        rf"task\(s\) enqueued, the last ({ID}) \(stdin line (\d+)\); nothing "
        "after it was enqueued",
    )
    in_queue = queued(real_redis.url, queue_name)
    assert int(line[1]) == len(in_queue)
    # Stopped at the closed pipe, not at the end of the input (a pipe holds far fewer ids).
    assert len(in_queue) < FED
    assert line[2] == in_queue[-1][0]
    assert [task_id for task_id, _ in in_queue[:5]] == first


def test_a_bad_line_mid_stream_enqueues_the_lines_before_it_and_names_it(
    real_redis: RedisServerProcess, queue_name: str
) -> None:
    # 1,200 payloads, a blank line among them (skipped, but counted as a line), then a line that
    # is not JSON (line 1,202), then more payloads that must not be enqueued.
    lines = payload_lines(0, 1_200).split(b"\n")
    lines.insert(600, b"")
    fed = b"\n".join(lines[:-1]) + b"\n{not json\n" + payload_lines(1_200, 1_900)
    done = subprocess.run(
        enqueue_argv(queue_name, real_redis.url),
        input=fed,
        capture_output=True,
        env=worker_env(),
        timeout=120,
    )

    assert done.returncode == 2
    in_queue = queued(real_redis.url, queue_name)
    assert done.stdout.decode().split() == [task_id for task_id, _ in in_queue]
    assert [payload for _, payload in in_queue] == [{"n": n} for n in range(1_200)]
    line = the_line(
        done.stderr,
        r"Error: stdin line 1202 is not JSON \(.*\): '\{not json'; "
        rf"1200 task\(s\) enqueued, the last ({ID}) \(stdin line 1201\); "
        "nothing after it was enqueued",
    )
    assert line[1] == in_queue[-1][0]


def test_a_batch_redis_refuses_mid_stream_ends_it_with_exactly_the_printed_ids_queued(
    real_redis: RedisServerProcess, queue_name: str
) -> None:
    admin = redis.Redis.from_url(real_redis.url)
    with running(start_enqueue(queue_name, real_redis.url)) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        printed = Lines(proc.stdout)
        printed.start()
        proc.stdin.write(payload_lines(0, 10))
        proc.stdin.flush()
        printed.wait_for(10, "ids printed while stdin is open")
        # Out of memory (noeviction): Redis refuses every write from now on.
        admin.config_set("maxmemory", 1)
        try:
            proc.stdin.write(payload_lines(10, 20))
            proc.stdin.close()
            assert proc.wait(timeout=60) == 1
        finally:
            admin.config_set("maxmemory", 0)
            admin.close()
        printed.join(timeout=60)
        stderr = proc.stderr.read().decode()

    in_queue = queued(real_redis.url, queue_name)
    assert printed.lines == [task_id for task_id, _ in in_queue]
    assert len(in_queue) == 10
    assert "Traceback" not in stderr
    assert stderr.startswith("Error: Redis is out of memory")
    assert stderr.endswith(
        f"; 10 task(s) enqueued, the last {in_queue[-1][0]} (stdin line 10); "
        "nothing after it was enqueued\n"
    )


def test_quiet_prints_only_the_count_of_tasks_enqueued(
    real_redis: RedisServerProcess, queue_name: str
) -> None:
    done = subprocess.run(
        enqueue_argv(queue_name, real_redis.url, "--quiet"),
        input=payload_lines(0, 1_234),
        capture_output=True,
        env=worker_env(),
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout == b"1234\n"
    assert len(queued(real_redis.url, queue_name)) == 1_234


def test_payload_arguments_around_stdin_are_enqueued_in_their_order(
    real_redis: RedisServerProcess, queue_name: str
) -> None:
    result = CliRunner().invoke(
        main,
        ["enqueue", "--queue", queue_name, "--redis-url", real_redis.url, '"first"', "-", '"last"'],
        input='"a"\n\n"b"\n',
    )

    assert result.exit_code == 0, result.output
    in_queue = queued(real_redis.url, queue_name)
    assert result.stdout.split() == [task_id for task_id, _ in in_queue]
    assert [payload for _, payload in in_queue] == ["first", "a", "b", "last"]


def test_a_bad_payload_argument_enqueues_nothing_even_with_stdin(
    real_redis: RedisServerProcess, queue_name: str
) -> None:
    result = CliRunner().invoke(
        main,
        ["enqueue", "--queue", queue_name, "--redis-url", real_redis.url, "-", "{not json"],
        input='"a"\n',
    )

    assert result.exit_code == 2
    assert "payload 2 is not JSON" in result.output
    assert queued(real_redis.url, queue_name) == []
