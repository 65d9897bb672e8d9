"""Poison pills and their bystanders: a task that shares the pill's process dies with it.

Recovery counts every task a dead holder held, not only the one that killed it. A process that
dies by the pill also held, often, another task: a prefetching worker holds its whole batch while
it runs it (one in-flight list per slot, released after the whole batch), and a server with
several workers holds a task per worker. Before suspects, the drain put the dead process's tasks
back side by side at the queue's take end, so the next takes brought them into one process
together again: the bystander shared each of the pill's deaths, and was dead-lettered as a poison
pill with it, although it never killed anything (seen end to end in
tests/test_poison_pill_e2e.py with 2 workers per process, and with `--prefetch 4`).

Now a task that recovery counts goes to the suspects list, and a process runs at most one suspect
at a time (a prefetching worker: as a batch of one). The bystander shares the pill's first death
only (one count), then runs without it and commits. These reproduce the old failure's setting
deterministically (ManualClock: each restart claims the id once the dead incarnation's lease
lapsed, and its startup drain recovers what the dead one held).
"""

from __future__ import annotations

import pytest
import redis

from taskcustody import ManualClock, Producer, QueueKeys, Settings
from taskcustody.core.envelope import decode
from taskcustody.core.prefetch import PrefetchingWorker
from taskcustody.core.worker import Worker
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import commits, dead_letters, make_server

SETTINGS = Settings(**{**TEST_SETTINGS.__dict__, "max_recoveries": 3})


def run_until_the_pill_is_gone(
    client: redis.Redis,
    keys: QueueKeys,
    clock: ManualClock,
    pill: str,
    settings: Settings,
    workers: int,
) -> tuple[list[str], list[list[str]]]:
    """Processes of server id s1, one after the other. Each takes with all its workers, over and
    over: a round that took the pill dies in it (no release: the handlers that ran before it in
    a batch returned, but a batch's releases follow the whole batch); a round without it commits
    what it took. Ends when a round takes nothing. Returns the tasks whose handler was reached,
    and what each round took."""
    ran: list[str] = []
    rounds: list[list[str]] = []
    for _ in range(20):  # far more processes than the pill can kill
        runners = make_server(client, keys, "s1", clock, settings=settings, workers=workers).start()
        while True:
            taken: list[str] = []
            releases = []
            for runner in runners:
                if isinstance(runner, PrefetchingWorker):
                    batch, error = runner.take_all()
                    assert error is None
                    ids = [task_id for _, _, task_id in batch.raws]
                    releases.append(lambda runner=runner, batch=batch: runner.handle(batch))
                else:
                    assert isinstance(runner, Worker)
                    task = runner.take(0.05)
                    if task is None:
                        continue
                    ids = [task.id]

                    def release(runner: Worker = runner, raw: bytes = task.raw) -> None:
                        task = decode(raw)
                        runner.record(task)
                        runner.release(task, runner.execute(task))

                    releases.append(release)
                taken += ids
                ran += ids[: ids.index(pill) + 1] if pill in ids else ids
            rounds.append(taken)
            if not taken:
                return ran, rounds
            if pill in taken:
                break  # the process dies in the pill
            for release in releases:
                release()
        clock.advance(settings.server_ttl + 1)
    raise AssertionError(f"the pill was never dead-lettered: {rounds}")


@pytest.mark.parametrize(
    ("prefetch", "workers"),
    [(2, 1), (1, 2)],
    ids=["prefetched-in-the-pills-batch", "run-by-the-pills-other-worker"],
)
def test_a_task_that_shares_the_pills_process_is_not_dead_lettered_with_it(
    backend: Backend, keys: QueueKeys, prefetch: int, workers: int
) -> None:
    client = backend.client()
    clock = ManualClock()
    settings = Settings(**{**SETTINGS.__dict__, "prefetch": prefetch})
    pill, innocent = Producer(client, keys, clock).enqueue_many(
        [{"poison": True}, {"poison": False}]
    )
    ran, rounds = run_until_the_pill_is_gone(client, keys, clock, pill, settings, workers)
    assert SETTINGS.max_recoveries is not None
    # The first process took both (they were enqueued together) and died in the pill ...
    assert sorted(rounds[0]) == sorted([pill, innocent])
    # ... and from then on each ran alone: a suspect at a time per process.
    assert all(len(r) <= 1 for r in rounds[1:]), rounds
    assert ran.count(pill) == SETTINGS.max_recoveries + 1
    assert [d["task_id"] for d in dead_letters(client, keys)] == [pill]
    assert commits(client, keys) == {innocent: 1}
    assert client.hgetall(keys.recoveries) == {}  # the commit deleted the innocent's count
    assert client.llen(keys.suspects) == 0 and client.llen(keys.queue) == 0


def test_a_process_takes_one_suspect_at_a_time_and_ordinary_work_beside_it(
    backend: Backend, keys: QueueKeys
) -> None:
    """Two suspects and an ordinary task: the process's first worker takes a suspect, its second
    the ordinary task (not the other suspect); once the first is released the other suspect is
    taken."""
    client = backend.client()
    clock = ManualClock()
    a, b = Producer(client, keys, clock).enqueue_many(["a", "b"])
    dead = make_server(client, keys, "dead", clock, settings=SETTINGS, workers=2)
    for worker in dead.start():
        assert isinstance(worker, Worker) and worker.take(0.05) is not None
    clock.advance(SETTINGS.server_ttl + 1)
    (ordinary,) = Producer(client, keys, clock).enqueue_many(["c"])
    server = make_server(client, keys, "s2", clock, settings=SETTINGS, workers=2)
    first, second = server.start()
    assert isinstance(first, Worker) and isinstance(second, Worker)
    assert server.sweep().drained_lists
    assert client.llen(keys.suspects) == 2
    first.reconcile()
    second.reconcile()  # what run_once does first: a new worker is dirty until it reconciles
    one = first.take(0.05)
    other = second.take(0.05)
    assert one is not None and one.id in (a, b)
    assert other is not None and other.id == ordinary
    first.release(one, first.execute(one))  # the slot is free again
    second.release(other, second.execute(other))
    last = second.take(0.05)
    assert last is not None and {one.id, last.id} == {a, b}
