"""bench/results/audit.{md,json}: per system and fault, the Jepsen-style counts, the settings,
and a reproduction of every loss."""

from __future__ import annotations

import datetime
import json
import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.audit.classify import Outcome
from bench.audit.systems import System
from bench.audit.trial import Fault, TrialRaw
from bench.harness import REPO_DIR

PEERS_DIR = REPO_DIR / "bench" / "peers"


@dataclass
class TrialResult:
    system: str
    fault: str  # "none", "drop", "kill", "stall", "restart"
    command: str
    skip: int
    only_task: bool
    seed: str
    fired: bool
    detail: str
    restarts: int
    seconds: float
    carried: list[str]
    outcome: Outcome

    @classmethod
    def of(cls, raw: TrialRaw, outcome: Outcome) -> TrialResult:
        return cls(
            raw.system,
            raw.fault.kind,
            raw.fault.command,
            raw.fault.skip,
            raw.fault.only_task,
            raw.seed,
            raw.fired,
            raw.detail,
            raw.restarts,
            round(raw.seconds, 1),
            sorted(raw.carried),
            outcome,
        )

    @property
    def row(self) -> str:
        """The row a trial counts in: one per fault, drops grouped (the per-command split is in
        the JSON and in the drop table)."""
        return {"none": "no fault", "drop": "dropped reply"}.get(self.fault, self.fault)


def versions(system: System) -> dict[str, str]:
    """The pinned versions of the system and of its redis-py."""
    if system.name == "taskcustody":
        import redis

        return {"taskcustody": "this commit", "redis": redis.__version__}
    pins = (PEERS_DIR / f"requirements-{system.name}.txt").read_text().splitlines()
    wanted = {system.name, "redis", "kombu", "hiredis"}
    return {
        p.split("==")[0]: p.split("==")[1]
        for p in pins
        if "==" in p and p.split("==")[0].lower() in wanted
    }


ROWS = ["no fault", "dropped reply", "kill", "stall", "restart"]


def aggregate(results: list[TrialResult], system: str) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for row in ROWS:
        mine = [r for r in results if r.system == system and r.row == row]
        if not mine:
            continue
        total = Outcome()
        for r in mine:
            total.add(r.outcome)
        table[row] = {
            "trials": len(mine),
            "fired": sum(r.fired for r in mine),
            "restarts": sum(r.restarts for r in mine),
            **asdict(total),
        }
    return table


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "not run"
    return f"{row['lost']} lost, {row['more_than_once']} dup / {row['enqueued']}"


def summary_table(results: list[TrialResult], systems: list[System]) -> list[str]:
    """The short table for the README: per system, lost and duplicated tasks per fault."""
    lines = [
        "| system (version) | no fault | dropped reply (commands) | SIGKILL mid-task | stall "
        "| Redis restart |",
        "|---|---|---|---|---|---|",
    ]
    for s in systems:
        rows = aggregate(results, s.name)
        v = versions(s).get(s.name, "")
        name = f"**{s.name}** (this commit)" if s.name == "taskcustody" else f"{s.name} {v}"
        drops = rows.get("dropped reply")
        drop_cell = _cell(drops) + (f" ({drops['trials']})" if drops else "")
        lines.append(
            f"| {name} | {_cell(rows.get('no fault'))} | {drop_cell} "
            f"| {_cell(rows.get('kill'))} | {_cell(rows.get('stall'))} "
            f"| {_cell(rows.get('restart'))} |"
        )
    return lines


def reach(results: list[TrialResult], systems: list[System]) -> list[str]:
    """Where the injector reached each system's take path: the commands whose dropped reply
    carried a task, and the drops that never fired."""
    lines = []
    for s in systems:
        mine = [r for r in results if r.system == s.name and r.fault == "drop"]
        if not mine:
            continue
        carrying = sorted({r.command for r in mine if r.carried})
        unfired = sorted(r.command for r in mine if not r.fired)
        lines.append(
            f"* {s.name}: {sum(r.fired for r in mine)} of {len(mine)} armed drops fired; a "
            f"dropped reply carried a task on {', '.join(carrying) or 'no command'} (the take)"
            + (
                f"; never fired (the command did not come again after SKIP replies): "
                f"{', '.join(unfired)}"
                if unfired
                else ""
            )
            + "."
        )
    return lines


def _fmt_recovery(row: dict[str, Any]) -> str:
    if not row["affected"]:
        return "-"
    s = row["recovery_seconds"]
    tail = f", max {s:.1f} s" if s is not None else ""
    return f"{row['recovered']}/{row['affected']}{tail}"


def _short(text: str, n: int = 160) -> str:
    text = re.sub(r"\s+", " ", text)
    return text if len(text) <= n else text[:n] + "..."


def render(
    results: list[TrialResult],
    systems: list[System],
    *,
    seed: int,
    tasks: int,
    task_seconds: float,
    command: str,
    elapsed: float,
    date: str,
) -> str:
    lines = [
        "# Audit: the peers and taskcustody under the same faults",
        "",
        f"`{command}` -- {date}, {elapsed / 60:.1f} min, seed {seed}, {tasks} tasks per trial "
        f"of {task_seconds:g} s each, two worker instances per trial, every trial on a fresh "
        f"redis-server ({_redis_version()}) with appendonly yes / appendfsync always.",
        "",
        "Counts are per fault, summed over its trials. *lost*: enqueued, never completed within "
        "the system's recovery time after the fault. *recovered*: of the tasks the fault hit "
        "(running at a kill or stall, or carried by the dropped reply), how many completed after "
        "it, and the longest time from the fault to such a completion. Completions are counted "
        "from append-only files written by the task itself, never from Redis.",
        "",
        "## Summary",
        "",
        *summary_table(results, systems),
        "",
        "## Per fault",
        "",
        "| system | fault | trials (fired) | enqueued | once | more than once | lost "
        "| recovered | worker restarts |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in systems:
        for row, c in aggregate(results, s.name).items():
            lines.append(
                f"| {s.name} | {row} | {c['trials']} ({c['fired']}) | {c['enqueued']} "
                f"| {c['once']} | {c['more_than_once']} | {c['lost']} | {_fmt_recovery(c)} "
                f"| {c['restarts']} |"
            )
    lines += [
        "",
        "## Dropped replies, per command",
        "",
        "One trial per command the system's workers sent in the recording run (connection "
        "set-up such as CLIENT, HELLO, PING, SCRIPT excluded): the reply to that command "
        "is read and thrown away after Redis ran it, once, after SKIP replies of it went "
        'through in that process ("taking a task": counting only replies that carried '
        "a task; chosen for every command whose reply carried one in the recording run).",
        "",
        "| system | command | skip | fired | once | more than once | lost | recovered |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.fault == "drop":
            o = r.outcome
            rec = _fmt_recovery(
                {
                    "affected": o.affected,
                    "recovered": o.recovered,
                    "recovery_seconds": o.recovery_seconds,
                }
            )
            skip = f"{r.skip} taking a task" if r.only_task else str(r.skip)
            lines.append(
                f"| {r.system} | {r.command} | {skip} | {'yes' if r.fired else 'no'} "
                f"| {o.once} | {o.more_than_once} | {o.lost} | {rec} |"
            )
    lines += [
        "",
        "## Reach of the injector",
        "",
        "Every system here talks to Redis through redis-py (Celery through kombu, which "
        "sends and reads with redis-py's connection: its BRPOP reply is read by "
        "`Connection.read_response`), so the shim sits under every command of every "
        "worker. redis-py 6 and later (every system here but arq, which pins redis-py "
        "5.3.1) send a command again when its connection breaks (3 retries by default): "
        "after a dropped reply the command runs a second time, as after a real broken "
        "socket, unless the system configured its client otherwise.",
        "",
        *reach(results, systems),
    ]
    lines += ["", "## Systems, versions, settings", ""]
    for s in systems:
        v = ", ".join(f"{k} {val}" for k, val in versions(s).items())
        lines += [
            f"* **{s.name}** ({v}): {s.label}. Settings: {s.settings}. Recovery time "
            f"allowed: {s.recovery_seconds:g} s after the fault. Stall: "
            f"{s.stall_seconds:g} s, {s.stall_reason}."
            + (f" Documented as unsafe: {s.unsafe}." if s.unsafe else "")
        ]
    losses = [r for r in results if r.outcome.lost]
    dups = [r for r in results if r.outcome.more_than_once]
    lines += ["", "## Every loss, with its reproduction", ""]
    if not losses:
        lines.append("No loss in this run.")
    for r in losses:
        lines.append(
            f"* **{r.system}, {r.row}{' ' + r.command if r.command else ''}**: lost "
            f"{', '.join(r.outcome.lost_tasks)}. Replay: `python -m bench.audit "
            f"{r.system} --seed {seed} --tasks {tasks} --fault {_fault_arg(r)}` "
            f"(trial seed `{r.seed}`). What happened: {_short(r.detail, 400)}."
        )
    lines += ["", "## Every duplicate", ""]
    if not dups:
        lines.append("No task completed more than once in this run.")
    for r in dups:
        lines.append(
            f"* {r.system}, {r.row}{' ' + r.command if r.command else ''}: "
            f"{', '.join(r.outcome.duplicated_tasks)} "
            f"({_short(r.detail, 200) or 'no fault'})"
        )
    return "\n".join(lines) + "\n"


def _redis_version() -> str:
    try:
        out = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "version unknown"
    found = re.search(r"v=(\S+)", out)
    return f"Redis {found.group(1)}" if found else "version unknown"


def _fault_arg(r: TrialResult) -> str:
    return Fault(r.fault, r.command, r.skip, r.only_task).arg


def write_reports(
    results: list[TrialResult],
    systems: list[System],
    out: Path | None,
    *,
    seed: int,
    tasks: int,
    task_seconds: float,
    command: str,
    elapsed: float,
) -> str:
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = render(
        results,
        systems,
        seed=seed,
        tasks=tasks,
        task_seconds=task_seconds,
        command=command,
        elapsed=elapsed,
        date=date,
    )
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "audit.md").write_text(text)
        data = {
            "command": command,
            "date": date,
            "seed": seed,
            "tasks": tasks,
            "task_seconds": task_seconds,
            "elapsed_seconds": round(elapsed, 1),
            "systems": {
                s.name: {
                    "label": s.label,
                    "versions": versions(s),
                    "settings": s.settings,
                    "recovery_seconds": s.recovery_seconds,
                    "stall_seconds": s.stall_seconds,
                    "unsafe": s.unsafe,
                    "rows": aggregate(results, s.name),
                }
                for s in systems
            },
            "trials": [
                {
                    **{k: v for k, v in asdict(r).items() if k != "outcome"},
                    "outcome": asdict(r.outcome),
                }
                for r in results
            ],
        }
        (out / "audit.json").write_text(json.dumps(data, indent=1) + "\n")
    return text
