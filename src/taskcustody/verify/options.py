"""What one verification run is asked to do (`Options`), and what follows from it: the run's
settings (`run_settings`, `load_settings`), its example count and its bounds per design."""

from __future__ import annotations

import dataclasses
import importlib
import shlex
from dataclasses import dataclass
from typing import Any

from taskcustody_model import Bounds

from ..core.settings import Settings
from .designs import BY_NAME
from .harness import VERIFY_SETTINGS
from .machine import RETRY_BOUNDS, default_bounds

#: The model check's default bounds: every broken design is found within them (depth <= 8), and
#: the correct design's state space takes about a minute on one core.
MODEL_BOUNDS = Bounds(
    tasks=2, servers=2, workers=2, faults=2, processes_per_server=1, late_tasks=1, redis_faults=True
)
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
    shrink_seconds: float = SHRINK_SECONDS
    shrink: bool = True
    #: also drive the prefetching worker's pipelined takes and releases
    prefetch: bool = False
    #: the queue (hash tag) of a run on a real Redis; None: verify-<pid>. On a cluster it picks
    #: the master the run happens on (every key of the run is in that tag's slot).
    queue: str | None = None
    #: the user's own Settings (`run_settings` says which of its fields the run takes); None:
    #: the harness's `VERIFY_SETTINGS` as they are
    settings: Settings | None = None
    #: where `settings` came from (`module:attr`, `load_settings`), for the command line
    settings_spec: str | None = None
    #: `redis_url` is a throwaway redis-server that verify started (`--embedded-redis`,
    #: embedded.py): the server is the run's own, so the Redis wipe flushes its script cache
    embedded: bool = False
    #: with the real implementation: also the part that runs the worker's production loop
    #: itself from the model (`LOOPS_PART`, verify/loops.py); off with `--no-loops`
    loops: bool = True
    #: with the real implementation: the stateful part also attempts what the model refuses
    #: (`machine.with_refusals`)
    refusals: bool = True
    #: with the real implementation: also the fault-coverage part (`FAULT_COVERAGE_PART`):
    #: the machine aims at every fault kind, and the run fails if one fires too rarely
    fault_coverage: bool = True
    #: that part's examples (its own, whatever `examples` says: its minimums are set for these)
    coverage_examples: int = 0  # 0: `COVERAGE_EXAMPLES`
    #: the stateful part drives the asyncio worker (`aio.AsyncWorker`, verify/aio.py) instead of
    #: the threaded one, with cancellations among its faults
    asyncio: bool = False

    @property
    def stateful_bounds(self) -> Bounds:
        return (
            self.bounds
            or design_stateful_bounds(self.variant)
            or default_bounds(self.prefetch, self.asyncio)
        )

    @property
    def part_name(self) -> str:
        """The stateful part's name (in the report and as a JUnit test case)."""
        where = (
            "fakeredis"
            if self.redis_url is None
            else "embedded redis-server"
            if self.embedded
            else "redis"
        )
        return (
            f"stateful conformance on {where}"
            + (" with the prefetching worker" if self.prefetch else "")
            + (" with the asyncio worker" if self.asyncio else "")
        )

    def command(self) -> str:
        """The command line that repeats this run."""
        args = [
            "taskcustody",
            "verify",
            "--examples",
            str(self.examples),
            "--steps",
            str(self.steps),
        ]
        if self.seed is not None:
            args += ["--seed", str(self.seed)]
        if self.variant != "correct":
            args += ["--variant", self.variant]
        if self.prefetch:
            args.append("--prefetch")
        if self.asyncio:
            args.append("--async")
        if not self.loops:
            args.append("--no-loops")
        if self.embedded:
            args.append("--embedded-redis")
        elif self.redis_url:
            args += ["--redis-url", self.redis_url]
        if self.queue:
            args += ["--queue", self.queue]
        if self.settings_spec:
            args += ["--settings", self.settings_spec]
        if not self.model_check:
            args.append("--no-model-check")
        if not self.stateful:
            args.append("--no-stateful")
        if not self.fault_coverage:
            args.append("--no-fault-coverage")
        return shlex.join(args)


#: The fields of a user's Settings that a run takes as they are: how the deployment talks to
#: Redis. The others (deadlines, sweep and heartbeat periods, drain chunks, attempts, commit
#: tracking) must be the harness's, whose timing is the model's ticks, or Redis could not be
#: compared with the model step by step.
USER_FIELDS = (
    "socket_timeout_margin",
    "allow_evicting_policy",
    "min_replicas",
    "replica_timeout",
    "result_ttl",
    "oom_log_interval",
)


def run_settings(user: Settings | None) -> Settings:
    """The settings of a run for a user whose deployment uses `user` (see `USER_FIELDS`)."""
    if user is None:
        return VERIFY_SETTINGS
    return dataclasses.replace(
        VERIFY_SETTINGS, **{name: getattr(user, name) for name in USER_FIELDS}
    )


def load_settings(spec: str) -> Settings:
    """`module:attr` (the module importable) -> the Settings it names; ValueError saying what is
    wrong with it otherwise."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec!r}: expected MODULE:ATTR, e.g. myapp.queue:SETTINGS")
    try:
        value: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{spec!r}: cannot import {module_name!r}: {exc}") from exc
    for name in attr.split("."):
        if not hasattr(value, name):
            raise ValueError(f"{spec!r}: {module_name!r} has no attribute {attr!r}")
        value = getattr(value, name)
    if not isinstance(value, Settings):
        raise ValueError(f"{spec!r}: is a {type(value).__name__}, not a taskcustody Settings")
    return value


def default_examples(variant: str) -> int:
    """How many stateful examples a run of this design generates unless told otherwise."""
    pinned = BY_NAME[variant].stateful if variant in BY_NAME else None
    return max(DEFAULT_EXAMPLES, pinned.examples if pinned else 0)


def design_stateful_bounds(variant: str) -> Bounds | None:
    """The stateful run's bounds a design needs beyond the machine's default: handler failures
    (the retrying machine, `machine.RETRY_BOUNDS`)."""
    pinned = BY_NAME[variant].stateful if variant in BY_NAME else None
    return RETRY_BOUNDS if pinned and pinned.handler_failures else None


def model_bounds(options: Options) -> Bounds:
    """The model check's bounds: the user's, else the design's (`MODEL_BOUNDS` for most), with
    `--async` the asyncio worker's own fault too (a step cancelled before its command is sent)."""
    if options.model_bounds is not None:
        return options.model_bounds
    bounds = design_model_bounds(options.variant)
    return bounds._replace(cancels_before_send=True) if options.asyncio else bounds


def design_model_bounds(variant: str) -> Bounds:
    own = BY_NAME[variant].verify_bounds if variant in BY_NAME else None
    return own or MODEL_BOUNDS


def with_refusals(options: Options) -> bool:
    """The stateful part also attempts what the model refuses (`machine.with_refusals`): on the
    real implementation only; the broken designs' pinned runs draw without it."""
    return options.refusals and options.variant == "correct"
