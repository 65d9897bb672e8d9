"""The asyncio prefetching worker: the threaded `PrefetchingWorker`'s pipelines, sent on an asyncio
connection, its handlers awaited (`Settings.prefetch` > 1 in an `AsyncServer`).

The pipelines' commands, the reading of their replies and the verdicts of a batch are the threaded
one's (both inherit `taskcustody.core.prefetch_custody.PrefetchCustody`), so a run is still a run
of `prefetch` model workers (`taskcustody.core.prefetch` says why). What asyncio adds is
cancellation, at any await:

- in a handler: the batch's releases still run to their end (`complete`, in a `finally`): the task
  whose handler was cancelled as a failed attempt, those it had not reached requeued unchanged,
  as the threaded worker does when interrupted;
- while a take pipeline's replies are in flight: every slot is dirty (any take may have moved a
  task into its list, read or not) and reconciles its list before its next take: never ignorant;
- the connection of a pipeline cut short is `_broken`, dropped before the next one;
- a shutdown's `interrupt` of an idle prefetching worker (beside its cancellation, which may have
  been swallowed: `AsyncWorker.interrupt`) closes the pipelines' connection and the lead's, and
  makes a take pipeline raise `CancelledError` before or after its send, and in place of the
  error of its reads (every slot dirty, as for any cancellation there). The batch's releases are
  not interrupted.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis

from ..core import scripts
from ..core.outcome import Release
from ..core.prefetch_custody import RELEASE, Batch, PrefetchCustody
from .connection import own_connection
from .worker import UNKNOWN, AsyncWorker, _cancel_pending, complete, run_until_stopped

__all__ = ["AsyncPrefetchingWorker"]

_EVAL = "EVAL"


class AsyncPrefetchingWorker(PrefetchCustody[AsyncWorker]):
    """`slots` asyncio workers driven by one coroutine: their takes in one round trip, then the
    batch's handlers (awaited one after the other), then their releases in one round trip. The
    lead (the first slot) does the blocking take, on its own connection, when the queue is empty.
    An `AsyncServer` with `Settings.prefetch` > 1 runs one per concurrent worker::

        server = AsyncServer(client, keys, "s1", handler, workers=8,
                             settings=Settings(prefetch=8))
        (runner, *_) = await server.start()    # AsyncPrefetchingWorkers of 8 slots each
        await runner.run_once()                # up to 8 tasks: takes, then releases, batched
    """

    def __init__(self, slots: list[AsyncWorker]) -> None:
        super().__init__(slots)
        #: Our pipelines' connection (the lead's own is for its blocking take).
        self.conn: Any = own_connection(self.lead.client)
        self._broken = False
        #: Set by `interrupt`: every take pipeline raises CancelledError from then on.
        self.takes_interrupted = False
        #: The batch being handled (None between batches): what a shutdown lets finish within
        #: the grace period.
        self.batch: Batch | None = None

    @property
    def busy(self) -> bool:
        """Whether we hold tasks: a batch being handled, or the lead's task from its blocking
        take."""
        return self.batch is not None or self.lead.busy

    # -- the steps ---------------------------------------------------------------------------

    async def register(self) -> None:
        await self.lead.register()  # every script our slots and pipelines call by hash

    async def connect(self) -> None:
        """Connect our pipelines' connection and the lead's now, not in the first take."""
        for conn in (self.conn, self.lead.conn):
            if not conn.is_connected:
                await conn.connect()

    async def reconcile(self) -> int:
        """Reconcile every dirty slot's list (`AsyncWorker.reconcile`)."""
        moved = 0
        for slot in self.slots:
            if slot.dirty:
                moved += await slot.reconcile()
        return moved

    async def take_suspect(self) -> tuple[Batch, Exception | None] | None:
        """A suspect, as a batch of one in the lead slot, if our process holds none: None when
        there was none to take."""
        command = self.suspect_take_command()
        if command is None:
            return None
        replies, error = await self._pipeline([command], scripts.TAKE_AND_RECORD, take=True)
        return self.suspect_taken(replies, error)

    async def take_all(self) -> tuple[Batch, Exception | None]:
        """One take per slot, in one round trip (a suspect first, alone, as a batch of one)."""
        suspect = await self.take_suspect()
        if suspect is not None:
            return suspect
        replies, error = await self._pipeline(
            self.take_commands(), scripts.TAKE_AND_RECORD, take=True
        )
        return self.taken(replies, error)

    async def handle(self, batch: Batch) -> list[Release]:
        """Run the batch's handlers in order, then release every task in one round trip. The
        releases run in a `finally`, to their end even if we are cancelled meanwhile: a cancelled
        handler's task as a failed attempt, the tasks it had not reached requeued unchanged."""
        self.batch = batch
        try:
            try:
                for slot, raw, _ in batch.raws:
                    task = self.decoded(batch, slot, raw)
                    if task is None:
                        continue
                    try:
                        outcome = await slot.execute(task)
                    except BaseException:
                        self.interrupted(batch, slot, task)
                        raise
                    self.ran(batch, slot, task, outcome)
            finally:
                releases = await complete(self.release_all(batch))
        finally:
            self.batch = None
        return releases

    async def release_all(self, batch: Batch) -> list[Release]:
        """One release per task of the batch, in one round trip."""
        plans, logged = self.release_plans(batch)
        replies, error = await self._pipeline(
            [(*RELEASE, *args) for _, _, args in plans], scripts.RELEASE
        )
        return self.released_all(plans, logged, replies, error)

    # -- the production loop -----------------------------------------------------------------

    async def run_once(self, timeout: float | None = None) -> bool:
        """One cycle. Returns True when a task was handled."""
        await self.reconcile()
        batch, error = await self.take_all()
        if not batch.raws:
            if error is not None:
                self._raise(error)
            # The queue is empty: block on the server like a single worker.
            return await self.lead.run_once(timeout)
        await self.handle(batch)
        if error is not None:
            self._raise(error)
        return True

    async def finish(self) -> None:
        """Nothing to finish: a batch is handled whole inside `run_once`."""

    async def run(self, stop: asyncio.Event, until_idle: bool = False) -> None:
        await run_until_stopped(self, stop, until_idle)

    async def interrupt(self) -> None:
        """`AsyncWorker.interrupt`: for our take pipelines and, through the lead, for the
        blocking take; both connections closed."""
        self.takes_interrupted = True
        await self.conn.disconnect(nowait=True)
        await self.lead.interrupt()

    async def close(self) -> None:
        await self.conn.disconnect()
        for slot in self.slots:
            await slot.close()

    # -- plumbing ----------------------------------------------------------------------------

    async def _pipeline(
        self, commands: list[tuple[Any, ...]], script: str, take: bool = False
    ) -> tuple[list[Any], Exception | None]:
        """Send `commands` (EVALSHA of `script`) in one write; read the replies in order until
        one is lost (`PrefetchingWorker._pipeline`). A command answered NOSCRIPT did not run, so
        it is sent again as EVAL. A `take` pipeline of a worker whose `takes_interrupted` raises
        `CancelledError` (`interrupt`)."""
        replies, error = await self._send_and_read(commands, take)
        if error is not None:
            return replies, error
        retry = [i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.NoScriptError)]
        if retry:
            again, error = await self._send_and_read(
                [(_EVAL, script, *commands[i][2:]) for i in retry], take
            )
            for n, reply in enumerate(again):
                replies[retry[n]] = reply
            if error is not None:
                del replies[retry[len(again)] :]
        return replies, error

    async def _send_and_read(
        self, commands: list[tuple[Any, ...]], take: bool = False
    ) -> tuple[list[Any], Exception | None]:
        """The replies read (a ResponseError in place of a refused command's) and the connection
        error that ended the reading, if any. A cancellation leaves every slot dirty (any of the
        commands may have run unread; before the send, we cannot tell, as the model's
        `cancel_before_send` says) and is raised."""
        conn = self.conn
        replies: list[Any] = []
        try:
            # Inside the try, so that whatever cuts this short leaves every slot dirty: in the
            # NOSCRIPT round (`_pipeline`) the first round's takes have already moved tasks.
            if self._broken or not conn.is_connected:
                # Broken until the handshake is done (as `AsyncWorker._call`): redis-py cleans up
                # after a Redis error in its handshake, not after a cancellation, which would
                # leave the handshake's replies unread for our next pipeline to read as its own.
                self._broken = True
                await conn.disconnect()
                await conn.connect()
                self._broken = False
            # swallowed in redis-py's handshake (see AsyncWorker._call), or interrupted
            if _cancel_pending() or (take and self.takes_interrupted):
                raise asyncio.CancelledError
            await conn.send_packed_command(conn.pack_commands(commands))
            if _cancel_pending() or (take and self.takes_interrupted):
                raise asyncio.CancelledError
            for _ in commands:
                try:
                    replies.append(await conn.read_response())
                except redis.ResponseError as exc:
                    replies.append(exc)
        except UNKNOWN as exc:
            self._broken = True
            if isinstance(exc, asyncio.CancelledError):
                self.dirty = True
                raise
            if take and self.takes_interrupted:
                # The interrupt closed our connection under the reads: it is the cancellation.
                self.dirty = True
                raise asyncio.CancelledError from exc
            return replies, exc
        except BaseException:
            self._broken = True
            self.dirty = True
            raise
        return replies, None
