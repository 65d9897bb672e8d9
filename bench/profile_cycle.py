"""Where the time goes in our cycle: one worker drains N no-op tasks on a throwaway server, twice.

1. Step timings: ``take``, ``record``, ``execute``, ``release``, ``release_and_take`` (the busy
   cycle's one step) of ``Worker`` wrapped with
   ``perf_counter`` (cheap enough not to distort a ~0.3 ms cycle much).
2. cProfile of the same loop: the functions with the most own time, grouped by kind (waiting for
   Redis, redis-py command packing and reply parsing, JSON, ours).
"""

from __future__ import annotations

import cProfile
import pstats
import time
from collections import defaultdict
from typing import Any

import redis

from bench.drivers import PREFETCH
from bench.harness import RedisServer

QUEUE = "profq"


def _worker(
    url: str, tasks: int, prefetch: int = 1, handler: Any = lambda payload: None
) -> tuple[Any, Any]:
    from taskcustody import Producer, QueueKeys, Server, Settings, connect

    settings = Settings(block_timeout=0.5, socket_timeout_margin=2.0, prefetch=prefetch)
    client = connect(url, settings)
    keys = QueueKeys(QUEUE)
    redis.Redis.from_url(url).flushall()
    Producer(client, keys).enqueue_many(range(tasks))
    server = Server(client, keys, "prof", handler, workers=1, settings=settings)
    (worker,) = server.start()
    # the production loop's cycle: each release takes the next task (release_and_take), as
    # `Worker.run` sets it up (a prefetching worker's slots never do)
    if prefetch == 1:
        worker.take_next = lambda: True
    return server, worker


def step_timings(url: str, tasks: int) -> dict[str, Any]:
    _, worker = _worker(url, tasks)
    spent: dict[str, float] = defaultdict(float)
    for name in ("take", "record", "execute", "release", "release_and_take", "reconcile"):
        original = getattr(worker, name)

        def timed(*a: Any, _orig: Any = original, _name: str = name, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _orig(*a, **kw)
            finally:
                spent[_name] += time.perf_counter() - t0

        setattr(worker, name, timed)
    done = 0
    t0 = time.perf_counter()
    while done < tasks:
        done += bool(worker.run_once(timeout=0.5))
    total = time.perf_counter() - t0
    steps = {k: v / tasks * 1e6 for k, v in spent.items()}
    steps["loop overhead"] = total / tasks * 1e6 - sum(steps.values())
    worker.close()
    return {"tasks": tasks, "us_per_task": total / tasks * 1e6, "steps_us": steps}


# (kind, substrings of the function name, substrings of the file name)
KINDS = [
    ("socket recv (waiting for Redis's reply)", ("'recv'", "'recv_into'", "select", "poll"), ()),
    ("socket send (syscall; wakes redis-server)", ("'sendall'", "'send'"), ()),
    ("redis-py: packing commands, parsing replies", (), ("redis/",)),
    ("JSON encode/decode", (), ("json/",)),
    ("taskcustody", (), ("taskcustody/",)),
]


def cprofile(url: str, tasks: int, top: int = 12, prefetch: int = 1) -> dict[str, Any]:
    handled = [0]

    def count(payload: Any) -> None:
        handled[0] += 1

    _, worker = _worker(url, tasks, prefetch, count)
    prof = cProfile.Profile()
    prof.enable()
    while handled[0] < tasks:
        worker.run_once(timeout=0.5)
    prof.disable()
    worker.close()
    stats = pstats.Stats(prof)
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = []
    by_kind: dict[str, float] = defaultdict(float)
    for (filename, _line, func), (_cc, _nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = filename.split("site-packages/")[-1].split("src/")[-1]
        rows.append(
            {"function": f"{where}:{func}", "own_us": tt / tasks * 1e6, "cum_us": ct / tasks * 1e6}
        )
        kind = "other (Python runtime, threading, builtins)"
        for name, in_func, in_file in KINDS:
            if any(n in func for n in in_func) or any(n in filename for n in in_file):
                kind = name
                break
        by_kind[kind] += tt
    rows.sort(key=lambda r: -r["own_us"])
    return {
        "tasks": tasks,
        "prefetch": prefetch,
        "profiled_us_per_task": total / tasks * 1e6,
        "by_kind_pct": {
            k: v / total * 100 for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])
        },
        "top": rows[:top],
    }


def profile(tasks: int) -> dict[str, Any]:
    with RedisServer() as srv:
        result = step_timings(srv.url, tasks)
        result["cprofile"] = cprofile(srv.url, tasks)
        result["cprofile_prefetch"] = cprofile(srv.url, tasks, prefetch=PREFETCH)
        return result


if __name__ == "__main__":
    import json

    print(json.dumps(profile(5000), indent=2))
