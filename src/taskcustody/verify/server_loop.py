"""The server's background thread, driven from the model: `Server._background` itself.

The stateful machine steps a server's heartbeat, sweep and promotion one at a time, in the order
the model chooses; a background loop that stops sweeping, or never heartbeats, would pass every
such run. Here the real loop (`Server._background`) runs in the test thread, with a hook at each
of its steps (`Server.heartbeat`, `Server.promote_due`, `Server.sweep`, patched on the one server
object for the run). At each hook the `ServerLoopDriver`:

1. checks the state the loop's previous step left (the real state equals the model's);
2. may let other actors step first (workers, other servers' sweeps, an enqueue, the clock): among
   them a worker whose take waits on the empty queue (the model's `arm`, `Harness._arm`) and a
   stall of another process (a fault, within the budget). Registrations age
   (`machine.LOOP_BOUNDS`, a grace of one tick), so the thread's sweeps meet design 9's
   counterexample: a stalled process expires, its worker's take waits on the empty queue (a
   fresh registration), and the sweep must spare the list, in Redis as in the model; one that
   forgets a registration younger than the grace (the named mutant `gc-when-empty`) is caught;
3. performs the step through the harness as the model's action, when the model has one for it
   (`heartbeat`, `sweep` with its passes, the processing sweep), the real call being the loop's
   own (the hook lets the harness's call through); a step that changes nothing the model sees (a
   heartbeat that renews a fresh registration, a sweep with no work, a promotion with nothing
   scheduled) runs alone. Its result, or its error (a lost reply the harness injected, a
   supersession), goes back to the loop, which handles it as in production;
4. checks the loop's cadence: a beat whose heartbeat went through is a completed beat, and the
   loop sweeps at least once every ceil(sweep_interval / heartbeat_interval) completed beats
   (`Settings.sweep_period`) -- else `Mismatch("loop", ...)`.

Time is the harness's `ManualClock` (the clock moves only by the model's `advance_clock`); the
stop event's wait returns at once. The loop runs at least `MIN_BEATS` beats (enough for the
cadence check to see a loop that stops sweeping) and at most `MAX_BEATS`. The sweep lease
(`Settings.sweep_lease`) is real: it is released when the run ends, so each run's first sweep
takes it, whatever wall-clock time passed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

from taskcustody_model import Action, enabled_actions
from taskcustody_model.state import RUNNING

from ..core.server import Server
from .harness import Harness, actor_of
from .loops import INTERLEAVED, _Stop, interleave
from .observation import Mismatch, StepRecord

MIN_BEATS = 4
MAX_BEATS = 5


class ServerChoices(Protocol):
    def stop(self) -> bool: ...

    def interleave(self, options: list[Action]) -> Action | None: ...

    def variant(self) -> int:
        """How a heartbeat is performed (`Harness.step`'s variant: 2 loses its reply)."""
        ...

    def drop_at(self) -> int:
        """Which move of the sweep's pass loses its reply (0: none)."""
        ...


def drivable(h: Harness) -> list[tuple[int, int]]:
    """(server, process) of each process whose background thread can be driven now: running,
    not stalled, not superseded."""
    return [
        (s, i)
        for s, procs in enumerate(h.procs)
        for i, slot in enumerate(procs)
        if i < len(h.state.processes[s])
        and h.state.processes[s][i].phase == RUNNING
        and not slot.stalled
        and not slot.server.superseded
    ]


#: Demonstration loops that break the protocol (the test proves the driven run catches them).
def _sweeps_once(server: Server) -> None:
    """The background thread sweeps at its first beat, then never again."""
    sweep = server.periodic_sweep
    done = {"once": False}

    def periodic_sweep() -> Any:
        if done["once"]:
            return None
        done["once"] = True
        return sweep()

    setattr(server, "periodic_sweep", periodic_sweep)  # noqa: B010 (one object's method)


BROKEN_SERVER_LOOPS: dict[str, Callable[[Server], None]] = {
    "background-sweeps-once": _sweeps_once,
}


class ServerLoopDriver:
    """Runs one process's background thread (`Server._background`) until it is stopped, the
    model performing or checking each of its steps (module doc)."""

    def __init__(
        self, h: Harness, s: int, i: int, choices: ServerChoices, loop: str = "correct"
    ) -> None:
        self.h = h
        self.s, self.i = s, i
        self.slot = h.procs[s][i]
        self.server: Server = self.slot.server
        self.choices = choices
        self.loop = loop
        settings = h.settings
        self.every = max(1, math.ceil(settings.sweep_interval / settings.heartbeat_interval - 1e-9))
        self.inside = False
        self.stopping = False
        self.beats = 0  # heartbeats the loop started
        self.since_sweep = 0  # completed beats since its last sweep
        self.sweeps = 0
        self.interleaved = 0
        self.steps = 0  # the loop's steps the model saw
        #: where the harness's call of the hooked method puts its result or error (`_through`)
        self.capture: dict[str, Any] | None = None

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> int:
        """Drive the loop until it stops; returns how many of its steps ran."""
        server = self.server
        originals = {name: getattr(server, name) for name in ("heartbeat", "promote_due", "sweep")}
        stop_event = server.stop_event
        server.stop_event = _Stop(lambda: self.stopping)
        hooks = {
            "heartbeat": self._heartbeat,
            "promote_due": self._promote_due,
            "sweep": self._sweep,
        }
        for name, hook in hooks.items():
            setattr(server, name, self._hooked(originals[name], hook))
        if self.loop != "correct":
            BROKEN_SERVER_LOOPS[self.loop](server)
        try:
            server._background()
        finally:
            for name in (*hooks, "periodic_sweep"):
                server.__dict__.pop(name, None)
            server.stop_event = stop_event
            self.inside = True
            try:
                if server.incarnation is not None and server.settings.sweep_lease:
                    server.sweep_lease.release()
            finally:
                self.inside = False
        self.h.counts["server-loop-runs"] += 1
        self.h.counts["server-loop-beats"] += self.beats
        self.h.counts["server-loop-sweeps"] += self.sweeps
        return self.steps

    def _hooked(
        self, original: Callable[..., Any], hook: Callable[[Callable[..., Any]], Any]
    ) -> Callable[..., Any]:
        """`original`, called through `hook` when the loop calls it; straight through when the
        harness does (inside a step or a check)."""

        def call(*args: Any, **kwargs: Any) -> Any:
            if not self.inside:
                return hook(lambda: original(*args, **kwargs))
            capture, self.capture = self.capture, None  # (the first such call only)
            if capture is None:
                return original(*args, **kwargs)
            try:
                capture["result"] = original(*args, **kwargs)
            except BaseException as exc:
                capture["error"] = exc
                raise
            return capture["result"]

        return call

    # -- the hooks -----------------------------------------------------------------------------

    def _heartbeat(self, call: Callable[[], Any]) -> Any:
        if self.since_sweep >= self.every:
            raise Mismatch(
                "loop",
                f"the background thread of s{self.s} did not sweep in "
                f"{self.since_sweep} beats (it must sweep at least once "
                f"every {self.every}: sweep_interval / heartbeat_interval)",
            )
        self.beats += 1
        if self.beats >= MAX_BEATS or (self.beats >= MIN_BEATS and self.choices.stop()):
            self.stopping = True  # after this beat
        action = Action("heartbeat", self.s, self.i)
        self._before()
        if action in self.h.enabled():
            result = self._through(
                call, lambda: self.h.step(action, variant=self.choices.variant())
            )
        else:
            # a renewal of a fresh registration: nothing the model sees changes
            result = self._alone(call)
        self.since_sweep += 1  # (a heartbeat that raised does not get here: the beat ended)
        return result

    def _promote_due(self, call: Callable[[], Any]) -> Any:
        self._before()
        if self.h.state.scheduled:
            raise Mismatch(
                "driver",
                "the server-loop driver does not map a promotion of a "
                "scheduled retry (its bounds have no handler failures)",
            )
        return self._alone(call)

    def _sweep(self, call: Callable[[], Any]) -> Any:
        self.sweeps += 1
        self.since_sweep = 0
        self._before()
        h, s, i = self.h, self.s, self.i
        action = Action("sweep", s, i)
        if action in enabled_actions(h.state, h.config):
            return self._through(call, lambda: h.step(action, drop_at=self.choices.drop_at()))
        # No prune, collection or drain to do: the pass is its processing sweep alone.
        stuck = Action("requeue_stuck_processing_tasks", s, i)
        if stuck not in enabled_actions(h.state, h.config):
            return self._alone(call)
        before = h.state.queue, h.state.suspects
        self._record(stuck)
        result = self._alone(call)
        h.model_step(stuck)
        h._adopt_recovery_order(before)
        return result

    # -- plumbing ------------------------------------------------------------------------------

    def _before(self) -> None:
        """Check what the loop's previous step left, then let other actors step."""
        self.inside = True
        try:
            self.h.check()
            self._interleave()
        finally:
            self.inside = False
        self.steps += 1
        self.h.counts["server-loop-steps"] += 1

    def _through(self, call: Callable[[], Any], step: Callable[[], None]) -> Any:
        """Run the harness's `step`, whose real side calls the same server method as the loop
        (`call`, with no arguments): that call's result, or its error, goes back to the loop
        (the harness handles the error on its side first)."""
        outcome: dict[str, Any] = {}
        self.inside = True
        self.capture = outcome
        try:
            step()
        finally:
            self.inside = False
            self.capture = None
        if "error" in outcome:
            raise outcome["error"]
        if "result" not in outcome:
            raise Mismatch("driver", "the harness's step did not make the loop's call")
        return outcome["result"]

    def _alone(self, call: Callable[[], Any]) -> Any:
        self.inside = True
        try:
            return call()
        finally:
            self.inside = False

    def _record(self, action: Action) -> None:
        h = self.h
        h.steps.append(
            StepRecord(
                len(h.steps) + 1,
                action,
                f"{h.describe(action)} (by its background thread)",
                action.is_fault,
                actor_of(action, h.state),
            )
        )

    def _interleave(self, name: str = "") -> None:
        """Other actors' steps (`loops.interleave`), and the two the harness does not offer: a
        worker's take that waits on the empty queue, another process's stall (module doc)."""
        h = self.h
        interleave(
            self,
            lambda: (
                [
                    a
                    for a in h.enabled()
                    if a.name in INTERLEAVED
                    and not a.is_fault
                    and not (a.name == "sweep" and (a.server, a.proc) == (self.s, self.i))
                ]
                + [
                    a
                    for a in enabled_actions(h.state, h.config)
                    if (
                        a.name == "arm"
                        and h.procs[a.server][a.proc].workers[a.worker].worker is not None
                    )
                    or (a.name == "stall_server" and (a.server, a.proc) != (self.s, self.i))
                ]
            ),
        )
