"""What `Settings(min_replicas=1)` costs: our worker on a local primary with one replica.

    python -m bench.replicas                    # 5,000 tasks x 5 rounds, about a minute
    python -m bench.replicas --tasks 2000 --rounds 5

Starts a throwaway primary and a replica of it (127.0.0.1, free ports, no persistence, both
stopped with the benchmark), then drains the same no-op tasks with our full cycle at
min_replicas 0 and 1, alternating within each round so that background noise falls on both:
one worker, four worker threads, and one worker with prefetch 8. Same driver and handshake as
`python -m bench` (bench/drivers.py, bench/harness.py): tasks/s from the first take to the last
completion; WAITs per task from the primary's command statistics; round trips per task = socket
reads the primary processed per task, less the replica's REPLCONF ACKs: each WAIT makes the
primary ask the replica for its offset (REPLCONF GETACK), and the replica's answer arrives as a
read on the primary like a client's command. Those are reported apart ("replica acks/task").
Reports the median of the rounds and writes bench/results/replicas.{md,json} (never latest.*).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from typing import Any

from bench.drivers import PREFETCH
from bench.harness import BENCH_DIR, DriverError, RedisServer, run_driver
from bench.run import git_commit, loadavg, log

RESULTS = BENCH_DIR / "results"
# (label, driver kind, threads)
CONFIGS = [
    ("1 worker", "ours", 1),
    ("4 threads", "ours", 4),
    (f"1 worker, prefetch {PREFETCH}", "ours-prefetch", 1),
]
PRIMARY_ARGS = ("--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0")
REPLICA_ARGS = ("--repl-diskless-load", "on-empty-db")


def wait_for_link(primary: RedisServer, replica: RedisServer, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        mine = replica.client.info("replication")
        slave = primary.client.info("replication").get("slave0")
        if (
            mine.get("master_link_status") == "up"
            and isinstance(slave, dict)
            and slave.get("state") == "online"
        ):
            return
        time.sleep(0.05)
    raise RuntimeError("the replica never linked to the primary")


def one_run(
    primary: RedisServer, kind: str, threads: int, tasks: int, min_replicas: int
) -> dict[str, Any]:
    argv = [
        sys.executable,
        "-m",
        "bench.drivers",
        "--kind",
        kind,
        "--mode",
        "threads",
        "--concurrency",
        str(threads),
        "--url",
        primary.url,
        "--tasks",
        str(tasks),
        "--min-replicas",
        str(min_replicas),
    ]
    res = run_driver(argv, primary, timeout=60 + tasks / 20)
    if res.extra.get("committed") != tasks:
        raise DriverError(f"committed {res.extra.get('committed')} of {tasks}")
    assert res.counts is not None
    acks = res.counts.by_command.get("replconf", 0.0)
    return {
        "rate": res.rate,
        "round_trips": res.counts.round_trips - acks,
        "acks": acks,
        "commands": res.counts.commands - acks,
        "waits": res.counts.by_command.get("wait", 0.0),
        "replica_warnings": res.extra.get("replica_warnings", 0),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tasks", type=int, default=5_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    began = time.monotonic()
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {}
    with (
        RedisServer(debug_command=False, extra_args=PRIMARY_ARGS) as primary,
        RedisServer(
            debug_command=False,
            extra_args=(*REPLICA_ARGS, "--replicaof", "127.0.0.1", str(primary.port)),
        ) as replica,
    ):
        wait_for_link(primary, replica)
        log(f"primary :{primary.port}, replica :{replica.port}, Redis {primary.version}")
        for rnd in range(args.rounds):
            for label, kind, threads in CONFIGS:
                order = (0, 1) if rnd % 2 == 0 else (1, 0)
                for n in order:
                    # run_driver flushes the primary; start from a replica that has caught up.
                    primary.flush()
                    if primary.client.wait(1, 30_000) != 1:
                        raise RuntimeError("the replica did not catch up")
                    row = one_run(primary, kind, threads, args.tasks, n)
                    runs.setdefault(label, {}).setdefault(n, []).append(row)
                    log(
                        f"  round {rnd + 1} {label:<22} min_replicas={n}: "
                        f"{row['rate']:8,.0f} tasks/s  {row['round_trips']:.2f} RT/task  "
                        f"{row['acks']:.2f} acks/task  "
                        f"{row['waits']:.2f} WAIT/task  warnings {row['replica_warnings']}"
                    )
    seconds = time.monotonic() - began
    summary = summarise(runs)
    meta = {
        "when": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench.replicas"
        + (
            ""
            if (args.tasks, args.rounds) == (5_000, 5)
            else f" --tasks {args.tasks} --rounds {args.rounds}"
        ),
        "redis": primary.version,
        "commit": git_commit(),
        "loadavg": loadavg(),
        "tasks": args.tasks,
        "rounds": args.rounds,
        "seconds": round(seconds, 1),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "replicas.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "runs": runs}, indent=2) + "\n"
    )
    text = render(meta, summary)
    (RESULTS / "replicas.md").write_text(text)
    print(text)
    return 0


def summarise(runs: dict[str, dict[int, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    rows = []
    for label, by_n in runs.items():
        medians = {
            n: {
                k: statistics.median(r[k] for r in rs)
                for k in ("rate", "round_trips", "acks", "commands", "waits")
            }
            | {
                "rates": [round(r["rate"]) for r in rs],
                "replica_warnings": sum(r["replica_warnings"] for r in rs),
            }
            for n, rs in by_n.items()
        }
        # Both settings ran back to back in every round: the ratio within a round is the
        # comparison least disturbed by whatever else the machine was doing at the time.
        paired = [one["rate"] / zero["rate"] for zero, one in zip(by_n[0], by_n[1], strict=True)]
        rows.append(
            {
                "config": label,
                "by_min_replicas": medians,
                "ratio": medians[1]["rate"] / medians[0]["rate"],
                "paired_ratios": [round(r, 2) for r in paired],
                "paired_median": statistics.median(paired),
            }
        )
    return rows


def render(meta: dict[str, Any], summary: list[dict[str, Any]]) -> str:
    lines = [
        "# The cost of `Settings(min_replicas=1)`: our worker, a local primary and one replica",
        "",
        f"`{meta['command']}` ({meta['when']}, commit {meta['commit']}, Redis {meta['redis']}, "
        f"load average {meta['loadavg']} at the end, {meta['tasks']:,} no-op tasks per run, "
        f"median of {meta['rounds']} rounds, {meta['seconds']:.0f} s in all). Primary and "
        "replica run on the same 2-core machine as the workers.",
        "",
        "| concurrency | min_replicas | tasks/s (median) | rounds | x min_replicas=0 (medians; "
        "per round, median) "
        "| round trips/task | WAITs/task | commands/task | replica acks/task "
        "| short-WAIT warnings |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in summary:
        for n in (0, 1):
            m = row["by_min_replicas"][n]
            ratio = (
                "1.00x"
                if n == 0
                else (
                    f"{row['ratio']:.2f}x ({', '.join(f'{r:.2f}' for r in row['paired_ratios'])}; "
                    f"{row['paired_median']:.2f}x)"
                )
            )
            lines.append(
                f"| {row['config']} | {n} | {m['rate']:,.0f} | "
                f"{', '.join(f'{r:,}' for r in m['rates'])} | {ratio} | "
                f"{m['round_trips']:.2f} | {m['waits']:.2f} | {m['commands']:.2f} | "
                f"{m['acks']:.2f} | {m['replica_warnings']} |"
            )
    lines += [
        "",
        "Round trips and commands per task are the primary's socket reads and commands per task "
        "less the replica's `REPLCONF` acknowledgements (shown apart): what the workers sent. "
        "`tasks/s` per round are listed in `rounds`.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
