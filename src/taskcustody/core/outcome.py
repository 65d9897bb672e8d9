"""What a release is told and what it found, and how it is logged: the value types every worker
(threaded, prefetching, asyncio) shares, with no I/O of their own.

`Verdict` is what a release script is told to do with a task the handler ran (the script's ARGV,
scripts.py); `Action` is what the release found and did, as `Release.action`, the log lines, the
`released` event and the metrics say it. Both are the exact strings that cross those boundaries,
so typing them as `Literal`s changes nothing on the wire.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import traceback
from dataclasses import dataclass, field
from typing import Any, Literal

from ..ops import events

# The workers' log lines keep the logger name users configure: `taskcustody.worker`.
log = logging.getLogger("taskcustody.worker")

#: What a release does with a task the handler ran: commit it ("ok"), put it back on the queue
#: ("retry"), schedule its retry after a backoff ("later"), or dead-letter it ("dead").
Verdict = Literal["ok", "retry", "later", "dead"]
#: What a release found and did: "lost-custody" when our list no longer held the task.
Action = Literal["committed", "retried", "dead-lettered", "lost-custody"]
#: The action a held task's release reports for each verdict.
ACTIONS: dict[Verdict, Action] = {
    "ok": "committed",
    "retry": "retried",
    "later": "retried",
    "dead": "dead-lettered",
}


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
    action: Action


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
    for path in (
        os.path.dirname(os.path.dirname(__file__)) + os.sep,
        asyncio.__file__,
        concurrent.futures.__file__,
    )
)


def bounded_traceback(exc: BaseException, limit: int = MAX_TRACEBACK) -> str:
    """`exc`'s formatted traceback from the handler's frame down (the worker's frames above it
    say nothing about the failure), at most `limit` characters: past that, the head line, a line
    saying how much was left out, and the tail -- the innermost frames and the error itself."""
    tb = exc.__traceback__
    while (
        tb is not None
        and tb.tb_next is not None
        and tb.tb_frame.f_code.co_filename.startswith(_ABOVE_THE_HANDLER)
    ):
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
    return Outcome(
        False,
        error="".join(traceback.format_exception_only(exc)).strip(),
        traceback=bounded_traceback(exc),
    )


#: The outcome of a handler interrupted before it returned (a crash of the cycle, a cancellation):
#: released as a failed attempt.
INTERRUPTED = Outcome(False, error="worker interrupted")

#: The error of a prefetched task that its batch never reached (requeued unchanged).
NOT_REACHED = "not run: the worker stopped before it reached this task"


def log_release(
    list_key: str,
    task_id: str,
    done: Release,
    data: str | bytes,
    error: str,
    max_attempts: int,
    delayed: bool = False,
) -> None:
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
            log.warning(
                "task %s failed (attempt %d of %d), %s: %s",
                task_id,
                attempts,
                max_attempts,
                "scheduled for a retry after its backoff" if delayed else "requeued for a retry",
                error or "worker interrupted",
                extra=extra,
            )
    elif done.action == "dead-lettered":
        if not error:
            try:
                error = str(json.loads(data)["error"])
            except (ValueError, KeyError, TypeError):
                error = "?"
        log.error("task %s dead-lettered: %s", task_id, error, extra=extra)
    else:
        log.warning(
            "task %s: lost custody in %s (judged dead meanwhile: recovery took it "
            "back): this run's result is not committed",
            task_id,
            list_key,
            extra=extra,
        )
