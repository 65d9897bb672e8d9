"""One verification run, reusable by `taskcustody verify` and by tests: the bounded model check
(`taskcustody_model.check`), then the stateful run (the model drives the real implementation,
`machine.build_machine`) on fakeredis or a real Redis, with every count the report needs.

Determinism: every stateful run draws from an explicit seed (`seeding.DEFAULT_SEED` unless
`seed=N`), so the same command explores the same examples every time, whatever the machine's
source text says in its comments (seeding.py). A failing run's
counterexample is shrunk (for at most `shrink_seconds`) and replayed once more at the end, so the
steps recorded last are the shrunk counterexample's.

Parts and budget: a run is made of parts (the model check, the stateful conformance run, and
with the real implementation the fault-coverage part, `fault_coverage.py`), each with an outcome
in `Result.parts`. With a time budget (`budget.Budget`, `--max-seconds`) a part
that the budget did not reach is skipped, and one that it cut short (between two model-check
progress reports, or between two stateful examples) is partial; each says what it covered.

Layout: options.py (what a run is asked to do), result.py (what it found), run_redis.py (the
Redis it happens on), stateful_run.py (one stateful run), parts.py (each part's verdict); this
module runs the parts in turn. Their public names are importable from here too.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from importlib import metadata

import redis
from taskcustody_model import Progress

from ..core.keys import QueueKeys
from ..deploy.connection import connect, connect_fake
from .budget import Budget
from .deployment import DeploymentError, deployment_error, describe
from .designs import CHOICES
from .machine import RunStats
from .options import (
    DEFAULT_EXAMPLES,
    MODEL_BOUNDS,
    SHRINK_SECONDS,
    USER_FIELDS,
    Options,
    default_examples,
    load_settings,
    model_bounds,
    run_settings,
    with_refusals,
)
from .parts import (
    AIMED_AGAIN_EXAMPLES,
    COVERAGE_BOUNDS,
    COVERAGE_EXAMPLES,
    COVERAGE_STEPS,
    FAULT_COVERAGE_PART,
    LOOP_EXAMPLES,
    LOOP_KINDS,
    LOOPS_PART,
    fault_coverage_part,
    loops_part,
    model_part,
    run_fault_coverage,
    stateful_part,
)
from .protocol_log import captured
from .result import FAILED, PARTIAL, PASSED, SKIPPED, Failure, Part, Result
from .run_redis import QueueInUse, cleanup, node_url, refuse_a_queue_in_use
from .run_redis import with_address as _with_address
from .seeding import DEFAULT_SEED, no_local_constants, shrink_budget
from .stateful_run import AIMING_RULES, ProgressStats, run_stateful

__all__ = [
    "AIMED_AGAIN_EXAMPLES",
    "AIMING_RULES",
    "COVERAGE_BOUNDS",
    "COVERAGE_EXAMPLES",
    "COVERAGE_STEPS",
    "DEFAULT_EXAMPLES",
    "DEFAULT_SEED",
    "FAILED",
    "FAULT_COVERAGE_PART",
    "LOOPS_PART",
    "LOOP_EXAMPLES",
    "LOOP_KINDS",
    "MODEL_BOUNDS",
    "PARTIAL",
    "PASSED",
    "SHRINK_SECONDS",
    "SKIPPED",
    "USER_FIELDS",
    "Failure",
    "Options",
    "Part",
    "QueueInUse",
    "Result",
    "_with_address",
    "default_examples",
    "load_settings",
    "model_bounds",
    "no_local_constants",
    "run_fault_coverage",
    "run_settings",
    "shrink_budget",
    "stopped_by_deployment",
    "verify",
    "versions",
    "with_refusals",
]


def versions(client: redis.Redis | None, fake: bool) -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("taskcustody", "redis", "fakeredis", "hypothesis", "lupa", "click"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "-"
    if fake:
        out["server"] = f"fakeredis {out['fakeredis']} (in-process)"
    elif client is not None:
        try:
            info = client.info("server")
            out["server"] = f"redis-server {info.get('redis_version', '?')}"
        except redis.RedisError as exc:
            out["server"] = f"unknown ({exc})"
    return out


def verify(
    options: Options,
    *,
    on_model: Callable[[Progress], None] | None = None,
    on_example: Callable[[RunStats], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
    on_log: Callable[[str], None] | None = None,
    budget: Budget | None = None,
) -> Result:
    """Run the model check and then the stateful run; never raises on a property violation (it is
    in the result). `budget`: a time budget shared with other runs (several designs); a part it
    does not reach is skipped, one it cuts short is partial (`Result.parts`). Raises QueueInUse
    if the run's queue on a real Redis holds keys already, DeploymentError if Redis fails it.

    The protocol's own log lines (warnings and errors of the `taskcustody` loggers) are counted
    into `Result.protocol_log` and go nowhere else while the run lasts; `on_log` gets each one,
    formatted, as it is logged (protocol_log.py)."""
    if options.variant not in CHOICES:
        raise ValueError(f"unknown variant {options.variant!r}; known: {', '.join(CHOICES)}")
    result = Result(options, "fakeredis" if options.redis_url is None else "redis")
    with captured(result.protocol_log, on_log):
        return _verify(result, on_model, on_example, on_phase, budget or Budget())


def _verify(
    result: Result,
    on_model: Callable[[Progress], None] | None,
    on_example: Callable[[RunStats], None] | None,
    on_phase: Callable[[str], None] | None,
    budget: Budget,
) -> Result:
    started = time.perf_counter()
    options = result.options
    fake = options.redis_url is None

    if fake:
        import fakeredis

        fake_server = fakeredis.FakeServer()

        def make_client() -> redis.Redis:
            return connect_fake(fake_server)

        keys = QueueKeys("verify", prefix="tcv")
    else:
        assert options.redis_url is not None
        # A queue of its own, so that the run touches nothing else on the user's server.
        keys = QueueKeys(options.queue or f"verify-{os.getpid()}", prefix="taskcustody-verify")
        url = node_url(options.redis_url, keys)
        connection_settings = run_settings(options.settings)

        def make_client() -> redis.Redis:
            return connect(url, connection_settings, cluster=False)

    # Before any part: a deployment that cannot run the stateful part, or a queue that holds
    # somebody's keys, is said at once, not after a minute of model checking.
    try:
        probe = make_client()
        try:
            probe.ping()
            result.versions = versions(probe, fake)
            if not fake and options.stateful:
                refuse_a_queue_in_use(probe, keys)
        finally:
            probe.close()
    except redis.RedisError as exc:
        raise DeploymentError(
            f"cannot set up the run on {options.redis_url}: {describe(exc)}"
        ) from exc

    if options.model_check:
        model_part(options, result, budget, on_model, on_phase)

    if options.stateful:
        if budget.spent():
            result.parts.append(Part(options.part_name, SKIPPED, message=budget.reason()))
        else:
            if on_phase:
                on_phase("stateful run")
            t = time.perf_counter()
            stats = ProgressStats(on_example)
            result.stats = stats
            try:
                result.failure, stopped = run_stateful(
                    options, make_client, keys, stats, real=not fake, budget=budget
                )
            finally:
                result.stateful_seconds = time.perf_counter() - t
                if not fake:
                    cleanup(make_client, keys)
            result.parts.append(stateful_part(options, result, stopped))
        if (
            options.loops
            and options.variant == "correct"
            and not options.prefetch
            and not options.asyncio
        ):
            result.parts.append(loops_part(options, result, make_client, keys, fake, budget))
        # (not once a part failed: the run fails anyway, and its counterexample is that one)
        # (the threaded machine's parts: --async drives the asyncio worker's steps only)
        if (
            options.fault_coverage
            and options.variant == "correct"
            and result.failure is None
            and not options.asyncio
        ):
            if on_phase:
                on_phase("fault coverage")
            result.parts.append(
                fault_coverage_part(options, result, make_client, keys, fake, budget)
            )
    result.seconds = time.perf_counter() - started
    return result


def stopped_by_deployment(exc: BaseException) -> str | None:
    """The one line to say when `exc`, out of `verify`, means the deployment stopped the run
    (deployment.py: never a finding); None when it does not."""
    if isinstance(exc, DeploymentError):
        return str(exc)
    cause = deployment_error(exc)
    return None if cause is None else f"the run was stopped by the deployment: {describe(cause)}"
