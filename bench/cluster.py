"""Aggregate throughput of 3 queues on 3 cluster masters against 1 queue on a single node.

    python -m bench.cluster                      # 3 x 4,000 tasks x 3 rounds, about a minute
    python -m bench.cluster --tasks 2000 --rounds 3

Starts a throwaway Redis Cluster (3 masters, 3 replicas; tests/support/redis_cluster.py) and a
throwaway single redis-server, both on 127.0.0.1 and free ports, stopped by pid at the end. Each
round runs, back to back, so that background noise falls on both:

* cluster: 3 queues whose slots live on 3 different masters (picked with CLUSTER KEYSLOT), all
  reached through one seed node, each drained by one worker process (our `Server`, WORKERS
  threads);
* single: 1 queue on the single node, drained by 3 worker processes of the same shape.

So both sides have the same client processes and threads; what differs is whether the queues'
Redis work is spread over 3 masters or done by one. Each process enqueues nothing: the parent
enqueues every task first, then starts the processes; each reports the time of its first take and
of its last completion, and a side's throughput is its tasks over (last completion - first take)
across its processes. Reports medians and the per-round ratios, and writes
bench/results/cluster.{md,json}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from bench.harness import BENCH_DIR, REPO_DIR
from bench.run import git_commit, loadavg, log

RESULTS = BENCH_DIR / "results"
WORKERS = 2  # worker threads per process


def child(url: str, queue: str, sid: str) -> None:
    """One worker process: drain `queue` until it is empty; print first take and last done."""
    from taskcustody import QueueKeys, Server, Settings, WallClock, connect

    first: list[float] = []
    last = [0.0]
    lock = threading.Lock()

    def handler(payload: Any) -> None:
        now = time.time()
        with lock:
            if not first:
                first.append(now)
            last[0] = now

    settings = Settings(block_timeout=0.2, heartbeat_interval=5, sweep_interval=60)
    client = connect(url, settings)
    server = Server(
        client,
        QueueKeys(queue),
        sid,
        handler,
        workers=WORKERS,
        settings=settings,
        clock=WallClock(),
    )
    server.run(until_idle=True)
    print(json.dumps({"first": first[0] if first else None, "last": last[0]}), flush=True)


def enqueue(url: str, queue: str, tasks: int) -> None:
    from taskcustody import Producer, QueueKeys, connect

    Producer(connect(url), QueueKeys(queue)).enqueue_many({"n": i} for i in range(tasks))


def run_side(targets: list[tuple[str, str]], tasks_per_process: int, tag: str) -> dict[str, Any]:
    """Start one worker process per (url, queue) in `targets`; their tasks are enqueued first."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.cluster", "--child", url, queue, f"{tag}-{i}"],
            cwd=REPO_DIR,
            stdout=subprocess.PIPE,
        )
        for i, (url, queue) in enumerate(targets)
    ]
    reports = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"worker process exited {p.returncode}")
        reports.append(json.loads(out.decode().strip().splitlines()[-1]))
    start = min(r["first"] for r in reports)
    end = max(r["last"] for r in reports)
    total = tasks_per_process * len(targets)
    return {"tasks": total, "seconds": end - start, "tasks_per_s": total / (end - start)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        child(*argv[1:4])
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.cluster")
    ap.add_argument("--tasks", type=int, default=4000, help="tasks per queue of the cluster")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)

    sys.path.insert(0, str(REPO_DIR))
    from tests.support.redis_cluster import tags_on_distinct_masters, throwaway_cluster
    from tests.support.redis_server import throwaway_redis_server

    started = dt.datetime.now(dt.timezone.utc)
    meta = {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "loadavg_before": loadavg(),
        "tasks_per_queue": args.tasks,
        "rounds": args.rounds,
        "workers_per_process": WORKERS,
    }
    rounds: list[dict[str, Any]] = []
    with throwaway_cluster() as cluster, throwaway_redis_server() as single:
        seed = cluster.url(0)
        meta["redis"] = single.url
        for r in range(args.rounds):
            names = [f"{n}r{r}" for n in tags_on_distinct_masters(cluster, f"bench{r}x")]
            for name in names:
                enqueue(seed, name, args.tasks)
            c = run_side([(seed, n) for n in names], args.tasks, f"c{r}")
            single_queue = f"bench{r}"
            enqueue(single.url, single_queue, 3 * args.tasks)
            # 3 processes share the one queue: each drains until it finds it empty
            s = run_side([(single.url, single_queue)] * 3, args.tasks, f"s{r}")
            ratio = c["tasks_per_s"] / s["tasks_per_s"]
            rounds.append({"cluster": c, "single": s, "ratio": ratio})
            log(
                f"round {r + 1}: cluster {c['tasks_per_s']:,.0f} tasks/s, single "
                f"{s['tasks_per_s']:,.0f} tasks/s, ratio {ratio:.2f}x"
            )
    meta["loadavg_after"] = loadavg()
    med_c = statistics.median(x["cluster"]["tasks_per_s"] for x in rounds)
    med_s = statistics.median(x["single"]["tasks_per_s"] for x in rounds)
    summary = {
        "cluster_median": med_c,
        "single_median": med_s,
        "ratio_of_medians": med_c / med_s,
        "median_ratio": statistics.median(x["ratio"] for x in rounds),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "cluster.json").write_text(
        json.dumps({"meta": meta, "rounds": rounds, "summary": summary}, indent=2)
    )
    lines = [
        f"# 3 queues on 3 cluster masters vs 1 queue on a single node ({meta['date']}, commit "
        f"{meta['commit']}, load average {meta['loadavg_before']} -> {meta['loadavg_after']})",
        "",
        f"`python -m bench.cluster --tasks {args.tasks} --rounds {args.rounds}`: "
        f"{args.tasks:,} no-op tasks per queue; 3 worker processes of {WORKERS} threads on "
        "each side.",
        "",
        "| round | cluster tasks/s | single tasks/s | ratio |",
        "|---:|---:|---:|---:|",
    ]
    for i, x in enumerate(rounds, 1):
        lines.append(
            f"| {i} | {x['cluster']['tasks_per_s']:,.0f} | "
            f"{x['single']['tasks_per_s']:,.0f} | {x['ratio']:.2f}x |"
        )
    lines += [
        "",
        f"Medians: cluster {med_c:,.0f} tasks/s, single {med_s:,.0f} tasks/s; ratio of "
        f"medians {summary['ratio_of_medians']:.2f}x, median of ratios "
        f"{summary['median_ratio']:.2f}x.",
        "",
    ]
    (RESULTS / "cluster.md").write_text("\n".join(lines))
    log("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
