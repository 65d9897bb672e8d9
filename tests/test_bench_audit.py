"""The audit's counting (bench/audit/classify.py, pure) and its fault shim
(bench/audit/shim/sitecustomize.py) on plain redis-py against a throwaway redis-server: the shim
runs in a subprocess, as in a worker, because it patches redis-py's classes for the whole
process."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

# The mutation gate's copy of the tree has no bench/ (as test_bench_results_files.py says too).
pytest.importorskip("bench.audit")

from bench.audit.classify import Outcome, Record, classify, in_flight, parse_records, tasks_in
from bench.audit.cli import parse_fault, plan
from bench.audit.report import TrialResult, aggregate, render
from bench.audit.systems import OURS
from bench.audit.trial import Fault, TrialRaw, take_path_commands
from tests.support.redis_server import RedisServerProcess

SHIM = Path(__file__).resolve().parents[1] / "bench" / "audit" / "shim" / "sitecustomize.py"
T = ["tk-000000", "tk-000001", "tk-000002", "tk-000003"]


def rec(kind: str, task: str, t: float, pid: int = 7) -> Record:
    return Record(kind, task, pid, t)


# -- counting --------------------------------------------------------------------------------


def test_parse_records_reads_lines_and_skips_a_torn_one() -> None:
    text = "start tk-000000 7 1.5\ndone tk-000000 7 1.7\ndone tk-0000"
    assert parse_records(text) == [rec("start", T[0], 1.5), rec("done", T[0], 1.7)]


def test_classify_counts_once_more_than_once_and_lost() -> None:
    records = [
        rec("done", T[0], 1),
        rec("done", T[1], 1),
        rec("done", T[1], 2),
        rec("done", T[2], 3),
    ]
    out = classify(T, records, fault_time=None)
    assert (out.enqueued, out.once, out.more_than_once, out.lost) == (4, 2, 1, 1)
    assert out.lost_tasks == [T[3]] and out.duplicated_tasks == [T[1]]


def test_classify_ignores_completions_of_tasks_never_enqueued() -> None:
    out = classify(T[:1], [rec("done", T[0], 1), rec("done", "tk-999999", 1)], None)
    assert (out.once, out.lost, out.more_than_once) == (1, 0, 0)


def test_tasks_running_at_the_fault_are_affected_and_recovered_when_done_after_it() -> None:
    records = [
        rec("start", T[0], 1.0),
        rec("done", T[0], 1.2),  # done before the fault: not hit
        rec("start", T[1], 1.9),  # running at the fault (killed), run again later
        rec("start", T[1], 5.0, pid=8),
        rec("done", T[1], 5.5, pid=8),
        rec("start", T[2], 1.95),  # running at the fault, never done: lost
        rec("start", T[3], 2.5),
        rec("done", T[3], 2.7),  # started after the fault: not hit
    ]
    out = classify(T, records, fault_time=2.0)
    assert out.affected == 2 and out.recovered == 1
    assert out.recovery_seconds == pytest.approx(3.5)
    assert out.lost_tasks == [T[2]]


def test_tasks_carried_by_a_dropped_reply_are_affected_unless_already_done() -> None:
    records = [rec("done", T[0], 1.0), rec("start", T[2], 9.0), rec("done", T[2], 9.2)]
    out = classify(T, records, fault_time=2.0, carried={T[0], T[1], T[2]})
    assert out.affected == 2  # T[1] (never done) and T[2] (done later); not T[0]
    assert out.recovered == 1 and out.recovery_seconds == pytest.approx(7.2)
    assert out.lost_tasks == [T[1], T[3]]


def test_in_flight_is_started_and_not_done_by_the_time() -> None:
    records = [rec("start", T[0], 1), rec("done", T[0], 2), rec("start", T[1], 1.5, pid=9)]
    assert in_flight(records, 1.7) == {T[0]: 7, T[1]: 9}
    assert in_flight(records, 2.5) == {T[1]: 9}


def test_tasks_in_finds_the_tokens_in_a_reply() -> None:
    reply = "[b'{\"args\":[\"tk-000012\"]}', b'tk-000003:job']"
    assert tasks_in(reply) == {"tk-000012", "tk-000003"}


# -- planning ------------------------------------------------------------------------------


def test_parse_fault_reads_what_a_reproduction_prints() -> None:
    assert parse_fault("kill") == Fault("kill")
    assert parse_fault("drop:EVALSHA/fdacc359/fetch:3") == Fault(
        "drop", "EVALSHA/fdacc359/fetch", 3
    )
    fault = Fault("drop", "BRPOP", 2, only_task=True)
    assert fault.arg == "drop:BRPOP:2:task" and parse_fault(fault.arg) == fault
    with pytest.raises(Exception, match="drop:COMMAND:SKIP"):
        parse_fault("drop:BLMOVE")


def test_plan_drops_each_recorded_command_except_set_up_then_the_other_faults() -> None:
    recording = TrialRaw("taskcustody", Fault("none"), "s", [], [])
    recording.commands.update(
        {
            "BLMOVE": [0, 1, 0, 1, 0, 0],
            "CLIENT": [0, 0],
            "PING": [0],
            "EVALSHA/ab12cd34": [0, 0, 0, 0, 0, 0],
        }
    )
    assert take_path_commands(recording.commands) == [
        ("BLMOVE", [0, 1, 0, 1, 0, 0]),
        ("EVALSHA/ab12cd34", [0, 0, 0, 0, 0, 0]),
    ]
    faults = plan(OURS, recording, seed=1, quick=False, only=None)
    assert [f.label for f in faults] == [
        "drop BLMOVE",
        "drop EVALSHA/ab12cd34",
        "kill",
        "stall",
        "restart",
    ]
    # BLMOVE carried tasks: the drop hits the 1st or 2nd reply that carries one
    assert faults[0].only_task and faults[0].skip in (0, 1)
    assert not faults[1].only_task and faults[1].skip in (0, 1)  # none did: the first third
    assert plan(OURS, recording, seed=1, quick=False, only=None) == faults  # seeded


# -- the shim ----------------------------------------------------------------------------------


def load_shim() -> ModuleType:
    """The shim's module without its hook (no AUDIT_SHIM_MODE in this process)."""
    assert "AUDIT_SHIM_MODE" not in os.environ
    spec = importlib.util.spec_from_file_location("audit_shim_under_test", SHIM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shim_labels_commands_and_tells_scripts_apart() -> None:
    shim = load_shim()
    packed = (
        b"*2\r\n$4\r\nINCR\r\n$1\r\nk\r\n"
        b"*5\r\n$7\r\nEVALSHA\r\n$8\r\nfdacc359\r\n$1\r\n1\r\n$2\r\nns\r\n$5\r\nfetch\r\n"
        b"*3\r\n$4\r\nEVAL\r\n$8\r\nreturn 1\r\n$1\r\n0\r\n"
    )
    import hashlib

    body_sha = hashlib.sha1(b"return 1").hexdigest()[:8]
    assert shim.command_names(packed) == ["INCR", "EVALSHA/fdacc359/fetch", f"EVAL/{body_sha}"]
    assert shim.command_names([b"*1\r\n$4\r\n", b"PING\r\n"]) == ["PING"]
    assert shim.command_names(b"PING\r\n") == []


def run_with_shim(tmp_path: Path, url: str, mode: str, body: str, **env: str) -> str:
    # No retries: redis-py 6+ retries a command after a ConnectionError by default, which would
    # hide the drop from the test (the peers keep whatever their redis-py and settings do).
    code = (
        "import redis, json, asyncio\nfrom redis.backoff import NoBackoff\n"
        "from redis.retry import Retry\n"
        f"URL = {url!r}\nr = redis.Redis.from_url(URL, retry=Retry(NoBackoff(), 0))\n"
        + textwrap.dedent(body)
    )
    full_env = {
        **os.environ,
        "PYTHONPATH": str(SHIM.parent),
        "AUDIT_SHIM_MODE": mode,
        "AUDIT_SHIM_DIR": str(tmp_path),
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_shim_drops_the_reply_after_redis_ran_the_command(
    tmp_path: Path, real_redis: RedisServerProcess
) -> None:
    real_redis_client = __import__("redis").Redis.from_url(real_redis.url)
    real_redis_client.delete("audit:k")
    out = run_with_shim(
        tmp_path,
        real_redis.url,
        "drop",
        """
        print(r.incr("audit:k"))  # INCRBY on the wire; the first reply goes through (skip 1)
        try:
            r.incr("audit:k")
            print("not dropped")
        except redis.ConnectionError as exc:
            print("dropped", exc)
        print(r.incr("audit:k"))          # once only: the next reply is read
    """,
        AUDIT_DROP_COMMAND="INCRBY",
        AUDIT_DROP_SKIP="1",
    )
    assert out.split("\n")[0] == "1"
    assert out.split("\n")[1].startswith("dropped reply to INCRBY")
    assert out.split("\n")[2] == "3"  # Redis ran the dropped INCR
    entries = [json.loads(x) for x in (tmp_path / "faults.log").read_text().splitlines()]
    assert [(e["command"], e["reply"]) for e in entries] == [("INCRBY", "2")]


def test_shim_counts_only_replies_carrying_a_task_when_told(
    tmp_path: Path, real_redis: RedisServerProcess
) -> None:
    __import__("redis").Redis.from_url(real_redis.url).mset(
        {"audit:x": "idle", "audit:y": "tk-000007"}
    )
    out = run_with_shim(
        tmp_path,
        real_redis.url,
        "drop",
        """
        print(r.get("audit:x"))  # no task in it: neither counted nor dropped
        print(r.get("audit:y"))  # the first carrying one: skipped (skip 1)
        try:
            r.get("audit:y")
            print("not dropped")
        except redis.ConnectionError:
            print("dropped")
    """,
        AUDIT_DROP_COMMAND="GET",
        AUDIT_DROP_SKIP="1",
        AUDIT_DROP_ONLY_TASK="1",
    )
    assert out.splitlines() == ["b'idle'", "b'tk-000007'", "dropped"]


def test_shim_drops_on_redis_asyncio_and_reads_the_pipelined_replies_behind(
    tmp_path: Path, real_redis: RedisServerProcess
) -> None:
    __import__("redis").Redis.from_url(real_redis.url).delete("audit:a", "audit:b")
    out = run_with_shim(
        tmp_path,
        real_redis.url,
        "drop",
        """
        import redis.asyncio
        async def main():
            from redis.asyncio.retry import Retry as ARetry
            a = redis.asyncio.Redis.from_url(URL, retry=ARetry(NoBackoff(), 0))
            try:
                await a.pipeline(transaction=False).incr("audit:a").incr("audit:b").execute()
                print("not dropped")
            except redis.ConnectionError:
                print("dropped")
            print(await a.get("audit:a"), await a.get("audit:b"))
            await a.aclose()
        asyncio.run(main())
    """,
        AUDIT_DROP_COMMAND="INCRBY",
        AUDIT_DROP_SKIP="0",
    )
    assert out.splitlines() == ["dropped", "b'1' b'1'"]  # both ran; neither reply arrived


def test_shim_records_the_commands_and_drops_nothing(
    tmp_path: Path, real_redis: RedisServerProcess
) -> None:
    out = run_with_shim(
        tmp_path,
        real_redis.url,
        "record",
        """
        r.set("audit:r", 1)
        r.set("audit:t", "tk-000001")
        r.get("audit:t")
        print(r.eval("return 7", 0))
    """,
    )
    assert out.strip() == "7"
    (log,) = tmp_path.glob("commands.*")
    replies = [line.split(" ")[1:] for line in log.read_text().splitlines()]
    assert ["SET", "0"] in replies and ["GET", "1"] in replies  # GET carried the task token
    assert any(n.startswith("EVAL/") for n, _ in replies)
    assert not (tmp_path / "faults.log").exists()


# -- the report ------------------------------------------------------------------------------


def result(
    fault: str, outcome: Outcome, command: str = "", skip: int = 0, only_task: bool = False
) -> TrialResult:
    return TrialResult(
        "taskcustody", fault, command, skip, only_task, "1:x", True, "what", 0, 1.0, [], outcome
    )


def test_report_sums_trials_per_fault_and_gives_each_loss_its_replay() -> None:
    lost = classify(T[:2], [rec("done", T[0], 1)], None)
    clean = classify(
        T[:2], [rec("done", T[0], 1), rec("done", T[1], 1), rec("done", T[1], 2)], None
    )
    results = [
        result("drop", lost, "BRPOP", 4, only_task=True),
        result("drop", clean, "HSET"),
        result("kill", clean),
    ]
    rows = aggregate(results, "taskcustody")
    assert rows["dropped reply"]["trials"] == 2
    assert (rows["dropped reply"]["lost"], rows["dropped reply"]["more_than_once"]) == (1, 1)
    assert rows["kill"]["enqueued"] == 2 and "stall" not in rows
    text = render(
        results, [OURS], seed=1, tasks=2, task_seconds=0.2, command="c", elapsed=1.0, date="d"
    )
    assert "| **taskcustody** (this commit) | not run | 1 lost, 1 dup / 4 (2) |" in text
    assert "--fault drop:BRPOP:4:task" in text and T[1] in text
