"""Symmetry reduction: servers are interchangeable, so are the workers of one incarnation and
the tasks, and incarnation numbers only matter by equality.

``canonical`` renames server ids, incarnations, worker indices and tasks so that states that
differ only by such names map to one representative.  Soundness does not depend on finding *the*
unique representative: every renaming applied is a bijection on names, applied consistently to every
place that mentions a name, so the result is a state with exactly the same futures up to renaming
(the protocol never compares names except for equality, and the properties are name-blind).
Ties between equal-looking servers or workers are broken by their current order; that can leave
a few symmetric twins unmerged, which costs states, never correctness.
"""

from __future__ import annotations

from collections.abc import Callable

from .state import Drain, ListKey, Process, Registration, State, Worker


def canonical(state: State, n_workers: int, *, plain: bool = False) -> State:
    """The representative of ``state``'s class (names chosen as the module docstring says).

    Written for speed (it runs for every successor the checker has not met as such): one pass
    per kind of place, no closures in the loops, the server order computed only when there is a
    choice, two workers' signatures compared only as far as they differ, and every place whose
    names the renaming leaves as they are kept as it is (the renamed copy would be equal).
    What it must keep is the representative itself, not only which states it merges: the
    checker's pinned figures (``tests/model/test_checker_figures.py``) depend on the tie-breaks.

    ``plain=True`` (for tests) takes none of the fast paths: every name is mapped, even where the
    renaming leaves it as it is, two workers are sorted by their whole signatures as more are, and
    the servers by theirs; it is the version this one was optimised from, and
    ``tests/model/test_symmetry.py`` holds the fast paths to it on every successor of searches at
    small bounds."""
    registry = state.registry
    processes = state.processes
    n_servers = len(registry)
    lists = dict(state.lists)
    registered = set(state.registered)
    recs: dict[ListKey, list[int]] = {}
    for t, key in enumerate(state.records):
        if key is not None:
            if key in recs:
                recs[key].append(t)
            else:
                recs[key] = [t]

    # Incarnations, per server: the registered one first, then the processes' (oldest first),
    # then the ones only lists, records or drains still mention.
    mentioned: list[set[int]] = [set() for _ in range(n_servers)]
    for k in lists:
        mentioned[k[0]].add(k[1])
    for k in recs:
        mentioned[k[0]].add(k[1])
    for k in registered:
        mentioned[k[0]].add(k[1])
    for procs in processes:
        for proc in procs:
            for d in proc.drains:
                mentioned[d.key[0]].add(d.key[1])

    inc_map: list[dict[int, int]] = []
    # Workers, per (server, incarnation): sorted by what they are doing and what their list and
    # the records naming it hold.
    worker_map: dict[tuple[int, int], list[int]] = {}
    workers_range = range(n_workers)
    # whether the renaming leaves every incarnation and worker index as it is (then only the
    # servers' order and the tasks' names can change)
    same_slots = not plain
    two = n_workers == 2 and not plain
    for s in range(n_servers):
        order: list[int] = []
        reg = registry[s]
        if reg is not None:
            order.append(reg.inc)
        procs = processes[s]
        for proc in procs:
            if proc.inc not in order:
                order.append(proc.inc)
        rest = mentioned[s].difference(order)
        if rest:
            order.extend(sorted(rest))
        imap = {old: new for new, old in enumerate(order)}
        inc_map.append(imap)
        if same_slots:
            for new, old in enumerate(order):
                if new != old:
                    same_slots = False
                    break
        for inc in order:
            if n_workers == 1:
                worker_map[(s, inc)] = [0]
                continue
            holder = None
            for p in procs:
                if p.inc == inc:
                    holder = p  # (the last one, as a dict by incarnation keeps it)
            if two:
                # the usual case: the two signatures below, compared as tuples are (element by
                # element, up to the first that differs), each element computed only if needed
                swap = _second_first(holder, s, inc, lists, recs, registered)
                worker_map[(s, inc)] = [1, 0] if swap else [0, 1]
                if swap:
                    same_slots = False
                continue
            sigs = []
            for w in workers_range:
                key = (s, inc, w)
                sigs.append(
                    (
                        holder.workers[w] if holder is not None else (),
                        holder is not None and holder.suspect == w,
                        lists.get(key, ()),
                        tuple(recs.get(key, ())),
                        key in registered,
                    )
                )
            new_index = [0] * n_workers
            for new, old in enumerate(sorted(workers_range, key=sigs.__getitem__)):
                new_index[old] = new
                if new != old:
                    same_slots = False
            worker_map[(s, inc)] = new_index

    # Each process with its incarnation and workers renamed (drains and tasks not yet).
    local: list[list[Process]] = []
    for s in range(n_servers):
        row = []
        for proc in processes[s]:
            wm = worker_map[(s, proc.inc)]
            new_inc = inc_map[s][proc.inc]
            if (
                new_inc == proc.inc
                and (n_workers == 1 or wm[0] == 0)
                and (n_workers <= 2 or wm == sorted(wm))
                and not plain
            ):
                row.append(proc)  # nothing of it renamed here
                continue
            workers: list[Worker] = list(proc.workers)
            for w, wk in enumerate(proc.workers):
                workers[wm[w]] = wk
            row.append(
                Process(
                    new_inc,
                    proc.stalled,
                    proc.phase,
                    proc.drains,
                    tuple(workers),
                    proc.pending_counts,
                    wm[proc.suspect] if proc.suspect >= 0 else -1,
                )
            )
        local.append(row)

    # Servers: sorted by everything they own, with names inside a server already canonical.
    server_map = list(range(n_servers))
    if n_servers > 1:
        # The signature's head (registration and processes) usually tells the servers apart;
        # its tail (what the server's lists, records and registrations hold) is computed only
        # when two heads tie, which orders exactly as the whole signature would.
        sigs_s: list[tuple] = [  # type: ignore[type-arg]
            (
                ()
                if registry[s] is None
                else (
                    inc_map[s][registry[s].inc],  # type: ignore[union-attr]
                    registry[s].deadline,  # type: ignore[union-attr]
                ),
                tuple(
                    (p.inc, p.stalled, p.phase, len(p.drains), p.workers, p.suspect)
                    for p in local[s]
                ),
            )
            for s in range(n_servers)
        ]
        if len(set(sigs_s)) < n_servers or plain:
            for s in range(n_servers):
                imap = inc_map[s]

                def rekey_local(k: ListKey, imap: dict[int, int] = imap) -> tuple[int, int]:
                    return imap[k[1]], worker_map[(k[0], k[1])][k[2]]

                sigs_s[s] = (
                    *sigs_s[s],
                    sorted((rekey_local(k), tasks) for k, tasks in lists.items() if k[0] == s),
                    sorted((rekey_local(k), tuple(ts)) for k, ts in recs.items() if k[0] == s),
                    sorted(rekey_local(k) for k in registered if k[0] == s),
                )
        for new, old in enumerate(sorted(range(n_servers), key=sigs_s.__getitem__)):
            server_map[old] = new
            if new != old:
                same_slots = False

    def rekey(key: ListKey) -> ListKey:
        return (server_map[key[0]], inc_map[key[0]][key[1]], worker_map[(key[0], key[1])][key[2]])

    new_registry: list[Registration | None] = [None] * n_servers
    new_local: list[list[Process]] = [[]] * n_servers
    for s in range(n_servers):
        reg = registry[s]
        ns = server_map[s]
        if reg is not None:
            new_inc = inc_map[s][reg.inc]
            new_registry[ns] = (
                reg if new_inc == reg.inc and not plain else Registration(new_inc, reg.deadline)
            )
        new_local[ns] = local[s]
    if same_slots:
        # no list key is renamed: the keys keep their order, and records their keys
        lists_ = list(state.lists)
        records = state.records
    else:
        lists_ = sorted((rekey(k), tasks) for k, tasks in state.lists)
        records = tuple([None if k is None else rekey(k) for k in state.records])

    # Tasks: renamed in the order they are met walking the queue (next first), the lists, the
    # workers' hands, then by record and commit count.  Only identity matters to the protocol.
    name: dict[int, int] = {}
    for t in reversed(state.queue):
        name.setdefault(t, len(name))
    for t in reversed(state.suspects):
        name.setdefault(t, len(name))
    for t in state.scheduled:
        name.setdefault(t, len(name))
    for _, tasks in lists_:
        for t in reversed(tasks):
            name.setdefault(t, len(name))
    for row in new_local:
        for proc in row:
            for wk in proc.workers:
                if wk.task >= 0:
                    name.setdefault(wk.task, len(name))
            for t in proc.pending_counts:
                name.setdefault(t, len(name))
    committed = state.committed
    n_tasks = len(committed)
    status = state.status or (0,) * n_tasks
    recoveries = state.recoveries or (0,) * n_tasks
    executions = state.executions or (0,) * n_tasks
    if len(name) < n_tasks:
        for t in sorted(
            (t for t in range(n_tasks) if t not in name),
            key=lambda t: (
                records[t] is None,
                records[t] or (),
                committed[t],
                status[t],
                recoveries[t],
                executions[t],
            ),
        ):
            name[t] = len(name)
    same_tasks = not plain
    for t in range(n_tasks):
        if name[t] != t:
            same_tasks = False
            break
    registered_ = (
        state.registered if same_slots else tuple(sorted(rekey(k) for k in state.registered))
    )
    fresh_ = (
        state.fresh
        if same_slots or not state.fresh
        else tuple(sorted(rekey(k) for k in state.fresh))
    )
    if same_tasks:
        # the tasks keep their names: every place that holds only tasks is kept as it is
        return State(
            queue=state.queue,
            suspects=state.suspects,
            scheduled=state.scheduled,
            lists=tuple(lists_),
            records=records,
            committed=committed,
            registry=tuple(new_registry),
            processes=tuple(
                tuple(p if same_slots or not p.drains else _renamed(p, name, rekey) for p in row)
                for row in new_local
            ),
            faults=state.faults,
            stalled_ever=state.stalled_ever,
            registered=registered_,
            fresh=fresh_,
            status=state.status,
            recoveries=state.recoveries,
            executions=state.executions,
        )
    new_records: list[ListKey | None] = [None] * n_tasks
    new_committed = [0] * n_tasks
    new_status = [0] * n_tasks
    new_recoveries = [0] * n_tasks
    new_executions = [0] * n_tasks
    for t in range(n_tasks):
        nt = name[t]
        new_records[nt] = records[t]
        new_committed[nt] = committed[t]
        new_status[nt] = status[t]
        new_recoveries[nt] = recoveries[t]
        new_executions[nt] = executions[t]
    return State(
        queue=tuple([name[t] for t in state.queue]),
        suspects=tuple([name[t] for t in state.suspects]),
        scheduled=tuple(sorted([name[t] for t in state.scheduled])),
        lists=tuple([(k, tuple([name[t] for t in tasks])) for k, tasks in lists_]),
        records=tuple(new_records),
        committed=tuple(new_committed),
        registry=tuple(new_registry),
        processes=tuple(tuple([_renamed(p, name, rekey) for p in row]) for row in new_local),
        faults=state.faults,
        stalled_ever=state.stalled_ever,
        registered=registered_,
        fresh=fresh_,
        status=tuple(new_status) if state.status else (),
        recoveries=tuple(new_recoveries) if state.recoveries else (),
        executions=tuple(new_executions) if state.executions else (),
    )


def _second_first(
    holder: Process | None,
    s: int,
    inc: int,
    lists: dict[ListKey, tuple[int, ...]],
    recs: dict[ListKey, list[int]],
    registered: set[ListKey],
) -> bool:
    """Whether worker 1's signature sorts before worker 0's (two workers of incarnation ``inc``
    of server ``s``). A signature is (the worker, whether it holds the suspect slot, its list,
    the tasks whose records name its list, whether its list is registered), compared as a tuple
    is: the first element that differs decides."""
    if holder is not None:
        w0, w1 = holder.workers[0], holder.workers[1]
        if w0 != w1:
            return bool(w1 < w0)
        a, b = holder.suspect == 0, holder.suspect == 1
        if a != b:
            return b < a
    k0, k1 = (s, inc, 0), (s, inc, 1)
    l0, l1 = lists.get(k0, ()), lists.get(k1, ())
    if l0 != l1:
        return l1 < l0
    r0, r1 = tuple(recs.get(k0, ())), tuple(recs.get(k1, ()))
    if r0 != r1:
        return r1 < r0
    return (k1 in registered) < (k0 in registered)


def _renamed(p: Process, name: dict[int, int], rekey: Callable[[ListKey], ListKey]) -> Process:
    """A process of ``canonical``, its workers already renamed: its tasks and drains renamed."""
    workers = p.workers
    for wk in workers:
        if wk.task >= 0:
            workers = tuple(w if w.task < 0 else Worker(w.phase, name[w.task]) for w in workers)
            break
    if not p.drains and not p.pending_counts:
        return p if workers is p.workers else p._replace(workers=workers)
    return Process(
        p.inc,
        p.stalled,
        p.phase,
        tuple(Drain(rekey(d.key), d.length, d.moved) for d in p.drains),
        workers,
        tuple(name[t] for t in p.pending_counts),
        p.suspect,
    )


def rename(
    state: State,
    servers: list[int],
    incs: list[dict[int, int]],
    workers: dict[tuple[int, int], list[int]],
    tasks: list[int],
) -> State:
    """Apply one renaming: ``servers[s]``, ``incs[s][inc]``, ``workers[(s, inc)][w]`` and
    ``tasks[t]`` are the new names (old server/incarnation numbers index the maps)."""

    def key(k: ListKey) -> ListKey:
        s, inc, w = k
        return (servers[s], incs[s][inc], workers[(s, inc)][w])

    n = len(state.registry)
    registry: list[Registration | None] = [None] * n
    processes: list[tuple[Process, ...]] = [()] * n
    for s in range(n):
        reg = state.registry[s]
        if reg is not None:
            registry[servers[s]] = Registration(incs[s][reg.inc], reg.deadline)
        procs = []
        for p in state.processes[s]:
            wm = workers[(s, p.inc)]
            ws: list[Worker] = list(p.workers)
            for w, wk in enumerate(p.workers):
                ws[wm[w]] = wk if wk.task < 0 else Worker(wk.phase, tasks[wk.task])
            procs.append(
                Process(
                    incs[s][p.inc],
                    p.stalled,
                    p.phase,
                    tuple(Drain(key(d.key), d.length, d.moved) for d in p.drains),
                    tuple(ws),
                    tuple(tasks[t] for t in p.pending_counts),
                    wm[p.suspect] if p.suspect >= 0 else -1,
                )
            )
        processes[servers[s]] = tuple(procs)
    records: list[ListKey | None] = [None] * len(state.records)
    committed = [0] * len(state.committed)
    status = [0] * len(state.status)
    recoveries = [0] * len(state.recoveries)
    executions = [0] * len(state.executions)
    for t, k in enumerate(state.records):
        records[tasks[t]] = None if k is None else key(k)
        committed[tasks[t]] = state.committed[t]
        if state.status:
            status[tasks[t]] = state.status[t]
        if state.recoveries:
            recoveries[tasks[t]] = state.recoveries[t]
        if state.executions:
            executions[tasks[t]] = state.executions[t]
    return State(
        queue=tuple(tasks[t] for t in state.queue),
        suspects=tuple(tasks[t] for t in state.suspects),
        scheduled=tuple(sorted(tasks[t] for t in state.scheduled)),
        lists=tuple(sorted((key(k), tuple(tasks[t] for t in ts)) for k, ts in state.lists)),
        records=tuple(records),
        committed=tuple(committed),
        registry=tuple(registry),
        processes=tuple(processes),
        faults=state.faults,
        stalled_ever=state.stalled_ever,
        registered=tuple(sorted(key(k) for k in state.registered)),
        fresh=tuple(sorted(key(k) for k in state.fresh)),
        status=tuple(status),
        recoveries=tuple(recoveries),
        executions=tuple(executions),
    )


def exact_canonical(state: State, n_workers: int) -> State:
    """The least renaming of ``state`` over *all* renamings: a unique representative of its
    class, but exponential; used only to replay counterexample traces."""
    from itertools import permutations, product

    n_servers = len(state.registry)
    incs_of: list[list[int]] = []
    for s in range(n_servers):
        found = set()
        reg = state.registry[s]
        if reg is not None:
            found.add(reg.inc)
        found.update(p.inc for p in state.processes[s])
        found.update(k[1] for k, _ in state.lists if k[0] == s)
        found.update(k[1] for k in state.records if k is not None and k[0] == s)
        found.update(k[1] for k in state.registered if k[0] == s)
        for procs in state.processes:
            for p in procs:
                found.update(d.key[1] for d in p.drains if d.key[0] == s)
        incs_of.append(sorted(found))
    slots = [(s, inc) for s in range(n_servers) for inc in incs_of[s]]
    best: State | None = None
    best_key = ""
    for sperm in permutations(range(n_servers)):
        for iperms in product(*(permutations(range(len(incs_of[s]))) for s in range(n_servers))):
            incs = [
                {old: iperms[s][k] for k, old in enumerate(incs_of[s])} for s in range(n_servers)
            ]
            for wperms in product(*(permutations(range(n_workers)) for _ in slots)):
                workers = {slot: list(wp) for slot, wp in zip(slots, wperms, strict=True)}
                for tperm in permutations(range(len(state.committed))):
                    cand = rename(state, list(sperm), incs, workers, list(tperm))
                    k = repr(cand)  # None and tuples do not compare; their reprs do
                    if best is None or k < best_key:
                        best, best_key = cand, k
    assert best is not None
    return best
