"""docs/configuration.md stays in step with the commands: every option of `taskcustody worker` is
a row of its table, with click's default and environment variable; every option two queue
commands share, and every environment variable the commands or the code read, is on the page; each
`Settings.field` it names exists."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import click
import pytest

from taskcustody import Settings
from tests.support.commands import every_command

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "configuration.md"
#: The commands that work on one queue (not verify, model-check: their options are their own).
QUEUE_COMMANDS = {
    "worker",
    "enqueue",
    "status",
    "sweep",
    "dead list",
    "dead show",
    "dead requeue",
    "dead purge",
    "result",
}

# The mutation gate runs the suite in a copy of src/, model/, tests/ only (no docs/).
pytestmark = pytest.mark.skipif(
    not (ROOT / "docs").is_dir(), reason="no docs/ (e.g. the mutation gate's copy)"
)


def page() -> str:
    return PAGE.read_text()


def commands() -> dict[str, tuple[click.Command, click.Context]]:
    return {
        path.removeprefix("taskcustody "): (command, ctx) for path, command, ctx in every_command()
    }


def options(name: str) -> list[click.Option]:
    command, ctx = commands()[name]
    # Not --help (its parameter name differs between click versions: its spellings do not).
    return [
        p
        for p in command.get_params(ctx)
        if isinstance(p, click.Option) and not set(p.opts) & set(ctx.help_option_names)
    ]


def worker_rows() -> dict[str, list[str]]:
    """The worker table's rows: the first long option of each -> its cells."""
    section = page().split("## `taskcustody worker HANDLER`", 1)[1]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `--"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            rows[re.findall(r"--[\w-]+", cells[0])[0]] = cells
    return rows


def test_every_worker_option_is_a_row_with_its_default_and_variable() -> None:
    rows = worker_rows()
    worker = options("worker")
    assert sorted(rows) == sorted(next(o for o in p.opts if o.startswith("--")) for p in worker)
    _, ctx = commands()["worker"]
    for param in worker:
        name = next(o for o in param.opts if o.startswith("--"))
        option_cell, variable, default_cell = rows[name][:3]
        # Every spelling of the option (short form, --no- form) is in its cell.
        for spelling in (*param.opts, *param.secondary_opts):
            assert f"`{spelling}`" in option_cell, (name, spelling)
        assert variable == (f"`${param.envvar}`" if param.envvar else ""), name
        default = param.get_default(ctx)
        if param.required:
            assert default_cell == "required", name
        elif param.is_flag and default is False:
            assert default_cell == "off", name
        elif isinstance(default, (int, float, str)) and not isinstance(default, bool):
            shown = re.findall(r"`([^`]+)`", default_cell)
            assert shown, (name, default_cell)
            if isinstance(default, str):
                assert shown[0] == default, name
            else:
                assert float(shown[0]) == float(default), name
        # None: a default the code computes (the page says how), nothing to compare with.


def test_every_option_shared_by_queue_commands_is_on_the_page() -> None:
    seen: dict[str, set[str]] = {}
    for name in QUEUE_COMMANDS:
        for param in options(name):
            for spelling in (*param.opts, *param.secondary_opts):
                if spelling.startswith("--"):
                    seen.setdefault(spelling, set()).add(name)
    shared = sorted(option for option, users in seen.items() if len(users) > 1)
    assert "--queue" in shared and "--redis-url" in shared  # the walk found the commands
    text = page()
    assert [option for option in shared if f"`{option}" not in text] == []


def test_every_environment_variable_is_on_the_page() -> None:
    declared = {
        param.envvar
        for _, command, ctx in every_command()
        for param in command.get_params(ctx)
        if isinstance(param, click.Option) and isinstance(param.envvar, str)
    }
    # And what the code reads itself (os.environ), named in full somewhere in src/.
    read = {
        name
        for path in (ROOT / "src").rglob("*.py")
        for name in re.findall(r"\bTASKCUSTODY_[A-Z_]+\b", path.read_text())
    }
    assert {"TASKCUSTODY_REDIS_URL", "TASKCUSTODY_SERVER_ID"} <= declared
    section = page().split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    assert sorted(v for v in declared | read if f"`${v}`" not in section) == []


def test_every_settings_field_the_page_names_exists() -> None:
    fields = {f.name for f in dataclasses.fields(Settings)}
    named = set(re.findall(r"Settings\.(\w+)", page()))
    assert named and named <= fields, named - fields
