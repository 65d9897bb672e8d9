"""Dead letters: list, show, requeue and purge the tasks a queue gave up on.

A worker dead-letters a task whose handler failed `max_attempts` times, and bytes in the queue that
are not a task envelope, by LPUSHing onto `P:{Q}:dead` a JSON object
`{"raw": base64 of the task's bytes, "error", "task_id", "at"}` (core/custody.py, `_dead_letter`); a
handler's failure adds `"traceback"`, its formatted traceback (bounded: worker.MAX_TRACEBACK).

A requeue moves one entry from the dead-letter list to the queue in ONE Lua step (REQUEUE_DEAD):
the script removes that exact entry and pushes the rebuilt envelope, or does nothing if the entry
is gone. So a requeue that crashes between entries has moved each entry once or not at all (none
lost, none doubled), and two operators requeueing at once cannot both push one entry.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from ..core import envelope, scripts
from ..core.envelope import Task
from ..core.errors import DeadLetterNotFound, MalformedTask
from ..core.keys import QueueKeys
from ..deploy.redis_errors import named_errors

# The two steps of the dead-letter list (lua/requeue_dead.lua, lua/purge_dead.lua).
REQUEUE_DEAD = scripts.REQUEUE_DEAD
PURGE_DEAD = scripts.PURGE_DEAD


@dataclass(frozen=True)
class DeadLetter:
    """One entry of the dead-letter list."""

    entry: bytes  # the exact list element (a requeue removes exactly it)
    raw: bytes  # the task's bytes as they were dead-lettered
    error: str
    task_id: str | None
    at: float | None
    task: Task | None  # `raw` read as an envelope; None when it is not one
    # A poison pill (dead-lettered by recovery: it killed the processes that ran it): how many
    # times it was recovered. None for a task dead-lettered by its worker's release.
    recoveries: int | None = None
    #: The handler's traceback, ending with the error ("" for a malformed envelope, a poison pill,
    #: or an entry written before dead letters kept one).
    traceback: str = ""

    @property
    def attempts(self) -> int:
        """How many times the handler ran: the envelope counts the failed attempts before the
        last one, and the last one failed too; a poison pill ran once per recovery on top of the
        attempts its envelope counts. 0 for bytes that never were a task."""
        if self.task is None or self.task_id is None:
            return 0
        if self.recoveries is not None:
            return self.task.attempts + self.recoveries
        return self.task.attempts + 1

    @property
    def requeueable(self) -> bool:
        return self.task is not None

    def requeued_envelope(self) -> bytes:
        """The envelope a requeue enqueues: same id, payload and enqueue time, attempts 0 (it
        gets `max_attempts` runs again)."""
        if self.task is None:
            raise MalformedTask(self.raw, "a dead letter that is not a task envelope")
        return envelope.encode(replace(self.task, attempts=0))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the payload decoded when the dead letter holds an envelope; otherwise the
        raw bytes, as text when they are UTF-8, else base64."""
        out: dict[str, Any] = {
            "task_id": self.task_id,
            "error": self.error,
            "at": self.at,
            "attempts": self.attempts,
        }
        if self.traceback:
            out["traceback"] = self.traceback
        if self.recoveries is not None:
            out["poison"] = True
            out["recoveries"] = self.recoveries
        if self.task is not None:
            out["payload"] = self.task.payload
            out["enqueued_at"] = self.task.enqueued_at
        else:
            try:
                out["raw"] = self.raw.decode("utf-8")
            except UnicodeDecodeError:
                out["raw_base64"] = base64.b64encode(self.raw).decode()
        return out


def parse(entry: bytes) -> DeadLetter:
    """Read one entry; an entry that is not ours (pushed by hand, say) is shown as raw bytes."""
    try:
        body = json.loads(entry)
        raw = base64.b64decode(body["raw"], validate=True)
        error, task_id, at = str(body.get("error", "")), body.get("task_id"), body.get("at")
    except (ValueError, KeyError, TypeError, binascii.Error):
        return DeadLetter(entry, entry, "(not a taskcustody dead letter)", None, None, None)
    try:
        task: Task | None = envelope.decode(raw)
    except MalformedTask:
        task = None
    recoveries = body.get("recoveries") if body.get("poison") else None
    trace = body.get("traceback")
    return DeadLetter(
        entry,
        raw,
        error,
        task_id if isinstance(task_id, str) else None,
        float(at) if isinstance(at, (int, float)) else None,
        task,
        recoveries if isinstance(recoveries, int) else None,
        trace if isinstance(trace, str) else "",
    )


def list_dead_letters(
    client: redis.Redis, keys: QueueKeys, limit: int | None = None
) -> list[DeadLetter]:
    """The dead letters, newest first (at most `limit`), read in one LRANGE."""
    if limit is not None and limit <= 0:
        return []
    with named_errors(client, keys, keys.dead_letters):
        entries = client.lrange(keys.dead_letters, 0, -1 if limit is None else limit - 1)
    # decode_responses is off on our clients: LRANGE gives bytes.
    return [parse(e if isinstance(e, bytes) else e.encode()) for e in entries]


def dead_letter(client: redis.Redis, keys: QueueKeys, task_id: str) -> DeadLetter:
    """The newest dead letter of task `task_id` (DeadLetterNotFound if there is none)."""
    for letter in list_dead_letters(client, keys):
        if letter.task_id == task_id:
            return letter
    raise DeadLetterNotFound(f"no dead letter of task {task_id} in queue {keys.queue_name!r}")


def requeue_one(client: redis.Redis, keys: QueueKeys, letter: DeadLetter) -> bool:
    """Move one dead letter to the queue in one atomic step. False: the entry was no longer in
    the dead-letter list (requeued or purged meanwhile), and nothing was enqueued."""
    with named_errors(client, keys, keys.dead_letters, keys.queue):
        moved = client.eval(
            REQUEUE_DEAD, 2, keys.dead_letters, keys.queue, letter.entry, letter.requeued_envelope()
        )
    return bool(moved)


@dataclass
class RequeueReport:
    requeued: list[str] = field(default_factory=list)  # task ids, in the order they were moved
    missing: list[str] = field(default_factory=list)  # asked for, no dead letter of that id
    not_tasks: list[DeadLetter] = field(default_factory=list)  # not an envelope: left in place
    gone: int = 0  # entries requeued or purged by someone else between our read and our move


def requeue_dead_letters(
    client: redis.Redis,
    keys: QueueKeys,
    task_ids: Iterable[str] | None = None,
    *,
    on_requeued: Callable[[DeadLetter], None] | None = None,
) -> RequeueReport:
    """Requeue the dead letters of `task_ids` (every one of them when None), oldest first, each
    in its own atomic step (`requeue_one`): a crash part-way leaves every entry either in the
    dead-letter list or in the queue, once. `on_requeued` is called after each move."""
    wanted = None if task_ids is None else list(dict.fromkeys(task_ids))
    report = RequeueReport()
    letters = list(reversed(list_dead_letters(client, keys)))  # oldest first
    if wanted is not None:
        present = {letter.task_id for letter in letters}
        report.missing = [t for t in wanted if t not in present]
        chosen = set(wanted)
        letters = [letter for letter in letters if letter.task_id in chosen]
    for letter in letters:
        if not letter.requeueable:
            report.not_tasks.append(letter)
            continue
        if not requeue_one(client, keys, letter):
            report.gone += 1
            continue
        report.requeued.append(letter.task.id if letter.task else "")
        if on_requeued is not None:
            on_requeued(letter)
    return report


def purge_dead_letters(client: redis.Redis, keys: QueueKeys) -> int:
    """Delete every dead letter of the queue for good; returns how many there were."""
    with named_errors(client, keys, keys.dead_letters):
        return int(client.eval(PURGE_DEAD, 1, keys.dead_letters))
