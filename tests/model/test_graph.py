"""`graph.reaching`: the backward search behind the eventual-recovery property, in the sequential
search and the parallel one."""

from __future__ import annotations

from taskcustody_model.graph import reaching


def test_reaching_marks_the_states_with_a_path_to_a_target_and_no_other() -> None:
    # 0 -> 1 -> 3 (target); 2 -> 2 (a cycle that never reaches 3); 4 -> 0
    src, dst = [0, 1, 2, 4], [1, 3, 2, 0]
    assert list(reaching(5, src, dst, [3])) == [1, 1, 0, 1, 1]


def test_reaching_keeps_the_states_already_marked_good() -> None:
    # The parallel search marks ids that hold no state as good beforehand.
    good = bytearray([0, 0, 1])
    assert list(reaching(3, [0], [1], [1], good)) == [1, 1, 1]
    assert list(reaching(3, [], [], [])) == [0, 0, 0]
