"""Latency at half capacity: the time from enqueue to the handler's start, p50/p90/p99/max.

    python -m bench.latency                      # 5,000 tasks x 3 rounds per configuration
    python -m bench.latency --rounds 1 --tasks 1000
    python -m bench --only latency               # the same, as a part of the benchmark

For each configuration, in each round, against a throwaway redis-server (127.0.0.1, a free port,
no persistence, never the shared 6379):

1. capacity: a drain of --capacity-tasks no-op tasks, enqueued first, by the throughput bench's own
   driver (bench/drivers.py, bench/peers/dramatiq_driver.py) at the same concurrency, timed from
   the first take to the last completion; and (unless --capacity drain) a *fed* run: the producer
   below sends as many tasks back to back, without a schedule, to the warmed-up worker, timed from
   the first send to the last handler start. The capacity is the lower of the two. On a 2-core
   machine the producer, the worker and redis-server compete for the cores: a drain runs without
   a producer, and half of its rate can be more than the worker sustains while a producer runs
   beside it (the raw BLPOP loop drains 30,000 tasks/s, but its producer, building an envelope
   per task, sends fewer than that and takes a core to do it), which would measure a growing
   backlog, not the latency at half load;
2. latency: a worker process (bench/latency_driver.py) is started and warmed up; then a producer
   process sends --tasks tasks at an open-loop constant rate of --load (0.5) x that capacity, each
   task due at t0 + i / rate on the monotonic clock (it never waits for the worker; when it falls
   behind it sends at once until it has caught up), for at most --max-seconds; each payload
   carries time.time() taken just before the enqueue call, and the handler's first statement
   records time.time() minus that.

Reported: the median over rounds of each round's p50, p90, p99 and max (nearest rank over all the
measured tasks of the round), and also p99 measured from the time the schedule meant to send each
task (which counts the producer's own lateness, so an overloaded producer cannot hide latency)
and the producer's lateness. Rounds rotate the order of the configurations. A round counts only if
every task sent was handled exactly once.

Writes bench/results/latency.{md,json}; with --only (a subset of the configurations) it writes to
bench/results/raw/ only.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import report
from bench.harness import (
    BENCH_DIR,
    REPO_DIR,
    DriverError,
    RedisServer,
    _die_with_parent,
    _readline,
    run_driver,
    stop_driver,
)
from bench.peerenv import PEERS, driver_argv, peer_python

RESULTS = BENCH_DIR / "results"
DRIVER = BENCH_DIR / "latency_driver.py"
DEFAULTS: dict[str, Any] = {
    "tasks": 5_000,
    "rounds": 3,
    "capacity_tasks": 5_000,
    "load": 0.5,
    "max_seconds": 60.0,
    "capacity": "min",
}
# `python -m bench --quick`: dramatiq at one thread handles ~270 tasks/s, so time bounds its runs.
QUICK: dict[str, Any] = DEFAULTS | {
    "tasks": 1_000,
    "rounds": 1,
    "capacity_tasks": 1_000,
    "max_seconds": 5.0,
}


@dataclass(frozen=True)
class Config:
    key: str
    label: str
    system: str  # latency_driver.py --system
    threads: int
    concurrency: str
    group: str  # ours, peer, floor (as bench/run.py)


CONFIGS = [
    Config(
        "ours", "taskcustody, default Settings()", "ours", 1, "1 process x 1 worker thread", "ours"
    ),
    Config(
        "ours-prefetch",
        "taskcustody, Settings(prefetch=8)",
        "ours-prefetch",
        1,
        "1 process x 1 worker thread (8 slots)",
        "ours",
    ),
    Config(
        "dramatiq",
        "dramatiq (RedisBroker, worker_timeout 100 ms)",
        "dramatiq",
        1,
        "1 process x 1 worker thread",
        "peer",
    ),
    Config(
        "dramatiq-8",
        "dramatiq (RedisBroker, worker_timeout 100 ms)",
        "dramatiq",
        8,
        "1 process x 8 worker threads (its throughput config)",
        "peer",
    ),
    Config("blpop", "raw BLPOP loop", "blpop", 1, "1 process x 1 thread", "floor"),
]


def log(msg: str) -> None:
    print(msg, flush=True)


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def latency_stem(quick: bool, partial: bool, stamp: str) -> str:
    """Where a latency run's .md/.json go, relative to the results directory, without suffix:
    `latency` for a run of every configuration at full size, otherwise (a quick run, or a subset
    of the configurations) `raw/<stamp>-latency[-quick][-partial]`, never over latency.*."""
    if not quick and not partial:
        return "latency"
    return f"raw/{stamp}-latency" + ("-quick" if quick else "") + ("-partial" if partial else "")


def select(
    only: Sequence[str] | None = None,
    only_kind: Sequence[str] | None = None,
    peers: Sequence[str] | None = None,
    skip_peers: bool = False,
) -> list[Config]:
    """The configurations a run measures: `only` names configuration keys; `only_kind`, `peers`
    and `skip_peers` filter as `python -m bench` does (a peer by its name, dramatiq)."""
    out = []
    for c in CONFIGS:
        kind = "dramatiq" if c.system == "dramatiq" else c.key
        if only and c.key not in only:
            continue
        if only_kind and kind not in only_kind:
            continue
        if c.group == "peer" and (skip_peers or (peers and kind not in peers)):
            continue
        out.append(c)
    return out


# --- statistics -------------------------------------------------------------------------------


def nearest_rank(ordered: Sequence[float], q: float) -> float:
    """The q-quantile (0 < q <= 1) of sorted values by nearest rank: a value that was observed."""
    if not ordered:
        return math.nan
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


def quantiles_ms(values: Sequence[float]) -> dict[str, float]:
    xs = sorted(values)
    return {
        "p50": nearest_rank(xs, 0.50) * 1e3,
        "p90": nearest_rank(xs, 0.90) * 1e3,
        "p99": nearest_rank(xs, 0.99) * 1e3,
        "max": xs[-1] * 1e3 if xs else math.nan,
        "mean": statistics.fmean(xs) * 1e3 if xs else math.nan,
    }


# --- one configuration, one round ---------------------------------------------------------------


def python_for(c: Config) -> str:
    if c.system == "dramatiq":
        return str(peer_python(next(p for p in PEERS if p.name == "dramatiq"), log))
    return sys.executable


def capacity_argv(c: Config, python: str, url: str, tasks: int) -> list[str]:
    """The throughput bench's drain of `tasks` tasks at this configuration's concurrency."""
    if c.system == "dramatiq":
        peer = dataclasses.replace(
            next(p for p in PEERS if p.name == "dramatiq"), concurrency=c.threads
        )
        return driver_argv(peer, Path(python), url, tasks)
    return [
        python,
        "-m",
        "bench.drivers",
        "--kind",
        c.system,
        "--mode",
        "threads",
        "--concurrency",
        str(c.threads),
        "--url",
        url,
        "--tasks",
        str(tasks),
    ]


def measure_capacity(c: Config, python: str, srv: RedisServer, tasks: int) -> float:
    res = run_driver(capacity_argv(c, python, srv.url, tasks), srv, timeout=60 + tasks / 40)
    if res.extra.get("committed") not in (None, tasks):
        raise DriverError(f"capacity drain committed {res.extra['committed']} of {tasks}")
    return res.rate


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_DIR)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _read_event(proc: subprocess.Popen[str], deadline: float, want: str) -> dict[str, Any]:
    while True:
        line = _readline(proc, deadline)
        if line is None:
            raise DriverError(f"worker exited before '{want}' (rc={proc.poll()})")
        line = line.strip()
        if not line.startswith("{"):
            continue
        msg: dict[str, Any] = json.loads(line)
        if msg.get("event") == "error":
            raise DriverError(f"worker: {msg.get('why')}")
        if msg.get("event") == want:
            return msg


def latency_run(
    c: Config, python: str, srv: RedisServer, tasks: int, rate: float, max_seconds: float
) -> dict[str, Any]:
    """One open-loop run at `rate` tasks/s: a warmed-up worker process, then the producer."""
    srv.flush()
    env = _env()
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
        worker_out, producer_out = Path(tmp) / "worker.json", Path(tmp) / "producer.json"
        common = ["--system", c.system, "--url", srv.url, "--tasks", str(tasks)]
        worker_err = Path(tmp) / "worker.err"
        with open(worker_err, "w+") as err:
            worker = subprocess.Popen(
                [
                    python,
                    str(DRIVER),
                    "worker",
                    *common,
                    "--threads",
                    str(c.threads),
                    "--out",
                    str(worker_out),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
                cwd=str(REPO_DIR),
                preexec_fn=_die_with_parent,
            )
            try:
                ready = _read_event(worker, time.monotonic() + 60, "ready")
                prod = subprocess.run(
                    [
                        python,
                        str(DRIVER),
                        "producer",
                        *common,
                        "--rate",
                        f"{rate:.3f}",
                        "--max-seconds",
                        str(max_seconds),
                        "--out",
                        str(producer_out),
                    ],
                    env=env,
                    cwd=str(REPO_DIR),
                    capture_output=True,
                    text=True,
                    timeout=max_seconds + 60,
                    preexec_fn=_die_with_parent,
                )
                if prod.returncode != 0:
                    raise DriverError(
                        f"producer failed (rc={prod.returncode}):\n{prod.stderr[-2000:]}"
                    )
                produced = json.loads(producer_out.read_text())
                assert worker.stdin is not None
                worker.stdin.write(f"sent {produced['sent']}\n")
                worker.stdin.flush()
                _read_event(worker, time.monotonic() + 60, "done")
                seen = json.loads(worker_out.read_text())
            except (DriverError, subprocess.TimeoutExpired, OSError, ValueError) as exc:
                err.seek(0)
                raise DriverError(f"{c.key}: {exc}\n{err.read()[-2000:]}") from exc
            finally:
                stop_driver(worker, 10)
    sent, index = produced["sent"], seen["index"]
    lags = sorted(produced["lag"])
    return {
        "sent": sent,
        "received": len(index),
        "distinct": len(set(index)),
        "complete": len(index) == sent and set(index) == set(range(sent)),
        "achieved_rate": sent / produced["seconds"] if produced["seconds"] > 0 else 0.0,
        # tasks per second from the first send to the last handler start
        "handled_rate": (
            sent / (seen["last"] - produced["wall0"]) if seen["last"] > produced["wall0"] else 0.0
        ),
        "latency_ms": quantiles_ms(seen["latency"]),
        "from_schedule_ms": quantiles_ms(seen["from_schedule"]),
        "producer_lag_ms": {
            "p99": nearest_rank(lags, 0.99) * 1e3,
            "max": (lags[-1] if lags else math.nan) * 1e3,
        },
        "version": ready.get("version"),
    }


# --- the whole measurement ----------------------------------------------------------------------


def fed_capacity(c: Config, python: str, srv: RedisServer, tasks: int, max_seconds: float) -> float:
    """What producer and worker sustain together on this machine: the producer sends back to back
    (no schedule) to the warmed-up worker; tasks per second from the first send to the last
    handler start."""
    run = latency_run(c, python, srv, tasks, math.inf, max_seconds)
    if not run["complete"]:
        raise DriverError(f"fed capacity run: {run['received']} handled of {run['sent']} sent")
    rate: float = run["handled_rate"]
    return rate


def measure(
    configs: Sequence[Config],
    *,
    tasks: int,
    rounds: int,
    capacity_tasks: int,
    load: float,
    max_seconds: float,
    capacity_mode: str = "min",
    log: Callable[[str], None] = log,
) -> dict[str, Any]:
    """Every configuration in every round (rotated); the rows with medians over rounds."""
    pythons = {c.key: python_for(c) for c in configs}
    runs: dict[str, list[dict[str, Any]]] = {c.key: [] for c in configs}
    failures: list[str] = []
    with RedisServer(debug_command=False) as srv:
        redis_version = srv.version
        for rnd in range(rounds):
            shift = rnd % max(1, len(configs))
            for c in [*configs[shift:], *configs[:shift]]:
                began = time.monotonic()
                try:
                    drain = measure_capacity(c, pythons[c.key], srv, capacity_tasks)
                    fed = None
                    if capacity_mode == "min":
                        fed = fed_capacity(c, pythons[c.key], srv, capacity_tasks, max_seconds)
                    capacity = drain if fed is None else min(drain, fed)
                    rate = load * capacity
                    n = max(1, min(tasks, int(rate * max_seconds)))
                    run = latency_run(c, pythons[c.key], srv, n, rate, max_seconds)
                except DriverError as exc:
                    failures.append(f"round {rnd + 1}, {c.key}: {str(exc)[:300]}")
                    log(f"  round {rnd + 1}: {c.key} FAILED: {str(exc)[:800]}")
                    continue
                run |= {
                    "round": rnd + 1,
                    "capacity": capacity,
                    "drain_capacity": drain,
                    "fed_capacity": fed,
                    "rate": rate,
                    "loadavg": loadavg(),
                }
                q = run["latency_ms"]
                log(
                    f"  round {rnd + 1}/{rounds}: {c.key:<14} capacity {capacity:7,.0f}/s "
                    f"(drain {drain:,.0f}" + ("" if fed is None else f", fed {fed:,.0f}") + "), "
                    f"rate {rate:7,.0f}/s (achieved {run['achieved_rate']:,.0f}), "
                    f"{run['received']:,}/{run['sent']:,} tasks: p50 {q['p50']:.2f} p90 "
                    f"{q['p90']:.2f} p99 {q['p99']:.2f} max {q['max']:.2f} ms "
                    f"({time.monotonic() - began:.1f} s wall)"
                )
                if not run["complete"]:
                    failures.append(
                        f"round {rnd + 1}, {c.key}: {run['received']} handled "
                        f"({run['distinct']} distinct) of {run['sent']} sent"
                    )
                    log(
                        f"  round {rnd + 1}: {c.key}: not every task handled exactly once: "
                        "not counted"
                    )
                    run["counted"] = False
                else:
                    run["counted"] = True
                runs[c.key].append(run)
    rows = []
    for c in configs:
        good = [r for r in runs[c.key] if r["counted"]]
        row: dict[str, Any] = {
            "key": c.key,
            "label": c.label,
            "group": c.group,
            "concurrency": c.concurrency,
            "system": c.system,
            "threads": c.threads,
            "runs": runs[c.key],
            "rounds_counted": len(good),
        }
        if good:
            row["version"] = good[0].get("version")
            for k in (
                "capacity",
                "drain_capacity",
                "fed_capacity",
                "rate",
                "achieved_rate",
                "handled_rate",
            ):
                if any(r.get(k) is None for r in good):
                    row[k] = None
                    continue
                row[k] = statistics.median(r[k] for r in good)
            row["tasks"] = statistics.median(r["sent"] for r in good)
            for part in ("latency_ms", "from_schedule_ms", "producer_lag_ms"):
                row[part] = {q: statistics.median(r[part][q] for r in good) for q in good[0][part]}
        rows.append(row)
    return {
        "rows": rows,
        "failures": failures,
        "redis_version": redis_version,
        "tasks": tasks,
        "rounds": rounds,
        "capacity_tasks": capacity_tasks,
        "load": load,
        "max_seconds": max_seconds,
        "capacity_mode": capacity_mode,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.latency",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--tasks",
        type=int,
        default=DEFAULTS["tasks"],
        help="tasks per latency run (default %(default)s; fewer if the rate "
        "would take longer than --max-seconds)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=DEFAULTS["rounds"],
        help="rounds per configuration (default %(default)s)",
    )
    ap.add_argument(
        "--capacity-tasks",
        type=int,
        default=DEFAULTS["capacity_tasks"],
        help="tasks per capacity drain (default %(default)s)",
    )
    ap.add_argument(
        "--load",
        type=float,
        default=DEFAULTS["load"],
        help="the producer's rate as a fraction of the measured capacity (default %(default)s)",
    )
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=DEFAULTS["max_seconds"],
        help="longest a producer sends (default %(default)s)",
    )
    ap.add_argument(
        "--capacity",
        choices=["min", "drain"],
        default=DEFAULTS["capacity"],
        help="the capacity the rate is a fraction of: the lower of the drain's and "
        "the fed run's (default), or the drain's alone",
    )
    ap.add_argument(
        "--only",
        action="append",
        choices=[c.key for c in CONFIGS],
        help="only these configurations (repeatable); writes to results/raw/ only",
    )
    ap.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    ap.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="only re-write the .md beside a results JSON from it",
    )
    args = ap.parse_args(argv)
    if args.render:
        from bench.harness import rerender

        return rerender(args.render, render)
    if args.tasks < 1 or args.rounds < 1 or args.capacity_tasks < 1 or args.load <= 0:
        ap.error("--tasks, --rounds and --capacity-tasks must be >= 1, --load > 0")
    from bench.run import git_commit

    configs = select(only=args.only)
    began = time.monotonic()
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench.latency"
        + "".join(
            f" --{k.replace('_', '-')} {getattr(args, k)}"
            for k in DEFAULTS
            if getattr(args, k) != DEFAULTS[k]
        )
        + "".join(f" --only {k}" for k in args.only or []),
        "commit": git_commit(),
        "cpus": os.cpu_count(),
        "load_before": loadavg(),
    }
    log(
        f"latency: {args.tasks:,} tasks at {args.load:g} x capacity, {args.rounds} round(s), "
        f"load average {meta['load_before']}"
    )
    result = measure(
        configs,
        tasks=args.tasks,
        rounds=args.rounds,
        capacity_tasks=args.capacity_tasks,
        load=args.load,
        max_seconds=args.max_seconds,
        capacity_mode=args.capacity,
    )
    meta |= {"load_after": loadavg(), "seconds": round(time.monotonic() - began, 1)}
    result["meta"] = meta
    stem = latency_stem(
        quick=False, partial=bool(args.only), stamp=dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    )
    text = write(result, args.out, stem)
    print(text)
    return 0 if not result["failures"] else 1


def write(result: dict[str, Any], out: Path, stem: str) -> str:
    """`<out>/<stem>.json` and `.md`; returns the markdown."""
    target = out / stem
    target.parent.mkdir(parents=True, exist_ok=True)
    target.with_suffix(".json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    text = render(result)
    target.with_suffix(".md").write_text(text)
    log(f"wrote {target.with_suffix('.md')} and .json")
    return text


def render(result: dict[str, Any]) -> str:
    meta = result.get("meta", {})
    head = ["# Latency at half capacity: enqueue to the handler's start", ""]
    if meta:
        head += [
            f"`{meta['command']}` ({meta['date']}, commit `{meta['commit']}`, "
            f"{meta['cpus']} cores, Redis {result['redis_version']}; load average "
            f"{meta['load_before']} at the start, {meta['load_after']} at the end; "
            f"{meta['seconds']:.0f} s in all).",
            "",
        ]
    return "\n".join(head + report.latency_lines(result, level=2)) + "\n"


if __name__ == "__main__":
    sys.exit(main())
