"""Every command's --help explains each of its options and arguments: walked over the whole
`taskcustody` group, lazy commands (dead, result, verify) and mounted ones (model-check)
included, so that an option added without help fails here."""

from __future__ import annotations

import click
from click.testing import CliRunner

from taskcustody.cli.app import main
from tests.support.commands import every_command


def test_the_walk_reaches_the_lazy_and_the_mounted_commands() -> None:
    paths = {path for path, _, _ in every_command()}
    # Guards the test below against a walk that misses what is loaded on demand.
    assert {
        "taskcustody worker",
        "taskcustody dead requeue",
        "taskcustody result",
        "taskcustody verify",
        "taskcustody model-check",
    } <= paths


def test_every_option_and_argument_of_every_command_has_help_text() -> None:
    missing = []
    for path, command, ctx in every_command():
        if not (command.help or "").strip():
            missing.append(f"{path}: no help text")
        for param in command.get_params(ctx):
            if isinstance(param, click.Option):
                if not param.hidden and not (param.help or "").strip():
                    missing.append(f"{path} {'/'.join(param.opts)}: no help text")
            # click arguments take no help of their own: the command's text must name each.
            elif isinstance(param, click.Argument) and param.human_readable_name not in (
                command.help or ""
            ):
                missing.append(f"{path}: help does not name {param.human_readable_name}")
    assert missing == []


def test_every_command_prints_its_help() -> None:
    for path, _, _ in every_command():
        args = path.split()[1:]
        result = CliRunner().invoke(main, [*args, "--help"])
        assert result.exit_code == 0 and "Usage" in result.output, (path, result.output)
