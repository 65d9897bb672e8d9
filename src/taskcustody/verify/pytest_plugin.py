"""The conformance suite as pytest items, for `pytest --taskcustody-redis-url URL` in a user's
project (the hooks are in the `taskcustody_pytest` entry point, which imports this only when asked).

One item per stateful run: the plain worker cycle, and with the user's `Settings.prefetch > 1`
the prefetching worker's too. Each is `taskcustody verify --no-model-check --redis-url URL` with
the user's settings (`run.run_settings`): the model check is about the protocol, not about the
user's deployment, and `taskcustody verify` runs it. A violation fails the item with the report
(the counterexample and the command that reproduces it); a deployment that stops the run, or a
queue that holds keys already, fails it with that one line; a run the time budget cut short
passes with what it covered in its report section, and one it did not reach is skipped.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..core.settings import Settings
from .budget import Budget
from .coverage import coverage_text
from .report import text_report
from .run import SKIPPED, Options, QueueInUse, load_settings, stopped_by_deployment, verify

_BUDGET = pytest.StashKey[Budget]()


def _settings(config: pytest.Config) -> tuple[Settings | None, str | None]:
    spec = config.getoption("--taskcustody-settings")
    if not spec:
        return None, None
    try:
        return load_settings(spec), spec
    except ValueError as exc:
        raise pytest.UsageError(f"--taskcustody-settings {exc}") from exc


def _options(config: pytest.Config, prefetch: bool) -> Options:
    url = config.getoption("--taskcustody-redis-url")
    queue = config.getoption("--taskcustody-queue")
    examples = config.getoption("--taskcustody-examples")
    steps = config.getoption("--taskcustody-steps")
    if examples < 1 or steps < 1:
        raise pytest.UsageError("--taskcustody-examples and --taskcustody-steps must be >= 1")
    if queue is not None:
        from ..core.keys import QueueKeys

        try:
            QueueKeys(queue)
        except ValueError as exc:
            raise pytest.UsageError(f"--taskcustody-queue: {exc}") from exc
    settings, spec = _settings(config)
    return Options(
        examples=examples,
        steps=steps,
        redis_url=url,
        model_check=False,
        prefetch=prefetch,
        queue=queue,
        settings=settings,
        settings_spec=spec,
    )


def conformance_items(session: pytest.Session, config: pytest.Config) -> list[pytest.Item]:
    settings, _ = _settings(config)
    try:
        Budget(config.getoption("--taskcustody-max-seconds"))  # refused now, not at run time
    except ValueError as exc:
        raise pytest.UsageError(f"--taskcustody-max-seconds: {exc}") from exc
    runs = [False] + ([True] if settings is not None and settings.prefetch > 1 else [])
    items: list[pytest.Item] = []
    for prefetch in runs:
        options = _options(config, prefetch)
        name = options.part_name.replace(" ", "-")
        item = ConformanceItem.from_parent(
            session, name=name, nodeid=f"taskcustody::{name}", options=options
        )
        # `-m taskcustody` or `-k taskcustody` selects them, `not taskcustody` leaves them out.
        item.add_marker("taskcustody")
        items.append(item)
    return items


class ConformanceFailure(Exception):
    """A property was violated: the report is the failure's text (no traceback of ours)."""


class ConformanceItem(pytest.Item):
    def __init__(self, *, options: Options, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.options = options

    def runtest(self) -> None:
        # The budget starts with the first conformance item, not with the session: the
        # user's own tests before it do not spend it.
        if _BUDGET not in self.config.stash:
            self.config.stash[_BUDGET] = Budget(
                self.config.getoption("--taskcustody-max-seconds"),
                option="--taskcustody-max-seconds",
            )
        budget = self.config.stash[_BUDGET]
        try:
            result = verify(self.options, budget=budget)
        except QueueInUse as exc:
            pytest.fail(str(exc), pytrace=False)
        except Exception as exc:
            message = stopped_by_deployment(exc)
            if message is None:
                raise
            pytest.fail(message, pytrace=False)
        self.add_report_section("call", "taskcustody", coverage_text(result))
        if not result.ok:
            raise ConformanceFailure(text_report(result))
        skipped = [p for p in result.parts if p.outcome == SKIPPED]
        if skipped:
            pytest.skip(skipped[0].message)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ConformanceFailure):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[str, int | None, str]:
        return "taskcustody", None, f"taskcustody conformance: {self.options.part_name}"
