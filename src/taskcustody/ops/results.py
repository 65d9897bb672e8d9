"""Results: wait for a task to commit and read what its handler returned.

A worker's release stores the handler's return value as JSON under `P:{Q}:result:<task id>`, with
a TTL of `Settings.result_ttl` seconds (default one day; 0 stores no results), in the same Lua
step that commits the task. `get_result` polls that key with a bounded backoff (10 ms doubling to
1 s): no change to the release script, and an idle waiter costs Redis one small pipeline a second.

A task that was dead-lettered has no result: `get_result` raises TaskFailed with its error as soon
as a poll sees it among the newest DEAD_WINDOW dead letters, and at the latest at the timeout,
when it looks through the whole dead-letter list once before raising ResultTimeout.

An id that is nowhere in the queue fails at once (UnknownTask) instead of waiting out the timeout:
the first poll also reads the newest queued tasks and the registry of in-flight lists, and unless
it found the task, one MULTI/EXEC reads every place a task can be (`_look`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import chain
from typing import Any

import redis

from ..core import envelope
from ..core.clock import Clock
from ..core.errors import MalformedTask, ResultTimeout, TaskFailed, UnknownTask
from ..core.keys import QueueKeys
from ..deploy.redis_errors import named_errors
from .deadletters import DeadLetter, list_dead_letters, parse

FIRST_PAUSE = 0.01
MAX_PAUSE = 1.0
#: Dead letters read per poll, from the newest: a task that fails while we wait is among them
#: unless more than this many tasks failed within one pause.
DEAD_WINDOW = 100
#: Newest queued tasks the first poll reads: a task enqueued a moment ago is found there, and
#: waiting on it costs no look through the whole queue.
QUEUE_WINDOW = 100
#: Times the look is taken again because in-flight lists it did not read were registered
#: meanwhile (a server started); past that the id is not judged unknown (we wait, as before).
LOOK_ROUNDS = 5


class MonotonicClock:
    """Local monotonic seconds: a timeout is a local matter, not the queue's shared time."""

    def now(self) -> float:
        return time.monotonic()


def decode_result(stored: bytes) -> Any:
    """A stored result is JSON (a value JSON cannot hold was stored as {"unserialisable_result":
    its repr}). Workers older than `get_result` stored nothing when a handler returned None: a
    waiter on such a task times out."""
    return json.loads(stored)


def _failed(task_id: str, letters: list[DeadLetter]) -> TaskFailed | None:
    for letter in letters:
        if letter.task_id == task_id:
            return TaskFailed(task_id, letter.error, letter.attempts)
    return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _holds(raws: Iterable[bytes], task_id: str) -> bool:
    """Whether one of `raws` (task envelopes) is task `task_id`. The id's JSON text is looked
    for first, so that only a likely envelope is decoded (`envelope.encode` writes the id as
    json.dumps does); a payload that merely contains the id is told apart by the decode."""
    needle = json.dumps(task_id).encode()
    for raw in raws:
        if needle in raw:
            try:
                if envelope.decode(raw).id == task_id:
                    return True
            except MalformedTask:
                continue
    return False


@dataclass(frozen=True)
class Look:
    """What one look found: the task is `known` (somewhere in the queue's keys), and if it is
    done, its stored result or its failure."""

    known: bool
    stored: bytes | None = None
    failure: TaskFailed | None = None


def _look(client: redis.Redis, keys: QueueKeys, task_id: str, lists: set[str]) -> Look:
    """Whether task `task_id` is anywhere, in one atomic read of every place a task can be.

    A task moves queue -> in-flight list -> result | scheduled set | queue | suspects | dead
    letters, and scheduled -> queue | suspects, each move one atomic step: reads of these places
    one after the other can miss a task on its way, so one MULTI/EXEC reads them all at one
    instant. The in-flight lists are the registry's (`lists`, read beforehand): a list is
    registered before it can hold a task (the protocol's registered-custody invariant), so a list
    that could hold the task at the EXEC and is not among `lists` is in the registry the EXEC
    reads; then the look is taken again with it. Comparing the members, not WATCHing the registry:
    every take re-registers its list (a new score), so a WATCH would fail on any busy queue. Every
    key shares the queue's hash tag: the transaction runs on a Redis Cluster too.

    The places are read whole: the look costs one round trip, but moves the queue, the scheduled
    set and the dead letters over the wire."""
    result_key = keys.result(task_id)
    fixed = (
        keys.inflight_registry,
        keys.legacy_inflight_registry,
        result_key,
        keys.commit_log,
        keys.dead_letters,
        keys.scheduled,
        keys.queue,
        keys.suspects,
    )
    for _ in range(LOOK_ROUNDS):
        ordered = sorted(lists)
        with named_errors(client, keys, *fixed, *ordered):
            pipe = client.pipeline(transaction=True)
            pipe.zrange(keys.inflight_registry, 0, -1)
            pipe.smembers(keys.legacy_inflight_registry)  # lists of version 0.1, until migrated
            pipe.get(result_key)
            pipe.hexists(keys.commit_log, task_id)  # committed, no result kept (track_commits)
            pipe.lrange(keys.dead_letters, 0, -1)
            pipe.zrange(keys.scheduled, 0, -1)
            pipe.lrange(keys.queue, 0, -1)
            pipe.lrange(keys.suspects, 0, -1)
            for list_key in ordered:
                pipe.lrange(list_key, 0, -1)
            registered, legacy, stored, committed, dead, scheduled, *custody = pipe.execute()
        if stored is not None:
            return Look(True, stored=stored)
        failure = _failed(task_id, [parse(entry) for entry in dead])
        if failure is not None:
            return Look(True, failure=failure)
        if committed or _holds(chain(scheduled, *custody), task_id):
            return Look(True)
        now_registered = {_text(k) for k in chain(registered, legacy)}
        if now_registered <= lists:
            return Look(False)
        lists |= now_registered
    return Look(True)  # lists kept being registered: not proven unknown, so wait


def get_result(
    client: redis.Redis,
    keys: QueueKeys,
    task_id: str,
    timeout: float | None = 30.0,
    *,
    clock: Clock | None = None,
    sleep: Callable[[float], None] = time.sleep,
    fail_if_unknown: bool = True,
) -> Any:
    """Block until task `task_id` commits and return its handler's return value.

    Raises TaskFailed if the task was dead-lettered, ResultTimeout if `timeout` seconds pass first
    (None: wait for ever; 0: look once). `clock` and `sleep` are injected by tests.

    Raises UnknownTask at once, before any wait, if the task is nowhere: not queued, scheduled,
    among the suspects, in flight or dead-lettered, and no result stored (one atomic look,
    `_look`). So a mistyped id, a wrong queue or prefix, or a result that expired fails fast
    instead of waiting out the timeout, as RQ's `Job.fetch` raises NoSuchJobError (Celery
    cannot tell: an unknown id stays PENDING). The other side of it: an id must be enqueued
    before it is waited on -- a waiter that looks before its producer has pushed the task (two
    processes agreeing on an id) gets UnknownTask, and should enqueue first or catch it and wait
    again. `fail_if_unknown=False` skips the look (the old behaviour: wait for the timeout);
    `TaskHandle.result` does, as its producer enqueued the task before making the handle.

    The look adds at most one round trip to the first poll, which also reads the newest queued
    tasks and the registry: a task enqueued a moment ago, a result, a recent failure are found
    without it. Otherwise it reads the queue, the scheduled set and the dead letters whole."""
    clock = clock or MonotonicClock()
    deadline = None if timeout is None else clock.now() + timeout
    pause = FIRST_PAUSE
    result_key = keys.result(task_id)
    look = fail_if_unknown
    while True:
        touched: tuple[str, ...] = (result_key, keys.dead_letters)
        if look:
            touched += (keys.queue, keys.inflight_registry, keys.legacy_inflight_registry)
        with named_errors(client, keys, *touched):
            pipe = client.pipeline(transaction=False)
            pipe.get(result_key)
            pipe.lrange(keys.dead_letters, 0, DEAD_WINDOW - 1)
            if look:
                pipe.lrange(keys.queue, 0, QUEUE_WINDOW - 1)
                pipe.zrange(keys.inflight_registry, 0, -1)
                pipe.smembers(keys.legacy_inflight_registry)
            stored, newest, *first = pipe.execute()
        if stored is not None:
            return decode_result(stored)
        failure = _failed(task_id, [parse(entry) for entry in newest])
        if failure is not None:
            raise failure
        if look:
            look = False
            queued, registered, legacy = first
            if not _holds(queued, task_id):
                found = _look(client, keys, task_id, {_text(k) for k in chain(registered, legacy)})
                if found.stored is not None:
                    return decode_result(found.stored)
                if found.failure is not None:
                    raise found.failure
                if not found.known:
                    raise UnknownTask(task_id, keys.queue_name)
        now = clock.now()
        if deadline is not None and now >= deadline:
            failure = _failed(task_id, list_dead_letters(client, keys))
            if failure is not None:
                raise failure
            raise ResultTimeout(
                f"no result for task {task_id} within {timeout:g} s: it is still queued or "
                "running, or its result expired (result_ttl), or no such task committed"
            )
        sleep(pause if deadline is None else min(pause, deadline - now))
        pause = min(pause * 2, MAX_PAUSE)


@dataclass(frozen=True)
class TaskHandle:
    """What `Producer.submit` returns: the task's id, and a way to wait for its result."""

    id: str
    client: redis.Redis
    keys: QueueKeys
    #: Whether this handle's task is known to have been enqueued (`Producer.submit` says so):
    #: `result` then skips `get_result`'s look for an unknown id, and its reads of the queue.
    enqueued: bool = False

    def result(
        self,
        timeout: float | None = 30.0,
        *,
        clock: Clock | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Any:
        """`get_result` for this task."""
        return get_result(
            self.client,
            self.keys,
            self.id,
            timeout,
            clock=clock,
            sleep=sleep,
            fail_if_unknown=not self.enqueued,
        )
