"""The threaded worker: take, record, execute, release -- each a public step, called in order by
`run_once` -- on a connection of its own, with its replies pipelined.

The worker talks to Redis on a connection of its own. That lets it send the processing record
without waiting for the reply, and read that reply together with the release's: the record is in
Redis while the handler runs. While the queue is busy the release and the next take are one step
(`release_and_take`, one script): one round trip per task. When that step finds nothing to take,
the next cycle blocks on the server (`take`), so an idle worker waits there, not in a poll loop.
What it sends and how it reads the replies is the custody core's (core/custody.py); the loop that
drives it in production is core/loop.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis

from ..deploy import cluster, replication
from ..deploy.connection import is_fakeredis
from ..deploy.release_refusals import as_refused
from . import envelope, scripts, wire
from .clock import Clock
from .custody import RELEASE_AND_TAKE_CHANGING, RELEASE_CHANGING, Custody, TakeMode
from .envelope import Task
from .errors import MalformedTask
from .keys import ListOwner, QueueKeys
from .loop import run_until_stopped
from .outcome import INTERRUPTED, Outcome, Release, Verdict, failed, log, log_release
from .recovery import Recovering, drain_inflight
from .settings import Settings

#: Times a release refused by a redirect is sent again before the loop takes over (with the
#: back-off capped at cluster.MAX_BACKOFF, some 20 s of a migration or failover).
REDIRECT_ATTEMPTS = 30

Handler = Callable[[Any], Any]
_T = TypeVar("_T")


class Worker(Custody):
    """One worker of a server: it moves tasks from the queue into an in-flight list of its own,
    runs the handler on each, and gives each task up by one atomic release.

    A worker owns exactly one in-flight list, ``keys.inflight(owner)``; `owner` names its
    server id, the server's incarnation and the worker's id. Its cycle is four public steps,
    which `run_once` calls in this order (the model checker and the stateful verifier drive
    them one at a time, in every order the protocol allows):

    - `take`: move the next task from the queue into our list, atomically (BLMOVE), and
      register the list in the same write;
    - `record`: write the processing record (which list holds the task, since when), only
      while the task is still in our list;
    - `execute`: call the handler; its exception is an `Outcome`, not our crash;
    - `release`: in one script, remove the task from our list (LREM) and commit, schedule a
      retry or dead-letter it -- only if the LREM found it there.

    What it guarantees (docs/protocol.md, sections 3 and 6): a task is never only in a reply in
    flight, so a take whose reply is lost leaves it in our list for recovery, not nowhere; a
    task commits at most once, and only by the worker that still holds it (a worker judged dead
    whose list was drained gets ``Release.held`` False and commits nothing); a release runs in
    a ``finally``, so an interrupted handler still gives its task up. A worker that may hold
    debris (a lost reply, a crash) is `dirty` and `reconcile`s its own list before its next
    take; a new worker starts dirty. Handlers run at least once: a task whose worker dies runs
    again elsewhere.

    A worker is normally made and run by a `Server` (`Server.make_worker`); driving one by
    hand shows the steps::

        server = Server(client, keys, "s1", handler)
        (worker,) = server.start()            # claim the id, drain debris, make the workers
        task = worker.take(timeout=1)         # None if the queue stayed empty
        if task is not None:
            worker.record(task)
            done = worker.release(task, worker.execute(task))
            assert done.held and done.action == "committed"
        worker.close()
    """

    client: redis.Redis
    handler: Handler

    def __init__(
        self,
        client: redis.Redis,
        keys: QueueKeys,
        owner: ListOwner,
        handler: Handler,
        clock: Clock,
        settings: Settings | None = None,
    ) -> None:
        super().__init__(client, keys, owner, handler, clock, settings, is_fakeredis(client))
        # A connection of our own, outside the pool: it is held for the worker's whole life and
        # would otherwise count against the pool's limit forever. On a cluster it goes to the
        # master that owns the queue's slot (`follow_slot` moves it when the slot moves).
        self._conn: redis.connection.ConnectionInterface = cluster.own_connection(
            client, keys.queue
        )
        # Redirects (cluster.py): a release refused by MOVED/ASK/TRYAGAIN did not run and is sent
        # again, after `pause` (injected by tests) for ASK/TRYAGAIN. A deferred record refused
        # the same way is sent again before it.
        self.pause: Callable[[float], None] = time.sleep
        self._record_refused = False
        self._unread_replies = 0
        self._deferred: tuple[Any, ...] = ()
        # Settings.min_replicas: the step ("take", "release") whose command the next `_call`
        # follows with WAIT in the same write (None: none), and the WAITs that returned short.
        replication.refuse_fakeredis(client, self.settings)
        self._wait_after: replication.Step | None = None
        self.replicas = replication.Shortfalls(self.settings, clock, self.list_key)
        # The release scripts' commands, packed once but for what changes per task (`_packed`).
        self._templates: dict[int, wire.Template] = {}

    # -- the steps ---------------------------------------------------------------------------

    def register(self) -> None:
        """Load the scripts our own connection calls by hash. (The list itself is registered by
        every take, in the same round trip: see `take`.)"""
        for script in (
            scripts.RECORD_SCRIPT,
            scripts.RELEASE_SCRIPT,
            scripts.TAKE_AND_RECORD_SCRIPT,
            scripts.RELEASE_AND_TAKE_SCRIPT,
        ):
            script.load(self.client)

    def reconcile(self) -> int:
        """Drain our own list back to the queue. Only called while we hold nothing, so whatever
        is there is debris nobody else will release."""
        moved = drain_inflight(
            self.client,
            self.keys,
            self.list_key,
            force=True,
            chunk=self.settings.drain_chunk,
            recovering=Recovering(self.settings.max_recoveries, self.clock.now()),
        )
        self.dirty = False
        # our list is empty: the suspect we held, if any, is gone
        self.suspects.release(self.list_key)
        if moved and self.settings.max_recoveries is not None:
            self.suspects.maybe_waiting = True  # what we moved is counted: a suspect now
        return moved

    def take(self, timeout: float | None = None) -> Task | None:
        """Take a suspect if our process holds none and one waits (`take_suspect`); else
        register our list, then move the next task from the queue into it (one atomic step).

        The registration (ZADD to the registry, score = now) goes in the same write as the
        BLMOVE, so it costs no round trip; it makes sure that recovery can find every list that
        can receive a task, even after Redis lost its data or a sweep forgot the list. Returns
        None when the queue stayed empty for `timeout` seconds, or when what we took was not a
        task envelope (it is dead-lettered at once)."""
        block = self.block(timeout)
        suspect = self.take_suspect()
        if suspect is not None:
            return suspect
        return self._take_from_queue(block)

    def take_from_queue(self, timeout: float | None = None) -> Task | None:
        """`take` without its first step, the take of a suspect: the blocking take from the
        queue alone (the stateful verifier drives the two steps apart)."""
        block = self.block(timeout)
        return self._take_from_queue(block)

    def _take_from_queue(self, block: float) -> Task | None:
        self._registration_error = None
        self._then_wait(replication.TAKE)
        try:
            raw = self._call(*self._take_args(block), first=self.registration())
        except (redis.ResponseError, redis.ConnectionError, redis.TimeoutError) as exc:
            self._take_failed(exc)
            raise
        if self._taken(raw) is None:
            return None
        try:
            return envelope.decode(raw)
        except MalformedTask as exc:
            log.warning("dead-lettering a malformed task: %s", exc)
            self._release_raw(raw, "", "dead", self._dead_letter(raw, exc.reason, None))
            return None

    def take_suspect(self) -> Task | None:
        """If our process holds no suspect, take one: register our list, move the suspects
        list's oldest task into it and write its processing record, in one atomic step (the
        prefetch take's script, from the suspects list). Non-blocking; None if there was none
        (or our process already holds one). The slot stays ours until we are clean again."""
        args = self.acquire_suspect_take()
        if args is None:
            return None
        try:
            try:
                self._then_wait(replication.TAKE)
                reply = self._call("EVALSHA", scripts.TAKE_AND_RECORD_SCRIPT.sha, *args)
            except redis.exceptions.NoScriptError:
                self._then_wait(replication.TAKE)
                reply = self._call("EVAL", scripts.TAKE_AND_RECORD, *args)
        except (redis.ResponseError, redis.ConnectionError, redis.TimeoutError) as exc:
            self._suspect_take_failed(exc)
            raise
        raw = self._suspect_taken(reply)
        if raw is None:
            return None
        try:
            return envelope.decode(raw)
        except MalformedTask as exc:  # recovery only counts envelopes with an id: unreachable
            log.warning("dead-lettering a malformed task: %s", exc)
            self._release_raw(raw, "", "dead", self._dead_letter(raw, exc.reason, None))
            return None

    def record(self, task: Task) -> None:
        """Write the processing record, only while the task is still ours (one Lua step).

        Sent now; its reply is read with the next command's (the release), so the record costs no
        round trip of its own. `flush()` reads it at once."""
        self._deferred = (
            "EVAL",
            scripts.RECORD,
            2,
            self.list_key,
            self.keys.processing,
            task.raw,
            task.id,
            self.record_value(),
        )
        self._record_refused = False  # an earlier task's refused record is moot now
        self._send("EVALSHA", scripts.RECORD_SCRIPT.sha, *self._deferred[2:])

    def flush(self) -> None:
        """Read the replies of commands sent without waiting (a synchronisation point for tests
        and tools that want to see the record in Redis before the release)."""
        if self._unread_replies:
            self._call("PING")

    def answered(self, timeout: float) -> bool:
        """Whether a reply to what this worker sent and has not read has arrived, waiting up to
        `timeout` seconds for one, without reading anything: the reply stays for the next
        command's read, as it would have (`flush()` reads it instead). With one command unread,
        the record the worker sends without waiting, that is: Redis has run it. For a tool that
        reads Redis back from another connection and must not do so before the record has run.
        True at once when nothing is unread, or when the connection has no socket (nothing sent
        on it is pending)."""
        if not self._unread_replies or getattr(self._conn, "_sock", None) is None:
            return True
        return bool(self._conn.can_read(timeout=timeout))

    def execute(self, task: Task) -> Outcome:
        started = time.perf_counter()
        try:
            return Outcome(True, self.handler(task.payload))
        except Exception as exc:  # the handler's failure is data, not our crash
            return failed(exc)
        finally:
            self._handled(started)

    def release(self, task: Task, outcome: Outcome) -> Release:
        """Give up custody, and commit, retry or dead-letter -- only if we still held it."""
        action, data = self.verdict(task, outcome)
        done = self._release_raw(task.raw, task.id, action, data)
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

    def release_and_take(self, task: Task, outcome: Outcome) -> tuple[Release, Task | None]:
        """`release`, and in the same atomic step (one script, one round trip) the take of the
        next task with its processing record: the oldest suspect if our process holds none and
        one may wait, else the queue's next task. Nothing is taken when the release leaves our
        list with debris (we are dirty: reconcile first) or when there is nothing to take; then
        the next cycle's `take` blocks on the server. The task returned is in our list with its
        record written: execute it, then release it. A lost reply loses both halves' answers: we
        are dirty, and the reconcile drains whatever the step took back to the queue."""
        action, data = self.verdict(task, outcome)
        mode = self.take_mode()
        extra = (mode, self.record_value(), repr(self.clock.now()))
        done, reply = self._release_and_take_raw(task.raw, task.id, action, data, extra)
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
        if raw is None:
            return done, None
        self._deferred = ()  # the step wrote the next task's record: nothing to send again
        self._record_refused = False
        try:
            return done, envelope.decode(raw)
        except MalformedTask as exc:
            log.warning("dead-lettering a malformed task: %s", exc)
            self._release_raw(raw, "", "dead", self._dead_letter(raw, exc.reason, None))
            return done, None

    # -- the production loop -----------------------------------------------------------------

    def run_once(self, timeout: float | None = None) -> bool:
        """One cycle. Returns True when a task was handled. The task is the one the last cycle's
        release took (`release_and_take`), or else one this cycle takes (after a reconcile if we
        are dirty); its release takes the next one while `take_next()` says so."""
        task, self._next = self._next, None
        taken_now = task is None
        if task is None:
            if self.dirty:
                self.reconcile()
            task = self.take(timeout)
            if task is None:
                return False
        ran = False
        try:
            if taken_now:
                self.record(task)
            outcome = self.execute(task)
            ran = True
        except BaseException:
            outcome = INTERRUPTED
            raise
        finally:
            # Custody is released whatever happened above; an interrupted cycle takes nothing.
            if ran and self.take_next():
                self._next = self.release_and_take(task, outcome)[1]
            else:
                self.release(task, outcome)
        return True

    def finish(self) -> None:
        """Run the task the last release took, if any, and release it without taking another
        (the loop calls this once it is stopped: that task is in our custody already)."""
        if self._next is not None:
            take_next, self.take_next = self.take_next, lambda: False
            try:
                self.run_once()
            finally:
                self.take_next = take_next

    def run(self, stop: threading.Event, until_idle: bool = False) -> None:
        self.take_next = lambda: not stop.is_set()
        run_until_stopped(self, stop, until_idle, register=self.register)

    @property
    def list_keys(self) -> tuple[str, ...]:
        return (self.list_key,)

    def close(self) -> None:
        self._conn.disconnect()  # type: ignore[no-untyped-call]

    def follow_slot(self, refresh: bool = True) -> None:
        """After MOVED, UNBLOCKED or a lost connection on a cluster: re-read the slot map and
        reconnect our own connection to the master that owns the queue's slot now. What we sent
        on the old connection either did not run (a redirect) or is unknown (a lost reply), so
        we are dirty: the next cycle reconciles our list before taking. On a single node only
        the connection is dropped (it reconnects on the next command)."""
        self.dirty = True
        self._unread_replies = 0
        self._conn = cluster.reconnect(
            self._conn, self.client, self.keys.queue, refresh_map=refresh
        )

    # -- plumbing ----------------------------------------------------------------------------

    def _release_raw(self, raw: bytes, task_id: str, action: Verdict, data: str) -> Release:
        """Release (RELEASE), sent again while Redis redirects it (`_redirected`)."""
        args = self.release_args(raw, task_id, action, data)
        return self._redirected(
            lambda: self.released(self._send_release(args, scripts.RELEASE_SCRIPT), action)
        )

    def _release_and_take_raw(
        self, raw: bytes, task_id: str, action: Verdict, data: str, take: tuple[TakeMode, str, str]
    ) -> tuple[Release, list[Any]]:
        """RELEASE_AND_TAKE (`take`: its last three ARGV), sent again while Redis redirects it:
        the release's reading and the whole reply."""
        args = self.release_and_take_args(raw, task_id, action, data, take)

        def once() -> tuple[Release, list[Any]]:
            reply = list(self._send_release(args, scripts.RELEASE_AND_TAKE_SCRIPT))
            return self.released_and_taken(reply, action), reply

        return self._redirected(once)

    def _redirected(self, send: Callable[[], _T]) -> _T:
        """`send` a release, again while Redis redirects it (it did not run): after MOVED or
        UNBLOCKED on the new owner, after ASK or TRYAGAIN (a migration) on the same one after a
        back-off. Retrying here, not in the loop, spares the handler a second run. After
        REDIRECT_ATTEMPTS the redirect is raised: the loop marks us dirty and the reconcile
        gives the task back to the queue."""
        backoff = cluster.Backoff()
        while True:
            try:
                return send()
            except redis.ResponseError as exc:
                kind = cluster.redirect_kind(exc)
                if kind is None or backoff.count >= REDIRECT_ATTEMPTS:
                    raise
                log.info("worker %s: release redirected (%s); sending it again", self.list_key, exc)
                self.pause(backoff.next())
                if kind == cluster.MOVED:
                    self.follow_slot()

    def _send_release(self, args: tuple[Any, ...], script: scripts.Script) -> Any:
        """Send a release script (by its SHA, then as EVAL after NOSCRIPT) and return its
        reply."""
        if self._record_refused and self._deferred:
            # The record was refused by a redirect (it did not run): send it again first, so
            # that it precedes the release as it did.
            self._record_refused = False
            self._send(*self._deferred)
        try:
            try:
                self._then_wait(replication.RELEASE)
                command = ("EVALSHA", script.sha, *args)
                return self._call(*command, packed=self._packed(command))
            except redis.exceptions.NoScriptError:
                # The script cache was flushed; NOSCRIPT means it did not run, so EVAL is safe.
                self._then_wait(replication.RELEASE)
                return self._call("EVAL", script.source, *args)
        except (redis.ConnectionError, redis.TimeoutError):
            # The release may have run: we cannot know whether we committed. Reconcile later;
            # the release is idempotent (a second one finds nothing to remove and commits nothing).
            self.dirty = True
            raise
        except redis.ResponseError as exc:
            refused = as_refused(exc)
            if refused is exc:
                raise
            # Refused (release_refusals.py): the task is still in our list; reconcile it.
            self.dirty = True
            raise refused from exc

    def _packed(self, command: tuple[Any, ...]) -> bytes:
        """The bytes of a release's EVALSHA (RELEASE or RELEASE_AND_TAKE, told apart by their
        number of keys), from a template built at its first use (wire.py)."""
        numkeys = command[2]
        template = self._templates.get(numkeys)
        if template is None:
            changing = RELEASE_CHANGING if numkeys == 10 else RELEASE_AND_TAKE_CHANGING
            template = self._templates[numkeys] = wire.Template(command, {2 + i for i in changing})
        return template.pack(command)

    def _send(
        self,
        *args: Any,
        first: tuple[Any, ...] | None = None,
        then: tuple[Any, ...] | None = None,
        packed: bytes | None = None,
    ) -> None:
        """Send a command, with `first` before it and `then` after it, in ONE write: the take's
        registration must reach Redis with its BLMOVE (a stall between two writes could let the
        registration age past the registry's grace before the BLMOVE is even sent), and a WAIT
        adds no round trip."""
        commands = [c for c in (first, args, then) if c is not None]
        try:
            if packed is not None:
                # (`args`'s bytes, built by a wire.Template; a WAIT after it packed as usual)
                tail = [] if then is None else self._conn.pack_commands([then])  # type: ignore[no-untyped-call]
                self._conn.send_packed_command([packed, *tail])  # type: ignore[no-untyped-call]
            elif len(commands) == 1:
                self._conn.send_command(*args)  # type: ignore[no-untyped-call]
            else:
                packed = self._conn.pack_commands(commands)  # type: ignore[no-untyped-call]
                self._conn.send_packed_command(packed)  # type: ignore[no-untyped-call]
        except (redis.ConnectionError, redis.TimeoutError):
            self.dirty = True
            self._unread_replies = 0
            raise
        self._unread_replies += len(commands)

    def _then_wait(self, step: replication.Step) -> None:
        """With `Settings.min_replicas`, the next `_call` sends `WAIT` right after its command in
        the same write, reads its reply after the command's, and counts a short one
        (replication.py). Without, nothing changes."""
        self._wait_after = step if self.settings.min_replicas else None

    def _call(
        self, *args: Any, first: tuple[Any, ...] | None = None, packed: bytes | None = None
    ) -> Any:
        """Send a command and return its reply, first reading the replies of deferred commands.
        `first` goes just before it, in the same write (the take's registration): its error, if
        any, is kept in `_registration_error`."""
        step, self._wait_after = self._wait_after, None
        wait = replication.wait_command(self.settings) if step else None
        self._send(*args, first=first, then=wait, packed=packed)
        # WAIT's reply comes after the command's. If the command fails (NOSCRIPT, WRONGTYPE),
        # the WAIT's reply stays unread and counted: the next call reads it as a deferred one.
        trailing = 0 if wait is None else 1
        resend_record = False
        acked: Any = None
        try:
            while self._unread_replies > 1 + trailing:  # deferred replies come first
                self._unread_replies -= 1
                try:
                    self._conn.read_response()
                except redis.ResponseError as exc:
                    if first is not None and self._unread_replies == 1 + trailing:
                        self._registration_error = exc
                    else:
                        resend_record = self._deferred_failed(exc)
            self._unread_replies -= 1
            reply = self._conn.read_response()
            if wait is not None:
                self._unread_replies -= 1
                try:
                    acked = self._conn.read_response()
                except redis.ResponseError as exc:
                    acked = exc
        except (redis.ConnectionError, redis.TimeoutError):
            self._unread_replies = 0
            raise
        if resend_record:
            self._send(*self._deferred)
            self._unread_replies -= 1
            self._conn.read_response()
        if wait is not None and step is not None:
            self.replicas.check(acked, step)
        return reply

    def _deferred_failed(self, exc: redis.ResponseError) -> bool:
        """True if the deferred record must be sent again."""
        if isinstance(exc, redis.exceptions.NoScriptError) and self._deferred:
            # The script cache was flushed (a Redis restart): NOSCRIPT means the record did not
            # run, so sending the whole script is safe.
            return True
        if cluster.redirect_kind(exc) is not None and self._deferred:
            # Refused by a redirect: it did not run. It goes again before the next release
            # (`_release_once`), on the connection to the slot's owner.
            self._record_refused = True
            return False
        log.warning("worker %s: deferred command failed: %s", self.list_key, exc)
        return False
