"""Recovery cost: how long one sweep takes to find and drain a dead server's in-flight lists, as
the database fills with unrelated keys -- ours (the registry set) next to a SCAN-based recovery.

State for each measurement, rebuilt every repetition:
* a dead server (heartbeat deadline in the past) with ``WORKERS`` in-flight lists, one task each,
  with processing records: what a crashed process leaves behind;
* a live server with ``WORKERS`` lists holding one task each, which neither recovery may touch;
* 0, 100,000 or 1,000,000 unrelated keys (``DEBUG POPULATE``).

Ours: ``taskcustody.sweep`` (prune, drain the registered lists that are not live, processing
sweep). The baseline differs in one thing only: it finds in-flight lists by
``SCAN MATCH <prefix>:inflight:* COUNT 1000`` over the whole keyspace instead of reading the
registry, then drains them with the same steps.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import redis

from bench.harness import RedisServer, counts_since_reset

QUEUE = "recq"
WORKERS = 8
SCAN_COUNT = 1000


def _lib() -> Any:
    import taskcustody

    return taskcustody


def build_state(url: str, rep: int) -> tuple[Any, Any]:
    """Returns (keys, identity of the live server that runs the sweep)."""
    tc = _lib()
    # A client of its own: each Worker opens a connection outside the pool's reuse.
    client = redis.Redis.from_url(url)
    keys = tc.QueueKeys(QUEUE)
    # Wipe the queue's keys (not the unrelated ones) so every repetition starts alike.
    stale = [k for k in client.zrange(keys.inflight_registry, 0, -1)]
    client.delete(*keys.all_fixed_keys(), *stale)
    real_now = tc.RedisClock(client).now()

    def noop(payload: Any) -> None:
        return None

    settings = tc.Settings(block_timeout=0.1, socket_timeout_margin=2.0)
    dead = tc.Server(
        client,
        keys,
        f"dead{rep}",
        noop,
        workers=WORKERS,
        settings=settings,
        clock=tc.ManualClock(real_now - 10 * settings.server_ttl),
    )
    live = tc.Server(client, keys, f"live{rep}", noop, workers=WORKERS, settings=settings)
    tc.Producer(client, keys).enqueue_many(range(2 * WORKERS))
    # Both register before either takes: a server's startup drain would recover the dead one's
    # lists right away.
    workers = [w for server in (dead, live) for w in server.start()]
    for worker in workers:
        task = worker.take(timeout=0.1)
        assert task is not None
        client.hset(keys.processing, task.id, f"{worker.list_key} {real_now!r}")
        worker.close()
    rescuer = tc.Server(client, keys, f"rescuer{rep}", noop, settings=settings)
    rescuer.claim()
    assert client.llen(keys.queue) == 0
    client.close()
    return keys, rescuer.identity


def ours(client: redis.Redis, keys: Any, me: Any) -> int:
    tc = _lib()
    report = tc.sweep(client, keys, tc.RedisClock(client).now(), me)
    return int(report.moved + report.requeued_stuck)


def scan_lists(client: redis.Redis, keys: Any) -> list[str]:
    """Every in-flight list of the queue, found by SCAN over the whole keyspace."""
    found = client.scan_iter(match=f"{keys.inflight_prefix}*", count=SCAN_COUNT, _type="list")
    return sorted(k.decode() if isinstance(k, bytes) else k for k in found)


def scan_registrations(client: redis.Redis, keys: Any) -> dict[str, float]:
    """:func:`scan_lists` in the shape of ``recovery.registrations``. SCAN knows no registration
    times: each list gets +inf, so the sweep's garbage collection never picks one (SCAN finds
    only lists that exist, so there is nothing to forget)."""
    return dict.fromkeys(scan_lists(client, keys), float("inf"))


def scan_based(client: redis.Redis, keys: Any, me: Any) -> int:
    """The library's own sweep with one change: lists are found by SCAN, not from the registry
    (``recovery.registrations`` swapped for :func:`scan_registrations` for the call)."""
    from taskcustody.core import recovery

    original = recovery.registrations
    recovery.registrations = scan_registrations
    try:
        return ours(client, keys, me)
    finally:
        recovery.registrations = original


def measure(sizes: list[int], reps: int, log: Any = print) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    with RedisServer(debug_command=True) as srv:
        client = redis.Redis.from_url(srv.url)
        for size in sizes:
            if size:
                t0 = time.monotonic()
                client.execute_command("DEBUG", "POPULATE", size, "unrelated", 16)
                log(f"  populated {client.dbsize()} keys in {time.monotonic() - t0:.1f}s")
            row: dict[str, Any] = {"unrelated_keys": size}
            for name, fn in (("ours", ours), ("scan", scan_based)):
                times: list[float] = []
                calls: list[int] = []
                reads: list[int] = []
                for rep in range(reps):
                    keys, me = build_state(srv.url, rep)
                    client.config_resetstat()
                    t0 = time.perf_counter()
                    moved = fn(client, keys, me)
                    times.append(time.perf_counter() - t0)
                    counts = counts_since_reset(client)
                    calls.append(counts["commands"])
                    reads.append(counts["reads"])
                    scans = int(counts["by_command"].get("scan", 0))
                    if (name == "scan") != (scans > 0):
                        raise RuntimeError(
                            f"{name}: {scans} SCAN calls; the baseline must SCAN and ours must not"
                        )
                    if moved != WORKERS:
                        raise RuntimeError(f"{name}: recovered {moved} tasks, expected {WORKERS}")
                    if int(client.llen(keys.queue)) != WORKERS:
                        raise RuntimeError(f"{name}: queue holds {client.llen(keys.queue)}")
                row[name] = {
                    "median_ms": statistics.median(times) * 1000,
                    "min_ms": min(times) * 1000,
                    "max_ms": max(times) * 1000,
                    "commands": statistics.median(calls),
                    "round_trips": statistics.median(reads),
                }
            log(
                f"  recovery, {size:>9,} unrelated keys: ours {row['ours']['median_ms']:.2f} ms, "
                f"SCAN {row['scan']['median_ms']:.2f} ms"
            )
            rows.append(row)
        client.close()
    return {"workers": WORKERS, "scan_count": SCAN_COUNT, "rows": rows}


if __name__ == "__main__":
    import json

    print(json.dumps(measure([0, 100_000], 3), indent=2))
