"""The correct design and the broken ones of ``docs/protocol.md`` (section 7), as parameters of
one model."""

from __future__ import annotations

from typing import NamedTuple


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


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("correct", "the protocol as designed"),
        Variant(
            "blpop-take",
            "1. take with BLPOP and record afterwards (the old design)",
            take_into_list=False,
            processing_sweep_removes_custody=False,
        ),
        Variant(
            "no-release",
            "2. no custody release: the LREM is dropped from the release",
            release_removes_custody=False,
        ),
        Variant(
            "sweep-drains-live",
            "3. the periodic sweep drains the own and registered servers' lists",
            sweep_skips_live=False,
        ),
        Variant(
            "startup-skips-own",
            "4. the startup drain skips the own server id's lists",
            startup_drains_own=False,
        ),
        Variant(
            "processing-sweep-no-custody",
            "5. the processing sweep requeues a task without removing it from custody",
            processing_sweep_removes_custody=False,
        ),
        Variant(
            "unbounded-drain",
            "6. a drain loops until the list is empty",
            drain_bounded=False,
        ),
        Variant(
            "drain-before-prune",
            "7. the sweep drains before it prunes on the same pass",
            prune_before_drain=False,
        ),
        Variant(
            "register-once",
            "8. in-flight lists are registered once, at start, not by every take",
            registry_heals=False,
        ),
        Variant(
            "gc-when-empty",
            "9. the sweep forgets a dead in-flight list as soon as it is empty",
            gc_waits_for_pending_takes=False,
        ),
        Variant(
            "recoveries-not-counted",
            "10. recovery never counts how often it took a task back from a dead holder",
            counts_recoveries=False,
        ),
        Variant(
            "count-after-recovery",
            "11. recovery writes a task's recovery count in a later step than the one that "
            "moves it",
            counts_in_recovering_step=False,
        ),
        Variant(
            "recovered-to-queue",
            "12. recovery requeues a counted task on the queue, beside the tasks that died with "
            "it, instead of running it alone as a suspect",
            suspects_run_alone=False,
        ),
        Variant(
            "promote-copies",
            "13. promotion of a due retry pushes it onto the queue without removing it from the "
            "scheduled set",
            promotion_moves=False,
        ),
        Variant(
            "composite-pops-next",
            "14. the composite release-and-take pops the next task into its reply instead of "
            "moving it into the own in-flight list",
            composite_takes_into_list=False,
        ),
        Variant(
            "composite-commits-unheld",
            "15. the composite release-and-take commits without checking that the release still "
            "held the task",
            composite_checks_custody=False,
        ),
        Variant(
            "cancelled-release-ran",
            "16. a worker takes a release cut short (its step cancelled, or its reply lost) for "
            "one that ran, and goes idle instead of reconciling",
            cut_short_release_dirty=False,
        ),
    )
}

CORRECT = VARIANTS["correct"]


def variant(name: str) -> Variant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise ValueError(
            f"unknown variant {name!r}; known: {', '.join(VARIANTS)}"
        ) from None


def variant_listing() -> str:
    """One line per variant, name and description (the CLIs' `--variant list`)."""
    return "\n".join(f"{v.name:30} {v.description}" for v in VARIANTS.values())
