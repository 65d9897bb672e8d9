"""taskcustody's pytest plugin (the `pytest11` entry point): `pytest --taskcustody-redis-url URL`
runs taskcustody's conformance suite (`taskcustody verify`'s stateful run) against that Redis, with
your own `Settings` (`--taskcustody-settings module:attr`), as test items of your own run.

Installed, pytest loads this in every run of every project, so without the option it adds no
test, no fixture and no import: it imports nothing but pytest when it is loaded. It is a package of
its own, not a module inside `taskcustody`, because loading `taskcustody.anything` would import
the `taskcustody` package from wherever it is installed before a test run has set up its paths
(the mutation gate runs the tests against a mutated copy of it). The work is in
`taskcustody.verify.pytest_plugin`, imported only when the option is given.
"""

from __future__ import annotations

import pytest

URL = "--taskcustody-redis-url"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("taskcustody", "taskcustody conformance suite (taskcustody verify)")
    group.addoption(
        URL,
        metavar="URL",
        default=None,
        help="Run taskcustody's conformance suite (the model-driven stateful run, "
        "faults injected) against this Redis as test items. It writes only "
        "keys under taskcustody-verify:{QUEUE}: and deletes them at the end.",
    )
    group.addoption(
        "--taskcustody-settings",
        metavar="MODULE:ATTR",
        default=None,
        help="Your taskcustody Settings (an attribute of an importable module), "
        "whose connection, replication and eviction fields the run uses; "
        "prefetch > 1 adds the prefetching worker's run.",
    )
    group.addoption(
        "--taskcustody-queue",
        metavar="NAME",
        default=None,
        help="The queue name (hash tag) of the run's keys (default: verify-<pid>). "
        "A queue that already holds keys is refused.",
    )
    group.addoption(
        "--taskcustody-examples",
        metavar="N",
        type=int,
        default=100,
        help="Stateful examples per run (default: 100).",
    )
    group.addoption(
        "--taskcustody-steps",
        metavar="N",
        type=int,
        default=40,
        help="Maximum steps per stateful example (default: 40).",
    )
    group.addoption(
        "--taskcustody-max-seconds",
        metavar="N",
        type=float,
        default=None,
        help="A time budget for the conformance items together: they stop cleanly "
        "between examples once it is spent and say how much they covered.",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption(URL) is not None:
        config.addinivalue_line(
            "markers", "taskcustody: taskcustody's conformance run (--taskcustody-redis-url)"
        )


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect: they apply to these items too
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    if config.getoption(URL) is None:
        return
    from taskcustody.verify.pytest_plugin import conformance_items

    items.extend(conformance_items(session, config))
