"""asyncio test support: clients on either backend, and a gate on an AsyncWorker's connection
that holds one command where the test says, so that a cancellation lands exactly there."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio

from taskcustody import AsyncServer, ManualClock, QueueKeys, Settings
from taskcustody.aio import connect_async, connect_fake_async
from taskcustody.core.envelope import decode
from tests.conftest import TEST_SETTINGS, Backend

Match = Callable[[tuple[Any, ...]], bool]


def async_client(backend: Backend, settings: Settings = TEST_SETTINGS) -> redis.asyncio.Redis:
    """An asyncio client on the same keyspace as `backend.client()`."""
    if backend.url is None:
        return connect_fake_async(backend.fake_server)
    return connect_async(backend.url, settings)


def run_with_client(
    test: Callable[[redis.asyncio.Redis], Awaitable[None]],
    backend: Backend,
    settings: Settings = TEST_SETTINGS,
) -> None:
    """Run `test(client)` in a new event loop, with an asyncio client of `backend` (made with
    `settings`) closed after."""

    async def main() -> None:
        client = async_client(backend, settings)
        try:
            await test(client)
        finally:
            await client.aclose()

    asyncio.run(main())


def skip_on_fakeredis(backend: Backend) -> None:
    """Skips a test that cancels a blocking command on fakeredis, whose async blocking commands
    ignore cancellation (pinned in tests/test_fakeredis_gaps.py)."""
    if not backend.real:
        pytest.skip(
            "fakeredis's async blocking commands ignore cancellation (pinned in "
            "tests/test_fakeredis_gaps.py)"
        )


def blocking(settings: Settings) -> Settings:
    """`settings` with takes that block for 20 s and a grace of 30 s: a run that returns long
    before cancelled or cut its takes."""
    return dataclasses.replace(settings, block_timeout=20.0, shutdown_grace=30.0)


async def started_server(
    client: redis.asyncio.Redis, keys: QueueKeys, settings: Settings
) -> tuple[AsyncServer, Any]:
    """An `AsyncServer` of one worker whose handler returns its payload, started (registered,
    not yet running), and its worker."""
    server = AsyncServer(
        client, keys, "aio-1", lambda p: p, workers=1, settings=settings, clock=ManualClock()
    )
    (worker,) = await server.start()
    return server, worker


def named(name: str, sha: str | None = None) -> Match:
    """Matches the command `name` (and, for EVALSHA, the script `sha`)."""

    def match(args: tuple[Any, ...]) -> bool:
        return str(args[0]).upper() == name and (sha is None or args[1] == sha)

    return match


class Gate:
    """Wraps `worker.conn`: the first command `match` accepts waits at `hold` -- "send" (before it
    is sent: Redis never sees it unless the gate opens), "read" (sent, before its reply is read:
    it may have run, its reply unread) or "reply" (after its reply was read: it ran, and its reply
    is in flight from the worker's point of view) -- until `opened` is set. `reached` is set when
    it waits there; `cancel_at(task)` cancels `task` once it does.

    With `swallow`, a cancellation of the task waiting there is swallowed, without a trace (as
    Python 3.10's `asyncio.wait_for`, which redis-py's send awaits, does when a cancellation lands
    as the operation ends; on 3.11+ `Task.uncancel` hides it from `Task.cancelling()` too), and
    the command goes on as if the gate had opened; `swallowed` says it was."""

    def __init__(self, conn: Any, match: Match, hold: str = "reply", swallow: bool = False) -> None:
        assert hold in ("send", "read", "reply")
        self.inner = conn
        self.match = match
        self.hold = hold
        self.swallow = swallow
        self.swallowed = False
        self.armed = True
        self.reached = asyncio.Event()
        self.opened = asyncio.Event()
        self._sent: deque[tuple[Any, ...]] = deque()

    async def _wait_here(self, args: tuple[Any, ...], at: str) -> None:
        if self.armed and at == self.hold and self.match(args):
            self.armed = False
            self.reached.set()
            try:
                await self.opened.wait()
            except asyncio.CancelledError:
                if not self.swallow:
                    raise
                self.swallowed = True
                uncancel = getattr(asyncio.current_task(), "uncancel", None)  # Python 3.11+
                if uncancel is not None:
                    uncancel()

    def pack_commands(self, commands: list[tuple[Any, ...]]) -> Any:
        self._pending = list(commands)
        return self.inner.pack_commands(commands)

    async def send_packed_command(self, packed: Any, check_health: bool = True) -> None:
        commands, self._pending = self._pending, []
        for args in commands:
            await self._wait_here(args, "send")
        await self.inner.send_packed_command(packed)
        self._sent.extend(commands)

    async def send_command(self, *args: Any, **kwargs: Any) -> None:
        await self._wait_here(args, "send")
        await self.inner.send_command(*args, **kwargs)
        self._sent.append(args)

    async def read_response(self, **kwargs: Any) -> Any:
        args = self._sent.popleft()
        await self._wait_here(args, "read")
        reply = await self.inner.read_response(**kwargs)
        await self._wait_here(args, "reply")
        return reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # is_connected, connect

    async def disconnect(self, *args: Any, **kwargs: Any) -> None:
        self._sent.clear()
        await self.inner.disconnect(*args, **kwargs)

    async def cancel_at(self, task: asyncio.Task[Any]) -> None:
        """Cancel `task` once it waits at the gate, then open the gate (what was held goes on
        only if something else still awaits it: a shielded release)."""
        await self.reached.wait()
        task.cancel()
        self.opened.set()


def task_stacks() -> str:
    """Where every task of the running loop waits, coroutine by coroutine (for a failure
    message: Task.print_stack shows only the outermost frame)."""
    lines = []
    for task in asyncio.all_tasks():
        cancelling = getattr(task, "cancelling", lambda: "?")  # Python 3.11 and newer
        lines.append(f"{task.get_name()} (cancelling: {cancelling()})")
        coro: Any = task.get_coro()
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
            if frame is not None:
                lines.append(
                    f"    {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}"
                )
            coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return "\n".join(lines)


async def finishes(task: asyncio.Task[Any], guard: float = 10.0) -> None:
    """Await `task`; if it has not finished after `guard` seconds (a hang, not a slow run),
    fail with every task's stack."""
    done, _ = await asyncio.wait([task], timeout=guard)
    if not done:
        raise AssertionError(f"still running after {guard} s:\n{task_stacks()}")
    task.result()


def gated(holder: Any, match: Match, hold: str = "reply", swallow: bool = False) -> Gate:
    """A `Gate` (`match`, `hold`, `swallow`) on `holder.conn` (a worker, or a prefetching
    worker's lead), put in its place."""
    gate = holder.conn = Gate(holder.conn, match, hold, swallow)
    return gate


async def stopped_at(
    server: AsyncServer, gate: Gate, held: Callable[[], Awaitable[None]] | None = None
) -> None:
    """Run `server` until `gate` holds its command, check `held` there (what is true while the
    command is held), then stop the server and await its run (`finishes`: a hang fails, as a take
    that blocks 20 s would). A swallowing gate must have swallowed the shutdown's cancellation:
    it landed there."""
    run = asyncio.create_task(server.run())
    await gate.reached.wait()
    if held is not None:
        await held()
    server.stop()
    await finishes(run)
    assert gate.swallowed == gate.swallow


async def in_custody(client: redis.asyncio.Redis, server: AsyncServer) -> int:
    """How many tasks `server`'s workers' in-flight lists hold (every slot's, for a prefetching
    worker)."""
    return sum([await client.llen(k) for w in server.workers for k in w.list_keys])


async def suspects(client: redis.asyncio.Redis, keys: QueueKeys) -> list[str]:
    """The ids of the tasks in the suspects list (where recovery and the shutdown's reconcile put
    a task taken into a list whose worker may not have seen it), sorted."""
    return sorted(decode(raw).id for raw in await client.lrange(keys.suspects, 0, -1))


def a_swallowed_idle_take_is_cut(
    backend: Backend, keys: QueueKeys, settings: Settings, taker: Callable[[Any], Any]
) -> None:
    """The shutdown ends a blocking take on an empty queue whose cancellation was swallowed
    (as by Python 3.10's `wait_for` in redis-py's send), without a trace, and the take sent: only
    the shutdown's interrupt can end it, and a run that returns long before the take's 20 s block
    was cut; nothing is left in custody and the server deregistered. `taker(worker)`: whose
    blocking take it is (the worker itself, or a prefetching worker's lead)."""
    skip_on_fakeredis(backend)
    settings = blocking(settings)

    async def test(client: redis.asyncio.Redis) -> None:
        server, worker = await started_server(client, keys, settings)
        taking = taker(worker)
        await stopped_at(server, gated(taking, named(taking.take_command), "send", swallow=True))
        assert await in_custody(client, server) == 0 and not worker.dirty
        assert await client.zcard(keys.servers) == 0

    run_with_client(test, backend, settings)


#: The asyncio connection's handshake method, which `connect()` awaits after the socket is open
#: (redis-py 6 and later: `on_connect_check_health`; redis-py 5: `on_connect`).
HANDSHAKE = (
    "on_connect_check_health"
    if hasattr(redis.asyncio.Connection, "on_connect_check_health")
    else "on_connect"
)


async def cancel_inside_the_handshake(conn: Any, step: Awaitable[Any]) -> None:
    """Run `step`, whose first await (re)connects `conn`, and cancel it while a reply of the
    connection's handshake is unread; check that the cancellation is raised. `conn`'s handshake
    and reads are its own again afterwards."""
    import pytest

    reached, never = asyncio.Event(), asyncio.Event()
    handshake = getattr(conn, HANDSHAKE)
    read = conn.read_response

    async def held_read(*args: Any, **kwargs: Any) -> Any:
        reached.set()
        await never.wait()  # the cancellation lands here, a handshake reply unread
        return await read(*args, **kwargs)

    async def holding_handshake(*args: Any, **kwargs: Any) -> Any:
        conn.read_response = held_read
        try:
            return await handshake(*args, **kwargs)
        finally:
            del conn.read_response

    setattr(conn, HANDSHAKE, holding_handshake)
    try:
        task = asyncio.ensure_future(step)
        await reached.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        delattr(conn, HANDSHAKE)
