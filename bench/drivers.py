"""Drivers for the workloads that run in the main environment: our cycle and the raw floors.

    python -m bench.drivers --kind {ours,ours-wallclock,blpop,blmove-lrem}
                            --mode {threads,processes} --concurrency N --url URL --tasks N
                            [--min-replicas N] [--wait-ms MS]

Same handshake as the peers' drivers (see bench/harness.py): enqueue, say so, wait for ``go``,
drain, stamp the last completion, snapshot the server's counters, report.

* ``blpop``: RPUSH'd tasks, a ``BLPOP`` loop: the cheapest way to pop from a Redis list, and one
  that loses the task if the reply is lost (the floor of unsafe queues).
* ``blmove-lrem``: ``BLMOVE queue -> own list``, then ``LREM own list``: custody in its barest form,
  one round trip to take, one to release; no record, no commit.
* ``ours``: taskcustody's ``Server`` (``workers`` threads) running the full cycle: take, record,
  execute, release with commit, with its production default clock (Redis ``TIME``).
* ``ours-async``: taskcustody's ``AsyncServer`` (``--concurrency`` asyncio workers in one
  process, ``--mode threads`` only), an ``async def`` handler; ``ours-async-prefetch`` the same
  with ``Settings(prefetch=8)``.
* ``ours-wallclock``: the same with ``clock=WallClock()`` (a diagnostic: what the cycle costs
  without the per-task ``TIME`` the record's timestamp takes).

``threads`` runs N workers as threads of one process; ``processes`` runs N processes of one worker.
``--min-replicas`` (ours, threads) runs our workers with ``Settings(min_replicas=N)``
(bench/replicas.py). ``--wait-ms`` (ours, ours-async) makes each handler wait that long first,
as I/O would: ``time.sleep`` in a thread, ``await asyncio.sleep`` on the loop (bench/aio.py).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import threading
import time
import uuid
from typing import Any

import redis

from bench.harness import normalise_info

QUEUE = "benchq"
#: Tasks a worker thread takes per round trip in the prefetch rows (Settings.prefetch).
PREFETCH = 8
FLOOR_QUEUE = "floor:queue"


def emit(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


class Finish:
    """Completion counter shared by threads, or by processes (``shared`` = mp objects)."""

    def __init__(self, url: str, tasks: int, shared: tuple[Any, Any, Any] | None = None) -> None:
        self.tasks = tasks
        self.stats_client = redis.Redis.from_url(url)
        self.stats_client.ping()
        if shared is None:
            self._lock = threading.Lock()
            self._count = 0
            self.done: Any = threading.Event()
            self._results: Any = None
            self._value: Any = None
        else:
            self._value, self.done, self._results = shared
        self.end = 0.0
        self.info: dict[str, Any] | None = None

    def tick(self) -> None:
        if self._value is None:
            with self._lock:
                self._count += 1
                last = self._count == self.tasks
        else:
            with self._value.get_lock():
                self._value.value += 1
                last = self._value.value == self.tasks
        if last:
            self.end = time.monotonic()
            self.info = normalise_info(self.stats_client.info("all"))
            if self._results is not None:
                self._results.put({"end": self.end, "info": self.info})
            self.done.set()


# --- workloads ----------------------------------------------------------------------------


def envelope(i: int, now: float) -> bytes:
    """Same shape and size as a taskcustody envelope, so the floors move the same bytes."""
    body = {"id": uuid.uuid4().hex, "payload": i, "attempts": 0, "enqueued_at": now}
    return json.dumps(body, separators=(",", ":")).encode()


def enqueue(kind: str, url: str, tasks: int) -> None:
    client = redis.Redis.from_url(url)
    if kind.startswith("ours"):
        from taskcustody import Producer, QueueKeys

        Producer(client, QueueKeys(QUEUE)).enqueue_many(range(tasks))
    else:
        now = time.time()
        for start in range(0, tasks, 10_000):
            batch = [envelope(i, now) for i in range(start, min(tasks, start + 10_000))]
            client.rpush(FLOOR_QUEUE, *batch)
    client.close()


def floor_loop(kind: str, client: redis.Redis, name: str, finish: Finish) -> None:
    inflight = f"floor:inflight:{name}"
    while not finish.done.is_set():
        if kind == "blpop":
            got = client.blpop([FLOOR_QUEUE], timeout=0.5)
            if got is None:
                continue
        else:
            raw = client.blmove(FLOOR_QUEUE, inflight, 0.5, "LEFT", "LEFT")
            if raw is None:
                continue
            client.lrem(inflight, 1, raw)
        finish.tick()


def run_floor(kind: str, url: str, threads: int, finish: Finish, tag: str) -> None:
    client = redis.Redis.from_url(url, socket_timeout=5)
    pool = [
        threading.Thread(target=floor_loop, args=(kind, client, f"{tag}-{i}", finish))
        for i in range(threads)
    ]
    for t in pool:
        t.start()
    finish.done.wait()
    for t in pool:
        t.join()
    client.close()


def run_ours(
    url: str,
    threads: int,
    finish: Finish,
    tag: str,
    wallclock: bool = False,
    prefetch: int = 1,
    min_replicas: int = 0,
    wait: float = 0.0,
) -> None:
    from taskcustody import QueueKeys, Server, Settings, WallClock, connect

    settings = Settings(
        block_timeout=0.5, socket_timeout_margin=2.0, prefetch=prefetch, min_replicas=min_replicas
    )
    client = connect(url, settings)

    def handler(payload: Any) -> None:
        if wait:
            time.sleep(wait)  # the handler's I/O wait (--wait-ms), blocking its thread
        finish.tick()

    server = Server(
        client,
        QueueKeys(QUEUE),
        server_id=f"bench-{tag}",
        handler=handler,
        workers=threads,
        settings=settings,
        clock=WallClock() if wallclock else None,
    )
    server.run(until_idle=True)
    client.close()


def run_ours_async(
    url: str, workers: int, finish: Finish, tag: str, wait: float, prefetch: int = 1
) -> None:
    """`AsyncServer`: `workers` concurrent asyncio workers in this process (each prefetching
    `prefetch` tasks), an `async def` handler that awaits `asyncio.sleep(wait)` (the handler's
    I/O wait, --wait-ms) first."""
    import asyncio

    from taskcustody import QueueKeys, Settings
    from taskcustody.aio import AsyncServer, connect_async

    settings = Settings(block_timeout=0.5, socket_timeout_margin=2.0, prefetch=prefetch)

    async def handler(payload: Any) -> None:
        if wait:  # as the peers' drivers: a 0 ms handler does not yield
            await asyncio.sleep(wait)
        finish.tick()

    async def main() -> None:
        client = connect_async(url, settings)
        server = AsyncServer(
            client,
            QueueKeys(QUEUE),
            server_id=f"bench-{tag}",
            handler=handler,
            workers=workers,
            settings=settings,
        )
        await server.run(until_idle=True)
        await client.aclose()

    asyncio.run(main())


def run_workload(
    kind: str,
    url: str,
    threads: int,
    finish: Finish,
    tag: str,
    min_replicas: int = 0,
    wait: float = 0.0,
) -> None:
    if kind.startswith("ours-async"):
        run_ours_async(
            url,
            threads,
            finish,
            tag,
            wait,
            prefetch=PREFETCH if kind == "ours-async-prefetch" else 1,
        )
    elif kind.startswith("ours"):
        run_ours(
            url,
            threads,
            finish,
            tag,
            wallclock=kind == "ours-wallclock",
            prefetch=PREFETCH if kind == "ours-prefetch" else 1,
            min_replicas=min_replicas,
            wait=wait,
        )
    else:
        run_floor(kind, url, threads, finish, tag)


def count_replica_warnings() -> list[int]:
    """Warnings of WAITs that returned short (taskcustody.replication): a min_replicas row whose
    replica fell behind says so in its report instead of passing for a clean run."""
    import logging

    counter = [0]

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            counter[0] += 1

    logging.getLogger("taskcustody.replication").addHandler(Count(logging.WARNING))
    return counter


# --- processes ------------------------------------------------------------------------------


def child(
    kind: str, url: str, tasks: int, index: int, shared: tuple[Any, Any, Any], ready: Any, go: Any
) -> None:
    finish = Finish(url, tasks, shared)
    ready.put(index)
    go.wait()
    run_workload(kind, url, 1, finish, f"p{index}")


def committed(kind: str, url: str) -> int | None:
    """Tasks the queue counted as committed (ours), checked after the drain."""
    if not kind.startswith("ours"):
        return None
    from taskcustody import QueueKeys

    client = redis.Redis.from_url(url)
    try:
        return int(client.get(QueueKeys(QUEUE).committed) or 0)
    finally:
        client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--kind",
        required=True,
        choices=[
            "ours",
            "ours-prefetch",
            "ours-wallclock",
            "ours-async",
            "ours-async-prefetch",
            "blpop",
            "blmove-lrem",
        ],
    )
    ap.add_argument("--mode", choices=["threads", "processes"], default="threads")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--url", required=True)
    ap.add_argument("--tasks", type=int, required=True)
    ap.add_argument("--min-replicas", type=int, default=0)
    ap.add_argument(
        "--wait-ms",
        type=float,
        default=0.0,
        help="ours, ours-async: each handler waits this long first (its I/O)",
    )
    args = ap.parse_args()

    enqueue(args.kind, args.url, args.tasks)
    if args.mode == "threads":
        finish = Finish(args.url, args.tasks)
        emit({"event": "enqueued"})
        if sys.stdin.readline().strip() != "go":
            return
        shortfalls = count_replica_warnings()
        start = time.monotonic()
        run_workload(
            args.kind,
            args.url,
            args.concurrency,
            finish,
            "t",
            args.min_replicas,
            args.wait_ms / 1000,
        )
        emit(
            {
                "event": "done",
                "tasks": args.tasks,
                "seconds": finish.end - start,
                "info": finish.info,
                "committed": committed(args.kind, args.url),
                "replica_warnings": shortfalls[0],
            }
        )
        return

    ctx = mp.get_context("spawn")
    shared = (ctx.Value("l", 0), ctx.Event(), ctx.Queue())
    ready, go = ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=child, args=(args.kind, args.url, args.tasks, i, shared, ready, go))
        for i in range(args.concurrency)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=60)
    emit({"event": "enqueued"})
    if sys.stdin.readline().strip() != "go":
        for p in procs:
            p.terminate()
        return
    start = time.monotonic()
    go.set()
    result = shared[2].get()
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.terminate()
    emit(
        {
            "event": "done",
            "tasks": args.tasks,
            "seconds": result["end"] - start,
            "info": result["info"],
            "committed": committed(args.kind, args.url),
        }
    )


if __name__ == "__main__":
    main()
