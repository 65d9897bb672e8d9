"""python -m bench.audit [SYSTEM ...] [--seed S] [--tasks N] [--quick] [--fault F] [--jobs J]

For each system: a recording run (no fault; the shim logs the commands each worker process
sends), then one trial per fault: a dropped reply for each command the recording saw (minus
connection set-up), a SIGKILL mid-task, a stall, a Redis restart. Trials run J at a time (each
has its own Redis and files; most of a trial is waiting out a recovery time). Writes
bench/results/audit.{md,json}.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.audit.classify import classify
from bench.audit.report import TrialResult, write_reports
from bench.audit.systems import SYSTEMS, System
from bench.audit.trial import Fault, TrialRaw, drop_fault, run_trial, take_path_commands
from bench.harness import BENCH_DIR

ORDER = ["taskcustody", "rq", "celery", "dramatiq", "saq", "arq"]
OTHER_FAULTS = ("kill", "stall", "restart")
QUICK_DROPS = 3


def parse_fault(text: str) -> Fault:
    """ "kill", "stall", "restart", or "drop:COMMAND:SKIP[:task]" (as a reproduction prints it;
    ":task": SKIP counts only the replies that carry a task)."""
    if text in OTHER_FAULTS:
        return Fault(text)
    parts = text.split(":")
    if (
        len(parts) in (3, 4)
        and parts[0] == "drop"
        and parts[2].isdigit()
        and parts[3:] in ([], ["task"])
    ):
        return Fault("drop", parts[1], int(parts[2]), only_task=len(parts) == 4)
    raise argparse.ArgumentTypeError(f"{text!r}: kill, stall, restart or drop:COMMAND:SKIP[:task]")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m bench.audit",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "systems",
        nargs="*",
        metavar="SYSTEM",
        help=f"of {', '.join(ORDER)} (default: all; taskcustody is always run too, "
        "so that our row is measured in the same run, except with --fault)",
    )
    ap.add_argument("--seed", type=int, default=1, help="seed of every choice (default 1)")
    ap.add_argument(
        "--tasks", type=int, default=None, help="tasks per trial (default 20; 10 with --quick)"
    )
    ap.add_argument("--task-seconds", type=float, default=0.2, help="each task sleeps this long")
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"10 tasks, at most {QUICK_DROPS} dropped-reply commands per system; "
        "writes nothing unless --out is given",
    )
    ap.add_argument(
        "--fault",
        action="append",
        type=parse_fault,
        default=None,
        help="only this fault (repeatable): kill, stall, restart, "
        "drop:COMMAND:SKIP[:task]; "
        "skips the recording run (for replaying a reproduction); writes "
        "nothing unless --out is given",
    )
    ap.add_argument("--jobs", type=int, default=3, help="trials at a time (default 3)")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="directory for audit.{md,json} (default bench/results)",
    )
    ap.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="copy each trial's records, shim logs and worker logs here",
    )
    return ap


def plan(
    system: System, recording: TrialRaw | None, seed: int, quick: bool, only: list[Fault] | None
) -> list[Fault]:
    if only is not None:
        return list(only)
    assert recording is not None
    rng = random.Random(f"{seed}:{system.name}:plan")
    drops = take_path_commands(recording.commands)
    if quick and len(drops) > QUICK_DROPS:
        drops = sorted(rng.sample(drops, QUICK_DROPS))
    faults = [drop_fault(c, flags, rng) for c, flags in drops]
    return faults + [Fault(k) for k in OTHER_FAULTS]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    unknown = [n for n in args.systems if n not in ORDER]
    if unknown:
        parser.error(f"unknown system(s) {', '.join(unknown)}: choose from {', '.join(ORDER)}")
    # Our row is measured in the same run -- except in a replay of named systems' faults.
    ours = not (args.fault and args.systems)
    names = [
        n for n in ORDER if (n == "taskcustody" and ours) or not args.systems or n in args.systems
    ]
    tasks = args.tasks or (10 if args.quick else 20)
    # A quick run or a replay (--fault) must not overwrite the full run's results.
    out = args.out or (None if args.quick or args.fault else BENCH_DIR / "results")
    started = time.time()
    systems = [SYSTEMS[n] for n in names]
    pythons = {s.name: s.python() for s in systems}

    def go(system: System, fault: Fault) -> TrialRaw:
        seed = f"{args.seed}:{system.name}:{fault.arg}"
        raw = run_trial(
            system,
            pythons[system.name],
            fault,
            tasks=tasks,
            seed=seed,
            task_seconds=args.task_seconds,
            keep=args.keep,
        )
        o = classify(raw.tasks, raw.records, raw.fault_time, raw.carried)
        print(
            f"  {system.name:12} {fault.label:22} fired={raw.fired!s:5} once={o.once:3} "
            f"dup={o.more_than_once:2} lost={o.lost:2} restarts={raw.restarts} "
            f"{raw.seconds:5.1f}s",
            file=sys.stderr,
            flush=True,
        )
        return raw

    results: list[TrialResult] = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        recordings: dict[str, TrialRaw | None] = dict.fromkeys(names)
        if args.fault is None:
            futures = {s.name: pool.submit(go, s, Fault("none")) for s in systems}
            recordings = {n: f.result() for n, f in futures.items()}
        trials = [
            (s, f)
            for s in systems
            for f in plan(s, recordings[s.name], args.seed, args.quick, args.fault)
        ]
        done = list(pool.map(lambda sf: go(*sf), trials))
    for raw in [r for r in recordings.values() if r is not None] + done:
        results.append(
            TrialResult.of(raw, classify(raw.tasks, raw.records, raw.fault_time, raw.carried))
        )
    elapsed = time.time() - started
    command = " ".join(["python -m bench.audit", *(argv if argv is not None else sys.argv[1:])])
    text = write_reports(
        results,
        systems,
        out,
        seed=args.seed,
        tasks=tasks,
        task_seconds=args.task_seconds,
        command=command,
        elapsed=elapsed,
    )
    print(text)
    return 0
