from taskcustody import ManualClock, Producer, QueueKeys, Server
from tests.conftest import TEST_SETTINGS, Backend


def test_one_cycle_commits(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    clock = ManualClock()
    Producer(client, keys, clock).enqueue({"n": 1})
    server = Server(client, keys, "s1", lambda p: p["n"] + 1, settings=TEST_SETTINGS, clock=clock)
    (worker,) = server.start()
    task = worker.take()
    assert task is not None
    worker.record(task)
    release = worker.release(task, worker.execute(task))
    assert release.held and release.action == "committed"
    assert client.llen(keys.queue) == 0
    assert client.llen(worker.list_key) == 0
    assert client.hgetall(keys.processing) == {}
    assert client.hget(keys.commit_log, task.id) == b"1"
