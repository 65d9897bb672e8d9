"""The production loop, driven from the model: `Worker.run` itself, one command at a time.

The stateful machine drives the worker's public steps one at a time, in the order the model
chooses; that alone would let a loop that skips or reorders a step (`Worker.run_once`,
`run_until_stopped`, `release_and_take`, `finish`) pass every run. Here the real loop runs, in the
test thread, with a hook at every command it sends (`faults.FaultInjector.on_send`, which sees the
bytes before Redis does). At each hook the `LoopDriver`:

1. checks the state the loop's previous command left (the real state equals the model's);
2. may let other actors step first (other workers, a sweep, an enqueue, the clock): an
   interleaving of the loop with the rest of the deployment;
3. maps the command to the model actions it performs (`LoopDriver._path`: one, none, or for a
   composite that passes a waiting suspect by, three), and checks that the model enables each for
   this worker when it runs -- else `Mismatch("loop", ...)`: the loop did something the protocol
   does not allow here;
4. may lose the command's reply (a dropped reply: Redis runs it, the loop gets a connection error,
   which `run_until_stopped` handles as in production);
5. applies the actions to the model (the command then reaches Redis).

So the sequence of commands the loop sends is checked to be a path the model allows, with the
state checked after every step of it. Time is the harness's `ManualClock`; the stop event's wait
returns at once. The loop is stopped when the machine draws it, after `MAX_COMMANDS` commands, or
when it would idle (its worker holds nothing and the model lets it take nothing). A take that finds
the queue empty (after a reconcile, or another actor's step just before it) registers the list
and blocks one block timeout (50 ms): the model's `arm`, which leaves the worker armed
(`WorkerSlot.armed`) until its next take; sent again while armed, it changes nothing the model
sees. A take of a suspect that finds none registers the list too, which no model action does
alone: it is one step with the take from the queue that follows it. Registrations age
(`machine.LOOP_BOUNDS` has `Bounds.registration_ages`, and the harness's grace is one tick): the
armed worker's list is fresh, and every sweep, in the model and in Redis, spares it; a tick ends
the wait (in the model the worker is idle again, its take timed out), and the loop's next take
registers the list again (another `arm`). So every sweep is driven, and one that forgets a
registration younger than the grace is caught. The prefetching loop's machine and the server
loop's run with the same bounds (`LOOP_BOUNDS`): their sweeps are all driven too.

What is driven here: the plain worker's loop (`Worker.run`: register, `run_until_stopped`,
`run_once` with its reconcile, take, record, execute, release or `release_and_take`, `finish` once
stopped). The prefetching worker's cycle is driven by verify/prefetch_loop.py (a subclass of this
driver), the server's background thread by verify/server_loop.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from taskcustody_model import Action, apply, enabled_actions, list_of
from taskcustody_model.state import ARMED, IDLE, RECORDED, RUNNING, TAKEN

from ..core import envelope, scripts
from ..core.worker import Worker
from .faults import command_args
from .harness import Harness, actor_of
from .observation import Mismatch, ProcSlot, StepRecord, WorkerSlot

#: An upper bound on Redis's answer to a command already sent (`await_answer`): not a
#: timing assumption, a real server answers in microseconds; only a server that stopped answering
#: reaches it.
ANSWER_SECONDS = 30.0

#: The commands a worker's loop sends, as model actions: on its own connection by (name, script
#: hash), on its process's pool by name (a reconcile's first command is the LLEN of its bound; the
#: chunks after it are part of the same model action). Others (the connection's handshake, the
#: scripts' SCRIPT LOAD, a PING that reads deferred replies, the drain's chunks) change nothing the
#: model sees.
OWN_SCRIPTS = {
    scripts.RECORD_SCRIPT.sha.encode(): "record",
    scripts.RELEASE_SCRIPT.sha.encode(): "release",
    scripts.RELEASE_AND_TAKE_SCRIPT.sha.encode(): "release_and_take",
    scripts.TAKE_AND_RECORD_SCRIPT.sha.encode(): "take_suspect",
}
TAKES = ("BLMOVE", "BRPOPLPUSH")

#: What other actors may do between two commands of the loop.
INTERLEAVED = (
    "take",
    "record",
    "release",
    "release_and_take",
    "reconcile",
    "enqueue",
    "advance_clock",
    "sweep",
)
#: The loop's commands that register its list (ZADD, score = the time they were built at).
REGISTERING = ("take", "take_suspect", "release_and_take")
#: At most this many interleaved steps per drive, and this many loop commands before it is stopped.
MAX_INTERLEAVED = 3
MAX_COMMANDS = 8


class Choices(Protocol):
    """The driver's choices (the stateful machine draws them, so that they shrink)."""

    def stop(self) -> bool:
        """Set the stop event now (before the loop's next command)?"""
        ...

    def lose(self, action: Action) -> bool:
        """Lose the reply of `action`'s command (the model enables that fault now)?"""
        ...

    def interleave(self, options: list[Action]) -> Action | None:
        """One of the other actors' steps to run before the loop's next command, or None."""
        ...


class _Stop(threading.Event):
    """The stop event the loop polls: set when the driver says so; its wait returns at once
    (time is the harness's clock, not the wall's)."""

    def __init__(self, stopped: Callable[[], bool]) -> None:
        super().__init__()
        self._stopped = stopped

    def is_set(self) -> bool:
        return self._stopped()

    def wait(self, timeout: float | None = None) -> bool:
        return self.is_set()


def drivable(h: Harness) -> list[tuple[int, int, int]]:
    """(server, process, worker) of each worker whose loop can be driven now: it holds nothing in
    the harness's hands, its process runs (claimed, drained, not superseded), and the model lets it
    take or reconcile."""
    enabled = enabled_steps(h)
    found = []
    for s, i, slot in running_slots(h):
        for w, ws in enumerate(slot.workers):
            if ws.worker is None or ws.crashed or ws.stopped or ws.task is not None:
                continue
            if ("take", s, i, w) in enabled or ("reconcile", s, i, w) in enabled:
                found.append((s, i, w))
    return found


def enabled_steps(h: Harness) -> set[tuple[str, int, int, int]]:
    """(name, server, process, worker) of each step the model enables now, faults left out."""
    return {(a.name, a.server, a.proc, a.worker) for a in h.enabled() if not a.is_fault}


def running_slots(h: Harness) -> Iterator[tuple[int, int, ProcSlot]]:
    """(server, process, slot) of each process that runs (claimed, drained, not superseded)."""
    for s, procs in enumerate(h.procs):
        for i, slot in enumerate(procs):
            if (
                i < len(h.state.processes[s])
                and h.state.processes[s][i].phase == RUNNING
                and not slot.server.superseded
            ):
                yield s, i, slot


def interleave(
    driver: Any, options: Callable[[], list[Action]], step: Callable[[Action], None] | None = None
) -> None:
    """Other actors' steps, while the `driver` (a loop's or the background thread's) has
    interleaved fewer than `MAX_INTERLEAVED` in its run: each chosen by its choices among
    `options()` (asked again after every step; none, or none chosen, ends it) and performed and
    checked (`step`; by default the harness's step, then its check)."""
    while driver.interleaved < MAX_INTERLEAVED:
        now = options()
        chosen = driver.choices.interleave(now) if now else None
        if chosen is None:
            return
        driver.interleaved += 1
        if step is None:
            driver.h.step(chosen)
            driver.h.check()
        else:
            step(chosen)
        # a superseded process that exits renumbers those after it, on both sides
        driver.i = driver.h.procs[driver.s].index(driver.slot)


def await_answer(worker: Worker, real_redis: bool) -> None:
    """On a real server, wait until Redis has answered what `worker` sent without reading the
    reply (the record: its reply is read with the next command's), before Redis is read back
    from another connection. Otherwise that read races the worker's own socket: the model has
    the record and Redis, not having run it yet, has none (a `records` mismatch, seen
    with both cores busy; tests/regressions/test_loop_check_awaits_the_record.py). The
    step-driven run reads the reply
    (`Worker.flush`); a production loop must read its own, so this only waits for it to arrive
    and leaves it unread (`Worker.answered`). fakeredis runs a command as it is sent: nothing to
    wait for there."""
    if not real_redis:
        return
    if not worker.answered(ANSWER_SECONDS):
        raise Mismatch(
            "loop", f"Redis did not answer the worker's unread command within {ANSWER_SECONDS:g} s"
        )


#: Demonstration loops that break the protocol (the test proves the driven run catches them):
#: each patches one worker before its loop runs.
def _skips_reconcile(worker: Worker) -> None:
    """The loop never drains its own list when dirty: it just forgets it was."""

    def reconcile() -> int:
        worker.dirty = False
        return 0

    setattr(worker, "reconcile", reconcile)  # noqa: B010 (a method, replaced on one object)


BROKEN_LOOPS: dict[str, Callable[[Worker], None]] = {
    "loop-skips-reconcile": _skips_reconcile,
}


class LoopDriver:
    """Runs one worker's production loop (`Worker.run`) from its start until it is stopped, the
    model checking every command it sends (module doc)."""

    def __init__(
        self, h: Harness, s: int, i: int, w: int, choices: Choices, loop: str = "correct"
    ) -> None:
        self.h = h
        self.s, self.i, self.w = s, i, w
        self.choices = choices
        self.loop = loop
        slot = self.slot = h.procs[s][i]
        self.label = slot.label
        self.ws: WorkerSlot = slot.workers[w]
        assert self.ws.worker is not None
        self.worker: Worker = self.ws.worker
        self.stopping = False
        self.commands = 0  # the loop's commands that the model saw
        self.interleaved = 0
        self.inside = False  # another actor's step, or a check: its commands are not the loop's
        self.checked = True  # the state after the loop's last command was checked
        self.last: Action | None = None  # the model action of the loop's last command
        self.sent: str | None = None  # the name of the loop's last command
        self.took = False  # the loop's last command was more than one model action
        self.failure: Mismatch | None = None  # the first the driver found
        self.joined = False  # the loop's last command and its next are one model step

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> int:
        """Drive the loop until it stops; returns how many of its commands the model saw."""
        if self.loop != "correct":
            BROKEN_LOOPS[self.loop](self.worker)
        injector = self.h.injector
        injector.on_send = self._on_send
        try:
            try:
                self.worker.run(_Stop(self._stopped))
            except Exception:
                if self.failure is not None:
                    raise self.failure from None
                raise
            if self.failure is not None:
                raise self.failure  # (swallowed by the loop as if Redis had failed it)
            if injector.armed:
                raise Mismatch("fault", "a reply the driver dropped did not surface")
            self._track()  # (its last command: armed, if an idle take)
        finally:
            injector.on_send = None
            injector.disarm_all()
            # The loop ends holding nothing: `finish` ran the task its last release took.
            self.ws.task = self.ws.outcome = None
            self.ws.stage = IDLE
        return self.commands

    def _stopped(self) -> bool:
        """The loop's stop event: drawn, forced after MAX_COMMANDS, or when the loop would idle
        (the model lets its worker neither take nor reconcile, and it holds nothing)."""
        if self.stopping:
            return True
        me = self.h.state.processes[self.s][self.i].workers[self.w]
        would_idle = not self._mine("take") and not self._mine("take_suspect")
        return me.phase in (IDLE, ARMED) and would_idle

    # -- the hook ------------------------------------------------------------------------------

    def _on_send(
        self, heads: list[tuple[str, bytes]], label: str | None, conn: object, packed: bytes
    ) -> None:
        if self.inside or not heads:
            return
        if self.failure is not None:
            raise self.failure  # (the loop's `finally` sends on: the first finding stands)
        try:
            self._hook(heads, label, conn, packed)
        except Mismatch as exc:
            self.failure = exc
            raise

    def _hook(
        self, heads: list[tuple[str, bytes]], label: str | None, conn: object, packed: bytes
    ) -> None:
        names = [name for name, _ in heads]
        if conn is self.worker._conn:
            take = next((n for n in names if n in TAKES), None)
            if take is not None:
                self._before("take", lambda: self.h.injector.arm(take, connection=conn))
            elif names[0] == "EVALSHA" and heads[0][1] in OWN_SCRIPTS:
                name = OWN_SCRIPTS[heads[0][1]]
                pending = list(getattr(conn, "_tc_pending", ()))
                mode = command_args(packed)[0][-3] if name == "release_and_take" else b""
                self._before(
                    name,
                    lambda: self.h.injector.arm(
                        "EVALSHA", connection=conn, skip=pending.count("EVALSHA")
                    ),
                    mode,
                )
        elif label == self.label and names[0] == "LLEN":
            n = len(list_of(self.h.state, self._key()))
            self._before(
                "reconcile",
                lambda: self.h.injector.arm("EVAL", label=self.label, skip=max(0, n - 1)),
            )

    def _key(self) -> tuple[int, int, int]:
        return (self.s, self.h.state.processes[self.s][self.i].inc, self.w)

    def _mine(self, name: str, command: str = "") -> Action | None:
        action = Action(name, self.s, self.i, self.w, command)
        return action if action in enabled_actions(self.h.state, self.h.config) else None

    def _before(self, name: str, arm: Callable[[], object], mode: bytes = b"") -> None:
        """The loop is about to send the command of model action `name` (module doc, 1-5);
        `mode`: what a composite's command asks to take (RELEASE_AND_TAKE's argument)."""
        h = self.h
        self.inside = True
        try:
            joined, self.joined = self.joined, False
            self._track()
            self._path(name, mode)  # a step the model does not allow here: said first, as such
            acquired = False if joined else self._check(name, mode)
            path = self._path(name, mode)  # (other actors may have stepped meanwhile)
        finally:
            self.inside = False
        # A take of a suspect that finds none registered our list all the same (TAKE_AND_RECORD)
        # and changes nothing else: no model action does only that. The take from the queue that
        # `Worker.take` sends next registers it too (`take`, `arm`): the two are one step here,
        # nobody steps and nothing is checked between them.
        self.joined = name == "take_suspect" and not path
        h.injector.disarm_all()
        self.commands += 1
        h.counts["loop-commands"] += 1
        # A composite that took our process's suspect slot keeps it, its reply lost, until the
        # worker's reconcile (the loop's next step; the slot is the process's own, not Redis's).
        # When the model's step does not leave the slot with the worker (no suspect waited: it
        # took from the queue, or nothing), the model cannot say that: that reply is not lost.
        if len(path) == 1:
            lost = self._mine("dropped_reply", path[0].name)
            if (
                lost is not None
                and acquired
                and apply(h.state, lost, h.config).processes[self.s][self.i].suspect != self.w
            ):
                lost = None
            if lost is not None and self.choices.lose(lost):
                arm()
                path = [lost]
                h.counts[f"dropped-reply:{lost.command}"] += 1
                h.counts["dropped-reply:loop"] += 1
        if len(path) > 1:
            h.counts["loop-composites-passing-a-suspect"] += 1
        for action in path:
            if action.name == "arm":
                h.counts["loop-arms"] += 1
            h.steps.append(
                StepRecord(
                    len(h.steps) + 1,
                    action,
                    f"{h.describe(action)} (by its production loop)",
                    action.is_fault,
                    actor_of(action, h.state),
                )
            )
            h.model_step(action)
        self.last = path[-1] if path else None
        self.took = len(path) > 1
        self.sent = name
        self.checked = False
        if self.commands >= MAX_COMMANDS or self.choices.stop():
            self.stopping = True

    def _track(self) -> None:
        """The harness's view of the worker (`WorkerSlot`: what it holds, at which stage), after
        the loop's last command, from what that command did in Redis: the task a take moved is
        the head of our list (read back, not taken from the model). A take that found the queue
        empty left the worker armed (`arm`); any other take ends that."""
        last, ws, sent = self.last, self.ws, self.sent
        took = self.took  # a composite's command that was a release, a take and a record
        self.last = self.sent = None
        self.took = False
        if sent == "take":
            ws.armed = (last is not None and last.name == "arm") or (last is None and ws.armed)
        elif sent in ("take_suspect", "release_and_take") and last is not None:
            ws.armed = False
        if last is None or last.is_fault:
            if last is not None:
                ws.task = ws.outcome = None
                ws.stage = IDLE
            return
        if last.name == "record" and not took:
            ws.stage = RECORDED
        elif took or last.name in ("take", "take_suspect", "release_and_take"):
            raw = self.h.admin.lindex(self.worker.list_key, 0)
            ws.task = (
                None
                if raw is None
                else envelope.decode(raw if isinstance(raw, bytes) else str(raw).encode())
            )
            ws.stage = (
                IDLE
                if raw is None
                else TAKEN
                if last.name in ("take", "take_suspect")
                else RECORDED
            )
        elif last.name != "arm":  # a release, a reconcile
            ws.task = ws.outcome = None
            ws.stage = IDLE

    def _check(self, name: str, mode: bytes) -> bool:
        """`Harness.check`, just before the loop's command of model action `name` is sent, then
        other actors' steps. A take of a suspect (alone or in a release's script) takes the
        process's suspect slot before it sends (`Worker.take_suspect`): that belongs to the
        command not yet sent, so the check does not see it, and nobody else steps then (another
        worker of the process could not take the slot the model still calls free). Returns
        whether the command took the slot so."""
        suspects = self.slot.server.suspect_slot
        mine = self.worker.list_key
        model = self.h.state.processes[self.s][self.i].suspect
        acquired = (
            (name == "take_suspect" or mode == b"suspect")
            and suspects.held_by(mine)
            and model != self.w
        )
        if acquired:
            suspects.release(mine)  # (lent back for the check: the command is not sent yet)
        try:
            if not self.checked:
                if self.h.injector.armed:
                    raise Mismatch("fault", "a reply the driver dropped did not surface")
                await_answer(self.worker, self.h.real_redis)
                self.h.check()
                self.checked = True
        finally:
            if acquired:
                suspects.acquire(mine)  # (nobody stepped meanwhile: it is free)
        if not acquired:
            self._interleave(name)
        return acquired

    def _path(self, name: str, mode: bytes) -> list[Action]:
        """The model actions the loop's command performs, in order, each checked to be enabled
        when it runs (the first now; `Mismatch("loop", ...)` if not).

        - A take that finds the queue empty registers the list and waits: `arm`; the take it
          sends again while it waits changes nothing the model sees ([]).
        - A composite (RELEASE_AND_TAKE) takes what its command asks for, decided when the
          worker built it (`mode`): "" (the worker is dirty) nothing, the plain `release`;
          "suspect" a waiting suspect, else the queue's next task, as the model's
          `release_and_take`; "queue" only the queue's next task, even when a suspect waits
          (one came while other actors stepped): then the model's composite would take the
          suspect, and the command is `release`, `take`, `record` in a row, which the model
          says the composite is (protocol.py). A composite with nothing to take is the plain
          `release`."""
        state, me = self.h.state, self.h.state.processes[self.s][self.i]
        phase = me.workers[self.w].phase
        if name == "take" and not state.queue:
            if phase == ARMED:
                return []  # still waiting: the registration is the model's already
            if phase == IDLE and self._mine("arm") is not None:
                return [self._one("arm")]
        if name == "take_suspect" and not state.suspects:
            return []  # the worker's hint said a suspect may wait; none does
        if name != "release_and_take":
            return [self._one(name)]
        suspect_first = bool(state.suspects) and me.suspect in (-1, self.w)
        composite = self._mine("release_and_take")
        if mode == b"suspect" or (mode == b"queue" and not suspect_first):
            return [composite] if composite is not None else [self._one("release")]
        release = self._one("release")
        if mode != b"queue" or not state.queue:
            return [release]
        after = apply(state, release, self.h.config).processes[self.s][self.i]
        if after.workers[self.w].phase != IDLE:
            return [release]  # debris left in our list: the script takes nothing
        return [
            release,
            Action("take", self.s, self.i, self.w),
            Action("record", self.s, self.i, self.w),
        ]

    def _one(self, name: str) -> Action:
        action = self._mine(name)
        if action is not None:
            return action
        allowed = sorted(
            {
                a.name
                for a in enabled_actions(self.h.state, self.h.config)
                if (a.server, a.proc, a.worker) == (self.s, self.i, self.w) and not a.is_fault
            }
        )
        raise Mismatch(
            "loop",
            f"worker {self.w} of s{self.s}'s loop did {name} where the model "
            f"allows only {', '.join(allowed) or 'nothing'}",
        )

    def _interleave(self, name: str) -> None:
        """Other actors' steps before the loop's command of model action `name`
        (`_others`)."""
        interleave(self, lambda: self._others(name))

    def _others(self, name: str) -> list[Action]:
        """The steps other actors may take before the loop's command (or write) of model action
        `name`, which is built already: a take's registration carries the time it was built at.
        So no tick comes between a registering command and its send when registrations age: a
        take reaches Redis within the grace of the registration it carries, the assumption the
        registry's collection rests on (docs/protocol.md, section 8)."""
        registers = self.h.bounds.registration_ages and name in REGISTERING
        return [
            a
            for a in self.h.enabled()
            if a.name in INTERLEAVED
            and not a.is_fault
            and not self._drives(a)
            and not (registers and a.name == "advance_clock")
        ]

    def _drives(self, action: Action) -> bool:
        """Whether `action` is a step of the worker(s) whose loop this driver runs."""
        return (action.server, action.proc, action.worker) == (self.s, self.i, self.w)
