"""The gate on fault coverage: the kinds it requires are read from the code and
agree with what the worker and the server send; a kind that never fires fails the part, naming it
with the counts; and the counts are the faults the injector really injected."""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from typing import Any

import fakeredis
import pytest
from taskcustody_model import FAULTS

from taskcustody.core import scripts
from taskcustody.core.keys import QueueKeys
from taskcustody.deploy.connection import connect_fake
from taskcustody.verify import parts
from taskcustody.verify.aiming import DROPPED, shots, walk_to
from taskcustody.verify.budget import Budget
from taskcustody.verify.fault_coverage import (
    MINIMUM,
    judge,
    losable_commands,
    model_losable_commands,
    required_kinds,
)
from taskcustody.verify.harness import Harness
from taskcustody.verify.machine import DEFAULT_BOUNDS, RunStats
from taskcustody.verify.run import COVERAGE_BOUNDS, Options, run_fault_coverage

#: What each Redis command or script the worker and the server send does, in the model's terms:
#: the command whose reply the model (or the harness) can lose ...
LOSABLE_SENDS = {
    "BLMOVE": {"take"},
    "TAKE_AND_RECORD": {"take_suspect"},
    "RELEASE": {"release"},
    "RELEASE_AND_TAKE": {"release_and_take"},
    "DRAIN_CHUNK": {"reconcile", "drain_step"},
    "CLAIM": {"claim"},
    "HEARTBEAT": {"heartbeat"},
    "PRUNE_INACTIVE_SERVERS": {"sweep"},
}
#: ... writes whose lost reply the model has no action for, and why ...
NOT_LOST_IN_THE_MODEL = {
    "RECORD": "the record is written and its error ignored: custody is in the list (the harness "
    "loses it with the release's reply, which reads it)",
    "ZADD": "a take's list registration, sent in one pipeline with its BLMOVE: lost with it",
    "FORGET_DEAD_EMPTY_LISTS": "a sweep's registry collection: the sweep's reply is the prune's",
    "REQUEUE_STUCK": "the processing sweep (not a fault of the model)",
}
#: ... and what changes nothing (reads, the handshake, script loads).
NO_EFFECT = {"HGETALL", "ZRANGE", "LLEN", "PING", "SCRIPT", "CLIENT", "HELLO", "SELECT"}


def _script_names() -> dict[bytes, str]:
    """A script's source or sha1 -> its name in `taskcustody.core.scripts`."""
    out = {}
    for name, value in vars(scripts).items():
        if name.isupper() and isinstance(value, str) and "redis.call" in value:
            out[value.encode()] = name
            out[hashlib.sha1(value.encode()).hexdigest().encode()] = name
    return out


def _what_each_step_sends() -> dict[str, set[str]]:
    """Drive the harness to every fault kind (a fresh deployment each) and through recovery,
    and record what each step sends on the connections faults are injected into: by step (the
    model command for a lost reply), the command names, scripts by their name."""
    names = _script_names()
    sent: dict[str, set[str]] = defaultdict(set)
    for kind in required_kinds(DEFAULT_BOUNDS):
        server = fakeredis.FakeServer()

        def make_client(server: fakeredis.FakeServer = server) -> Any:
            return connect_fake(server)

        h = Harness(make_client, DEFAULT_BOUNDS)
        step = ["setup"]

        def on_send(
            heads: list[tuple[str, bytes]],
            label: Any,
            conn: Any,
            data: bytes,
            step: list[str] = step,
        ) -> None:
            for name, first in heads:
                sent[step[0]].add(
                    names.get(first, first.decode(errors="replace"))
                    if name.startswith("EVAL")
                    else name
                )

        h.injector.on_send = on_send
        try:
            h.setup()
            walk = walk_to(h.state, h.config, kind)
            assert walk is not None, kind
            for a in walk:
                step[0] = a.name
                h.step(a)
                h.check()
            shot = shots(h.state, h.config, kind)[0]
            step[0] = kind
            h.step(shot.action, drop_at=shot.drop_at, variant=shot.variant)
            h.check()
            step[0] = "recovery"
            h.recover()
        finally:
            h.close()
    return sent


def test_the_losable_commands_are_the_models_and_the_harness_heartbeat() -> None:
    assert set(model_losable_commands()) == {
        a for names in LOSABLE_SENDS.values() for a in names
    } - {"heartbeat"}
    assert set(losable_commands()) == set(model_losable_commands()) | {"heartbeat"}
    assert required_kinds(DEFAULT_BOUNDS)[:4] == (
        "crash_server",
        "crash_worker",
        "redis_wipe",
        "stall_server",
    )
    assert set(required_kinds(DEFAULT_BOUNDS)) - {
        f"{DROPPED}{c}" for c in losable_commands()
    } == set(FAULTS) - {"dropped_reply", "retry", "cancel_before_send"}
    # asyncio's cancellation before the send only where the bounds have it (`verify --async`)
    assert "cancel_before_send" in required_kinds(DEFAULT_BOUNDS._replace(cancels_before_send=True))


def test_the_list_agrees_with_what_the_worker_and_the_server_send() -> None:
    sent = _what_each_step_sends()
    everything = set().union(*sent.values())
    known = set(LOSABLE_SENDS) | set(NOT_LOST_IN_THE_MODEL) | NO_EFFECT
    assert everything <= known, f"sent, and not known to the fault list: {everything - known}"
    # every command of the list is one the step of that name really sends (and loses)
    for command in losable_commands():
        kind = f"{DROPPED}{command}"
        mine = {s for s, commands in LOSABLE_SENDS.items() if command in commands}
        assert sent[kind] & mine, f"the {kind} step sent {sorted(sent[kind])}, none of {mine}"
    # and every command the deployment sends whose reply the model loses is on the list
    for name in everything & set(LOSABLE_SENDS):
        assert LOSABLE_SENDS[name] <= set(losable_commands()), name


def test_a_kind_that_never_fires_fails_the_gate_naming_it_with_the_counts() -> None:
    cov = judge(
        {"crash_worker": 12, "dropped-reply:take": 9, "dropped-reply:release": 2},
        ["crash_worker", "redis_wipe", "dropped-reply:take", "dropped-reply:release"],
    )
    assert not cov.ok
    assert "redis_wipe fired 0 times, fewer than the minimum 5" in cov.summary()
    assert "dropped-reply:release fired 2 times, fewer than the minimum 5" in cov.summary()
    assert "crash_worker" not in cov.summary()
    rare = judge(
        {"dropped-reply:take": 30, "dropped-reply:sweep": 9},
        ["dropped-reply:take", "dropped-reply:sweep"],
    )
    assert rare.short == [
        "dropped-reply:sweep fired 9 times, less than 1/3 of dropped-reply:take's 30"
    ]
    assert judge(
        {"dropped-reply:take": 30, "dropped-reply:sweep": 10},
        ["dropped-reply:take", "dropped-reply:sweep"],
    ).ok


class _Injected(RunStats):
    """RunStats that also keeps, per example, what the injector fired and the fault steps."""

    def __init__(self) -> None:
        super().__init__()
        self.fired: Counter[str] = Counter()
        self.fault_steps: Counter[str] = Counter()

    def add(self, h: Any) -> None:
        super().add(h)
        self.fired.update(h.injector.counts)
        self.fault_steps.update(
            s.action.name for s in h.steps if s.fault and s.action.name != "dropped_reply"
        )


def _small_run(
    kinds: tuple[str, ...] | None = None, again: int = 0, **bounds: Any
) -> tuple[Any, _Injected]:
    """12 examples; kinds left short are aimed at again in `again` more (none by default)."""
    server = fakeredis.FakeServer()
    stats = _Injected()
    options = Options(coverage_examples=12, bounds=COVERAGE_BOUNDS._replace(**bounds))
    failure, stopped, cov = run_fault_coverage(
        options,
        lambda: connect_fake(server),
        QueueKeys("verify", prefix="tcv"),
        stats,
        real=False,
        kinds=kinds,
        aimed_again_examples=again,
    )
    assert failure is None and not stopped
    return cov, stats


def test_a_run_where_a_kind_cannot_fire_fails_naming_it_and_its_count() -> None:
    # Redis's own faults off, the wipe still required: it fires 0 times
    cov, stats = _small_run(required_kinds(DEFAULT_BOUNDS), redis_faults=False)
    assert stats.examples > 0 and cov.counts["redis_wipe"] == 0
    assert not cov.ok
    assert f"redis_wipe fired 0 times, fewer than the minimum {MINIMUM}" in cov.summary()


def test_kinds_the_first_examples_leave_short_are_aimed_at_again_until_they_fire_enough() -> None:
    # 12 examples of 4 faults over 13 kinds leave some short (the same 12 examples, seeded,
    # with no examples after them); 30 more aimed at those alone bring each to its minimum
    first, first_stats = _small_run()
    assert not first.ok and not first.aimed_again
    cov, stats = _small_run(again=30)
    assert cov.aimed_again == first.short_kinds()
    assert stats.examples > first_stats.examples
    assert cov.ok, cov.summary()
    for kind in cov.aimed_again:
        assert cov.counts[kind] >= MINIMUM > first.counts[kind], kind
    assert cov.aimed_again_line() == "aimed at again, alone: " + ", ".join(cov.aimed_again)


def test_a_kind_that_cannot_fire_is_aimed_at_again_and_still_fails() -> None:
    _, first_stats = _small_run(("redis_wipe", "crash_worker"), redis_faults=False)
    cov, stats = _small_run(("redis_wipe", "crash_worker"), again=2, redis_faults=False)
    assert cov.aimed_again == ("redis_wipe",)
    assert stats.examples > first_stats.examples  # the examples aimed at it again ran
    assert cov.counts["redis_wipe"] == 0 and not cov.ok


def test_no_kind_is_aimed_at_again_once_the_time_budget_is_spent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the budget's clock runs out as the first examples end: the kinds they left short fail
    # the gate as they are, and no examples run after them
    now = [0.0]
    calls = []
    stateful = parts.run_stateful

    def first_examples_then_spent(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["aim_at"])
        outcome = stateful(*args, **kwargs)
        now[0] = 1e9
        return outcome

    monkeypatch.setattr(parts, "run_stateful", first_examples_then_spent)
    server = fakeredis.FakeServer()
    failure, stopped, cov = run_fault_coverage(
        Options(coverage_examples=12, bounds=COVERAGE_BOUNDS),
        lambda: connect_fake(server),
        QueueKeys("verify", prefix="tcv"),
        RunStats(),
        real=False,
        budget=Budget(60, clock=lambda: now[0]),
    )
    assert len(calls) == 1
    assert failure is None and not stopped
    assert not cov.ok and cov.aimed_again == ()


def test_aimed_again_the_lost_replies_are_judged_against_the_takes_of_the_first_examples() -> None:
    kinds = ["dropped-reply:take", "dropped-reply:sweep"]
    # the take's lost replies aimed at again went from 30 to 90: the sweep's 10 are still a third
    # of the 30 they were judged against
    assert not judge({"dropped-reply:take": 90, "dropped-reply:sweep": 10}, kinds).ok
    assert judge({"dropped-reply:take": 90, "dropped-reply:sweep": 10}, kinds, reference=30).ok
    assert judge(
        {"dropped-reply:take": 90, "dropped-reply:sweep": 9}, kinds, reference=30
    ).short == ["dropped-reply:sweep fired 9 times, less than 1/3 of dropped-reply:take's 30"]


def test_the_counts_are_the_faults_actually_injected() -> None:
    cov, stats = _small_run()
    drops = {k: n for k, n in stats.faults.items() if k.startswith(DROPPED)}
    assert sum(drops.values()) > 0
    assert sum(drops.values()) == stats.fired["dropped-reply"]  # each one the injector fired
    for kind in ("crash_server", "crash_worker", "redis_wipe", "stall_server"):
        assert cov.counts[kind] == stats.fault_steps[kind] > 0, kind
    assert cov.counts == {k: stats.faults[k] for k in cov.counts}


@pytest.mark.parametrize(
    "kind",
    [
        "dropped-reply:take_suspect",
        "dropped-reply:sweep",
        "dropped-reply:drain_step",
        "dropped-reply:reconcile",
    ],
)
def test_the_planner_reaches_a_rare_kind_from_a_fresh_deployment(kind: str) -> None:
    server = fakeredis.FakeServer()
    h = Harness(lambda: connect_fake(server), DEFAULT_BOUNDS)
    try:
        h.setup()
        walk = walk_to(h.state, h.config, kind)
        assert walk is not None and len(walk) <= 4
        for a in walk:
            assert a in h.enabled()
            h.step(a)
            h.check()
        assert shots(h.state, h.config, kind)
    finally:
        h.close()


def test_the_reports_print_the_counts_per_kind_and_a_shortfall_is_the_verdict() -> None:
    from taskcustody.verify.report import text_report, verdict
    from taskcustody.verify.report_html import html_report
    from taskcustody.verify.run import Result

    kinds = ["crash_worker", "redis_wipe", "dropped-reply:take"]
    result = Result(Options(model_check=False), "fakeredis")
    result.coverage = judge({"crash_worker": 12, "dropped-reply:take": 9}, kinds)
    text, page = text_report(result), html_report(result)
    assert verdict(result).startswith("FAULT COVERAGE NOT MET")
    assert (
        "fault coverage (each kind >= 5, each lost reply >= 1/3 of dropped-reply:take): "
        "NOT MET" in text
    )
    lines = {
        line.split()[0]: line.split()[1:]
        for line in text.splitlines()
        if line.startswith("    ") and line.split()[0] in kinds
    }
    assert lines == {
        "crash_worker": ["12"],
        "redis_wipe": ["0", "<-", "short"],
        "dropped-reply:take": ["9"],
    }
    assert '<section id="fault-coverage">' in page
    assert '<td>redis_wipe</td><td class="num">0</td><td>short</td>' in page
    assert "redis_wipe fired 0 times, fewer than the minimum 5" in page
    result.coverage = judge({k: 10 for k in kinds}, kinds)
    assert result.ok and "): met" in text_report(result)


def test_a_lost_reply_counted_but_not_injected_fails_the_machine() -> None:
    from taskcustody.verify.aiming import with_aimed_faults
    from taskcustody.verify.harness import Mismatch
    from taskcustody.verify.machine import build_machine

    server = fakeredis.FakeServer()
    machine: Any = with_aimed_faults(
        build_machine(lambda: connect_fake(server)), required_kinds(DEFAULT_BOUNDS)
    )()
    try:
        machine.setup()
        machine.injected_faults_are_the_counted_ones()  # nothing counted, nothing fired
        machine.h.counts["dropped-reply:take"] += 1
        with pytest.raises(Mismatch, match="counted 1 lost replies; the injector dropped 0"):
            machine.injected_faults_are_the_counted_ones()
    finally:
        machine.h.close()
