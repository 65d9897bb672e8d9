"""Poison pills with a prefetching worker: the task prefetched next to a pill dies with it.

A prefetching worker holds its whole batch (one in-flight list per slot) while it runs the
batch's tasks one after the other, and releases them all afterwards. When the pill kills the
process, every task of the batch is recovered with it, and counted. The drain puts them back
side by side at the queue's take end, so the next prefetching take brings them in together
again: the innocent task shares every one of the pill's deaths, and is dead-lettered as a poison
pill with it -- although it never killed anything (it even ran and returned, every other time,
and its commit was lost with the batch's releases).

Seen end to end too: tests/test_poison_pill_e2e.py with `--prefetch 4` fails about one run in
two with an ordinary task in the dead letters next to the pill, same holders, recoveries 4.
"""

from __future__ import annotations

import pytest

from taskcustody import ManualClock, Producer, QueueKeys, Settings
from taskcustody.prefetch import PrefetchingWorker
from tests.conftest import TEST_SETTINGS, Backend
from tests.helpers import commits, dead_letters, make_server

SETTINGS = Settings(**{**TEST_SETTINGS.__dict__, "prefetch": 2, "max_recoveries": 3})


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="issue 11: recovery counts every task a dying process held, so a "
                          "task prefetched next to a poison pill is dead-lettered with it")
def test_a_task_prefetched_next_to_a_poison_pill_is_not_dead_lettered_with_it(
    backend: Backend, keys: QueueKeys
) -> None:
    client = backend.client()
    clock = ManualClock()
    pill, innocent = Producer(client, keys, clock).enqueue_many(
        [{"poison": True}, {"poison": False}])
    assert SETTINGS.max_recoveries is not None
    ran: list[str] = []
    for _ in range(SETTINGS.max_recoveries + 1):
        # A restart of the same server id: its startup drain recovers the last death's batch.
        (worker,) = make_server(client, keys, "s1", clock, settings=SETTINGS).start()
        assert isinstance(worker, PrefetchingWorker)
        batch, error = worker.take_all()
        assert error is None
        assert sorted(task_id for _, _, task_id in batch.raws) == sorted([pill, innocent])
        # The process runs the batch in order and dies in the pill: what ran before it returned,
        # but nothing is released (the releases follow the whole batch).
        for _, _, task_id in batch.raws:
            ran.append(task_id)
            if task_id == pill:
                break
        clock.advance(SETTINGS.server_ttl + 1)
    (worker,) = make_server(client, keys, "s1", clock, settings=SETTINGS).start()
    assert ran.count(pill) == SETTINGS.max_recoveries + 1
    assert [d["task_id"] for d in dead_letters(client, keys)] == [pill]
    # The innocent task is still in custody, and commits once it runs without the pill.
    assert worker.run_once(timeout=0.05)
    assert commits(client, keys) == {innocent: 1}
