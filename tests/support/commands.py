"""Every command of the `taskcustody` click group, its lazy ones loaded (for tests that check
something of each: its help, its options in the docs)."""

from __future__ import annotations

from collections.abc import Iterator

import click


def walk(
    command: click.Command, ctx: click.Context
) -> Iterator[tuple[str, click.Command, click.Context]]:
    """(path, command, its context) for `command` and every subcommand below it, depth first.
    The group's `get_command` is what loads a lazy command (cli_errors.MappedErrors), so each is
    asked for by name, never read from `.commands` (which holds only the loaded ones)."""
    yield ctx.command_path, command, ctx
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None, f"{ctx.command_path} lists {name!r} but cannot load it"
            yield from walk(sub, click.Context(sub, parent=ctx, info_name=name))


def every_command() -> list[tuple[str, click.Command, click.Context]]:
    from taskcustody.cli.app import main

    return list(walk(main, click.Context(main, info_name="taskcustody")))
