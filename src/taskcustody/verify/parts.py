"""The parts of a run, each turned into a `Part`: the model check, the stateful conformance run's
verdict, the production loops and the fault coverage."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import redis
from taskcustody_model import Progress, check

from ..core.keys import QueueKeys
from .budget import Budget, BudgetSpent
from .fault_coverage import REFERENCE, Coverage, judge, required_kinds
from .machine import RunStats, default_bounds
from .options import Options, model_bounds, with_refusals
from .refusal_aiming import judge as judge_refusals
from .refusal_aiming import minimum_for as refusal_minimum
from .result import FAILED, PARTIAL, PASSED, SKIPPED, Failure, Part, Result
from .run_redis import cleanup
from .stateful_run import run_stateful


def model_part(
    options: Options,
    result: Result,
    budget: Budget,
    on_model: Callable[[Progress], None] | None,
    on_phase: Callable[[str], None] | None,
) -> None:
    name = "model check"
    if budget.spent():
        result.parts.append(Part(name, SKIPPED, message=budget.reason()))
        return
    if on_phase:
        on_phase("model check")
    last: list[Progress] = []

    def progress(p: Progress) -> None:
        last[:] = [p]
        if on_model:
            on_model(p)
        budget.check()  # between two reports: the search holds nothing outside this process

    t = time.perf_counter()
    bounds = model_bounds(options)
    try:
        # With a budget, a report every 512 states (checked against the budget's own clock).
        result.model = check(
            bounds,
            options.variant,
            progress=progress,
            progress_every=0.0 if budget.limited else 2.0,
        )
    except BudgetSpent:
        result.model_seconds = time.perf_counter() - t
        covered = (
            f"{last[0].distinct_states:,} states, depth {last[0].depth}"
            if last
            else "no states reported"
        )
        result.parts.append(
            Part(
                name,
                SKIPPED,
                result.model_seconds,
                covered,
                f"stopped by {budget.label()} after {covered}: not a complete check",
            )
        )
        return
    result.model_seconds = time.perf_counter() - t
    m = result.model
    covered = f"{m.distinct_states:,} states, depth {m.depth}"
    if m.ok:
        result.parts.append(Part(name, PASSED, result.model_seconds, covered))
    else:
        message = (
            f"{m.property}: {m.violation.message}" if m.violation is not None else f"{m.property}"
        )
        result.parts.append(Part(name, FAILED, result.model_seconds, covered, message))


def stateful_part(options: Options, result: Result, stopped: bool) -> Part:
    s = result.stats
    # Hypothesis may run a few more examples than asked for (overruns, replays): both are said.
    covered = f"{s.examples:,} examples run ({options.examples:,} asked for), {s.steps:,} steps"
    if result.failure is not None:
        f = result.failure
        return Part(
            options.part_name, FAILED, result.stateful_seconds, covered, f"{f.kind}: {f.message}"
        )
    if stopped:
        return Part(
            options.part_name,
            PARTIAL,
            result.stateful_seconds,
            covered,
            "stopped by the time budget between two examples; nothing failed in what was covered",
        )
    if with_refusals(options):
        # The refusal part: each kind of attempt the model refuses made at least
        # `refusal_aiming.MINIMUM` times over its examples (fewer in a smaller run).
        result.refusal_coverage = cov = judge_refusals(
            s.refusals, minimum=refusal_minimum(options.examples)
        )
        if not cov.ok:
            return Part(options.part_name, FAILED, result.stateful_seconds, covered, cov.summary())
    return Part(options.part_name, PASSED, result.stateful_seconds, covered)


#: The part that drives the production loops from the model: the worker's (`Worker.run`), the
#: prefetching worker's (`PrefetchingWorker.run`) and the server's background thread
#: (`Server._background`), each in a machine of its own, and its examples per machine (at most
#: the run's), and steps per example (at most the run's; None: the run's). The server's machine
#: runs fewer, shorter examples: its rule is enabled in almost every state and each run of the
#: background thread is at least `server_loop.MIN_BEATS` beats, each checked, so that 10
#: examples of 20 steps drive it dozens of times; a thread that stops sweeping is caught by any
#: one of them.
LOOPS_PART = "production loops"
LOOP_EXAMPLES = 30
SERVER_LOOP_EXAMPLES = 10
SERVER_LOOP_STEPS = 20
#: (loop kind, examples, steps) in the order the part runs them.
LOOP_KINDS: tuple[tuple[str, int, int | None], ...] = (
    ("worker", LOOP_EXAMPLES, None),
    ("prefetch", LOOP_EXAMPLES, None),
    ("server", SERVER_LOOP_EXAMPLES, SERVER_LOOP_STEPS),
)


def loops_part(
    options: Options,
    result: Result,
    make_client: Callable[[], redis.Redis],
    keys: QueueKeys,
    fake: bool,
    budget: Budget,
) -> Part:
    """The production loops (verify/loops.py, verify/prefetch_loop.py, verify/server_loop.py):
    the machines run the worker's own loop, the prefetching worker's and the server's background
    thread, and check that every step they take is
    one the model allows. Its failure, if the stateful part found none, is the run's
    counterexample."""
    if budget.spent():
        return Part(LOOPS_PART, SKIPPED, message=budget.reason())
    started = time.perf_counter()
    stats = RunStats()
    failure: Failure | None = None
    stopped = False
    for kind, examples, steps in LOOP_KINDS:
        loop_options = dataclasses.replace(
            options,
            examples=min(options.examples, examples),
            steps=min(options.steps, steps or options.steps),
        )
        try:
            failure, stopped = run_stateful(
                loop_options,
                make_client,
                keys,
                stats,
                real=not fake,
                budget=budget,
                drive_loops=True,
                loop_kind=kind,
            )
        finally:
            if not fake:
                cleanup(make_client, keys)
        if failure is not None or stopped:
            break
    seconds = time.perf_counter() - started
    covered = (
        f"{stats.examples:,} examples run, {stats.faults['loop-commands']:,} commands "
        f"of the worker's loop checked, {stats.faults['dropped-reply:loop']:,} of their "
        f"replies lost, {stats.faults['prefetch-loop-writes']:,} writes of the "
        f"prefetching worker's loop checked ({stats.faults['prefetch-loop-commands']:,} "
        f"commands, {stats.faults['dropped-reply:prefetch-loop']:,} replies lost), "
        f"{stats.faults['server-loop-beats']:,} beats of the server's "
        f"background thread checked ({stats.faults['server-loop-sweeps']:,} sweeps), "
        f"{stats.faults['sweeps-sparing-fresh']:,} sweeps that had to spare a fresh "
        f"registration"
    )
    if failure is not None:
        if result.failure is None:
            result.failure = failure
        return Part(LOOPS_PART, FAILED, seconds, covered, f"{failure.kind}: {failure.message}")
    if stopped:
        return Part(
            LOOPS_PART,
            PARTIAL,
            seconds,
            covered,
            "stopped by the time budget between two examples; nothing failed in what was covered",
        )
    return Part(LOOPS_PART, PASSED, seconds, covered)


#: The part that aims at every fault kind (`aiming.with_aimed_faults`, with
#: `stateful_run.AIMING_RULES` aiming rules) and gates on how often each fired
#: (`fault_coverage.judge`); its examples and steps.
FAULT_COVERAGE_PART = "fault coverage"
COVERAGE_EXAMPLES = 100
COVERAGE_STEPS = 30
#: its bounds: the stateful run's default with one more fault per example (an example's set-up
#: and recovery are most of its time): with 3 faults the rarest kinds fired right at the minimum.
COVERAGE_BOUNDS = default_bounds(False)._replace(faults=4, tasks=4)
#: Kinds that the part's examples leave short are aimed at again, alone, in this many more
#: examples asked for (Hypothesis runs a few more); only a kind still short then fails the
#: gate. Why: the counts follow the seed's draws, and a change of the machine's behaviour (a rule
#: added, renamed or drawing otherwise) moves them. The gate is there to catch a kind that cannot
#: fire, not to depend on which examples one seed happens to draw (a kind that fires rarely even
#: when aimed at alone can pass so).
AIMED_AGAIN_EXAMPLES = 30


def run_fault_coverage(
    options: Options,
    make_client: Callable[[], redis.Redis],
    keys: QueueKeys,
    stats: RunStats,
    *,
    real: bool,
    budget: Budget | None = None,
    kinds: Sequence[str] | None = None,
    aimed_again_examples: int = AIMED_AGAIN_EXAMPLES,
) -> tuple[Failure | None, bool, Coverage]:
    """The fault-coverage run: the plain machine (the default bounds) with the aiming rules,
    its failure (None: every property held), whether the budget ended it early, and the gate's
    verdict on its counts. `kinds`: the kinds required (None: `required_kinds` of the bounds).
    Kinds its examples leave short are aimed at again, alone, in `aimed_again_examples` more
    asked for (not once the budget is spent). `stopped` with a verdict: the run aimed again was
    cut short, and the verdict says what was short then."""
    bounds = options.bounds or COVERAGE_BOUNDS
    required = tuple(kinds) if kinds is not None else required_kinds(bounds)
    cov_options = dataclasses.replace(
        options,
        examples=options.coverage_examples or COVERAGE_EXAMPLES,
        steps=COVERAGE_STEPS,
        prefetch=False,
        bounds=bounds,
    )
    failure, stopped = run_stateful(
        cov_options, make_client, keys, stats, real=real, budget=budget, aim_at=required
    )
    cov = judge(stats.faults, required)
    short = cov.short_kinds()
    if (
        failure is None
        and not stopped
        and short
        and aimed_again_examples > 0
        and (budget is None or not budget.spent())
    ):
        # The lost replies' ratio stays judged against the take's lost replies of the examples
        # above: aimed at again, the take's would pull the others under it.
        reference = stats.faults.get(REFERENCE, 0)
        again = dataclasses.replace(cov_options, examples=aimed_again_examples)
        failure, stopped = run_stateful(
            again, make_client, keys, stats, real=real, budget=budget, aim_at=short
        )
        cov = judge(stats.faults, required, reference=reference)
        cov.aimed_again = short
    return failure, stopped, cov


def fault_coverage_part(
    options: Options,
    result: Result,
    make_client: Callable[[], redis.Redis],
    keys: QueueKeys,
    fake: bool,
    budget: Budget,
) -> Part:
    """Every fault kind fired at least `fault_coverage.MINIMUM` times (fault_coverage.py). Its
    failure, if no other part found one, is the run's counterexample."""
    if budget.spent():
        return Part(FAULT_COVERAGE_PART, SKIPPED, message=budget.reason())
    started = time.perf_counter()
    stats = RunStats()
    try:
        failure, stopped, cov = run_fault_coverage(
            options, make_client, keys, stats, real=not fake, budget=budget
        )
    finally:
        if not fake:
            cleanup(make_client, keys)
    seconds = time.perf_counter() - started
    covered = (
        f"{stats.examples:,} examples run, {stats.steps:,} steps, "
        f"{sum(cov.counts.values()):,} faults of {len(cov.counts)} kinds"
    )
    if failure is not None:
        if result.failure is None:
            result.failure = failure
        return Part(
            FAULT_COVERAGE_PART, FAILED, seconds, covered, f"{failure.kind}: {failure.message}"
        )
    if stopped:
        short = (
            f" (short when it stopped: {', '.join(cov.short_kinds())})" if cov.short_kinds() else ""
        )
        return Part(
            FAULT_COVERAGE_PART,
            PARTIAL,
            seconds,
            covered,
            "stopped by the time budget between two examples; the minimums are not "
            f"judged on a partial run{short}",
        )
    result.coverage = cov
    if cov.ok:
        return Part(FAULT_COVERAGE_PART, PASSED, seconds, covered, cov.aimed_again_line())
    return Part(FAULT_COVERAGE_PART, FAILED, seconds, covered, cov.summary())
