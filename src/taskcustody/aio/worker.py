"""One asyncio worker: the threaded `Worker`'s steps as coroutines, with the same names, the same
commands and the same reading of their replies (both inherit `taskcustody.core.custody.Custody`).

What asyncio adds is cancellation: a `CancelledError` may land at any await. So:

- the release runs to completion whatever happens to the task that awaits it (`complete`), in a
  `finally`; a cancelled handler releases as a failed attempt ("worker interrupted"), as the
  threaded worker does when interrupted;
- a cancellation while a take (or a release) is in flight leaves the worker `dirty`: the move may
  have happened with its reply unread, so the worker reconciles its list before its next take. It
  is never ignorant of what may be in its list.
- The worker's connection is its own; a command cut short by a cancellation or a lost reply leaves
  it `_broken`, and it is dropped before the next command (a half-read reply never meets the next
  command). So does a cancellation inside the reconnect's handshake, before the command is sent.
- A shutdown cancels an idle worker's take and also `interrupt`s it: something may have swallowed
  the cancellation (redis-py's asyncio timeouts can, and on Python 3.10 a task cannot see that it
  was cancelled), so the interrupt closes the worker's connection, which ends a take's pending
  read whatever became of the cancellation, and makes the take raise `CancelledError` before or
  after its send, and in place of the error of a read it cut. A take so cut with its reply in
  flight leaves the worker dirty, as any cancellation there does. Only takes are interrupted: a
  running handler's record and release are not.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import redis
import redis.asyncio

from ..core import envelope, scripts
from ..core.clock import Clock
from ..core.custody import Custody
from ..core.envelope import Task
from ..core.errors import MalformedTask, ReleaseRefused
from ..core.keys import ListOwner, QueueKeys
from ..core.outcome import INTERRUPTED, Outcome, Release, Verdict, failed, log_release
from ..core.recovery import Recovering, drain_inflight
from ..core.settings import Settings
from ..deploy.oom import OomSpell, is_oom
from ..deploy.release_refusals import RefusedReleases, as_refused
from .bridge import SyncBridge
from .connection import is_fake, own_connection, refuse_unsupported

log = logging.getLogger("taskcustody.worker")

_T = TypeVar("_T")

#: What a worker's reply-in-flight may be cut by: each leaves the command's effect unknown.
UNKNOWN = (redis.ConnectionError, redis.TimeoutError, asyncio.CancelledError)


async def complete(step: Awaitable[_T]) -> _T:
    """Await `step` to its end even if the awaiting task is cancelled meanwhile; then re-raise
    the cancellation. (`asyncio.shield` alone would let the caller go on while the step still
    runs: a shutdown could deregister before the release lands.)"""
    inner = asyncio.ensure_future(step)
    cancelled = False
    while not inner.done():
        try:
            await asyncio.shield(inner)
        except asyncio.CancelledError:
            if inner.cancelled():
                raise  # the step itself was cancelled, not only us
            cancelled = True  # we were: the step goes on, and we wait for it again
    result = inner.result()
    if cancelled:
        raise asyncio.CancelledError
    return result


def is_async_handler(handler: Callable[..., Any]) -> bool:
    """Whether calling `handler` returns a coroutine: an `async def` function, or an object whose
    `__call__` is one."""
    # A callable object's own method: getattr, not callable(), which says nothing of coroutines.
    method = getattr(handler, "__call__", None)  # noqa: B004
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(method)


class AsyncWorker(Custody):
    """One asyncio worker of an `AsyncServer`: it owns one in-flight list and one connection (for
    its blocking take), and steps through the threaded `Worker`'s cycle, each step a coroutine:

    `register`, `reconcile`, `take` (= `take_suspect`, then `take_from_queue`), `record`,
    `execute`, `release`, `release_and_take`, `run_once` (one whole cycle, releasing in a
    `finally` that completes even when cancelled), `finish`, `run` (the production loop) and
    `close`.

    `handler` may be `async def` (awaited on the loop) or a plain function (run in a thread by
    `asyncio.to_thread`; cancelling it releases its task as a failed attempt, but the thread runs
    on until the function returns).
    """

    client: redis.asyncio.Redis
    handler: Callable[[Any], Any]

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: QueueKeys,
        owner: ListOwner,
        handler: Callable[[Any], Any],
        clock: Clock,
        settings: Settings | None = None,
    ) -> None:
        super().__init__(client, keys, owner, handler, clock, settings, is_fake(client))
        refuse_unsupported(client, self.settings)
        # Made at first use (`conn`): a prefetching worker's slots other than its lead never
        # send a command of their own, and redis-py's Connection() costs some 2 ms (it reads the
        # package's metadata), 1 s for the 512 slots of 64 workers at prefetch 8.
        self._own_conn: Any = None
        self._broken = False
        #: Set by `interrupt` (the shutdown's, for an idle worker): every take raises
        #: CancelledError from then on.
        self.takes_interrupted = False
        #: The task this worker holds between its take and its release (None while idle): what
        #: `AsyncServer`'s shutdown lets finish within the grace period.
        self.current: Task | None = None
        self._async_handler = is_async_handler(handler)

    @property
    def conn(self) -> Any:
        """The worker's own connection, made at first use (tests wrap it to hold a reply, or cut
        one, where they choose)."""
        if self._own_conn is None:
            self._own_conn = own_connection(self.client)
        return self._own_conn

    @conn.setter
    def conn(self, value: Any) -> None:
        self._own_conn = value

    @property
    def busy(self) -> bool:
        """Whether the worker holds a task (running, or taken by its last release)."""
        return self.current is not None or self._next is not None

    @property
    def list_keys(self) -> tuple[str, ...]:
        return (self.list_key,)

    # -- the steps ---------------------------------------------------------------------------

    async def register(self) -> None:
        """Load the scripts our connection calls by hash (as `Worker.register`)."""
        for script in (
            scripts.RECORD_SCRIPT,
            scripts.RELEASE_SCRIPT,
            scripts.TAKE_AND_RECORD_SCRIPT,
            scripts.RELEASE_AND_TAKE_SCRIPT,
        ):
            await self.client.script_load(script.source)

    async def reconcile(self) -> int:
        """Drain our own list back to the queue (`Worker.reconcile`): the same drain, run in a
        thread through `SyncBridge`, so it sends the same script on this loop's client."""
        length = int(await self.client.llen(self.list_key))
        moved = 0
        if length:
            bridge = SyncBridge(self.client, asyncio.get_running_loop())
            recovering = Recovering(self.settings.max_recoveries, self.clock.now())
            moved = await asyncio.to_thread(
                drain_inflight,
                bridge,  # type: ignore[arg-type]
                self.keys,
                self.list_key,
                force=True,
                chunk=self.settings.drain_chunk,
                length=length,
                recovering=recovering,
            )
        self.dirty = False
        self.suspects.release(self.list_key)
        if moved and self.settings.max_recoveries is not None:
            self.suspects.maybe_waiting = True
        return moved

    async def take(self, timeout: float | None = None) -> Task | None:
        """`Worker.take`: a suspect if our process holds none and one waits, else the blocking
        take from the queue with our list's registration in the same write."""
        block = self.block(timeout)
        suspect = await self.take_suspect()
        if suspect is not None:
            return suspect
        return await self._take_from_queue(block)

    async def take_from_queue(self, timeout: float | None = None) -> Task | None:
        """`take` without the take of a suspect."""
        return await self._take_from_queue(self.block(timeout))

    async def _take_from_queue(self, block: float) -> Task | None:
        self._registration_error = None
        try:
            raw = await self._call(*self._take_args(block), first=self.registration(), take=True)
        except (redis.ResponseError, *UNKNOWN) as exc:
            self._take_failed(exc)  # a cancellation with the reply in flight: a lost reply
            raise
        if self._taken(raw) is None:
            return None
        return await self._decoded(raw)

    async def take_suspect(self) -> Task | None:
        """`Worker.take_suspect`: non-blocking, one script (register, move, record)."""
        args = self.acquire_suspect_take()
        if args is None:
            return None
        try:
            try:
                reply = await self._call(
                    "EVALSHA", scripts.TAKE_AND_RECORD_SCRIPT.sha, *args, take=True
                )
            except redis.exceptions.NoScriptError:
                reply = await self._call("EVAL", scripts.TAKE_AND_RECORD, *args, take=True)
        except (redis.ResponseError, *UNKNOWN) as exc:
            self._suspect_take_failed(exc)
            raise
        raw = self._suspect_taken(reply)
        return None if raw is None else await self._decoded(raw)

    async def _decoded(self, raw: bytes) -> Task | None:
        """The task in `raw`, or None after dead-lettering what is not a task envelope."""
        try:
            return envelope.decode(raw)
        except MalformedTask as exc:
            log.warning("dead-lettering a malformed task: %s", exc)
            await self._release_raw(raw, "", "dead", self._dead_letter(raw, exc.reason, None))
            return None

    async def record(self, task: Task) -> None:
        """Write the processing record, only while the task is still ours (one Lua step). Its
        reply is awaited here (the threaded worker reads it with the release's)."""
        args = (2, self.list_key, self.keys.processing, task.raw, task.id, self.record_value())
        try:
            try:
                await self._call("EVALSHA", scripts.RECORD_SCRIPT.sha, *args)
            except redis.exceptions.NoScriptError:
                await self._call("EVAL", scripts.RECORD, *args)
        except UNKNOWN:
            self.dirty = True
            raise

    async def execute(self, task: Task) -> Outcome:
        """Run the handler: awaited if `async def`, else in a thread. Its exception is an
        `Outcome`; a cancellation is not (it propagates: `run_once` releases the task as a
        failed attempt)."""
        started = time.perf_counter()
        try:
            if self._async_handler:
                result = await self.handler(task.payload)
            else:
                result = await asyncio.to_thread(self.handler, task.payload)
                if inspect.isawaitable(result):  # a plain callable that returns a coroutine
                    result = await result
            return Outcome(True, result)
        except Exception as exc:  # the handler's failure is data, not our crash
            return failed(exc)
        finally:
            self._handled(started)

    async def release(self, task: Task, outcome: Outcome) -> Release:
        """Give up custody, and commit, retry or dead-letter, only if we still held it."""
        action, data = self.verdict(task, outcome)
        done = await self._release_raw(task.raw, task.id, action, data)
        log_release(
            self.list_key,
            task.id,
            done,
            data,
            outcome.error,
            self.settings.max_attempts,
            delayed=action == "later",
        )
        return done

    async def release_and_take(self, task: Task, outcome: Outcome) -> tuple[Release, Task | None]:
        """`Worker.release_and_take`: the release and the next take (with its record), in one
        script."""
        action, data = self.verdict(task, outcome)
        mode = self.take_mode()
        extra = (mode, self.record_value(), repr(self.clock.now()))
        args = self.release_and_take_args(task.raw, task.id, action, data, extra)
        reply = list(await self._send_release(args, scripts.RELEASE_AND_TAKE_SCRIPT))
        done = self.released_and_taken(reply, action)
        log_release(
            self.list_key,
            task.id,
            done,
            data,
            outcome.error,
            self.settings.max_attempts,
            delayed=action == "later",
        )
        raw = self.after_release_and_take(reply, mode)
        return done, None if raw is None else await self._decoded(raw)

    async def _release_raw(self, raw: bytes, task_id: str, action: Verdict, data: str) -> Release:
        args = self.release_args(raw, task_id, action, data)
        return self.released(await self._send_release(args, scripts.RELEASE_SCRIPT), action)

    async def _send_release(self, args: tuple[Any, ...], script: scripts.Script) -> Any:
        try:
            try:
                return await self._call("EVALSHA", script.sha, *args)
            except redis.exceptions.NoScriptError:
                return await self._call("EVAL", script.source, *args)
        except UNKNOWN:
            # The release may have run: reconcile later (a second release finds nothing).
            self.dirty = True
            raise
        except redis.ResponseError as exc:
            refused = as_refused(exc)
            if refused is exc:
                raise
            # Refused (release_refusals.py): the task is still in our list; reconcile it.
            self.dirty = True
            raise refused from exc

    # -- the cycle ---------------------------------------------------------------------------

    async def run_once(self, timeout: float | None = None) -> bool:
        """One cycle (`Worker.run_once`). Whatever interrupts it after the take, a cancellation
        included, the task is released (as a failed attempt unless the handler returned) before
        this returns or raises."""
        task, self._next = self._next, None
        taken_now = task is None
        if task is None:
            if self.dirty:
                await self.reconcile()
            task = await self.take(timeout)
            if task is None:
                return False
        self.current = task
        ran = False
        try:
            if taken_now:
                await self.record(task)
            outcome = await self.execute(task)
            ran = True
        except BaseException:
            outcome = INTERRUPTED
            raise
        finally:
            # Custody is released whatever happened above, to the end even if we are cancelled
            # meanwhile; an interrupted cycle takes nothing.
            try:
                if ran and self.take_next():
                    self._next = (await complete(self.release_and_take(task, outcome)))[1]
                else:
                    await complete(self.release(task, outcome))
            finally:
                self.current = None
        return True

    async def finish(self) -> None:
        """Run the task the last release took, if any, and release it taking nothing more."""
        if self._next is not None:
            take_next, self.take_next = self.take_next, lambda: False
            try:
                await self.run_once()
            finally:
                self.take_next = take_next

    async def run(self, stop: asyncio.Event, until_idle: bool = False) -> None:
        """The production loop (`taskcustody.core.loop.run_until_stopped`'s asyncio twin): cycles
        until `stop` is set (or, with `until_idle`, a cycle finds the queue empty); Redis lost or
        out of memory is waited out, not a crash. Then `finish`."""
        self.take_next = lambda: not stop.is_set()
        await run_until_stopped(self, stop, until_idle)

    async def interrupt(self) -> None:
        """The shutdown's cut of an idle worker, beside its loop's cancellation, which something
        may have swallowed (redis-py's asyncio timeouts can; before Python 3.11 a task cannot see
        that it was cancelled, `_cancel_pending`): from now on a take raises `CancelledError`
        before its send, after it, or in place of the error of its read; and closing our
        connection ends a read in progress (a blocking take would otherwise wait out its
        `block_timeout`). A take cut with its reply in flight leaves us dirty (`_take_failed`).
        Not for a worker running a handler: its record and release are not interrupted."""
        self.takes_interrupted = True
        if self._own_conn is not None:
            await self._own_conn.disconnect(nowait=True)

    async def close(self) -> None:
        if self._own_conn is not None:
            await self._own_conn.disconnect()

    # -- plumbing ----------------------------------------------------------------------------

    async def _call(
        self, *args: Any, first: tuple[Any, ...] | None = None, take: bool = False
    ) -> Any:
        """Send a command (with `first` before it in the same write: the take's registration,
        whose error is kept in `_registration_error`) and read its reply. Anything but an error
        reply leaves the connection `_broken`: it is dropped before the next command. A `take`
        of a worker whose `takes_interrupted` raises `CancelledError` (see `interrupt`)."""
        try:
            return await self._send_and_read(args, first, take)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if take and self.takes_interrupted:
                # The interrupt closed our connection under the take: it is the cancellation.
                raise asyncio.CancelledError from exc
            raise

    async def _send_and_read(
        self, args: tuple[Any, ...], first: tuple[Any, ...] | None, take: bool
    ) -> Any:
        conn = self.conn
        if self._broken or not conn.is_connected:
            # Broken until the handshake is done: redis-py cleans up after a Redis error in its
            # handshake, not after a cancellation, which would leave the handshake's replies
            # unread on a connection it calls connected, for our next command to read as its own.
            self._broken = True
            await conn.disconnect()
            await conn.connect()
            self._broken = False
        # redis-py's handshake and its send wait with asyncio.wait_for, which (Python 3.10 and
        # 3.11) swallows a cancellation that lands as the wait ends: honour it here, before
        # anything is sent, and after the send, not a block timeout later (seen by
        # `_cancel_pending` on 3.11+; on 3.10 a shutdown's `interrupt` says so for a take).
        if _cancel_pending() or (take and self.takes_interrupted):
            raise asyncio.CancelledError
        try:
            if first is None:
                await conn.send_command(*args)
            else:
                await conn.send_packed_command(conn.pack_commands([first, args]))
            if _cancel_pending() or (take and self.takes_interrupted):
                # Sent: a blocking take would go on waiting on the server, and could still
                # move a task into our list. Closing the connection aborts it there.
                await conn.disconnect(nowait=True)
                raise asyncio.CancelledError
            if first is not None:
                try:
                    await conn.read_response()
                except redis.ResponseError as exc:
                    self._registration_error = exc
            return await conn.read_response()
        except redis.ResponseError:
            raise
        except BaseException:
            self._broken = True
            raise


class AsyncRunnable(Protocol):
    """What `run_until_stopped` runs: an `AsyncWorker`, or an `AsyncPrefetchingWorker`."""

    list_key: str
    clock: Clock
    settings: Settings
    dirty: bool

    async def register(self) -> None: ...

    async def run_once(self, timeout: float | None = None) -> bool: ...

    async def finish(self) -> None: ...


async def run_until_stopped(unit: AsyncRunnable, stop: asyncio.Event, until_idle: bool) -> None:
    """The production loop (`taskcustody.core.loop.run_until_stopped`'s asyncio twin): `register`,
    then cycles until `stop` is set (or, with `until_idle`, a cycle finds the queue empty); Redis
    lost or out of memory is waited out, not a crash. Then `finish`."""
    oom = OomSpell(
        log,
        f"worker {unit.list_key}",
        unit.clock,
        unit.settings.oom_log_interval,
        first_pause=min(1.0, unit.settings.block_timeout),
    )
    refusals = RefusedReleases(
        log,
        f"worker {unit.list_key}",
        unit.clock,
        unit.settings.oom_log_interval,
        first_pause=min(1.0, unit.settings.block_timeout),
    )
    await unit.register()
    while not stop.is_set():
        try:
            handled = await unit.run_once()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("worker %s: Redis unreachable (%s); will reconcile", unit.list_key, exc)
            unit.dirty = True
            await _wait(stop, min(1.0, unit.settings.block_timeout))
            continue
        except ReleaseRefused as exc:
            # As the threaded loop: the task is in our list; back off, reconcile, no crash.
            unit.dirty = True
            await _wait(stop, refusals.refused(exc))
            continue
        except redis.ResponseError as exc:
            if not is_oom(exc):
                raise
            unit.dirty = True  # a refused release leaves its task in our list: reconcile
            await _wait(stop, oom.refused(exc))
            continue
        oom.recovered()
        refusals.recovered()
        if until_idle and not handled:
            break
    try:
        await unit.finish()
    except redis.RedisError as exc:
        log.warning(
            "worker %s: could not finish the task it held (%s); recovery will requeue it",
            unit.list_key,
            exc,
        )


def _cancel_pending() -> bool:
    """Whether the current task was cancelled and something swallowed the CancelledError
    (Python 3.11+; 3.10 cannot tell: there, a shutdown's `AsyncWorker.interrupt` covers a take)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return bool(cancelling is not None and cancelling())


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    """Wait `seconds`, or less if `stop` is set meanwhile."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
