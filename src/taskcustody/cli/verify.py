"""`taskcustody verify`, or, without the `verify` extra, a stand-in that says how to get it.

The verify job needs hypothesis (it drives the model), fakeredis and lupa (its embedded Redis,
with Lua). A worker in production needs none of them, so they are the `verify` extra, not core
dependencies: `pip install 'taskcustody[verify]'`.
"""

from __future__ import annotations

import importlib

import click

from .errors import Failure

#: What the verify job imports, beyond the core dependencies.
NEEDS = ("hypothesis", "fakeredis", "lupa")


def _missing() -> str | None:
    for name in NEEDS:
        try:
            importlib.import_module(name)
        except ImportError:
            return name
    return None


def _stand_in(missing: str) -> click.Command:
    message = (
        f"taskcustody verify needs the verify extra ({missing} is not installed): "
        "pip install 'taskcustody[verify]'"
    )

    @click.command(
        name="verify",
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        short_help="Verify the protocol (needs: pip install 'taskcustody[verify]').",
    )
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def verify(args: tuple[str, ...]) -> None:
        raise Failure(message)

    return verify


def load() -> click.Command:
    missing = _missing()
    if missing is not None:
        return _stand_in(missing)
    from ..verify.cli import verify_command

    return verify_command


def __getattr__(name: str) -> click.Command:
    if name == "verify_command":
        return load()
    raise AttributeError(name)
