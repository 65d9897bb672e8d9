"""Poison pills and their bystanders: a task that shares the pill's process dies with it.

Recovery counts every task a dead holder held, not only the one that killed it. A process that
dies by the pill also held, often, another task: a prefetching worker holds its whole batch while
it runs it (one in-flight list per slot, released after the whole batch), and a server with
several workers holds a task per worker. The drain puts the dead process's tasks back side by
side at the queue's take end, so the next takes bring them into one process together again: the
bystander shares each of the pill's deaths, and is dead-lettered as a poison pill with it,
although it never killed anything.

Seen end to end: tests/test_poison_pill_e2e.py run with 2 workers per process (3 of 8 runs) or
with `--prefetch 4` (3 of 7 runs) ends with an ordinary task in the dead letters next to the
pill, same holders, recoveries 4. These reproduce it deterministically (ManualClock: each
restart claims the id once the dead incarnation's lease lapsed, and its startup drain recovers
the batch).
"""

from __future__ import annotations

import pytest
import redis

from taskcustody import ManualClock, Producer, QueueKeys, Settings
from taskcustody.prefetch import PrefetchingWorker
from taskcustody.worker import Worker
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import commits, dead_letters, make_server

SETTINGS = Settings(**{**TEST_SETTINGS.__dict__, "max_recoveries": 3})
BUG = ("issue 11: recovery counts every task a dying process held, so a task that shares the "
       "pill's process is dead-lettered with it")


def die_by_the_pill(client: redis.Redis, keys: QueueKeys, clock: ManualClock, pill: str,
                    innocent: str, settings: Settings, workers: int) -> list[str]:
    """max_recoveries + 1 runs of the same server id, each of which takes both tasks and dies
    in the pill without releasing anything; returns the tasks whose handler was reached."""
    assert settings.max_recoveries is not None
    ran: list[str] = []
    for _ in range(settings.max_recoveries + 1):
        runners = make_server(client, keys, "s1", clock, settings=settings,
                              workers=workers).start()
        if settings.prefetch > 1:
            (worker,) = runners
            assert isinstance(worker, PrefetchingWorker)
            batch, error = worker.take_all()
            assert error is None
            taken = [task_id for _, _, task_id in batch.raws]
            # The batch runs in order until the pill: what ran before it returned, but the
            # releases follow the whole batch, so none is sent.
            ran += taken[: taken.index(pill) + 1]
        else:
            tasks = []
            for worker in runners:
                assert isinstance(worker, Worker)
                task = worker.take(0.05)
                assert task is not None
                tasks.append(task.id)
            taken = tasks
            ran += taken  # both handlers are running when the pill kills the process
        assert sorted(taken) == sorted([pill, innocent])
        clock.advance(settings.server_ttl + 1)
    return ran


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=BUG)
@pytest.mark.parametrize(("prefetch", "workers"), [(2, 1), (1, 2)],
                         ids=["prefetched-in-the-pills-batch", "run-by-the-pills-other-worker"])
def test_a_task_that_shares_the_pills_process_is_not_dead_lettered_with_it(
    backend: Backend, keys: QueueKeys, prefetch: int, workers: int
) -> None:
    client = backend.client()
    clock = ManualClock()
    settings = Settings(**{**SETTINGS.__dict__, "prefetch": prefetch})
    pill, innocent = Producer(client, keys, clock).enqueue_many(
        [{"poison": True}, {"poison": False}])
    ran = die_by_the_pill(client, keys, clock, pill, innocent, settings, workers)
    runners = make_server(client, keys, "s1", clock, settings=settings, workers=workers).start()
    assert ran.count(pill) == SETTINGS.max_recoveries + 1  # type: ignore[operator]
    assert [d["task_id"] for d in dead_letters(client, keys)] == [pill]
    # The innocent task is still in custody, and commits once it runs without the pill.
    assert runners[0].run_once(timeout=0.05)
    assert commits(client, keys) == {innocent: 1}
