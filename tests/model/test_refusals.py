"""`refused_attempts`: what the model refuses, beside what it enables."""

from __future__ import annotations

from collections import deque

from taskcustody_model import (
    REFUSALS,
    Action,
    Attempt,
    Bounds,
    Config,
    State,
    apply,
    enabled_actions,
    refused_attempts,
    variant,
)
from taskcustody_model.protocol import pass_selection
from taskcustody_model.state import SUPERSEDED

CONFIG = Config(Bounds(tasks=2, servers=1, workers=1, faults=2), variant("correct"))


def _reachable(config: Config, limit: int = 4_000) -> list[State]:
    seen = {config.initial()}
    todo = deque(seen)
    while todo and len(seen) < limit:
        state = todo.popleft()
        for action in enabled_actions(state, config):
            after = apply(state, action, config)
            if after not in seen:
                seen.add(after)
                todo.append(after)
    return list(seen)


def test_a_claim_of_a_held_id_is_refused_from_the_start() -> None:
    state = CONFIG.initial()
    assert refused_attempts(state, CONFIG) == [Attempt("claim_held", 0)]
    assert Action("claim", 0) not in enabled_actions(state, CONFIG)


def test_a_refused_attempt_is_never_an_enabled_action_and_every_kind_is_reachable() -> None:
    kinds = set()
    for state in _reachable(CONFIG):
        enabled = enabled_actions(state, CONFIG)
        for a in refused_attempts(state, CONFIG):
            kinds.add(a.name)
            if a.name == "claim_held":
                assert Action("claim", a.server) not in enabled
                reg = state.registry[a.server]
                assert reg is not None and reg.deadline > 0
            elif a.name == "heartbeat_superseded":
                proc = state.processes[a.server][a.proc]
                assert proc.phase == SUPERSEDED and proc.inc == a.inc
                assert Action("heartbeat", a.server, a.proc) not in enabled
            else:
                reg = state.registry[a.server]
                assert reg is not None and reg.inc == a.inc and reg.deadline > 0  # live
                # ... and no sweep that can run now selects the list
                for sweep in (x for x in enabled if x.name == "sweep"):
                    assert (a.server, a.inc, a.worker) not in pass_selection(state, sweep, CONFIG)
    assert kinds == set(REFUSALS)
