"""`python -m bench.fingerprints`: whether the 64-bit fingerprints of `model-check --fingerprints`
(Python's tuple hash of a state) collide as often as random 64-bit values would.

The chance the checker prints assumes they do. Every state a search meets (each successor, raw,
and its canonical form) is hashed; the report gives the distinct states, the distinct 64-bit
fingerprints, and, since a 64-bit collision is too rare to count, the collisions among their low
and high 24 and 28 bits beside the number a random hash would give (n - m(1 - (1 - 1/m)^n) for n
values in m buckets). A hash whose bits are not mixed well collides well above that."""

from __future__ import annotations

import argparse
import json
from typing import Any

from taskcustody_model.protocol import Config, apply, enabled_actions
from taskcustody_model.state import Bounds, State
from taskcustody_model.symmetry import canonical
from taskcustody_model.variants import variant

#: 3 tasks, 2 x 2, 1 fault, 2 processes per id: incarnations, stalls and every kind of place
DEFAULT_BOUNDS = Bounds(tasks=3, servers=2, workers=2, faults=1, processes_per_server=2)


def states_met(bounds: Bounds) -> set[State]:
    """Every state an unreduced search at ``bounds`` meets: the successors as generated and their
    canonical forms."""
    config = Config(bounds, variant("correct"))
    init = canonical(config.initial(), bounds.workers)
    met = {init}
    stored = {init}
    frontier = [init]
    while frontier:
        level = []
        for state in frontier:
            for action in enabled_actions(state, config):
                raw = apply(state, action, config)
                c = canonical(raw, bounds.workers)
                met.add(raw)
                met.add(c)
                if c not in stored:
                    stored.add(c)
                    level.append(c)
        frontier = level
    return met


def collisions(bounds: Bounds) -> dict[str, Any]:
    hashes = [hash(s) & (2**64 - 1) for s in states_met(bounds)]
    n = len(hashes)
    out: dict[str, Any] = {"states": n, "distinct_fingerprints": len(set(hashes))}
    for bits in (24, 28):
        m = 2**bits
        out[f"{bits}_bits"] = {
            "low": n - len({h & (m - 1) for h in hashes}),
            "high": n - len({h >> (64 - bits) for h in hashes}),
            "random": round(n - m * (1 - (1 - 1 / m) ** n)),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fingerprints", description=__doc__)
    parser.add_argument(
        "--bounds",
        default=None,
        help="JSON of taskcustody_model.Bounds fields (default: 3 tasks, 2 x 2, "
        "1 fault, 2 processes per id)",
    )
    args = parser.parse_args(argv)
    bounds = DEFAULT_BOUNDS if args.bounds is None else Bounds(**json.loads(args.bounds))
    print(json.dumps(collisions(bounds), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
