"""A partial-order reduction of the checker's search: in a state where the fault budget is spent,
one step that commutes with everything else is taken alone (a singleton *ample set*).

Why it is needed: with two processes per server id, a stalled process keeps its workers running
beside its successor, and the checker met every interleaving of their steps with the rest: the
bound we want in CI (3 tasks, 2 x 2, 2 faults, 2 processes per id) has millions of states. Most of
them differ only in when a step that touches nothing anybody else reads was taken: a stalled
process's resumption (its ``stalled`` flag is read by its own server loop only, once its
registration is not its own), a healthy worker's ``record`` (which writes its own task's record,
naming a list that stays live), a restart or an empty reconcile.

**The rule** (``ample``). In a state ``s`` whose fault budget is spent, if an enabled step ``a``
is *eligible* (below), the search expands ``s`` by ``a`` alone (the first eligible one, in
``enabled_actions``'s order). States with fault budget left are always expanded fully.

**Eligible steps**, each with the reason it is independent of every other step, now and on every
path that does not take it (condition C1 of ample sets), and invisible (it changes no property):

``resume_server`` of a stalled process P of server id s that is not superseded, when the
registry's entry for s is not P's incarnation (none, or a newer one), and registrations do not
age (``Bounds.registration_ages`` off). Its only effect is ``P.stalled = False``. What reads that
flag: (1) P's own server loop (heartbeat, sweeps, ...), enabled only after the resumption, so no
path without it can take them; (2) ``renewed(state, s, inc)``, which the clock asks only of the
registry's incarnation (``advance_clock``, ``_clock_may_advance``), not P's; with aging it is
asked of every fresh registration, P's lists' too, hence the exclusion. It stays true on every
path without the resumption: the registry's entry becomes P's incarnation only by P's heartbeat
(not enabled while P is stalled), never by a claim (a fresh incarnation is one nothing mentions,
and P mentions its own); P becomes superseded only by its own heartbeat; a stall, a crash or a
Redis wipe is a fault. No other step is enabled or disabled by it but P's loop, and no invariant,
the transition property or ``is_done`` reads ``stalled``.

``record`` of worker w of a process P of server id s holding task t (its only enabled step once
faults are spent), when P is running, not stalled, and registered with a fresh deadline (the
registry's entry for s is ``(P.inc, TTL)``); its list L = (s, P.inc, w); no other process of s is
claimed or starting (a startup drain drains every other incarnation of its id), no drain in
progress names L; t's record is None or names L (or t is not in L); the design takes into lists,
its sweep skips live lists, and executions are not counted (``Bounds.max_recoveries`` None).
Its effect: w becomes RECORDED, and if t is in L the record of t names L. Then L is live on every
path: P renews its registration (it is healthy, and only a fault makes it otherwise), a claim of
s needs the registration expired, a prune removes only expired ones, a heartbeat of another
process of s finds a newer incarnation and supersedes only itself. So nothing drains L (a sweep
skips live lists, no startup drain of s is pending or can begin, no drain of L is in progress),
and the processing sweep requeues only records naming lists that are not live: never t's, before
or after. Nobody else writes t's record (another worker holding t, after a stall, finds t not in
its list and writes nothing; a release or a drain deletes only records naming its own list), and
nobody but P's heartbeat reads w's phase (and P stays registered, so it is never superseded). No
invariant reads records (but the BLPOP design's no-loss, excluded), the transition property reads
lists and the registry, and ``is_done`` needs every list empty: it is false before and after when
t is in L, and when it is not, only w's phase changes, which ``is_done`` does not read.

``restart_worker`` of a crashed worker w, and ``reconcile`` of a dirty worker w whose list is
empty and which does not hold its process's suspect slot, in a process P that is healthy and
registered as above (so, on every path, it stays so, and its heartbeat never supersedes it). The
effect is w's phase only (crashed to dirty, dirty to idle: an empty list moves nothing to the
queue, and the slot is not w's to free). Nobody else reads w's phase (a supersession would, and
there is none; the settling of a superseded process, the same), w's list stays empty (only w
takes into it), and no property reads a phase but ``HOLDING`` ones, which these are not.

The measure ``progress`` (a rank per worker phase and one per process not stalled) rises by one
with each eligible step, so no cycle of the reduced graph consists of single expansions only:
the cycle proviso (C3) holds without a check during the search.

**Why the verdict is the same.** The reduced graph is a subgraph of the full one, so every
violation it shows is real. Conversely, let a path pi lead from an explored state s to a state u
that breaks an invariant or the transition property, or (the eventual property) to a done state.
If s is expanded fully, the search follows pi's first step. If s is expanded by a alone: when pi
takes a, a commutes with every step before it (C1), so a, then pi without a, leads to u as well,
one step shorter after a; when pi does not take a, a(s) -pi-> a(u), and a(u) is as bad, or as
done, as u (a is invisible). The chain of single expansions met this way is finite (each of its
steps raises ``progress``, which is bounded), and ends in a fully expanded state or one where pi
takes a: by induction on pi's length, the reduced search reaches a state that is as bad as u (or
done). For the eventual property (from every explored state, a done state is reachable without
faults): a state u of the full graph that cannot reach done is reachable, by the same argument,
as a state u' with u -> u' (a's appended), and u' cannot reach done either; and from an explored
state, a done state is reachable in the reduced graph iff in the full one (the argument above
with "done" for "bad"; only spent-budget states are reduced, where every step is a non-fault
step, and a non-fault step never restores budget). Symmetry: the rule and every condition name
no server, incarnation, worker or task, so they hold of a state iff of its renamings, and the
argument runs on the quotient graph.

**What is not kept**: the shortest counterexample (a reduced path may take eligible steps a
shortest one does not need) and the counts of states. So ``checker.check`` searches again
without the reduction when the reduced search finds a violation (the trace and figures are then
exactly the unreduced ones), and the reduced search's figures are reported only for a pass.
``tests/model/test_reduction.py`` checks the independence and invisibility claims above on every
state of unreduced searches at small bounds, and the verdicts of both searches on every design.
"""

from __future__ import annotations

from .protocol import Action, Config, enabled_actions
from .state import (
    CLAIMED,
    CRASHED,
    DIRTY,
    IDLE,
    RECORDED,
    RUNNING,
    STARTING,
    SUPERSEDED,
    TAKEN,
    TTL,
    Registration,
    State,
    list_of,
)


def steps_to_expand(state: State, config: Config, reduce: bool) -> list[Action]:
    """The steps a search expands ``state`` by: every enabled one, or with ``reduce`` the ample
    one alone where there is one (the sequential and the parallel search both ask)."""
    actions = enabled_actions(state, config)
    if reduce:
        alone = ample(state, actions, config)
        if alone is not None:
            return [alone]
    return actions


def ample(state: State, actions: list[Action], config: Config) -> Action | None:
    """The step to expand ``state`` by alone, or None (expand it fully): the first eligible one
    of ``actions`` (the enabled steps, in their order) once the fault budget is spent."""
    if state.faults < config.bounds.faults:
        return None
    for action in actions:
        if eligible(state, action, config):
            return action
    return None


#: each eligible step raises ``progress`` by one (a worker's phase one rank up, or a process
#: resumed), so no cycle of the reduced graph is made of single expansions only (the cycle
#: proviso, C3, holds without a check during the search)
_RANK = {CRASHED: 0, DIRTY: 1, IDLE: 2, TAKEN: 0, RECORDED: 1}


def progress(state: State) -> int:
    """The measure every eligible step raises by one."""
    return sum(
        (not proc.stalled) + sum(_RANK.get(wk.phase, 0) for wk in proc.workers)
        for procs in state.processes
        for proc in procs
    )


def eligible(state: State, action: Action, config: Config) -> bool:
    """Whether ``action`` (enabled in ``state``, whose fault budget is spent) commutes with every
    other step and changes no property (the module docstring gives the reasons)."""
    if action.name == "resume_server":
        return _resume_alone(state, action, config)
    if action.name == "record":
        return _record_alone(state, action, config)
    if action.name == "reconcile":
        return _reconcile_alone(state, action)
    if action.name == "restart_worker":
        return _restart_alone(state, action)
    return False


def _healthy_registered(state: State, s: int, i: int) -> bool:
    """Process ``i`` of server id ``s`` runs, is not stalled, and holds the registration with a
    fresh deadline: with the fault budget spent, it stays so on every path."""
    proc = state.processes[s][i]
    return (
        not proc.stalled
        and proc.phase == RUNNING
        and state.registry[s] == Registration(proc.inc, TTL)
    )


def _reconcile_alone(state: State, action: Action) -> bool:
    s, i, w = action.server, action.proc, action.worker
    proc = state.processes[s][i]
    return (
        _healthy_registered(state, s, i)
        and proc.suspect != w
        and not list_of(state, (s, proc.inc, w))
    )


def _restart_alone(state: State, action: Action) -> bool:
    return _healthy_registered(state, action.server, action.proc)


def _resume_alone(state: State, action: Action, config: Config) -> bool:
    proc = state.processes[action.server][action.proc]
    if proc.phase == SUPERSEDED or config.bounds.registration_ages:
        return False
    reg = state.registry[action.server]
    return reg is None or reg.inc != proc.inc


def _record_alone(state: State, action: Action, config: Config) -> bool:
    v = config.variant
    if not (v.take_into_list and v.sweep_skips_live) or config.bounds.max_recoveries is not None:
        return False
    s, i, w = action.server, action.proc, action.worker
    if not _healthy_registered(state, s, i):
        return False
    procs = state.processes[s]
    proc = procs[i]
    if any(j != i and q.phase in (CLAIMED, STARTING) for j, q in enumerate(procs)):
        return False
    key = (s, proc.inc, w)
    t = proc.workers[w].task
    if state.records[t] not in (None, key) and t in list_of(state, key):
        return False
    return not any(d.key == key for ps in state.processes for q in ps for d in q.drains)
