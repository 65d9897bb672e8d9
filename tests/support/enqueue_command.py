"""`taskcustody enqueue ... -` as a subprocess whose stdin the test feeds and whose stdout it reads
as it goes: a stream, stopped mid-way by a signal or by closing its stdout."""

from __future__ import annotations

import contextlib
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import IO

from tests.support.worker_command import worker_env

#: A bound on waiting for the command's output: generous on a shared machine, not a claim about
#: speed. A command that does not stream never prints while its stdin is open, and fails here.
OUTPUT_LIMIT = 60.0


def enqueue_argv(queue_name: str, redis_url: str, *options: str) -> list[str]:
    """`taskcustody enqueue --queue QUEUE --redis-url URL OPTIONS... -` as a subprocess's
    arguments (this interpreter, the package's command module)."""
    return [
        sys.executable,
        "-m",
        "taskcustody.cli",
        "enqueue",
        "--queue",
        queue_name,
        "--redis-url",
        redis_url,
        *options,
        "-",
    ]


def start_enqueue(queue_name: str, redis_url: str, *options: str) -> subprocess.Popen[bytes]:
    """The command, its stdin, stdout and stderr pipes of ours."""
    return subprocess.Popen(
        enqueue_argv(queue_name, redis_url, *options),
        env=worker_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def payload_lines(start: int, stop: int) -> bytes:
    """`{"n": start}` ... `{"n": stop - 1}`, one per line."""
    return b"".join(b'{"n": %d}\n' % n for n in range(start, stop))


class Feeder(threading.Thread):
    """Writes `data` to the command's stdin, 4 KiB at a time (the command reads as it comes), and
    closes it at the end if `close`. Stops quietly once the command is gone (a broken pipe)."""

    def __init__(self, stdin: IO[bytes], data: bytes, close: bool) -> None:
        super().__init__(daemon=True)
        self.stdin = stdin
        self.data = data
        self.close = close

    def run(self) -> None:
        with contextlib.suppress(BrokenPipeError, ValueError, OSError):
            for start in range(0, len(self.data), 4096):
                self.stdin.write(self.data[start : start + 4096])
                self.stdin.flush()
            if self.close:
                self.stdin.close()


class Lines(threading.Thread):
    """Reads the command's stdout line by line as it is printed (so that the command never blocks
    on a full pipe), keeping every line, until the end of it."""

    def __init__(self, stdout: IO[bytes]) -> None:
        super().__init__(daemon=True)
        self.stdout = stdout
        self.lines: list[str] = []
        self._arrived: queue.Queue[str | None] = queue.Queue()
        self._taken = 0  # lines wait_for has seen arrive

    def run(self) -> None:
        for raw in self.stdout:
            line = raw.decode().rstrip("\n")
            self.lines.append(line)
            self._arrived.put(line)
        self._arrived.put(None)

    def wait_for(self, count: int, what: str) -> None:
        """Until `count` lines in all were printed; an AssertionError naming `what` if the output
        ends first or nothing arrives for OUTPUT_LIMIT seconds."""
        while self._taken < count:
            try:
                line = self._arrived.get(timeout=OUTPUT_LIMIT)
            except queue.Empty:
                raise AssertionError(
                    f"{what}: {self._taken} line(s) printed, then nothing for {OUTPUT_LIMIT:g} s"
                ) from None
            if line is None:
                raise AssertionError(f"{what}: the output ended after {self._taken} line(s)")
            self._taken += 1


@contextlib.contextmanager
def running(proc: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    """`proc`, killed (by its pid) if the test leaves it running, its pipes closed."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
