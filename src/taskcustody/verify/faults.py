"""Dropped replies, injected inside redis-py's connection handling.

A dropped reply is the fault that destroyed a task in production (docs/protocol.md, design 1 of
section 7; section 5 for the fault): Redis executed the command, and the reply never reached the
client. We inject it where it happens: in the connection's `read_response`. The faulty connection
reads the *real* reply -- so Redis really executed the command -- and then throws it away,
disconnects and raises `redis.ConnectionError`, exactly what redis-py raises when a socket breaks
mid-reply. Whatever redis-py does next (release the connection to its pool, reconnect on the next
command, retry if the client was configured to) happens for real, with the client configured as the
library configures it.

The mixin works on top of `redis.Connection` and of fakeredis's connection class alike:
`install(client, injector)` swaps the client's pool to a subclass of its own connection class.

A fault is *armed* for a command name, optionally for one connection (a worker's dedicated
connection) or one labelled client (a server's pool), and fires once, on the next reply of that
command. The injector counts the faults that fired, by kind.
"""

from __future__ import annotations

import contextlib
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

DROPPED_REPLY = "dropped-reply"


class InjectedDrop(redis.ConnectionError):
    """The reply was read and thrown away on purpose. A `redis.ConnectionError`, so the code
    under test sees exactly what a broken socket gives it."""


@dataclass
class Arm:
    command: str  # upper-case command name, e.g. "BLMOVE", "EVALSHA", "HSET"
    label: str | None = None  # only on connections of this labelled client (None: any)
    connection: object | None = None  # only on this connection object (None: any)
    skip: int = 0  # let this many matching replies through first (the k-th move of a drain)

    def matches(self, command: str, label: str | None, conn: object) -> bool:
        if self.command != command:
            return False
        if self.label is not None and self.label != label:
            return False
        return self.connection is None or self.connection is conn


@dataclass
class FaultInjector:
    """Arms dropped replies and counts every fault by kind (the harness adds its own kinds, such
    as worker crashes, through `count`)."""

    armed: list[Arm] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    # What fired, in order: (label, command) -- for reports.
    log: list[tuple[str | None, str]] = field(default_factory=list)
    enabled: bool = True
    #: Called just before a write reaches Redis, with the (name, first argument) of each command
    #: in it, the connection's label, the connection and the write's bytes (`command_args` reads
    #: every argument back): the hook through which the loop driver (verify/loops.py) sees every
    #: command a production loop sends, before Redis runs it.
    on_send: Callable[[list[tuple[str, bytes]], str | None, object, bytes], None] | None = None

    def arm(self, command: str, *, label: str | None = None,
            connection: object | None = None, skip: int = 0) -> Arm:
        a = Arm(command.upper(), label, connection, skip)
        self.armed.append(a)
        return a

    def disarm_all(self) -> None:
        self.armed.clear()

    def count(self, kind: str, n: int = 1) -> None:
        self.counts[kind] += n

    def should_drop(self, command: str, label: str | None, conn: object) -> bool:
        if not self.enabled:
            return False
        for i, a in enumerate(self.armed):
            if a.matches(command, label, conn):
                if a.skip > 0:
                    a.skip -= 1
                    return False
                del self.armed[i]
                self.counts[DROPPED_REPLY] += 1
                self.counts[f"{DROPPED_REPLY}:{command}"] += 1
                self.log.append((label, command))
                return True
        return False


def _name(args: tuple[Any, ...]) -> str:
    if not args:
        return ""
    first = args[0]
    text = first.decode() if isinstance(first, bytes) else str(first)
    # redis-py sends some commands as one string with a space ("CLIENT SETINFO").
    return text.split(" ", 1)[0].upper()


def as_bytes(packed: bytes | list[bytes] | tuple[bytes, ...]) -> bytes:
    """A write's bytes, joined (redis-py sends a list of chunks)."""
    return bytes(packed) if isinstance(packed, bytes | bytearray) else b"".join(
        bytes(p) for p in packed)


def command_args(packed: bytes | list[bytes] | tuple[bytes, ...]) -> list[list[bytes]]:
    """The arguments (the name first) of each command in RESP request bytes (`*<n>`, then n bulk
    strings each), in the order they are sent; [] for what is not such a request."""
    data = as_bytes(packed)
    commands: list[list[bytes]] = []
    at = 0
    try:
        while at < len(data):
            if data[at:at + 1] != b"*":
                return commands
            end = data.index(b"\r\n", at)
            count, at = int(data[at + 1:end]), end + 2
            args: list[bytes] = []
            for _ in range(count):
                end = data.index(b"\r\n", at)
                length = int(data[at + 1:end])
                args.append(bytes(data[end + 2:end + 2 + length]))
                at = end + 2 + length + 2
            commands.append(args)
    except ValueError:
        pass
    return commands


def command_heads(packed: bytes | list[bytes] | tuple[bytes, ...]) -> list[tuple[str, bytes]]:
    """(name, first argument or b"") of each command in RESP request bytes, in the order they
    are sent (`command_args`). The first argument tells scripts apart (EVALSHA's hash)."""
    return [(_name((args[0],)) if args else "", args[1] if len(args) > 1 else b"")
            for args in command_args(packed)]


class DroppingConnectionMixin:
    """Tracks the names of the commands whose replies are pending on this connection (in order:
    Redis answers in order), and drops the reply of an armed one after reading it."""

    injector: FaultInjector | None = None
    label: str | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tc_pending: deque[str] = deque()

    # -- which replies are pending ------------------------------------------------------------

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        # Take the names first: connecting (inside the send) runs a handshake of its own, whose
        # commands are sent and answered before ours. They are read from the bytes themselves, so
        # that a command packed without redis-py (the worker's wire.Template) is named too.
        heads = command_heads(command)
        injector = type(self).injector
        if injector is not None and injector.on_send is not None:
            injector.on_send(heads, type(self).label, self, as_bytes(command))
        names = [name for name, _ in heads]
        super().send_packed_command(command, check_health=check_health)  # type: ignore[misc]
        self._tc_pending.extend(names)

    def disconnect(self, *args: Any, **kwargs: Any) -> None:
        self._tc_pending.clear()
        super().disconnect(*args, **kwargs)  # type: ignore[misc]

    # -- the fault ----------------------------------------------------------------------------

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        command = self._tc_pending.popleft() if self._tc_pending else ""
        injector = type(self).injector
        drop = injector is not None and injector.should_drop(command, type(self).label, self)
        try:
            reply = super().read_response(*args, **kwargs)  # type: ignore[misc]
        except redis.ResponseError:
            if not drop:
                raise
            reply = None  # an error reply is a reply too: dropped all the same
        if drop:
            # Redis executed the command and answered; the answer is lost on the way. Commands
            # sent after it on this connection are read (and lost) too before the connection
            # closes, so that they surely ran: which of them Redis executes must not depend on
            # socket timing, or runs would not replay.
            while self._tc_pending:
                self._tc_pending.popleft()
                with contextlib.suppress(redis.ResponseError):
                    super().read_response(*args, **kwargs)  # type: ignore[misc]
            self.disconnect()
            raise InjectedDrop(f"reply to {command} dropped (injected fault)")
        return reply


def dropping_class(base: type, injector: FaultInjector, label: str | None = None) -> type:
    """A subclass of `base` (redis.Connection or fakeredis's connection class) that drops the
    replies `injector` arms."""
    return type(f"Dropping{base.__name__}", (DroppingConnectionMixin, base),
                {"injector": injector, "label": label})


def install(client: redis.Redis, injector: FaultInjector, label: str | None = None) -> redis.Redis:
    """Make every new connection of `client`'s pool a dropping one; close the existing ones so
    that none escapes. Everything else about the client (retries, timeouts) stays as configured."""
    pool = client.connection_pool
    base = pool.connection_class
    if issubclass(base, DroppingConnectionMixin):
        base = base.__mro__[2]
    pool.disconnect()
    pool.connection_class = dropping_class(base, injector, label)
    return client
