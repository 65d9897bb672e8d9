"""Explicit-state model checker: breadth-first over every state reachable within the bounds.

- States are canonicalised under symmetry (``symmetry.py``) before they are hashed, so each class
  of interchangeable states is explored once.
- Breadth-first order makes the first violation found one with a shortest trace.
- Safety: every new state is checked against ``INVARIANTS``, every step against the promptness
  of recovery.  A violating state is not expanded further.
- Eventual property: after the search, backward reachability over the explored graph restricted
  to non-fault steps, from the states where recovery is done (``is_done``).  This is exact, not a
  heuristic: a non-fault step never spends fault budget, so every state a fault-free continuation
  can reach from an explored state was itself explored, and the recovery graph is closed inside
  the explored set.  An explored state that cannot reach a done state is a violation.
- With ``reduce`` (``reduction.py``), a state whose fault budget is spent may be expanded by one
  step that commutes with every other: the explored graph is then a subgraph, and that module
  argues why every verdict, the eventual one included, is the same.
- With ``fingerprints`` (hash compaction, as TLC and SPIN offer it), the search keeps a 64-bit
  fingerprint of each state met instead of the state, and a state only while it waits in the
  frontier: about 1 KB a state all told instead of 3 to 4 KB, for bounds whose states do not fit
  in memory. Two states with one fingerprint would be taken for one, and the second's futures
  not explored: the result says how many fingerprints were stored, and estimates the chance of
  such a collision (``CheckResult.collision_bound``).
"""

from __future__ import annotations

import builtins
import gc
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass

from .graph import reaching
from .invariants import check_invariants, check_transition, is_done
from .parallel import search as parallel_search
from .protocol import Action, Config, apply, enabled_actions
from .reduction import steps_to_expand
from .state import Bounds, State
from .symmetry import canonical, exact_canonical
from .variants import variant as variant_named


@dataclass(frozen=True)
class Step:
    action: Action
    state: State  # the state after the action (names as in the replayed run, not canonical)


@dataclass(frozen=True)
class Trace:
    property: str
    message: str
    initial: State
    steps: tuple[Step, ...]
    eventual: bool  # True: the last state cannot recover (not: the last step broke a property)

    def __len__(self) -> int:
        return len(self.steps)


@dataclass(frozen=True)
class Progress:
    distinct_states: int
    states_generated: int
    depth: int
    queued: int
    seconds: float
    #: "safety" or "eventual"; "again": a reduced or fingerprinted search broke ``broken`` (the
    #: figures are its), and the exact search starts, for a shortest trace
    phase: str
    broken: str | None = None


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    variant: str
    bounds: Bounds
    distinct_states: int
    states_generated: int
    depth: int
    seconds: float
    violation: Trace | None
    property: str | None  # name of the violated property, None when ok
    #: the figures are the partial-order-reduced search's (``reduction.py``); a violation's
    #: never are (it is searched again without the reduction)
    reduced: bool = False
    #: with ``fingerprints``: how many distinct fingerprints the search stored (canonical states
    #: and the raw successors looked up before canonicalisation); 0: states were stored exactly.
    #: A violation's figures never are fingerprinted (it is searched again with states stored).
    fingerprints: int = 0

    @builtins.property
    def collision_bound(self) -> float:
        """The chance that two of the states met shared a fingerprint (so that one of them may
        have gone unexplored), were fingerprints independent and uniform over 2**64 values: at
        most k(k-1)/2 pairs, each equal with chance 2**-64. An estimate, not a proof: Python's
        tuple hash is fixed, not drawn at random (its low and high bits collide at the rate a
        random hash's would: ``python -m bench.fingerprints``), and k counts the
        distinct fingerprints."""
        k = self.fingerprints
        return min(1.0, k * (k - 1) / 2 / 2.0**64)

    @builtins.property  # (a field above is named "property")
    def states_per_second(self) -> float:
        return self.distinct_states / self.seconds if self.seconds > 0 else 0.0


def check(
    bounds: Bounds,
    variant: str = "correct",
    progress: Callable[[Progress], None] | None = None,
    progress_every: float = 2.0,
    eventual: bool = True,
    jobs: int = 1,
    reduce: bool = False,
    fingerprints: bool = False,
) -> CheckResult:
    """Explore every state reachable within ``bounds`` under ``variant``; check all properties.

    ``jobs`` > 1: the search runs in that many processes (``parallel.py``); a violation is then
    searched again here, sequentially, for its shortest trace and the pinned figures.

    The cyclic garbage collector is off during the search: the search makes no reference cycles
    (its states are tuples of ints, its bookkeeping dicts, lists and arrays), so each of the
    collector's passes only walked the ever-growing set of stored states again, for nothing.  It is
    switched back on afterwards.

    ``reduce``: the partial-order reduction of ``reduction.py`` (same verdict; fewer states where
    the fault budget is spent). ``model-check`` reduces unless told ``--no-reduce``; it is off
    here, so that the figures pinned of the unreduced search stay what they are. When the
    reduced search finds a violation, the search runs again without it, so a counterexample is
    a shortest one and its figures are the unreduced search's. The parallel search (``jobs`` > 1)
    reduces too: the reduction is a function of the state, whatever order the states are met in.

    ``fingerprints``: hash compaction (the module docstring); for a pass only, like ``reduce``:
    a violation is searched again with every state stored, for its trace and figures. That search
    stops at the first violation it meets, at no greater depth than the first search's (it is
    breadth-first, over a graph with every path of the first), so it needs the memory of the
    states up to that depth; ``progress`` is told which property broke first, with phase
    ``"again"``, before it starts. (Not with ``jobs`` > 1.)"""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        fingerprints = fingerprints and jobs == 1
        result = _search(
            bounds, variant, progress, progress_every, eventual, jobs, reduce, fingerprints
        )
        if (result.reduced or result.fingerprints) and not result.ok:
            if progress is not None:
                progress(
                    Progress(
                        result.distinct_states,
                        result.states_generated,
                        result.depth,
                        0,
                        result.seconds,
                        "again",
                        result.property,
                    )
                )
            # (one process: the sequential search is the one whose trace is a shortest one)
            result = _search(bounds, variant, progress, progress_every, eventual, 1, False, False)
        return result
    finally:
        if was_enabled:
            gc.enable()


def _search(
    bounds: Bounds,
    variant: str,
    progress: Callable[[Progress], None] | None,
    progress_every: float,
    eventual: bool,
    jobs: int,
    reduce: bool,
    fingerprints: bool = False,
    fingerprint: Callable[[State], int] = hash,
) -> CheckResult:
    """The search ``check`` runs (its docstring). ``fingerprint``: the fingerprint of a state
    with ``fingerprints`` (tests weaken it to see a collision's effect)."""
    config = Config(bounds, variant_named(variant))
    n_workers = bounds.workers
    start = time.monotonic()
    if jobs > 1:

        def level_progress(
            distinct: int, generated: int, depth: int, queued: int, seconds: float
        ) -> None:
            if progress is not None:
                progress(Progress(distinct, generated, depth, queued, seconds, "safety"))

        outcome = parallel_search(config, jobs, eventual, level_progress, progress_every, reduce)
        if outcome is not None and not outcome.stuck:
            return CheckResult(
                ok=True,
                variant=variant,
                bounds=bounds,
                distinct_states=outcome.distinct_states,
                states_generated=outcome.states_generated,
                depth=outcome.depth,
                seconds=time.monotonic() - start,
                violation=None,
                property=None,
                reduced=reduce,
            )
        # a violation: the sequential search, unreduced, finds its shortest trace (and the same
        # figures)
        reduce = False
    next_report = start + progress_every

    init = canonical(config.initial(), n_workers)
    # the stored states and raw aliases (or, with fingerprints, their hashes) -> state id
    index: dict[object, int] = {fingerprint(init) if fingerprints else init: 0}
    # by id; with fingerprints, a state is dropped (None) once it has been expanded
    states: list[State | None] = [init]
    parent = array("l", [-1])
    via: list[Action | None] = [None]  # (with fingerprints: None, no trace is made)
    depth = array("l", [0])
    done = bytearray([eventual and is_done(init)])
    # the non-fault edges, for the eventual property
    rec_src = array("l")
    rec_dst = array("l")
    generated = 1  # the initial state

    stored = 0  # (len(index) once the index is cleared)

    def broken(
        last: int, extra: Action | None, bad: tuple[str, str], unrecoverable: bool
    ) -> CheckResult:
        """The result of a violation: with fingerprints its property only (no states are kept
        for a trace; ``check`` searches again), else its trace."""
        if fingerprints:
            return result(None, bad[0])
        return result(_trace(index, states, parent, via, last, extra, bad, config, unrecoverable))

    def result(violation: Trace | None, name: str | None = None) -> CheckResult:
        """``name``: the property broken, where there is no trace of it."""
        return CheckResult(
            ok=violation is None and name is None,
            variant=variant,
            bounds=bounds,
            distinct_states=len(states),
            states_generated=generated,
            depth=max(depth),
            seconds=time.monotonic() - start,
            violation=violation,
            property=name if violation is None else violation.property,
            reduced=reduce,
            fingerprints=(len(index) or stored) if fingerprints else 0,
        )

    head = 0
    while head < len(states):
        sid = head
        st = states[head]
        assert st is not None
        if fingerprints:
            states[head] = None
        head += 1
        if progress is not None and head % 512 == 0 and time.monotonic() >= next_report:
            next_report = time.monotonic() + progress_every
            progress(
                Progress(
                    len(states),
                    generated,
                    depth[sid],
                    len(states) - head,
                    time.monotonic() - start,
                    "safety",
                )
            )
        d1 = depth[sid] + 1
        for action in steps_to_expand(st, config, reduce):
            nxt = apply(st, action, config)
            generated += 1
            bad = check_transition(st, action, config)
            if bad is not None:
                return broken(sid, action, bad, False)
            # Most successors are met again and again (interleavings commute): look the raw
            # state up first, and remember it as an alias of its canonical form.
            raw: object = fingerprint(nxt) if fingerprints else nxt
            j = index.get(raw)
            if j is None:
                c = canonical(nxt, n_workers)
                key: object = fingerprint(c) if fingerprints else c
                j = index.get(key)
                if j is not None:
                    index[raw] = j
            if j is None:
                j = len(states)
                index[key] = j
                index[raw] = j
                states.append(c)
                parent.append(sid)
                via.append(None if fingerprints else action)
                depth.append(d1)
                done.append(eventual and is_done(c))
                bad = check_invariants(c, config)
                if bad is not None:
                    return broken(j, None, bad, False)
            if not action.is_fault:
                rec_src.append(sid)
                rec_dst.append(j)

    stored = len(index)
    if fingerprints:
        index.clear()  # (not needed any more: the backward search below is the memory's peak)
    if eventual:
        stuck = _unrecoverable(done, rec_src, rec_dst)
        if stuck is not None:
            msg = (
                "once faults stop, no continuation commits every task exactly once and leaves "
                "queue, in-flight lists, processing records and server registry clean"
            )
            return broken(stuck, None, ("eventual-recovery", msg), True)
    return result(None)


def _unrecoverable(done: bytearray, src: array[int], dst: array[int]) -> int | None:
    """The first (so: shallowest) state that cannot reach a done state by non-fault steps."""
    n = len(done)
    good = reaching(n, src, dst, [j for j in range(n) if done[j]])
    for j in range(n):
        if not good[j]:
            return j
    return None


def _trace(
    index: dict[object, int],
    states: list[State | None],
    parent: array[int],
    via: list[Action | None],
    last: int,
    extra: Action | None,
    bad: tuple[str, str],
    config: Config,
    eventual: bool,
) -> Trace:
    """The path to ``last`` (plus ``extra``), replayed from the real initial state so that the
    names of servers, workers and tasks stay stable along the trace (canonical states rename
    them); the violation message is recomputed on the replayed state, in its names."""
    n_workers = config.bounds.workers

    def lookup(st: State) -> int | None:
        j = index.get(st)
        return j if j is not None else index.get(canonical(st, n_workers))

    path: list[int] = []
    j = last
    while j > 0:
        path.append(j)
        j = parent[j]
    path.reverse()
    init = config.initial()
    cur = init
    steps: list[Step] = []
    for j in path:
        candidates = [(a, apply(cur, a, config)) for a in enabled_actions(cur, config)]
        match = next(((a, nxt) for a, nxt in candidates if lookup(nxt) == j), None)
        if match is None:
            # canonical() picks one representative per class only up to ties; fall back on the
            # exact (slow) representative to recognise the step
            stored = states[j]
            assert stored is not None  # (a trace is made only when every state is kept)
            want = exact_canonical(stored, n_workers)
            match = next(
                (a, nxt) for a, nxt in candidates if exact_canonical(nxt, n_workers) == want
            )
        steps.append(Step(*match))
        cur = match[1]
    name, message = bad
    if extra is not None:
        # the breaking step came from the canonical state; find the same kind of step from ours
        for action in enabled_actions(cur, config):
            if action.name != extra.name:
                continue
            broken = check_transition(cur, action, config)
            if broken is not None and broken[0] == name:
                steps.append(Step(action, apply(cur, action, config)))
                message = broken[1]
                break
        else:  # pragma: no cover
            raise AssertionError("trace replay failed")
    elif not eventual:
        again = check_invariants(cur, config)
        if again is not None:
            name, message = again
    return Trace(name, message, init, tuple(steps), eventual)
