"""Counting, Jepsen-style, from the completion records alone (pure: no Redis, no processes).

A trial enqueues tasks, injects one fault at `fault_time`, waits out the system's recovery time,
and reads the records every worker process appended ("start"/"done" lines, see
bench/peers/audit_apps/_record.py). Per trial:

* completed once / more than once / lost: how many "done" lines each enqueued task has (0: lost);
* affected: the tasks the fault hit -- started and not done at the fault (a killed or stalled
  worker's task), or carried by the dropped reply and not done by then;
* recovered: the affected tasks done after the fault; time to recovery: the longest wait from the
  fault to such a task's first completion.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

TASK_TOKEN = re.compile(r"tk-\d{6}")


@dataclass(frozen=True)
class Record:
    kind: str  # "start" or "done"
    task: str
    pid: int
    time: float


def parse_records(text: str) -> list[Record]:
    """Lines "<kind> <task> <pid> <time>"; a torn last line (a write cut short) is skipped."""
    out: list[Record] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 4 or parts[0] not in ("start", "done"):
            continue
        try:
            out.append(Record(parts[0], parts[1], int(parts[2]), float(parts[3])))
        except ValueError:
            continue
    return out


def tasks_in(text: str) -> set[str]:
    """The task tokens a (dropped) reply carried, found in its repr."""
    return set(TASK_TOKEN.findall(text))


def in_flight(records: Iterable[Record], at: float) -> dict[str, int]:
    """Task -> pid of the tasks started and not yet done at time `at` (by records before it)."""
    started: dict[str, int] = {}
    done: set[str] = set()
    for r in sorted(records, key=lambda r: r.time):
        if r.time > at:
            break
        if r.kind == "start":
            started[r.task] = r.pid
        else:
            done.add(r.task)
    return {t: pid for t, pid in started.items() if t not in done}


@dataclass
class Outcome:
    enqueued: int = 0
    once: int = 0
    more_than_once: int = 0
    lost: int = 0
    affected: int = 0
    recovered: int = 0
    recovery_seconds: float | None = None
    lost_tasks: list[str] = field(default_factory=list)
    duplicated_tasks: list[str] = field(default_factory=list)

    def add(self, other: Outcome) -> None:
        self.enqueued += other.enqueued
        self.once += other.once
        self.more_than_once += other.more_than_once
        self.lost += other.lost
        self.affected += other.affected
        self.recovered += other.recovered
        if other.recovery_seconds is not None:
            self.recovery_seconds = max(self.recovery_seconds or 0.0, other.recovery_seconds)
        self.lost_tasks += other.lost_tasks
        self.duplicated_tasks += other.duplicated_tasks


def classify(
    enqueued: list[str],
    records: list[Record],
    fault_time: float | None,
    carried: frozenset[str] | set[str] = frozenset(),
) -> Outcome:
    done_counts = Counter(r.task for r in records if r.kind == "done")
    out = Outcome(enqueued=len(enqueued))
    for task in enqueued:
        n = done_counts.get(task, 0)
        if n == 0:
            out.lost += 1
            out.lost_tasks.append(task)
        elif n == 1:
            out.once += 1
        else:
            out.more_than_once += 1
            out.duplicated_tasks.append(task)
    if fault_time is None:
        return out
    done_before = {r.task for r in records if r.kind == "done" and r.time <= fault_time}
    hit = set(in_flight(records, fault_time)) | (set(carried) - done_before)
    hit &= set(enqueued)
    out.affected = len(hit)
    first_after: dict[str, float] = {}
    for r in records:
        if r.kind == "done" and r.task in hit and r.time > fault_time:
            first_after[r.task] = min(first_after.get(r.task, r.time), r.time)
    out.recovered = len(first_after)
    if first_after:
        out.recovery_seconds = max(first_after.values()) - fault_time
    return out
