"""The `taskcustody` command line: `app` holds the group and the worker, sweep, status and enqueue
commands; `dead` and `verify` are loaded when used; `errors` decides how every failure reads.

`main` is the console script's entry point (`taskcustody = "taskcustody.cli:main"`).
"""

from .app import main

__all__ = ["main"]
