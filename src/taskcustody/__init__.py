"""taskcustody: a Redis task queue that never loses a task and never hands one task to two workers.

Workers take tasks with BLMOVE into an in-flight list of their own and release custody in a
`finally`; recovery finds in-flight lists through a registry, drains a server's own debris at
startup and dead servers' lists periodically. See the README and docs/design.md.
"""

from .aio import AsyncProducer, AsyncServer, AsyncWorker, connect_async
from .core.clock import Clock, ManualClock, RedisClock, WallClock
from .core.envelope import Task
from .core.errors import (
    AuthenticationFailed,
    BadPayload,
    ClusterRedirect,
    DeadLetterNotFound,
    EvictingPolicy,
    InvalidName,
    MalformedTask,
    NoPermission,
    NoSuchDatabase,
    NotRedis,
    ReadOnlyReplica,
    RedisOutOfMemory,
    RedisTooOld,
    ReleaseRefused,
    ReplicationTimeout,
    ResultTimeout,
    ServerIdHeld,
    Superseded,
    TaskCustodyError,
    TaskFailed,
    UnknownTask,
    WrongKeyType,
)
from .core.keys import ListOwner, QueueKeys
from .core.outcome import Outcome, Release
from .core.producer import Producer
from .core.recovery import (
    ServerIdentity,
    drain_inflight,
    prune_inactive_servers,
    recover_inflight,
    requeue_stuck_processing_tasks,
    sweep,
)
from .core.server import Server, default_server_id
from .core.settings import Settings, SettingsError
from .core.worker import Worker
from .deploy.connection import check_server, connect, connect_fake
from .ops.deadletters import (
    DeadLetter,
    RequeueReport,
    dead_letter,
    list_dead_letters,
    purge_dead_letters,
    requeue_dead_letters,
)
from .ops.results import TaskHandle, get_result
from .ops.status import queue_status

__all__ = [
    "AsyncProducer",
    "AsyncServer",
    "AsyncWorker",
    "AuthenticationFailed",
    "BadPayload",
    "Clock",
    "ClusterRedirect",
    "DeadLetter",
    "DeadLetterNotFound",
    "EvictingPolicy",
    "InvalidName",
    "ListOwner",
    "MalformedTask",
    "ManualClock",
    "NoPermission",
    "NoSuchDatabase",
    "NotRedis",
    "Outcome",
    "Producer",
    "QueueKeys",
    "ReadOnlyReplica",
    "RedisClock",
    "RedisOutOfMemory",
    "RedisTooOld",
    "Release",
    "ReleaseRefused",
    "ReplicationTimeout",
    "RequeueReport",
    "ResultTimeout",
    "Server",
    "ServerIdHeld",
    "ServerIdentity",
    "Settings",
    "SettingsError",
    "Superseded",
    "Task",
    "TaskCustodyError",
    "TaskFailed",
    "TaskHandle",
    "UnknownTask",
    "WallClock",
    "Worker",
    "WrongKeyType",
    "check_server",
    "connect",
    "connect_async",
    "connect_fake",
    "dead_letter",
    "default_server_id",
    "drain_inflight",
    "get_result",
    "list_dead_letters",
    "prune_inactive_servers",
    "purge_dead_letters",
    "queue_status",
    "recover_inflight",
    "requeue_dead_letters",
    "requeue_stuck_processing_tasks",
    "sweep",
]

__version__ = "0.1.0"
