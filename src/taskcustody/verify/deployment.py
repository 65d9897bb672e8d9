"""Telling the deployment's faults from the protocol's: `taskcustody verify` must never report a
violation when the network or the Redis deployment is at fault.

The stateful run injects its own faults (`faults.InjectedDrop`, a ConnectionError) and expects
them. Any other Redis error that reaches the top of a run -- a connection refused or reset, a
timeout, a cluster redirect (MOVED, ASK, TRYAGAIN, CLUSTERDOWN), a replica's READONLY, a key of the
wrong type, Redis out of memory -- says nothing about the protocol: the run is void, and verify
exits 2 with that error. It may be hidden behind another exception (a teardown that failed
because set-up had not finished) or inside an exception group (Hypothesis's flaky-failure
report), so the whole chain is searched.
"""

from __future__ import annotations

import redis

from ..core.errors import ServerIdHeld, Superseded, TaskCustodyError
from ..deploy.oom import is_oom
from .faults import InjectedDrop


class DeploymentError(Exception):
    """The run could not be carried out on this deployment (not a finding about the protocol)."""


def _is_deployment(exc: BaseException) -> bool:
    if isinstance(exc, InjectedDrop):
        return False
    # The protocol's own refusals: the harness expects them where the model refuses (and catches
    # them there); one that escapes is the implementation refusing what the model allows, a
    # finding (e.g. a claim sent again by a client's transport retry that finds its own first
    # claim), never the deployment's doing.
    if isinstance(exc, ServerIdHeld | Superseded):
        return False
    # Our own refusals: a server too old, an evicting policy, a key of the wrong type. (First:
    # some of them are also the redis-py errors they name, e.g. WrongKeyType a ResponseError.)
    if isinstance(exc, TaskCustodyError):
        return True
    if isinstance(
        exc,
        redis.ConnectionError
        | redis.TimeoutError
        | redis.exceptions.RedisClusterException
        | redis.exceptions.AskError
        | redis.exceptions.TryAgainError
        | redis.exceptions.ClusterError
        | redis.exceptions.ReadOnlyError
        | redis.exceptions.AuthenticationError
        | redis.exceptions.NoPermissionError,
    ):
        return True
    if isinstance(exc, redis.ResponseError):
        text = str(exc)
        return is_oom(exc) or text.startswith(("WRONGTYPE", "UNBLOCKED", "LOADING", "MASTERDOWN"))
    return False


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc`, what it was raised from or during, and the members of exception groups."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
        todo += list(getattr(e, "exceptions", ()))
    return seen


def deployment_error(exc: BaseException) -> BaseException | None:
    """The deployment's error behind `exc`, if there is one."""
    for e in _chain(exc):
        if _is_deployment(e):
            return e
    return None


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
