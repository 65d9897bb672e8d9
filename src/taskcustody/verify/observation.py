"""The harness's observation part: reading Redis back into the model's terms, and judging it.

Nothing here changes Redis or the model's state. `Observation.observe()` reads this run's keys
with the admin client (never faulted) and maps them to a model `State`; `check()` compares it with
the model's prediction and checks every property on both; `check_eventual()` checks the end of a
run (every task committed exactly once, nothing left in custody); `tallies()` counts a run's
outcomes, Jepsen-style.

The mapping. Model tasks `0..n-1` are task ids `t0..`; model server `s` is server id `s<s>`; model
incarnations are renamed real ones (the model reuses the smallest free number, Redis counts up:
the stepping part keeps the renaming in `names`, fixed at each claim). Registrations map to
relative deadlines in ticks (`TICK`). Worker phases come from the implementation's own flags
(`Worker.dirty`, `Server.superseded`) and from what its steps returned (`WorkerSlot`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

import redis
from taskcustody_model import Action, Config, State, check_invariants
from taskcustody_model.state import (
    ARMED,
    CLAIMED,
    CRASHED,
    DIRTY,
    ENQUEUED,
    IDLE,
    POISONED,
    RECORDED,
    RUNNING,
    STOPPED,
    SUPERSEDED,
    TAKEN,
    WIPED,
    Bounds,
    ListKey,
    Process,
    Registration,
)
from taskcustody_model.state import (
    Worker as ModelWorker,
)

from ..core import recovery
from ..core.clock import ManualClock
from ..core.envelope import Task, decode
from ..core.keys import ListOwner, QueueKeys
from ..core.outcome import Outcome
from ..core.recovery import parse_record
from ..core.server import Server
from ..core.settings import Settings
from ..core.worker import Worker
from ..deploy import cluster

#: One model tick of the clock, in seconds. Server TTL = the model's TTL in ticks.
TICK = 5.0


class Mismatch(AssertionError):
    """The real state and the model's prediction differ, or a property failed."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


@dataclass
class WorkerSlot:
    """The harness's view of one worker of one process: the Worker object and where it is in
    its cycle (what its steps returned)."""

    worker: Worker | None
    task: Task | None = None
    stage: int = IDLE  # TAKEN/RECORDED while holding
    outcome: Outcome | None = None
    crashed: bool = False
    stopped: bool = False
    #: its production loop's last take found the queue empty (the model's `arm`: the take
    #: registered the list and waits); its next take, or a crash, ends that
    armed: bool = False

    def phase(self) -> int:
        if self.crashed:
            return CRASHED
        if self.stopped:
            return STOPPED
        if self.task is not None:
            return self.stage
        assert self.worker is not None
        return DIRTY if self.worker.dirty else ARMED if self.armed else IDLE


@dataclass
class ProcSlot:
    """The harness's view of one process (one incarnation of a server id): its Server, its own
    client, its incarnation under both numberings, and its workers."""

    server: Server
    client: redis.Redis
    label: str
    real_inc: int
    model_inc: int
    phase: int = CLAIMED
    stalled: bool = False
    workers: list[WorkerSlot] = field(default_factory=list)


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


@dataclass
class StepRecord:
    """One step of a run, for reports: the action and who/what it touched."""

    index: int
    action: Action
    text: str
    fault: bool
    #: who acted, for sequence diagrams: "s0#1 w0" (server 0, model incarnation 1, worker 0),
    #: "s0#1" (that server process), "s0" (a claim of id s0) or "" (the clock)
    actor: str = ""
    #: the states after the step, the model's and Redis's read back in the model's terms, as the
    #: check after it saw them (None: no check ran after this step, e.g. a step inside a pass)
    model: State | None = None
    real: State | None = None
    #: a step of `Harness.recover` (faults have stopped), not one the machine chose
    recovery: bool = False


class Observation:
    """Reads one run's Redis back in the model's terms and judges it. The attributes are the
    run's, set up by `Harness` and kept current by its stepping part."""

    admin: redis.Redis  # reads state back; never faulted
    keys: QueueKeys
    bounds: Bounds
    config: Config
    clock: ManualClock
    settings: Settings
    #: the model's state: the prediction `check` compares with
    state: State
    procs: list[list[ProcSlot]]
    #: real incarnation -> model incarnation, per server
    names: list[dict[int, int]]
    #: ghost records, kept outside Redis (a wipe cannot touch them): per task, enqueued /
    #: waiting / wiped, and the commits read back before each wipe
    status: list[int]
    commits_before_wipes: Counter[int]
    enqueued: int
    recovered: int  # tasks moved back to the queue by recovery (model-counted)
    steps: list[StepRecord]

    # -- naming --------------------------------------------------------------------------------

    def server_id(self, s: int) -> str:
        return f"s{s}"

    @staticmethod
    def task_id(t: int) -> str:
        return f"t{t}"

    @staticmethod
    def task_index(task_id: str) -> int:
        return int(task_id[1:])

    def list_key(self, key: tuple[str, int, str]) -> ListKey:
        sid, real_inc, wid = key
        s = int(sid[1:])
        model_inc = self.names[s].get(real_inc)
        if model_inc is None:
            raise Mismatch("mapping", f"in-flight list of unknown incarnation {key}")
        return (s, model_inc, int(wid[1:]))

    def _model_key(self, real_key: str) -> ListKey:
        owner = self.keys.owner_of(real_key)
        return self.list_key((owner.server_id, owner.incarnation, owner.worker_id))

    def _real_key(self, key: ListKey) -> str:
        s, model_inc, w = key
        real = {m: r for r, m in self.names[s].items()}.get(model_inc, -1)
        return self.keys.inflight(ListOwner(self.server_id(s), real, f"w{w}"))

    def _tid(self, raw: bytes | str) -> int:
        """The model's number of the task in an envelope read from Redis."""
        return self.task_index(decode(raw if isinstance(raw, bytes) else raw.encode()).id)

    # -- reading Redis back, in the model's terms ---------------------------------------------

    def _keys_starting(self, prefix: str) -> list[bytes]:
        """This run's keys that start with `prefix` (all in one slot: on a cluster node they are
        listed with CLUSTER GETKEYSINSLOT, never KEYS or SCAN; see cluster.tag_keys)."""
        return cluster.tag_keys(self.admin, self.keys.queue, prefix)

    def observe_queue(self, key: str | None = None) -> tuple[int, ...]:
        """The queue (or the suspects list), as task numbers."""
        return tuple(self._tid(r) for r in self.admin.lrange(key or self.keys.queue, 0, -1))

    def _redis_commits(self) -> dict[int, int]:
        """Commits per task, as Redis's commit log has them now."""
        return {
            self.task_index(_text(k)): int(v)
            for k, v in self.admin.hgetall(self.keys.commit_log).items()
        }

    def observe(self) -> State:
        """The real state, mapped to the model's terms."""
        keys = self.keys
        pipe = self.admin.pipeline(transaction=False)
        pipe.lrange(keys.queue, 0, -1)
        pipe.zrange(keys.inflight_registry, 0, -1, withscores=True)
        pipe.hgetall(keys.processing)
        pipe.hgetall(keys.commit_log)
        pipe.zrange(keys.servers, 0, -1, withscores=True)
        pipe.hgetall(keys.incarnations)
        pipe.hgetall(keys.recoveries)
        pipe.lrange(keys.dead_letters, 0, -1)
        pipe.zrange(keys.scheduled, 0, -1)
        (
            queue_raw,
            registry_raw,
            processing,
            commits,
            servers,
            incs,
            counts,
            dead,
            scheduled_raw,
        ) = pipe.execute()
        list_keys = self._keys_starting(keys.inflight_prefix)
        n = self.bounds.tasks
        tid = self._tid
        queue = tuple(tid(r) for r in queue_raw)
        registered = tuple(sorted(self._model_key(_text(k)) for k, _ in registry_raw))
        # With `Bounds.registration_ages`: the registrations younger than the grace (one tick)
        fresh: tuple[ListKey, ...] = ()
        if self.bounds.registration_ages:
            cutoff = self.clock.now() - self.settings.registry_grace
            fresh = tuple(
                sorted(self._model_key(_text(k)) for k, at in registry_raw if float(at) > cutoff)
            )
        lists: list[tuple[ListKey, tuple[int, ...]]] = []
        for k in sorted(_text(k) for k in list_keys):
            owner = keys.owner_of(k)
            tasks = tuple(tid(r) for r in self.admin.lrange(k, 0, -1))
            if tasks:
                lists.append(
                    (self.list_key((owner.server_id, owner.incarnation, owner.worker_id)), tasks)
                )
        lists.sort()
        records: list[ListKey | None] = [None] * n
        for task_id, value in processing.items():
            list_key, _ = parse_record(value)
            owner = keys.owner_of(list_key)
            records[self.task_index(_text(task_id))] = self.list_key(
                (owner.server_id, owner.incarnation, owner.worker_id)
            )
        committed = [0] * n
        for task_id, count in commits.items():
            committed[self.task_index(_text(task_id))] = int(count)
        total = int(self.admin.get(keys.committed) or 0)
        if total != sum(committed):
            raise Mismatch("commits", f"committed counter {total} != commit log {committed}")
        for t, before in self.commits_before_wipes.items():
            committed[t] += before
        registry: list[Registration | None] = [None] * self.bounds.servers
        now = self.clock.now()
        zset = {_text(m): float(score) for m, score in servers}
        hincs = {_text(k): int(v) for k, v in incs.items()}
        if set(zset) != set(hincs):
            raise Mismatch("registry", f"servers {sorted(zset)} vs incarnations {sorted(hincs)}")
        for sid, deadline in zset.items():
            s = int(sid[1:])
            model_inc = self.names[s].get(hincs[sid])
            if model_inc is None:
                raise Mismatch("mapping", f"server {sid} registered as unknown incarnation")
            rel = (deadline - now) / TICK
            if abs(rel - round(rel)) > 1e-6:
                raise Mismatch("clock", f"deadline of {sid} is not a whole tick away: {rel}")
            registry[s] = Registration(model_inc, max(0, round(rel)))
        processes = tuple(
            tuple(self._observe_proc(p) for p in self.procs[s]) for s in range(self.bounds.servers)
        )
        recoveries = [0] * n
        for name, count in counts.items():
            if ":" not in _text(name):  # (`<id>:from` names the holders that died)
                recoveries[self.task_index(_text(name))] = int(count)
        status = list(self.status)
        for entry in dead:
            letter = json.loads(entry)
            if letter.get("poison"):
                t = self.task_index(letter["task_id"])
                status[t] = POISONED
                # the dead letter keeps the count its recoveries reached
                recoveries[t] = int(letter["recoveries"])
        return State(
            queue=queue,
            suspects=self.observe_queue(keys.suspects),
            lists=tuple(lists),
            records=tuple(records),
            committed=tuple(committed),
            registry=tuple(registry),
            processes=processes,
            faults=self.state.faults,
            stalled_ever=self.state.stalled_ever,
            registered=registered,
            fresh=fresh,
            status=tuple(status),
            recoveries=tuple(recoveries),
            # a ghost of the model (handler starts), not Redis state: see `check`
            executions=self.state.executions,
            scheduled=tuple(sorted(tid(r) for r in scheduled_raw)),
        )

    def _observe_proc(self, slot: ProcSlot) -> Process:
        if slot.phase == RUNNING or slot.phase == SUPERSEDED or slot.workers:
            workers = tuple(
                ModelWorker(ws.phase(), self.task_index(ws.task.id) if ws.task else -1)
                for ws in slot.workers
            )
        else:
            workers = tuple(ModelWorker(IDLE) for _ in range(self.bounds.workers))
        phase = SUPERSEDED if slot.server.superseded else slot.phase
        # The suspect slot, by the worker whose list key holds it.
        holder = slot.server.suspect_slot.holder
        suspect = next(
            (
                w
                for w in range(self.bounds.workers)
                if holder
                == self.keys.inflight(ListOwner(slot.server.server_id, slot.real_inc, f"w{w}"))
            ),
            -1,
        )
        # Passes run whole inside one step: between steps, no process is mid-pass.
        return Process(slot.model_inc, slot.stalled, phase, (), workers, suspect=suspect)

    # -- checks --------------------------------------------------------------------------------

    def check(self) -> None:
        """After every step: the real state equals the model's, and every property holds on
        both."""
        real = self.observe()
        model = self.state
        if self.steps:  # for the report: what this check saw after the last step
            self.steps[-1].model, self.steps[-1].real = model, real
        for name, have in (("model", model), ("real", real)):
            bad = check_invariants(have, self.config)
            if bad is not None:
                raise Mismatch(f"{name}:{bad[0]}", bad[1])
        if real != model:
            raise Mismatch("conformance", diff(model, real))

    def check_eventual(self) -> None:
        """Every task committed exactly once; queue, in-flight lists and records empty."""
        keys = self.keys
        commits = Counter(self.commits_before_wipes)
        commits.update(self._redis_commits())
        status = self.observe().status
        want = {t: 0 if st in (WIPED, POISONED) else 1 for t, st in enumerate(status)}
        have = {t: commits[t] for t in want}
        if have != want:
            raise Mismatch(
                "eventual",
                f"commits per task {have}, want {want} (exactly one "
                "each, none for a task Redis itself lost or a poison "
                "pill)",
            )
        if self.admin.llen(keys.queue):
            raise Mismatch("eventual", "the queue is not empty")
        if self.admin.llen(keys.suspects):
            raise Mismatch("eventual", "the suspects list is not empty")
        if self.admin.zcard(keys.scheduled):
            raise Mismatch("eventual", "the scheduled set is not empty")
        for k in recovery.registered_lists(self.admin, keys):
            if self.admin.llen(k):
                raise Mismatch("eventual", f"in-flight list {k} is not empty")
        if self.admin.hlen(keys.processing):
            raise Mismatch("eventual", "processing records remain")

    # -- figures -------------------------------------------------------------------------------

    def tallies(self) -> dict[str, int]:
        """Jepsen-style counts of this run, read from Redis."""
        state = self.observe()
        commits = dict(enumerate(state.committed))
        places: Counter[int] = Counter(state.queue + state.suspects + state.scheduled)
        for _, tasks in state.lists:
            places.update(tasks)
        ours = [t for t, st in enumerate(state.status) if st == ENQUEUED]
        lost = sum(1 for t in ours if commits[t] == 0 and places[t] == 0)
        return {
            "enqueued": self.enqueued,
            "committed": sum(1 for v in commits.values() if v >= 1),
            "lost": lost,
            # twice in Redis, committed twice, or committed and still queued or in custody
            # (it would run again)
            "duplicated": sum(
                1
                for t in range(self.bounds.tasks)
                if places[t] > 1 or commits[t] > 1 or (commits[t] >= 1 and places[t] >= 1)
            ),
            "double-assigned": _double_assigned(state),
            "recovered": self.recovered,
            # enqueued, then lost by Redis itself in a wipe: not the protocol's loss
            "lost-by-redis": sum(1 for st in self.status if st == WIPED),
            # recovered once too often: dead-lettered as a poison pill (an end, like a commit)
            "poison-pills": sum(1 for st in state.status if st == POISONED),
        }


def _double_assigned(state: State) -> int:
    """How many tasks two workers hold at once (the protocol allows it after a stall)."""
    held: Counter[int] = Counter(
        w.task
        for procs in state.processes
        for p in procs
        for w in p.workers
        if w.phase in (TAKEN, RECORDED)
    )
    return sum(1 for v in held.values() if v > 1)


def diff(model: State, real: State) -> str:
    """The fields in which the model's state and the real one differ, for a `Mismatch`."""
    lines = []
    for name in State._fields:
        a, b = getattr(model, name), getattr(real, name)
        if a != b:
            lines.append(f"{name}: model {a!r} != real {b!r}")
    return "; ".join(lines) or "equal"
