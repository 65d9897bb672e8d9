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

from . import cluster, envelope, replication, scripts
from .errors import MalformedTask
from .worker import (
    NOT_REACHED,
    REDIRECT_ATTEMPTS,
    Outcome,
    Release,
    Worker,
    log_release,
    run_until_stopped,
)

_TAKE = ("EVALSHA", scripts.TAKE_AND_RECORD_SCRIPT.sha, 4)
_RELEASE = ("EVALSHA", scripts.RELEASE_SCRIPT.sha)

log = logging.getLogger("taskcustody.prefetch")

_EVAL = "EVAL"
_NOT_RUN = Outcome(False, error="worker interrupted")


class Batch:
    """The tasks one pipelined take brought in, slot by slot, and what became of each."""

    def __init__(self) -> None:
        self.raws: list[tuple[Worker, bytes, str]] = []  # (slot, raw task, id recorded)
        self.verdicts: list[tuple[str, str | bytes]] = []  # per handled task: (action, data)
        self.errors: list[str] = []  # per handled task: the handler's error ("" if none)


class PrefetchingWorker:
    """`slots` workers driven by one thread: several takes in one round trip, then the batch's
    handlers, then its releases in another round trip. The first slot (the lead) also does
    the blocking take when the queue is empty.

    Each slot is an ordinary `Worker` with its own in-flight list, and each take and release is
    that worker's atomic script (`TAKE_AND_RECORD`, `RELEASE`), so it guarantees what a `Worker`
    does: a lost reply leaves the task in a slot's list (that slot, and every slot whose reply
    came after it, is marked dirty and reconciles before its next take); a task commits at most
    once, and only from the list that still holds it; the batch's releases are sent even when a
    handler is interrupted. The module docstring says why this is still the protocol the model
    checks. A `Server` with `Settings.prefetch` > 1 runs one per worker thread::

        server = Server(client, keys, "s1", handler, settings=Settings(prefetch=8))
        (runner,) = server.start()            # a PrefetchingWorker of 8 slots
        runner.run_once()                     # up to 8 tasks: takes, then releases, batched
    """

    def __init__(self, slots: list[Worker]) -> None:
        if not slots:
            raise ValueError("a prefetching worker needs at least one slot")
        self.slots = slots
        self.lead = slots[0]
        for slot in slots:
            slot.take_next = lambda: False  # our batches take for the slots
        self.owner = self.lead.owner
        self.list_key = self.lead.list_key
        self.settings = self.lead.settings
        self.clock = self.lead.clock
        # Our pipelines' connection, to the node that owns the queue's slot (cluster.py).
        self._conn: redis.connection.ConnectionInterface = cluster.own_connection(
            self.lead.client, self.lead.keys.queue)
        # Settings.min_replicas: each pipeline ends with one WAIT (replication.py).
        self.replicas = replication.Shortfalls(self.settings, self.lead.clock, self.list_key)

    @property
    def list_keys(self) -> tuple[str, ...]:
        return tuple(slot.list_key for slot in self.slots)

    @property
    def dirty(self) -> bool:
        return any(slot.dirty for slot in self.slots)

    @dirty.setter
    def dirty(self, value: bool) -> None:
        for slot in self.slots:
            slot.dirty = value

    # -- the steps ---------------------------------------------------------------------------

    def register(self) -> None:
        for slot in self.slots:
            slot.register()
        scripts.TAKE_AND_RECORD_SCRIPT.load(self.lead.client)

    def take_suspect(self) -> tuple[Batch, Exception | None] | None:
        """A suspect, as a batch of one in the lead slot, if our process holds none (see
        `Worker.take_suspect`; suspects.py): None when there was none to take."""
        lead, keys = self.lead, self.lead.keys
        if not lead.suspects.maybe_waiting or not lead.suspects.acquire(lead.list_key):
            return None
        replies, error = self._pipeline(
            [(*_TAKE, keys.suspects, lead.list_key, keys.processing, keys.inflight_registry,
              lead.record_value(), repr(lead.clock.now()))],
            scripts.TAKE_AND_RECORD, replication.TAKE)
        if not replies:  # the reply was lost: the take may have run (reconcile frees the slot)
            lead.dirty = True
            return Batch(), error
        (reply,) = replies
        if isinstance(reply, redis.ResponseError) or not reply:
            if not reply:
                lead.suspects.maybe_waiting = False
            lead.suspects.release(lead.list_key)
            return (Batch(), reply) if isinstance(reply, redis.ResponseError) else None
        batch = Batch()
        raw, task_id = reply
        batch.raws.append((lead, raw, task_id.decode()))
        return batch, error

    def take_all(self) -> tuple[Batch, Exception | None]:
        """One take per slot, in one round trip. A slot whose reply was lost (and every slot
        after it) is dirty: its task, if the take ran, is debris its reconcile requeues. A
        suspect comes first, alone: a batch of one (its ordinary batches come from the queue
        only, so a suspect never shares a batch)."""
        suspect = self.take_suspect()
        if suspect is not None:
            return suspect
        batch = Batch()
        keys = self.lead.keys
        now = repr(self.lead.clock.now())
        commands = [
            (*_TAKE, keys.queue, slot.list_key, keys.processing, keys.inflight_registry,
             slot.record_value(), now)
            for slot in self.slots
        ]
        replies, error = self._pipeline(commands, scripts.TAKE_AND_RECORD, replication.TAKE)
        for k, reply in enumerate(replies):
            slot = self.slots[k]
            if isinstance(reply, redis.ResponseError):
                # e.g. WRONGTYPE: the script stopped before it moved anything.
                error = error or reply
            elif reply:
                raw, task_id = reply
                batch.raws.append((slot, raw, task_id.decode()))
        for slot in self.slots[len(replies):]:
            slot.dirty = True
        return batch, error

    def handle(self, batch: Batch) -> list[Release]:
        """Execute the batch's tasks in order, then release them all; the releases are sent in
        a `finally`, so an interrupted handler still gives up custody of every task: the one it
        was running (as a failed attempt) and those it had not reached (requeued unchanged)."""
        try:
            for slot, raw, _ in batch.raws:
                try:
                    task = envelope.decode(raw)
                except MalformedTask as exc:
                    batch.verdicts.append(("dead", slot._dead_letter(raw, exc.reason, None)))
                    batch.errors.append(exc.reason)
                    continue
                try:
                    outcome = slot.execute(task)
                except BaseException:
                    batch.verdicts.append(slot.verdict(task, _NOT_RUN))
                    batch.errors.append(_NOT_RUN.error)
                    raise
                batch.verdicts.append(slot.verdict(task, outcome))
                batch.errors.append(outcome.error)
        finally:
            releases = self.release_all(batch)
        return releases

    def release_all(self, batch: Batch) -> list[Release]:
        """One release per task of the batch, in one round trip."""
        plans = []
        logged: list[tuple[str, str | bytes, str]] = []  # per plan: (task id, data, error)
        for i, (slot, raw, recorded_id) in enumerate(batch.raws):
            action, data = batch.verdicts[i] if i < len(batch.verdicts) else ("retry", raw)
            plans.append((slot, action, slot.release_args(raw, recorded_id, action, data)))
            logged.append((recorded_id, data, batch.errors[i] if i < len(batch.errors)
                           else NOT_REACHED))
        replies, error = self._pipeline(
            [(*_RELEASE, *args) for _, _, args in plans], scripts.RELEASE, replication.RELEASE
        )
        if error is None:
            replies, error = self._release_redirected(plans, replies)
        releases = []
        for k, reply in enumerate(replies):
            slot, action, _ = plans[k]
            if isinstance(reply, redis.ResponseError):
                slot.dirty = True
                error = error or reply
            else:
                releases.append(slot.released(reply, action))
                task_id, data, failure = logged[k]
                log_release(slot.list_key, task_id, releases[-1], data, failure,
                            slot.settings.max_attempts, delayed=action == "later")
        for slot, _, _ in plans[len(replies):]:
            # The release may have run: we cannot know whether we committed. It is idempotent,
            # so the slot reconciles later.
            slot.dirty = True
        if error is not None:
            raise error
        return releases

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
        self._conn = cluster.reconnect(self._conn, self.lead.client, self.lead.keys.queue,
                                       refresh_map=refresh)
        for slot in self.slots:
            slot.follow_slot(refresh=False)

    # -- plumbing ----------------------------------------------------------------------------

    def _release_redirected(
        self, plans: list[tuple[Worker, str, tuple[Any, ...]]], replies: list[Any]
    ) -> tuple[list[Any], Exception | None]:
        """Send again the releases that a redirect refused (they did not run; cluster.py), as
        `Worker._release_raw` does: on the new owner after MOVED, after a back-off for ASK or
        TRYAGAIN. The handler does not run twice for them."""
        backoff = cluster.Backoff()
        replies = list(replies)
        while backoff.count < REDIRECT_ATTEMPTS:
            refused = [i for i, r in enumerate(replies) if isinstance(r, Exception)
                       and cluster.redirect_kind(r) is not None]
            if not refused:
                break
            log.info("prefetching worker %s: %d release(s) redirected (%s); sending them again",
                     self.list_key, len(refused), replies[refused[0]])
            self.lead.pause(backoff.next())
            if any(cluster.redirect_kind(replies[i]) == cluster.MOVED for i in refused):
                self.follow_slot()
            again, error = self._pipeline([(*_RELEASE, *plans[i][2]) for i in refused],
                                          scripts.RELEASE, replication.RELEASE)
            for n, reply in enumerate(again):
                replies[refused[n]] = reply
            if error is not None:
                # Lost with the connection: those releases and the ones after are unknown.
                lost = refused[len(again)] if len(again) < len(refused) else len(replies)
                return replies[:lost], error
        return replies, None

    def _raise(self, error: Exception) -> None:
        if isinstance(error, redis.ResponseError):
            self.lead._raise_wrong_type(error, self.lead.keys.queue, *self.list_keys)
        raise error

    def _pipeline(
        self, commands: list[tuple[Any, ...]], script: str, step: str
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
                del replies[retry[len(again)]:]
        return replies, error

    def _send_and_read(
        self, commands: list[tuple[Any, ...]], step: str
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
