"""What every end-to-end SIGKILL test checks once its processes are done: every task committed
exactly once, at least once executed, and nothing left in Redis but the results."""

from __future__ import annotations

import redis

from taskcustody import QueueKeys


def assert_every_task_committed_once(
    admin: redis.Redis,
    keys: QueueKeys,
    ids: list[str],
    title: str,
    at_kill: int,
    inflight_at_kill: int,
) -> None:
    commits = {k.decode(): int(v) for k, v in admin.hgetall(keys.commit_log).items()}
    executions = sum(int(v) for v in admin.hgetall("e2e:executions").values())
    print(
        f"\n{title}: N={len(ids)}, committed before SIGKILL={at_kill}, in flight at kill="
        f"{inflight_at_kill}, commits={sum(commits.values())}, distinct committed="
        f"{len(commits)}, executions={executions}"
    )
    assert sorted(commits) == sorted(ids)
    assert set(commits.values()) == {1}
    assert int(admin.get(keys.committed) or 0) == len(ids)
    assert executions >= len(ids)
    assert admin.llen(keys.queue) == 0
    assert all(admin.llen(k) == 0 for k in admin.zrange(keys.inflight_registry, 0, -1))
    assert admin.hlen(keys.processing) == 0
    # Graceful shutdown deregistered the servers and forgot their (empty) lists.
    assert admin.zcard(keys.servers) == 0
