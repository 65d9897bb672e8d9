"""A server reporting a two-part version ("6.2") was refused as older than 6.2.0: the parsed tuple
(6, 2) ranks below (6, 2, 0). Found reviewing `parse_version` for the mutation gate."""

from __future__ import annotations

from taskcustody.deploy.connection import MIN_VERSION, parse_version


def test_a_two_part_version_is_padded_to_three() -> None:
    assert parse_version("6.2") == (6, 2, 0)
    assert parse_version("6.2") >= MIN_VERSION
    assert parse_version("7") == (7, 0, 0)
    assert parse_version("6.1") < MIN_VERSION
