"""``taskcustody model-check``: explore the model within bounds and check every property."""

from __future__ import annotations

import sys
from typing import TypeVar

import click

from .checker import Progress, check
from .simulate import SimulationProgress
from .simulate import simulate as simulate_walks
from .trace import (
    describe_bounds,
    render_bounds,
    render_simulation_stats,
    render_stats,
    render_trace,
)
from .variants import DEFAULT_BOUNDS, VARIANTS


def _progress(p: Progress) -> None:
    if p.phase == "again":
        click.echo(
            f"  {p.broken} broke after {p.distinct_states} distinct states; searching "
            "again with every state stored and no reduction, for a shortest trace",
            err=True,
        )
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


#: The options that set a bound (None when not given: the design's own).
_BOUND_OPTIONS = frozenset(
    {
        "tasks",
        "servers",
        "workers",
        "faults",
        "processes_per_server",
        "drain_steps",
        "late_tasks",
        "redis_faults",
        "takes_outwait_grace",
        "max_recoveries",
        "handler_failures",
        "cancels_before_send",
    }
)


_T = TypeVar("_T")


def _or(given: _T | None, own: _T) -> _T:
    """A bound: the flag's value if it was given, else the design's own."""
    return own if given is None else given


def _given_bound_flags(ctx: click.Context) -> list[str]:
    """The bound flags given, as spelt (``--no-handler-failures``), in ``--help``'s order."""
    given: list[str] = []
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if param.name in _BOUND_OPTIONS and value is not None:
            off = value is False and isinstance(param, click.Option) and param.secondary_opts
            given.append(param.secondary_opts[0] if off else param.opts[0])
    return given


def design_listing() -> str:
    """``--variant list``: each design's name and description, the bounds ``--variant NAME``
    checks it at, and the shortest counterexample it has there."""
    lines: list[str] = []
    for v in VARIANTS.values():
        lines.append(f"{v.name:30} {v.description}")
        found = (
            f"counterexample: {v.counterexample.property}, "
            f"{v.counterexample.length} step{'s' if v.counterexample.length != 1 else ''}"
            if v.counterexample
            else "no counterexample"
        )
        lines.append(f"{'':30} bounds: {describe_bounds(v.own_bounds)}; {found}")
    return "\n".join(lines)


_OWN = "default: the design's own (--variant list shows them; the correct design's: {})"


@click.command(name="model-check")
@click.option(
    "--tasks",
    type=click.IntRange(1, 6),
    default=None,
    help="tasks the producer enqueues (the state space grows fastest with this); "
    + _OWN.format(DEFAULT_BOUNDS.tasks),
)
@click.option(
    "--servers",
    type=click.IntRange(1, 4),
    default=None,
    help="server ids, each running --workers workers; " + _OWN.format(DEFAULT_BOUNDS.servers),
)
@click.option(
    "--workers",
    type=click.IntRange(1, 4),
    default=None,
    help="workers per server; " + _OWN.format(DEFAULT_BOUNDS.workers),
)
@click.option(
    "--faults",
    type=click.IntRange(0, 10),
    default=None,
    help="budget of injected faults (all kinds count); " + _OWN.format(DEFAULT_BOUNDS.faults),
)
@click.option(
    "--processes-per-server",
    type=click.IntRange(1, 3),
    default=None,
    help="processes sharing one server id at once (a stalled one and its successor); "
    + _OWN.format(DEFAULT_BOUNDS.processes_per_server),
)
@click.option(
    "--drain-steps/--atomic-drains",
    default=None,
    help="drain one task per step (default: only for unbounded-drain)",
)
@click.option(
    "--late-tasks",
    type=click.IntRange(0, 6),
    default=None,
    help="of the tasks, how many the producer enqueues during the run (not at start); "
    + _OWN.format(DEFAULT_BOUNDS.late_tasks),
)
@click.option(
    "--redis-faults/--no-redis-faults",
    default=None,
    help="Redis's own faults too: redis_wipe (Redis restarts empty); " + _OWN.format("no"),
)
@click.option(
    "--takes-outwait-grace/--takes-within-grace",
    default=None,
    help="break the registry GC's assumption: a pending take may outlast the grace; "
    + _OWN.format("within"),
)
@click.option(
    "--max-recoveries",
    type=click.Choice([*map(str, range(6)), "off"]),
    default=None,
    help="poison-pill detection: dead-letter a task recovered more often than this "
    "(off: recoveries not counted); " + _OWN.format("off"),
)
@click.option(
    "--handler-failures/--no-handler-failures",
    default=None,
    help="a handler may fail (counts against --faults): its retry is scheduled and "
    "promoted to the queue when due; " + _OWN.format("no"),
)
@click.option(
    "--cancels-before-send/--no-cancels-before-send",
    default=None,
    help="asyncio's fault: a worker step cancelled before its command is sent (counts "
    "against --faults); " + _OWN.format("no"),
)
@click.option(
    "--variant",
    default="correct",
    show_default=True,
    help="design to check, at its own bounds unless flags say otherwise; 'list' names "
    "them with their bounds",
)
@click.option("--full-trace", is_flag=True, help="print the state after every step")
@click.option("--no-eventual", is_flag=True, help="skip the eventual-recovery check")
@click.option(
    "--simulate",
    is_flag=True,
    help="random walks instead of the exhaustive search (for bounds beyond it): every "
    "property on every state; eventual recovery by a fault-free continuation at "
    "each walk's end",
)
@click.option(
    "--seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="with --simulate: stop after this long (default 60 unless --steps is given)",
)
@click.option(
    "--steps",
    "max_steps",
    type=click.IntRange(min=1),
    default=None,
    help="with --simulate: stop after this many steps",
)
@click.option("--seed", type=int, default=0, show_default=True, help="with --simulate")
@click.option(
    "--reduce/--no-reduce",
    default=True,
    show_default=True,
    help="the partial-order reduction once the fault budget is spent (same verdict, "
    "fewer states; a counterexample is searched again without it, for a shortest "
    "one)",
)
@click.option(
    "--fingerprints",
    is_flag=True,
    help="store a 64-bit fingerprint of each state met instead of the state (hash "
    "compaction): about 1 KB a state instead of 3-4, for bounds that do not fit in "
    "memory; prints the estimated chance that two fingerprints collided; a "
    "counterexample is searched again with states stored (up to its depth); not "
    "with --jobs",
)
@click.option(
    "--jobs",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="search in this many processes (a violation is searched again in one, for "
    "its shortest trace)",
)
def model_check(
    tasks: int | None,
    servers: int | None,
    workers: int | None,
    faults: int | None,
    processes_per_server: int | None,
    drain_steps: bool | None,
    late_tasks: int | None,
    redis_faults: bool | None,
    takes_outwait_grace: bool | None,
    max_recoveries: str | None,
    handler_failures: bool | None,
    cancels_before_send: bool | None,
    variant: str,
    full_trace: bool,
    no_eventual: bool,
    simulate: bool,
    seconds: float | None,
    max_steps: int | None,
    seed: int,
    reduce: bool,
    fingerprints: bool,
    jobs: int,
) -> None:
    """Exhaustively check the custody protocol model, or with --simulate walk it at random
    (exit 0: all properties hold within the bounds, or on every walk; 1: a counterexample is
    printed; 2: bad arguments).  A design is checked at its own bounds (--variant list shows
    them), each flag given replacing one of them."""
    if variant == "list":
        click.echo(design_listing())
        return
    if variant not in VARIANTS:
        # one line: the names fit on it; `--variant list` describes them
        click.echo(f"Error: unknown variant {variant!r} (known: {', '.join(VARIANTS)})", err=True)
        sys.exit(2)
    own = VARIANTS[variant].own_bounds
    recoveries = own.max_recoveries
    if max_recoveries is not None:
        recoveries = None if max_recoveries == "off" else int(max_recoveries)
    bounds = own._replace(
        tasks=_or(tasks, own.tasks),
        servers=_or(servers, own.servers),
        workers=_or(workers, own.workers),
        faults=_or(faults, own.faults),
        processes_per_server=_or(processes_per_server, own.processes_per_server),
        drain_steps=_or(drain_steps, own.drain_steps),
        late_tasks=_or(late_tasks, own.late_tasks),
        redis_faults=_or(redis_faults, own.redis_faults),
        take_wait_bounded=own.take_wait_bounded
        if takes_outwait_grace is None
        else not takes_outwait_grace,
        max_recoveries=recoveries,
        handler_failures=_or(handler_failures, own.handler_failures),
        cancels_before_send=_or(cancels_before_send, own.cancels_before_send),
    )
    overridden = _given_bound_flags(click.get_current_context())
    if bounds.late_tasks > bounds.tasks:
        raise click.BadParameter(
            f"cannot exceed the tasks ({bounds.tasks})", param_hint="--late-tasks"
        )
    if not simulate:
        if seconds is not None or max_steps is not None:
            raise click.BadParameter("only with --simulate", param_hint="--seconds/--steps")
        if fingerprints and jobs != 1:
            raise click.BadParameter("not with --jobs", param_hint="--fingerprints")
    else:
        if no_eventual:
            raise click.BadParameter("not with --simulate", param_hint="--no-eventual")
        if fingerprints:
            raise click.BadParameter("not with --simulate", param_hint="--fingerprints")
        if jobs != 1:
            raise click.BadParameter("not with --simulate", param_hint="--jobs")
    click.echo(render_bounds(bounds, overridden))
    if not simulate:
        result = check(
            bounds,
            variant,
            progress=_progress,
            eventual=not no_eventual,
            jobs=jobs,
            reduce=reduce,
            fingerprints=fingerprints,
        )
        click.echo(render_stats(result))
        violation = result.violation
    else:
        sim = simulate_walks(
            bounds,
            variant,
            seed=seed,
            max_steps=max_steps,
            seconds=60.0 if seconds is None and max_steps is None else seconds,
            progress=_sim_progress,
        )
        click.echo(render_simulation_stats(sim))
        violation = sim.violation
    if violation is not None:
        click.echo(render_trace(violation, full_states=full_trace))
        sys.exit(1)
    click.echo("all properties hold " + ("on every walk" if simulate else "within the bounds"))
