"""The pure custody core of a worker: the commands its steps send and the reading of their
replies, with no I/O and no threads of its own (`Custody`).

`taskcustody.core.worker.Worker` (threads, its own connection) and
`taskcustody.aio.AsyncWorker` (asyncio) both inherit it, so the two build the same take, the same
release arguments and the same verdicts, and read replies the same way; each only sends them its
own way. The prefetching workers' slots are `Worker`s too (core/prefetch_custody.py).
"""

from __future__ import annotations

import base64
import json
import math
import time
from collections.abc import Callable
from typing import Any, Literal

import redis

from ..ops import events
from . import scheduled
from .clock import Clock
from .envelope import Task
from .errors import WrongKeyType
from .keys import ListOwner, QueueKeys
from .outcome import ACTIONS, Outcome, Release, Verdict
from .settings import Settings
from .suspects import SuspectSlot

#: What a `release_and_take` takes after its release: the oldest suspect ("suspect"), the
#: queue's next task ("queue"), or nothing ("": a dirty worker reconciles first). The script's
#: last-but-two ARGV (scripts.py).
TakeMode = Literal["suspect", "queue", ""]


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
    {i if i < 11 else i + 1 for i in RELEASE_CHANGING} | {19, 20, 21}
)


class Custody:
    """The sans-IO half of a worker: the commands its steps send and the reading of their
    replies, with no I/O of its own. `Worker` (threads) and `taskcustody.aio.AsyncWorker`
    (asyncio) both inherit it, so the two build the same take, the same release arguments and the
    same verdicts, and read replies the same way; each only sends them its own way."""

    def __init__(
        self,
        client: Any,
        keys: QueueKeys,
        owner: ListOwner,
        handler: Any,
        clock: Clock,
        settings: Settings | None,
        fake: bool,
    ) -> None:
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
        if not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(
                f"take timeout must be a finite number > 0 (0 would block forever), not {timeout}"
            )
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

    def verdict(self, task: Task, outcome: Outcome) -> tuple[Verdict, str]:
        """What the release does with a task the handler ran: (action, data) for RELEASE."""
        if outcome.ok:
            # result_ttl 0: store no result (RELEASE skips an empty one).
            return "ok", _result_json(outcome.result) if self.settings.result_ttl else ""
        if task.attempts + 1 < self.settings.max_attempts:
            # with a retry delay, "later": the release schedules it (`release_args` draws the
            # due time); without, "retry": straight back on the queue
            return (
                "later" if self.settings.retry_backoff > 0 else "retry",
                task.retried().raw.decode(),
            )
        return "dead", self._dead_letter(task.raw, outcome.error, task.id, outcome.traceback)

    def record_value(self) -> str:
        """A processing record: whose list holds the task, and since when."""
        return f"{self.list_key} {self.clock.now()!r}"

    def release_args(
        self, raw: bytes, task_id: str, action: Verdict, data: str | bytes
    ) -> tuple[Any, ...]:
        """RELEASE's arguments after the script (numkeys, keys, argv). A delayed retry
        ("later") carries its due time: now + the jittered backoff of the attempt that failed
        (`data` is the retried envelope, whose attempts count it)."""
        keys = self.keys
        due = ""
        if action == "later":
            due = repr(self.clock.now() + scheduled.retry_delay(_attempts(data), self.settings))
        return (
            10,
            self.list_key,
            keys.processing,
            keys.queue,
            keys.dead_letters,
            keys.committed,
            keys.commit_log,
            keys.result(task_id or "-"),
            keys.recoveries,
            keys.suspects,
            keys.scheduled,
            raw,
            task_id,
            action,
            data,
            self.settings.result_ttl,
            1 if self.settings.track_commits else 0,
            due,
        )

    def released(self, reply: Any, action: Verdict, keep_slot: bool = False) -> Release:
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
        return Release(True, int(remaining), ACTIONS[action])

    def _dead_letter(self, raw: bytes, error: str, task_id: str | None, trace: str = "") -> str:
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
            events.emit("handled", list_key=self.list_key, seconds=time.perf_counter() - started)

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
        return (
            4,
            self.keys.suspects,
            self.list_key,
            self.keys.processing,
            self.keys.inflight_registry,
            self.record_value(),
            repr(self.clock.now()),
        )

    def take_mode(self) -> TakeMode:
        """What a `release_and_take` takes after its release: 'suspect' while our process holds
        no suspect or we hold it (it is this task, whose release runs first in the same step):
        the step then prefers a waiting suspect; a dirty worker takes nothing ('': it reconciles
        first, its list may hold debris); else 'queue'."""
        if self.dirty:
            return ""
        if self.suspects.maybe_waiting and self.suspects.acquire(self.list_key):
            return "suspect"
        return "queue"

    def release_and_take_args(
        self, raw: bytes, task_id: str, action: Verdict, data: str, take: tuple[TakeMode, str, str]
    ) -> tuple[Any, ...]:
        """RELEASE_AND_TAKE's arguments: RELEASE's with the registry after the keys, and `take`
        (mode, next record, now) as its last three ARGV."""
        numkeys, *rest = self.release_args(raw, task_id, action, data)
        return (numkeys + 1, *rest[:numkeys], self.keys.inflight_registry, *rest[numkeys:], *take)

    def released_and_taken(self, reply: list[Any], action: Verdict) -> Release:
        """Read the release half of RELEASE_AND_TAKE's reply (a suspect taken in the step keeps
        our process's slot ours: reply[5])."""
        keep = len(reply) > 5 and int(reply[5]) == 1
        return self.released(reply, action, keep_slot=keep)

    def after_release_and_take(self, reply: list[Any], mode: TakeMode) -> bytes | None:
        """The raw task RELEASE_AND_TAKE took, or None (then, if it looked for a suspect and
        none waits, our process stops looking until told again)."""
        if len(reply) <= 3:
            if mode == "suspect" and not int(reply[2]):
                self.suspects.maybe_waiting = False
            return None
        raw: bytes = reply[3]
        return raw
