"""One trial: a fresh Redis (persistence on), N tasks enqueued, two worker instances of one
system started with the fault shim, one fault injected, the system's recovery time waited out,
every process stopped by pid, the completion records read back.

Worker instances run in sessions of their own (pgid = the pid we started), so that a stall stops
a whole instance (a worker and its pool children) and the end of the trial kills every process an
instance forked. A worker instance that exits (a peer that gives up on a broken connection, or the
one killed) is started again, as a supervisor (systemd, Kubernetes) would, at most
MAX_RESTARTS times: the restarts are reported.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.audit.classify import Record, in_flight, parse_records, tasks_in
from bench.audit.redis_aof import AofRedis
from bench.audit.systems import APPS_DIR, System
from bench.harness import REPO_DIR

SHIM_DIR = Path(__file__).resolve().parent / "shim"
INSTANCES = 2
MAX_RESTARTS = 6
POLL = 0.05
SETTLE = 3.0  # seconds after the last first-completion to catch late duplicates
REDIS_DOWN = 1.0  # seconds Redis stays down in the restart fault

# Connection set-up and health checks, not the take path: never dropped.
HANDSHAKE = frozenset(
    {
        "",
        "CLIENT",
        "HELLO",
        "AUTH",
        "SELECT",
        "PING",
        "INFO",
        "ECHO",
        "SCRIPT",
        "COMMAND",
        "CONFIG",
        "QUIT",
        "RESET",
    }
)


@dataclass(frozen=True)
class Fault:
    kind: str  # "none" (the recording run), "drop", "kill", "stall", "restart"
    command: str = ""  # drop: the command whose reply is dropped
    skip: int = 0  # drop: replies of it let through first, per process
    only_task: bool = False  # drop: count only the replies that carry a task

    @property
    def label(self) -> str:
        return f"drop {self.command}" if self.kind == "drop" else self.kind

    @property
    def arg(self) -> str:
        """As --fault takes it."""
        if self.kind != "drop":
            return self.kind
        return f"drop:{self.command}:{self.skip}" + (":task" if self.only_task else "")


@dataclass
class TrialRaw:
    system: str
    fault: Fault
    seed: str
    tasks: list[str]
    records: list[Record]
    fault_time: float | None = None
    fired: bool = False
    carried: set[str] = field(default_factory=set)
    detail: str = ""  # what was done, when (for the reproduction)
    restarts: int = 0
    seconds: float = 0.0
    # The recording run: per command label, its replies in one process (1: carried a task).
    commands: dict[str, list[int]] = field(default_factory=dict)
    start_time: float = 0.0


class Instance:
    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.argv, self.env, self.log = argv, env, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=APPS_DIR,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)
        if sig == signal.SIGKILL:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)

    @property
    def pgid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


def _env(system: System, url: str, work: Path, fault: Fault, task_seconds: float) -> dict[str, str]:
    paths = [str(SHIM_DIR), str(APPS_DIR)]
    if system.name == "taskcustody":
        paths += [str(REPO_DIR / "src")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUDIT_", "PYTHON"))}
    env.update(
        {
            "PYTHONPATH": os.pathsep.join(paths),
            "AUDIT_REDIS_URL": url,
            "AUDIT_RECORD_DIR": str(work / "records"),
            "AUDIT_SHIM_DIR": str(work / "shim"),
            "AUDIT_TASK_SECONDS": str(task_seconds),
            "AUDIT_SHIM_MODE": {"none": "record", "drop": "drop"}.get(fault.kind, ""),
            "AUDIT_DROP_COMMAND": fault.command,
            "AUDIT_DROP_SKIP": str(fault.skip),
            "AUDIT_DROP_ONLY_TASK": "1" if fault.only_task else "",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _read_records(work: Path) -> list[Record]:
    out: list[Record] = []
    for path in sorted((work / "records").glob("records.*")):
        out += parse_records(path.read_text(errors="replace"))
    return out


def _read_commands(work: Path) -> dict[str, list[int]]:
    """Per command label, the replies to it of the process that read the most of them: 1 for a
    reply that carried a task, 0 for one that did not (the skips a drop may choose from)."""
    best: dict[str, list[int]] = {}
    for path in (work / "shim").glob("commands.*"):
        per: dict[str, list[int]] = {}
        for line in path.read_text().splitlines():
            parts = line.split(" ")
            if len(parts) == 3:
                per.setdefault(parts[1], []).append(int(parts[2] == "1"))
        for name, flags in per.items():
            if len(flags) > len(best.get(name, [])):
                best[name] = flags
    return best


def run_trial(
    system: System,
    python: Path,
    fault: Fault,
    *,
    tasks: int,
    seed: str,
    task_seconds: float,
    keep: Path | None = None,
) -> TrialRaw:
    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix=f"audit-{system.name}-"))
    for sub in ("records", "shim", "logs"):
        (work / sub).mkdir()
    redis = AofRedis(work / "redis").start()
    instances: list[Instance] = []
    raw = TrialRaw(system.name, fault, seed, [], [])
    t0 = time.monotonic()
    try:
        enqueue_env = _env(system, redis.url, work, Fault("enqueue"), task_seconds)
        enqueue_env["PYTHONPATH"] = enqueue_env["PYTHONPATH"].split(os.pathsep, 1)[1]
        subprocess.run(
            system.enqueue_argv(python, redis.url, tasks),
            env=enqueue_env,
            cwd=APPS_DIR,
            check=True,
            timeout=60,
            capture_output=True,
        )
        from bench.peers.audit_apps._record import task_name  # one definition of the names

        raw.tasks = [task_name(i) for i in range(tasks)]
        env = _env(system, redis.url, work, fault, task_seconds)
        for k in range(INSTANCES):
            inst = Instance(system.argv(python, redis.url), env, work / "logs" / f"worker{k}.log")
            inst.start()
            instances.append(inst)
        raw.start_time = time.time()
        _drive(system, fault, raw, rng, redis, instances, work, tasks, task_seconds)
    finally:
        for inst in instances:
            inst.kill_group(signal.SIGCONT)
            inst.kill_group(signal.SIGKILL)
        redis.stop()
        raw.records = _read_records(work)
        raw.commands = _read_commands(work)
        raw.seconds = time.monotonic() - t0
        if keep is not None:
            shutil.copytree(
                work,
                keep / f"{system.name}-{fault.label.replace(' ', '-')}",
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns("redis"),
            )
        shutil.rmtree(work, ignore_errors=True)
    return raw


def _drive(
    system: System,
    fault: Fault,
    raw: TrialRaw,
    rng: random.Random,
    redis: AofRedis,
    instances: list[Instance],
    work: Path,
    tasks: int,
    task_seconds: float,
) -> None:
    """Inject the fault, supervise the instances, stop once recovered or past the deadline."""
    trigger_after = rng.randint(1, max(1, tasks // 3))  # completions before kill/stall/restart
    point = rng.uniform(0.1, 0.8) * task_seconds  # how far into a running task
    start = time.time()
    # Without a fault (or before a drop fires): enough for the whole run, generously.
    base_deadline = start + 30 + 3 * tasks * task_seconds
    resume_at: float | None = None
    stalled: Instance | None = None
    last_first_done = start
    while True:
        now = time.time()
        records = _read_records(work)
        done = {r.task for r in records if r.kind == "done"}
        if len(done) > 0:
            last_first_done = max(
                min(r.time for r in records if r.kind == "done" and r.task == t) for t in done
            )
        # -- the fault --------------------------------------------------------------------------
        if fault.kind == "drop" and not raw.fired:
            log = work / "shim" / "faults.log"
            if log.exists() and log.read_text().strip():
                entry = json.loads(log.read_text().splitlines()[0])
                raw.fired, raw.fault_time = True, float(entry["time"])
                raw.carried = tasks_in(entry["reply"])
                which = "replies carrying a task" if fault.only_task else "replies"
                raw.detail = (
                    f"reply to {entry['command']} dropped in pid {entry['pid']} "
                    f"{entry['time'] - raw.start_time:.2f} s after the workers started "
                    f"(after {fault.skip} of its {which} in that process); the reply "
                    f"was {entry['reply'][:300]}"
                )
        elif (
            fault.kind in ("kill", "stall", "restart")
            and not raw.fired
            and len(done) >= trigger_after
        ):
            if fault.kind == "restart":
                time.sleep(point)
                flying = in_flight(_read_records(work), time.time())
                raw.fault_time = time.time()
                redis.kill()
                time.sleep(REDIS_DOWN)
                redis.start()
                raw.fired = True
                at = raw.fault_time - raw.start_time
                raw.detail = (
                    f"redis-server SIGKILLed (by pid) {at:.2f} s after the workers "
                    f"started, {point:.3f} s after the "
                    f"{len(done)}th completion, with {sorted(flying)} running; started "
                    f"again on the same port and append-only file {REDIS_DOWN:.0f} s "
                    "later"
                )
            else:
                hit = _next_start(work, records, deadline=time.time() + 10)
                if hit is not None:
                    # `point` seconds into the task that started next.
                    time.sleep(max(0.0, hit.time + point - time.time()))
                    raw.fault_time = time.time()
                    raw.fired = True
                    _hit(fault, hit, raw, instances, point, len(done))
                    if fault.kind == "stall":
                        stalled = next((i for i in instances if _in_group(hit.pid, i)), None)
                        resume_at = raw.fault_time + system.stall_seconds
        if stalled is not None and resume_at is not None and time.time() >= resume_at:
            stalled.kill_group(signal.SIGCONT)
            stalled, resume_at = None, None
        # -- supervision ------------------------------------------------------------------------
        for inst in instances:
            if not inst.alive() and stalled is not inst and raw.restarts < MAX_RESTARTS:
                inst.kill_group(signal.SIGKILL)  # the rest of its group, if any
                inst.start()
                raw.restarts += 1
        # -- the end ----------------------------------------------------------------------------
        now = time.time()
        if raw.fault_time is not None:
            deadline = raw.fault_time + system.recovery_seconds
            if fault.kind == "stall":
                deadline += system.stall_seconds
        else:
            deadline = base_deadline
        settled = now >= last_first_done + SETTLE and resume_at is None
        if fault.kind == "stall" and raw.fault_time is not None:
            settled = settled and now >= raw.fault_time + system.stall_seconds + SETTLE
        if len(done) >= tasks and settled and (raw.fired or fault.kind in ("none", "drop")):
            return
        if now >= deadline:
            return
        time.sleep(POLL)


def _next_start(work: Path, seen: list[Record], deadline: float) -> Record | None:
    """The first task start recorded after `seen` (polled; None by the deadline)."""
    known = {(r.task, r.pid, r.time) for r in seen if r.kind == "start"}
    while time.time() < deadline:
        fresh = [
            r
            for r in _read_records(work)
            if r.kind == "start" and (r.task, r.pid, r.time) not in known
        ]
        if fresh:
            return min(fresh, key=lambda r: r.time)
        time.sleep(0.005)
    return None


def _hit(
    fault: Fault, hit: Record, raw: TrialRaw, instances: list[Instance], point: float, done: int
) -> None:
    """SIGKILL the process running the task, or SIGSTOP its whole worker instance."""
    at = (raw.fault_time or 0.0) - raw.start_time
    when = f"{point:.3f} s into {hit.task} ({at:.2f} s after the workers started, {done} done)"
    if fault.kind == "kill":
        with contextlib.suppress(ProcessLookupError):
            os.kill(hit.pid, signal.SIGKILL)
        raw.detail = f"SIGKILL of pid {hit.pid} {when}"
        return
    inst = next((i for i in instances if _in_group(hit.pid, i)), None)
    if inst is not None:
        inst.kill_group(signal.SIGSTOP)
    raw.detail = (
        f"SIGSTOP of the worker instance (process group) of pid {hit.pid} {when}, "
        "then SIGCONT after the stall"
    )


def _in_group(pid: int, inst: Instance) -> bool:
    try:
        return os.getpgid(pid) == inst.pgid
    except ProcessLookupError:
        return False


def take_path_commands(commands: dict[str, list[int]]) -> list[tuple[str, list[int]]]:
    """The commands a worker sent in the recording run, minus connection set-up, each with its
    replies in one process."""
    return sorted((c, flags) for c, flags in commands.items() if c not in HANDSHAKE)


def drop_fault(command: str, flags: list[int], rng: random.Random) -> Fault:
    """The drop on `command`: if any of its replies carried a task in the recording run, the
    reply of a take that delivers one (the k-th such, k drawn from those seen; counting only
    those, so that the idle polls in between do not move it); else a reply in the first third."""
    carrying = sum(flags)
    if carrying:
        return Fault("drop", command, rng.randrange(carrying), only_task=True)
    return Fault("drop", command, rng.randrange(0, max(1, len(flags) // 3)))


def trial_summary(raw: TrialRaw) -> dict[str, Any]:
    return {
        "fired": raw.fired,
        "detail": raw.detail,
        "restarts": raw.restarts,
        "seconds": round(raw.seconds, 1),
    }
