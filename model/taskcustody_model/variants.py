"""The correct design and the broken ones of ``docs/protocol.md`` (section 7), as parameters of
one model, each with the bounds ``model-check --variant NAME`` checks it at and, for a broken one,
the shortest counterexample the checker finds there (``tests/model/test_checker.py`` and
``tests/model/test_variant_cli.py`` check each pin against a search)."""

from __future__ import annotations

from typing import NamedTuple

from .state import Bounds

#: ``model-check``'s bounds when neither a design nor a flag says otherwise: the correct design's.
DEFAULT_BOUNDS = Bounds(tasks=3, servers=2, workers=2, faults=2, processes_per_server=1)
#: Most broken designs show at these: 3 tasks, 2 servers x 2 workers, 2 faults, and a successor
#: process beside a stalled one.
CHECKER_BOUNDS = Bounds(tasks=3, servers=2, workers=2, faults=2)
#: Designs 10 and 11 show with poison-pill detection on: one task whose holder keeps dying, the
#: tightest limit (a task recovered twice is dead-lettered).
POISON_BOUNDS = Bounds(
    tasks=1, servers=2, workers=1, faults=3, processes_per_server=1, max_recoveries=1
)
#: Design 12 needs a process that holds two tasks (2 workers) and dies with them.
BYSTANDER_BOUNDS = Bounds(
    tasks=2, servers=2, workers=2, faults=2, processes_per_server=1, max_recoveries=1
)
#: Design 13 needs a handler that fails, so that a retry is scheduled and promoted: the checker's
#: bounds with handler failures.
RETRY_BOUNDS = CHECKER_BOUNDS._replace(processes_per_server=1, handler_failures=True)
#: Design 16 shows with asyncio's fault, a worker step cancelled before its command is sent:
#: 2 tasks, so that another worker can empty the queue (with a task left in the queue, the worker
#: that believes itself clean takes it, and that release finds the first task as debris).
CANCEL_BOUNDS = Bounds(
    tasks=2, servers=2, workers=1, faults=2, processes_per_server=1, cancels_before_send=True
)


class Counterexample(NamedTuple):
    """The property a broken design breaks, and the length of the shortest run that breaks it
    at the design's own bounds."""

    property: str
    length: int


class Variant(NamedTuple):
    name: str
    description: str
    #: take = BLMOVE queue -> own in-flight list.  False: BLPOP into the worker's memory, record
    #: afterwards (the old design: a lost reply destroys the task).
    take_into_list: bool = True
    #: release removes the task from the own list (LREM) and reports whether it was there.
    release_removes_custody: bool = True
    #: the periodic sweep skips live lists and the own incarnation's lists (include_self=False).
    sweep_skips_live: bool = True
    #: the startup drain drains the earlier incarnations of the own server id (include_self=True).
    startup_drains_own: bool = True
    #: the processing sweep requeues a task only in the step that removes it from its list.
    processing_sweep_removes_custody: bool = True
    #: a drain stops after the number of moves read up front (LLEN).
    drain_bounded: bool = True
    #: the sweep prunes expired servers before it decides which lists are dead.
    prune_before_drain: bool = True
    #: every take registers its list in the same round trip (and a heartbeat that finds its
    #: registration gone re-registers the process's lists).  False: lists are registered once,
    #: when the process starts (the old design), so a Redis wipe or a collection leaves a list
    #: that later takes fill unregistered.
    registry_heals: bool = True
    #: the registry's garbage collection spares a list while a take into it may still be pending
    #: (its registration is younger than the grace).  False: a dead list is forgotten as soon as
    #: it is empty.
    gc_waits_for_pending_takes: bool = True
    #: recovery counts each task it takes back from a holder's list, in the same step, and
    #: dead-letters a task recovered more than ``Bounds.max_recoveries`` times.  False: recoveries
    #: are never counted, so a task that kills every process that runs it is recovered for ever.
    counts_recoveries: bool = True
    #: the count is written in the recovering step.  False: the recovering step reads the count
    #: to decide, and a later step of the same process writes it, so a crash in between loses it.
    counts_in_recovering_step: bool = True
    #: a recovered task that is not dead-lettered goes to the suspects list, and a process takes
    #: at most one suspect at a time.  False: it goes back to the queue's take end beside the
    #: other tasks its dead holder held, so they are taken into one process together again and an
    #: innocent task shares (and is counted for) every death of a poison pill.
    suspects_run_alone: bool = True
    #: promotion of a due retry moves it from the scheduled set to the queue in one step (ZREM and
    #: LPUSH of the same member in one script).  False: it LPUSHes a copy and leaves the member
    #: scheduled, so the task is in two places and runs (and commits) twice.
    promotion_moves: bool = True
    #: the composite ``release_and_take`` (one script: the release, then the next take) takes the
    #: next task with ``LMOVE queue own-list``, as a take does.  False: its take half pops the task
    #: into the script's reply (``RPOP``, as a ``BLPOP`` would), so the task is in no list while
    #: the worker holds it, and a lost reply of the composite destroys it.
    composite_takes_into_list: bool = True
    #: the composite's release half commits only if its ``LREM`` removed the task (custody was
    #: still held), as the release does.  False: it runs the ``LREM`` and commits whatever it
    #: found, so a worker judged dead commits a task that recovery has already handed back.
    composite_checks_custody: bool = True
    #: a release the worker did not see end (its reply lost, or its step cancelled before or
    #: after the send) leaves the worker dirty: it reconciles before its next take.  False: the
    #: worker takes it for a release that ran and goes idle.  After a lost reply that is what a
    #: reconcile would reach (the script ran, and a worker that holds a task has nothing else in
    #: its list); after a cancellation before the send the task is still in the list of a worker
    #: that believes itself clean, and nothing drains a live worker's list.
    cut_short_release_dirty: bool = True
    #: the bounds ``model-check --variant NAME`` checks the design at unless flags say otherwise
    #: (for a broken design, bounds at which its counterexample shows).  The protocol never reads
    #: it: a check's bounds are ``Config.bounds``.
    own_bounds: Bounds = DEFAULT_BOUNDS
    #: a broken design's shortest counterexample at ``own_bounds``; None for the correct design.
    counterexample: Counterexample | None = None


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("correct", "the protocol as designed"),
        Variant(
            "blpop-take",
            "1. take with BLPOP and record afterwards (the old design)",
            take_into_list=False,
            processing_sweep_removes_custody=False,
            own_bounds=CHECKER_BOUNDS,
            counterexample=Counterexample("no-loss", 1),
        ),
        Variant(
            "no-release",
            "2. no custody release: the LREM is dropped from the release",
            release_removes_custody=False,
            own_bounds=CHECKER_BOUNDS,
            counterexample=Counterexample("no-duplication", 3),
        ),
        Variant(
            "sweep-drains-live",
            "3. the periodic sweep drains the own and registered servers' lists",
            sweep_skips_live=False,
            own_bounds=CHECKER_BOUNDS,
            counterexample=Counterexample("no-double-execution", 3),
        ),
        Variant(
            "startup-skips-own",
            "4. the startup drain skips the own server id's lists",
            startup_drains_own=False,
            own_bounds=CHECKER_BOUNDS,
            counterexample=Counterexample("prompt-recovery", 5),
        ),
        Variant(
            "processing-sweep-no-custody",
            "5. the processing sweep requeues a task without removing it from custody",
            processing_sweep_removes_custody=False,
            own_bounds=CHECKER_BOUNDS,
            counterexample=Counterexample("no-duplication", 6),
        ),
        Variant(
            "unbounded-drain",
            "6. a drain loops until the list is empty",
            drain_bounded=False,
            own_bounds=CHECKER_BOUNDS,
            counterexample=Counterexample("bounded-work", 8),
        ),
        Variant(
            "drain-before-prune",
            "7. the sweep drains before it prunes on the same pass",
            prune_before_drain=False,
            own_bounds=CHECKER_BOUNDS,
            counterexample=Counterexample("prompt-recovery", 4),
        ),
        # stall, clock, a sweep forgets the stalled server's empty list, its worker takes into it
        # (also 4 with Redis wipes among the faults: tests/model/test_checker.py)
        Variant(
            "register-once",
            "8. in-flight lists are registered once, at start, not by every take",
            registry_heals=False,
            own_bounds=CHECKER_BOUNDS,
            counterexample=Counterexample("registered-custody", 4),
        ),
        # a take waits on an empty queue (arm), its server stalls and is judged dead, a sweep
        # forgets the list at once, the waiting take is served into it
        Variant(
            "gc-when-empty",
            "9. the sweep forgets a dead in-flight list as soon as it is empty",
            gc_waits_for_pending_takes=False,
            own_bounds=CHECKER_BOUNDS,
            counterexample=Counterexample("registered-custody", 8),
        ),
        Variant(
            "recoveries-not-counted",
            "10. recovery never counts how often it took a task back from a dead holder",
            counts_recoveries=False,
            own_bounds=POISON_BOUNDS,
            counterexample=Counterexample("bounded-executions", 8),
        ),
        Variant(
            "count-after-recovery",
            "11. recovery writes a task's recovery count in a later step than the one that "
            "moves it",
            counts_in_recovering_step=False,
            own_bounds=POISON_BOUNDS,
            counterexample=Counterexample("bounded-executions", 8),
        ),
        Variant(
            "recovered-to-queue",
            "12. recovery requeues a counted task on the queue, beside the tasks that died with "
            "it, instead of running it alone as a suspect",
            suspects_run_alone=False,
            own_bounds=BYSTANDER_BOUNDS,
            counterexample=Counterexample("suspects-run-alone", 6),
        ),
        Variant(
            "promote-copies",
            "13. promotion of a due retry pushes it onto the queue without removing it from the "
            "scheduled set",
            promotion_moves=False,
            own_bounds=RETRY_BOUNDS,
            counterexample=Counterexample("no-duplication", 4),
        ),
        # take, record, and the composite release-and-take whose reply is lost: it popped the next
        # task into that reply, so the task is nowhere
        Variant(
            "composite-pops-next",
            "14. the composite release-and-take pops the next task into its reply instead of "
            "moving it into the own in-flight list",
            composite_takes_into_list=False,
            own_bounds=CHECKER_BOUNDS,
            counterexample=Counterexample("no-loss", 3),
        ),
        # take, record, stall, clock, a sweep requeues the task; the stalled worker's composite
        # commits it (not held) and takes it back from the queue
        Variant(
            "composite-commits-unheld",
            "15. the composite release-and-take commits without checking that the release still "
            "held the task",
            composite_checks_custody=False,
            own_bounds=CHECKER_BOUNDS,
            counterexample=Counterexample("no-duplication", 6),
        ),
        # two workers take, one records; its release is cancelled before it is sent and it goes
        # idle with the task still in its live list, which nothing drains (only with cancellations
        # before the send: without them the checker accepts this variant, with the correct
        # design's very state space)
        Variant(
            "cancelled-release-ran",
            "16. a worker takes a release cut short (its step cancelled, or its reply lost) for "
            "one that ran, and goes idle instead of reconciling",
            cut_short_release_dirty=False,
            own_bounds=CANCEL_BOUNDS,
            counterexample=Counterexample("eventual-recovery", 4),
        ),
    )
}

CORRECT = VARIANTS["correct"]


def variant(name: str) -> Variant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}") from None


def variant_listing() -> str:
    """One line per variant, name and description (the CLIs' `--variant list`)."""
    return "\n".join(f"{v.name:30} {v.description}" for v in VARIANTS.values())
