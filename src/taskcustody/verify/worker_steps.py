"""The harness's worker steps: one step of `Worker.run_once` at a time, in its order (take,
record, release, or the composite release-and-take, and reconcile), each with the reply the model
says is lost dropped on the worker's connection."""

from __future__ import annotations

from collections.abc import Callable

import redis
from taskcustody_model import (
    Action,
    list_of,
)
from taskcustody_model.state import (
    RECORDED,
    TAKEN,
)

from ..core.envelope import Task
from ..core.outcome import Outcome
from ..core.worker import Worker
from .observation import Mismatch, WorkerSlot
from .stepping_base import SteppingBase


class WorkerSteps(SteppingBase):
    """Performs a worker's steps on the implementation, and on the model."""

    def _worker_step(self, action: Action, command: str, lost: bool, variant: int) -> None:
        try:
            self._real_worker_step(action, command, lost, variant)
        finally:
            self.injector.disarm_all()
        self.model_step(action)

    def _real_worker_step(self, action: Action, command: str, lost: bool, variant: int) -> None:
        """The implementation's side of a worker step (the caller steps the model)."""
        s, i, w = action.server, action.proc, action.worker
        slot = self.procs[s][i]
        ws = slot.workers[w]
        worker = ws.worker
        assert worker is not None
        conn = worker._conn
        if command == "take":
            # the model's take is the queue's; a suspect's take is a step of its own
            self._take(
                ws,
                command,
                lost,
                worker.take_command,
                lambda: worker.take_from_queue(timeout=self.settings.block_timeout),
            )
        elif command == "take_suspect":
            # The model enables it when the suspects list holds a task and the process's slot
            # is free: the worker's hint may still say none wait (it learns at its next release
            # or timed-out take); the step is the take the worker then makes.
            worker.suspects.maybe_waiting = True
            self._take(ws, command, lost, "EVALSHA", worker.take_suspect)
        elif command == "record":
            assert ws.task is not None
            worker.record(ws.task)
            ws.stage = RECORDED
            if self.real_redis or self.scripts_flushed:
                # The record's reply is read with the release's; read it now so that what we
                # read back next is not a race against our own socket, and so that a record
                # refused with NOSCRIPT (the script cache went with a wipe) is sent again as
                # EVAL now, not with the release.
                worker.flush()
        elif command in ("release", "retry"):
            assert ws.task is not None
            if command == "retry":  # the handler fails: the release's retry branch
                ws.outcome = Outcome(False, error="handler failed (injected by verify)")
            if ws.outcome is None:  # the model's release includes the handler's execution
                ws.outcome = worker.execute(ws.task)
            assert ws.outcome is not None
            if lost:
                # The release's reply, or the deferred record reply read just before it: either
                # way the script ran and the worker cannot know whether it committed.
                # (Both are EVALSHA: the record is a script too.) After a wipe flushed the script
                # cache, the scripts are loaded again first: a NOSCRIPT reply is of a release that
                # did not run, and losing it is no lost reply of the model's.
                if self.scripts_flushed:
                    self._load_release_scripts()
                unread = worker._unread_replies
                skip = 0 if variant % 2 and unread else unread
                self.injector.arm("EVALSHA", connection=conn, skip=skip)
            task, outcome = ws.task, ws.outcome
            ws.task = ws.outcome = None
            try:
                worker.release(task, outcome)
            except redis.ConnectionError:
                if not lost:
                    raise
            if slot.server.superseded:
                ws.stopped = True  # `Worker.run` checks the stop event before its next cycle
        elif command == "release_and_take":
            self._release_and_take(action, ws, lost, variant)
        elif command == "reconcile":
            if lost:
                # the reply of the last move of the drain (the model moves the whole list)
                n = len(list_of(self.state, (s, slot.model_inc, w)))
                self.injector.arm("EVAL", label=slot.label, skip=n - 1)
            try:
                worker.reconcile()
            except redis.ConnectionError:
                worker.dirty = True  # `Worker.run` marks the worker dirty on any Redis error
                if not lost:
                    raise

    def _release_and_take(self, action: Action, ws: WorkerSlot, lost: bool, variant: int) -> None:
        """The composite step (`Worker.release_and_take`): the release of the task the worker
        holds and, in the same script, the take of the next one with its record. The model takes
        a waiting suspect when the process's slot is free (or the worker's own). The worker's hint
        (does a suspect wait?) is set to what the model knows, so that it asks for a suspect
        exactly then: a worker that asks takes the slot before it sends, and keeps it after a lost
        reply until its reconcile, as the model's take_suspect does."""
        worker = ws.worker
        assert worker is not None and ws.task is not None
        if ws.outcome is None:  # the model's release includes the handler's execution
            ws.outcome = worker.execute(ws.task)
        proc = self.state.processes[action.server][action.proc]
        key = (action.server, proc.inc, action.worker)
        debris = set(list_of(self.state, key)) - {proc.workers[action.worker].task}
        worker.suspects.maybe_waiting = (
            bool(self.state.suspects) and not debris and proc.suspect in (-1, action.worker)
        )
        if lost:
            # the step's reply, or the deferred record reply read just before it (as a release)
            if self.scripts_flushed:
                self._load_release_scripts()
            unread = worker._unread_replies
            if variant % 2 and unread:  # the deferred record's (EVALSHA: a script too)
                self.injector.arm("EVALSHA", connection=worker._conn)
            elif _sends_its_own_release(worker):  # its own script, as EVAL: only its reply
                self.injector.arm("EVAL", connection=worker._conn)
            else:
                self.injector.arm("EVALSHA", connection=worker._conn, skip=unread)
        task, outcome = ws.task, ws.outcome
        ws.task = ws.outcome = None
        try:
            _, taken = worker.release_and_take(task, outcome)
        except redis.ConnectionError:
            if not lost:
                raise
            return
        if lost:
            raise Mismatch("fault", "the dropped release_and_take reply did not surface")
        if taken is None:
            raise Mismatch("release_and_take", "the model predicts a task; the step took none")
        ws.task, ws.stage = taken, RECORDED

    def _take(
        self, ws: WorkerSlot, command: str, lost: bool, armed: str, take: Callable[[], Task | None]
    ) -> None:
        """One take by the real worker (`take`), with its reply dropped (`armed` is the command
        whose reply the injector drops on the worker's connection) when `lost`."""
        worker = ws.worker
        assert worker is not None
        ws.armed = False  # (a take left waiting by a production loop: this one is served)
        if lost:
            self.injector.arm(armed, connection=worker._conn)
        try:
            task = take()
        except redis.ConnectionError:
            task = None
            if not lost:
                raise
        else:
            if lost:
                raise Mismatch("fault", f"the dropped {command} reply did not surface")
        if task is not None:
            ws.task, ws.stage = task, TAKEN
        elif not lost:
            raise Mismatch(command, "the model predicts a task; the take returned None")


def _sends_its_own_release(worker: Worker) -> bool:
    """A demonstration's worker (verify/broken.py) that sends its own release script with EVAL,
    not the real one by its SHA: the composite step's lost reply is that EVAL's. (The asyncio
    harness's workers are not `Worker`s, and send the real scripts.)"""
    return isinstance(worker, Worker) and type(worker)._send_release is not Worker._send_release
