"""The harness's stepping, its base: the deployment's set-up (`setup`), the model's side of a
step (`enabled`, `model_step`) and what every step needs (clients, claims, crashes, exits).
The steps themselves are the subclasses': worker_steps.py, recovery_passes.py, stepping.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import redis
from taskcustody_model import (
    Action,
    apply,
    check_transition,
    enabled_actions,
)
from taskcustody_model.state import (
    ENQUEUED,
    RUNNING,
    TTL,
    State,
)
from taskcustody_model.trace import describe_action

from ..core import scripts
from ..core.clock import ManualClock
from ..core.keys import QueueKeys
from ..core.producer import Producer
from ..core.server import Server
from ..core.settings import Settings
from . import faults
from .observation import TICK, Mismatch, Observation, ProcSlot, WorkerSlot

#: Settings whose timing matches the model: deadlines are whole ticks, a drain moves one task per
#: command (the model's `drain_step`), takes on an empty queue return after 50 ms.
VERIFY_SETTINGS = Settings(
    block_timeout=0.05,
    socket_timeout_margin=2.0,
    heartbeat_interval=TICK * 0.8,
    server_ttl=TICK * TTL,
    sweep_interval=TICK,
    max_attempts=3,
    drain_chunk=1,
    track_commits=True,
    registry_grace=0,
)


#: Chooses one of the worker steps the model enables between two moves of a drain, or None to let
#: the drain go on (the stateful machine draws it, so that it shrinks).
Interleave = Callable[[list[Action]], Action | None]

ServerFactory = Callable[..., Server]


def default_server(
    client: redis.Redis,
    keys: QueueKeys,
    server_id: str,
    *,
    settings: Settings,
    clock: ManualClock,
    workers: int,
) -> Server:
    return Server(
        client,
        keys,
        server_id,
        lambda payload: payload,
        workers=workers,
        settings=settings,
        clock=clock,
    )


def actor_of(action: Action, state: State) -> str:
    """The lifeline an action belongs to (see `StepRecord.actor`), named from the state before
    it."""
    if action.server < 0:
        return ""
    who = f"s{action.server}"
    if action.proc >= 0:
        who += f"#{state.processes[action.server][action.proc].inc}"
    if action.worker >= 0:
        who += f" w{action.worker}"
    return who


class SteppingBase(Observation):
    """What every step of the harness needs. The run's parts (clients, clock, fault injector,
    slots) are set up by `Harness`."""

    make_client: Callable[[], redis.Redis]
    server_factory: ServerFactory
    settings: Settings
    injector: faults.FaultInjector
    #: with the Redis wipe: flush the script cache too (not on a server that is the user's)
    flush_scripts: bool
    #: on a real server (not fakeredis): replies arrive on a real socket
    real_redis: bool
    counts: Counter[str]  # faults by kind, and other events
    refusals: Counter[str]  # refused attempts (`attempt`) by kind, each refused as the model says
    steps_during_drains: int  # worker steps interleaved between the moves of a drain
    seconds: float  # time spent in steps
    scripts_flushed: bool
    # -- setup ---------------------------------------------------------------------------------

    def setup(self) -> None:
        """The model's initial state, made real: every task enqueued (t0 first, so it is taken
        first), every server claimed, startup-drained, its workers registered and reconciled."""
        self.wipe()
        # Workers release with EVALSHA and fall back to EVAL on NOSCRIPT. Load the scripts up
        # front, so that a dropped release reply is always the reply of a release that ran.
        self._load_release_scripts()
        for t, status in enumerate(self.status):
            if status == ENQUEUED:
                self._enqueue(t)
        for s in range(self.bounds.servers):
            slot = self._claim(s, expect_model_inc=0)
            slot.server.startup_drain()
            self._start_workers(slot)
        self.check()

    def _load_release_scripts(self) -> None:
        scripts.RELEASE_SCRIPT.load(self.admin)
        scripts.RELEASE_AND_TAKE_SCRIPT.load(self.admin)

    def _enqueue(self, t: int) -> None:
        Producer(self.admin, self.keys, self.clock).enqueue({"n": t}, task_id=self.task_id(t))
        self.status[t] = ENQUEUED
        self.enqueued += 1

    def wipe(self) -> None:
        """Delete this run's keys, nothing else (with `--redis-url` the server is the user's)."""
        found = self._keys_starting(self.keys.base + ":")
        if found:
            self.admin.delete(*found)

    def _new_client(self, label: str) -> redis.Redis:
        client = self.make_client()
        faults.install(client, self.injector, label)
        return client

    def _claim(self, s: int, expect_model_inc: int) -> ProcSlot:
        label = f"{self.server_id(s)}#{len(self.steps)}"
        client = self._new_client(label)
        server = self.server_factory(
            client,
            self.keys,
            self.server_id(s),
            settings=self.settings,
            clock=self.clock,
            workers=self.bounds.workers,
        )
        try:
            real_inc = server.claim()
        except BaseException:
            client.close()
            raise
        self._name(s, real_inc, expect_model_inc)
        slot = ProcSlot(server, client, label, real_inc, expect_model_inc)
        self.procs[s].append(slot)
        return slot

    def _name(self, s: int, real_inc: int, model_inc: int) -> None:
        for r, m in list(self.names[s].items()):
            if m == model_inc and r != real_inc:
                del self.names[s][r]  # the model reuses a number nothing mentions any more
        self.names[s][real_inc] = model_inc

    def _start_workers(self, slot: ProcSlot) -> None:
        """What `Server.start` and `Worker.run` do before the first take: make each worker,
        register its list, reconcile (a new worker is dirty; its list is new and empty)."""
        slot.workers = []
        for w in range(self.bounds.workers):
            worker = slot.server.make_worker(w)
            worker.register()
            worker.reconcile()
            slot.workers.append(WorkerSlot(worker))
        slot.phase = RUNNING

    # -- the model's side, and what every step needs ------------------------------------------

    def enabled(self) -> list[Action]:
        """The model's enabled actions, minus the mid-pass ones (`drain_step`: passes run whole
        inside one step; its dropped reply is chosen with the pass, see `step`)."""
        return [
            a
            for a in enabled_actions(self.state, self.config)
            if a.name not in ("drain_step", "arm") and a.command != "drain_step"
        ]

    def model_step(self, action: Action) -> None:
        """The model's side of a step: `action` applied to the model's state, after checking the
        model's step properties on it (the implementation's side is the caller's)."""
        before = self.state
        after = apply(before, action, self.config)
        bad = check_transition(before, action, self.config)
        if bad is not None:
            raise Mismatch(f"model:{bad[0]}", bad[1])
        self.state = after

    def describe(self, action: Action) -> str:
        """`action` in words, as the model's traces say it (in the state before it)."""
        return describe_action(action, self.state)

    def _crash_worker(self, ws: WorkerSlot) -> None:
        if ws.worker is not None:
            ws.worker.close()  # whatever reply it had not read is gone with it
        ws.worker = None
        ws.task = None
        ws.crashed = True

    def settle(self) -> None:
        """A superseded process exits once none of its workers holds a task."""
        for procs in self.procs:
            for slot in list(procs):
                if slot.server.superseded and all(ws.crashed or ws.stopped for ws in slot.workers):
                    slot.client.close()
                    procs.remove(slot)

    def _faults_left(self) -> bool:
        return self.state.faults < self.bounds.faults
