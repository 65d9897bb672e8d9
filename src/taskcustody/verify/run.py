"""One verification run, reusable by `taskcustody verify` and by tests: the bounded model check
(`taskcustody_model.check`), then the stateful run (the model drives the real implementation,
`machine.build_machine`) on fakeredis or a real Redis, with every count the report needs.

Determinism: without a seed the stateful run is derandomized (the same command explores the same
examples every time); `seed=N` explores other examples, reproducibly. Either way a failing run's
counterexample is shrunk (for at most `shrink_seconds`) and replayed once more at the end, so the
steps recorded last are the shrunk counterexample's.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from hypothesis import HealthCheck, Phase, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.reporting import with_reporter
from hypothesis.stateful import get_state_machine_test
from taskcustody_model import Bounds, CheckResult, Progress, check

from .. import cluster
from ..connection import connect, connect_fake
from ..keys import QueueKeys
from .deployment import DeploymentError, deployment_error, describe
from .designs import BY_NAME, CHOICES
from .harness import VERIFY_SETTINGS, Mismatch, StepRecord
from .machine import RETRY_BOUNDS, RunStats, build_machine, default_bounds

#: The model check's default bounds: every broken design is found within them (depth <= 8), and
#: the correct design's 147,900 distinct states (with the composite step, 2026-12-01) take about a
#: minute on one core.
MODEL_BOUNDS = Bounds(tasks=2, servers=2, workers=2, faults=2, processes_per_server=1,
                      late_tasks=1, redis_faults=True)
#: Stateful examples when none are asked for; a broken design's run (`taskcustody verify --variant
#: NAME`) runs at least the examples its stateful search is pinned to find it in
#: (`designs.Stateful.examples`, the finds-the-bug tests' counts). Every design is also caught by
#: the model check; these make the stateful part catch it too.
DEFAULT_EXAMPLES = 200
#: Hypothesis shrinks for at most 300 s by default; a report does not need the last few steps.
SHRINK_SECONDS = 60.0


@dataclass
class Options:
    examples: int = DEFAULT_EXAMPLES
    steps: int = 40
    seed: int | None = None
    variant: str = "correct"
    redis_url: str | None = None
    model_check: bool = True
    stateful: bool = True
    #: the model check's bounds; None: the design's own (`designs.Design.verify_bounds`), else
    #: `MODEL_BOUNDS`
    model_bounds: Bounds | None = None
    #: the stateful run's bounds; None: the machine's default (`machine.default_bounds`)
    bounds: Bounds | None = None

    @property
    def stateful_bounds(self) -> Bounds:
        return self.bounds or _design_stateful_bounds(self.variant) or default_bounds(
            self.prefetch)
    shrink_seconds: float = SHRINK_SECONDS
    shrink: bool = True
    #: also drive the prefetching worker's pipelined takes and releases
    prefetch: bool = False
    #: the queue (hash tag) of a run on a real Redis; None: verify-<pid>. On a cluster it picks
    #: the master the run happens on (every key of the run is in that tag's slot).
    queue: str | None = None

    def command(self) -> str:
        """The command line that repeats this run."""
        args = ["taskcustody", "verify", "--examples", str(self.examples), "--steps",
                str(self.steps)]
        if self.seed is not None:
            args += ["--seed", str(self.seed)]
        if self.variant != "correct":
            args += ["--variant", self.variant]
        if self.prefetch:
            args.append("--prefetch")
        if self.redis_url:
            args += ["--redis-url", self.redis_url]
        if self.queue:
            args += ["--queue", self.queue]
        if not self.model_check:
            args.append("--no-model-check")
        if not self.stateful:
            args.append("--no-stateful")
        return shlex.join(args)


def default_examples(variant: str) -> int:
    """How many stateful examples a run of this design generates unless told otherwise."""
    pinned = BY_NAME[variant].stateful if variant in BY_NAME else None
    return max(DEFAULT_EXAMPLES, pinned.examples if pinned else 0)


def _design_stateful_bounds(variant: str) -> Bounds | None:
    """The stateful run's bounds a design needs beyond the machine's default: handler failures
    (the retrying machine, `machine.RETRY_BOUNDS`)."""
    pinned = BY_NAME[variant].stateful if variant in BY_NAME else None
    return RETRY_BOUNDS if pinned and pinned.handler_failures else None


def _design_model_bounds(variant: str) -> Bounds:
    own = BY_NAME[variant].verify_bounds if variant in BY_NAME else None
    return own or MODEL_BOUNDS


@dataclass
class Failure:
    """The stateful run's counterexample: what failed, and the shrunk steps that led there."""

    kind: str
    message: str
    steps: list[StepRecord]
    program: str  # Hypothesis's runnable program of the same steps
    tallies: dict[str, int] = field(default_factory=dict)


@dataclass
class Result:
    options: Options
    backend: str
    model: CheckResult | None = None
    stats: RunStats = field(default_factory=RunStats)
    failure: Failure | None = None
    model_seconds: float = 0.0
    stateful_seconds: float = 0.0
    seconds: float = 0.0
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def model_ok(self) -> bool:
        return self.model is None or self.model.ok

    @property
    def ok(self) -> bool:
        """Every property held in every part that ran."""
        return self.model_ok and self.failure is None

    @property
    def steps_per_second(self) -> float:
        """End to end: every step, its check against the model, Hypothesis and shrinking."""
        s = self.stats
        return s.steps / self.stateful_seconds if self.stateful_seconds > 0 else 0.0

    @property
    def counts(self) -> dict[str, int]:
        """Jepsen-style counts, summed over the examples that recovered (a failing run: the
        failing example's own)."""
        keys = ("enqueued", "committed", "lost", "duplicated", "double-assigned", "recovered",
                "lost-by-redis", "poison-pills")
        src: dict[str, int] = dict(self.stats.tallies)
        if self.failure is not None:
            src = self.failure.tallies
        return {k: int(src.get(k, 0)) for k in keys}


class _ProgressStats(RunStats):
    """RunStats that reports after every example."""

    def __init__(self, report: Callable[[RunStats], None] | None) -> None:
        super().__init__()
        self._report = report

    def add(self, h: Any) -> None:
        super().add(h)
        if self._report is not None:
            self._report(self)


@contextlib.contextmanager
def shrink_budget(seconds: float) -> Iterator[None]:
    """Cap Hypothesis's shrinking time (a module constant of its engine, 300 s by default)."""
    from hypothesis.internal.conjecture import engine

    old = engine.MAX_SHRINKING_SECONDS
    engine.MAX_SHRINKING_SECONDS = int(max(1, seconds))
    try:
        yield
    finally:
        engine.MAX_SHRINKING_SECONDS = old


@contextlib.contextmanager
def no_local_constants() -> Iterator[None]:
    """Hypothesis mixes literals found in every imported module of this project into what it
    draws, so a derandomized run would change with whatever else is imported (a test run of one
    file and of all of `tests/` differed) and with any edit of any literal anywhere. Without them
    a derandomized run depends only on the machine. (Hypothesis internals, as of 6.170.)"""
    from hypothesis.internal.conjecture import providers as _providers

    providers: Any = _providers
    original = getattr(providers, "_get_local_constants", None)
    if original is None:  # a Hypothesis without local constants
        yield
        return
    providers._get_local_constants = providers.Constants
    providers.CONSTANTS_CACHE.cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = original
        providers.CONSTANTS_CACHE.cache.clear()


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
) -> Result:
    """Run the model check and then the stateful run; never raises on a property violation (it is
    in the result)."""
    started = time.perf_counter()
    if options.variant not in CHOICES:
        raise ValueError(f"unknown variant {options.variant!r}; known: {', '.join(CHOICES)}")
    fake = options.redis_url is None
    result = Result(options, "fakeredis" if fake else "redis")

    if options.model_check:
        if on_phase:
            on_phase("model check")
        t = time.perf_counter()
        bounds = options.model_bounds or _design_model_bounds(options.variant)
        result.model = check(bounds, options.variant, progress=on_model)
        result.model_seconds = time.perf_counter() - t

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
        url = _node_url(options.redis_url, keys)

        def make_client() -> redis.Redis:
            return connect(url, VERIFY_SETTINGS, cluster=False)

    try:
        probe = make_client()
        try:
            probe.ping()
            result.versions = versions(probe, fake)
        finally:
            probe.close()
    except redis.RedisError as exc:
        raise DeploymentError(f"cannot set up the run on {options.redis_url}: "
                              f"{describe(exc)}") from exc

    if options.stateful:
        if on_phase:
            on_phase("stateful run")
        t = time.perf_counter()
        stats = _ProgressStats(on_example)
        result.stats = stats
        try:
            result.failure = _stateful(options, make_client, keys, stats, real=not fake)
        finally:
            result.stateful_seconds = time.perf_counter() - t
            if not fake:
                _cleanup(make_client, keys)
    result.seconds = time.perf_counter() - started
    return result


def _stateful(options: Options, make_client: Callable[[], redis.Redis], keys: QueueKeys,
              stats: RunStats, *, real: bool) -> Failure | None:
    machine = build_machine(make_client, bounds=options.bounds or _design_stateful_bounds(
                                options.variant), implementation=options.variant,
                            real_redis=real, stats=stats, keys=keys,
                            prefetching=options.prefetch,
                            flush_scripts=options.redis_url is None)
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if options.shrink else [])
    the_settings = settings(
        max_examples=options.examples,
        stateful_step_count=options.steps,
        derandomize=options.seed is None,
        database=None,
        deadline=None,
        phases=phases,
        report_multiple_bugs=False,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
    )
    make_test: Any = get_state_machine_test  # (untyped in Hypothesis)
    test = make_test(machine, settings=the_settings)
    if options.seed is not None:
        test = hypothesis_seed(options.seed)(test)
    printed: list[str] = []

    def reporter(value: object) -> None:
        printed.append(str(value))

    try:
        with shrink_budget(options.shrink_seconds), no_local_constants(), \
                with_reporter(reporter):
            test()
    except Exception as exc:  # the finding: a property or conformance failure, or a crash
        cause = deployment_error(exc)
        if cause is not None:
            # Not a finding: the deployment failed the run (deployment.py).
            raise DeploymentError(f"the run was stopped by the deployment, not by the "
                                  f"protocol: {describe(cause)}") from cause
        kind = exc.kind if isinstance(exc, Mismatch) else type(exc).__name__
        message = exc.message if isinstance(exc, Mismatch) else str(exc)
        notes = [str(n) for n in getattr(exc, "__notes__", [])]
        return Failure(kind, message, list(stats.last_steps), "\n".join(printed + notes),
                       dict(stats.last_tallies))
    return None


def _node_url(url: str, keys: QueueKeys) -> str:
    """The URL the run talks to: `url` itself, or on a cluster the master that owns the run's
    slot (found through a cluster client seeded by `url`, which may be any node). The run needs
    a connection it can inject faults into, and every key it touches is in that one slot."""
    seed = connect(url, VERIFY_SETTINGS)
    try:
        if not cluster.is_cluster(seed):
            return url
        node = cluster.owner_node(seed, keys.queue)
        return _with_address(url, str(node.host), int(node.port))
    except redis.RedisError as exc:
        raise DeploymentError(f"cannot find the node of {keys.queue} through {url}: "
                              f"{describe(exc)}") from exc
    finally:
        seed.close()


def _with_address(url: str, host: str, port: int) -> str:
    """`url` with its host and port replaced (its scheme, user, password and options kept)."""
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@{host}:{port}" if auth else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _cleanup(make_client: Callable[[], redis.Redis], keys: QueueKeys) -> None:
    """Delete the run's keys: on a cluster those of its slot, on the master that owns it
    (`cluster.tag_keys`), never found with KEYS or SCAN on some node."""
    client = make_client()
    try:
        found = cluster.tag_keys(client, keys.queue, keys.base + ":")
        if found:
            client.delete(*found)
    finally:
        client.close()
