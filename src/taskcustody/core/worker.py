"""One worker: take, record, execute, release -- each a public step, called in order by `run`.

The worker talks to Redis on a connection of its own. That lets it send the processing record
without waiting for the reply, and read that reply together with the release's: the record is in
Redis while the handler runs. While the queue is busy the release and the next take are one step
(`release_and_take`, one script): one round trip per task. When that step finds nothing to take,
the next cycle blocks on the server (`take`), so an idle worker waits there, not in a poll loop.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import logging
import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import redis

from .. import scripts
from ..deploy import cluster, replication
from ..deploy.connection import is_fakeredis
from ..deploy.oom import OomSpell, is_oom
from ..deploy.release_refusals import RefusedReleases, as_refused
from ..ops import events
from . import envelope, scheduled, wire
from .clock import Clock
from .envelope import Task
from .errors import MalformedTask, ReleaseRefused, WrongKeyType
from .keys import ListOwner, QueueKeys
from .recovery import Recovering, drain_inflight
from .settings import Settings
from .suspects import SuspectSlot

log = logging.getLogger("taskcustody.worker")

#: Times a release refused by a redirect is sent again before the loop takes over (with the
#: back-off capped at cluster.MAX_BACKOFF, some 20 s of a migration or failover).
REDIRECT_ATTEMPTS = 30

Handler = Callable[[Any], Any]
_T = TypeVar("_T")


@dataclass(frozen=True)
class Outcome:
    """What the handler did: returned `result`, or raised `error` (its one-line text, for logs,
    `dead list` and `TaskFailed`), with its `traceback` (bounded: `bounded_traceback`), which a
    dead letter keeps for `dead show`."""

    ok: bool
    result: Any = None
    error: str = ""
    # Not compared: two outcomes are the same failure when their errors are (the traceback
    # names where it happened, and what called the handler).
    traceback: str = field(default="", compare=False)


@dataclass(frozen=True)
class Release:
    """What the release step found. `held` False: our list had been drained (we were judged dead),
    the task is someone else's now, and we did not commit. `remaining` > 0: debris in our list."""

    held: bool
    remaining: int
    action: str  # "committed", "retried", "dead-lettered", or "lost-custody"


#: The most characters of a handler's traceback a dead letter keeps. Bounded because a dead letter
#: stays in Redis (no TTL) until it is requeued or purged, `dead list` reads them all, and every
#: poll of `get_result` reads the newest hundred: a deep recursion's traceback (hundreds of KB)
#: would weigh on all of them. 4,096 is some thirty frames of the usual length, the innermost ones.
MAX_TRACEBACK = 4096

#: Where the frames above a handler's own are: the taskcustody package (every worker's `execute`,
#: threaded, prefetching or asyncio), and the machinery an asyncio worker runs a plain handler
#: through (`asyncio.to_thread`).
_ABOVE_THE_HANDLER = tuple(
    os.path.dirname(path) + os.sep
    for path in (os.path.dirname(os.path.dirname(__file__)) + os.sep, asyncio.__file__,
                 concurrent.futures.__file__))


def bounded_traceback(exc: BaseException, limit: int = MAX_TRACEBACK) -> str:
    """`exc`'s formatted traceback from the handler's frame down (the worker's frames above it
    say nothing about the failure), at most `limit` characters: past that, the head line, a line
    saying how much was left out, and the tail -- the innermost frames and the error itself."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and \
            tb.tb_frame.f_code.co_filename.startswith(_ABOVE_THE_HANDLER):
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb)).rstrip("\n")
    if len(text) <= limit:
        return text
    def marker(cut: int) -> str:
        return f"  ... {cut} characters of the traceback left out (at most {limit} kept) ..."

    head = text.partition("\n")[0][: limit // 4]
    room = limit - len(head) - len(marker(len(text))) - 2  # the marker's longest, two newlines
    tail = text[-room:]
    tail = tail.partition("\n")[2] or tail  # start on a whole line
    return f"{head}\n{marker(len(text) - len(head) - len(tail))}\n{tail}"


def failed(exc: BaseException) -> Outcome:
    """The outcome of a handler that raised `exc`: its one-line text is the error, and its
    traceback goes with it. The one place every worker (threaded, asyncio, prefetching) builds a
    failed outcome."""
    return Outcome(False, error="".join(traceback.format_exception_only(exc)).strip(),
                   traceback=bounded_traceback(exc))


#: The outcome of a handler interrupted before it returned (a crash of the cycle, a cancellation):
#: released as a failed attempt.
INTERRUPTED = Outcome(False, error="worker interrupted")


def _result_json(result: Any) -> str:
    """The stored result. A value JSON cannot hold is stored as its repr: the task still commits
    (it ran), and failing here would skip the release. None is stored too (as JSON null): a
    waiter (results.get_result) must tell "returned None" from "not done yet"."""
    try:
        return json.dumps(result, allow_nan=False)
    except (TypeError, ValueError):
        return json.dumps({"unserialisable_result": repr(result)})


def _attempts(data: str | bytes) -> int:
    """The attempts count of a retried envelope (the attempt that just failed, from 1)."""
    try:
        return int(json.loads(data)["attempts"])
    except (ValueError, KeyError, TypeError):
        return 1



#: The positions in `Worker.release_args` that change from one task to the next (the result key,
#: the raw task, its id, the outcome, its data, the due time); the others are the worker's keys
#: and settings. RELEASE_AND_TAKE's arguments are RELEASE's with the registry after the keys (so
#: the argv positions move one on) and three more at the end, which change too (what to take, the
#: next record, now). tests/test_wire.py checks that these are the positions that change.
RELEASE_CHANGING = frozenset({7, 11, 12, 13, 14, 17})
RELEASE_AND_TAKE_CHANGING = frozenset(
    {i if i < 11 else i + 1 for i in RELEASE_CHANGING} | {19, 20, 21})

#: The error of a prefetched task that its batch never reached (requeued unchanged).
NOT_REACHED = "not run: the worker stopped before it reached this task"


def log_release(list_key: str, task_id: str, done: Release, data: str | bytes, error: str,
                max_attempts: int, delayed: bool = False) -> None:
    """One log line per release: a retry and a lost custody (warning), a dead letter (error), a
    commit (debug), each with the task's id (also as the `task_id` field of a JSON line).
    `delayed`: a failed task's retry went to the scheduled set (`Settings.retry_backoff`)."""
    if events.listeners:
        events.emit("released", list_key=list_key, task_id=task_id, action=done.action)
    extra = {"task_id": task_id, "action": done.action}
    if done.action == "committed":
        log.debug("task %s committed by %s", task_id, list_key, extra=extra)
    elif done.action == "retried":
        try:
            attempts = int(json.loads(data)["attempts"])
        except (ValueError, KeyError, TypeError):
            attempts = 0
        if error == NOT_REACHED:
            log.info("task %s requeued as it was: %s", task_id, error, extra=extra)
        else:
            log.warning("task %s failed (attempt %d of %d), %s: %s", task_id, attempts,
                        max_attempts, "scheduled for a retry after its backoff" if delayed
                        else "requeued for a retry", error or "worker interrupted", extra=extra)
    elif done.action == "dead-lettered":
        if not error:
            try:
                error = str(json.loads(data)["error"])
            except (ValueError, KeyError, TypeError):
                error = "?"
        log.error("task %s dead-lettered: %s", task_id, error, extra=extra)
    else:
        log.warning("task %s: lost custody in %s (judged dead meanwhile: recovery took it "
                    "back): this run's result is not committed", task_id, list_key, extra=extra)


class Custody:
    """The sans-IO half of a worker: the commands its steps send and the reading of their
    replies, with no I/O of its own. `Worker` (threads) and `taskcustody.aio.AsyncWorker`
    (asyncio) both inherit it, so the two build the same take, the same release arguments and the
    same verdicts, and read replies the same way; each only sends them its own way."""

    def __init__(self, client: Any, keys: QueueKeys, owner: ListOwner, handler: Any,
                 clock: Clock, settings: Settings | None, fake: bool) -> None:
        self.client = client
        self.keys = keys
        self.owner = owner
        self.handler = handler
        self.clock = clock
        self.settings = settings or Settings()
        self.list_key = keys.inflight(owner)
        # A dirty worker may have debris in its list (a take whose reply was lost, an unknown
        # release): it reconciles before its next take. A new worker starts dirty: a restarted
        # worker drains its own list before taking work.
        self.dirty = True
        # fakeredis's BLMOVE does not block and can write None into the destination list (pinned
        # in tests/test_fakeredis_gaps.py); BRPOPLPUSH is the same atomic RIGHT->LEFT move and
        # blocks correctly there. Real Redis always gets BLMOVE.
        self.take_command = "BRPOPLPUSH" if fake else "BLMOVE"
        # At most one suspect per process: a Server gives all its workers one slot; a lone
        # worker is a process of its own.
        self.suspects = SuspectSlot()
        #: Whether `run_once`'s release also takes the next task (`release_and_take`). The
        #: production loop (`run`) says yes until it is stopped; a `run_once` called on its own is
        #: one whole cycle and leaves nothing in custody; a prefetching worker's slots never (their
        #: batches take for them).
        self.take_next: Callable[[], bool] = lambda: False
        # The task the last `release_and_take` took into custody (its record written): the next
        # `run_once` runs it without a take.
        self._next: Task | None = None
        self._registration_error: redis.ResponseError | None = None

    def block(self, timeout: float | None) -> float:
        """A take's block timeout: `Settings.block_timeout`, or `timeout` once checked."""
        return self.settings.block_timeout if timeout is None else self._checked_block(timeout)

    def _checked_block(self, timeout: float) -> float:
        """A take's own timeout must keep the promise `Settings` checks for block_timeout: Redis
        serves or times out the BLMOVE before its registration ages past the registry's grace.
        A longer one would let a stalled worker's pending BLMOVE fill a list that a sweep forgot
        meanwhile (a task no recovery can find); 0 would block forever."""
        grace, margin = self.settings.registry_grace, self.settings.socket_timeout_margin
        if timeout <= 0:
            raise ValueError("take timeout must be > 0 (0 would block forever)")
        if grace and timeout + margin >= grace:
            raise ValueError(
                f"take timeout {timeout:g} s must be shorter than registry_grace - "
                f"socket_timeout_margin ({grace - margin:g} s): a take may be pending that long"
            )
        return timeout

    def registration(self) -> tuple[Any, ...] | None:
        """The command that registers our list, sent in the same write as every take."""
        return ("ZADD", self.keys.inflight_registry, repr(self.clock.now()), self.list_key)

    def _take_args(self, block: float) -> tuple[Any, ...]:
        if self.take_command == "BLMOVE":
            return ("BLMOVE", self.keys.queue, self.list_key, "RIGHT", "LEFT", block)
        return ("BRPOPLPUSH", self.keys.queue, self.list_key, block)

    def verdict(self, task: Task, outcome: Outcome) -> tuple[str, str]:
        """What the release does with a task the handler ran: (action, data) for RELEASE."""
        if outcome.ok:
            # result_ttl 0: store no result (RELEASE skips an empty one).
            return "ok", _result_json(outcome.result) if self.settings.result_ttl else ""
        if task.attempts + 1 < self.settings.max_attempts:
            # with a retry delay, "later": the release schedules it (`release_args` draws the
            # due time); without, "retry": straight back on the queue
            return ("later" if self.settings.retry_backoff > 0 else "retry",
                    task.retried().raw.decode())
        return "dead", self._dead_letter(task.raw, outcome.error, task.id, outcome.traceback)

    def record_value(self) -> str:
        """A processing record: whose list holds the task, and since when."""
        return f"{self.list_key} {self.clock.now()!r}"

    def release_args(
        self, raw: bytes, task_id: str, action: str, data: str | bytes
    ) -> tuple[Any, ...]:
        """RELEASE's arguments after the script (numkeys, keys, argv). A delayed retry
        ("later") carries its due time: now + the jittered backoff of the attempt that failed
        (`data` is the retried envelope, whose attempts count it)."""
        keys = self.keys
        due = ""
        if action == "later":
            due = repr(self.clock.now() + scheduled.retry_delay(_attempts(data), self.settings))
        return (
            10, self.list_key, keys.processing, keys.queue, keys.dead_letters, keys.committed,
            keys.commit_log, keys.result(task_id or "-"), keys.recoveries, keys.suspects,
            keys.scheduled,
            raw, task_id, action, data, self.settings.result_ttl,
            1 if self.settings.track_commits else 0, due,
        )

    def released(self, reply: Any, action: str, keep_slot: bool = False) -> Release:
        """Read RELEASE's reply: {held, what remains in our list, suspects waiting} (the first
        three of RELEASE_AND_TAKE's; `keep_slot`: it took a suspect, which keeps the slot)."""
        held, remaining, *waiting = reply
        self.dirty = self.dirty or int(remaining) > 0
        if waiting and int(waiting[0]) > 0:
            self.suspects.maybe_waiting = True
        if not self.dirty and not keep_slot:
            # clean again: the suspect we held, if any, is done
            self.suspects.release(self.list_key)
        if not held:
            return Release(False, int(remaining), "lost-custody")
        names = {"ok": "committed", "retry": "retried", "later": "retried",
                 "dead": "dead-lettered"}
        return Release(True, int(remaining), names[action])

    def _dead_letter(self, raw: bytes, error: str, task_id: str | None,
                     trace: str = "") -> str:
        """The dead-letter entry (deadletters.py reads it). RELEASE pushes these bytes as they
        are, so a field added here needs no change to the script. The traceback is a field of its
        own, not folded into `error`: `error` stays the one line that logs, `dead list` and
        `TaskFailed` show, and entries written before it read the same."""
        entry: dict[str, Any] = {
            "raw": base64.b64encode(raw).decode(),
            "error": error,
            "task_id": task_id,
            "at": self.clock.now(),
        }
        if trace:
            entry["traceback"] = trace
        return json.dumps(entry)

    def _take_failed(self, exc: BaseException) -> None:
        """The take's command failed (the caller raises `exc` on): a wrong-type reply is named;
        any other failure but a refusal may have lost the reply of a move that happened, so the
        task would sit in our list: dirty, reconcile before the next take."""
        if isinstance(exc, redis.ResponseError):
            self._raise_wrong_type(exc, self.keys.queue, self.list_key)
        else:
            self.dirty = True

    def _taken(self, raw: Any) -> Any:
        """The take's reply once read: raises the registration's refusal, or gives the raw task
        (None when the queue stayed empty)."""
        if self._registration_error is not None:
            # The move may have put a task into a list recovery cannot find: give it back to the
            # queue (reconcile) before anything else.
            self.dirty = True
            self._raise_wrong_type(self._registration_error, self.keys.inflight_registry)
            raise self._registration_error
        if raw is None:
            # Idle: a suspect pushed meanwhile is seen at the next take (so within the block
            # timeout), even if no release told us.
            self.suspects.maybe_waiting = True
        return raw

    def _suspect_take_failed(self, exc: BaseException) -> None:
        """`_take_failed` for the take of a suspect (whose slot a refused script leaves free)."""
        if isinstance(exc, redis.ResponseError):
            self.suspects.release(self.list_key)  # the script did not move anything
            self._raise_wrong_type(exc, self.keys.suspects, self.list_key)
        else:
            # The move may have happened with its reply lost: reconcile (which frees the slot).
            self.dirty = True

    def _suspect_taken(self, reply: Any) -> Any:
        """The raw suspect in the script's reply, or None (none waited: the slot is freed)."""
        if not reply:
            self.suspects.maybe_waiting = False
            self.suspects.release(self.list_key)
            return None
        return reply[0]

    def _handled(self, started: float) -> None:
        """The `handled` event (the handler's time since `started`), when anyone listens."""
        if events.listeners:
            events.emit("handled", list_key=self.list_key,
                        seconds=time.perf_counter() - started)

    def _raise_wrong_type(self, exc: redis.ResponseError, *keys: str) -> None:
        if "WRONGTYPE" in str(exc):
            raise WrongKeyType(
                f"one of {', '.join(keys)} holds the wrong Redis type ({exc})"
            ) from exc

    def acquire_suspect_take(self) -> tuple[Any, ...] | None:
        """TAKE_AND_RECORD's arguments (numkeys, keys, argv) for the take of a suspect, once the
        process's suspect slot is ours; None when no suspect may wait or another worker of the
        process holds the slot (then no take is sent)."""
        if not self.suspects.maybe_waiting or not self.suspects.acquire(self.list_key):
            return None
        return (4, self.keys.suspects, self.list_key, self.keys.processing,
                self.keys.inflight_registry, self.record_value(), repr(self.clock.now()))

    def take_mode(self) -> str:
        """What a `release_and_take` takes after its release: 'suspect' while our process holds
        no suspect or we hold it (it is this task, whose release runs first in the same step):
        the step then prefers a waiting suspect; a dirty worker takes nothing ('': it reconciles
        first, its list may hold debris); else 'queue'."""
        if self.dirty:
            return ""
        if self.suspects.maybe_waiting and self.suspects.acquire(self.list_key):
            return "suspect"
        return "queue"

    def release_and_take_args(self, raw: bytes, task_id: str, action: str, data: str,
                              take: tuple[str, str, str]) -> tuple[Any, ...]:
        """RELEASE_AND_TAKE's arguments: RELEASE's with the registry after the keys, and `take`
        (mode, next record, now) as its last three ARGV."""
        numkeys, *rest = self.release_args(raw, task_id, action, data)
        return (numkeys + 1, *rest[:numkeys], self.keys.inflight_registry, *rest[numkeys:],
                *take)

    def released_and_taken(self, reply: list[Any], action: str) -> Release:
        """Read the release half of RELEASE_AND_TAKE's reply (a suspect taken in the step keeps
        our process's slot ours: reply[5])."""
        keep = len(reply) > 5 and int(reply[5]) == 1
        return self.released(reply, action, keep_slot=keep)

    def after_release_and_take(self, reply: list[Any], mode: str) -> bytes | None:
        """The raw task RELEASE_AND_TAKE took, or None (then, if it looked for a suspect and
        none waits, our process stops looking until told again)."""
        if len(reply) <= 3:
            if mode == "suspect" and not int(reply[2]):
                self.suspects.maybe_waiting = False
            return None
        raw: bytes = reply[3]
        return raw


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
            client, keys.queue)
        # Redirects (cluster.py): a release refused by MOVED/ASK/TRYAGAIN did not run and is sent
        # again, after `pause` (injected by tests) for ASK/TRYAGAIN. A deferred record refused
        # the same way is sent again before it.
        self.pause: Callable[[float], None] = time.sleep
        self._record_refused = False
        self._unread_replies = 0
        self._deferred: tuple[Any, ...] = ()
        # Settings.min_replicas: the step ("take", "release") whose command the next `_call`
        # follows with WAIT in the same write ("" = none), and the WAITs that returned short.
        replication.refuse_fakeredis(client, self.settings)
        self._wait_after = ""
        self.replicas = replication.Shortfalls(self.settings, clock, self.list_key)
        # The release scripts' commands, packed once but for what changes per task (`_packed`).
        self._templates: dict[int, wire.Template] = {}

    # -- the steps ---------------------------------------------------------------------------

    def register(self) -> None:
        """Load the scripts our own connection calls by hash. (The list itself is registered by
        every take, in the same round trip: see `take`.)"""
        for script in (scripts.RECORD_SCRIPT, scripts.RELEASE_SCRIPT,
                       scripts.TAKE_AND_RECORD_SCRIPT, scripts.RELEASE_AND_TAKE_SCRIPT):
            script.load(self.client)

    def reconcile(self) -> int:
        """Drain our own list back to the queue. Only called while we hold nothing, so whatever
        is there is debris nobody else will release."""
        moved = drain_inflight(self.client, self.keys, self.list_key, force=True,
                               chunk=self.settings.drain_chunk,
                               recovering=Recovering(self.settings.max_recoveries,
                                                     self.clock.now()))
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
        self._deferred = ("EVAL", scripts.RECORD, 2, self.list_key, self.keys.processing,
                          task.raw, task.id, self.record_value())
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
        log_release(self.list_key, task.id, done, data, outcome.error, self.settings.max_attempts,
                    delayed=action == "later")
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
        log_release(self.list_key, task.id, done, data, outcome.error, self.settings.max_attempts,
                    delayed=action == "later")
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
        self._conn = cluster.reconnect(self._conn, self.client, self.keys.queue,
                                       refresh_map=refresh)

    # -- plumbing ----------------------------------------------------------------------------

    def _release_raw(self, raw: bytes, task_id: str, action: str, data: str) -> Release:
        """Release (RELEASE), sent again while Redis redirects it (`_redirected`)."""
        args = self.release_args(raw, task_id, action, data)
        return self._redirected(lambda: self.released(
            self._send_release(args, scripts.RELEASE_SCRIPT), action))

    def _release_and_take_raw(self, raw: bytes, task_id: str, action: str, data: str,
                              take: tuple[str, str, str]) -> tuple[Release, list[Any]]:
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
                log.info("worker %s: release redirected (%s); sending it again", self.list_key,
                         exc)
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
            template = self._templates[numkeys] = wire.Template(
                command, {2 + i for i in changing})
        return template.pack(command)

    def _send(self, *args: Any, first: tuple[Any, ...] | None = None,
              then: tuple[Any, ...] | None = None, packed: bytes | None = None) -> None:
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

    def _then_wait(self, step: str) -> None:
        """With `Settings.min_replicas`, the next `_call` sends `WAIT` right after its command in
        the same write, reads its reply after the command's, and counts a short one
        (replication.py). Without, nothing changes."""
        self._wait_after = step if self.settings.min_replicas else ""

    def _call(self, *args: Any, first: tuple[Any, ...] | None = None,
              packed: bytes | None = None) -> Any:
        """Send a command and return its reply, first reading the replies of deferred commands.
        `first` goes just before it, in the same write (the take's registration): its error, if
        any, is kept in `_registration_error`."""
        step, self._wait_after = self._wait_after, ""
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
        if wait is not None:
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


class Runnable(Protocol):
    """What `run_until_stopped` drives: a `Worker`, or a `PrefetchingWorker`."""

    list_key: str
    dirty: bool
    settings: Settings
    clock: Clock

    def run_once(self, timeout: float | None = None) -> bool: ...

    def finish(self) -> None: ...

    def follow_slot(self, refresh: bool = True) -> None: ...


class Stop(Protocol):
    """The stop event's part the loop uses (a threading.Event; tests record the waits)."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


def run_until_stopped(unit: Runnable, stop: Stop, until_idle: bool,
                      register: Callable[[], None] | None = None) -> None:
    """The production loop: `register`, then cycles until `stop` is set (or, with `until_idle`,
    until a cycle finds the queue empty). Losing Redis is not a crash: the unit reconciles when it
    is back. Nor is Redis out of memory: the unit waits, logging at most once per
    `oom_log_interval`, and carries on when memory frees. Nor a release Redis refuses
    (`ReleaseRefused`): the same back-off and throttled line, and a reconcile before the next
    take."""
    oom = OomSpell(log, f"worker {unit.list_key}", unit.clock, unit.settings.oom_log_interval,
                   first_pause=min(1.0, unit.settings.block_timeout))
    refusals = RefusedReleases(log, f"worker {unit.list_key}", unit.clock,
                               unit.settings.oom_log_interval,
                               first_pause=min(1.0, unit.settings.block_timeout))
    redirected = cluster.Backoff()
    if register is not None:
        # The unit's set-up (loading its scripts) comes before any take, whatever: the first
        # attempt is made even if already stopped, and under OOM it is retried until it works
        # or we are stopped. (Its lists are registered by the claim and by every take.)
        while True:
            try:
                register()
                break
            except redis.ResponseError as exc:
                if not is_oom(exc):
                    raise
                stop.wait(oom.refused(exc))
                if stop.is_set():
                    return
    while not stop.is_set():
        try:
            handled = unit.run_once()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("worker %s: Redis unreachable (%s); will reconcile", unit.list_key, exc)
            unit.dirty = True
            stop.wait(min(1.0, unit.settings.block_timeout))
            _follow(unit)  # on a cluster the slot may have failed over to another node
            continue
        except ReleaseRefused as exc:
            # Not a crash (the supervisor would restart us into the same refusal, one traceback
            # per task): the task is in our list, not committed; dirty, the next cycle drains it
            # back to the queue before it takes, as after a crash.
            unit.dirty = True
            stop.wait(refusals.refused(exc))
            continue
        except (redis.ResponseError, redis.exceptions.ClusterError,
                redis.exceptions.RedisClusterException) as exc:
            kind = cluster.redirect_kind(exc)
            if kind is not None:
                # The redirected command did not run (cluster.py); whatever ran before it in
                # this cycle is in our list: dirty, so the next cycle reconciles first. Never a
                # crash, never the handler's failure.
                if redirected.count == 0:
                    log.warning("worker %s: %s; following the slot", unit.list_key, exc)
                unit.dirty = True
                stop.wait(redirected.next())
                if kind == cluster.MOVED:
                    _follow(unit)
                continue
            if not is_oom(exc):
                raise
            assert isinstance(exc, redis.ResponseError)
            # The refused command did not run (see oom.py). A refused take or reconcile left
            # nothing behind; a refused release would have left its task in our list, not
            # committed: dirty makes the next cycle drain it back to the queue (once memory
            # frees) before taking anything, so it is run again and committed once. An empty
            # list makes that reconcile one LLEN.
            unit.dirty = True
            stop.wait(oom.refused(exc))
            continue
        oom.recovered()
        refusals.recovered()
        redirected.reset()
        if until_idle and not handled:
            return
    # Stopped: a task the last release took (release_and_take) is in our custody already, with
    # its record: run and release it like any current task (within the shutdown grace).
    try:
        unit.finish()
    except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
        log.warning("worker %s: could not finish the task it held (%s); recovery will requeue it",
                    unit.list_key, exc)


def _follow(unit: Runnable) -> None:
    """Reconnect to the slot's owner; if the cluster cannot tell it now, the next cycle fails
    again and we come back here."""
    try:
        unit.follow_slot()
    except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
        log.warning("worker %s: cannot read the cluster's slot map (%s)", unit.list_key, exc)
