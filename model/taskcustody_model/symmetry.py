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

from .state import Drain, ListKey, Process, Registration, State, Worker


def canonical(state: State, n_workers: int) -> State:
    n_servers = len(state.registry)
    lists = dict(state.lists)
    registered = set(state.registered)
    recs: dict[ListKey, list[int]] = {}
    for t, key in enumerate(state.records):
        if key is not None:
            recs.setdefault(key, []).append(t)

    # Incarnations, per server: the registered one first, then the processes' (oldest first),
    # then the ones only lists, records or drains still mention.
    inc_map: list[dict[int, int]] = []
    for s in range(n_servers):
        order: list[int] = []
        reg = state.registry[s]
        if reg is not None:
            order.append(reg.inc)
        for proc in state.processes[s]:
            if proc.inc not in order:
                order.append(proc.inc)
        rest = {k[1] for k in lists if k[0] == s}
        rest.update(k[1] for k in recs if k[0] == s)
        rest.update(k[1] for k in registered if k[0] == s)
        for procs in state.processes:
            for proc in procs:
                rest.update(d.key[1] for d in proc.drains if d.key[0] == s)
        order.extend(sorted(rest.difference(order)))
        inc_map.append({old: new for new, old in enumerate(order)})

    # Workers, per (server, incarnation): sorted by what they are doing and what their list and
    # the records naming it hold.
    worker_map: dict[tuple[int, int], list[int]] = {}
    for s in range(n_servers):
        procs_by_inc = {p.inc: p for p in state.processes[s]}
        for inc in inc_map[s]:
            holder = procs_by_inc.get(inc)

            def sig(
                w: int, s: int = s, inc: int = inc, holder: Process | None = holder
            ) -> tuple:  # type: ignore[type-arg]
                key = (s, inc, w)
                return (
                    holder.workers[w] if holder is not None else (),
                    holder is not None and holder.suspect == w,
                    lists.get(key, ()),
                    tuple(recs.get(key, ())),
                    key in registered,
                )

            perm = sorted(range(n_workers), key=sig)
            new_index = [0] * n_workers
            for new, old in enumerate(perm):
                new_index[old] = new
            worker_map[(s, inc)] = new_index

    def rekey_local(key: ListKey) -> tuple[int, int]:
        return inc_map[key[0]][key[1]], worker_map[(key[0], key[1])][key[2]]

    def local_process(s: int, proc: Process) -> Process:
        wm = worker_map[(s, proc.inc)]
        workers: list[Worker] = [Worker(0)] * n_workers
        for w, wk in enumerate(proc.workers):
            workers[wm[w]] = wk
        return Process(
            inc_map[s][proc.inc], proc.stalled, proc.phase, proc.drains, tuple(workers),
            proc.pending_counts, wm[proc.suspect] if proc.suspect >= 0 else -1,
        )

    # Servers: sorted by everything they own, with names inside a server already canonical.
    def server_sig(s: int) -> tuple:  # type: ignore[type-arg]
        reg = state.registry[s]
        return (
            () if reg is None else (inc_map[s][reg.inc], reg.deadline),
            tuple(
                (p.inc, p.stalled, p.phase, len(p.drains), p.workers, p.suspect)
                for p in (local_process(s, q) for q in state.processes[s])
            ),
            sorted((rekey_local(k), tasks) for k, tasks in lists.items() if k[0] == s),
            sorted((rekey_local(k), tuple(ts)) for k, ts in recs.items() if k[0] == s),
            sorted(rekey_local(k) for k in registered if k[0] == s),
        )

    server_order = sorted(range(n_servers), key=server_sig)
    server_map = [0] * n_servers
    for new, old in enumerate(server_order):
        server_map[old] = new

    def rekey(key: ListKey) -> ListKey:
        return (server_map[key[0]], *rekey_local(key))

    def full_process(s: int, proc: Process) -> Process:
        p = local_process(s, proc)
        return p._replace(
            drains=tuple(Drain(rekey(d.key), d.length, d.moved) for d in proc.drains)
        )

    registry: list[Registration | None] = [None] * n_servers
    processes: list[tuple[Process, ...]] = [()] * n_servers
    for s in range(n_servers):
        reg = state.registry[s]
        ns = server_map[s]
        if reg is not None:
            registry[ns] = Registration(inc_map[s][reg.inc], reg.deadline)
        processes[ns] = tuple(full_process(s, p) for p in state.processes[s])
    lists_ = sorted((rekey(k), tasks) for k, tasks in state.lists)
    records = [None if k is None else rekey(k) for k in state.records]

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
    for procs in processes:
        for proc in procs:
            for wk in proc.workers:
                if wk.task >= 0:
                    name.setdefault(wk.task, len(name))
            for t in proc.pending_counts:
                name.setdefault(t, len(name))
    n_tasks = len(state.committed)
    status = state.status or (0,) * n_tasks
    recoveries = state.recoveries or (0,) * n_tasks
    executions = state.executions or (0,) * n_tasks
    if len(name) < n_tasks:
        for t in sorted(
            (t for t in range(n_tasks) if t not in name),
            key=lambda t: (records[t] is None, records[t] or (), state.committed[t], status[t],
                           recoveries[t], executions[t]),
        ):
            name[t] = len(name)
    new_records: list[ListKey | None] = [None] * n_tasks
    committed = [0] * n_tasks
    new_status = [0] * n_tasks
    new_recoveries = [0] * n_tasks
    new_executions = [0] * n_tasks
    for t in range(n_tasks):
        new_records[name[t]] = records[t]
        committed[name[t]] = state.committed[t]
        new_status[name[t]] = status[t]
        new_recoveries[name[t]] = recoveries[t]
        new_executions[name[t]] = executions[t]
    return State(
        queue=tuple(name[t] for t in state.queue),
        suspects=tuple(name[t] for t in state.suspects),
        scheduled=tuple(sorted(name[t] for t in state.scheduled)),
        lists=tuple((k, tuple(name[t] for t in tasks)) for k, tasks in lists_),
        records=tuple(new_records),
        committed=tuple(committed),
        registry=tuple(registry),
        processes=tuple(
            tuple(
                p._replace(
                    workers=tuple(
                        wk if wk.task < 0 else Worker(wk.phase, name[wk.task])
                        for wk in p.workers
                    ),
                    pending_counts=tuple(name[t] for t in p.pending_counts),
                )
                for p in procs
            )
            for procs in processes
        ),
        faults=state.faults,
        stalled_ever=state.stalled_ever,
        registered=tuple(sorted(rekey(k) for k in state.registered)),
        status=tuple(new_status) if state.status else (),
        recoveries=tuple(new_recoveries) if state.recoveries else (),
        executions=tuple(new_executions) if state.executions else (),
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
