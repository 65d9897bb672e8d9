"""The prefetching worker's cycle, driven from the model: `PrefetchingWorker.run` itself.

The prefetching machine (verify/prefetching.py) sends one pipelined take or release at a time, in
the order the model chooses; a cycle that skips its reconcile, or takes for a slot that is still
dirty, would pass every such run. Here the harness's free workers of one process become the slots
of one real `PrefetchingWorker`, whose loop (`run_until_stopped`, `run_once`: reconcile the dirty
slots, the suspect's take, the pipelined takes, the handlers, the pipelined releases, the lead's
blocking cycle when the queue is empty) runs in the test thread, with the hook of
`loops.LoopDriver` at every write it sends. At each hook the `PrefetchLoopDriver` checks the state
the loop's previous write left, may let other actors step, then maps the write to model actions,
slot by slot:

- a take pipeline (TAKE_AND_RECORD per slot, from the queue): per slot in order, `take` then
  `record` while the queue holds a task; once it is empty, `arm` (the script registered the
  list all the same, score = when the pipeline was built: registrations age in this machine,
  `machine.LOOP_BOUNDS`, so the list is fresh, and the slot is armed until a tick, like a
  blocking take that waits), nothing for a slot armed already. A slot the model holds dirty
  (or holding a task) must not be in it: `Mismatch("loop", ...)`;
- the suspect's take (TAKE_AND_RECORD from the suspects list, the lead alone): `take_suspect`,
  `record`; when no suspect waits, nothing, but it registered the lead's list: it is one step
  with the take pipeline `take_all` sends next (nobody steps, nothing is checked between);
- a release pipeline (RELEASE per slot): per slot, `release`;
- a reconcile (its LLEN on the process's pool, by list key): `reconcile` for a slot the model
  holds dirty; nothing for one it holds idle whose list is empty (after a lost reply
  `run_until_stopped` marks every slot dirty: the model's idle ones reconcile an empty list, one
  LLEN; until then the check counts such a slot idle, which is what it is in the model's terms);
- the lead's own blocking cycle (BLMOVE, RECORD, RELEASE on its connection): as
  `loops.LoopDriver` maps a plain worker's.

A reply may be lost at any slot j of a pipeline (and with it every later reply, as the real
connection loses them), when the model's fault budget allows it: from slot j on, a take that
brought a task is, in the model's terms, a take and record whose worker crashed holding it and was
restarted dirty (verify/prefetching.py says why), a suspect's take its `dropped_reply`, a release
its `dropped_reply` (a slot that found the queue empty is armed all the same: its script ran).
Each model action of a write is checked to be enabled when it runs. No tick comes before a take
pipeline (`LoopDriver._others`): it carries the time it was built at. So every sweep is driven,
also one that would forget a slot's fresh list, and one that forgets it is caught (the named
mutant `gc-when-empty`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from taskcustody_model import Action, apply, enabled_actions, list_of
from taskcustody_model.state import ARMED, DIRTY, IDLE, RECORDED, State

from ..core import envelope, scripts
from ..core.prefetch import PrefetchingWorker
from ..core.worker import Worker
from .faults import command_args
from .harness import Harness, actor_of
from .loops import (
    BROKEN_LOOPS,
    Choices,
    LoopDriver,
    _Stop,
    enabled_steps,
    interleave,
    running_slots,
)
from .observation import Mismatch, StepRecord

#: At most this many writes of the loop (pipelines, reconciles, the lead's commands) before it is
#: stopped.
MAX_WRITES = 10

TAKE_SHA = scripts.TAKE_AND_RECORD_SCRIPT.sha.encode()
RELEASE_SHA = scripts.RELEASE_SCRIPT.sha.encode()


class PrefetchChoices(Choices, Protocol):
    def lose_at(self, positions: list[int]) -> int | None:
        """The slot of a pipeline whose reply is lost (and every later one's), or None."""
        ...


def drivable(h: Harness) -> list[tuple[int, int, tuple[int, ...]]]:
    """(server, process, slots) of each process whose free workers can be driven as one
    prefetching worker: it runs (not superseded), each slot holds nothing in the harness's hands,
    and the model lets one of them take or reconcile."""
    enabled = enabled_steps(h)
    found = []
    for s, i, slot in running_slots(h):
        free = tuple(
            w
            for w, ws in enumerate(slot.workers)
            if ws.worker is not None and not ws.crashed and not ws.stopped and ws.task is None
        )
        if any(("take", s, i, w) in enabled or ("reconcile", s, i, w) in enabled for w in free):
            found.append((s, i, free))
    return found


#: Demonstration loops that break the protocol (the test proves the driven run catches them).
def _skips_reconcile(pw: PrefetchingWorker) -> None:
    """The cycle never reconciles its dirty slots: each forgets it was dirty (the plain loop's
    broken reconcile, slot by slot) and takes all the same."""
    for slot in pw.slots:
        BROKEN_LOOPS["loop-skips-reconcile"](slot)


BROKEN_PREFETCH_LOOPS: dict[str, Callable[[PrefetchingWorker], None]] = {
    "prefetch-skips-reconcile": _skips_reconcile,
}


class PrefetchLoopDriver(LoopDriver):
    """Runs one process's free workers as one prefetching worker (`PrefetchingWorker.run`) until
    it is stopped, the model checking every write it sends (module doc). The lead (its first
    slot) is `LoopDriver`'s worker: its own blocking cycle is mapped as a plain worker's."""

    def __init__(
        self,
        h: Harness,
        s: int,
        i: int,
        slots: tuple[int, ...],
        choices: PrefetchChoices,
        loop: str = "correct",
    ) -> None:
        super().__init__(h, s, i, slots[0], choices, loop)
        self.pchoices = choices
        self.slots = slots
        self.workers: dict[int, Worker] = {}
        for w in slots:
            worker = self.slot.workers[w].worker
            assert worker is not None
            self.workers[w] = worker
        self.by_key = {worker.list_key: w for w, worker in self.workers.items()}
        self.pw: PrefetchingWorker | None = None
        #: what the loop's last write did to each slot, applied to the harness's view of it at
        #: the next hook (once the loop has read the replies): "held" or "idle"
        self.pending: list[tuple[int, str]] = []

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> int:
        take_next = {w: worker.take_next for w, worker in self.workers.items()}
        pw = self.pw = PrefetchingWorker([self.workers[w] for w in self.slots])
        if self.loop != "correct":
            BROKEN_PREFETCH_LOOPS[self.loop](pw)
        injector = self.h.injector
        injector.on_send = self._on_send
        try:
            try:
                pw.run(_Stop(self._stopped))
            except Exception:
                if self.failure is not None:
                    raise self.failure from None
                raise
            if self.failure is not None:
                raise self.failure
            if injector.armed:
                raise Mismatch("fault", "a reply the driver dropped did not surface")
            self._track()
            self._settle_clean()
        finally:
            injector.on_send = None
            injector.disarm_all()
            pw._conn.disconnect()  # type: ignore[no-untyped-call]
            for w, worker in self.workers.items():
                worker.take_next = take_next[w]
                ws = self.slot.workers[w]
                ws.task = ws.outcome = None
                ws.stage = IDLE
        return self.commands

    def _settle_clean(self) -> None:
        """A slot the loop left dirty that the model holds idle (its list empty) reconciles now
        (one LLEN, nothing the model sees), as its next cycle would first thing: the harness's
        steps take it from here."""
        self.inside = True
        try:
            for w in self._clean_in_the_model():
                self.workers[w].reconcile()
        finally:
            self.inside = False

    def _stopped(self) -> bool:
        """Drawn, forced after MAX_COMMANDS, or when the loop would idle: every slot idle in the
        model and none may take."""
        if self.stopping:
            return True
        state = self.h.state
        me = state.processes[self.s][self.i]
        if any(me.workers[w].phase not in (IDLE, ARMED) for w in self.slots):
            return False
        return not any(
            self._slot_may(name, w) for w in self.slots for name in ("take", "take_suspect")
        )

    def _slot_may(self, name: str, w: int) -> bool:
        return Action(name, self.s, self.i, w) in enabled_actions(self.h.state, self.h.config)

    # -- the hook ------------------------------------------------------------------------------

    def _hook(
        self, heads: list[tuple[str, bytes]], label: str | None, conn: object, packed: bytes
    ) -> None:
        assert self.pw is not None
        names = [name for name, _ in heads]
        if conn is self.pw._conn:
            commands = [
                a for a in command_args(packed) if a and a[0].upper() in (b"EVALSHA", b"EVAL")
            ]
            if not commands:
                return
            if any(a[0].upper() != b"EVALSHA" for a in commands):
                raise Mismatch(
                    "driver",
                    "the prefetching loop sent a script by its text (the "
                    "driver maps its pipelines by hash)",
                )
            if commands[0][1] == TAKE_SHA:
                self._take_pipeline(commands)
            elif commands[0][1] == RELEASE_SHA:
                self._release_pipeline(commands)
            else:
                raise Mismatch("driver", "a pipeline of an unknown script")
        elif conn is self.worker._conn:
            super()._hook(heads, label, conn, packed)  # the lead's own blocking cycle
        elif label == self.label and names[0] == "LLEN":
            key = command_args(packed)[0][1].decode()
            if key in self.by_key:
                self._reconcile(self.by_key[key])

    # -- the mapping ---------------------------------------------------------------------------

    def _pre(self, name: str) -> None:
        """Before the loop's write: the harness's view brought up to date, the check of what the
        previous write left, and other actors' steps (`LoopDriver._check`), unless the write is
        one step with the previous one (`joined`)."""
        self.inside = True
        try:
            joined, self.joined = self.joined, False
            self._track()
            if not joined:
                self._check(name, b"")
        finally:
            self.inside = False

    def _walk(self, steps: list[list[Action]]) -> State | None:
        """The model's state after `steps` in a row, or None if one is not enabled when it
        runs."""
        state = self.h.state
        for actions in steps:
            for a in actions:
                if a not in enabled_actions(state, self.h.config):
                    return None
                state = apply(state, a, self.h.config)
        return state

    def _refused(self, w: int, did: str, state: State | None = None) -> Mismatch:
        state = state or self.h.state
        allowed = sorted(
            {
                a.name
                for a in enabled_actions(state, self.h.config)
                if (a.server, a.proc, a.worker) == (self.s, self.i, w) and not a.is_fault
            }
        )
        return Mismatch(
            "loop",
            f"worker {w} of s{self.s}'s prefetching loop did {did} where the "
            f"model allows only {', '.join(allowed) or 'nothing'}",
        )

    def _take_pipeline(self, commands: list[list[bytes]]) -> None:
        keys = self.h.keys
        suspect = commands[0][3].decode() == keys.suspects
        order = [self.by_key[a[4].decode()] for a in commands]
        name = "take_suspect" if suspect else "take"
        self._pre(name)
        s, i = self.s, self.i
        state = self.h.state
        plain: list[list[Action]] = []
        for w in order:
            phase = state.processes[s][i].workers[w].phase
            if phase not in (IDLE, ARMED):
                raise self._refused(w, name, state)
            acts = (
                [Action(name, s, i, w), Action("record", s, i, w)]
                if (state.suspects if suspect else state.queue)
                else []
            )
            if not acts and not suspect and phase == IDLE:
                # The slot's script found the queue empty: it registered the list all the same
                # (ZADD, score = when the pipeline was built), the model's `arm` (the slot
                # armed until a tick ends its take, like a blocking take that waits).
                acts = [Action("arm", s, i, w)]
            for a in acts:
                if a not in enabled_actions(state, self.h.config):
                    raise self._refused(w, a.name, state)
                state = apply(state, a, self.h.config)
            plain.append(acts)
        # A suspect's take that finds none registered the lead's list all the same, which no
        # model action does alone; the take pipeline `take_all` sends next registers it too
        # (`take` or `arm`): the two are one step, nobody steps and nothing is checked between.
        self.joined = suspect and not plain[0]

        def took(k: int) -> bool:
            return any(a.name != "arm" for a in plain[k])

        def lost_walk(k: int) -> list[Action]:
            w, acts = order[k], plain[k]
            if not took(k):
                return acts  # (an empty slot's script ran all the same: it registered)
            if suspect:
                return [Action("dropped_reply", s, i, w, "take_suspect")]
            return [*acts, Action("crash_worker", s, i, w), Action("restart_worker", s, i, w)]

        if suspect and plain[0]:
            self.h.counts["prefetch-loop-suspect-takes"] += 1
        positions = [
            j
            for j in range(len(order))
            if took(j)
            and self._walk(plain[:j] + [lost_walk(k) for k in range(j, len(order))]) is not None
        ]
        lost = self._lose_from(positions)
        for k, w in enumerate(order):
            gone = lost is not None and k >= lost
            for a in lost_walk(k) if gone else plain[k]:
                self._model(a)
            if not took(k):
                if plain[k]:
                    self.h.counts["prefetch-loop-arms"] += 1
                    self.pending.append((w, "armed"))
            elif gone:
                self.pending.append((w, "idle"))
            else:
                self.pending.append((w, "held"))
        self._sent(len(commands))

    def _lose_from(self, positions: list[int]) -> int | None:
        """The slot of the pipeline (among `positions`, where the model allows it) whose reply is
        lost, and every later one's: the injector armed to drop them, and counted; None if none
        is."""
        lost = self.pchoices.lose_at(positions) if positions else None
        if lost is not None:
            self.h.injector.arm("EVALSHA", connection=self.pw._conn if self.pw else None, skip=lost)
            self.h.counts["dropped-reply:prefetch-loop"] += 1
        return lost

    def _release_pipeline(self, commands: list[list[bytes]]) -> None:
        order = [self.by_key[a[3].decode()] for a in commands]
        self._pre("release")
        s, i = self.s, self.i
        plain = [[Action("release", s, i, w)] for w in order]
        if self._walk(plain) is None:
            state = self.h.state
            for w in order:
                if Action("release", s, i, w) not in enabled_actions(state, self.h.config):
                    raise self._refused(w, "release", state)
                state = apply(state, Action("release", s, i, w), self.h.config)
        lossy = [[Action("dropped_reply", s, i, w, "release")] for w in order]
        positions = [j for j in range(len(order)) if self._walk(plain[:j] + lossy[j:]) is not None]
        lost = self._lose_from(positions)
        for k, w in enumerate(order):
            for a in lossy[k] if lost is not None and k >= lost else plain[k]:
                self._model(a)
            self.pending.append((w, "idle"))
        self._sent(len(commands))

    def _reconcile(self, w: int) -> None:
        self._pre("reconcile")
        s, i = self.s, self.i
        state = self.h.state
        key = (s, state.processes[s][i].inc, w)
        phase = state.processes[s][i].workers[w].phase
        if phase == DIRTY:
            path = [Action("reconcile", s, i, w)]
            lost = Action("dropped_reply", s, i, w, "reconcile")
            if lost in enabled_actions(state, self.h.config) and self.choices.lose(lost):
                self.h.injector.arm(
                    "EVAL", label=self.label, skip=max(0, len(list_of(state, key)) - 1)
                )
                self.h.counts["dropped-reply:prefetch-loop"] += 1
                path = [lost]
            for a in path:
                self._model(a)
        elif phase not in (IDLE, ARMED) or list_of(state, key):
            raise self._refused(w, "reconcile")
        self.pending.append((w, "idle"))
        self._sent(1)

    def _model(self, action: Action) -> None:
        h = self.h
        h.steps.append(
            StepRecord(
                len(h.steps) + 1,
                action,
                f"{h.describe(action)} (by its prefetching loop)",
                action.is_fault,
                actor_of(action, h.state),
            )
        )
        h.model_step(action)

    def _sent(self, commands: int) -> None:
        """The write is about to go: what follows it is the next hook's to check."""
        self.commands += 1
        self.h.counts["prefetch-loop-writes"] += 1
        self.h.counts["prefetch-loop-commands"] += commands
        self.last = self.sent = None
        self.took = False
        self.checked = False
        if self.commands >= MAX_WRITES or self.choices.stop():
            self.stopping = True

    # -- the harness's view --------------------------------------------------------------------

    def _track(self) -> None:
        super()._track()
        pending, self.pending = self.pending, []
        for w, what in pending:
            ws = self.slot.workers[w]
            ws.outcome = None
            if what == "held":
                raw = self.h.admin.lindex(self.workers[w].list_key, 0)
                ws.task = (
                    None
                    if raw is None
                    else envelope.decode(raw if isinstance(raw, bytes) else str(raw).encode())
                )
                ws.stage = RECORDED if raw is not None else IDLE
                ws.armed = False
            else:
                ws.task = None
                ws.stage = IDLE
                if what == "armed":
                    ws.armed = True
                elif self.h.state.processes[self.s][self.i].workers[w].phase != ARMED:
                    ws.armed = False

    def _clean_in_the_model(self) -> list[int]:
        """Slots the loop holds dirty that the model holds idle (or armed) with an empty list:
        after a lost reply `run_until_stopped` marks every slot dirty; their reconcile moves
        nothing (one LLEN)."""
        state = self.h.state
        proc = state.processes[self.s][self.i]
        return [
            w
            for w in self.slots
            if self.workers[w].dirty
            and self.slot.workers[w].task is None
            and proc.workers[w].phase in (IDLE, ARMED)
            and not list_of(state, (self.s, proc.inc, w))
        ]

    @contextmanager
    def _as_the_model_sees(self) -> Iterator[None]:
        """While checking: a slot dirty with an empty list that the model holds idle is idle
        (`_clean_in_the_model`)."""
        clean = self._clean_in_the_model()
        for w in clean:
            self.workers[w].dirty = False
        try:
            yield
        finally:
            for w in clean:
                self.workers[w].dirty = True

    def _check(self, name: str, mode: bytes) -> bool:
        with self._as_the_model_sees():
            return super()._check(name, mode)

    def _interleave(self, name: str = "") -> None:
        def step(chosen: Action) -> None:
            with self._as_the_model_sees():
                self.h.step(chosen)
                self.h.check()

        interleave(self, lambda: self._others(name), step)

    def _drives(self, action: Action) -> bool:
        return (action.server, action.proc) == (self.s, self.i) and action.worker in self.slots
