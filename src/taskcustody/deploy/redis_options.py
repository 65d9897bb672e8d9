"""Client options that depend on which redis-py is installed (the floor is redis-py 5.0).

redis-py 7 and later ask every new RESP3 connection for maintenance notifications (`CLIENT
MAINT_NOTIFICATIONS`, a Redis 8 command for servers that move during maintenance). A Redis 7
answers "unknown subcommand", which redis-py logs at DEBUG on every connection: a worker run
with `-v` printed two such lines per worker. The protocol has no use for those notifications (a
moved server is a lost connection to it, reconciled as any other), so our clients turn them off
where the client takes the option, and never send the command at all.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

OPTION = "maint_notifications_config"


def _config_class() -> Any:
    try:
        from redis.maint_notifications import MaintNotificationsConfig
    except ImportError:  # redis-py before 7: it asks for no notifications
        return None
    return MaintNotificationsConfig


#: redis-py's MaintNotificationsConfig, or None for a redis-py without the feature; looked up
#: once, here.
CONFIG_CLASS: Any = _config_class()


@functools.cache
def _takes_option(constructor: Callable[..., Any]) -> bool:
    # By the constructor's own signature: the feature reached redis-py's clients one at a time
    # (the plain pools first, the cluster and asyncio clients in later releases), and a pool
    # hands a keyword it does not know on to its connections, which refuse it (TypeError).
    try:
        return OPTION in inspect.signature(constructor).parameters
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        return False


def no_maint_notifications(constructor: Callable[..., Any]) -> dict[str, Any]:
    """The keyword arguments that turn maintenance notifications off for `constructor` (a
    redis-py client or connection pool class; its `from_url` passes them on to it): {} where
    redis-py has no such option. A fresh config each call: a pool keeps the one it is given."""
    if CONFIG_CLASS is None or not _takes_option(constructor):
        return {}
    return {OPTION: CONFIG_CLASS(enabled=False)}
