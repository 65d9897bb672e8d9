"""The asyncio worker beside the threaded one and the async peers (saq, arq), one run.

    python -m bench.aio                                   # 5,000 tasks x 3 rounds, latency too
    python -m bench.aio --tasks 2000 --rounds 2 --latency-tasks 1000

Throughput: one worker process, concurrency 8 and 64, each handler first waiting --wait-ms (0
and 5 by default) as an I/O call would: our `AsyncServer` (N asyncio workers, `async def`
handler, `await asyncio.sleep`), at prefetch 1 and 8 (`Settings(prefetch=8)`: each worker an
`AsyncPrefetchingWorker` of 8 slots), our threaded `Server` (N threads, `time.sleep`: a thread
blocked in I/O), at prefetch 1 and 8, saq (`Worker(concurrency=N)`) and arq (`max_jobs=N`,
burst, poll_delay 10 ms), both `await asyncio.sleep` in an `async def` handler. Same handshake
and drivers as `python -m bench` (bench/harness.py, bench/drivers.py, bench/peers/); rounds rotate
the order; medians over rounds; the ratio is each row's median over the asyncio worker's
(prefetch 1) at the same concurrency and wait.

Latency: bench/latency.py's measure (enqueue to the handler's start at half capacity) for our
threaded and asyncio workers at 1 and 8 workers.

Writes bench/results/aio.{md,json} (and a copy of the JSON in bench/results/raw/); `--render
JSON` re-writes the .md beside a results JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import latency, report
from bench.harness import BENCH_DIR, DriverError, RedisServer, rerender, run_driver
from bench.peerenv import PEERS, driver_argv, peer_python

RESULTS = BENCH_DIR / "results"
SYSTEMS = [
    ("ours-async", "taskcustody AsyncServer (asyncio workers)"),
    ("ours-async-prefetch", "taskcustody AsyncServer (asyncio workers)"),
    ("ours", "taskcustody Server (worker threads)"),
    ("ours-prefetch", "taskcustody Server (worker threads)"),
    ("saq", "saq Worker (concurrency N)"),
    ("arq", "arq (burst, poll_delay 10 ms, max_jobs N)"),
]
LATENCY_CONFIGS = [
    latency.Config(
        "ours",
        "taskcustody Server, default Settings()",
        "ours",
        1,
        "1 process x 1 worker thread",
        "ours",
    ),
    latency.Config(
        "ours-async",
        "taskcustody AsyncServer, default Settings()",
        "ours-async",
        1,
        "1 process x 1 asyncio worker",
        "ours",
    ),
    latency.Config(
        "ours-8",
        "taskcustody Server, default Settings()",
        "ours",
        8,
        "1 process x 8 worker threads",
        "ours",
    ),
    latency.Config(
        "ours-async-8",
        "taskcustody AsyncServer, default Settings()",
        "ours-async",
        8,
        "1 process x 8 asyncio workers",
        "ours",
    ),
]

#: The systems run with `Settings(prefetch=8)` (bench/drivers.py PREFETCH); the others take one
#: task per round trip.
PREFETCHING = {"ours-async-prefetch": 8, "ours-prefetch": 8}


#: bench/report.py's note on the concurrency of bench/latency.py's own configurations (not these).
THEIR_CONCURRENCY_NOTE = "Concurrency: one worker process everywhere"


def log(msg: str) -> None:
    print(msg, flush=True)


def argv_for(system: str, python: str, url: str, tasks: int, n: int, wait_ms: float) -> list[str]:
    if system.startswith("ours"):
        argv = [
            python,
            "-m",
            "bench.drivers",
            "--kind",
            system,
            "--mode",
            "threads",
            "--concurrency",
            str(n),
            "--url",
            url,
            "--tasks",
            str(tasks),
        ]
    else:
        peer = dataclasses.replace(next(p for p in PEERS if p.name == system), concurrency=n)
        argv = driver_argv(peer, Path(python), url, tasks)
    return [*argv, "--wait-ms", f"{wait_ms:g}"]


def throughput(
    tasks: int, rounds: int, concurrency: list[int], waits: list[float], systems: list[str]
) -> list[dict[str, Any]]:
    pythons = {
        s: sys.executable
        if s.startswith("ours")
        else str(peer_python(next(p for p in PEERS if p.name == s), log))
        for s in systems
    }
    configs = [(s, n, w) for n in concurrency for w in waits for s in systems]
    rates: dict[tuple[str, int, float], list[float]] = {c: [] for c in configs}
    versions: dict[str, str] = {}
    with RedisServer(debug_command=False) as srv:
        for rnd in range(rounds):
            shift = rnd % len(configs)
            for s, n, w in configs[shift:] + configs[:shift]:
                argv = argv_for(s, pythons[s], srv.url, tasks, n, w)
                try:
                    res = run_driver(argv, srv, timeout=60 + tasks / 20)
                except DriverError as exc:
                    log(f"  round {rnd + 1}: {s} x{n} wait {w:g} ms FAILED: {str(exc)[:600]}")
                    continue
                if res.extra.get("committed") not in (None, tasks):
                    log(
                        f"  round {rnd + 1}: {s} x{n}: committed {res.extra['committed']}: "
                        "not counted"
                    )
                    continue
                versions.setdefault(s, str(res.extra.get("version", "")))
                rates[(s, n, w)].append(res.rate)
                log(
                    f"  round {rnd + 1}/{rounds}: {s:<10} x{n:<3} wait {w:g} ms: "
                    f"{res.rate:,.0f} tasks/s (load {os.getloadavg()[0]:.1f})"
                )
    rows = []
    for (s, n, w), rs in rates.items():
        base = rates[("ours-async", n, w)] if "ours-async" in systems else []
        med = statistics.median(rs) if rs else None
        rows.append(
            {
                "system": s,
                "concurrency": n,
                "wait_ms": w,
                "rates": rs,
                "median": med,
                "min": min(rs, default=None),
                "max": max(rs, default=None),
                "version": versions.get(s),
                "x_async": med / statistics.median(base) if med and base else None,
            }
        )
    return rows


def render(data: dict[str, Any]) -> str:
    meta = data["meta"]
    labels = dict(SYSTEMS)
    lines = [
        "# The asyncio worker: throughput and latency beside the threaded worker, saq, arq",
        "",
        f"`{meta['command']}` ({meta['date']}, commit `{meta['commit']}`, {meta['cpus']} "
        f"cores, load average {meta['load_before']} at the start, {meta['load_after']} at "
        f"the end, {meta['seconds']:.0f} s). {meta['tasks']:,} tasks per drain, median of "
        f"{meta['rounds']} rounds (min-max beside it). The machine was shared with other "
        "work throughout: the figures are for comparing rows of this run, not absolute.",
        "",
        "## Throughput: 1 process, handler waits `wait` first (tasks/s)",
        "",
        "| system | concurrency | prefetch | wait | tasks/s (median) | min-max | x async |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["throughput"]:
        med = f"{r['median']:,.0f}" if r["median"] else "failed"
        rng = f"{r['min']:,.0f}-{r['max']:,.0f}" if r["median"] else ""
        ratio = f"{r['x_async']:.2f}x" if r["x_async"] else ""
        prefetch = PREFETCHING.get(r["system"], 1)
        lines.append(
            f"| {labels[r['system']]} | {r['concurrency']} | {prefetch} | "
            f"{r['wait_ms']:g} ms | {med} | {rng} | {ratio} |"
        )
    versions = {r["system"]: r["version"] for r in data["throughput"] if r.get("version")}
    if versions:
        lines += ["", "Peer versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + "."]
    if data.get("latency"):
        lines += [
            "",
            "## Latency at half capacity: enqueue to the handler's start",
            "",
            "No-op handlers (no wait). Each configuration is one worker process: our "
            "`Server(workers=N)` (N threads) or `AsyncServer(workers=N)` (N asyncio workers "
            "on one loop), `Settings()`.",
            "",
        ]
        lines += [
            line
            for line in report.latency_lines(data["latency"], level=3)
            if not line.startswith(THEIR_CONCURRENCY_NOTE)
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.aio",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--tasks", type=int, default=5_000, help="tasks per drain")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--concurrency",
        type=int,
        action="append",
        help="workers per process (repeatable; default 8 and 64)",
    )
    ap.add_argument(
        "--wait-ms",
        type=float,
        action="append",
        help="each handler's I/O wait (repeatable; default 0 and 5)",
    )
    ap.add_argument(
        "--latency-tasks",
        type=int,
        default=2_000,
        help="tasks per latency run (0: no latency part)",
    )
    ap.add_argument("--skip-peers", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="only re-write the .md beside a results JSON from it",
    )
    args = ap.parse_args(argv)
    if args.render:
        return rerender(args.render, render)
    if args.tasks < 1 or args.rounds < 1 or args.latency_tasks < 0:
        ap.error("--tasks and --rounds must be >= 1, --latency-tasks >= 0")
    from bench.run import git_commit, loadavg

    systems = [s for s, _ in SYSTEMS if not (args.skip_peers and not s.startswith("ours"))]
    began = time.monotonic()
    data: dict[str, Any] = {
        "meta": {
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python -m bench.aio "
            + " ".join(argv if argv is not None else sys.argv[1:]),
            "commit": git_commit(),
            "cpus": os.cpu_count(),
            "load_before": loadavg(),
            "tasks": args.tasks,
            "rounds": args.rounds,
        }
    }
    data["throughput"] = throughput(
        args.tasks, args.rounds, args.concurrency or [8, 64], args.wait_ms or [0.0, 5.0], systems
    )
    if args.latency_tasks:
        log(f"latency: {args.latency_tasks:,} tasks, {args.rounds} round(s)")
        data["latency"] = latency.measure(
            LATENCY_CONFIGS,
            tasks=args.latency_tasks,
            rounds=args.rounds,
            capacity_tasks=args.latency_tasks,
            load=0.5,
            max_seconds=30.0,
            log=log,
        )
    data["meta"] |= {"load_after": loadavg(), "seconds": round(time.monotonic() - began, 1)}
    args.out.mkdir(parents=True, exist_ok=True)
    payload = json.dumps(data, indent=2, default=str) + "\n"
    (args.out / "aio.json").write_text(payload)
    (args.out / "raw").mkdir(exist_ok=True)
    (args.out / "raw" / f"{dt.datetime.now():%Y%m%d-%H%M%S}-aio.json").write_text(payload)
    text = render(data)
    (args.out / "aio.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
