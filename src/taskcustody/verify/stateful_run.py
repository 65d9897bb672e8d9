"""One stateful run: the machine built for the options (`machine.build_machine`, with the aiming
rules a part asks for), run from its seed (seeding.py) within the time budget, its failure
turned into the counterexample."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis
from hypothesis import HealthCheck, Phase, settings
from hypothesis.reporting import with_reporter
from hypothesis.stateful import RuleBasedStateMachine

from ..core.keys import QueueKeys
from .aiming import with_aimed_faults, with_drain_aimed
from .budget import Budget, BudgetSpent
from .deployment import DeploymentError, deployment_error, describe
from .designs import BY_NAME
from .harness import Mismatch
from .machine import RunStats, build_machine
from .options import Options, design_stateful_bounds, run_settings, with_refusals
from .result import Failure
from .seeding import DEFAULT_SEED, no_local_constants, seeded_test, shrink_budget

#: How many aiming rules a run that aims at fault kinds adds (the fault-coverage part's).
AIMING_RULES = 8


class ProgressStats(RunStats):
    """RunStats that reports after every example."""

    def __init__(self, report: Callable[[RunStats], None] | None) -> None:
        super().__init__()
        self._report = report

    def add(self, h: Any) -> None:
        super().add(h)
        if self._report is not None:
            self._report(self)


def _budgeted(machine: type[RuleBasedStateMachine], budget: Budget) -> Any:
    """`machine`, ended between two examples once `budget` is spent. Never once an example has
    failed: Hypothesis is then shrinking it, and the counterexample is the finding (shrinking has
    a budget of its own, `shrink_seconds`)."""
    base: Any = machine
    seen = {"failure": False}

    class Budgeted(base):  # type: ignore[misc]
        def __init__(self) -> None:
            if not seen["failure"]:
                budget.check()
            super().__init__()

        def teardown(self) -> None:
            ended_clean = False
            try:
                super().teardown()
                ended_clean = not getattr(self, "failed", False)
            finally:
                if not ended_clean:
                    seen["failure"] = True

    Budgeted.__name__ = machine.__name__
    return Budgeted


def run_stateful(
    options: Options,
    make_client: Callable[[], redis.Redis],
    keys: QueueKeys,
    stats: RunStats,
    *,
    real: bool,
    budget: Budget | None = None,
    drive_loops: bool = False,
    loop_kind: str = "worker",
    aim_at: Sequence[str] = (),
) -> tuple[Failure | None, bool]:
    """The stateful run: its failure (None: none) and whether the budget ended it early.
    `drive_loops`: the machine that also runs the worker's production loop (with its own
    bounds); `loop_kind`: which loop it runs (`build_machine`). `aim_at`: the plain machine
    with rules that aim at these fault kinds (the
    fault-coverage part)."""
    budget = budget or Budget()
    bounds = None if drive_loops else options.bounds or design_stateful_bounds(options.variant)
    machine = build_machine(
        make_client,
        bounds=bounds,
        implementation=options.variant,
        real_redis=real,
        stats=stats,
        keys=keys,
        prefetching=options.prefetch,
        asyncio=options.asyncio,
        flush_scripts=options.redis_url is None or options.embedded,
        settings=run_settings(options.settings),
        drive_loops=drive_loops,
        loop_kind=loop_kind,
        # The real implementation is also attempted what the model refuses
        # (`refusing.with_refusals`); not the broken designs, whose pinned
        # runs would draw other examples with one more rule.
        refusals=with_refusals(options) and not drive_loops and not aim_at,
    )
    if aim_at:
        machine = with_aimed_faults(machine, aim_at, AIMING_RULES)
    design = BY_NAME.get(options.variant)
    if (
        design is not None
        and design.stateful is not None
        and design.stateful.aim_at_drains
        and not drive_loops
        and not aim_at
    ):
        machine = with_drain_aimed(machine)
    if budget.limited:
        machine = _budgeted(machine, budget)
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if options.shrink else [])
    the_settings = settings(
        max_examples=options.examples,
        stateful_step_count=options.steps,
        derandomize=False,  # an explicit seed (seeding.py)
        database=None,
        deadline=None,
        phases=phases,
        report_multiple_bugs=False,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
    )
    test = seeded_test(
        machine, the_settings, DEFAULT_SEED if options.seed is None else options.seed
    )
    printed: list[str] = []

    def reporter(value: object) -> None:
        printed.append(str(value))

    shrink_seconds = min(options.shrink_seconds, max(1.0, budget.remaining()))
    try:
        with shrink_budget(shrink_seconds), no_local_constants(), with_reporter(reporter):
            test()
    except BudgetSpent:
        return None, True
    except Exception as exc:  # the finding: a property or conformance failure, or a crash
        cause = deployment_error(exc)
        if cause is not None:
            # Not a finding: the deployment failed the run (deployment.py).
            raise DeploymentError(
                f"the run was stopped by the deployment, not by the protocol: {describe(cause)}"
            ) from cause
        kind = exc.kind if isinstance(exc, Mismatch) else type(exc).__name__
        message = exc.message if isinstance(exc, Mismatch) else str(exc)
        notes = [str(n) for n in getattr(exc, "__notes__", [])]
        return Failure(
            kind,
            message,
            list(stats.last_steps),
            "\n".join(printed + notes),
            dict(stats.last_tallies),
        ), False
    return None, False
