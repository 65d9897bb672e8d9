"""What one verification run found: its parts and their outcomes (`Part`), the stateful run's
counterexample (`Failure`), and the whole (`Result`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from taskcustody_model import CheckResult

from .fault_coverage import Coverage
from .harness import StepRecord
from .machine import RunStats
from .options import Options
from .protocol_log import ProtocolLog
from .refusal_aiming import RefusalCoverage

PASSED, FAILED, SKIPPED, PARTIAL = "passed", "failed", "skipped", "partial"


@dataclass
class Part:
    """One part of a run and its outcome: PASSED, FAILED (`message`: what broke), SKIPPED (not
    run: `message` says why) or PARTIAL (cut short by the time budget, nothing failed in what it
    covered). A PASSED part's `message`, if any, is a remark (the fault kinds aimed at again)."""

    name: str
    outcome: str
    seconds: float = 0.0
    covered: str = ""
    message: str = ""


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
    parts: list[Part] = field(default_factory=list)
    #: the fault-coverage part's verdict and counts (None: the part did not run to its end)
    coverage: Coverage | None = None
    #: the refusal part's verdict (the stateful part, when it attempts what the model refuses)
    #: on how often each kind was attempted (None: no refusals, or the part did not end clean)
    refusal_coverage: RefusalCoverage | None = None
    #: the protocol's own warnings and errors during the run, by kind (protocol_log.py): what
    #: the injected faults made it log, for the report rather than stderr
    protocol_log: ProtocolLog = field(default_factory=ProtocolLog)

    @property
    def partial(self) -> bool:
        """The time budget skipped a part or cut one short."""
        return any(p.outcome in (SKIPPED, PARTIAL) for p in self.parts)

    @property
    def model_ok(self) -> bool:
        return self.model is None or self.model.ok

    @property
    def ok(self) -> bool:
        """Every property held in every part that ran, the faults fired as often as the
        fault-coverage part requires, and each kind of refused attempt was made as often as the
        refusal part requires."""
        return (
            self.model_ok
            and self.failure is None
            and (self.coverage is None or self.coverage.ok)
            and (self.refusal_coverage is None or self.refusal_coverage.ok)
        )

    @property
    def steps_per_second(self) -> float:
        """End to end: every step, its check against the model, Hypothesis and shrinking."""
        s = self.stats
        return s.steps / self.stateful_seconds if self.stateful_seconds > 0 else 0.0

    @property
    def counts(self) -> dict[str, int]:
        """Jepsen-style counts, summed over the examples that recovered (a failing run: the
        failing example's own)."""
        keys = (
            "enqueued",
            "committed",
            "lost",
            "duplicated",
            "double-assigned",
            "recovered",
            "lost-by-redis",
            "poison-pills",
        )
        src: dict[str, int] = dict(self.stats.tallies)
        if self.failure is not None:
            src = self.failure.tallies
        return {k: int(src.get(k, 0)) for k in keys}
