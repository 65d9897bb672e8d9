"""The asyncio API: `AsyncProducer`, `AsyncWorker` and `AsyncServer` on `redis.asyncio`, with the
threaded API's scripts, key schema, envelope and settings (a mixed fleet of threaded and asyncio
workers serves one queue)."""

from .bridge import SyncBridge
from .clock import AsyncRedisClock
from .connection import connect_async, connect_fake_async
from .prefetch import AsyncPrefetchingWorker
from .producer import AsyncProducer, AsyncTaskHandle
from .server import AsyncServer
from .worker import AsyncWorker, complete, is_async_handler

__all__ = [
    "AsyncPrefetchingWorker",
    "AsyncProducer",
    "AsyncRedisClock",
    "AsyncServer",
    "AsyncTaskHandle",
    "AsyncWorker",
    "SyncBridge",
    "complete",
    "connect_async",
    "connect_fake_async",
    "is_async_handler",
]
