"""taskcustody benchmarks: one command writes bench/results/latest.{md,png,json}.

    python -m bench            # full: 20,000 tasks, 3 rounds, recovery at 0/100k/1M keys
    python -m bench --quick    # a minute or two (once the peers' venvs exist): quick.{md,png,json}

A quick run writes bench/results/quick.*, a partial one (--only, --only-kind, --peers,
--skip-peers) bench/results/raw/ only: only the full run replaces latest.* and summary.md
(results_stem).

Everything runs against throwaway redis-servers this command starts on free ports (never the
shared 6379). Peers run from their own virtual environments under bench/.venvs/, created on first
use. Benchmarks are never timed assertions in the test suite.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/run.py`: make the `bench` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import checker, latency, profile_cycle, recovery, report
from bench.drivers import PREFETCH
from bench.harness import BENCH_DIR, REPO_DIR, DriverError, RedisServer, run_driver
from bench.peerenv import PEERS, Peer, driver_argv, ensure_venv, peer_python

RESULTS = BENCH_DIR / "results"

LOCAL_KINDS = [
    ("ours", "taskcustody full cycle", "ours"),
    ("ours-prefetch", f"taskcustody full cycle, prefetch {PREFETCH}", "ours"),
    ("ours-wallclock", "taskcustody, WallClock (diagnostic)", "diag"),
    ("blpop", "raw BLPOP loop", "floor"),
    ("blmove-lrem", "raw BLMOVE + LREM loop", "floor"),
]
CONCURRENCY = [
    ("1 worker", "threads", 1),
    ("4 threads", "threads", 4),
    ("2 processes", "processes", 2),
]


def log(msg: str) -> None:
    print(msg, flush=True)


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_DIR,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src", "bench"],
            cwd=REPO_DIR,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return out + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def library_available() -> bool:
    return importlib.util.find_spec("taskcustody") is not None


def throughput_configs(args: argparse.Namespace) -> list[dict[str, Any]]:
    configs: list[dict[str, Any]] = []
    for kind, label, group in LOCAL_KINDS:
        if kind.startswith("ours") and not library_available():
            log("  taskcustody is not importable: our rows are skipped")
            continue
        if args.only_kind and kind not in args.only_kind:
            continue
        if group == "diag" and kind not in (args.only_kind or []):
            continue  # diagnostics run only when asked for by name
        for conc_label, mode, n in CONCURRENCY:
            if group == "diag" and n != 1:
                continue
            configs.append(
                {
                    "key": f"{kind}/{conc_label}",
                    "kind": kind,
                    "label": label,
                    "group": group,
                    "concurrency": conc_label,
                    "tasks": args.tasks,
                    "argv": [
                        sys.executable,
                        "-m",
                        "bench.drivers",
                        "--kind",
                        kind,
                        "--mode",
                        mode,
                        "--concurrency",
                        str(n),
                    ],
                }
            )
    for peer in PEERS:
        if args.skip_peers or (args.peers and peer.name not in args.peers):
            continue
        if args.only_kind and peer.name not in args.only_kind:
            continue
        tasks = min(args.tasks, peer.max_tasks) if args.quick and peer.max_tasks else args.tasks
        configs.append(
            {
                "key": f"peer/{peer.name}",
                "kind": peer.name,
                "label": peer.label,
                "group": "peer",
                "concurrency": "1 process",
                "floor_concurrency": peer.floor,
                "tasks": tasks,
                "peer": peer,
            }
        )
    return configs


def run_throughput(args: argparse.Namespace) -> list[dict[str, Any]]:
    configs = throughput_configs(args)
    for cfg in configs:
        if "peer" in cfg:
            peer: Peer = cfg["peer"]
            cfg["python"] = peer_python(peer, log)
    results: dict[str, dict[str, Any]] = {}
    with RedisServer(debug_command=False) as srv:
        for rnd in range(args.rounds):
            shift = rnd % max(1, len(configs))
            for cfg in configs[shift:] + configs[:shift]:  # rotate: spread the noise
                if "peer" in cfg:
                    argv = driver_argv(cfg["peer"], cfg["python"], srv.url, cfg["tasks"])
                else:
                    argv = [*cfg["argv"], "--url", srv.url, "--tasks", str(cfg["tasks"])]
                began = time.monotonic()
                try:
                    res = run_driver(argv, srv, timeout=60 + cfg["tasks"] / 40, log=lambda m: None)
                except DriverError as exc:
                    log(f"  round {rnd + 1}: {cfg['key']} FAILED: {str(exc)[:800]}")
                    continue
                row = results.setdefault(
                    cfg["key"],
                    {k: v for k, v in cfg.items() if k not in ("argv", "peer", "python")}
                    | {"rates": [], "by_round": {}, "counts": None},
                )
                if res.extra.get("committed") not in (None, cfg["tasks"]):
                    log(
                        f"  round {rnd + 1}: {cfg['key']}: committed {res.extra['committed']} "
                        f"of {cfg['tasks']} tasks: not counted"
                    )
                    continue
                row["rates"].append(res.rate)
                row["by_round"][str(rnd)] = res.rate
                if row["counts"] is None and res.counts is not None:
                    row["counts"] = res.counts.to_json()
                for k in ("version", "config"):
                    if k in res.extra:
                        row[k] = res.extra[k]
                log(
                    f"  round {rnd + 1}/{args.rounds}: {cfg['label']} [{cfg['concurrency']}]: "
                    f"{res.rate:,.0f} tasks/s"
                    + (
                        f", {res.counts.round_trips:.2f} RT, {res.counts.commands:.2f} cmd per task"
                        if res.counts
                        else ""
                    )
                    + f" ({time.monotonic() - began:.1f} s wall)"
                )
    rows = []
    for row in results.values():
        rates = row["rates"]
        row.update(median=statistics.median(rates), min=min(rates), max=max(rates))
        rows.append(row)
    report.add_ratios(rows)
    return rows


def results_stem(quick: bool, partial: bool, stamp: str = "") -> str:
    """Where a run of `python -m bench` writes its .md, .json and .png: a path relative to the
    results directory, without the suffix. The full run: `latest` (and only it rewrites
    summary.md, the short form); `--quick`: `quick`; a partial run (`--only`,
    `--only-kind`, `--peers`, `--skip-peers`), quick or not: `raw/<stamp>[-quick]-partial`.
    Every run also keeps its JSON in raw/."""
    if partial:
        return f"raw/{stamp}" + ("-quick" if quick else "") + "-partial"
    return "quick" if quick else "latest"


def run_latency(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The latency part (bench/latency.py): `--latency-tasks` (default 5,000; quick 1,000) at
    half capacity, `--rounds` rounds, the configurations --only-kind/--peers/--skip-peers leave.
    A run of every configuration, not --quick, also writes latency.{md,json} (latency_stem)."""
    sizes = latency.QUICK if args.quick else latency.DEFAULTS
    configs = latency.select(only_kind=args.only_kind, peers=args.peers, skip_peers=args.skip_peers)
    if not library_available():
        configs = [c for c in configs if c.group != "ours"]
    if not configs:
        log("latency: no configuration left by --only-kind/--peers/--skip-peers")
        return {"rows": []}
    tasks = args.latency_tasks or sizes["tasks"]
    log(
        f"latency: {tasks:,} tasks at {sizes['load']:g} x capacity, {args.rounds} round(s), "
        f"{', '.join(c.key for c in configs)}"
    )
    began = time.monotonic()
    load_before = loadavg()
    result = latency.measure(
        configs,
        tasks=tasks,
        rounds=args.rounds,
        capacity_tasks=sizes["capacity_tasks"],
        load=sizes["load"],
        max_seconds=sizes["max_seconds"],
        capacity_mode=sizes["capacity"],
        log=log,
    )
    result["meta"] = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench"
        + (" --quick" if args.quick else "")
        + " (latency part"
        + (f", --latency-tasks {tasks}" if args.latency_tasks else "")
        + ")",
        "commit": git_commit(),
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "load_after": loadavg(),
        "seconds": round(time.monotonic() - began, 1),
    }
    stem = latency.latency_stem(
        quick=args.quick,
        partial=len(configs) != len(latency.CONFIGS),
        stamp=dt.datetime.now().strftime("%Y%m%d-%H%M%S"),
    )
    if stem == "latency":  # otherwise the figures are in this run's own files only
        latency.write(result, out, stem)
    return result


def chart_python() -> str:
    if importlib.util.find_spec("matplotlib") is not None:
        return sys.executable
    return str(ensure_venv("chart", BENCH_DIR / "requirements.txt", log))


def write_outputs(data: dict[str, Any], out: Path, target: Path, json_path: Path) -> str:
    md = report.markdown(data)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.with_suffix(".md").write_text(md + "\n")
    if target == out / "latest":
        (out / "summary.md").write_text(report.summary(data) + "\n")
    png = target.with_suffix(".png")
    try:
        subprocess.run(
            [chart_python(), str(BENCH_DIR / "chart.py"), str(json_path), str(png)], check=True
        )
        log(f"wrote {target.with_suffix('.md')} and {png}")
    except (subprocess.CalledProcessError, OSError) as exc:
        log(f"wrote {target.with_suffix('.md')}; chart failed: {exc}")
    return md


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a minute or two: fewer tasks, 1 round; writes results/quick.*",
    )
    ap.add_argument("--tasks", type=int, help="tasks per drain (default 20000; quick 2000)")
    ap.add_argument("--rounds", type=int, help="rounds per configuration (default 3; quick 1)")
    ap.add_argument(
        "--only",
        action="append",
        choices=["throughput", "latency", "recovery", "checker", "profile"],
        help="run only these parts (repeatable)",
    )
    ap.add_argument(
        "--only-kind",
        action="append",
        help="throughput and latency: only these workloads (ours, ours-prefetch, "
        "blpop, blmove-lrem, a peer)",
    )
    ap.add_argument(
        "--latency-tasks", type=int, help="tasks per latency run (default 5000; quick 1000)"
    )
    ap.add_argument("--peers", action="append", help="only these peers (repeatable)")
    ap.add_argument("--skip-peers", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where latest.*/quick.* go")
    ap.add_argument(
        "--loaded",
        action="store_true",
        help="say in the results that the machine was shared with other work",
    )
    ap.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="only re-write the .md (and summary.md) and .png of a results JSON, "
        "where its run wrote them (latest, quick or raw/)",
    )
    args = ap.parse_args(argv)
    if args.render:
        data = json.loads(args.render.read_text())
        report.add_ratios(data.get("throughput", []))
        meta = data.get("meta", {})
        # A partial run's files sit beside its JSON in raw/; the others go where results_stem
        # says (a JSON without meta.partial, from before it existed, is taken as not partial).
        target = (
            args.render.with_suffix("")
            if meta.get("partial")
            else args.out / results_stem(bool(meta.get("quick")), False)
        )
        write_outputs(data, args.out, target, json_path=args.render)
        return 0
    args.tasks = args.tasks or (2_000 if args.quick else 20_000)
    args.rounds = args.rounds or (1 if args.quick else 3)
    parts = set(args.only or ["throughput", "latency", "recovery", "checker", "profile"])
    # A partial run (--only, --only-kind, --peers, --skip-peers) never replaces latest.*.
    partial = bool(args.only or args.only_kind or args.peers or args.skip_peers)
    if "ours" in (args.only_kind or []) and not library_available():
        log("taskcustody is not importable; pip install -e . first")
        return 2

    started = time.monotonic()
    data: dict[str, Any] = {
        "meta": {
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python -m bench"
            + (" --quick" if args.quick else "")
            + (f" --tasks {args.tasks}" if args.tasks not in (2_000, 20_000) else ""),
            "commit": git_commit(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "quick": args.quick,
            "partial": partial,
            "tasks": args.tasks,
            "rounds": args.rounds,
            "load_before": loadavg(),
            # say so when asked, or when the 1-minute load average already exceeds the core count
            "loaded_note": args.loaded or os.getloadavg()[0] > (os.cpu_count() or 1),
        }
    }
    with RedisServer(debug_command=False) as probe:
        data["meta"]["redis_version"] = probe.version
    notes: list[str] = []

    sections: dict[str, float] = {}
    data["meta"]["section_seconds"] = sections
    mark = time.monotonic()

    def section(name: str) -> None:
        nonlocal mark
        sections[name] = round(time.monotonic() - mark, 1)
        mark = time.monotonic()

    if "throughput" in parts:
        log(f"throughput: {args.tasks:,} tasks, {args.rounds} round(s)")
        data["throughput"] = run_throughput(args)
        section("throughput")
        if args.quick and any(p.max_tasks for p in PEERS):
            notes.append(
                "--quick caps the slowest peers' drains: "
                + ", ".join(f"{p.name} {p.max_tasks:,} tasks" for p in PEERS if p.max_tasks)
                + "."
            )
    if "latency" in parts:
        data["latency"] = run_latency(args, args.out)
        section("latency")
    if "recovery" in parts and library_available():
        sizes = [0, 100_000, 1_000_000]
        reps = 2 if args.quick else 7
        log(f"recovery: {sizes} unrelated keys, {reps} repetitions")
        data["recovery"] = recovery.measure(sizes, reps, log) | {"reps": reps}
        section("recovery")
    if "checker" in parts:
        log("checker speed")
        data["checker"] = checker.measure(args.quick)
        log(f"  {json.dumps(data['checker'])[:300]}")
        section("checker")
    if "profile" in parts and library_available():
        n = 1_000 if args.quick else 10_000
        log(f"profile: one worker, {n:,} tasks")
        data["profile"] = profile_cycle.profile(n)
        section("profile")

    data["meta"]["load_after"] = loadavg()
    data["meta"]["seconds"] = round(time.monotonic() - started, 1)
    notes.append(
        "Each drain runs against a throwaway redis-server (127.0.0.1, no persistence) "
        "on the same 2-core machine as the workers, so client and server compete for "
        "CPU; figures are tasks per second of wall time from the first take to the last "
        "completion."
    )
    notes.append(
        f"The whole run took {data['meta']['seconds']:.0f} s ("
        + ", ".join(f"{k} {v:.0f} s" for k, v in sections.items())
        + ")."
    )
    data["notes"] = notes

    args.out.mkdir(parents=True, exist_ok=True)
    raw_dir = args.out / "raw"
    raw_dir.mkdir(exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = stamp + ("-quick" if args.quick else "") + ("-partial" if partial else "")
    target = args.out / results_stem(args.quick, partial, stamp)
    payload = json.dumps(data, indent=2, default=str)
    (raw_dir / f"{name}.json").write_text(payload)
    json_path = target.with_suffix(".json")
    json_path.write_text(payload)
    md = write_outputs(data, args.out, target, json_path)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
