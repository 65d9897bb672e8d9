"""The Hypothesis state machine: a rule for every action and fault of the model.

Each rule picks one of the model's enabled actions of its kind (which worker, which server) and
performs it through `Harness.step`; after every step `Harness.check` compares the real Redis
state with the model's and checks every property on both. At teardown faults stop, recovery and
workers run until quiescent, and the eventual properties are checked.

A recovery pass runs whole inside one rule, but not without company: after every move of a drain
the rule draws whether the list's owner (a stalled worker, judged dead and still running) takes,
records or releases right then (`Harness.step(interleave=...)`), so that a worker appends to a
list while it is drained. That is what catches a drain that loops until the list is empty.

`build_machine` returns a fresh `RuleBasedStateMachine` subclass bound to a backend (a client
factory), bounds and an implementation (the real one or a broken demonstration); pytest and
`taskcustody verify` both use it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from taskcustody_model.protocol import Action
from taskcustody_model.state import Bounds

from ..core.keys import QueueKeys
from ..core.settings import Settings
from . import loops, prefetch_loop, server_loop
from . import prefetching as pipelines
from .aiming import walked
from .broken import server_factory
from .harness import Harness, StepRecord
from .harness import Harness as _Harness
from .refusal_aiming import AIM_ORDER, walk_to_refusal

ClientFactory = Callable[[], redis.Redis]

#: 3 tasks (one of them enqueued during the run), 2 servers x 2 workers, 3 faults, Redis's own
#: faults (a wipe) among them, and poison-pill detection at its tightest (a task recovered twice
#: is dead-lettered), so that a run can reach it.
DEFAULT_BOUNDS = Bounds(tasks=3, servers=2, workers=2, faults=3, late_tasks=1, redis_faults=True,
                        max_recoveries=1)
#: The prefetching machine's: its pipelines' lost replies need the fault budget more than a wipe.
PIPELINE_BOUNDS = Bounds(tasks=3, servers=2, workers=2, faults=3)
#: The loop-driven machines' (`drive_loops`: the worker's loop, the prefetching worker's, the
#: server's background thread): the default's, without Redis's own faults (a wipe flushes the
#: script cache; the driver does not yet map a release's EVAL fallback to its lost reply), and
#: with registrations that age (`Bounds.registration_ages`; its harness's grace is one tick): a
#: take its production loop leaves pending on an empty queue (or a prefetching take pipeline's
#: slot that found it empty) spares its list as long as the registration sent with it is younger
#: than the grace, in the model and in Redis alike. So every sweep is driven.
LOOP_BOUNDS = Bounds(tasks=3, servers=2, workers=2, faults=3, late_tasks=1, max_recoveries=1,
                     registration_ages=True)
#: The retrying machine's (handlers may fail: retry delays, the scheduled set and its promotion),
#: with poison-pill detection so that a suspect's retry is scheduled too.
RETRY_BOUNDS = Bounds(tasks=3, servers=2, workers=2, faults=3, max_recoveries=1,
                      handler_failures=True)
#: The asyncio machine's (`verify --async`): the default's, with asyncio's own fault, a worker
#: step cancelled before its command is sent (verify/aio.py).
ASYNC_BOUNDS = DEFAULT_BOUNDS._replace(cancels_before_send=True)


#: The worker commands whose lost replies have rules of their own.
WORKER_COMMANDS = ("take", "take_suspect", "release", "release_and_take", "reconcile")


def default_bounds(prefetching: bool, asyncio: bool = False) -> Bounds:
    return PIPELINE_BOUNDS if prefetching else ASYNC_BOUNDS if asyncio else DEFAULT_BOUNDS


@dataclass
class RunStats:
    """Totals over every example of a run (Hypothesis's `event` counts examples, not steps)."""

    examples: int = 0
    steps: int = 0
    recovery_steps: int = 0
    seconds_in_steps: float = 0.0
    faults: Counter[str] = field(default_factory=Counter)
    #: attempts the model refuses, made and refused (`Harness.attempt`), by kind
    refusals: Counter[str] = field(default_factory=Counter)
    tallies: Counter[str] = field(default_factory=Counter)
    #: worker steps run between two moves of a drain (see the module doc)
    steps_during_drains: int = 0
    last_steps: list[StepRecord] = field(default_factory=list)
    last_error: str = ""
    #: the tallies of the last example as it stood when it ended (a failing example included)
    last_tallies: dict[str, int] = field(default_factory=dict)

    def add(self, h: Harness) -> None:
        self.examples += 1
        self.steps += len(h.steps)
        self.seconds_in_steps += h.seconds
        self.steps_during_drains += h.steps_during_drains
        self.faults.update(h.counts)
        self.refusals.update(h.refusals)
        self.last_steps = list(h.steps)


def build_machine(
    make_client: ClientFactory,
    *,
    bounds: Bounds | None = None,
    implementation: str = "correct",
    real_redis: bool = False,
    stats: RunStats | None = None,
    keys: QueueKeys | None = None,
    prefetching: bool = False,
    flush_scripts: bool = True,
    settings: Settings | None = None,
    refusals: bool = False,
    drive_loops: bool = False,
    loop: str = "correct",
    asyncio: bool = False,
    loop_kind: str = "worker",
) -> type[RuleBasedStateMachine]:
    """The machine; with `prefetching`, a subclass that also drives the prefetching worker's
    pipelines (a separate class, so that the plain machine's derandomized runs, which the
    finds-the-bug tests pin, draw exactly as before). `settings`: the harness's (None: its
    default, `harness.VERIFY_SETTINGS`). With `refusals`, a subclass with one more rule, which
    makes an attempt the model refuses (`with_refusals`). `drive_loops`: a subclass with one more
    rule, which runs a worker's production loop (`Worker.run`) with the model checking every
    command it sends (verify/loops.py); `loop` names the loop it runs (`loops.BROKEN_LOOPS`, for
    the demonstration that a broken loop is caught); `loop_kind` which production loop the rule
    runs: "worker" (`Worker.run`), "prefetch" (`PrefetchingWorker.run`, verify/prefetch_loop.py)
    or "server" (`Server._background`, verify/server_loop.py), each its own machine class.
    `asyncio`: the workers are asyncio workers
    (`aio.AsyncWorker`, stepped by verify/aio.py), with cancellations among their faults."""
    run_stats = stats if stats is not None else RunStats()
    factory = server_factory(implementation)
    the_bounds = bounds or (LOOP_BOUNDS if drive_loops else default_bounds(prefetching, asyncio))
    # The class's source text is part of the seed of its derandomized runs (Hypothesis digests
    # the machine class), and those runs are pinned (tests/stateful, the README's figures): an
    # edit of the class body, a comment included, moves every one of them
    # (test_machine_source.py says so when it happens). So the user's settings reach the harness
    # through this subclass's name, not through a new argument in the class body.
    user_settings: dict[str, Any] = {} if settings is None else {"settings": settings}

    harness_base: type[_Harness] = _Harness
    if asyncio:
        from .aio import AsyncHarness

        harness_base = AsyncHarness

    # (a class, not a partial: the machines' annotations name it)
    class Harness(harness_base):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**user_settings, **kwargs})

    class CustodyMachine(RuleBasedStateMachine):
        """The model drives the real implementation."""

        stats = run_stats

        def __init__(self) -> None:
            super().__init__()
            self.h = Harness(make_client, the_bounds, server_factory=factory,
                             real_redis=real_redis, keys=keys, flush_scripts=flush_scripts)
            self.failed = False

        @initialize()
        def setup(self) -> None:
            self.h.setup()

        # -- helpers --------------------------------------------------------------------------

        def _of(self, name: str, command: str = "") -> list[Action]:
            return [a for a in self.h.enabled()
                    if a.name == name and (not command or a.command == command)]

        def _do(self, data: st.DataObject, name: str, command: str = "", *,
                drop_at: int = 0) -> None:
            options = self._of(name, command)
            action = options[data.draw(st.integers(0, len(options) - 1), label="which")]
            variant = data.draw(st.integers(0, 5), label="variant") if action.is_fault or \
                name == "heartbeat" else 0
            interleave = _drawn_interleaving(data) if name in ("sweep", "startup_drain") \
                else None
            self._step(action, drop_at=drop_at, variant=variant, interleave=interleave)

        def _step(self, action: Action, *, drop_at: int = 0, variant: int = 0,
                  interleave: Callable[[list[Action]], Action | None] | None = None) -> None:
            self.failed = True  # until the step and its check succeed
            self.h.step(action, drop_at=drop_at, variant=variant, interleave=interleave)
            self.failed = False

        def _has(self, name: str, command: str = "") -> bool:
            return bool(self._of(name, command))

        # -- worker steps ---------------------------------------------------------------------

        @precondition(lambda self: self._has("take"))
        @rule(data=st.data())
        def take(self, data: st.DataObject) -> None:
            self._do(data, "take")

        @precondition(lambda self: self._has("take_suspect"))
        @rule(data=st.data())
        def take_suspect(self, data: st.DataObject) -> None:
            """A worker whose process holds no suspect takes one (poison-pill suspects run
            alone)."""
            self._do(data, "take_suspect")

        @precondition(lambda self: self._has("record"))
        @rule(data=st.data())
        def record(self, data: st.DataObject) -> None:
            self._do(data, "record")

        @precondition(lambda self: self._has("release"))
        @rule(data=st.data())
        def release(self, data: st.DataObject) -> None:
            self._release(data, "release")

        @precondition(lambda self: self._has("release_and_take"))
        @rule(data=st.data())
        def release_and_take(self, data: st.DataObject) -> None:
            """The busy cycle's one step: the release and the next take with its record."""
            self._release(data, "release_and_take")

        def _release(self, data: st.DataObject, name: str) -> None:
            # A release's reply is lost only while its worker holds a recorded task, a short
            # window that the fault rules rarely hit before the fault budget is spent elsewhere;
            # so a release loses its reply here too, one time in two when the budget allows.
            options = self._of(name)
            action = options[data.draw(st.integers(0, len(options) - 1), label="which")]
            lost = action._replace(name="dropped_reply", command=name)
            if lost in self.h.enabled() and data.draw(st.booleans(), label="lose"):
                variant = data.draw(st.integers(0, 5), label="variant")
                self._step(lost, variant=variant)
            else:
                self._step(action)

        @precondition(lambda self: self._has("reconcile"))
        @rule(data=st.data())
        def reconcile(self, data: st.DataObject) -> None:
            self._do(data, "reconcile")

        @precondition(lambda self: self._has("restart_worker"))
        @rule(data=st.data())
        def restart_worker(self, data: st.DataObject) -> None:
            self._do(data, "restart_worker")

        # -- server steps ---------------------------------------------------------------------

        @precondition(lambda self: self._has("claim"))
        @rule(data=st.data())
        def claim(self, data: st.DataObject) -> None:
            self._do(data, "claim")

        @precondition(lambda self: self._has("startup_drain"))
        @rule(data=st.data(), drop_at=st.integers(0, 3))
        def startup_drain(self, data: st.DataObject, drop_at: int) -> None:
            self._do(data, "startup_drain", drop_at=drop_at)

        @precondition(lambda self: self._has("heartbeat"))
        @rule(data=st.data())
        def heartbeat(self, data: st.DataObject) -> None:
            self._do(data, "heartbeat")

        @precondition(lambda self: self._has("sweep"))
        @rule(data=st.data(), drop_at=st.integers(0, 3))
        def sweep(self, data: st.DataObject, drop_at: int) -> None:
            self._do(data, "sweep", drop_at=drop_at)

        @precondition(lambda self: self._has("requeue_stuck_processing_tasks"))
        @rule(data=st.data())
        def requeue_stuck_processing_tasks(self, data: st.DataObject) -> None:
            self._do(data, "requeue_stuck_processing_tasks")

        @precondition(lambda self: self._has("enqueue"))
        @rule(data=st.data())
        def enqueue(self, data: st.DataObject) -> None:
            self._do(data, "enqueue")

        @precondition(lambda self: self._has("resume_server"))
        @rule(data=st.data())
        def resume_server(self, data: st.DataObject) -> None:
            self._do(data, "resume_server")

        @precondition(lambda self: self._has("advance_clock"))
        @rule(data=st.data())
        def advance_clock(self, data: st.DataObject) -> None:
            self._do(data, "advance_clock")

        # -- faults ---------------------------------------------------------------------------

        # One rule per command whose reply can be lost, so that each kind is drawn as often as
        # any other rule (one rule for all would rarely hit the short window of a release).
        @precondition(lambda self: self._has("dropped_reply", "take"))
        @rule(data=st.data())
        def dropped_reply_on_take(self, data: st.DataObject) -> None:
            self._do(data, "dropped_reply", "take")

        @precondition(lambda self: self._has("dropped_reply", "release")
                      or self._has("dropped_reply", "take"))
        @rule(data=st.data())
        def dropped_reply_on_release(self, data: st.DataObject) -> None:
            """A release whose reply is lost. Its window (a worker holding a recorded task, with
            fault budget left) is short, and the other fault rules spend the budget first; so
            when no worker is in it, a worker that can take first takes and records (checked
            after each step), then loses its release's reply."""
            if not self._has("dropped_reply", "release"):
                take = self._of("take")
                action = take[data.draw(st.integers(0, len(take) - 1), label="which")]
                for step in (action, action._replace(name="record")):
                    self._step(step)
                    self.h.check()
            self._do(data, "dropped_reply", "release")

        @precondition(lambda self: self._has("dropped_reply", "take_suspect"))
        @rule(data=st.data())
        def dropped_reply_on_take_suspect(self, data: st.DataObject) -> None:
            self._do(data, "dropped_reply", "take_suspect")

        @precondition(lambda self: self._has("dropped_reply", "reconcile"))
        @rule(data=st.data())
        def dropped_reply_on_reconcile(self, data: st.DataObject) -> None:
            self._do(data, "dropped_reply", "reconcile")

        @precondition(lambda self: any(a.command not in WORKER_COMMANDS
                                       for a in self._of("dropped_reply")))
        @rule(data=st.data())
        def dropped_reply_on_server_command(self, data: st.DataObject) -> None:
            options = [a for a in self._of("dropped_reply")
                       if a.command not in WORKER_COMMANDS]
            action = options[data.draw(st.integers(0, len(options) - 1), label="which")]
            self._do(data, "dropped_reply", action.command)

        @precondition(lambda self: self._has("redis_wipe"))
        @rule(data=st.data())
        def redis_wipe(self, data: st.DataObject) -> None:
            """Redis restarts empty (see `Harness._redis_wipe`)."""
            self._do(data, "redis_wipe")

        @precondition(lambda self: self._has("crash_worker"))
        @rule(data=st.data())
        def crash_worker(self, data: st.DataObject) -> None:
            self._do(data, "crash_worker")

        @precondition(lambda self: self._has("crash_server"))
        @rule(data=st.data())
        def crash_server(self, data: st.DataObject) -> None:
            self._do(data, "crash_server")

        @precondition(lambda self: self._has("stall_server"))
        @rule(data=st.data())
        def stall_server(self, data: st.DataObject) -> None:
            self._do(data, "stall_server")

        @rule()
        def nothing_happens(self) -> None:
            """Always possible (a quiescent run has no other step)."""

        # -- after every step -----------------------------------------------------------------

        @invariant()
        def real_state_matches_the_model(self) -> None:
            self.failed = True
            self.h.check()
            self.failed = False

        def teardown(self) -> None:
            try:
                if not self.failed:  # a failed step is the finding; recovery would mask it
                    run_stats.recovery_steps += self.h.recover()
                    run_stats.last_tallies = self.h.tallies()
                    run_stats.tallies.update(run_stats.last_tallies)
                else:
                    try:
                        run_stats.last_tallies = self.h.tallies()
                    except Exception:  # the state may not even map to the model's terms
                        run_stats.last_tallies = {}
            finally:
                run_stats.add(self.h)
                self.h.close()

    if drive_loops and loop_kind == "prefetch":

        class PrefetchLoopDrivenCustodyMachine(CustodyMachine):
            """... and a process's free workers run as one prefetching worker
            (`PrefetchingWorker.run`), from its start until it is stopped, between the model's
            other steps (verify/prefetch_loop.py)."""

            @precondition(lambda self: bool(prefetch_loop.drivable(self.h)))
            @rule(data=st.data())
            def prefetch_loop(self, data: st.DataObject) -> None:
                options = prefetch_loop.drivable(self.h)
                s, i, slots = options[data.draw(st.integers(0, len(options) - 1),
                                                label="which")]
                self.failed = True
                prefetch_loop.PrefetchLoopDriver(self.h, s, i, slots,
                                                 _DrawnPrefetchChoices(data), loop).run()
                self.failed = False

        return PrefetchLoopDrivenCustodyMachine

    if drive_loops and loop_kind == "server":

        class ServerLoopDrivenCustodyMachine(CustodyMachine):
            """... and a process's background thread (`Server._background`: heartbeats,
            promotions, sweeps) runs, from its start until it is stopped, between the model's
            other steps (verify/server_loop.py)."""

            @precondition(lambda self: bool(server_loop.drivable(self.h)))
            @rule(data=st.data())
            def server_loop(self, data: st.DataObject) -> None:
                options = server_loop.drivable(self.h)
                s, i = options[data.draw(st.integers(0, len(options) - 1), label="which")]
                self.failed = True
                server_loop.ServerLoopDriver(self.h, s, i, _DrawnServerChoices(data),
                                             loop).run()
                self.failed = False

        return ServerLoopDrivenCustodyMachine

    if drive_loops:

        class LoopDrivenCustodyMachine(CustodyMachine):
            """... and a worker's production loop runs, from its start until it is stopped,
            between the model's other steps (a separate class, so that the plain machine's
            derandomized runs draw exactly as before)."""

            @precondition(lambda self: bool(loops.drivable(self.h)))
            @rule(data=st.data())
            def production_loop(self, data: st.DataObject) -> None:
                options = loops.drivable(self.h)
                s, i, w = options[data.draw(st.integers(0, len(options) - 1), label="which")]
                self.failed = True
                loops.LoopDriver(self.h, s, i, w, _DrawnChoices(data), loop).run()
                self.failed = False

        return LoopDrivenCustodyMachine

    if the_bounds.handler_failures:

        class RetryingCustodyMachine(CustodyMachine):
            """... and handlers fail: the release schedules the retry (a delay), and a
            promotion moves it back when due (a separate class, like the prefetching one, so
            that the plain machine draws exactly as before)."""

            @precondition(lambda self: self._has("retry") or (
                self._has("take") and self.h.state.faults < the_bounds.faults))
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

        # (not with prefetching: its machine's source, which seeds a derandomized run, stays
        # as it was; the retrying machine drives the plain worker's release)
        return with_refusals(RetryingCustodyMachine) if refusals else RetryingCustodyMachine

    if not prefetching:
        return with_refusals(CustodyMachine) if refusals else CustodyMachine

    class PrefetchingCustodyMachine(CustodyMachine):
        """... and a process's workers also take, or release, in one pipeline
        (`taskcustody.prefetch`), with a reply lost at any slot."""

        def _pipelines(self, who: Callable[[Harness, int, int], list[int]]) -> list[
                tuple[int, int]]:
            """Processes where at least two workers would join the pipeline."""
            return [(s, i) for s, procs in enumerate(self.h.procs) for i in range(len(procs))
                    if len(who(self.h, s, i)) >= 2]

        def _pipelined(self, data: st.DataObject, who: Callable[[Harness, int, int], list[int]],
                       step: Callable[[Harness, int, int, int | None], None],
                       needs_tasks: bool, *, may_lose: bool = True) -> None:
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

        @precondition(lambda self: self._pipelines(pipelines.holders)
                      or self._pipelines(pipelines.takers))
        @rule(data=st.data())
        def prefetching_release(self, data: st.DataObject) -> None:
            """A pipelined release. Like a single release, its window (two or more workers of a
            process holding tasks) is short: when no process is in it, one first takes in a
            pipeline (no reply lost), checked, then releases."""
            if not self._pipelines(pipelines.holders):
                self._pipelined(data, pipelines.takers, pipelines.prefetching_take, True,
                                may_lose=False)
                self.h.check()
                if not self._pipelines(pipelines.holders):
                    return
            self._pipelined(data, pipelines.holders, pipelines.prefetching_release, False)

    return with_refusals(PrefetchingCustodyMachine) if refusals else PrefetchingCustodyMachine


def with_refusals(base: type[RuleBasedStateMachine]) -> type[RuleBasedStateMachine]:
    """`base` and a rule that attempts what the model refuses (issue 14, point 9): a claim of an
    id a live process holds, a heartbeat from a superseded process, a sweep's drain of a live
    list (`taskcustody_model.refused_attempts`). The implementation must refuse it
    (`Harness.attempt` raises `Mismatch("refusal", ...)` if not) and leave Redis as the model,
    unchanged, says (the invariant's check after the rule). A second rule aims at each kind not
    yet attempted in the example (verify/refusal_aiming.py): it walks, planned on the model, to
    a state where such an attempt is refused, so that every kind is attempted whatever the draws
    (a superseded process's heartbeat needs a stall, a lapsed lease, a new claim and a resume).

    A subclass, not a rule of `base`: Hypothesis draws a rule by its index, and a derandomized
    run's seed is digested from the machine class's source, so one more rule in `base` would move
    every pinned derandomized run. The runs that want refusals ask for them (`build_machine`'s
    `refusals`)."""

    class RefusingMachine(base):  # type: ignore[valid-type, misc]
        """... and attempts what the model refuses: whatever the draws reach
        (`attempt_refused`), and each kind not yet attempted in this example, walked to
        (`_aim_at_a_refusal`)."""

        @precondition(lambda self: bool(self.h.refused()))
        @rule(data=st.data())
        def attempt_refused(self, data: st.DataObject) -> None:
            options = self.h.refused()
            attempt = options[data.draw(st.integers(0, len(options) - 1), label="which attempt")]
            self.failed = True  # until the implementation refused it
            self.h.attempt(attempt)
            self.failed = False

        def _refusals_to_aim_at(self) -> list[str]:
            """The kinds not yet attempted in this example, nor found out of reach in it."""
            out_of_reach: set[str] = getattr(self, "_out_of_reach", set())
            return [k for k in AIM_ORDER if not self.h.refusals[k] and k not in out_of_reach]

        def _aim_at_a_refusal(self, data: st.DataObject) -> None:
            """Plans on the model a shortest walk to a state where an attempt of a kind not yet
            made in this example is refused (`refusal_aiming.walk_to_refusal`), performs it
            step by step on the implementation, each step checked, and makes the attempt. A
            kind with no walk within the planner's bounds is not aimed at again in this
            example."""
            for kind in self._refusals_to_aim_at():
                walk = walk_to_refusal(self.h.state, self.h.config, kind)
                if walk is not None:
                    break
                self._out_of_reach = {*getattr(self, "_out_of_reach", ()), kind}
            else:
                return
            if not walked(self, walk):
                return
            options = [a for a in self.h.refused() if a.name == kind]
            if not options:
                return
            attempt = options[data.draw(st.integers(0, len(options) - 1), label="which attempt")]
            self.failed = True  # until the implementation refused it
            self.h.attempt(attempt)
            self.failed = False

    # (copies of the aiming rule: Hypothesis draws a rule uniformly among those enabled, and
    # each copy is enabled only while a kind is left to aim at in the example)
    for n in range(REFUSAL_AIMING_RULES):
        def aim(self: Any, data: st.DataObject) -> None:
            self._aim_at_a_refusal(data)

        aim = precondition(lambda self: bool(self._refusals_to_aim_at()))(aim)
        aim.__name__ = f"aim_at_a_refusal_{n}"
        setattr(RefusingMachine, aim.__name__, rule(data=st.data())(aim))
    RefusingMachine.__name__ = f"Refusing{base.__name__}"
    return RefusingMachine


#: How many copies of the refusal-aiming rule the machine with refusals has (their weight among
#: the rules, while a kind is left to aim at in the example).
REFUSAL_AIMING_RULES = 3


class _DrawnChoices:
    """The loop driver's choices (`loops.Choices`), drawn; each shrinks to "no"."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def stop(self) -> bool:
        return self.data.draw(st.integers(0, 3), label="stop the loop") == 1

    def lose(self, action: Action) -> bool:
        return self.data.draw(st.integers(0, 2), label=f"lose the {action.command} reply") == 1

    def interleave(self, options: list[Action]) -> Action | None:
        # one time in two, nobody else steps (what it shrinks to)
        k = self.data.draw(st.integers(0, 2 * len(options) - 1), label="another actor steps")
        return options[k - len(options)] if k >= len(options) else None


class _DrawnPrefetchChoices(_DrawnChoices):
    """The prefetching-loop driver's choices (`prefetch_loop.PrefetchChoices`), drawn."""

    def lose_at(self, positions: list[int]) -> int | None:
        if not self.data.draw(st.booleans(), label="a pipeline reply is lost"):
            return None
        return self.data.draw(st.sampled_from(positions), label="at slot")


class _DrawnServerChoices(_DrawnChoices):
    """The server-loop driver's choices (`server_loop.ServerChoices`), drawn."""

    def variant(self) -> int:
        return self.data.draw(st.integers(0, 5), label="heartbeat variant")

    def drop_at(self) -> int:
        return self.data.draw(st.integers(0, 3), label="sweep drop at")


def _drawn_interleaving(data: st.DataObject) -> Callable[[list[Action]], Action | None]:
    """What a drain's owner does between two moves, drawn. 0 is "nothing" (what it shrinks to);
    anything else picks a step, so that the owner steps more often than not: catching an unbounded
    drain takes two or three steps in a row (record, release, take the task back)."""

    def choose(options: list[Action]) -> Action | None:
        k = data.draw(st.integers(0, 3 * len(options)), label="worker step during the drain")
        return options[(k - 1) % len(options)] if k else None

    return choose


def describe_steps(steps: list[StepRecord]) -> list[str]:
    return [f"{s.index}. {s.text}" for s in steps]
