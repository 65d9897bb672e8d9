"""`python -m bench.reduction_headroom`: the optimistic estimate of what larger ample sets could
save, against the model's reduction."""

from __future__ import annotations

import pytest
from taskcustody_model import check
from taskcustody_model.protocol import Config, enabled_actions
from taskcustody_model.reduction import steps_to_expand
from taskcustody_model.state import Bounds
from taskcustody_model.variants import variant

# (importorskip: the mutation gate's copies hold no bench/)
headroom = pytest.importorskip("bench.reduction_headroom")
fingerprints = pytest.importorskip("bench.fingerprints")

SMALL = Bounds(tasks=2, servers=2, workers=1, faults=1, processes_per_server=1)


def test_the_model_column_is_the_reduced_checkers_count() -> None:
    # 2 x 2: where the checker's raw aliases merge states that canonical forms alone do not
    # (2,342 states against 2,355)
    bounds = SMALL._replace(workers=2)
    report = headroom.headroom(bounds)
    assert report["complete"]
    rows = report["levels"]
    result = check(bounds, reduce=True)
    assert rows[-1]["reduced"] == result.distinct_states
    # a level per depth: the last one the checker's depth
    config = Config(bounds, variant("correct"))
    assert (
        len(list(headroom.levels(config, lambda s: steps_to_expand(s, config, True))))
        == result.depth
    )


def test_the_oracle_never_expands_more_than_every_enabled_step() -> None:
    config = Config(SMALL, variant("correct"))
    report = headroom.headroom(SMALL)
    assert report["levels"][-1]["oracle"] <= check(SMALL).distinct_states
    state = config.initial()
    # with faults left, a state is expanded fully
    assert headroom.smallest_dependent_group(state, config) == enabled_actions(state, config)


def test_a_spent_state_is_expanded_by_some_of_its_steps() -> None:
    config = Config(SMALL, variant("correct"))
    seen = 0
    for state in fingerprints.states_met(SMALL):  # (every state an unreduced search meets)
        if state.faults < SMALL.faults:
            continue
        group = headroom.smallest_dependent_group(state, config)
        enabled = enabled_actions(state, config)
        assert set(group) <= set(enabled) and bool(group) == bool(enabled)
        seen += len(group) < len(enabled)
    assert seen > 0  # some state is expanded by fewer than all its steps


def test_the_command_prints_a_line_per_depth_and_a_summary(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        headroom.main(
            [
                "--tasks",
                "2",
                "--servers",
                "2",
                "--workers",
                "1",
                "--faults",
                "1",
                "--max-states",
                "50",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("depth 1: reduced ")
    assert out[-1].startswith("stopped at depth ")
