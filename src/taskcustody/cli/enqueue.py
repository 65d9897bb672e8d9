"""`taskcustody enqueue`'s stream: payloads enqueued batch by batch, each id printed as its task is
enqueued, so that the ids printed are always exactly the tasks in Redis.

A batch is one LPUSH (Producer.enqueue_many with one batch): Redis runs it whole or refuses it
whole. Between two batches is the only place the command stops, however it stops:

- SIGINT (Ctrl-C) or SIGTERM while it reads or parses: the batch in hand is dropped, unsent. While
  a batch is pushed and its ids printed, the signal is held until both are done. Exit 128 + the
  signal's number (130, 143).
- stdout closed (`| head`): the batch just pushed stays pushed; the rest is not read. Exit 141
  (128 + SIGPIPE, what a shell reports for a writer killed by a closed pipe), no traceback.
- a stdin line that is not JSON: the lines before it are enqueued (and printed), it and the lines
  after it are not. Exit 2.
- Redis refuses or fails: the error, with what was enqueued. Exit 1.

Each names on stderr, in one line, how many tasks were enqueued, the last one's id and the input
line it came from: the input from the next line on is what is left to enqueue.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, BinaryIO, TextIO

import click
import redis

from ..core.errors import ReplicationTimeout
from ..core.producer import Producer
from .errors import UsageFailure, one_line

#: Payloads per batch (one LPUSH) when streaming. Small enough that an id is printed soon after
#: its line is read and that a Ctrl-C stops within a fraction of a second (a batch is pushed and
#: printed whole before the command stops); large enough that the round trip per batch costs
#: little next to the 500 payloads it carries. (`enqueue --help` names the number.)
STREAM_BATCH = 500

#: Exit status for a closed stdout: 128 + SIGPIPE (13), what a shell reports for `yes | head`'s
#: `yes`, killed by the signal.
EXIT_BROKEN_PIPE = 128 + 13

#: The signals that stop the stream at a batch boundary (exit 128 + the signal's number).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived where nothing is half done. A KeyboardInterrupt, so that no
    `except Exception` on the way swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals:
    """SIGINT and SIGTERM, raised as `Interrupted` where the stream may stop (reading, parsing) and
    held while a batch is pushed and printed (`held()`): a push interrupted after its command
    was sent would leave tasks in Redis whose ids nobody saw."""

    def __init__(self) -> None:
        self._holding = False
        self._ignoring = False
        self._pending: int | None = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._ignoring:
            return
        if self._holding:
            self._pending = signum
            return
        raise Interrupted(signum)

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopSignals]:
        """The handlers, for the duration; the previous ones afterwards. Only the main thread
        may set handlers: elsewhere (an embedding that runs the command in a thread), none."""
        previous: dict[int, Any] = {}
        try:
            for signum in STOP_SIGNALS:
                previous[signum] = signal.signal(signum, self._handle)
        except ValueError:
            pass
        try:
            yield self
        finally:
            for stopped, handler in previous.items():
                signal.signal(stopped, handler)

    def ignore(self) -> None:
        """From now on, ignore the stop signals: the command is ending, and saying what it did
        must not be cut short."""
        self._ignoring = True

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """A signal arriving inside is raised once the block is done (not if it fails: its own
        error then ends the command)."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
        if self._pending is not None:
            raise Interrupted(self._pending)


class StdinLines:
    """A binary stream's lines, numbered from 1, in batches of up to `size` lines. A batch ends
    early when no more input is ready (a pipe whose writer pauses): lines read are enqueued
    without waiting for the next ones."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        try:
            self._fd: int | None = stream.fileno()
        except (AttributeError, OSError, io.UnsupportedOperation):
            self._fd = None  # an in-memory stream (click's CliRunner): read it line by line
        self._buffer = b""
        self._start = 0  # where the first unread line starts in _buffer
        self._eof = False
        self.number = 0  # lines handed out so far (blank ones too)

    def batch(self, size: int) -> list[tuple[int, bytes]]:
        """Up to `size` (line number, line) pairs; an empty list at the end of the input."""
        lines: list[tuple[int, bytes]] = []
        while len(lines) < size:
            line = self._next(wait=not lines)
            if line is None:
                break
            self.number += 1
            lines.append((self.number, line))
        return lines

    def _next(self, wait: bool) -> bytes | None:
        """The next line (without its newline); None at the end, or when `wait` is False and no
        whole line can be had without blocking."""
        if self._fd is None:
            line = self._stream.readline()
            return line.rstrip(b"\n") if line else None
        while True:
            end = self._buffer.find(b"\n", self._start)
            if end >= 0:
                line = self._buffer[self._start : end]
                self._start = end + 1
                return line
            if self._eof:
                rest = self._buffer[self._start :]
                self._buffer, self._start = b"", 0
                return rest or None  # a last line without a newline
            if not wait and not self._ready():
                return None
            chunk = os.read(self._fd, 65536)
            self._buffer = self._buffer[self._start :] + chunk
            self._start = 0
            self._eof = not chunk

    def _ready(self) -> bool:
        assert self._fd is not None
        try:
            readable, _, _ = select.select([self._fd], [], [], 0)
        except (OSError, ValueError):  # no select on this kind of file here: read, and wait
            return True
        return bool(readable)


@dataclass
class Payload:
    """A parsed payload and where it came from ("stdin line 12", or "payload 2": the second
    PAYLOADS argument)."""

    value: Any
    where: str


def parse(text: str | bytes, where: str) -> Payload:
    """Raises ValueError naming `where` for what is not JSON (NaN and infinities included: an
    envelope cannot hold them)."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
        shown = text.decode(errors="replace") if isinstance(text, bytes) else text
        raise ValueError(f"{where} is not JSON ({exc}): {shown[:60]!r}") from exc
    return Payload(value, where)


def _no_constant(name: str) -> Any:
    """Python's json accepts NaN and Infinity; JSON (and so an envelope) cannot hold them."""
    raise ValueError(f"{name} is not JSON")


@dataclass
class Progress:
    """What the stream has enqueued so far."""

    count: int = 0
    last_id: str = ""
    last_where: str = ""

    def add(self, ids: Sequence[str], batch: Sequence[Payload]) -> None:
        if ids:
            self.count += len(ids)
            self.last_id = ids[-1]
            self.last_where = batch[len(ids) - 1].where

    def summary(self, unsure: Sequence[Payload] = ()) -> str:
        """How many tasks were enqueued and the last one; `unsure`: the batch after them, which
        Redis may or may not have run (the connection failed before its reply)."""
        done = (
            f"{self.count} task(s) enqueued, the last {self.last_id} ({self.last_where})"
            if self.count
            else "no task was enqueued"
        )
        if not unsure:
            return f"{done}; nothing after it was enqueued" if self.count else done
        return (
            f"{done}; the {len(unsure)} after it ({unsure[0].where} to {unsure[-1].where}) "
            "may or may not have been (Redis did not answer), and nothing after those"
        )


@dataclass
class Stream:
    """Enqueues batches of payloads, printing each batch's ids to `out` once Redis holds them
    (or, `quiet`, only the count at the end)."""

    signals: StopSignals
    quiet: bool = False
    out: TextIO = field(default_factory=lambda: sys.stdout)
    progress: Progress = field(default_factory=Progress)
    counted: bool = False  # the count is printed (`quiet`) once, however the command ends

    @contextlib.contextmanager
    def stopping(self) -> Iterator[None]:
        """Ends the command for every stop but the end of the input (click's Exit, or the
        error), saying on stderr what was enqueued; prints the count (`quiet`) either way."""
        try:
            yield
            self._print_count()
        except Interrupted as interrupt:
            self._stop(
                f"Interrupted ({signal.Signals(interrupt.signum).name})", 128 + interrupt.signum
            )
        except BrokenPipeError:
            self._silence_stdout()
            self._stop("stdout closed (not every id enqueued was printed)", EXIT_BROKEN_PIPE)
        except click.ClickException:
            self.signals.ignore()
            with contextlib.suppress(BrokenPipeError):
                self._print_count()
            raise

    def enqueue(
        self,
        sources: Sequence[Payload | BinaryIO],
        producer: Producer,
        run: Callable[[Callable[[], Any]], Any],
    ) -> None:
        """Every payload of `sources` in order: a Payload (an argument, parsed already), or a
        stream (stdin) read STREAM_BATCH lines at a time. `run` maps a push's errors to a
        ClickException (cli._run)."""
        batch: list[Payload] = []
        for source in sources:
            if isinstance(source, Payload):
                batch.append(source)
                if len(batch) == STREAM_BATCH:
                    self._push(batch, producer, run)
                    batch = []
                continue
            self._push(batch, producer, run)
            batch = []
            self._enqueue_stream(source, producer, run)
        self._push(batch, producer, run)

    def _enqueue_stream(
        self, stream: BinaryIO, producer: Producer, run: Callable[[Callable[[], Any]], Any]
    ) -> None:
        lines = StdinLines(stream)
        while chunk := lines.batch(STREAM_BATCH):
            batch: list[Payload] = []
            for number, line in chunk:
                if not line.strip():
                    continue
                try:
                    batch.append(parse(line, f"stdin line {number}"))
                except ValueError as bad:
                    # The lines before it are enqueued, so that "enqueued" is exactly the input
                    # up to the bad line: fix it, and feed the rest from there.
                    self._push(batch, producer, run)
                    raise UsageFailure(one_line(f"{bad}; {self.progress.summary()}")) from bad
            self._push(batch, producer, run)

    def _push(
        self, batch: Sequence[Payload], producer: Producer, run: Callable[[Callable[[], Any]], Any]
    ) -> None:
        """One LPUSH of `batch`, then its ids printed; no stop signal in between."""
        if not batch:
            return
        values = [p.value for p in batch]
        with self.signals.held():
            try:
                ids: list[str] = run(lambda: producer.enqueue_many(values, batch_size=len(values)))
            except click.ClickException as failure:
                raise self._failed(failure, batch) from failure.__cause__
            self._enqueued(ids, batch)

    def _failed(
        self, failure: click.ClickException, batch: Sequence[Payload]
    ) -> click.ClickException:
        """`failure`, saying what was enqueued: a short WAIT left the batch in the queue (its ids
        are printed); a lost connection may or may not have; anything else refused it whole."""
        short = failure.__cause__
        if isinstance(short, ReplicationTimeout):
            # Those tasks are in the queue: the caller must know their ids.
            self._enqueued(short.confirmed + short.unconfirmed, batch)
            fate = self.progress.summary()
        elif _connection_lost(failure):
            fate = self.progress.summary(unsure=batch)
        else:
            fate = self.progress.summary()  # Redis refused the LPUSH: none of the batch is in
        # The same class: the same exit code (cli_errors: 1 at run time, 2 for usage).
        return type(failure)(one_line(f"{failure.message}; {fate}"))

    def _enqueued(self, ids: list[str], batch: Sequence[Payload]) -> None:
        self.progress.add(ids, batch)
        if not self.quiet and ids:
            self.out.write("".join(f"{task_id}\n" for task_id in ids))
            self.out.flush()

    def _print_count(self) -> None:
        if self.quiet and not self.counted:
            self.counted = True
            self.out.write(f"{self.progress.count}\n")
            self.out.flush()

    def _stop(self, why: str, exit_code: int) -> None:
        self.signals.ignore()
        with contextlib.suppress(BrokenPipeError):
            self._print_count()
        with contextlib.suppress(OSError):
            click.echo(f"{why}: {self.progress.summary()}", err=True)
        raise click.exceptions.Exit(exit_code)

    def _silence_stdout(self) -> None:
        """stdout's reader is gone: what is still buffered for it goes to /dev/null, so that
        Python's flush at exit does not report the broken pipe a second time."""
        with contextlib.suppress(AttributeError, OSError, io.UnsupportedOperation):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.out.fileno())
            os.close(devnull)


def _connection_lost(failure: BaseException) -> bool:
    """Whether a connection error or timeout is in `failure`'s causes: a command sent may then
    have run or not."""
    seen: BaseException | None = failure
    # The context too, not only the cause: told "may or may not" of a batch Redis refused, the
    # user checks; told "not enqueued" of one it ran, they enqueue it twice.
    while seen is not None:
        if isinstance(seen, (redis.ConnectionError, redis.TimeoutError)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
