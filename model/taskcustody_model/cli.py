"""``taskcustody model-check``: explore the model within bounds and check every property."""

from __future__ import annotations

import sys

import click

from .checker import Progress, check
from .simulate import SimulationProgress
from .simulate import simulate as simulate_walks
from .state import Bounds
from .trace import render_simulation_stats, render_stats, render_trace
from .variants import VARIANTS, variant_listing


def _progress(p: Progress) -> None:
    if p.phase == "again":
        click.echo(f"  {p.broken} broke after {p.distinct_states} distinct states; searching "
                   "again with every state stored and no reduction, for a shortest trace", err=True)
        return
    click.echo(
        f"  {p.distinct_states} distinct states, {p.states_generated} generated, depth "
        f"{p.depth}, {p.queued} queued, {p.seconds:.0f}s",
        err=True,
    )


def _sim_progress(p: SimulationProgress) -> None:
    click.echo(
        f"  {p.walks} walks, {p.steps} steps, {p.distinct_states} distinct states, deepest "
        f"{p.max_depth}, {p.seconds:.0f}s",
        err=True,
    )


@click.command(name="model-check")
@click.option("--tasks", type=click.IntRange(1, 6), default=3, show_default=True,
              help="tasks the producer enqueues (the state space grows fastest with this)")
@click.option("--servers", type=click.IntRange(1, 4), default=2, show_default=True,
              help="server ids, each running --workers workers")
@click.option("--workers", type=click.IntRange(1, 4), default=2, show_default=True,
              help="workers per server")
@click.option("--faults", type=click.IntRange(0, 10), default=2, show_default=True,
              help="budget of injected faults (all kinds count)")
@click.option("--processes-per-server", type=click.IntRange(1, 3), default=1, show_default=True,
              help="processes sharing one server id at once (a stalled one and its successor)")
@click.option("--drain-steps/--atomic-drains", default=None,
              help="drain one task per step (default: only for unbounded-drain)")
@click.option("--late-tasks", type=click.IntRange(0, 6), default=0, show_default=True,
              help="of the tasks, how many the producer enqueues during the run (not at start)")
@click.option("--redis-faults", is_flag=True,
              help="Redis's own faults too: redis_wipe (Redis restarts empty)")
@click.option("--takes-outwait-grace", is_flag=True,
              help="break the registry GC's assumption: a pending take may outlast the grace")
@click.option("--max-recoveries", type=click.IntRange(0, 5), default=None,
              help="poison-pill detection: dead-letter a task recovered more often than this "
                   "(default: recoveries not counted)")
@click.option("--handler-failures", is_flag=True,
              help="a handler may fail (counts against --faults): its retry is scheduled and "
                   "promoted to the queue when due")
@click.option("--variant", default="correct", show_default=True,
              help="design to check; 'list' names them")
@click.option("--full-trace", is_flag=True, help="print the state after every step")
@click.option("--no-eventual", is_flag=True, help="skip the eventual-recovery check")
@click.option("--simulate", is_flag=True,
              help="random walks instead of the exhaustive search (for bounds beyond it): every "
                   "property on every state; eventual recovery by a fault-free continuation at "
                   "each walk's end")
@click.option("--seconds", type=click.FloatRange(min=0, min_open=True), default=None,
              help="with --simulate: stop after this long (default 60 unless --steps is given)")
@click.option("--steps", "max_steps", type=click.IntRange(min=1), default=None,
              help="with --simulate: stop after this many steps")
@click.option("--seed", type=int, default=0, show_default=True, help="with --simulate")
@click.option("--reduce/--no-reduce", default=True, show_default=True,
              help="the partial-order reduction once the fault budget is spent (same verdict, "
                   "fewer states; a counterexample is searched again without it, for a shortest "
                   "one)")
@click.option("--fingerprints", is_flag=True,
              help="store a 64-bit fingerprint of each state met instead of the state (hash "
                   "compaction): about 1 KB a state instead of 3-4, for bounds that do not fit in "
                   "memory; prints the estimated chance that two fingerprints collided; a "
                   "counterexample is searched again with states stored (up to its depth); not "
                   "with --jobs")
@click.option("--jobs", type=click.IntRange(1, 64), default=1, show_default=True,
              help="search in this many processes (a violation is searched again in one, for "
                   "its shortest trace)")
def model_check(
    tasks: int, servers: int, workers: int, faults: int, processes_per_server: int,
    drain_steps: bool | None, late_tasks: int, redis_faults: bool, takes_outwait_grace: bool,
    max_recoveries: int | None, handler_failures: bool, variant: str, full_trace: bool,
    no_eventual: bool, simulate: bool, seconds: float | None, max_steps: int | None, seed: int,
    reduce: bool, fingerprints: bool, jobs: int,
) -> None:
    """Exhaustively check the custody protocol model, or with --simulate walk it at random
    (exit 0: all properties hold within the bounds, or on every walk; 1: a counterexample is
    printed; 2: bad arguments)."""
    if variant == "list":
        click.echo(variant_listing())
        return
    if variant not in VARIANTS:
        raise click.BadParameter(
            f"unknown variant {variant!r} (known: {', '.join(VARIANTS)})", param_hint="--variant"
        )
    if late_tasks > tasks:
        raise click.BadParameter("cannot exceed --tasks", param_hint="--late-tasks")
    bounds = Bounds(
        tasks, servers, workers, faults, processes_per_server, drain_steps,
        late_tasks=late_tasks, redis_faults=redis_faults,
        take_wait_bounded=not takes_outwait_grace, max_recoveries=max_recoveries,
        handler_failures=handler_failures,
    )
    if not simulate:
        if seconds is not None or max_steps is not None:
            raise click.BadParameter("only with --simulate", param_hint="--seconds/--steps")
        if fingerprints and jobs != 1:
            raise click.BadParameter("not with --jobs", param_hint="--fingerprints")
        result = check(bounds, variant, progress=_progress, eventual=not no_eventual, jobs=jobs,
                       reduce=reduce, fingerprints=fingerprints)
        click.echo(render_stats(result))
        violation = result.violation
    else:
        if no_eventual:
            raise click.BadParameter("not with --simulate", param_hint="--no-eventual")
        if fingerprints:
            raise click.BadParameter("not with --simulate", param_hint="--fingerprints")
        if jobs != 1:
            raise click.BadParameter("not with --simulate", param_hint="--jobs")
        sim = simulate_walks(bounds, variant, seed=seed, max_steps=max_steps,
                             seconds=60.0 if seconds is None and max_steps is None else seconds,
                             progress=_sim_progress)
        click.echo(render_simulation_stats(sim))
        violation = sim.violation
    if violation is not None:
        click.echo(render_trace(violation, full_states=full_trace))
        sys.exit(1)
    click.echo("all properties hold " + ("on every walk" if simulate else "within the bounds"))
