"""`python -m bench.reduction_headroom`: an estimate of how many states a larger partial-order
reduction could save, before anyone writes one.

The model's reduction (``reduction.py``) expands a state whose fault budget is spent by one step
alone where one commutes with everything. A larger ample set (a persistent set) must still hold
every enabled step that depends on one of its own: two steps that do not commute where both are
enabled cannot be split. So the best any persistent set can do in a state is one of the
connected groups of its enabled steps under that *local* dependence. This bench searches with an
oracle that expands each spent-budget state by its smallest such group, where two steps count as
independent when each stays enabled after the other and both orders reach the same canonical
state (so symmetry helps it too).

The oracle is optimistic and unsound: it ignores the steps that become enabled later (condition
C1 of ample sets), visibility and the cycle proviso. It is also greedy (the smallest group in
each state, where a larger one might lead to fewer states further on), so its counts are an
estimate of the floor, not a bound, and not a reduction to use. The report gives, per depth,
the states the model's reduction stores and the states the oracle stores, and their ratio: the
headroom.

Both searches are breadth first over canonical states, level by level, and stop after the level
at which the model's search passes ``--max-states`` (at 2 processes per id the full space takes
half an hour even reduced; the ratio per level is what is measured).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from taskcustody_model.protocol import Action, Config, apply, enabled_actions
from taskcustody_model.reduction import steps_to_expand
from taskcustody_model.state import Bounds, State
from taskcustody_model.symmetry import canonical
from taskcustody_model.variants import variant


def smallest_dependent_group(state: State, config: Config) -> list[Action]:
    """The enabled steps of ``state``: all of them while faults are left, else the smallest
    connected group under local dependence (the module docstring)."""
    actions = enabled_actions(state, config)
    if state.faults < config.bounds.faults or len(actions) <= 1:
        return actions
    n_workers = config.bounds.workers
    after = [apply(state, a, config) for a in actions]
    enabled_after = [set(enabled_actions(s, config)) for s in after]

    def independent(i: int, j: int) -> bool:
        a, b = actions[i], actions[j]
        return (
            b in enabled_after[i]
            and a in enabled_after[j]
            and canonical(apply(after[i], b, config), n_workers)
            == canonical(apply(after[j], a, config), n_workers)
        )

    n = len(actions)
    group_of = [-1] * n
    groups: list[list[int]] = []
    for start in range(n):
        if group_of[start] >= 0:
            continue
        group = [start]
        group_of[start] = len(groups)
        for i in group:  # (grows while it is walked)
            for j in range(n):
                if group_of[j] < 0 and not independent(i, j):
                    group_of[j] = len(groups)
                    group.append(j)
        groups.append(group)
    return [actions[i] for i in sorted(min(groups, key=len))]


def levels(config: Config, expand: Callable[[State], list[Action]]) -> Iterator[int]:
    """The states stored after each level of a breadth-first search expanding by ``expand``,
    which looks a successor up as generated first, as the checker does (``canonical`` is not a
    unique representative, so the raw aliases merge a few more states than canonical forms
    alone would: the counts are the checker's)."""
    init = canonical(config.initial(), config.bounds.workers)
    met = {init}  # stored states and raw aliases
    stored = 1
    frontier = [init]
    while frontier:
        level = []
        for state in frontier:
            for action in expand(state):
                raw = apply(state, action, config)
                if raw in met:
                    continue
                nxt = canonical(raw, config.bounds.workers)
                if nxt not in met:
                    met.add(nxt)
                    level.append(nxt)
                met.add(raw)
        if not level:
            return
        stored += len(level)
        frontier = level
        yield stored


def headroom(
    bounds: Bounds,
    design: str = "correct",
    max_states: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Per depth: the states of the model's reduction and of the oracle (the module docstring)."""
    config = Config(bounds, variant(design))
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    model = levels(config, lambda s: steps_to_expand(s, config, True))
    oracle = levels(config, lambda s: smallest_dependent_group(s, config))
    reduced = floor = 1  # (the initial state; once a search is exhausted, its total)
    complete = False
    while True:
        after = next(model, None)
        if after is None:
            complete = True
            # the model's search is exhausted; the oracle's may go deeper
            rows.extend(
                {
                    "depth": len(rows) + 1,
                    "reduced": reduced,
                    "oracle": more,
                    "ratio": round(reduced / more, 2),
                }
                for more in oracle
            )
            break
        reduced = after
        floor = next(oracle, floor)
        rows.append(
            {
                "depth": len(rows) + 1,
                "reduced": reduced,
                "oracle": floor,
                "ratio": round(reduced / floor, 2),
            }
        )
        if progress is not None:
            progress(
                f"depth {len(rows)}: reduced {reduced:,}, oracle {floor:,} "
                f"({time.monotonic() - started:.0f} s)"
            )
        if max_states is not None and reduced >= max_states:
            break
    return {
        "bounds": bounds._asdict(),
        "variant": design,
        "complete": complete,
        "levels": rows,
        "seconds": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.reduction_headroom",
        description="An estimate of how many states larger persistent sets could save, against "
        "the model's reduction (an optimistic, unsound oracle; the module docstring).",
    )
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--faults", type=int, default=2)
    parser.add_argument("--processes-per-server", type=int, default=1)
    parser.add_argument("--variant", default="correct")
    parser.add_argument(
        "--max-states",
        type=int,
        default=None,
        help="stop after the level at which the model's search stores this many",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    bounds = Bounds(
        tasks=args.tasks,
        servers=args.servers,
        workers=args.workers,
        faults=args.faults,
        processes_per_server=args.processes_per_server,
    )
    report = headroom(bounds, args.variant, args.max_states, progress=None if args.json else print)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        last = report["levels"][-1]
        print(
            f"{'complete' if report['complete'] else 'stopped'} at depth {last['depth']}: "
            f"the model's reduction stores {last['reduced']:,} states, the oracle "
            f"{last['oracle']:,} ({last['ratio']}x), {report['seconds']} s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
