"""The loop-driven run's registrations age (`Bounds.registration_ages` in `machine.LOOP_BOUNDS`,
a harness grace of one tick), so every sweep is driven, also while a worker's production loop
left a take pending on an empty queue: Redis and the model agree on which
registrations a sweep may forget, and a sweep that forgets a fresh one is caught.

Design 9's counterexample, on the real implementation, step by step: server 0 stalls and
expires; its worker's loop takes on a queue that another worker has just emptied (the take
registers the list and waits: the model's `arm`); server 1's sweep prunes server 0; a task
arrives and the pending take is served. The correct sweep spares the fresh registration; one
that ignores the grace (the demonstration `GcWhenEmptyServer`, and the named mutant
`gc-when-empty`) forgets it, which the check right after the sweep reports."""

from __future__ import annotations

import pytest
from taskcustody_model import Action
from taskcustody_model.state import ARMED, IDLE

from taskcustody.verify.broken import server_factory
from taskcustody.verify.harness import Harness, Mismatch
from taskcustody.verify.loops import LoopDriver
from taskcustody.verify.machine import LOOP_BOUNDS
from tests.conftest import Backend


class _Steady:
    """Loop driver choices that never stop the loop nor lose a reply (subclasses say what to
    interleave)."""

    def stop(self) -> bool:
        return False

    def lose(self, action: Action) -> bool:
        return False


class _Choices(_Steady):
    """The loop driver's choices: just before the loop's take, worker 1 of server 1 takes the
    queue's last task (so the loop's take finds the queue empty); nothing else."""

    def __init__(self) -> None:
        self.stepped = False

    def interleave(self, options: list[Action]) -> Action | None:
        if self.stepped:
            return None
        self.stepped = True
        take = Action("take", 1, 0, 1)
        assert take in options
        return take


def _armed(backend: Backend, implementation: str = "correct") -> Harness:
    """Server 0 stalled and expired, its worker 0 armed by its production loop (its take is
    pending on the empty queue), checked."""
    h = Harness(
        backend.client,
        LOOP_BOUNDS,
        server_factory=server_factory(implementation),
        real_redis=backend.real,
    )
    h.setup()
    for action in (Action("take", 1, 0, 0), Action("stall_server", 0, 0), Action("advance_clock")):
        h.step(action)
        h.check()
    LoopDriver(h, 0, 0, 0, _Choices()).run()
    h.check()
    assert h.state.processes[0][0].workers[0].phase == ARMED
    assert h.procs[0][0].workers[0].armed
    assert (0, 0, 0) in h.state.fresh
    return h


def test_the_sweep_spares_the_list_of_a_pending_take_and_the_take_is_served_into_it(
    backend: Backend,
) -> None:
    h = _armed(backend)
    try:
        h.step(Action("sweep", 1, 0))
        h.check()
        assert (0, 0, 0) in h.state.registered
        for action in (Action("enqueue"), Action("take", 0, 0, 0)):
            h.step(action)
            h.check()
        assert h.state.lists[0][0] == (0, 0, 0)  # in a registered list: recovery finds it
    finally:
        h.close()


def test_a_tick_ends_the_pending_take_and_the_sweep_then_forgets_the_list(backend: Backend) -> None:
    h = _armed(backend)
    try:
        h.step(Action("advance_clock"))
        h.check()
        assert h.state.processes[0][0].workers[0].phase == IDLE
        assert not h.procs[0][0].workers[0].armed
        h.step(Action("sweep", 1, 0))
        h.check()  # Redis forgot it too: its registration is a tick old
        assert (0, 0, 0) not in h.state.registered
    finally:
        h.close()


def test_a_sweep_that_ignores_the_registration_age_is_caught(backend: Backend) -> None:
    h = _armed(backend, "gc-when-empty")
    try:
        h.step(Action("sweep", 1, 0))
        with pytest.raises(Mismatch, match=r"conformance: .*registered: model .*\(0, 0, 0\)"):
            h.check()
    finally:
        h.close()


class _Ticks(_Steady):
    """The loop driver's choices: a tick whenever one is offered (at most one), nothing else;
    records the options offered before each of the loop's commands."""

    def __init__(self) -> None:
        self.offered: list[list[str]] = []
        self.ticked = False

    def interleave(self, options: list[Action]) -> Action | None:
        self.offered.append([a.name for a in options])
        if self.ticked or Action("advance_clock") not in options:
            return None
        self.ticked = True
        return Action("advance_clock")


def test_no_tick_comes_between_a_take_and_its_send(backend: Backend) -> None:
    """The loop's take is built (its registration's score is the clock's time) before the driver's
    hook sees it; a tick there would make it arrive old where the model, which steps it after
    the tick, has it fresh (a mismatch the shrinker of a verify run found). By the assumption the
    collection rests on, a take reaches Redis within the grace of its registration: the driver
    offers no tick before a registering command, and does before the others (the record)."""
    h = Harness(backend.client, LOOP_BOUNDS, real_redis=backend.real)
    try:
        h.setup()
        h.step(Action("stall_server", 0, 0))  # (s0's registration now lapses with a tick)
        h.check()
        choices = _Ticks()
        LoopDriver(h, 0, 0, 0, choices).run()
        h.check()
        first = choices.offered[0]  # before the loop's take
        assert "advance_clock" not in first and first, first
        assert choices.ticked  # before its record
    finally:
        h.close()
