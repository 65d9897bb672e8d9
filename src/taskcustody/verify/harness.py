"""The conformance machine's core: the model drives the real implementation, step by step.

One `Harness` holds a model state (`taskcustody_model`) and a real deployment (servers and workers
of `taskcustody`, on one Redis, all on one `ManualClock`). It is made of two parts, one job each:

- stepping (`stepping.Stepping`): set-up, the model's actions performed on the implementation and
  on the model, the faults they carry, and the recovery at the end of a run -- everything that
  changes Redis;
- observation (`observation.Observation`): reading Redis back into the model's terms, the checks
  (`check`, `check_eventual`: the real state equals the model's, every property holds on both),
  and the tallies of a run.

This module builds one run from those parts (its clients, clock, fault injector and model state)
and closes it; it also names the harness's public API in one place.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable

import redis
from taskcustody_model import Bounds, Config, State, initial_state, variant

from ..core.clock import ManualClock
from ..core.keys import QueueKeys
from ..core.settings import Settings
from . import faults
from .observation import TICK, Mismatch, ProcSlot, StepRecord, WorkerSlot, diff
from .stepping import (
    VERIFY_SETTINGS,
    Interleave,
    ServerFactory,
    Stepping,
    actor_of,
    default_server,
)

__all__ = [
    "TICK",
    "VERIFY_SETTINGS",
    "Harness",
    "Interleave",
    "Mismatch",
    "ProcSlot",
    "ServerFactory",
    "StepRecord",
    "WorkerSlot",
    "actor_of",
    "default_server",
    "diff",
]


class Harness(Stepping):
    """One conformance run: the model and the real deployment it drives (`setup`, `step`,
    `recover`), read back and judged after every step (`check`, `check_eventual`, `tallies`)."""

    def __init__(
        self,
        make_client: Callable[[], redis.Redis],
        bounds: Bounds | None = None,
        *,
        server_factory: ServerFactory = default_server,
        settings: Settings = VERIFY_SETTINGS,
        keys: QueueKeys | None = None,
        real_redis: bool = False,
        flush_scripts: bool = True,
    ) -> None:
        self.bounds = bounds or Bounds(tasks=3, servers=2, workers=2, faults=3)
        # A Redis wipe flushes the script cache too, unless the server is somebody else's
        # (`verify --redis-url`): there it only deletes this run's keys.
        self.flush_scripts = flush_scripts
        # The model drains per move (`drain_step`), whatever its default: `_pass` walks a pass
        # move by move, to drop the k-th move's reply and to interleave worker steps between
        # moves. Between two harness steps no pass is in progress, so nothing else changes.
        self.config = Config(self.bounds._replace(drain_steps=True), variant("correct"))
        self.make_client = make_client
        self.server_factory = server_factory
        # Poison-pill detection as the model's bounds have it.
        self.settings = dataclasses.replace(settings, max_recoveries=self.bounds.max_recoveries)
        if self.bounds.handler_failures:
            # A failed handler's retry waits in the scheduled set (the model's `retry`), and the
            # model has no attempt limit: every failure is a fault, so the budget bounds them.
            self.settings = dataclasses.replace(
                self.settings,
                retry_backoff=TICK,
                retry_backoff_max=8 * TICK,
                max_attempts=self.bounds.faults + 2,
            )
        if self.bounds.registration_ages:
            # The model's registrations age by ticks (`Bounds.registration_ages`): a grace of one
            # tick, so that the collection forgets exactly the registrations the model calls old
            # (a registration's score is the clock's time, which moves a tick at a time).
            self.settings = dataclasses.replace(self.settings, registry_grace=TICK)
        self.keys = keys or QueueKeys("verify", prefix="tcv")
        self.real_redis = real_redis
        self.clock = ManualClock(start=1_000.0)
        self.injector = faults.FaultInjector()
        self.admin = make_client()  # reads state back; never faulted
        self.state: State = initial_state(self.bounds)
        self.procs: list[list[ProcSlot]] = [[] for _ in range(self.bounds.servers)]
        # real incarnation -> model incarnation, per server
        self.names: list[dict[int, int]] = [{} for _ in range(self.bounds.servers)]
        self.steps: list[StepRecord] = []
        self.counts: Counter[str] = Counter()  # faults by kind, and other events
        self.refusals: Counter[str] = Counter()  # refused attempts by kind (`Stepping.attempt`)
        self.enqueued = 0
        self.recovered = 0  # tasks moved back to the queue by recovery (model-counted)
        self.steps_during_drains = 0  # worker steps interleaved between the moves of a drain
        self.recovering = False  # in `recover`: its steps are marked so in the step records
        self.seconds = 0.0
        # Ghost records, kept outside Redis (a wipe cannot touch them): per task, enqueued /
        # waiting / wiped, and the commits read back before each wipe.
        self.status = list(self.state.status)
        self.commits_before_wipes: Counter[int] = Counter()
        self.scripts_flushed = False

    def close(self) -> None:
        """Closes every client of the run: the workers', the processes' and the admin one."""
        for procs in self.procs:
            for slot in procs:
                for ws in slot.workers:
                    if ws.worker is not None:
                        ws.worker.close()
                slot.client.close()
        self.admin.close()
