"""What a pass looks at: the lists a startup drain or a sweep selects, what the registry's
collection forgets, which processing records are stuck, and when the clock's tick matters.

These are reads (the guards and the passes share them); the steps that act on them are in
``server_steps.py``.

``include_self`` names the one difference between the two passes that drain in-flight lists,
as in the implementation's ``recovery.lists_to_recover``:

- ``include_self=True`` (the **startup drain**, right after a claim): every list of *our own
  server id* from an earlier incarnation, without a liveness check.  The id is exclusive and was
  just claimed, so those lists can only hold debris of earlier runs under it (the new
  incarnation's own lists are still empty).  Other servers' lists are left to the sweeps.
- ``include_self=False`` (the periodic **sweep**): every list whose owner is not live and is not
  us (our current incarnation), after the prune.
"""

from __future__ import annotations

from .action import Action, Config
from .custody import is_live, prune, renewed
from .state import ARMED, Bounds, Drain, ListKey, Process, Registration, State, list_of
from .variants import Variant

#: The passes that drain in-flight lists, and whether each includes its own server id's lists
#: (``lists_to_recover``).
INCLUDE_SELF: dict[str, bool] = {"startup_drain": True, "sweep": False}


def lists_to_recover(
    state: State, s: int, proc: Process, v: Variant, include_self: bool
) -> tuple[Drain, ...]:
    """The lists one pass of process ``proc`` of server ``s`` drains, each with its length read
    up front.  ``include_self=True``: the startup drain (the earlier incarnations of our own id;
    a design with ``startup_drains_own`` off selects none).  ``include_self=False``: the sweep
    (neither ours nor live, judged on the registry as pruned first if the design prunes first; a
    design with ``sweep_skips_live`` off selects every list)."""
    if include_self:
        if not v.startup_drains_own:
            return ()
        return tuple(
            Drain(key, len(tasks), 0)
            for key, tasks in state.lists
            if key[0] == s and key[1] != proc.inc
        )
    registry = prune(state.registry) if v.prune_before_drain else state.registry
    return tuple(
        Drain(key, len(tasks), 0)
        for key, tasks in state.lists
        if not v.sweep_skips_live or (key[:2] != (s, proc.inc) and not is_live(registry, key))
    )


def pass_selection(state: State, action: Action, config: Config) -> set[ListKey]:
    """The lists a ``sweep`` or ``startup_drain`` about to run in ``state`` decides to drain."""
    proc = state.processes[action.server][action.proc]
    drains = lists_to_recover(
        state, action.server, proc, config.variant, include_self=INCLUDE_SELF[action.name]
    )
    return {d.key for d in drains}


def drain_would_move(state: State, d: Drain, v: Variant) -> bool:
    return bool(list_of(state, d.key)) and (not v.drain_bounded or d.moved < d.length)


def sweep_has_work(state: State, s: int, proc: Process, v: Variant, bounds: Bounds) -> bool:
    registry = state.registry
    return (
        prune(registry) != registry
        or bool(lists_to_recover(state, s, proc, v, include_self=False))
        or bool(collectable(state, s, proc, prune(registry), v, bounds))
        or (bounds.registration_ages and spares_fresh(state, s, proc))
    )


def spares_fresh(state: State, s: int, proc: Process) -> bool:
    """With ``Bounds.registration_ages``: a sweep of ``proc`` would forget a list but for its
    fresh registration (empty, not its own, its owner not live). Such a sweep changes nothing,
    but it is where a collection that ignores the age differs: it is enabled, so that the
    stateful run drives it (the checker's state space does not grow: its state is the same)."""
    if not state.fresh:
        return False
    held = {k for k, _ in state.lists}
    registry = prune(state.registry)
    return any(
        k not in held and k[:2] != (s, proc.inc) and not is_live(registry, k) for k in state.fresh
    )


def collectable(
    state: State,
    s: int,
    proc: Process,
    registry: tuple[Registration | None, ...],
    v: Variant,
    bounds: Bounds,
) -> tuple[ListKey, ...]:
    """The registered lists that a sweep of process ``proc`` of server ``s`` forgets (given the
    pruned registry): empty, not its own, their owner not live, and (the design) no take into
    them still pending.

    The implementation cannot see a pending take; it sees the registration's age.  A take's
    pipeline registers the list (ZADD, score = now) and sends its BLMOVE in the same write, and
    Redis serves or times out a BLMOVE within the block timeout, which the grace exceeds.  So a
    registration older than the grace has no pending take behind it: that is the assumption
    ``Bounds.take_wait_bounded`` (the model's clock has no seconds, so it says it directly).
    Without it, or with a collection that forgets an empty dead list at once (design 9), a pending
    take can fill a list that recovery no longer knows.
    """
    held = {k for k, _ in state.lists}
    if bounds.registration_ages:
        # What the implementation sees: the registration's age. A pending take's is fresh (a
        # tick ends it: ``_aged``), unless takes may outwait the grace.
        fresh = set(state.fresh) if v.gc_waits_for_pending_takes else set()
        return tuple(
            k
            for k in state.registered
            if k not in held
            and k[:2] != (s, proc.inc)
            and not is_live(registry, k)
            and k not in fresh
        )
    spare_pending = v.gc_waits_for_pending_takes and bounds.take_wait_bounded
    return tuple(
        k
        for k in state.registered
        if k not in held
        and k[:2] != (s, proc.inc)
        and not is_live(registry, k)
        and not (spare_pending and _take_pending(state, k))
    )


def _take_pending(state: State, key: ListKey) -> bool:
    s, inc, w = key
    return any(p.inc == inc and p.workers[w].phase == ARMED for p in state.processes[s])


def stuck_records(state: State, s: int, proc: Process) -> list[int]:
    """Tasks whose processing record names a list that is not live (and not our own)."""
    return [
        t
        for t, key in enumerate(state.records)
        if key is not None and key[:2] != (s, proc.inc) and not is_live(state.registry, key)
    ]


def clock_may_advance(state: State) -> bool:
    """Time passing matters only when it can expire somebody: a registration that no healthy
    process renews (its process crashed or stalled, or its claim's reply was lost).  Ticks while
    every registration is renewed change nothing observable, so they are not generated."""
    for s, reg in enumerate(state.registry):
        if reg is not None and reg.deadline > 0 and not renewed(state, s, reg.inc):
            return True
    return False


def tick_ages(state: State) -> bool:
    """With ``Bounds.registration_ages``, time passing matters also when it ages a fresh
    registration of a list whose owner no healthy process renews: the collection may forget it
    then. (A take pending in such a process registered its list when it was sent, so the tick
    that ends it is one of these.) The fresh registrations of a renewed owner cannot be collected
    before a tick that expires the owner, which ages them too, and a take pending in a renewed
    process that a tick ends is sent again at once, registering the same list; so ticks for
    them alone are not generated."""
    return any(not renewed(state, k[0], k[1]) for k in state.fresh)
