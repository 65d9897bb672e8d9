"""The machine's kinds beyond the plain one: each adds rules to it, in a subclass, so that the
plain machine keeps its rules (Hypothesis draws a rule by its index among the machine's rules:
one more rule in it would change what every seeded run of it draws, the broken designs' pinned
runs among them).

- `pipelined`: a process's workers also take, or release, in one pipeline;
- `retrying`: handlers fail, the release schedules the retry and a promotion moves it back;
- `loop_driven`, `prefetch_loop_driven`, `server_loop_driven`: a production loop runs between
  the model's other steps (loops.py, prefetch_loop.py, server_loop.py).
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule
from taskcustody_model.state import Bounds

from . import loops, prefetch_loop, server_loop
from . import prefetching as pipelines
from .drawn import DrawnChoices, DrawnPrefetchChoices, DrawnServerChoices
from .harness import Harness

Machine = type[RuleBasedStateMachine]


def prefetch_loop_driven(base: Machine, loop: str) -> Machine:
    """`base`, and a process's free workers run as one prefetching worker."""

    class PrefetchLoopDrivenCustodyMachine(base):  # type: ignore[valid-type, misc]
        """... and a process's free workers run as one prefetching worker
        (`PrefetchingWorker.run`), from its start until it is stopped, between the model's
        other steps (verify/prefetch_loop.py)."""

        @precondition(lambda self: bool(prefetch_loop.drivable(self.h)))
        @rule(data=st.data())
        def prefetch_loop(self, data: st.DataObject) -> None:
            options = prefetch_loop.drivable(self.h)
            s, i, slots = options[data.draw(st.integers(0, len(options) - 1), label="which")]
            self.failed = True
            prefetch_loop.PrefetchLoopDriver(
                self.h, s, i, slots, DrawnPrefetchChoices(data), loop
            ).run()
            self.failed = False

    return PrefetchLoopDrivenCustodyMachine


def server_loop_driven(base: Machine, loop: str) -> Machine:
    """`base`, and a process's background thread runs."""

    class ServerLoopDrivenCustodyMachine(base):  # type: ignore[valid-type, misc]
        """... and a process's background thread (`Server._background`: heartbeats,
        promotions, sweeps) runs, from its start until it is stopped, between the model's
        other steps (verify/server_loop.py)."""

        @precondition(lambda self: bool(server_loop.drivable(self.h)))
        @rule(data=st.data())
        def server_loop(self, data: st.DataObject) -> None:
            options = server_loop.drivable(self.h)
            s, i = options[data.draw(st.integers(0, len(options) - 1), label="which")]
            self.failed = True
            server_loop.ServerLoopDriver(self.h, s, i, DrawnServerChoices(data), loop).run()
            self.failed = False

    return ServerLoopDrivenCustodyMachine


def loop_driven(base: Machine, loop: str) -> Machine:
    """`base`, and a worker's production loop runs."""

    class LoopDrivenCustodyMachine(base):  # type: ignore[valid-type, misc]
        """... and a worker's production loop runs, from its start until it is stopped,
        between the model's other steps (verify/loops.py)."""

        @precondition(lambda self: bool(loops.drivable(self.h)))
        @rule(data=st.data())
        def production_loop(self, data: st.DataObject) -> None:
            options = loops.drivable(self.h)
            s, i, w = options[data.draw(st.integers(0, len(options) - 1), label="which")]
            self.failed = True
            loops.LoopDriver(self.h, s, i, w, DrawnChoices(data), loop).run()
            self.failed = False

    return LoopDrivenCustodyMachine


def retrying(base: Machine, bounds: Bounds) -> Machine:
    """`base`, and handlers fail."""

    class RetryingCustodyMachine(base):  # type: ignore[valid-type, misc]
        """... and handlers fail: the release schedules the retry (a delay), and a
        promotion moves it back when due."""

        @precondition(
            lambda self: (
                self._has("retry") or (self._has("take") and self.h.state.faults < bounds.faults)
            )
        )
        @rule(data=st.data())
        def handler_fails(self, data: st.DataObject) -> None:
            """A handler fails and the release schedules its retry. Its window (a worker
            holding a recorded task, with fault budget left) is short, as a release's lost
            reply's is: when no worker is in it, a worker first takes and records."""
            if not self._has("retry"):
                take = self._of("take")
                action = take[data.draw(st.integers(0, len(take) - 1), label="which")]
                for step in (action, action._replace(name="record")):
                    self._step(step)
                    self.h.check()
            self._do(data, "retry")

        @precondition(lambda self: self._has("promote"))
        @rule(data=st.data())
        def promote(self, data: st.DataObject) -> None:
            self._do(data, "promote")

    return RetryingCustodyMachine


def pipelined(base: Machine) -> Machine:
    """`base`, and workers take and release in pipelines."""

    class PrefetchingCustodyMachine(base):  # type: ignore[valid-type, misc]
        """... and a process's workers also take, or release, in one pipeline
        (`taskcustody.core.prefetch`), with a reply lost at any slot."""

        def _pipelines(
            self, who: Callable[[Harness, int, int], list[int]]
        ) -> list[tuple[int, int]]:
            """Processes where at least two workers would join the pipeline."""
            return [
                (s, i)
                for s, procs in enumerate(self.h.procs)
                for i in range(len(procs))
                if len(who(self.h, s, i)) >= 2
            ]

        def _pipelined(
            self,
            data: st.DataObject,
            who: Callable[[Harness, int, int], list[int]],
            step: Callable[[Harness, int, int, int | None], None],
            needs_tasks: bool,
            *,
            may_lose: bool = True,
        ) -> None:
            options = self._pipelines(who)
            s, i = options[data.draw(st.integers(0, len(options) - 1), label="which process")]
            slots = len(who(self.h, s, i))
            positions = pipelines.lost_positions(self.h, slots) if may_lose else []
            if needs_tasks and len(self.h.state.queue) < slots:
                positions = []  # see `prefetching_take`
            lost: int | None = None
            if positions:
                lose = data.draw(st.booleans(), label="a reply is lost")
                lost = data.draw(st.sampled_from(positions), label="at slot") if lose else None
            self.failed = True
            step(self.h, s, i, lost)
            self.failed = False

        @precondition(lambda self: self._pipelines(pipelines.takers))
        @rule(data=st.data())
        def prefetching_take(self, data: st.DataObject) -> None:
            self._pipelined(data, pipelines.takers, pipelines.prefetching_take, True)

        @precondition(
            lambda self: self._pipelines(pipelines.holders) or self._pipelines(pipelines.takers)
        )
        @rule(data=st.data())
        def prefetching_release(self, data: st.DataObject) -> None:
            """A pipelined release. Like a single release, its window (two or more workers of a
            process holding tasks) is short: when no process is in it, one first takes in a
            pipeline (no reply lost), checked, then releases."""
            if not self._pipelines(pipelines.holders):
                self._pipelined(
                    data, pipelines.takers, pipelines.prefetching_take, True, may_lose=False
                )
                self.h.check()
                if not self._pipelines(pipelines.holders):
                    return
            self._pipelined(data, pipelines.holders, pipelines.prefetching_release, False)

    return PrefetchingCustodyMachine
