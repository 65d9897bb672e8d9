"""The task envelope: JSON with a unique id, the payload, the attempt count and the enqueue time."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, replace
from typing import Any

from .errors import BadPayload, MalformedTask


@dataclass(frozen=True)
class Task:
    id: str
    payload: Any
    attempts: int = 0
    enqueued_at: float = 0.0
    # The exact bytes held in Redis: LREM needs them to release custody.
    raw: bytes = b""

    def retried(self) -> Task:
        bumped = replace(self, attempts=self.attempts + 1)
        return replace(bumped, raw=encode(bumped))  # (encode reads every field but raw)


def new_task(payload: Any, enqueued_at: float, task_id: str | None = None) -> Task:
    task = Task(id=task_id or uuid.uuid4().hex, payload=payload, enqueued_at=enqueued_at)
    return replace(task, raw=encode(task))


def encode(task: Task) -> bytes:
    try:
        body = {
            "id": task.id,
            "payload": task.payload,
            "attempts": task.attempts,
            "enqueued_at": task.enqueued_at,
        }
        return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise BadPayload(f"payload is not JSON-serialisable: {exc}") from exc


def decode(raw: bytes) -> Task:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedTask(raw, f"not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise MalformedTask(raw, "not a JSON object")
    task_id = body.get("id")
    if not isinstance(task_id, str) or not task_id:
        raise MalformedTask(raw, "no id")
    attempts = body.get("attempts", 0)
    enqueued_at = body.get("enqueued_at", 0.0)
    if not isinstance(attempts, int) or not isinstance(enqueued_at, (int, float)):
        raise MalformedTask(raw, "bad attempts or enqueued_at")
    return Task(task_id, body.get("payload"), attempts, float(enqueued_at), raw)
