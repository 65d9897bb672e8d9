"""The sans-IO half of a prefetching worker: the commands its pipelines send, the reading of their
replies slot by slot, and the bookkeeping of a batch, with no I/O of its own.

`taskcustody.core.prefetch.PrefetchingWorker` (threads) and `taskcustody.aio.AsyncPrefetchingWorker`
(asyncio) both inherit `PrefetchCustody`, as `Worker` and `AsyncWorker` share
`taskcustody.core.custody.Custody`: the two build the same take and release pipelines, read a lost
reply the same way (that slot and every later one dirty), and give up a batch's tasks the same
way (the task a handler was running when interrupted as a failed attempt, those it never reached
requeued unchanged); each only sends its pipelines its own way and awaits its handlers or not.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import redis

from ..deploy.release_refusals import as_refused
from . import envelope, scripts
from .custody import Custody
from .envelope import Task
from .errors import MalformedTask
from .outcome import INTERRUPTED, NOT_REACHED, Outcome, Release, Verdict, log_release

#: A pipelined take of one slot: TAKE_AND_RECORD by hash, then its numkeys and keys/argv.
TAKE = ("EVALSHA", scripts.TAKE_AND_RECORD_SCRIPT.sha, 4)
#: A pipelined release of one slot: RELEASE by hash, then `Custody.release_args`.
RELEASE = ("EVALSHA", scripts.RELEASE_SCRIPT.sha)

Slot = TypeVar("Slot", bound=Custody)
#: Per release of a batch: (slot, action, RELEASE's arguments).
Plan = tuple[Any, Verdict, tuple[Any, ...]]
#: Per release of a batch: (task id, data, the handler's error) for its log line.
Logged = tuple[str, str | bytes, str]


class Batch:
    """The tasks one pipelined take brought in, slot by slot, and what became of each."""

    def __init__(self) -> None:
        self.raws: list[tuple[Any, bytes, str]] = []  # (slot, raw task, id recorded)
        self.verdicts: list[tuple[Verdict, str | bytes]] = []  # per handled task: (action, data)
        self.errors: list[str] = []  # per handled task: the handler's error ("" if none)


class PrefetchCustody(Generic[Slot]):
    """`slots` workers whose takes and releases are pipelined on one connection; the first slot
    (the lead) also does the blocking take when the queue is empty. What is shared by the threaded
    and the asyncio prefetching worker: the slots' bookkeeping, the pipelines' commands, the
    reading of their replies, and the verdicts of a batch's tasks."""

    def __init__(self, slots: list[Slot]) -> None:
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

    # -- the take ----------------------------------------------------------------------------

    def suspect_take_command(self) -> tuple[Any, ...] | None:
        """The lead's take of a suspect, once our process's suspect slot is the lead's (see
        `Custody.acquire_suspect_take`); None when no suspect may wait or the slot is held."""
        args = self.lead.acquire_suspect_take()
        return None if args is None else (*TAKE[:2], *args)

    def suspect_taken(
        self, replies: list[Any], error: Exception | None
    ) -> tuple[Batch, Exception | None] | None:
        """Read the suspect take's pipeline: a batch of one in the lead slot, or None when no
        suspect waited (the slot is freed)."""
        lead = self.lead
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

    def take_commands(self) -> list[tuple[Any, ...]]:
        """One take from the queue per slot, each with its own record."""
        keys = self.lead.keys
        now = repr(self.lead.clock.now())
        return [
            (
                *TAKE,
                keys.queue,
                slot.list_key,
                keys.processing,
                keys.inflight_registry,
                slot.record_value(),
                now,
            )
            for slot in self.slots
        ]

    def taken(self, replies: list[Any], error: Exception | None) -> tuple[Batch, Exception | None]:
        """Read the take pipeline's replies. A slot whose reply was lost (and every slot after
        it) is dirty: its task, if the take ran, is debris its reconcile requeues."""
        batch = Batch()
        for k, reply in enumerate(replies):
            slot = self.slots[k]
            if isinstance(reply, redis.ResponseError):
                # e.g. WRONGTYPE: the script stopped before it moved anything.
                error = error or reply
            elif reply:
                raw, task_id = reply
                batch.raws.append((slot, raw, task_id.decode()))
        for slot in self.slots[len(replies) :]:
            slot.dirty = True
        return batch, error

    # -- a batch's handlers ------------------------------------------------------------------

    def decoded(self, batch: Batch, slot: Slot, raw: bytes) -> Task | None:
        """The task in `raw`, or None once its dead-letter verdict is noted (not an envelope)."""
        try:
            return envelope.decode(raw)
        except MalformedTask as exc:
            batch.verdicts.append(("dead", slot._dead_letter(raw, exc.reason, None)))
            batch.errors.append(exc.reason)
            return None

    def ran(self, batch: Batch, slot: Slot, task: Task, outcome: Outcome) -> None:
        """Note what the handler did with `task`: its release's verdict."""
        batch.verdicts.append(slot.verdict(task, outcome))
        batch.errors.append(outcome.error)

    def interrupted(self, batch: Batch, slot: Slot, task: Task) -> None:
        """Note that the handler of `task` was interrupted: a failed attempt."""
        self.ran(batch, slot, task, INTERRUPTED)

    # -- the release -------------------------------------------------------------------------

    def release_plans(self, batch: Batch) -> tuple[list[Plan], list[Logged]]:
        """One release per task of the batch: its verdict's, or for a task the batch never
        reached, a requeue as it was (NOT_REACHED)."""
        plans: list[Plan] = []
        logged: list[Logged] = []
        for i, (slot, raw, recorded_id) in enumerate(batch.raws):
            action, data = batch.verdicts[i] if i < len(batch.verdicts) else ("retry", raw)
            plans.append((slot, action, slot.release_args(raw, recorded_id, action, data)))
            logged.append(
                (recorded_id, data, batch.errors[i] if i < len(batch.errors) else NOT_REACHED)
            )
        return plans, logged

    def released_all(
        self, plans: list[Plan], logged: list[Logged], replies: list[Any], error: Exception | None
    ) -> list[Release]:
        """Read the release pipeline's replies (raising `error`, or the first refusal, once
        every reply read is accounted for). A slot whose reply is missing may have released or
        not: dirty, it reconciles later (a release is idempotent)."""
        releases = []
        for k, reply in enumerate(replies):
            slot, action, _ = plans[k]
            if isinstance(reply, redis.ResponseError):
                slot.dirty = True
                error = error or reply
            else:
                releases.append(slot.released(reply, action))
                task_id, data, failure = logged[k]
                log_release(
                    slot.list_key,
                    task_id,
                    releases[-1],
                    data,
                    failure,
                    slot.settings.max_attempts,
                    delayed=action == "later",
                )
        for slot, _, _ in plans[len(replies) :]:
            # The release may have run: we cannot know whether we committed. It is idempotent,
            # so the slot reconciles later.
            slot.dirty = True
        if isinstance(error, redis.ResponseError) and as_refused(error) is not error:
            # A refused release (release_refusals.py): its slot is dirty, its task in its list.
            raise as_refused(error) from error
        if error is not None:
            raise error
        return releases

    def _raise(self, error: Exception) -> None:
        if isinstance(error, redis.ResponseError):
            self.lead._raise_wrong_type(error, self.lead.keys.queue, *self.list_keys)
        raise error
