"""Refusals are behaviour too: the machine with `refusals` also attempts what
the model refuses (`taskcustody_model.refused_attempts`: a claim of an id a live process holds, a
heartbeat from a superseded process, a sweep's drain of a live list), and the implementation must
refuse it with Redis unchanged. An implementation that accepts one fails the stateful run with a
`refusal` mismatch, not only a unit test (the correct implementation's run with refusals is
tests/stateful/test_conformance.py's).

The broken implementations here are the real one with one script rewritten so that it no longer
refuses (the rewrites the named mutants `claim-ignores-live-holder` and
`drain-ignores-live-owner` make in the source), and a server whose heartbeat, once it knows it was
superseded, takes its id back.
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from taskcustody_model import REFUSALS

from taskcustody.core import scripts
from taskcustody.core.server import Server
from taskcustody.verify.machine import RunStats, build_machine
from taskcustody.verify.observation import Mismatch
from taskcustody.verify.run import Options, verify
from taskcustody.verify.seeding import run_machine
from tests.conftest import Backend

#: What each script turns into when it no longer refuses, and which refusal must then fail.
NOT_REFUSING = {
    "claim_held": (
        "CLAIM",
        "if current and tonumber(current) > tonumber(now) then",
        "if false then",
    ),
    "drain_live": (
        "DRAIN_CHUNK",
        "if mode ~= 'force' and is_live(servers, incarnations, server_id, incarnation) then",
        "if false then",
    ),
}


def _run(backend: Backend, examples: int) -> RunStats:
    stats = RunStats()
    machine = build_machine(backend.client, real_redis=backend.real, stats=stats, refusals=True)
    phases = [Phase.explicit, Phase.generate]  # no shrinking: the kind of mismatch is enough
    run_machine(
        machine,
        settings(
            stateful_step_count=30,
            max_examples=examples,
            deadline=None,
            phases=phases,
            database=None,
        ),
    )
    return stats


def _refusal_message(backend: Backend) -> str:
    """The message of the `refusal` mismatch that a run of 30 examples must fail with."""
    with pytest.raises(Mismatch) as failure:
        _run(backend, 30)
    assert failure.value.kind == "refusal"
    return failure.value.message


def test_the_implementation_refuses_each_kind_of_attempt(backend: Backend) -> None:
    """The real implementation meets every kind of attempt and refuses each (else `_run` raises
    the `refusal` mismatch): the test that kills the named mutants `claim-ignores-live-holder`
    and `drain-ignores-live-owner` (mutation/named.py)."""
    stats = _run(backend, 30)
    for kind in REFUSALS:
        assert stats.refusals[kind] > 0, f"no {kind} attempt in {stats.examples} examples"


@pytest.mark.parametrize("kind", sorted(NOT_REFUSING))
def test_an_implementation_that_accepts_what_it_must_refuse_fails(
    backend: Backend, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, refusing, accepting = NOT_REFUSING[kind]
    source = getattr(scripts, name)
    # the rewrite below still hits the refusal (fails under a mutant that already removed it,
    # after the test above has met the mutant)
    assert source.count(refusing) == 1
    monkeypatch.setattr(scripts, name, source.replace(refusing, accepting))
    assert ("claim" if kind == "claim_held" else "drain") in _refusal_message(backend)


def test_a_superseded_process_whose_heartbeat_takes_its_id_back_fails(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its first heartbeat after the supersession is refused (the model's `heartbeat` finds the
    newer incarnation, which every run checks); a later one, once the process knows, takes the id
    back. Only an attempt of what the model refuses can see that."""
    heartbeat = Server.heartbeat

    def takes_the_id_back(self: Server) -> None:
        if self.superseded:
            self.client.hset(self.keys.incarnations, self.server_id, self.identity.incarnation)
            self.client.zadd(
                self.keys.servers, {self.server_id: self.clock.now() + self.settings.server_ttl}
            )
            return
        heartbeat(self)

    monkeypatch.setattr(Server, "heartbeat", takes_the_id_back)
    assert "superseded" in _refusal_message(backend)


def test_verify_fails_an_implementation_that_claims_a_held_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`taskcustody verify` (not only this suite): its run of the real implementation attempts
    what the model refuses, and says which refusal failed, with the attempt as the last step."""
    name, refusing, accepting = NOT_REFUSING["claim_held"]
    monkeypatch.setattr(scripts, name, getattr(scripts, name).replace(refusing, accepting))
    result = verify(Options(examples=30, steps=30, model_check=False, shrink_seconds=20))
    assert result.failure is not None and result.failure.kind == "refusal"
    assert result.failure.steps[-1].action.name == "claim_held"
    assert "refuses" in result.failure.steps[-1].text


def test_a_superseded_process_that_goes_on_after_a_refused_heartbeat_fails(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The named mutant `superseded-heartbeat-goes-on`: once a process knows it was superseded,
    a later heartbeat that Redis refuses no longer stops it. Redis is unchanged, so no check of
    the state can see it; the attempt of a superseded process's heartbeat does (aimed at in
    every example, verify/refusal_aiming.py)."""
    heartbeat = Server.heartbeat

    def goes_on(self: Server) -> None:
        if not self.superseded:
            heartbeat(self)

    monkeypatch.setattr(Server, "heartbeat", goes_on)
    assert "went on" in _refusal_message(backend)


def test_every_kind_is_attempted_in_every_example_it_is_in_reach(backend: Backend) -> None:
    """The aiming rule walks to each kind not yet attempted in an example, so the counts depend
    little on the draws: over 30 seeded examples a superseded process's heartbeat (a stall, a
    lapsed lease, a new claim, the resume and the heartbeat that tells it) is attempted in a good
    share of them, whatever the seed (twice in 277 examples of `verify`'s run before the aiming;
    from a quarter to all of the examples with seeds 0 to 2, as short examples and planner
    bounds allow)."""
    stats = _run(backend, 30)
    assert stats.refusals["heartbeat_superseded"] >= stats.examples // 4, stats.refusals


def test_walk_to_refusal_plans_the_superseded_heartbeat_on_the_model() -> None:
    from taskcustody_model import Config, initial_state, variant

    from taskcustody.verify.machine import DEFAULT_BOUNDS
    from taskcustody.verify.refusal_aiming import attempts, walk_to_refusal

    config = Config(DEFAULT_BOUNDS._replace(drain_steps=True), variant("correct"))
    state = initial_state(config.bounds)
    assert walk_to_refusal(state, config, "claim_held") == []
    walk = walk_to_refusal(state, config, "heartbeat_superseded")
    assert walk is not None
    assert [a.name for a in walk][1:] == [
        "stall_server",
        "advance_clock",
        "resume_server",
        "claim",
        "heartbeat",
    ]
    from taskcustody.verify.aiming import after

    for action in walk:
        assert not attempts(state, config, "heartbeat_superseded")
        state = after(state, action, config)
    assert attempts(state, config, "heartbeat_superseded")
    # out of reach without fault budget (no stall): None, not a walk
    spent = initial_state(config.bounds)._replace(faults=config.bounds.faults)
    assert walk_to_refusal(spent, config, "heartbeat_superseded") is None


def test_verify_fails_when_a_kind_is_attempted_too_rarely(monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal part's gate: with the aiming rule's walks cut to nothing, a superseded
    process's heartbeat is left to the draws, which do not reach it, and the run fails with the
    counts; with the walks, the same run meets the minimum."""
    from taskcustody.verify import refusal_aiming
    from taskcustody.verify.report import text_report

    options = Options(
        examples=30, steps=20, model_check=False, loops=False, fault_coverage=False, shrink=False
    )
    monkeypatch.setattr(refusal_aiming, "MAX_DEPTH", 0)
    result = verify(options)
    assert result.failure is None
    assert result.refusal_coverage is not None and not result.refusal_coverage.ok
    assert not result.ok
    report = text_report(result)
    assert "REFUSAL COVERAGE NOT MET" in report
    assert "heartbeat_superseded" in report and "<- short" in report
    monkeypatch.undo()
    result = verify(options)
    assert result.ok, result.parts
    assert result.refusal_coverage is not None and result.refusal_coverage.ok
    assert "refusal coverage (each kind attempted >= 3 times): met" in text_report(result)
