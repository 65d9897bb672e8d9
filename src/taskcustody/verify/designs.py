"""The broken designs of `docs/protocol.md` (section 7), one row each: the one home of what the
repository says about a design.

A row gives the design's one name (the model variant's, the demonstration's key, the named
mutant's when there is one that makes the same bug), its number in `docs/protocol.md`, its
demonstration implementation in `verify/broken.py` (by class name, or None and why), the property
it breaks, its pinned shortest model counterexample and the bounds it is pinned at (read from the
model's table: `Design.pinned`), the bounds `taskcustody verify` model-checks it at, and what its
stateful run is pinned to find. Everything else reads from here: the checker's pins
(tests/model/test_checker.py), the finds-the-bug
expectations (tests/stateful/test_finds_broken_designs.py), `verify`'s example budgets and its
`--variant` choices, and the demonstrations' registry (`broken.BROKEN`).
`tests/test_designs_table.py` fails if the model's variants, the demonstrations, the named
mutants, or the lists in docs/protocol.md and the README disagree with this table.

The model keeps its parameters (`taskcustody_model.variants`, which imports nothing from here),
and with them each design's own bounds and shortest counterexample there, which
`taskcustody model-check --variant NAME` runs at and `--variant list` shows; this table names them
and reads its pins from there, so that the two cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from taskcustody_model import Bounds

# (the bounds the model's table checks the designs at, named here too: the tests read them here)
from taskcustody_model.variants import BYSTANDER_BOUNDS as BYSTANDER_BOUNDS
from taskcustody_model.variants import CANCEL_BOUNDS as CANCEL_BOUNDS
from taskcustody_model.variants import CHECKER_BOUNDS as CHECKER_BOUNDS
from taskcustody_model.variants import POISON_BOUNDS as POISON_BOUNDS
from taskcustody_model.variants import RETRY_BOUNDS as RETRY_BOUNDS
from taskcustody_model.variants import VARIANTS, Variant

#: The same, smaller: what `taskcustody verify` model-checks design 13 at.
VERIFY_RETRY_BOUNDS = Bounds(
    tasks=2, servers=2, workers=1, faults=2, processes_per_server=1, handler_failures=True
)

#: Shrinking of a finds-the-bug run is capped by time (Hypothesis's own cap is 300 s); on a loaded
#: machine a short cap leaves a few removable steps in. The pins below hold with this cap on a
#: 2-core machine at load 5.
SHRINK_SECONDS = 90.0


@dataclass(frozen=True)
class Pinned:
    """The model checker's shortest counterexample: the property it breaks and its length, at
    these bounds (the design's own: the model's table, ``Variant.own_bounds`` and
    ``Variant.counterexample``, pins them)."""

    property: str
    length: int
    bounds: Bounds


@dataclass(frozen=True)
class Stateful:
    """What the stateful run (the model driving the demonstration) is pinned to find."""

    examples: int  # found within this many examples; `verify --variant` runs at least this many
    seed: int | None  # None: the default seed (`seeding.DEFAULT_SEED`)
    max_steps: int  # the shrunk counterexample has at most this many steps
    kinds: tuple[str, ...]  # what the failure is (Mismatch kinds)
    slow: bool = False
    shrink_seconds: float = SHRINK_SECONDS
    #: run the retrying machine (handler failures; `machine.RETRY_BOUNDS`)
    handler_failures: bool = False
    #: the machine also aims at a sweep whose drain moves a task out of a list whose owner steps
    #: between the moves (`aiming.with_drain_aimed`): found whatever the draws reach
    aim_at_drains: bool = False


@dataclass(frozen=True)
class Design:
    name: str  # the model variant's name, the demonstration's, and the same-bug named mutant's
    number: int  # its section in docs/protocol.md, section 7
    #: the class in `verify/broken.py`; None: there is none, `no_demo` says why (the stateful
    #: part then runs the real implementation, and only the model check can catch the design)
    demo: str | None
    #: the stateful run's pin; None: it cannot find this design, `no_stateful` says why
    stateful: Stateful | None
    #: True: the named mutant of the same name (mutation/named.py) makes this bug in the real code
    mutant: bool
    #: named mutants that break the same property near the same lines, but are a different bug,
    #: each with how it differs
    related_mutants: tuple[tuple[str, str], ...] = ()
    #: the bounds `taskcustody verify` model-checks this design at; None: `options.MODEL_BOUNDS`
    verify_bounds: Bounds | None = None
    no_demo: str = ""
    no_stateful: str = ""

    @property
    def variant(self) -> Variant:
        return VARIANTS[self.name]

    @property
    def pinned(self) -> Pinned:
        """The property it breaks, and the model's shortest counterexample at its own bounds."""
        c = self.variant.counterexample
        assert c is not None, f"{self.name}: a broken design's variant pins its counterexample"
        return Pinned(c.property, c.length, self.variant.own_bounds)

    @property
    def breaks(self) -> str:
        return self.pinned.property

    @property
    def named_mutant(self) -> str | None:
        return self.name if self.mutant else None


_STEPPED_BY_THE_MODEL_ONLY = (
    "the step-driven run's takes never wait on an empty queue (its grace is 0 already, see "
    "`harness.VERIFY_SETTINGS`), so it cannot leave a take pending while the list is forgotten; "
    "the loop-driven part of the correct design's run (registrations that age, a grace of one "
    "tick) catches the named mutant of the same name in the real implementation"
)

DESIGNS: tuple[Design, ...] = (
    Design(
        "blpop-take",
        1,
        demo="BlpopTakeServer",
        stateful=Stateful(20, None, 1, ("real:no-loss",)),
        mutant=True,
        related_mutants=(
            (
                "prefetch-take-without-custody",
                "the same flaw in the prefetching worker's batched take (RPOP in "
                "its script), not in the take",
            ),
        ),
    ),
    Design(
        "no-release",
        2,
        demo="NoReleaseServer",
        stateful=Stateful(20, None, 3, ("real:no-duplication",)),
        mutant=True,
    ),
    Design(
        "sweep-drains-live",
        3,
        demo="SweepDrainsLiveServer",
        stateful=Stateful(300, None, 8, ("conformance",)),
        mutant=False,
        related_mutants=(
            (
                "sweep-include-self-true",
                "only the `include_self` half: the sweep drains its own server's "
                "live lists but still skips other live servers'; the design drains "
                "every registered list",
            ),
        ),
    ),
    Design(
        "startup-skips-own",
        4,
        demo="StartupSkipsOwnServer",
        # observed: 5 steps (stall, clock, claim, take, startup drain)
        stateful=Stateful(600, None, 8, ("conformance",), slow=True),
        mutant=True,
    ),
    Design(
        "processing-sweep-no-custody",
        5,
        demo="ProcessingSweepNoCustodyServer",
        # Pinned to seed 1, which finds it within the examples below; other seeds may need
        # many more (`python -m taskcustody.verify.seeds --seeds 6 --examples 600 --designs
        # processing-sweep-no-custody` says how many)
        stateful=Stateful(600, 1, 12, ("conformance", "real:no-duplication"), slow=True),
        mutant=True,
    ),
    Design(
        "unbounded-drain",
        6,
        demo="UnboundedDrainServer",
        # Aimed, so that it does not depend on which examples a seed draws: the machine aims
        # at a drain whose owner steps between its moves (a take, a stall, the clock, a sweep
        # during which the stalled worker records, releases and takes the next task into the
        # list).
        stateful=Stateful(
            300,
            None,
            14,
            ("real:bounded-work", "conformance"),
            shrink_seconds=20.0,
            aim_at_drains=True,
        ),
        mutant=True,
    ),
    Design(
        "drain-before-prune",
        7,
        demo="DrainBeforePruneServer",
        # observed: up to 16 steps (a second worker's steps and a lost release the shrinker
        # keeps, with the 90 s cap on a loaded 2-core machine)
        stateful=Stateful(300, None, 16, ("conformance",)),
        mutant=True,
    ),
    Design(
        "register-once",
        8,
        demo="RegisterOnceServer",
        # observed: a wipe, the reconciles, then a heartbeat that registers the
        # server but not its lists (the model's heartbeat registers both)
        stateful=Stateful(300, None, 8, ("conformance", "real:registered-custody")),
        mutant=True,
    ),
    Design(
        "gc-when-empty",
        9,
        demo="GcWhenEmptyServer",
        stateful=None,
        no_stateful=_STEPPED_BY_THE_MODEL_ONLY,
        # the named mutant is caught by the loop-driven part of `taskcustody verify`, whose
        # registrations age (`Bounds.registration_ages`: a grace of one tick)
        mutant=True,
    ),
    Design(
        "recoveries-not-counted",
        10,
        demo="RecoveriesNotCountedServer",
        # observed: a few steps (up to a wipe, a claim, an enqueue, a reconcile, a stall, the
        # stalled worker's take, and a new incarnation's startup drain that recovers it): the
        # model counts the recovery, the demonstration does not
        stateful=Stateful(200, None, 8, ("conformance",)),
        mutant=True,
        verify_bounds=POISON_BOUNDS,
    ),
    Design(
        "count-after-recovery",
        11,
        demo=None,
        no_demo="this implementation counts in the script that moves the task, so there is no "
        "later step to move the count to without rewriting recovery; the stateful part "
        "runs the real implementation",
        stateful=None,
        no_stateful="it needs a recovery whose count is still unwritten when the task is "
        "recovered again, and this implementation has no such window to drive",
        mutant=False,
        verify_bounds=POISON_BOUNDS,
    ),
    Design(
        "recovered-to-queue",
        12,
        demo="RecoveredToQueueServer",
        # observed: the same walk as design 10: the model puts the counted task on the
        # suspects list, the demonstration on the queue
        stateful=Stateful(200, None, 8, ("conformance",)),
        mutant=True,
        verify_bounds=BYSTANDER_BOUNDS,
    ),
    Design(
        "promote-copies",
        13,
        demo="PromoteCopiesServer",
        # observed: 4 steps: take, record, the handler fails (retry scheduled), a promotion
        # copies it to the queue: in two places at once
        stateful=Stateful(
            200, None, 6, ("real:no-duplication", "conformance"), handler_failures=True
        ),
        mutant=True,
        verify_bounds=VERIFY_RETRY_BOUNDS,
    ),
    Design(
        "composite-pops-next",
        14,
        demo="CompositePopsNextServer",
        # observed: 5 steps (the model counts the task in the worker's hands, so the real side
        # fails first)
        stateful=Stateful(300, None, 7, ("real:no-loss", "conformance")),
        mutant=False,
    ),
    Design(
        "composite-commits-unheld",
        15,
        demo="CompositeCommitsUnheldServer",
        # observed: 10 steps with 60 s of shrinking
        stateful=Stateful(300, None, 12, ("real:no-duplication", "conformance")),
        mutant=True,
    ),
    Design(
        "cancelled-release-ran",
        16,
        demo=None,
        no_demo="the bug is the asyncio worker's (only a cancellation can cut a release short "
        "before its send); the named mutant of the same name makes it in "
        "`AsyncWorker`, and `verify --async` catches it",
        stateful=None,
        no_stateful="the threaded machine has no cancellations; `verify --async` (the asyncio "
        "machine, which injects them) catches the named mutant instead",
        mutant=True,
        verify_bounds=CANCEL_BOUNDS,
    ),
)

BY_NAME: dict[str, Design] = {d.name: d for d in DESIGNS}

#: What `taskcustody verify --variant` accepts (besides `list`): the correct design and these.
CHOICES: tuple[str, ...] = ("correct", *BY_NAME)


def design(name: str) -> Design:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown design {name!r}; known: {', '.join(BY_NAME)}") from None
