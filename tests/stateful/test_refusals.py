"""Refusals are behaviour too (issue 14, point 9): the machine with `refusals` also attempts what
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
from hypothesis.stateful import run_state_machine_as_test
from taskcustody_model import REFUSALS

from taskcustody import scripts
from taskcustody.server import Server
from taskcustody.verify.machine import RunStats, build_machine
from taskcustody.verify.observation import Mismatch
from taskcustody.verify.run import Options, no_local_constants, verify
from tests.conftest import Backend

#: What each script turns into when it no longer refuses, and which refusal must then fail.
NOT_REFUSING = {
    "claim_held": ("CLAIM", "if deadline and tonumber(deadline) > tonumber(ARGV[2]) then",
                   "if false then"),
    "drain_live": ("DRAIN_CHUNK",
                   "if ARGV[4] ~= 'force' and is_live(KEYS[4], KEYS[5], ARGV[2], ARGV[3]) then",
                   "if false then"),
}


def _run(backend: Backend, examples: int) -> RunStats:
    stats = RunStats()
    machine = build_machine(backend.client, real_redis=backend.real, stats=stats, refusals=True)
    phases = [Phase.explicit, Phase.generate]  # no shrinking: the kind of mismatch is enough
    with no_local_constants():
        run_state_machine_as_test(machine, settings=settings(
            stateful_step_count=30, derandomize=True, max_examples=examples, deadline=None,
            phases=phases, database=None))
    return stats


def test_the_implementation_refuses_each_kind_of_attempt(backend: Backend) -> None:
    """The real implementation meets every kind of attempt and refuses each (else `_run` raises
    the `refusal` mismatch): the test that kills the named mutants `claim-ignores-live-holder`
    and `drain-ignores-live-owner` (mutation/named.py)."""
    stats = _run(backend, 30)
    for kind in REFUSALS:
        assert stats.refusals[kind] > 0, f"no {kind} attempt in {stats.examples} examples"


@pytest.mark.parametrize("kind", sorted(NOT_REFUSING))
def test_an_implementation_that_accepts_what_it_must_refuse_fails(
        backend: Backend, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    name, refusing, accepting = NOT_REFUSING[kind]
    source = getattr(scripts, name)
    # the rewrite below still hits the refusal (fails under a mutant that already removed it,
    # after the test above has met the mutant)
    assert source.count(refusing) == 1
    monkeypatch.setattr(scripts, name, source.replace(refusing, accepting))
    with pytest.raises(Mismatch) as failure:
        _run(backend, 30)
    assert failure.value.kind == "refusal"
    assert ("claim" if kind == "claim_held" else "drain") in failure.value.message


def test_a_superseded_process_whose_heartbeat_takes_its_id_back_fails(
        backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its first heartbeat after the supersession is refused (the model's `heartbeat` finds the
    newer incarnation, which every run checks); a later one, once the process knows, takes the id
    back. Only an attempt of what the model refuses can see that."""
    heartbeat = Server.heartbeat

    def takes_the_id_back(self: Server) -> None:
        if self.superseded:
            self.client.hset(self.keys.incarnations, self.server_id, self.identity.incarnation)
            self.client.zadd(self.keys.servers,
                             {self.server_id: self.clock.now() + self.settings.server_ttl})
            return
        heartbeat(self)

    monkeypatch.setattr(Server, "heartbeat", takes_the_id_back)
    with pytest.raises(Mismatch) as failure:
        _run(backend, 30)
    assert failure.value.kind == "refusal"
    assert "superseded" in failure.value.message


def test_verify_fails_an_implementation_that_claims_a_held_id(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`taskcustody verify` (not only this suite): its run of the real implementation attempts
    what the model refuses, and says which refusal failed, with the attempt as the last step."""
    name, refusing, accepting = NOT_REFUSING["claim_held"]
    monkeypatch.setattr(scripts, name, getattr(scripts, name).replace(refusing, accepting))
    result = verify(Options(examples=30, steps=30, model_check=False, shrink_seconds=20))
    assert result.failure is not None and result.failure.kind == "refusal"
    assert result.failure.steps[-1].action.name == "claim_held"
    assert "refuses" in result.failure.steps[-1].text
