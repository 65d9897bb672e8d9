"""The registry's garbage collection: what one sweep costs with 0, 1,000 and 100,000
dead registered lists, before and after they are collected, and what it cost before there was a
collection; and that the take's registration adds no round trip to the worker cycle.

    python -m bench.registry_gc                   # about a minute and a half
    python -m bench.registry_gc --skip-cycle      # the sweep part only

Writes bench/results/registry_gc.{md,json} (never latest.*). Runs against throwaway
redis-servers of its own (127.0.0.1, a free port, no persistence, killed with the benchmark).

Sweep part. The queue is written straight into Redis, rebuilt for every round:
* one live server ("live", 4 workers): registered with a deadline the run never reaches, its 4
  lists registered now, each holding one task with its processing record;
* N dead registered lists: registry entries an hour old whose owners (server id, incarnation) are
  not registered, the lists themselves empty (absent), as restarts and crashes leave them.
The sweeper is the live server, at the same simulated time as the build; the sweep is the
library's own `taskcustody.core.recovery.sweep`, with the default `Settings.registry_grace` and
`drain_chunk` (what `Server.sweep` passes). Per round, on the same state:
1. GC off: the same sweep with a grace so large that nothing is old enough; it changes
   nothing, so every sweep without the collection costs this. (An earlier sweep also
   read each list's length in a round trip of its own, not 100 per round trip: it cost more
   than this row; that code is not measured here.)
2. first sweep with GC: it forgets the N dead lists;
3. the next LATER sweeps with GC: what every later sweep costs.
Round trips are the sweeping client's socket writes (`bench.harness.counting_client`); Redis's
`total_reads_processed` is shown next to them (it reads a large script call in pieces). Commands
are `INFO commandstats` deltas after `CONFIG RESETSTAT`, including those the scripts ran.

Cycle part: `bench.run`'s throughput drains of our rows only (`ours`, `ours-prefetch`, at its
three concurrencies, no peers), the same as
`python -m bench --only throughput --only-kind ours --only-kind ours-prefetch`, compared with the
counts of bench/results/latest.json (a run from before the take registered its list). Then one
worker's socket writes per task, counted on the client, with and without the take's ZADD.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/registry_gc.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (
    BENCH_DIR,
    RedisServer,
    counting_client,
    counts_since_reset,
    parse_sizes,
    rerender,
)
from taskcustody import QueueKeys, Settings, connect
from taskcustody.core import recovery
from taskcustody.core.envelope import new_task
from taskcustody.core.keys import ListOwner

RESULTS = BENCH_DIR / "results"
QUEUE = "gcq"
WORKERS = 4
T0 = 1_000_000.0  # simulated time of the build and of every sweep
FAR = T0 + 10**9  # the live server's registration deadline: never reached
AGE = 3600.0  # how old the dead lists' registrations are (the default grace is 60 s)
NO_GC_GRACE = 10.0**12  # "no GC": no registration is that old
ME = recovery.ServerIdentity("live", 7)
MEMBERS_PER_ZADD = 2_000
ZADDS_PER_PIPELINE = 2
PHASES = [
    ("no_gc", "GC off (every sweep pays this)"),
    ("first", "first sweep with GC (collects them)"),
    ("next", "next sweeps with GC (after the collection)"),
]
#: Sweeps after the collection per round: sub-millisecond times need more than one sample.
LATER = 10


def dead_list(keys: QueueKeys, i: int) -> str:
    """The i-th dead list: 16 server ids, each restarted many times (a new incarnation each),
    WORKERS lists per incarnation."""
    incarnation = 1_000 + i // WORKERS
    return keys.inflight(ListOwner(f"d{incarnation % 16}", incarnation, f"w{i % WORKERS}"))


def live_lists(keys: QueueKeys) -> list[str]:
    return [keys.inflight(ListOwner(ME.server_id, ME.incarnation, f"w{w}")) for w in range(WORKERS)]


def build(client: Any, keys: QueueKeys, dead: int) -> None:
    client.flushall()
    pipe = client.pipeline(transaction=False)
    pipe.zadd(keys.servers, {ME.server_id: FAR})
    pipe.hset(keys.incarnations, ME.server_id, ME.incarnation)
    for w, list_key in enumerate(live_lists(keys)):
        task = new_task({"n": w}, T0, task_id=f"live-{w}")
        pipe.lpush(list_key, task.raw)
        pipe.hset(keys.processing, task.id, f"{list_key} {T0!r}")
        pipe.zadd(keys.inflight_registry, {list_key: T0})
    pipe.execute()
    for start in range(0, dead, MEMBERS_PER_ZADD * ZADDS_PER_PIPELINE):
        end = min(dead, start + MEMBERS_PER_ZADD * ZADDS_PER_PIPELINE)
        for lo in range(start, end, MEMBERS_PER_ZADD):
            hi = min(end, lo + MEMBERS_PER_ZADD)
            pipe.zadd(keys.inflight_registry, {dead_list(keys, i): T0 - AGE for i in range(lo, hi)})
        pipe.execute()
    assert int(client.zcard(keys.inflight_registry)) == dead + WORKERS


def one_sweep(
    counted: Any, counter: Any, admin: Any, keys: QueueKeys, grace: float
) -> dict[str, Any]:
    chunk = Settings().drain_chunk
    admin.config_resetstat()
    counter.writes = 0
    began = time.perf_counter()
    report = recovery.sweep(counted, keys, T0, ME, chunk=chunk, grace=grace)
    seconds = time.perf_counter() - began
    writes = counter.writes
    server = counts_since_reset(admin)
    return {
        "ms": seconds * 1000,
        "round_trips": writes,
        "server_reads": server["reads"],
        "commands": server["commands"],
        "scripts": server["scripts"],
        "by_command": server["by_command"],
        "forgotten": len(report.forgotten_lists),
        "drained": report.moved,
        "pruned": len(report.pruned),
        "requeued": report.requeued_stuck,
    }


def check(
    client: Any, keys: QueueKeys, row: dict[str, Any], *, forgotten: int, registered: int, what: str
) -> None:
    """The sweep did what it should, and nothing else: a live server's tasks stay put."""
    problems = []
    if row["forgotten"] != forgotten:
        problems.append(f"forgot {row['forgotten']} lists, expected {forgotten}")
    if int(client.zcard(keys.inflight_registry)) != registered:
        problems.append(
            f"{client.zcard(keys.inflight_registry)} lists registered, expected {registered}"
        )
    if row["drained"] or row["pruned"] or row["requeued"] or int(client.llen(keys.queue)):
        problems.append("it moved, pruned or requeued something")
    if any(int(client.llen(k)) != 1 for k in live_lists(keys)):
        problems.append("a live list lost its task")
    if problems:
        raise RuntimeError(f"{what}: " + "; ".join(problems))


def measure_sweeps(sizes: list[int], rounds: int, log: Any = print) -> list[dict[str, Any]]:
    keys = QueueKeys(QUEUE)
    grace = Settings().registry_grace
    rows: list[dict[str, Any]] = []
    with RedisServer(debug_command=False) as srv:
        client = connect(srv.url)
        counted, counter = counting_client(client)
        counted.ping()  # the connection's handshake is not the sweep's
        # Warm-up: Redis compiles each script the first time it sees it (EVAL).
        build(client, keys, 100)
        one_sweep(counted, counter, srv.client, keys, grace)
        for n in sizes:
            runs: dict[str, list[dict[str, Any]]] = {p: [] for p, _ in PHASES}
            for rnd in range(rounds):
                began = time.monotonic()
                build(client, keys, n)
                built = time.monotonic() - began
                for phase, _ in PHASES:
                    for _ in range(LATER if phase == "next" else 1):
                        row = one_sweep(
                            counted,
                            counter,
                            srv.client,
                            keys,
                            NO_GC_GRACE if phase == "no_gc" else grace,
                        )
                        check(
                            client,
                            keys,
                            row,
                            forgotten=n if phase == "first" else 0,
                            registered=n + WORKERS if phase == "no_gc" else WORKERS,
                            what=f"{n} dead lists, {phase}",
                        )
                        runs[phase].append(row)
                log(
                    f"  {n:>7,} dead lists, round {rnd + 1}/{rounds} (built in {built:.1f} s): "
                    + ", ".join(
                        f"{p} {runs[p][-1]['ms']:.1f} ms / {runs[p][-1]['round_trips']} RT"
                        for p, _ in PHASES
                    )
                )
            for phase, label in PHASES:
                rows.append(summarise(n, phase, label, runs[phase]))
        counted.close()
        client.close()
    return rows


def summarise(n: int, phase: str, label: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    def med(field: str) -> float:
        return float(statistics.median(r[field] for r in runs))

    ms = [r["ms"] for r in runs]
    return {
        "dead_lists": n,
        "phase": phase,
        "label": label,
        "rounds": len(runs),
        "median_ms": statistics.median(ms),
        "min_ms": min(ms),
        "max_ms": max(ms),
        "round_trips": med("round_trips"),
        "server_reads": med("server_reads"),
        "commands": med("commands"),
        "scripts": med("scripts"),
        "forgotten": med("forgotten"),
        "by_command": runs[0]["by_command"],
        "runs": runs,
    }


# -- the worker cycle ----------------------------------------------------------------------------


def measure_cycle(tasks: int, rounds: int, baseline_path: Path) -> dict[str, Any]:
    """Our throughput rows through bench.run's own machinery, compared with the baseline's."""
    from bench import run

    args = argparse.Namespace(
        only_kind=["ours", "ours-prefetch"],
        skip_peers=True,
        peers=None,
        quick=False,
        tasks=tasks,
        rounds=rounds,
    )
    rows = run.run_throughput(args)
    baseline = json.loads(baseline_path.read_text())
    before = {r["key"]: r for r in baseline.get("throughput", [])}
    out = []
    for row in rows:
        old = before.get(row["key"])
        now = row["counts"]
        out.append(
            {
                "key": row["key"],
                "label": row["label"],
                "concurrency": row["concurrency"],
                "tasks": row["tasks"],
                "median_rate": row["median"],
                "round_trips": now["round_trips"],
                "commands": now["commands"],
                "zadd": now["by_command"].get("zadd", 0.0),
                "baseline_round_trips": old["counts"]["round_trips"] if old else None,
                "baseline_commands": old["counts"]["commands"] if old else None,
                "baseline_zadd": old["counts"]["by_command"].get("zadd", 0.0) if old else None,
            }
        )
    return {
        "baseline": str(baseline_path.relative_to(BENCH_DIR.parent)),
        "baseline_meta": {
            k: baseline.get("meta", {}).get(k) for k in ("date", "commit", "command")
        },
        "tasks": tasks,
        "rounds": rounds,
        "rows": out,
    }


def writes_per_task(
    url: str, admin: Any, tasks: int, prefetch: int, register: bool
) -> dict[str, Any]:
    """One worker drains `tasks` no-op tasks; its socket writes (round trips) and Redis's
    commands per task. `register=False`: the same worker with `Worker.registration` returning
    None, i.e. the take without its ZADD (prefetch 1 only: with prefetch the ZADD is inside the
    take script)."""
    from taskcustody import Producer, Server, Worker

    settings = Settings(block_timeout=0.5, socket_timeout_margin=2.0, prefetch=prefetch)
    client = connect(url, settings)
    counted, counter = counting_client(client)
    keys = QueueKeys("cycleq")
    admin.flushall()
    Producer(client, keys).enqueue_many(range(tasks))
    handled = [0]

    def handler(payload: Any) -> None:
        handled[0] += 1

    original = Worker.registration
    if not register:
        Worker.registration = lambda self: None  # type: ignore[method-assign,assignment]
    try:
        (worker,) = Server(counted, keys, "cyc", handler, workers=1, settings=settings).start()
        admin.config_resetstat()
        counter.writes = 0
        while handled[0] < tasks:
            worker.run_once(timeout=0.5)
        writes = counter.writes
        server = counts_since_reset(admin)
        worker.close()
    finally:
        Worker.registration = original  # type: ignore[method-assign]
    counted.close()
    client.close()
    return {
        "prefetch": prefetch,
        "register": register,
        "tasks": tasks,
        "writes": writes / tasks,
        "server_reads": server["reads"] / tasks,
        "commands": server["commands"] / tasks,
        "zadd": server["by_command"].get("zadd", 0) / tasks,
    }


def measure_writes(tasks: int) -> list[dict[str, Any]]:
    with RedisServer(debug_command=False) as srv:
        return [
            writes_per_task(srv.url, srv.client, tasks, prefetch, register)
            for prefetch, register in ((1, False), (1, True), (8, True))
        ]


# -- report --------------------------------------------------------------------------------------


def render(result: dict[str, Any]) -> str:
    lines = [
        "# Registry garbage collection: sweep cost with dead registered lists",
        "",
        f"Run {result['when']}: `{result['command']}` at commit `{result['commit']}`, Redis "
        f"{result['redis_version']}, {result['host']}, load average before/after "
        f"{result['load_before']} / {result['load_after']} (2 cores shared with other work: "
        "times are noisy; round trips and commands are exact).",
        "",
        f"One live server ({WORKERS} workers, one task each) sweeps "
        "(`taskcustody.core.recovery.sweep`, default grace "
        f"{result['grace']:g} s) a queue with N dead registered lists: registry entries "
        f"{AGE:g} s old whose owners are not live, the lists empty. State written straight "
        "into a throwaway redis-server and rebuilt every round; each round runs the sweeps "
        f"below in this order on it (the next sweeps: {result.get('later', 1)} in a row). "
        "*GC off* = the same sweep with a grace nothing is "
        "old enough for: it changes nothing, so without the collection every sweep costs this "
        "(an earlier sweep also read each list's length in a round trip of its own, "
        f"not {recovery.BATCH} per round trip, so it cost more; that code is not measured "
        "here). Round trips: the sweeping client's socket writes; server "
        "reads: Redis's `total_reads_processed` (it reads a large script call in pieces); "
        "commands: `INFO commandstats` deltas, including those run inside scripts.",
        "",
        f"## One sweep (median of {result['rounds']} rounds; the next sweeps: of "
        f"{result['rounds']} x {result.get('later', 1)})",
        "",
        "| dead lists | sweep | ms: median (min - max) | round trips | server reads | commands "
        "| scripts | lists forgotten |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["sweeps"]:
        lines.append(
            f"| {row['dead_lists']:,} | {row['label']} | {row['median_ms']:,.1f} "
            f"({row['min_ms']:,.1f} - {row['max_ms']:,.1f}) | {row['round_trips']:,.0f} | "
            f"{row['server_reads']:,.0f} | {row['commands']:,.0f} | {row['scripts']:,.0f} | "
            f"{row['forgotten']:,.0f} |"
        )
    by = {(r["dead_lists"], r["phase"]): r for r in result["sweeps"]}
    sizes = sorted({r["dead_lists"] for r in result["sweeps"]})
    base = by.get((0, "next"))
    if base is not None:
        lines += ["", "After the collection, against 0 dead lists:", ""]
        for n in sizes[1:]:
            after, old = by[(n, "next")], by[(n, "no_gc")]
            lines.append(
                f"- {n:,} dead lists: next sweeps {after['median_ms']:.1f} ms vs "
                f"{base['median_ms']:.1f} ms ({after['median_ms'] / base['median_ms']:.2f}x), "
                f"{after['round_trips']:.0f} vs {base['round_trips']:.0f} round trips, "
                f"{after['commands']:.0f} vs {base['commands']:.0f} commands; without GC every "
                f"sweep cost {old['median_ms']:,.1f} ms, {old['round_trips']:,.0f} round trips, "
                f"{old['commands']:,.0f} commands."
            )
    first = [by[(n, "first")] for n in sizes if n]
    if first:
        lines += [
            "",
            "The first sweep pays once for the collection: one `FORGET_DEAD_EMPTY_LISTS` "
            f"script per {recovery.BATCH} candidates (each re-checks ZSCORE, LLEN and the "
            "owner's registration, then ZREMs). Without GC, a sweep reads every dead list's "
            f"length, {recovery.BATCH} LLEN per pipelined round trip, on every sweep.",
        ]
    cycle = result.get("cycle")
    if cycle:
        meta = cycle["baseline_meta"]
        lines += [
            "",
            "## The take's registration: cost per task of the worker cycle",
            "",
            f"`bench.run`'s throughput drains of our rows only ({cycle['tasks']:,} no-op tasks, "
            f"{cycle['rounds']} round(s), the same as `python -m bench --only throughput "
            "--only-kind ours --only-kind ours-prefetch`), against "
            f"`{cycle['baseline']}` (run {meta['date']}, commit `{meta['commit']}`, before the "
            "take registered its list). RT/task is Redis's `total_reads_processed` per task, "
            "as in latest.md: it depends on how a command sent without waiting coalesces with "
            "the next one, so it moves a little from run to run (more with several workers).",
            "",
            "| workload | concurrency | RT/task | RT/task before | cmd/task | cmd/task before "
            "| ZADD/task | tasks/s (noisy) |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for row in cycle["rows"]:

            def fmt(v: float | None) -> str:
                return "-" if v is None else f"{v:.2f}"

            lines.append(
                f"| {row['label']} | {row['concurrency']} | {row['round_trips']:.2f} | "
                f"{fmt(row['baseline_round_trips'])} | {row['commands']:.2f} | "
                f"{fmt(row['baseline_commands'])} | {row['zadd']:.2f} | "
                f"{row['median_rate']:,.0f} |"
            )
    writes = result.get("writes")
    if writes:
        lines += [
            "",
            f"Counted on the client, one worker, {writes[0]['tasks']:,} no-op tasks per row "
            "(`writes_per_task`): the take with and without its registration, in the same run. "
            "Writes are the worker connection's socket writes, i.e. round trips.",
            "",
            "| prefetch | take | writes (round trips)/task | server reads/task | cmd/task "
            "| ZADD/task |",
            "|---:|---|---:|---:|---:|---:|",
        ]
        for row in writes:
            take = (
                "ZADD + BLMOVE in one write"
                if row["register"] and row["prefetch"] == 1
                else "BLMOVE alone (`Worker.registration` -> None)"
                if not row["register"]
                else "take script (ZADD inside), one pipeline per batch"
            )
            lines.append(
                f"| {row['prefetch']} | {take} | {row['writes']:.3f} | "
                f"{row['server_reads']:.3f} | {row['commands']:.3f} | {row['zadd']:.3f} |"
            )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.registry_gc",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--sizes", default="0,1000,100000", help="dead lists, comma-separated")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per size (median)")
    ap.add_argument("--skip-cycle", action="store_true", help="the sweep part only")
    ap.add_argument(
        "--cycle-tasks", type=int, default=20_000, help="tasks per drain of the cycle part"
    )
    ap.add_argument(
        "--writes-tasks", type=int, default=5_000, help="tasks per row of the client-side count"
    )
    ap.add_argument(
        "--baseline",
        type=Path,
        default=RESULTS / "latest.json",
        help="results JSON the cycle's counts are compared with",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="only rewrite the .md next to JSON from it (no measurement)",
    )
    args = ap.parse_args(argv)
    if args.render is not None:
        return rerender(args.render, render)
    sizes = sorted(set(parse_sizes(ap, args.sizes)))
    if any(s < 0 for s in sizes):
        ap.error("--sizes: no negative sizes")
    if args.rounds < 1 or args.cycle_tasks < 1 or args.writes_tasks < 1:
        ap.error("--rounds, --cycle-tasks and --writes-tasks must be >= 1")
    if not args.skip_cycle and not args.baseline.is_file():
        print(f"no baseline at {args.baseline} (--baseline, or --skip-cycle)", file=sys.stderr)
        return 1
    from bench.run import git_commit, loadavg

    started = time.monotonic()
    result: dict[str, Any] = {
        "when": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench.registry_gc"
        + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:])),
        "commit": git_commit(),
        "load_before": loadavg(),
        "host": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}",
        "grace": Settings().registry_grace,
        "workers": WORKERS,
        "age_s": AGE,
        "rounds": args.rounds,
        "later": LATER,
    }
    with RedisServer(debug_command=False) as probe:
        result["redis_version"] = probe.version
    print(f"sweeps: {sizes} dead lists, {args.rounds} rounds", flush=True)
    result["sweeps"] = measure_sweeps(sizes, args.rounds)
    if not args.skip_cycle:
        print(f"cycle: our rows, {args.cycle_tasks:,} tasks", flush=True)
        result["cycle"] = measure_cycle(args.cycle_tasks, 1, args.baseline)
        print(f"writes: one worker, {args.writes_tasks:,} tasks", flush=True)
        result["writes"] = measure_writes(args.writes_tasks)
    result["load_after"] = loadavg()
    result["elapsed_s"] = time.monotonic() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "registry_gc.json").write_text(json.dumps(result, indent=2) + "\n")
    md = render(result)
    (args.out / "registry_gc.md").write_text(md)
    print(md)
    print(f"wrote {args.out / 'registry_gc.md'} and .json in {result['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
