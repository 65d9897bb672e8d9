"""A prefetching worker: several workers' takes in one round trip, and their releases in another.

Why this is still the protocol the model checks: a prefetching worker is `prefetch` ordinary
workers, each with its own in-flight list, whose commands share one connection. Each take is one
atomic script (`TAKE_AND_RECORD`: the model's take, then its record, with nothing in between), each
release is the usual `RELEASE` script. Sending them in one pipeline only fixes an order in which
the workers' steps reach Redis, one of the interleavings the model already explores; a lost reply
loses the replies after it too, which is a dropped reply for each of those workers. So every run
of a prefetching worker is a run of `prefetch` model workers.

While the queue is busy a thread then pays two round trips per `prefetch` tasks instead of two
per task. When the first pipelined take finds the queue empty, the lead worker falls back to the
ordinary blocking cycle (BLMOVE), so an idle worker still waits on the server, not in a poll loop.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis

from ..deploy import cluster, replication
from . import scripts
from .loop import run_until_stopped
from .outcome import Release
from .prefetch_custody import RELEASE, Batch, Plan, PrefetchCustody
from .worker import REDIRECT_ATTEMPTS, Worker

__all__ = ["Batch", "PrefetchingWorker"]

log = logging.getLogger("taskcustody.prefetch")

_EVAL = "EVAL"


class PrefetchingWorker(PrefetchCustody[Worker]):
    """`slots` workers driven by one thread: several takes in one round trip, then the batch's
    handlers, then its releases in another round trip. The first slot (the lead) also does
    the blocking take when the queue is empty.

    Each slot is an ordinary `Worker` with its own in-flight list, and each take and release is
    that worker's atomic script (`TAKE_AND_RECORD`, `RELEASE`), so it guarantees what a `Worker`
    does: a lost reply leaves the task in a slot's list (that slot, and every slot whose reply
    came after it, is marked dirty and reconciles before its next take); a task commits at most
    once, and only from the list that still holds it; the batch's releases are sent even when a
    handler is interrupted. The module docstring says why this is still the protocol the model
    checks; `PrefetchCustody` holds what it shares with the asyncio one
    (`taskcustody.aio.AsyncPrefetchingWorker`). A `Server` with `Settings.prefetch` > 1 runs one
    per worker thread::

        server = Server(client, keys, "s1", handler, settings=Settings(prefetch=8))
        (runner,) = server.start()            # a PrefetchingWorker of 8 slots
        runner.run_once()                     # up to 8 tasks: takes, then releases, batched
    """

    def __init__(self, slots: list[Worker]) -> None:
        super().__init__(slots)
        # Our pipelines' connection, to the node that owns the queue's slot (cluster.py).
        self._conn: redis.connection.ConnectionInterface = cluster.own_connection(
            self.lead.client, self.lead.keys.queue
        )
        # Settings.min_replicas: each pipeline ends with one WAIT (replication.py).
        self.replicas = replication.Shortfalls(self.settings, self.lead.clock, self.list_key)

    # -- the steps ---------------------------------------------------------------------------

    def register(self) -> None:
        for slot in self.slots:
            slot.register()
        scripts.TAKE_AND_RECORD_SCRIPT.load(self.lead.client)

    def take_suspect(self) -> tuple[Batch, Exception | None] | None:
        """A suspect, as a batch of one in the lead slot, if our process holds none (see
        `Worker.take_suspect`; suspects.py): None when there was none to take."""
        command = self.suspect_take_command()
        if command is None:
            return None
        replies, error = self._pipeline([command], scripts.TAKE_AND_RECORD, replication.TAKE)
        return self.suspect_taken(replies, error)

    def take_all(self) -> tuple[Batch, Exception | None]:
        """One take per slot, in one round trip. A slot whose reply was lost (and every slot
        after it) is dirty: its task, if the take ran, is debris its reconcile requeues. A
        suspect comes first, alone: a batch of one (its ordinary batches come from the queue
        only, so a suspect never shares a batch)."""
        suspect = self.take_suspect()
        if suspect is not None:
            return suspect
        replies, error = self._pipeline(
            self.take_commands(), scripts.TAKE_AND_RECORD, replication.TAKE
        )
        return self.taken(replies, error)

    def handle(self, batch: Batch) -> list[Release]:
        """Execute the batch's tasks in order, then release them all; the releases are sent in
        a `finally`, so an interrupted handler still gives up custody of every task: the one it
        was running (as a failed attempt) and those it had not reached (requeued unchanged)."""
        try:
            for slot, raw, _ in batch.raws:
                task = self.decoded(batch, slot, raw)
                if task is None:
                    continue
                try:
                    outcome = slot.execute(task)
                except BaseException:
                    self.interrupted(batch, slot, task)
                    raise
                self.ran(batch, slot, task, outcome)
        finally:
            releases = self.release_all(batch)
        return releases

    def release_all(self, batch: Batch) -> list[Release]:
        """One release per task of the batch, in one round trip."""
        plans, logged = self.release_plans(batch)
        replies, error = self._pipeline(
            [(*RELEASE, *args) for _, _, args in plans], scripts.RELEASE, replication.RELEASE
        )
        if error is None:
            replies, error = self._release_redirected(plans, replies)
        return self.released_all(plans, logged, replies, error)

    # -- the production loop -----------------------------------------------------------------

    def run_once(self, timeout: float | None = None) -> bool:
        """One cycle. Returns True when a task was handled."""
        for slot in self.slots:
            if slot.dirty:
                slot.reconcile()
        batch, error = self.take_all()
        if not batch.raws:
            if error is not None:
                self._raise(error)
            # The queue is empty: block on the server like a single worker.
            return self.lead.run_once(timeout)
        self.handle(batch)
        if error is not None:
            self._raise(error)
        return True

    def finish(self) -> None:
        """Nothing to finish: a batch is handled whole inside `run_once`."""

    def run(self, stop: threading.Event, until_idle: bool = False) -> None:
        run_until_stopped(self, stop, until_idle, register=self.register)

    def close(self) -> None:
        self._conn.disconnect()  # type: ignore[no-untyped-call]
        for slot in self.slots:
            slot.close()

    def follow_slot(self, refresh: bool = True) -> None:
        """`Worker.follow_slot` for our pipelines' connection and every slot's (the lead's
        blocking take uses its own): one refresh of the slot map, then each reconnects."""
        self._conn = cluster.reconnect(
            self._conn, self.lead.client, self.lead.keys.queue, refresh_map=refresh
        )
        for slot in self.slots:
            slot.follow_slot(refresh=False)

    # -- plumbing ----------------------------------------------------------------------------

    def _release_redirected(
        self, plans: list[Plan], replies: list[Any]
    ) -> tuple[list[Any], Exception | None]:
        """Send again the releases that a redirect refused (they did not run; cluster.py), as
        `Worker._release_raw` does: on the new owner after MOVED, after a back-off for ASK or
        TRYAGAIN. The handler does not run twice for them."""
        backoff = cluster.Backoff()
        replies = list(replies)
        while backoff.count < REDIRECT_ATTEMPTS:
            refused = [
                i
                for i, r in enumerate(replies)
                if isinstance(r, Exception) and cluster.redirect_kind(r) is not None
            ]
            if not refused:
                break
            log.info(
                "prefetching worker %s: %d release(s) redirected (%s); sending them again",
                self.list_key,
                len(refused),
                replies[refused[0]],
            )
            self.lead.pause(backoff.next())
            if any(cluster.redirect_kind(replies[i]) == cluster.MOVED for i in refused):
                self.follow_slot()
            again, error = self._pipeline(
                [(*RELEASE, *plans[i][2]) for i in refused], scripts.RELEASE, replication.RELEASE
            )
            for n, reply in enumerate(again):
                replies[refused[n]] = reply
            if error is not None:
                # Lost with the connection: those releases and the ones after are unknown.
                lost = refused[len(again)] if len(again) < len(refused) else len(replies)
                return replies[:lost], error
        return replies, None

    def _pipeline(
        self, commands: list[tuple[Any, ...]], script: str, step: replication.Step
    ) -> tuple[list[Any], Exception | None]:
        """Send `commands` (EVALSHA of `script`) in one write; read the replies in order until
        one is lost. Returns the replies read (a ResponseError in place of a failed command's
        reply) and the connection error that ended the reading, if any. A command answered
        NOSCRIPT did not run (the script cache was flushed), so it is sent again as EVAL."""
        replies, error = self._send_and_read(commands, step)
        if error is not None:
            return replies, error
        retry = [i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.NoScriptError)]
        if retry:
            again, error = self._send_and_read(
                [(_EVAL, script, *commands[i][2:]) for i in retry], step
            )
            for n, reply in enumerate(again):
                replies[retry[n]] = reply
            if error is not None:
                # Lost with the connection: that resend and every reply after it are unread.
                del replies[retry[len(again)] :]
        return replies, error

    def _send_and_read(
        self, commands: list[tuple[Any, ...]], step: replication.Step
    ) -> tuple[list[Any], Exception | None]:
        conn = self._conn
        replies: list[Any] = []
        # With min_replicas, one WAIT ends the pipeline: same write, no round trip of its own.
        wait = replication.wait_command(self.settings) if commands else None
        sent = commands if wait is None else [*commands, wait]
        acked: Any = None
        try:
            conn.send_packed_command(conn.pack_commands(sent))  # type: ignore[no-untyped-call]
            for _ in commands:
                try:
                    replies.append(conn.read_response())
                except redis.ResponseError as exc:
                    replies.append(exc)
            if wait is not None:
                try:
                    acked = conn.read_response()
                except redis.ResponseError as exc:
                    acked = exc
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            conn.disconnect()  # type: ignore[no-untyped-call]
            return replies, exc
        if wait is not None:
            self.replicas.check(acked, step)
        return replies, None
