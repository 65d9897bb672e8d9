"""Both ends of one latency run (bench/latency.py): a worker process and an open-loop producer.

    python bench/latency_driver.py worker   --system S --url URL --tasks N --out FILE [--threads T]
    python bench/latency_driver.py producer --system S --url URL --tasks N --rate R --out FILE
                                            [--max-seconds S]

``S`` is ``ours`` (taskcustody, default ``Settings()``), ``ours-prefetch``
(``Settings(prefetch=8)``), ``ours-async`` (``AsyncServer``, ``--threads`` asyncio workers, an
``async def`` handler; bench/aio.py), ``blpop`` (the raw redis-py BLPOP loop) or ``dramatiq``
(RedisBroker, as bench/peers/dramatiq_driver.py). Standalone (stdlib and redis-py at the top,
the system's own imports inside its functions), so that one file runs under the main environment
for ours and the floor and under ``bench/.venvs/dramatiq`` for dramatiq.

Every payload is ``[i, sent, scheduled]``: the task's index, ``time.time()`` just before the
producer hands it to the system's enqueue call, and the wall-clock time the schedule meant to send
it. The handler's first statement reads ``time.time()`` (both processes run on one machine: one
clock). Warm-up tasks have a negative index and are not recorded.

Worker protocol (stdout JSON lines, stdin lines): start the system's worker; enqueue WARMUP tasks
of its own and wait until it has handled them all (so it is connected, its scripts are loaded and
it is waiting for work); print ``{"event": "ready"}``; read ``sent K`` from stdin once the producer
is done; wait (at most ``--grace`` seconds) until K measured tasks were handled; write the
latencies to ``--out`` and print ``{"event": "done", ...}``.

Producer: connect, then send task i at ``t0 + i / rate`` on the monotonic clock (a fixed schedule:
when it falls behind it sends at once, without sleeping, until it has caught up), stop after
``--tasks`` tasks or ``--max-seconds``; write what it sent and how late it was to ``--out``.
``--rate inf`` sends back to back (bench/latency.py's measure of what producer and worker sustain
together).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

QUEUE = "latencyq"  # ours (QueueKeys) and dramatiq (its queue name)
FLOOR_QUEUE = "latency:floor"
ACTOR = "latency_noop"
PREFETCH = 8  # as bench/drivers.py
DRAMATIQ_WORKER_TIMEOUT_MS = 100  # as bench/peers/dramatiq_driver.py
WARMUP = 20

Send = Callable[[list[float]], Any]


def emit(msg: dict[str, Any]) -> None:
    out = sys.__stdout__ or sys.stdout
    out.write(json.dumps(msg) + "\n")
    out.flush()


class Recorder:
    """What the handlers saw: per measured task, its index and its two latencies (seconds)."""

    def __init__(self, expected: int) -> None:
        self.lock = threading.Lock()
        self.target = expected
        self.index: list[int] = []
        self.latency: list[float] = []  # handler start - sent
        self.from_schedule: list[float] = []  # handler start - scheduled send
        self.last = 0.0  # the latest handler start of a measured task (time.time())
        self.warm = 0
        self.warmed = threading.Event()
        self.done = threading.Event()

    def seen(self, payload: Any) -> None:
        now = time.time()  # first: the handler's start
        i, sent, scheduled = payload
        with self.lock:
            if i < 0:
                self.warm += 1
                if self.warm >= WARMUP:
                    self.warmed.set()
                return
            self.index.append(int(i))
            self.latency.append(now - sent)
            self.from_schedule.append(now - scheduled)
            self.last = max(self.last, now)
            if len(self.index) >= self.target:
                self.done.set()

    def expect(self, count: int) -> None:
        with self.lock:
            self.target = count
            if len(self.index) >= count:
                self.done.set()


# --- the systems: start a worker (returns its stop function), make a send function ------------


def ours_settings(system: str) -> Any:
    from taskcustody import Settings

    return Settings(prefetch=PREFETCH) if system == "ours-prefetch" else Settings()


def ours_worker(system: str, url: str, threads: int, rec: Recorder) -> Callable[[], None]:
    from taskcustody import QueueKeys, Server, connect

    settings = ours_settings(system)
    client = connect(url, settings)
    server = Server(
        client,
        QueueKeys(QUEUE),
        server_id=f"latency-{os.getpid()}",
        handler=rec.seen,
        workers=threads,
        settings=settings,
    )
    thread = threading.Thread(target=server.run, name="latency-server", daemon=True)
    thread.start()

    def stop() -> None:
        server.stop()
        thread.join(timeout=settings.block_timeout + 5)

    return stop


def ours_async_worker(url: str, workers: int, rec: Recorder) -> Callable[[], None]:
    """`AsyncServer` with `workers` asyncio workers, on an event loop in a thread of its own; the
    `async def` handler's first statement records, as the threaded handler's does."""
    import asyncio

    from taskcustody import QueueKeys, Settings
    from taskcustody.aio import AsyncServer, connect_async

    loop = asyncio.new_event_loop()
    settings = Settings()

    async def handler(payload: Any) -> None:
        rec.seen(payload)

    server = AsyncServer(
        connect_async(url, settings),
        QueueKeys(QUEUE),
        server_id=f"latency-{os.getpid()}",
        handler=handler,
        workers=workers,
        settings=settings,
    )
    thread = threading.Thread(
        target=loop.run_until_complete, args=(server.run(),), name="latency-server", daemon=True
    )
    thread.start()

    def stop() -> None:
        loop.call_soon_threadsafe(server.stop)
        thread.join(timeout=settings.block_timeout + 5)

    return stop


def ours_sender(system: str, url: str) -> Send:
    from taskcustody import Producer, QueueKeys, connect

    settings = ours_settings(system)
    producer = Producer(connect(url, settings), QueueKeys(QUEUE), settings=settings)
    return producer.enqueue


def floor_body(payload: list[float]) -> bytes:
    """The shape and size of a taskcustody envelope, as bench/drivers.py's floors."""
    body = {"id": uuid.uuid4().hex, "payload": payload, "attempts": 0, "enqueued_at": payload[1]}
    return json.dumps(body, separators=(",", ":")).encode()


def blpop_worker(url: str, threads: int, rec: Recorder) -> Callable[[], None]:
    stopping = threading.Event()

    def loop() -> None:
        client = redis.Redis.from_url(url, socket_timeout=5)
        while not stopping.is_set():
            got = client.blpop([FLOOR_QUEUE], timeout=0.5)
            if got is not None:
                rec.seen(json.loads(got[1])["payload"])
        client.close()

    pool = [threading.Thread(target=loop, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()

    def stop() -> None:
        stopping.set()
        for t in pool:
            t.join(timeout=5)

    return stop


def blpop_sender(url: str) -> Send:
    client = redis.Redis.from_url(url)
    return lambda payload: client.rpush(FLOOR_QUEUE, floor_body(payload))


def dramatiq_actor(url: str, rec: Recorder | None) -> Any:
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=url)
    dramatiq.set_broker(broker)

    @dramatiq.actor(queue_name=QUEUE, actor_name=ACTOR, max_retries=0)
    def noop(payload: list[float]) -> None:
        if rec is not None:
            rec.seen(payload)

    return broker, noop


def dramatiq_worker(url: str, threads: int, rec: Recorder) -> tuple[Callable[[], None], Send]:
    from dramatiq import Worker

    broker, noop = dramatiq_actor(url, rec)
    worker = Worker(broker, worker_threads=threads, worker_timeout=DRAMATIQ_WORKER_TIMEOUT_MS)
    worker.start()
    # dramatiq's Worker.stop waits for its consumers' idle polls; the process ends by os._exit.
    return (lambda: None), noop.send


def dramatiq_sender(url: str) -> Send:
    _, noop = dramatiq_actor(url, None)
    return noop.send


def start_worker(
    system: str, url: str, threads: int, rec: Recorder
) -> tuple[Callable[[], None], Send]:
    """Start the system's worker; returns its stop function and a send function for the
    worker's own warm-up tasks."""
    if system == "ours-async":
        return ours_async_worker(url, threads, rec), ours_sender(system, url)
    if system.startswith("ours"):
        return ours_worker(system, url, threads, rec), ours_sender(system, url)
    if system == "blpop":
        return blpop_worker(url, threads, rec), blpop_sender(url)
    return dramatiq_worker(url, threads, rec)


def make_sender(system: str, url: str) -> Send:
    if system.startswith("ours"):
        return ours_sender(system, url)
    if system == "blpop":
        return blpop_sender(url)
    return dramatiq_sender(url)


def version(system: str) -> str:
    if system == "dramatiq":
        import dramatiq

        return str(dramatiq.__version__)
    if system.startswith("ours"):
        from importlib.metadata import version as dist_version

        return dist_version("taskcustody")
    return f"redis-py {redis.__version__}"


# --- the two roles ----------------------------------------------------------------------------


def run_worker(args: argparse.Namespace) -> int:
    rec = Recorder(args.tasks)
    stop, send = start_worker(args.system, args.url, args.threads, rec)
    for k in range(WARMUP):
        now = time.time()
        send([-1 - k, now, now])
    if not rec.warmed.wait(args.grace):
        emit({"event": "error", "why": f"warm-up: {rec.warm} of {WARMUP} handled"})
        os._exit(1)
    emit({"event": "ready", "version": version(args.system)})
    line = sys.stdin.readline().split()
    if len(line) != 2 or line[0] != "sent":
        os._exit(1)  # the harness went away
    rec.expect(int(line[1]))
    rec.done.wait(args.grace)
    with rec.lock:
        data = {
            "index": list(rec.index),
            "latency": list(rec.latency),
            "from_schedule": list(rec.from_schedule),
            "last": rec.last,
        }
    with open(args.out, "w") as fh:
        json.dump(data, fh)
    emit({"event": "done", "received": len(data["index"])})
    sys.stdout.flush()
    if args.system.startswith("ours"):
        stop()  # a clean shutdown: deregister, forget our empty lists
    os._exit(0)


def run_producer(args: argparse.Namespace) -> int:
    send = make_sender(args.system, args.url)
    # Connect (and load scripts) before the clock starts: one warm-up task (negative index, not
    # recorded by the worker).
    send([-1_000_000, time.time(), time.time()])
    interval = 1.0 / args.rate
    lags: list[float] = []
    wall0, t0 = time.time(), time.monotonic()
    sent = 0
    for i in range(args.tasks):
        due = t0 + i * interval
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
            now = time.monotonic()
        if now - t0 > args.max_seconds:
            break
        send([i, time.time(), wall0 + (due - t0)])
        lags.append(now - due)
        sent += 1
    elapsed = time.monotonic() - t0
    with open(args.out, "w") as fh:
        json.dump({"sent": sent, "seconds": elapsed, "lag": lags, "wall0": wall0}, fh)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("role", choices=["worker", "producer"])
    ap.add_argument(
        "--system",
        required=True,
        choices=["ours", "ours-prefetch", "ours-async", "blpop", "dramatiq"],
    )
    ap.add_argument("--url", required=True)
    ap.add_argument("--tasks", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="worker: worker threads (ours-async: asyncio workers)",
    )
    ap.add_argument(
        "--grace",
        type=float,
        default=30.0,
        help="worker: seconds to wait for the warm-up, and for the last task",
    )
    ap.add_argument("--rate", type=float, help="producer: tasks per second")
    ap.add_argument(
        "--max-seconds", type=float, default=60.0, help="producer: stop sending after this long"
    )
    args = ap.parse_args()
    if args.role == "producer":
        if not args.rate or args.rate <= 0:
            ap.error("the producer needs --rate > 0")
        return run_producer(args)
    return run_worker(args)


if __name__ == "__main__":
    sys.exit(main())
