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
    bounds = (Bounds(tasks=2, servers=2, workers=2, faults=1) if quick
              else Bounds(tasks=3, servers=2, workers=1, faults=2))
    result = check(bounds)
    return {"status": "ok", "ok": result.ok, "states": result.distinct_states,
            "generated": result.states_generated, "seconds": result.seconds,
            "per_second": result.states_per_second, "bounds": repr(bounds)}


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
    return {"steps": steps, "runs": runs, "seconds": spent,
            "per_second": steps / spent if spent else 0.0,
            "wall_seconds": time.perf_counter() - began}


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
    for name, fn in (("model_check", model_states_per_second),
                     ("stateful", stateful_steps_per_second)):
        try:
            out[name] = fn(quick)
        except Exception as exc:  # a piece under construction must not sink the benchmark
            out[name] = {"status": "error", "why": f"{type(exc).__name__}: {exc}"[:300]}
    return out
