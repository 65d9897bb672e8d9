"""The model drives the asyncio worker (`taskcustody.aio.AsyncWorker`), step by step.

The harness's stepping code (stepping.py) drives workers through the threaded `Worker`'s steps.
`SteppedAsyncWorker` presents an `AsyncWorker` to it as if it were one: each step is the worker's
coroutine run to its end on the harness's private event loop, in a new task (a cancelled task is
never reused: redis-py's asyncio `wait_for` can swallow a cancellation). So the same rules, the same
observation and the same refinement check run after every step as for the threaded worker. The
processes around the workers (claim, heartbeat, sweeps) stay the threaded `Server`'s: what is
under test here is the asyncio worker.

Faults. Each asyncio client of the run has the fault injector's asyncio connection class
(`faults.install_async`), so a dropped reply is injected inside `redis.asyncio`'s connection
handling, by the same read path as the threaded run's. A fault of a worker step may instead be a
*cancellation*, drawn by the fault's variant (`AsyncHarness.way`):

- with the reply in flight: Redis runs the command, its reply is read, and the step's task is
  cancelled at that await. The model has one action for this and a lost reply -- the command ran,
  the reply is lost, the worker is dirty;
- before the send (with the run's bounds' `cancels_before_send`): the step's task is cancelled at
  the await of the send that carries the command, before any of it is written, so Redis runs
  none of it. The model's action is `cancel_before_send`: nothing moved, and the worker, which
  cannot tell this from the cancellation in flight, is dirty all the same.

The adapter reports a cancellation to the stepping code as the connection error a lost reply is
(`CancelledStep`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import redis
import redis.asyncio
from taskcustody_model import Action
from taskcustody_model.protocol import CANCELLABLE

from ..aio.prefetch import AsyncPrefetchingWorker
from ..aio.worker import AsyncWorker
from ..core.clock import Clock
from ..core.envelope import Task
from ..core.keys import ListOwner, QueueKeys
from ..core.outcome import Outcome, Release
from ..core.prefetch_custody import Batch
from ..core.server import Server
from ..core.settings import Settings
from ..deploy.redis_options import no_maint_notifications
from . import faults
from .harness import Harness
from .stepping import ServerFactory, default_server


class CancelledStep(redis.ConnectionError):
    """A step's task was cancelled (its reply in flight, or before its command was sent): to the
    stepping code, a step whose end the worker did not see, as after a lost reply."""


#: How a fault of a worker step is injected, by its variant (`AsyncHarness.way`).
DROP, IN_FLIGHT, BEFORE_SEND = "drop", "in-flight", "before-send"


async def identity(payload: Any) -> Any:
    """The run's handler (`async def`: awaited on the loop, no thread)."""
    return payload


def async_client_like(client: redis.Redis) -> redis.asyncio.Redis:
    """An asyncio client on the same Redis as `client` (the same fakeredis server, or the same
    host, port and database), configured like `aio.connection.connect_async`'s."""
    from ..aio.connection import no_retry

    kwargs = client.connection_pool.connection_kwargs
    if "server" in kwargs:  # fakeredis: the sync client's keyspace
        import fakeredis.aioredis

        fake: redis.asyncio.Redis = fakeredis.aioredis.FakeRedis(
            server=kwargs["server"], retry=no_retry()
        )
        return fake
    return redis.asyncio.Redis(
        host=kwargs.get("host", "localhost"),
        port=kwargs.get("port", 6379),
        db=kwargs.get("db", 0),
        username=kwargs.get("username"),
        password=kwargs.get("password"),
        socket_timeout=kwargs.get("socket_timeout"),
        socket_connect_timeout=kwargs.get("socket_connect_timeout"),
        retry=no_retry(),
        # Without maintenance notifications, like every client of ours (redis_options.py).
        **no_maint_notifications(redis.asyncio.Redis),
    )


class SteppedAsyncWorker:
    """An `AsyncWorker` with the threaded `Worker`'s synchronous steps (the ones stepping.py
    calls), each run on `loop` in a task of its own."""

    def __init__(self, worker: AsyncWorker, loop: asyncio.AbstractEventLoop) -> None:
        self.aw = worker
        self.loop = loop
        self.take_command = worker.take_command
        self._unread_replies = 0  # the asyncio worker awaits every reply in its step

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        task = self.loop.create_task(coro)
        try:
            return self.loop.run_until_complete(task)
        except asyncio.CancelledError as exc:
            raise CancelledStep("the step was cancelled (injected fault)") from exc

    # -- what stepping.py reads and sets -------------------------------------------------------

    @property
    def _conn(self) -> Any:
        return self.aw.conn

    @property
    def dirty(self) -> bool:
        return self.aw.dirty

    @dirty.setter
    def dirty(self, value: bool) -> None:
        self.aw.dirty = value

    @property
    def suspects(self) -> Any:
        return self.aw.suspects

    @property
    def list_key(self) -> str:
        return self.aw.list_key

    def verdict(self, task: Task, outcome: Outcome) -> tuple[str, str]:
        return self.aw.verdict(task, outcome)

    # -- the steps -----------------------------------------------------------------------------

    def register(self) -> None:
        self._run(self.aw.register())

    def reconcile(self) -> int:
        moved: int = self._run(self.aw.reconcile())
        return moved

    def take_from_queue(self, timeout: float | None = None) -> Task | None:
        task: Task | None = self._run(self.aw.take_from_queue(timeout))
        return task

    def take_suspect(self) -> Task | None:
        task: Task | None = self._run(self.aw.take_suspect())
        return task

    def record(self, task: Task) -> None:
        self._run(self.aw.record(task))

    def flush(self) -> None:
        """Nothing: the asyncio worker's record reads its reply in its own step."""

    def execute(self, task: Task) -> Outcome:
        outcome: Outcome = self._run(self.aw.execute(task))
        return outcome

    def release(self, task: Task, outcome: Outcome) -> Release:
        done: Release = self._run(self.aw.release(task, outcome))
        return done

    def release_and_take(self, task: Task, outcome: Outcome) -> tuple[Release, Task | None]:
        result: tuple[Release, Task | None] = self._run(self.aw.release_and_take(task, outcome))
        return result

    def follow_slot(self, refresh: bool = True) -> None:
        """After the run's Redis wipe closed every connection: the worker's next command meets a
        broken connection, so it is dirty, and reconnects (single node only)."""
        self.aw.dirty = True
        self._run(self.aw.conn.disconnect())
        self._run(self.aw.client.connection_pool.disconnect())

    def close(self) -> None:
        self._run(self.aw.close())
        self._run(self.aw.client.connection_pool.disconnect())


class SteppedAsyncPrefetchingWorker:
    """An `AsyncPrefetchingWorker` whose slots are stepped asyncio workers, with the threaded
    `PrefetchingWorker`'s synchronous pipelines (the ones verify/prefetching.py calls), each run
    on `loop` in a task of its own."""

    def __init__(self, slots: list[SteppedAsyncWorker], loop: asyncio.AbstractEventLoop) -> None:
        self.apw = AsyncPrefetchingWorker([slot.aw for slot in slots])
        self.loop = loop

    @property
    def _conn(self) -> Any:
        return self.apw.conn

    def take_all(self) -> tuple[Batch, Exception | None]:
        result: tuple[Batch, Exception | None] = self.loop.run_until_complete(
            self.loop.create_task(self.apw.take_all())
        )
        return result

    def release_all(self, batch: Batch) -> list[Release]:
        """The batch's releases; its slots may be the stepped workers (their asyncio ones
        release)."""
        theirs = Batch()
        theirs.raws = [
            (getattr(slot, "aw", slot), raw, task_id) for slot, raw, task_id in batch.raws
        ]
        theirs.verdicts, theirs.errors = batch.verdicts, batch.errors
        releases: list[Release] = self.loop.run_until_complete(
            self.loop.create_task(self.apw.release_all(theirs))
        )
        return releases

    def disconnect(self) -> None:
        self.loop.run_until_complete(self.apw.conn.disconnect())


def async_server_factory(base: ServerFactory, loop: asyncio.AbstractEventLoop) -> ServerFactory:
    """A harness server factory: the server `base` builds, whose workers are asyncio workers on
    an asyncio client of their process (with the process's fault label), stepped on `loop`."""

    def make(
        client: redis.Redis,
        keys: QueueKeys,
        server_id: str,
        *,
        settings: Settings,
        clock: Clock,
        workers: int,
    ) -> Server:
        server = base(client, keys, server_id, settings=settings, clock=clock, workers=workers)
        conn_class = client.connection_pool.connection_class
        injector = getattr(conn_class, "injector", None)
        label = getattr(conn_class, "label", None)

        def make_worker(index: int) -> Any:
            aclient = async_client_like(client)
            if injector is not None:
                loop.run_until_complete(faults.install_async(aclient, injector, label))
            owner = ListOwner(server_id, server.identity.incarnation, f"w{index}")
            worker = AsyncWorker(aclient, keys, owner, identity, clock, settings)
            worker.suspects = server.suspect_slot
            return SteppedAsyncWorker(worker, loop)

        server.make_worker = make_worker  # type: ignore[method-assign]
        return server

    return make


class AsyncHarness(Harness):
    """The harness with asyncio workers (`SteppedAsyncWorker`) on a private event loop, and
    cancellations among a worker step's faults (`way`): a lost reply's fault may instead cancel
    the step with its reply in flight, or (with the bounds' `cancels_before_send`) before its
    command is sent -- the model's `cancel_before_send`, which the harness performs in place of
    the lost reply the machine drew."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.loop = asyncio.new_event_loop()
        base: ServerFactory = kwargs.pop("server_factory", None) or default_server
        super().__init__(*args, server_factory=async_server_factory(base, self.loop), **kwargs)
        self._way = DROP
        arm = self.injector.arm

        def arming(command: str, **options: Any) -> faults.Arm:
            if options.get("connection") is not None:
                options["cancel"] = self._way == IN_FLIGHT
                options["before_send"] = self._way == BEFORE_SEND
            return arm(command, **options)

        self.injector.arm = arming  # type: ignore[method-assign]

    def way(self, action: Action, variant: int) -> str:
        """How the fault `action` (drawn with `variant`, 0 to 5) is injected: a lost reply of a
        worker step is a dropped reply (variants 0 and 3), a cancellation with the reply in
        flight (1 and 4), or a cancellation before the send (2 and 5: with the bounds'
        `cancels_before_send` and where the model enables it, else a dropped reply)."""
        if action.name != "dropped_reply":
            return DROP
        if (
            variant % 3 == 2
            and self.bounds.cancels_before_send
            and action.command in CANCELLABLE
            and action._replace(name="cancel_before_send") in self.enabled()
        ):
            return BEFORE_SEND
        return IN_FLIGHT if variant % 3 == 1 else DROP

    def step(
        self, action: Action, *, drop_at: int = 0, variant: int = 0, interleave: Any = None
    ) -> None:
        # (decided in the state before the step, where the machine drew it)
        if self.way(action, variant) == BEFORE_SEND:
            action = action._replace(name="cancel_before_send")
        super().step(action, drop_at=drop_at, variant=variant, interleave=interleave)

    def _step(self, action: Action, drop_at: int, variant: int, interleave: Any = None) -> None:
        if action.name != "cancel_before_send":
            super()._step(action, drop_at, variant, interleave)
            return
        command = action.command
        self.counts[action.name] += 1
        self.counts[f"{faults.CANCELLED_BEFORE_SEND}:{command}"] += 1
        self._way = BEFORE_SEND
        try:
            # the stepping code's lost reply of the same step, armed to cancel before the send
            Harness._real_worker_step(
                self, action._replace(name="dropped_reply"), command, True, variant
            )
        finally:
            self._way = DROP
            self.injector.disarm_all()
        self.model_step(action)
        self.settle()

    def _real_worker_step(self, action: Action, command: str, lost: bool, variant: int) -> None:
        # (a lost reply that `step` did not turn into a cancellation before the send; a
        # reconcile's lost reply is armed on its process's pool, never cancelled)
        self._way = IN_FLIGHT if lost and variant % 3 == 1 and command != "reconcile" else DROP
        if self._way == IN_FLIGHT:
            self.counts[f"{faults.CANCELLED}:{command}"] += 1
        try:
            super()._real_worker_step(action, command, lost, variant)
        finally:
            self._way = DROP

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()
