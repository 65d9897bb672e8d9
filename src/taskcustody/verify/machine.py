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

from collections.abc import Callable
from typing import Any

import redis
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from taskcustody_model.protocol import Action
from taskcustody_model.state import Bounds

from ..core.keys import QueueKeys
from ..core.settings import Settings
from .broken import server_factory
from .drawn import drawn_interleaving
from .harness import Harness, StepRecord
from .machine_kinds import (
    loop_driven,
    pipelined,
    prefetch_loop_driven,
    retrying,
    server_loop_driven,
)
from .refusing import REFUSAL_AIMING_RULES, with_refusals
from .stats import RunStats

__all__ = [
    "ASYNC_BOUNDS",
    "DEFAULT_BOUNDS",
    "LOOP_BOUNDS",
    "PIPELINE_BOUNDS",
    "REFUSAL_AIMING_RULES",
    "RETRY_BOUNDS",
    "WORKER_COMMANDS",
    "ClientFactory",
    "RunStats",
    "build_machine",
    "default_bounds",
    "describe_steps",
    "with_refusals",
]

ClientFactory = Callable[[], redis.Redis]

#: 3 tasks (one of them enqueued during the run), 2 servers x 2 workers, 3 faults, Redis's own
#: faults (a wipe) among them, and poison-pill detection at its tightest (a task recovered twice
#: is dead-lettered), so that a run can reach it.
DEFAULT_BOUNDS = Bounds(
    tasks=3, servers=2, workers=2, faults=3, late_tasks=1, redis_faults=True, max_recoveries=1
)
#: The prefetching machine's: its pipelines' lost replies need the fault budget more than a wipe.
PIPELINE_BOUNDS = Bounds(tasks=3, servers=2, workers=2, faults=3)
#: The loop-driven machines' (`drive_loops`: the worker's loop, the prefetching worker's, the
#: server's background thread): the default's, without Redis's own faults (a wipe flushes the
#: script cache; the driver does not yet map a release's EVAL fallback to its lost reply), and
#: with registrations that age (`Bounds.registration_ages`; its harness's grace is one tick): a
#: take its production loop leaves pending on an empty queue (or a prefetching take pipeline's
#: slot that found it empty) spares its list as long as the registration sent with it is younger
#: than the grace, in the model and in Redis alike. So every sweep is driven.
LOOP_BOUNDS = Bounds(
    tasks=3, servers=2, workers=2, faults=3, late_tasks=1, max_recoveries=1, registration_ages=True
)
#: The retrying machine's (handlers may fail: retry delays, the scheduled set and its promotion),
#: with poison-pill detection so that a suspect's retry is scheduled too.
RETRY_BOUNDS = Bounds(
    tasks=3, servers=2, workers=2, faults=3, max_recoveries=1, handler_failures=True
)
#: The asyncio machine's (`verify --async`): the default's, with asyncio's own fault, a worker
#: step cancelled before its command is sent (verify/aio.py).
ASYNC_BOUNDS = DEFAULT_BOUNDS._replace(cancels_before_send=True)


#: The worker commands whose lost replies have rules of their own.
WORKER_COMMANDS = ("take", "take_suspect", "release", "release_and_take", "reconcile")


def default_bounds(prefetching: bool, asyncio: bool = False) -> Bounds:
    return PIPELINE_BOUNDS if prefetching else ASYNC_BOUNDS if asyncio else DEFAULT_BOUNDS


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
    pipelines (machine_kinds.py says why the kinds are subclasses). `settings`: the harness's
    (None: its default, `harness.VERIFY_SETTINGS`). With `refusals`, a subclass with one more
    rule, which makes an attempt the model refuses (`with_refusals`). `drive_loops`: a subclass
    with one more rule, which runs a worker's production loop (`Worker.run`) with the model
    checking every command it sends (verify/loops.py); `loop` names the loop it runs
    (`loops.BROKEN_LOOPS`, for the demonstration that a broken loop is caught); `loop_kind`
    which production loop the rule runs: "worker" (`Worker.run`), "prefetch"
    (`PrefetchingWorker.run`, verify/prefetch_loop.py) or "server" (`Server._background`,
    verify/server_loop.py), each its own machine class. `asyncio`: the workers are asyncio
    workers (`aio.AsyncWorker`, stepped by verify/aio.py), with cancellations among their
    faults."""
    run_stats = stats if stats is not None else RunStats()
    factory = server_factory(implementation)
    the_bounds = bounds or (LOOP_BOUNDS if drive_loops else default_bounds(prefetching, asyncio))
    user_settings: dict[str, Any] = {} if settings is None else {"settings": settings}
    harness_class: type[Harness] = Harness
    if asyncio:
        from .aio import AsyncHarness

        harness_class = AsyncHarness

    class CustodyMachine(RuleBasedStateMachine):
        """The model drives the real implementation."""

        stats = run_stats

        def __init__(self) -> None:
            super().__init__()
            self.h = harness_class(
                make_client,
                the_bounds,
                server_factory=factory,
                real_redis=real_redis,
                keys=keys,
                flush_scripts=flush_scripts,
                **user_settings,
            )
            self.failed = False

        @initialize()
        def setup(self) -> None:
            self.h.setup()

        # -- helpers --------------------------------------------------------------------------

        def _of(self, name: str, command: str = "") -> list[Action]:
            return [
                a
                for a in self.h.enabled()
                if a.name == name and (not command or a.command == command)
            ]

        def _do(
            self, data: st.DataObject, name: str, command: str = "", *, drop_at: int = 0
        ) -> None:
            options = self._of(name, command)
            action = options[data.draw(st.integers(0, len(options) - 1), label="which")]
            variant = (
                data.draw(st.integers(0, 5), label="variant")
                if action.is_fault or name == "heartbeat"
                else 0
            )
            interleave = drawn_interleaving(data) if name in ("sweep", "startup_drain") else None
            self._step(action, drop_at=drop_at, variant=variant, interleave=interleave)

        def _step(
            self,
            action: Action,
            *,
            drop_at: int = 0,
            variant: int = 0,
            interleave: Callable[[list[Action]], Action | None] | None = None,
        ) -> None:
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

        @precondition(
            lambda self: self._has("dropped_reply", "release") or self._has("dropped_reply", "take")
        )
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

        @precondition(
            lambda self: any(a.command not in WORKER_COMMANDS for a in self._of("dropped_reply"))
        )
        @rule(data=st.data())
        def dropped_reply_on_server_command(self, data: st.DataObject) -> None:
            options = [a for a in self._of("dropped_reply") if a.command not in WORKER_COMMANDS]
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

    machine: type[RuleBasedStateMachine] = CustodyMachine
    if drive_loops:
        driven = {"prefetch": prefetch_loop_driven, "server": server_loop_driven}
        return driven.get(loop_kind, loop_driven)(machine, loop)
    if the_bounds.handler_failures:
        machine = retrying(machine, the_bounds)  # (it drives the plain worker's release)
    elif prefetching:
        machine = pipelined(machine)
    return with_refusals(machine) if refusals else machine


def describe_steps(steps: list[StepRecord]) -> list[str]:
    return [f"{s.index}. {s.text}" for s in steps]
