"""Producers: put task envelopes on the queue (JSON, never pickle)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import redis

from ..deploy import cluster
from ..deploy.oom import is_oom
from ..deploy.redis_errors import translate
from ..deploy.replication import acknowledged, refuse_fakeredis, wait_command
from ..ops.results import TaskHandle
from .clock import Clock, WallClock
from .envelope import new_task
from .errors import RedisOutOfMemory, ReplicationTimeout
from .keys import QueueKeys
from .settings import Settings

#: Times an LPUSH + WAIT refused by a cluster redirect is sent again.
REDIRECT_ATTEMPTS = 5


def out_of_memory(exc: redis.RedisError, refused: int, before: list[str]) -> RedisOutOfMemory:
    """What an LPUSH refused by a full Redis raises: nothing of its batch was enqueued; `before`
    are the ids earlier batches did enqueue."""
    done = f"; {len(before)} earlier task(s) were enqueued" if before else ""
    return RedisOutOfMemory(
        f"Redis is out of memory ({exc}): {refused} task(s) not enqueued{done}; retry once "
        "memory frees",
        before,
    )


class Producer:
    """Puts tasks on a queue: each payload becomes a JSON envelope (a fresh id, attempts 0, the
    enqueue time; never pickle) pushed onto the queue with LPUSH.

    What it guarantees: an enqueue that returns is in Redis (with `Settings.min_replicas`, on
    that many replicas too, or it raises `ReplicationTimeout`); a payload JSON cannot carry
    (a set, NaN) is refused before anything is sent, and `enqueue_many` encodes every payload
    before it sends any. A batch is one LPUSH, so Redis queues it whole or refuses it whole
    (out of memory: `RedisOutOfMemory`, naming the earlier batches that were queued).

    Example::

        producer = Producer(client, QueueKeys("images"))
        task_id = producer.enqueue({"url": "https://example.com/a.png"})
        handle = producer.submit({"x": 21})       # enqueue, and a handle on its result
        handle.result(timeout=5)                  # the handler's return value, once committed
        ids = producer.enqueue_many(payloads)     # one LPUSH per 10,000 tasks
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: QueueKeys,
        clock: Clock | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.client = client
        self.keys = keys
        # Enqueue time is informational only; no protocol decision reads it.
        self.clock = clock or WallClock()
        self.settings = settings or Settings()
        refuse_fakeredis(client, self.settings)

    def enqueue(self, payload: Any, task_id: str | None = None) -> str:
        """Enqueue one task. With `min_replicas`, returns only once that many replicas hold it,
        and raises `ReplicationTimeout` otherwise (the task is then in the primary's queue)."""
        task = new_task(payload, self.clock.now(), task_id)
        self._push([task.raw], [task.id], [], [])
        return task.id

    def submit(self, payload: Any, task_id: str | None = None) -> TaskHandle:
        """`enqueue`, returning a handle: `.id`, and `.result(timeout)` to wait for the task's
        result (results.get_result). Results are kept `Settings.result_ttl` seconds."""
        return TaskHandle(self.enqueue(payload, task_id), self.client, self.keys, enqueued=True)

    def enqueue_many(self, payloads: Iterable[Any], batch_size: int = 10_000) -> list[str]:
        """Enqueue many payloads, one LPUSH (one round trip) per batch. Every payload is encoded
        before anything is sent, so a bad payload enqueues nothing of its batch. With
        `min_replicas`, stops at the first batch whose WAIT returns short: the exception names
        the tasks confirmed, those on the primary only, and those never sent."""
        now = self.clock.now()
        tasks = [new_task(p, now) for p in payloads]
        for start in range(0, len(tasks), batch_size):
            batch = tasks[start : start + batch_size]
            self._push(
                [t.raw for t in batch],
                [t.id for t in batch],
                [t.id for t in tasks[:start]],
                [t.id for t in tasks[start + batch_size :]],
            )
        return [t.id for t in tasks]

    def _push(self, raws: list[bytes], ids: list[str], before: list[str], after: list[str]) -> None:
        """One LPUSH (and WAIT, with `min_replicas`). Redis out of memory refuses the LPUSH whole
        (nothing of it is enqueued): that is RedisOutOfMemory, naming what earlier batches did
        enqueue, so the caller can retry."""
        try:
            self._lpush(raws, ids, before, after)
        except redis.RedisError as exc:
            if not is_oom(exc):
                # WRONGTYPE (the queue key holds something else), a read-only replica, a port
                # that answers HTTP...: named (redis_errors.py).
                ours = translate(exc, self.client, self.keys, (self.keys.queue,))
                if ours is exc:
                    raise
                raise ours from exc
            raise out_of_memory(exc, len(raws), before) from exc

    def _lpush(
        self, raws: list[bytes], ids: list[str], before: list[str], after: list[str]
    ) -> None:
        if wait_command(self.settings) is None:
            self.client.lpush(self.keys.queue, *raws)
            return
        # LPUSH and WAIT in one pipeline: one round trip. Not MULTI: inside a transaction WAIT
        # does not block, it only reports the replicas that already have the write.
        pushed, reply = self._push_and_wait(raws)
        if isinstance(pushed, Exception):
            raise pushed  # e.g. WRONGTYPE: nothing was enqueued
        acks, reason = acknowledged(reply)
        if acks < self.settings.min_replicas:
            raise ReplicationTimeout(
                acks,
                self.settings.min_replicas,
                self.settings.replica_timeout,
                unconfirmed=ids,
                confirmed=before,
                unsent=after,
                reason=reason,
            )

    def _push_and_wait(self, raws: list[bytes]) -> tuple[Any, Any]:
        """LPUSH + WAIT on the node that serves the queue. On a cluster WAIT names no key, so
        a cluster pipeline would send it to any node: both go to the slot's master instead
        (cluster.node_client), and a redirect (the LPUSH did not run) re-reads the slot map
        and sends them again, a few times."""
        for attempt in range(REDIRECT_ATTEMPTS):
            node = cluster.node_client(self.client, self.keys.queue)
            pipe = node.pipeline(transaction=False)
            pipe.lpush(self.keys.queue, *raws)
            pipe.wait(self.settings.min_replicas, self.settings.replica_timeout_ms)
            pushed, reply = pipe.execute(raise_on_error=False)
            kind = cluster.redirect_kind(pushed) if isinstance(pushed, Exception) else None
            if kind is None or attempt == REDIRECT_ATTEMPTS - 1:
                break
            time.sleep(cluster.Backoff().next() * (attempt + 1))
            cluster.refresh(self.client)
        return pushed, reply
