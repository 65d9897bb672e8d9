"""A breadth-first search over several processes: ``check(..., jobs=N)``.

The search of ``checker.check``, split by owner: each canonical state belongs to the worker
process ``hash(state) % N`` (the frontier partitioned by hash).  The search is level-synchronous:

1. every worker expands its states of the current level, computes each successor's canonical form
   (``apply`` and ``canonical``, the costly part, spread over the workers) and keeps the ones it
   owns; the ones another worker owns go into that worker's outbox, each canonical state once per
   level with the states it was reached from by a non-fault step;
2. the coordinator (this process) routes the outboxes; every worker adds the states it receives
   that it has not seen.  The states added in a level are the next level.

Why the figures are those of the sequential search: the states explored are the closure of the
initial canonical state under "canonical form of a successor", whatever the order (a raw
successor already met is looked up first, as the sequential search does); each is expanded once,
so the transitions generated are the same; and a level-synchronous search gives every state its
breadth-first depth.  ``tests/model/test_parallel.py`` asserts the same states, transitions and
depth as the sequential search at small bounds, for the correct design and every broken one.

Violations: a worker that meets one stops the search, and ``check`` runs the sequential search
again, which stops at the first violation in its own order: the same counterexample, the same
figures (the broken designs are found within a few thousand states, so the second run is short).
The eventual property is computed here, by the same backward search over the non-fault edges
that the workers report; a state that cannot recover makes ``check`` run the sequential search,
for its trace.

The owner of a state is a hash of its parts that hold no ``None`` (whose hash is an address in
Python 3.11), so the partition, and with it the search, is the same on every run.

Known difference: ``canonical`` is not idempotent on every state (its tie-breaks look at task
names before it renames the tasks), so the sequential search's figures depend on its order: a raw
successor that happens to equal a canonical state already stored is merged with it without being
canonicalised.  The parallel search meets states in another order, so where that happens its
figures differ slightly (7,629 states against 7,536 at 3 tasks, 2 x 2, 1 fault, one process per
id).  Both are sound: every state either search stores is a state of the model, and every
reachable state has its canonical form (a renaming of it) explored.  The verdicts are the same
(``tests/model/test_parallel.py``); the pinned figures are the sequential search's.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import time
from array import array
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from .graph import reaching
from .invariants import check_invariants, check_transition, is_done
from .protocol import Config, apply
from .reduction import steps_to_expand
from .state import State
from .symmetry import canonical

_PICKLE = pickle.HIGHEST_PROTOCOL


class _Found(Exception):
    """A worker met a violation: the coordinator falls back on the sequential search."""


class Outcome:
    """What the parallel search found when no worker met a safety violation."""

    def __init__(self, distinct: int, generated: int, depth: int, stuck: bool) -> None:
        self.distinct_states = distinct
        self.states_generated = generated
        self.depth = depth
        self.stuck = stuck  # some state cannot recover (the eventual property is violated)


def owner(c: State, n: int) -> int:
    """The worker that owns canonical state ``c`` (the same on every run: no ``None`` hashed)."""
    return hash((c.queue, c.lists, c.processes, c.committed, c.faults, c.registered)) % n


def _worker(k: int, n: int, config: Config, conn: Connection, reduce: bool) -> None:
    """One worker's side of the search: the states it owns, by local id (global id: id * n + k)."""
    nw = config.bounds.workers
    index: dict[State, int] = {}  # canonical states and raw aliases -> local id
    #: raw successors owned elsewhere -> their canonical form (a canonical form sent is its own)
    remote: dict[State, State] = {}
    remote_id: dict[State, int] = {}  # canonical states owned elsewhere -> their global id
    states: list[State] = []
    src = array("q")  # the non-fault edges this worker met (global ids)
    dst = array("q")
    frontier: list[int] = []
    new: list[int] = []
    sent: list[list[State]] = [[] for _ in range(n)]  # this level's outboxes, in order
    bad = False

    def add(c: State) -> int:
        nonlocal bad
        j = index.get(c)
        if j is None:
            j = len(states)
            index[c] = j
            states.append(c)
            new.append(j)
            if check_invariants(c, config) is not None:
                bad = True
        return j

    init = canonical(config.initial(), nw)
    if owner(init, n) == k:
        add(init)
    try:
        while True:
            cmd = conn.recv()
            if cmd == "expand":
                frontier, new = new, []
                out: list[dict[State, list[int]]] = [{} for _ in range(n)]
                generated = 0
                for sid in frontier:
                    st = states[sid]
                    gsrc = sid * n + k
                    for action in steps_to_expand(st, config, reduce):
                        nxt = apply(st, action, config)
                        generated += 1
                        if check_transition(st, action, config) is not None:
                            raise _Found
                        j = index.get(nxt)
                        if j is not None:
                            g = j * n + k
                        else:
                            c = remote.get(nxt)
                            if c is None:
                                c = canonical(nxt, nw)
                                home = owner(c, n)
                                if home == k:
                                    j = add(c)
                                    index[nxt] = j
                                    if bad:
                                        raise _Found
                                else:
                                    remote[nxt] = c
                                    remote[c] = c
                            if j is not None:
                                g = j * n + k
                            else:
                                known = remote_id.get(c)
                                if known is None:
                                    box = out[owner(c, n)]
                                    srcs = box.get(c)
                                    if srcs is None:
                                        srcs = box[c] = []
                                    if not action.is_fault:
                                        srcs.append(gsrc)
                                    continue
                                g = known
                        if not action.is_fault:
                            src.append(gsrc)
                            dst.append(g)
                sent = [list(box) for box in out]
                conn.send((False, generated, [pickle.dumps(box, _PICKLE) for box in out]))
            elif cmd == "receive":
                ids = []
                for blob in conn.recv():
                    got = array("q")
                    for c, srcs in pickle.loads(blob).items():
                        g = add(c) * n + k
                        got.append(g)
                        for s in srcs:
                            src.append(s)
                            dst.append(g)
                    ids.append(got.tobytes())
                conn.send((bad, len(new), ids))
            elif cmd == "ids":
                # the global ids of what this worker sent, from each owner
                for home, blob in conn.recv():
                    got = array("q")
                    got.frombytes(blob)
                    for c, g in zip(sent[home], got, strict=True):
                        remote_id[c] = g
                sent = [[] for _ in range(n)]
            elif cmd == "finish":
                done = array("q", (j * n + k for j, st in enumerate(states) if is_done(st)))
                conn.send((len(states), src.tobytes(), dst.tobytes(), done.tobytes()))
                return
            else:  # "stop"
                return
    except _Found:
        conn.send((True, 0, []))
        conn.recv()  # the coordinator's "stop"


def search(
    config: Config,
    jobs: int,
    eventual: bool,
    progress: Callable[[int, int, int, int, float], None] | None = None,
    progress_every: float = 2.0,
    reduce: bool = False,
) -> Outcome | None:
    """The parallel search; None when a worker met a safety violation (the caller then searches
    sequentially, for the counterexample).  ``progress(distinct, generated, depth, queued,
    seconds)`` is called between levels, at most every ``progress_every`` seconds. ``reduce``:
    each worker expands a state as ``checker`` does with the partial-order reduction (``ample``
    is a function of the state alone, so the reduced graph is the same in any order)."""
    ctx = multiprocessing.get_context("fork")
    pipes: list[Connection] = []
    procs: list[Any] = []
    for k in range(jobs):
        here, there = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(k, jobs, config, there, reduce), daemon=True)
        p.start()
        there.close()
        pipes.append(here)
        procs.append(p)
    start = time.monotonic()
    next_report = start + progress_every
    try:
        distinct = 1
        generated = 1  # the initial state
        depth = 0
        level = 0
        while True:
            for conn in pipes:
                conn.send("expand")
            replies = [conn.recv() for conn in pipes]
            generated += sum(r[1] for r in replies)
            if any(r[0] for r in replies):
                return None
            senders = [[j for j in range(jobs) if j != k] for k in range(jobs)]
            for k, conn in enumerate(pipes):
                conn.send("receive")
                conn.send([replies[j][2][k] for j in senders[k]])
            counts = [conn.recv() for conn in pipes]
            if any(c[0] for c in counts):
                return None
            # each owner's ids of the states it received, back to their senders
            back: list[list[tuple[int, bytes]]] = [[] for _ in range(jobs)]
            for k in range(jobs):
                for j, blob in zip(senders[k], counts[k][2], strict=True):
                    back[j].append((k, blob))
            for k, conn in enumerate(pipes):
                conn.send("ids")
                conn.send(back[k])
            level += 1
            added = sum(c[1] for c in counts)
            if not added:
                break
            distinct += added
            depth = level
            if progress is not None and time.monotonic() >= next_report:
                next_report = time.monotonic() + progress_every
                progress(distinct, generated, depth, added, time.monotonic() - start)
        for conn in pipes:
            conn.send("finish")
        finals = [conn.recv() for conn in pipes]
    except EOFError:
        raise RuntimeError("a worker of the parallel search died") from None
    finally:
        for conn in pipes:
            with contextlib.suppress(OSError):
                conn.send("stop")
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
    stuck = eventual and _unrecoverable(jobs, finals)
    return Outcome(sum(f[0] for f in finals), generated, depth, stuck)


def _unrecoverable(jobs: int, finals: list[tuple[int, bytes, bytes, bytes]]) -> bool:
    """Whether some state cannot reach a done state by non-fault steps (``checker``'s backward
    search, over the global ids of every worker's states; ids no state has count as good)."""
    size = jobs * max(f[0] for f in finals)
    src = array("q")
    dst = array("q")
    done = array("q")
    good = bytearray(b"\x01") * size
    for k, (count, s, d, g) in enumerate(finals):
        src.frombytes(s)
        dst.frombytes(d)
        done.frombytes(g)
        for j in range(count):
            good[j * jobs + k] = 0
    good = reaching(size, src, dst, done, good)
    return 0 in good
