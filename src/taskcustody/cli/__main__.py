"""`python -m taskcustody.cli`: the console script without an installed entry point (the tests
start workers this way, from the source tree)."""

from .app import main

main()
