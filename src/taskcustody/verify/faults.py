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
`AsyncDroppingConnectionMixin` (`install_async`) is its twin for `redis.asyncio` connections (and
fakeredis's asyncio ones): both read through one coroutine, `read_dropping`, which the sync mixin
runs without an event loop (`run_without_loop`: it never suspends there). An arm may also
*cancel* (`Arm.cancel`, asyncio only): the reply is read -- Redis ran the command -- and the task
awaiting it is cancelled there, a `CancelledError` at that await, as when a cancellation lands
while the reply is in flight. Or it may cancel *before the send* (`Arm.before_send`, asyncio only):
the task is cancelled at the send's await, before a byte of the write that carries the command
reaches the socket, so Redis runs none of it.

A fault is *armed* for a command name, optionally for one connection (a worker's dedicated
connection) or one labelled client (a server's pool), and fires once, on the next reply of that
command. The injector counts the faults that fired, by kind.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import redis

DROPPED_REPLY = "dropped-reply"
CANCELLED = "cancelled-in-flight"
CANCELLED_BEFORE_SEND = "cancelled-before-send"


class InjectedDrop(redis.ConnectionError):
    """The reply was read and thrown away on purpose. A `redis.ConnectionError`, so the code
    under test sees exactly what a broken socket gives it."""


@dataclass
class Arm:
    command: str  # upper-case command name, e.g. "BLMOVE", "EVALSHA", "HSET"
    label: str | None = None  # only on connections of this labelled client (None: any)
    connection: object | None = None  # only on this connection object (None: any)
    skip: int = 0  # let this many matching replies through first (the k-th move of a drain)
    #: cancel the awaiting task after reading the reply instead of raising InjectedDrop (asyncio
    #: connections only)
    cancel: bool = False
    #: cancel the sending task at the send of the write that carries the command, before any of
    #: it is written (asyncio connections only; fires on the send path, never on the read path)
    before_send: bool = False

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

    def arm(
        self,
        command: str,
        *,
        label: str | None = None,
        connection: object | None = None,
        skip: int = 0,
        cancel: bool = False,
        before_send: bool = False,
    ) -> Arm:
        a = Arm(command.upper(), label, connection, skip, cancel, before_send)
        self.armed.append(a)
        return a

    def disarm_all(self) -> None:
        self.armed.clear()

    def count(self, kind: str, n: int = 1) -> None:
        self.counts[kind] += n

    def should_drop(self, command: str, label: str | None, conn: object) -> bool:
        return self.firing(command, label, conn) is not None

    def firing(
        self, command: str, label: str | None, conn: object, before_send: bool = False
    ) -> Arm | None:
        """The arm that fires on this reply (it is spent and counted), or None. `before_send`:
        on this send instead (only the arms that cancel before the send fire there)."""
        if not self.enabled:
            return None
        for i, a in enumerate(self.armed):
            if a.before_send == before_send and a.matches(command, label, conn):
                if a.skip > 0:
                    a.skip -= 1
                    return None
                del self.armed[i]
                kind = (
                    CANCELLED_BEFORE_SEND
                    if a.before_send
                    else CANCELLED
                    if a.cancel
                    else DROPPED_REPLY
                )
                self.counts[kind] += 1
                self.counts[f"{kind}:{command}"] += 1
                self.log.append((label, command))
                return a
        return None


def _name(args: tuple[Any, ...]) -> str:
    if not args:
        return ""
    first = args[0]
    text = first.decode() if isinstance(first, bytes) else str(first)
    # redis-py sends some commands as one string with a space ("CLIENT SETINFO").
    return text.split(" ", 1)[0].upper()


def as_bytes(packed: bytes | list[bytes] | tuple[bytes, ...]) -> bytes:
    """A write's bytes, joined (redis-py sends a list of chunks)."""
    return (
        bytes(packed)
        if isinstance(packed, bytes | bytearray)
        else b"".join(bytes(p) for p in packed)
    )


def command_args(packed: bytes | list[bytes] | tuple[bytes, ...]) -> list[list[bytes]]:
    """The arguments (the name first) of each command in RESP request bytes (`*<n>`, then n bulk
    strings each), in the order they are sent; [] for what is not such a request."""
    data = as_bytes(packed)
    commands: list[list[bytes]] = []
    at = 0
    try:
        while at < len(data):
            if data[at : at + 1] != b"*":
                return commands
            end = data.index(b"\r\n", at)
            count, at = int(data[at + 1 : end]), end + 2
            args: list[bytes] = []
            for _ in range(count):
                end = data.index(b"\r\n", at)
                length = int(data[at + 1 : end])
                args.append(bytes(data[end + 2 : end + 2 + length]))
                at = end + 2 + length + 2
            commands.append(args)
    except ValueError:
        pass
    return commands


def command_heads(packed: bytes | list[bytes] | tuple[bytes, ...]) -> list[tuple[str, bytes]]:
    """(name, first argument or b"") of each command in RESP request bytes, in the order they
    are sent (`command_args`). The first argument tells scripts apart (EVALSHA's hash)."""
    return [
        (_name((args[0],)) if args else "", args[1] if len(args) > 1 else b"")
        for args in command_args(packed)
    ]


_T = Any


def run_without_loop(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine that never suspends (it awaits only coroutines that return at once) to its
    end, without an event loop: how the sync mixin runs `read_dropping`."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("the coroutine suspended: it cannot run without an event loop")


async def cancel_current_task() -> None:
    """Cancel the task running this coroutine, at this await: a real `CancelledError`, as when a
    cancellation lands while a reply is in flight."""
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    await asyncio.sleep(0)


class _Pending:
    """The names of the commands whose replies are pending on a connection (in order: Redis
    answers in order), and the injector and label of its class."""

    injector: FaultInjector | None = None
    label: str | None = None
    _tc_pending: deque[str]

    def _sending(self, command: Any) -> list[str]:
        # The names are taken before the send: connecting (inside the send) runs a handshake of
        # its own, whose commands are sent and answered before ours. They are read from the bytes
        # themselves, so that a command packed without redis-py (the worker's wire.Template) is
        # named too.
        heads = command_heads(command)
        injector = type(self).injector
        if injector is not None and injector.on_send is not None:
            injector.on_send(heads, type(self).label, self, as_bytes(command))
        return [name for name, _ in heads]


async def read_dropping(
    conn: _Pending,
    read: Callable[[], Awaitable[Any]],
    disconnect: Callable[[], Awaitable[None]],
    interrupt: Callable[[], Awaitable[None]] | None = None,
) -> Any:
    """Read the next reply on `conn` with `read`, and drop it if an arm fires for its command;
    the one read path of both mixins. `interrupt` (asyncio only): how an arm with `cancel`
    cancels the awaiting task."""
    command = conn._tc_pending.popleft() if conn._tc_pending else ""
    injector = type(conn).injector
    arm = injector.firing(command, type(conn).label, conn) if injector is not None else None
    try:
        reply = await read()
    except redis.ResponseError:
        if arm is None:
            raise
        reply = None  # an error reply is a reply too: dropped all the same
    if arm is None:
        return reply
    # Redis executed the command and answered; the answer is lost on the way. Commands sent after
    # it on this connection are read (and lost) too before the connection closes, so that they
    # surely ran: which of them Redis executes must not depend on socket timing, or runs would
    # not replay.
    while conn._tc_pending:
        conn._tc_pending.popleft()
        with contextlib.suppress(redis.ResponseError):
            await read()
    await disconnect()
    if arm.cancel and interrupt is not None:
        await interrupt()
    raise InjectedDrop(f"reply to {command} dropped (injected fault)")


class DroppingConnectionMixin(_Pending):
    """Tracks the names of the commands whose replies are pending on this connection, and drops
    the reply of an armed one after reading it (`read_dropping`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tc_pending = deque()

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        names = self._sending(command)
        super().send_packed_command(command, check_health=check_health)  # type: ignore[misc]
        self._tc_pending.extend(names)

    def disconnect(self, *args: Any, **kwargs: Any) -> None:
        self._tc_pending.clear()
        super().disconnect(*args, **kwargs)  # type: ignore[misc]

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        base: Any = super()

        async def read() -> Any:
            return base.read_response(*args, **kwargs)

        async def disconnect() -> None:
            self.disconnect()

        return run_without_loop(read_dropping(self, read, disconnect))


class AsyncDroppingConnectionMixin(_Pending):
    """`DroppingConnectionMixin` for `redis.asyncio` connections (and fakeredis's asyncio ones),
    through the same `read_dropping`; an arm with `cancel` cancels the awaiting task."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tc_pending = deque()

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        injector = type(self).injector
        if injector is not None and any(
            injector.firing(name, type(self).label, self, before_send=True)
            for name, _ in command_heads(command)
        ):
            # cancelled at the send's await, before a byte of this write reached the socket
            await cancel_current_task()
        names = self._sending(command)
        await super().send_packed_command(command, check_health=check_health)  # type: ignore[misc]
        self._tc_pending.extend(names)

    async def disconnect(self, *args: Any, **kwargs: Any) -> None:
        self._tc_pending.clear()
        await super().disconnect(*args, **kwargs)  # type: ignore[misc]

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        base: Any = super()

        async def read() -> Any:
            return await base.read_response(*args, **kwargs)

        async def disconnect() -> None:
            await self.disconnect()

        return await read_dropping(self, read, disconnect, cancel_current_task)


def dropping_class(base: type, injector: FaultInjector, label: str | None = None) -> type:
    """A subclass of `base` (redis.Connection or fakeredis's connection class) that drops the
    replies `injector` arms."""
    return type(
        f"Dropping{base.__name__}",
        (DroppingConnectionMixin, base),
        {"injector": injector, "label": label},
    )


def install(client: redis.Redis, injector: FaultInjector, label: str | None = None) -> redis.Redis:
    """Make every new connection of `client`'s pool a dropping one; close the existing ones so
    that none escapes. Everything else about the client (retries, timeouts) stays as configured."""
    pool = client.connection_pool
    base = pool.connection_class
    if issubclass(base, DroppingConnectionMixin):
        base = base.__mro__[3]
    pool.disconnect()
    pool.connection_class = dropping_class(base, injector, label)
    return client


async def install_async(client: Any, injector: FaultInjector, label: str | None = None) -> Any:
    """`install` for a `redis.asyncio` client."""
    pool = client.connection_pool
    base = pool.connection_class
    if issubclass(base, AsyncDroppingConnectionMixin):
        base = base.__mro__[3]
    await pool.disconnect()
    pool.connection_class = type(
        f"Dropping{base.__name__}",
        (AsyncDroppingConnectionMixin, base),
        {"injector": injector, "label": label},
    )
    return client
