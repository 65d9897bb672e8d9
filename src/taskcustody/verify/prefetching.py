"""Conformance steps for the prefetching worker: its pipelines, fed to the model slot by slot.

A `PrefetchingWorker` is several workers whose commands share one connection (see
`taskcustody.core.prefetch`). Here the harness's workers of one process become its slots for one
pipelined take or one pipelined release, on the process's faulty client, and the model takes the
matching walk: for the take, each slot's `take` then `record` (the take script does both, with
nothing between); for the release, each slot's `release`. A reply lost at slot j loses every later
reply too (Redis ran them all; the worker reads none of them). For the model, that is per slot
from j on: for a release, a dropped release reply; for a take, a worker that took and recorded
its task and no longer knows it, which in the model's terms is a crash while holding it followed
by a restart (the same Redis state, the same worker knowledge, one fault). The model predicts;
the after-step check compares.
"""

from __future__ import annotations

from typing import Any

import redis
from taskcustody_model.protocol import Action
from taskcustody_model.state import IDLE, RECORDED

from ..core import scripts
from ..core.envelope import decode
from ..core.prefetch import Batch, PrefetchingWorker
from .harness import Harness, Mismatch, StepRecord, actor_of


def takers(h: Harness, s: int, i: int) -> list[int]:
    """The workers of process (s, i) that may take now: idle, and the model enables their take."""
    return _workers_in(h, s, i, IDLE, "take")


def holders(h: Harness, s: int, i: int) -> list[int]:
    """The workers of process (s, i) holding a recorded task the model lets them release."""
    return _workers_in(h, s, i, RECORDED, "release")


def _workers_in(h: Harness, s: int, i: int, phase: int, step: str) -> list[int]:
    enabled = set(h.enabled())
    return [
        w
        for w, ws in enumerate(h.procs[s][i].workers)
        if ws.worker is not None and ws.phase() == phase and Action(step, s, i, w) in enabled
    ]


def lost_positions(h: Harness, slots: int) -> list[int]:
    """Where a reply of a pipeline of `slots` commands may be lost: a loss costs the model one
    fault per slot from there on, within the run's fault budget."""
    budget = h.bounds.faults - h.state.faults
    return [j for j in range(slots) if slots - j <= budget]


def _model(h: Harness, action: Action, fault: str = "") -> None:
    """One model step of a pipeline, recorded for the report; `fault` names the injected fault
    it stands for (counted by that name)."""
    h.steps.append(
        StepRecord(
            len(h.steps) + 1, action, h.describe(action), action.is_fault, actor_of(action, h.state)
        )
    )
    if fault:
        h.counts[fault] += 1
    h.model_step(action)


def _pipelined(h: Harness, s: int, i: int, workers: list[int]) -> Any:
    """The process's workers `workers` as the slots of one prefetching worker: the threaded
    `PrefetchingWorker`, or with asyncio workers (verify/aio.py) the asyncio one, stepped."""
    slot = h.procs[s][i]
    slots: list[Any] = []
    for w in workers:
        worker = slot.workers[w].worker
        assert worker is not None
        slots.append(worker)
    loop = getattr(h, "loop", None)
    if loop is not None:
        from .aio import SteppedAsyncPrefetchingWorker

        return SteppedAsyncPrefetchingWorker(slots, loop)
    return PrefetchingWorker(slots)


def _disconnect(pw: Any) -> None:
    if isinstance(pw, PrefetchingWorker):
        pw._conn.disconnect()  # type: ignore[no-untyped-call]
    else:
        pw.disconnect()


def prefetching_take(h: Harness, s: int, i: int, lost_at: int | None) -> None:
    """One pipelined take by every worker of (s, i) that may take; with `lost_at` = j, the reply
    of slot j is lost (and those after it). Only when every slot finds a task: a take that found
    the queue empty and lost its reply leaves a dirty worker with an empty list, which the model
    has no single action for."""
    workers = takers(h, s, i)
    queued = len(h.state.queue)
    if lost_at is not None and queued < len(workers):
        raise ValueError("a lost reply needs a task for every slot")
    pw = _pipelined(h, s, i, workers)
    # As `PrefetchingWorker.register` does (here, unfaulted): a lost reply must be the reply of a
    # take that ran, not of a NOSCRIPT answer.
    scripts.TAKE_AND_RECORD_SCRIPT.load(h.admin)
    if lost_at is not None:
        h.injector.arm("EVALSHA", connection=pw._conn, skip=lost_at)
    try:
        batch, error = pw.take_all()
    finally:
        h.injector.disarm_all()
        _disconnect(pw)
    if (error is not None) != (lost_at is not None) or (
        error is not None and not isinstance(error, redis.ConnectionError)
    ):
        raise Mismatch("prefetch", f"take pipeline: lost at {lost_at}, error {error!r}")
    received = {worker.list_key: (raw, task_id) for worker, raw, task_id in batch.raws}
    for k, w in enumerate(workers):
        if k >= queued:
            break  # the queue ran empty: this slot's take found nothing (so did the model's)
        ws = h.procs[s][i].workers[w]
        assert ws.worker is not None
        _model(h, Action("take", s, i, w))
        _model(h, Action("record", s, i, w))
        if lost_at is not None and k >= lost_at:
            # The worker does not know the task it took and recorded. For the model that is a
            # worker that crashed holding it and was restarted (dirty): the same Redis state,
            # the same knowledge, and one fault, as a lost reply is.
            _model(h, Action("crash_worker", s, i, w), "dropped-reply:prefetching-take")
            _model(h, Action("restart_worker", s, i, w))
            continue
        if ws.worker.list_key not in received:
            raise Mismatch(
                "prefetch",
                f"worker {w}: the model predicts a task, the pipelined take brought none",
            )
        raw, _ = received[ws.worker.list_key]
        ws.task, ws.stage = decode(raw), RECORDED
    h.settle()


def prefetching_release(h: Harness, s: int, i: int, lost_at: int | None) -> None:
    """One pipelined release (after executing each task) by every worker of (s, i) holding a
    recorded task; with `lost_at` = j, the reply of slot j is lost (and those after it)."""
    workers = holders(h, s, i)
    slot = h.procs[s][i]
    pw = _pipelined(h, s, i, workers)
    batch = Batch()
    for w in workers:
        ws = slot.workers[w]
        assert ws.worker is not None and ws.task is not None
        batch.raws.append((ws.worker, ws.task.raw, ws.task.id))
        batch.verdicts.append(ws.worker.verdict(ws.task, ws.worker.execute(ws.task)))
        ws.task = ws.outcome = None
    if lost_at is not None:
        h.injector.arm("EVALSHA", connection=pw._conn, skip=lost_at)
    try:
        pw.release_all(batch)
    except redis.ConnectionError:
        if lost_at is None:
            raise
    else:
        if lost_at is not None:
            raise Mismatch("fault", "the lost release reply did not surface")
    finally:
        h.injector.disarm_all()
        _disconnect(pw)
    for k, w in enumerate(workers):
        lost = lost_at is not None and k >= lost_at
        if lost:
            _model(
                h, Action("dropped_reply", s, i, w, "release"), "dropped-reply:prefetching-release"
            )
        else:
            _model(h, Action("release", s, i, w))
        if slot.server.superseded:
            slot.workers[w].stopped = True  # as after a single release
    h.settle()
