"""Events for observers (metrics.py): who listens is the process's business, not the protocol's.

A step that has something to report calls `emit` only when `listeners` is not empty, so an
unobserved process pays one list check per event and nothing else. Events and their fields:

- "released": list_key, task_id, action ("committed", "retried", "dead-lettered",
  "lost-custody");
- "handled": list_key, seconds (the handler's run, success or failure);
- "recovered": list_key, count (tasks requeued by a startup drain or a sweep);
- "poison-pill": list_key, count (tasks dead-lettered by recovery).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

#: The events above, by name.
Event = Literal["released", "handled", "recovered", "poison-pill"]
Listener = Callable[[Event, dict[str, Any]], None]

#: Called in order with (event, fields) by `emit`. A listener must not raise.
listeners: list[Listener] = []


def emit(event: Event, **fields: Any) -> None:
    for listener in listeners:
        listener(event, fields)
