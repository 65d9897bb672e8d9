"""Checker speed: model-check states per second; stateful steps per second on fakeredis and on
real Redis. Each figure is taken only if the piece it measures exists in this tree; otherwise the
row says "pending" (the report shows which)."""

from __future__ import annotations

import random
import time
from typing import Any

from bench.harness import RedisServer


def model_states_per_second(quick: bool) -> dict[str, Any]:
    try:
        from taskcustody_model.checker import check
        from taskcustody_model.state import Bounds
    except ImportError:
        return {"status": "pending", "why": "taskcustody_model.checker is not in the tree yet"}
    bounds = (
        Bounds(tasks=2, servers=2, workers=2, faults=1)
        if quick
        else Bounds(tasks=3, servers=2, workers=1, faults=2)
    )
    result = check(bounds)
    return {
        "status": "ok",
        "ok": result.ok,
        "states": result.distinct_states,
        "generated": result.states_generated,
        "seconds": result.seconds,
        "per_second": result.states_per_second,
        "bounds": repr(bounds),
    }


STATEFUL_BOUNDS = dict(tasks=3, servers=2, workers=2, faults=3)
MAX_STEPS_PER_RUN = 80


def _walk(make_client: Any, real: bool, budget: float, seed: int) -> dict[str, Any]:
    """Random walks of the conformance harness (the model drives the implementation, faults
    included), as the stateful test does: only the steps are timed, not each run's setup."""
    from taskcustody_model.state import Bounds

    from taskcustody.verify.harness import Harness

    rng = random.Random(seed)
    steps = runs = 0
    spent = 0.0
    began = time.perf_counter()
    while time.perf_counter() - began < budget:
        harness = Harness(make_client, Bounds(**STATEFUL_BOUNDS), real_redis=real)
        harness.setup()
        for _ in range(MAX_STEPS_PER_RUN):
            actions = harness.enabled()
            if not actions:
                break
            action = rng.choice(actions)
            t0 = time.perf_counter()
            harness.step(action)
            spent += time.perf_counter() - t0
            steps += 1
        runs += 1
    return {
        "steps": steps,
        "runs": runs,
        "seconds": spent,
        "per_second": steps / spent if spent else 0.0,
        "wall_seconds": time.perf_counter() - began,
    }


def stateful_steps_per_second(quick: bool) -> dict[str, Any]:
    try:
        import fakeredis

        from taskcustody import connect, connect_fake
        from taskcustody.verify.harness import VERIFY_SETTINGS
    except ImportError as exc:
        return {"status": "pending", "why": f"the conformance harness is not importable: {exc}"}
    budget = 1.5 if quick else 15.0
    fake_server = fakeredis.FakeServer()
    rows: dict[str, Any] = {"status": "ok", "bounds": STATEFUL_BOUNDS}
    rows["fakeredis"] = _walk(lambda: connect_fake(fake_server), False, budget, 1)
    with RedisServer() as srv:
        rows["redis"] = _walk(lambda: connect(srv.url, VERIFY_SETTINGS), True, budget, 1)
    return rows


def measure(quick: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, fn in (
        ("model_check", model_states_per_second),
        ("stateful", stateful_steps_per_second),
    ):
        try:
            out[name] = fn(quick)
        except Exception as exc:  # a piece under construction must not sink the benchmark
            out[name] = {"status": "error", "why": f"{type(exc).__name__}: {exc}"[:300]}
    return out


# -- time to find each broken design by simulation (a tracked figure) -----------------

#: `taskcustody model-check --simulate --tasks 6 --servers 3 --workers 3 --faults 4`
SIMULATION_BOUNDS = dict(tasks=6, servers=3, workers=3, faults=4, processes_per_server=1)
#: what a design needs on top to show at all (as `verify.run.DESIGN_MODEL_BOUNDS`): poison-pill
#: detection for designs 10-12, failing handlers for design 13
SIMULATION_EXTRAS: dict[str, dict[str, Any]] = {
    "recoveries-not-counted": {"max_recoveries": 1},
    "count-after-recovery": {"max_recoveries": 1},
    "recovered-to-queue": {"max_recoveries": 1},
    "promote-copies": {"handler_failures": True},
    # design 16 needs asyncio's cancellation before the send
    "cancelled-release-ran": {"cancels_before_send": True},
}
TIME_TO_FIND_SEEDS = 10
#: a seed that has not found its design after this long counts as not found
TIME_TO_FIND_BUDGET = 300.0


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def time_to_find(
    seeds: int = TIME_TO_FIND_SEEDS,
    budget: float = TIME_TO_FIND_BUDGET,
    designs: list[str] | None = None,
) -> dict[str, Any]:
    """For each broken design (or each of `designs`), `seeds` simulations (seeds 0..seeds-1)
    until it is found: the median steps (machine-independent: a seed's walk is deterministic) and
    the median seconds (wall clock, this machine, however loaded) to the first violation."""
    from taskcustody_model.simulate import simulate
    from taskcustody_model.state import Bounds
    from taskcustody_model.variants import VARIANTS

    rows: dict[str, Any] = {}
    for name in VARIANTS:
        if name == "correct" or (designs is not None and name not in designs):
            continue
        bounds = Bounds(**{**SIMULATION_BOUNDS, **SIMULATION_EXTRAS.get(name, {})})
        runs = [simulate(bounds, name, seed=seed, seconds=budget) for seed in range(seeds)]
        found = [r for r in runs if not r.ok]
        rows[name] = {
            "extras": SIMULATION_EXTRAS.get(name, {}),
            "found": len(found),
            "seeds": seeds,
            "properties": sorted({r.property for r in found if r.property}),
            "median_steps": _median([r.steps for r in found]) if found else None,
            "median_seconds": _median([r.seconds for r in found]) if found else None,
            "max_seconds": max(r.seconds for r in found) if found else None,
            "median_trace_length": (
                _median([len(r.violation) for r in found if r.violation]) if found else None
            ),
        }
    return {"bounds": SIMULATION_BOUNDS, "seeds": seeds, "budget_seconds": budget, "designs": rows}


def time_to_find_markdown(data: dict[str, Any], command: str, when: str) -> str:
    b = data["bounds"]
    out = [
        "# Time for `model-check --simulate` to find each broken design",
        "",
        f"`{command}` ({when}). Sizes: {b['tasks']} tasks, {b['servers']} servers x "
        f"{b['workers']} workers, {b['faults']} faults, {b['processes_per_server']} process "
        f"per id; seeds 0-{data['seeds'] - 1}; a seed gives up after "
        f"{data['budget_seconds']:.0f} s. Steps are machine-independent (a seed's walks are "
        "deterministic); seconds are wall-clock on the shared 2-core machine.",
        "",
        "| design | extra bounds | found | property | median steps | median s | max s | "
        "median trace |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    alone = [
        f"{name} ({r['when']}, `{r['command']}`)"
        for name, r in data["designs"].items()
        if "when" in r
    ]
    if alone:
        out[4:4] = ["Measured alone since: " + "; ".join(alone) + ".", ""]
    for name, r in data["designs"].items():
        extras = ", ".join(f"{k}={v}" for k, v in r["extras"].items()) or "-"

        def num(x: float | None, fmt: str) -> str:
            return "-" if x is None else format(x, fmt)

        out.append(
            f"| {name} | {extras} | {r['found']}/{r['seeds']} | {', '.join(r['properties'])} | "
            f"{num(r['median_steps'], ',.0f')} | {num(r['median_seconds'], '.2f')} | "
            f"{num(r['max_seconds'], '.2f')} | {num(r['median_trace_length'], '.0f')} |"
        )
    return "\n".join(out) + "\n"


# -- checker speed, before and after a change (measured in the same run) -----------------

_ONE_CHECK = """
import json, sys, time
from taskcustody_model import Bounds, check
import resource
bounds = Bounds(**json.loads(sys.argv[1]))
jobs = int(sys.argv[2])
# "full", or options of the after search joined by "+" ("reduce+fingerprints"): an older
# check() knows neither, nor jobs (passed only to the after search)
how = {name: True for name in sys.argv[3].split("+") if name != "full"}
cpu, wall = time.process_time(), time.monotonic()
r = check(bounds, jobs=jobs, **how) if jobs > 1 else check(bounds, **how)
cpu = time.process_time() - cpu
cpu += resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime  # the parallel search's workers
cpu += resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime
wall = time.monotonic() - wall
print(json.dumps({"ok": r.ok, "states": r.distinct_states, "generated": r.states_generated,
                  "depth": r.depth, "cpu": cpu, "wall": wall,
                  "max_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def compare(
    rev: str,
    bounds: dict[str, Any],
    rounds: int,
    after: str | None = None,
    jobs: int = 1,
    reduce: bool = False,
    fingerprints: bool = False,
) -> dict[str, Any]:
    """The checker of git revision ``rev`` against this tree's, alternating, ``rounds`` times
    each, one fresh process per run: median CPU and wall seconds, and distinct states per CPU
    second. CPU time is the fairer figure on a shared machine (wall time counts the others; CPU
    time counts a parallel search's workers too). ``after``: a directory to run instead of this
    tree's model (a compiled copy, ``python -m taskcustody_model.native_build DIR``); ``jobs``:
    the processes of the after search; ``reduce``: the after search with the partial-order
    reduction (``taskcustody_model.reduction``: fewer states, so the figure to read is the CPU
    ratio, the time to exhaust the bound, not states per second); ``fingerprints``: the after
    search with hash compaction (``checker.check``'s ``fingerprints``)."""
    import json
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "-C", str(root), "archive", rev, "model"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        trees = {"before": Path(tmp) / "model", "after": Path(after) if after else root / "model"}
        runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        for _ in range(rounds):
            for label, tree in trees.items():
                env = {**os.environ, "PYTHONPATH": str(tree)}
                n = str(jobs) if label == "after" else "1"
                options = [
                    name for name, on in (("reduce", reduce), ("fingerprints", fingerprints)) if on
                ]
                how = "+".join(options) if options and label == "after" else "full"
                out = subprocess.run(
                    [sys.executable, "-c", _ONE_CHECK, json.dumps(bounds), n, how],
                    capture_output=True,
                    text=True,
                    env=env,
                )
                if out.returncode != 0:
                    why = (out.stderr.strip().splitlines() or ["no output"])[-1]
                    raise SystemExit(f"the {label} search ({tree}) failed: {why}")
                runs[label].append(json.loads(out.stdout))
                print(label, runs[label][-1], file=sys.stderr, flush=True)
    summary: dict[str, Any] = {
        "rev": rev,
        "bounds": bounds,
        "rounds": rounds,
        "after": after or "this tree",
        "jobs": jobs,
        "reduce": reduce,
        "fingerprints": fingerprints,
    }
    for label, rs in runs.items():
        cpu = _median([r["cpu"] for r in rs])
        summary[label] = {
            "states": rs[0]["states"],
            "generated": rs[0]["generated"],
            "depth": rs[0]["depth"],
            "ok": rs[0]["ok"],
            "median_cpu_seconds": cpu,
            "median_wall_seconds": _median([r["wall"] for r in rs]),
            "max_rss_kb": max(r.get("max_rss_kb", 0) for r in rs),
            "states_per_cpu_second": rs[0]["states"] / cpu,
        }
    summary["same_states"] = summary["before"]["states"] == summary["after"]["states"]
    summary["cpu_ratio"] = (
        summary["before"]["median_cpu_seconds"] / summary["after"]["median_cpu_seconds"]
    )
    summary["wall_ratio"] = (
        summary["before"]["median_wall_seconds"] / summary["after"]["median_wall_seconds"]
    )
    # distinct states per second, after over before (the parallel search may store a few more
    # representatives than the sequential one: see taskcustody_model.parallel)
    summary["states_per_cpu_second_ratio"] = (
        summary["after"]["states_per_cpu_second"] / summary["before"]["states_per_cpu_second"]
    )
    summary["states_per_wall_second_ratio"] = (
        summary["after"]["states"]
        / summary["after"]["median_wall_seconds"]
        / (summary["before"]["states"] / summary["before"]["median_wall_seconds"])
    )
    return summary


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.checker --time-to-find` writes bench/results/time_to_find.{json,md};
    `python -m bench.checker --compare REV` measures the checker's speed-up since REV."""
    import argparse
    import json
    from datetime import datetime, timezone
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m bench.checker")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--time-to-find", action="store_true")
    what.add_argument(
        "--compare", metavar="REV", help="this tree's checker against git revision REV's"
    )
    parser.add_argument("--seeds", type=int, default=TIME_TO_FIND_SEEDS)
    parser.add_argument(
        "--designs",
        default=None,
        metavar="NAME,...",
        help="with --time-to-find: measure only these designs and update their "
        "rows of the results file (each row then says when it was measured)",
    )
    parser.add_argument("--budget", type=float, default=TIME_TO_FIND_BUDGET)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--after",
        metavar="DIR",
        default=None,
        help="with --compare: run the model in DIR as 'after' (a compiled copy)",
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="with --compare: the processes of the 'after' search"
    )
    parser.add_argument(
        "--reduce",
        action="store_true",
        help="with --compare: the 'after' search with the partial-order "
        "reduction (compare the CPU ratio: it stores fewer states)",
    )
    parser.add_argument(
        "--fingerprints",
        action="store_true",
        help="with --compare: the 'after' search with hash compaction",
    )
    parser.add_argument(
        "--bounds",
        default='{"tasks": 3, "servers": 2, "workers": 2, "faults": 2, "processes_per_server": 1}',
        help="JSON of taskcustody_model.Bounds fields (default: the CI bound)",
    )
    args = parser.parse_args(argv)
    if args.compare:
        print(
            json.dumps(
                compare(
                    args.compare,
                    json.loads(args.bounds),
                    args.rounds,
                    args.after,
                    args.jobs,
                    args.reduce,
                    args.fingerprints,
                ),
                indent=1,
            )
        )
        return 0
    designs = args.designs.split(",") if args.designs else None
    if designs is not None:
        from taskcustody_model.variants import VARIANTS

        unknown = [d for d in designs if d not in VARIANTS or d == "correct"]
        if unknown:
            parser.error(f"--designs: no broken design {', '.join(unknown)}")
    data = time_to_find(args.seeds, args.budget, designs)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = "python -m bench.checker --time-to-find" + (
        f" --seeds {args.seeds}" if args.seeds != TIME_TO_FIND_SEEDS else ""
    )
    args.out.mkdir(parents=True, exist_ok=True)
    if designs is not None:
        # update these rows only; the others keep the full run's figures, date and command
        old = json.loads((args.out / "time_to_find.json").read_text())
        if (old["bounds"], old["seeds"], old["budget_seconds"]) != (
            data["bounds"],
            data["seeds"],
            data["budget_seconds"],
        ):
            parser.error(
                "--designs: the results file was measured with other bounds, seeds or "
                "budget; run them all"
            )
        for row in data["designs"].values():
            row.update(when=when, command=f"{command} --designs {args.designs}")
        old["designs"].update(data["designs"])
        data = old
        when, command = data["when"], data.get("command", command)
    else:
        data["when"] = when
    (args.out / "time_to_find.json").write_text(json.dumps(data, indent=1) + "\n")
    (args.out / "time_to_find.md").write_text(time_to_find_markdown(data, command, when))
    print(time_to_find_markdown(data, command, when))
    missed = [n for n, r in data["designs"].items() if r["found"] < r["seeds"]]
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
