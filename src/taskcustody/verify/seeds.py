"""How fast does the stateful run find each broken design? (`python -m taskcustody.verify.seeds`)

For each design and each seed 0..N-1: a stateful run (no model check, no shrinking) with that
seed, stopped at the first failure; prints found/not found, the median and worst time to find
it, and the unshrunk counterexample's length. Also measures steps/s on the correct design.

    python -m taskcustody.verify.seeds              # 10 seeds, every stateful design, fakeredis
    python -m taskcustody.verify.seeds --seeds 3 --designs no-release,blpop-take
    python -m taskcustody.verify.seeds --redis-url redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from .designs import DESIGNS
from .run import Options, verify


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m taskcustody.verify.seeds",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument(
        "--examples", type=int, default=1000, help="give up on a seed after this many examples"
    )
    p.add_argument("--steps", type=int, default=40)
    # (by default the designs the stateful run is pinned to find: `designs.Stateful`)
    p.add_argument("--designs", default=",".join(d.name for d in DESIGNS if d.stateful))
    p.add_argument("--redis-url", default=None)
    p.add_argument("--json", dest="json_file", default=None, help="also write the rows here")
    args = p.parse_args(argv)
    rows = []
    for name in args.designs.split(","):
        times, lengths, kinds, found = [], [], set(), 0
        for seed in range(args.seeds):
            r = verify(
                Options(
                    examples=args.examples,
                    steps=args.steps,
                    seed=seed,
                    variant=name,
                    redis_url=args.redis_url,
                    model_check=False,
                    shrink=False,
                )
            )
            if r.failure is not None:
                found += 1
                times.append(r.stateful_seconds)
                lengths.append(len(r.failure.steps))
                kinds.add(r.failure.kind)
            print(
                f"  {name} seed {seed}: "
                + (
                    f"found in {r.stateful_seconds:.1f} s ({r.stats.examples} examples, "
                    f"{len(r.failure.steps)} steps): {r.failure.kind}"
                    if r.failure
                    else f"not found in {r.stats.examples} examples, {r.stateful_seconds:.1f} s"
                ),
                file=sys.stderr,
                flush=True,
            )
        row = {
            "design": name,
            "found": found,
            "seeds": args.seeds,
            "median_s": statistics.median(times) if times else None,
            "worst_s": max(times) if times else None,
            "median_len": statistics.median(lengths) if lengths else None,
            "kinds": sorted(kinds),
        }
        rows.append(row)
    print(
        f"| design | found (of {args.seeds} seeds) | median time to find | worst | "
        "median unshrunk length | failure |"
    )
    print("|---|---|---|---|---|---|")
    for row in rows:
        med = f"{row['median_s']:.1f} s" if row["median_s"] is not None else "-"
        worst = f"{row['worst_s']:.1f} s" if row["worst_s"] is not None else "-"
        print(
            f"| {row['design']} | {row['found']} | {med} | {worst} | {row['median_len'] or '-'}"
            f" | {', '.join(row['kinds']) or '-'} |"
        )
    if args.json_file:
        with open(args.json_file, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
