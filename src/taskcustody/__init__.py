"""taskcustody: a Redis task queue that never loses a task and never hands one task to two workers.

Workers take tasks with BLMOVE into an in-flight list of their own and release custody in a
`finally`; recovery finds in-flight lists through a registry, drains a server's own debris at
startup and dead servers' lists periodically. See the README and docs/design.md.
"""

from .clock import Clock, ManualClock, RedisClock, WallClock
from .connection import check_server, connect, connect_fake
from .envelope import Task
from .errors import (
    EvictingPolicy,
    InvalidName,
    MalformedTask,
    RedisOutOfMemory,
    RedisTooOld,
    ReplicationTimeout,
    ServerIdHeld,
    Superseded,
    TaskCustodyError,
    WrongKeyType,
)
from .keys import ListOwner, QueueKeys
from .producer import Producer
from .recovery import (
    ServerIdentity,
    drain_inflight,
    prune_inactive_servers,
    recover_inflight,
    requeue_stuck_processing_tasks,
    sweep,
)
from .server import Server
from .settings import Settings
from .status import queue_status
from .worker import Outcome, Release, Worker

__all__ = [
    "Clock",
    "EvictingPolicy",
    "InvalidName",
    "ListOwner",
    "MalformedTask",
    "ManualClock",
    "Outcome",
    "Producer",
    "QueueKeys",
    "RedisClock",
    "RedisOutOfMemory",
    "RedisTooOld",
    "Release",
    "ReplicationTimeout",
    "Server",
    "ServerIdHeld",
    "ServerIdentity",
    "Settings",
    "Superseded",
    "Task",
    "TaskCustodyError",
    "WallClock",
    "Worker",
    "WrongKeyType",
    "check_server",
    "connect",
    "connect_fake",
    "drain_inflight",
    "prune_inactive_servers",
    "queue_status",
    "recover_inflight",
    "requeue_stuck_processing_tasks",
    "sweep",
]

__version__ = "0.1.0"
