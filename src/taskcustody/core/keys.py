"""The Redis key schema of one queue: every key shares one Cluster hash tag and a prefix."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InvalidName

# Braces would change the hash tag, and ':' separates the parts of an in-flight list key.
_SAFE = re.compile(r"^[A-Za-z0-9_.\-]+$")


def check_name(kind: str, value: str) -> str:
    if not value or not _SAFE.match(value):
        raise InvalidName(
            f"{kind} {value!r} is not allowed: use letters, digits, '_', '-' and '.' only"
        )
    return value


@dataclass(frozen=True)
class ListOwner:
    """Who an in-flight list belongs to: a worker of one incarnation of one server id."""

    server_id: str
    incarnation: int
    worker_id: str


@dataclass(frozen=True)
class QueueKeys:
    """All key names of one queue. `{queue}` is the hash tag, so BLMOVE and our scripts never
    cross slots in Redis Cluster (names may not contain braces, so no other part of a key can act
    as a hash tag)."""

    queue_name: str
    prefix: str = "taskcustody"

    def __post_init__(self) -> None:
        check_name("queue name", self.queue_name)
        check_name("prefix", self.prefix)

    @property
    def base(self) -> str:
        return f"{self.prefix}:{{{self.queue_name}}}"

    @property
    def queue(self) -> str:
        return f"{self.base}:queue"

    @property
    def inflight_registry(self) -> str:
        """Sorted set: in-flight list key -> time of its last registration (every take registers
        its list; the sweep forgets dead, empty lists once that time is older than the grace)."""
        return f"{self.base}:inflight-registry"

    @property
    def legacy_inflight_registry(self) -> str:
        """The registry of version 0.1 (a plain set); a starting server moves it into the new
        one (`recovery.migrate_legacy_registry`), so lists registered by 0.1 stay recoverable."""
        return f"{self.base}:inflight-lists"

    @property
    def servers(self) -> str:
        return f"{self.base}:servers"

    @property
    def incarnations(self) -> str:
        return f"{self.base}:incarnations"

    @property
    def sweep_lease(self) -> str:
        """Who sweeps now (sweep_lease.py): one sweeper at a time keeps the fleet's sweep load
        linear in its size."""
        return f"{self.base}:sweep-lease"

    @property
    def recoveries(self) -> str:
        """Hash of recovery counts: task id -> how many times recovery took it back from a
        holder that died; `<task id>:from` -> those holders (poison-pill detection)."""
        return f"{self.base}:recoveries"

    @property
    def suspects(self) -> str:
        """List of suspects: tasks recovery took back from a dead holder and did not dead-letter
        (their recovery count is >= 1). A server process takes at most one at a time, so a
        suspect never dies again beside another counted task (docs/guides/using-it.md, poison
        pills)."""
        return f"{self.base}:suspects"

    @property
    def scheduled(self) -> str:
        """Sorted set of delayed retries: envelope -> due time (docs/protocol.md, section 10).
        A promotion moves each due member to the queue (or the suspects list) in one script."""
        return f"{self.base}:scheduled"

    @property
    def processing(self) -> str:
        return f"{self.base}:processing"

    @property
    def dead_letters(self) -> str:
        return f"{self.base}:dead"

    @property
    def committed(self) -> str:
        return f"{self.base}:committed"

    @property
    def commit_log(self) -> str:
        return f"{self.base}:commits"

    @property
    def result_prefix(self) -> str:
        return f"{self.base}:result:"

    def result(self, task_id: str) -> str:
        return f"{self.result_prefix}{task_id}"

    @property
    def inflight_prefix(self) -> str:
        return f"{self.base}:inflight:"

    def inflight(self, owner: ListOwner) -> str:
        return f"{self.inflight_prefix}{owner.server_id}:{owner.incarnation}:{owner.worker_id}"

    def owner_of(self, inflight_key: str | bytes) -> ListOwner:
        key = inflight_key.decode() if isinstance(inflight_key, bytes) else inflight_key
        if not key.startswith(self.inflight_prefix):
            raise InvalidName(f"{key!r} is not an in-flight list of queue {self.queue_name!r}")
        server_id, incarnation, worker_id = key[len(self.inflight_prefix) :].split(":")
        return ListOwner(server_id, int(incarnation), worker_id)

    def all_fixed_keys(self) -> dict[str, str]:
        """The keys whose types are fixed, with their expected Redis type (for checks)."""
        return {
            self.queue: "list",
            self.suspects: "list",
            self.scheduled: "zset",
            self.inflight_registry: "zset",
            self.legacy_inflight_registry: "set",
            self.servers: "zset",
            self.incarnations: "hash",
            self.processing: "hash",
            self.recoveries: "hash",
            self.dead_letters: "list",
            self.committed: "string",
            self.commit_log: "hash",
            self.sweep_lease: "string",
        }
