"""A synchronous face on an asyncio client, for the parts of the protocol that are written once,
synchronously, and shared by both APIs: recovery (the startup drain, the sweep, a worker's
reconcile), the server's identity (claim, heartbeat, deregister), the server checks and result
polling. They run in a thread (`asyncio.to_thread`); each command they send runs as a coroutine of
the asyncio client on the event loop, so the async API sends the very same scripts over its own
connections and never opens a second, synchronous client.

Calling the bridge from the event loop's own thread would wait for the loop while blocking it: it
raises instead.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Coroutine
from typing import Any

import redis.asyncio


class SyncBridge:
    """`redis.Redis`'s methods, run on `loop` by the asyncio client `client`."""

    def __init__(
        self, client: redis.asyncio.Redis, loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        self._client = client
        self._loop = loop

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the commands run on (made before the loop runs: bound when it does)."""
        self._loop = loop

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run `coro` on the loop and wait for its result, from a thread other than the loop's."""
        if self._loop is None or self._on_loop_thread():
            coro.close()
            raise RuntimeError(
                "SyncBridge called before bind() or from its event loop's "
                "thread: use asyncio.to_thread, or the asyncio client itself"
            )
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _on_loop_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def pipeline(self, transaction: bool = True) -> _BridgedPipeline:
        return _BridgedPipeline(self, self._client.pipeline(transaction=transaction))

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)  # a command: an awaitable, not yet sent
            return self.run(_awaited(result)) if inspect.isawaitable(result) else result

        return call

    def __repr__(self) -> str:
        return f"SyncBridge({self._client!r})"


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


class _BridgedPipeline:
    """An asyncio pipeline: commands queue as usual (they are not coroutines); `execute` runs on
    the loop."""

    def __init__(self, bridge: SyncBridge, pipe: Any) -> None:
        self._bridge = bridge
        self._pipe = pipe

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        result: list[Any] = self._bridge.run(self._pipe.execute(raise_on_error=raise_on_error))
        return result

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._pipe, name)

        def queue(*args: Any, **kwargs: Any) -> _BridgedPipeline:
            attr(*args, **kwargs)
            return self

        return queue
