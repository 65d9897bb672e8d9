"""bench/aio.py: every system of the asyncio comparison gets the same concurrency and I/O wait,
and the prefetch rows say which prefetch they ran."""

from __future__ import annotations

import pytest

aio = pytest.importorskip("bench.aio")


@pytest.mark.parametrize("system", [s for s, _ in aio.SYSTEMS])
def test_every_system_is_driven_with_the_same_concurrency_and_wait(system: str) -> None:
    argv = aio.argv_for(system, "python", "redis://h:1/0", 100, 64, 5.0)
    assert argv[argv.index("--concurrency") + 1] == "64"
    assert argv[argv.index("--wait-ms") + 1] == "5"
    assert argv[argv.index("--tasks") + 1] == "100"


def test_the_prefetch_rows_say_which_prefetch_they_ran() -> None:
    meta = {
        "command": "python -m bench.aio",
        "date": "D",
        "commit": "C",
        "cpus": 2,
        "load_before": "1",
        "load_after": "1",
        "seconds": 1.0,
        "tasks": 10,
        "rounds": 1,
    }
    rows = [
        {
            "system": system,
            "concurrency": 8,
            "wait_ms": 0.0,
            "median": median,
            "min": 90.0,
            "max": 310.0,
            "x_async": median / 100,
            "version": None,
        }
        for system, median in (("ours-async", 100.0), ("ours-async-prefetch", 300.0))
    ]
    text = aio.render({"meta": meta, "throughput": rows})
    assert len([line for line in text.splitlines() if "| 8 | 1 | 0 ms | 100 |" in line]) == 1
    assert len([line for line in text.splitlines() if "| 8 | 8 | 0 ms | 300 |" in line]) == 1
    assert "not served" not in text


def test_the_asyncio_driver_handles_every_task_once_with_an_awaiting_handler(
    real_redis: object,
) -> None:
    import redis

    drivers = pytest.importorskip("bench.drivers")
    url = real_redis.url  # type: ignore[attr-defined]
    redis.Redis.from_url(url).flushall()
    drivers.enqueue("ours-async", url, 20)
    finish = drivers.Finish(url, 20)
    drivers.run_ours_async(url, 4, finish, "test", wait=0.001)
    assert finish.done.is_set()
    assert drivers.committed("ours-async", url) == 20


def test_the_asyncio_prefetching_driver_handles_every_task_once(real_redis: object) -> None:
    import redis

    drivers = pytest.importorskip("bench.drivers")
    url = real_redis.url  # type: ignore[attr-defined]
    redis.Redis.from_url(url).flushall()
    drivers.enqueue("ours-async-prefetch", url, 50)
    finish = drivers.Finish(url, 50)
    drivers.run_ours_async(url, 2, finish, "test", wait=0.0, prefetch=drivers.PREFETCH)
    assert finish.done.is_set()
    assert drivers.committed("ours-async-prefetch", url) == 50
