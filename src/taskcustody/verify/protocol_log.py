"""The protocol's own log lines during a verify run, kept apart from verify's progress.

The faults verify injects make the implementation log what it logs in production when they
happen for real: a worker whose task was recovered meanwhile "lost custody ... (judged dead
meanwhile ...)", a task recovered too often "poison pill: ... dead-lettered", a lost reply
"Redis unreachable". A short run logs about a hundred such warnings and errors. Left to
Python's last-resort handler they went to stderr among the progress lines (and under --quiet),
where they read like failures of the run; they are its faults doing their job, and a failure
is a violation, which the report says.

So for the length of a run (`captured`), the `taskcustody` logger's records of WARNING and above
go to a handler of the run's own, which counts them by kind (logger, level, message template)
for the report (`ProtocolLog`), and, when asked (`verify -v`), passes each line on; none
propagate further. The logger's handlers, level and propagation are put back when the run ends.
"""

from __future__ import annotations

import contextlib
import html
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

#: The logger every module of the protocol logs under (`taskcustody.worker`, `.server`, ...).
LOGGER = "taskcustody"
#: What is kept: what reached stderr before, with logging not configured (Python's last resort
#: prints WARNING and above). INFO would cost the protocol work it does only for an INFO log
#: (recovery lists each task it requeues), and would change with the caller's logging set-up.
LEVEL = logging.WARNING

TITLE = (
    "the protocol's own log, warnings and errors, by kind (what the injected faults made "
    "it log, as it would in production; not failures: a violation is reported above)"
)

_PLACEHOLDER = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[diouxXeEfFgGcrsa]")


@dataclass
class LogKind:
    """The lines of one kind: one logger, one level, one message template."""

    logger: str
    level: str
    template: str
    count: int = 0
    example: str = ""  # the first line of the kind, as logged (its message)

    @property
    def label(self) -> str:
        """The template with its values left out (`...`)."""
        return _PLACEHOLDER.sub("...", self.template).replace("%%", "%")


@dataclass
class ProtocolLog:
    """The protocol's log lines of a run (WARNING and above), counted by kind."""

    kinds: dict[tuple[str, str, str], LogKind] = field(default_factory=dict)

    def add(self, record: logging.LogRecord) -> None:
        template = record.msg if isinstance(record.msg, str) else repr(record.msg)
        key = (record.name, record.levelname, template)
        kind = self.kinds.get(key)
        if kind is None:
            kind = self.kinds[key] = LogKind(
                record.name, record.levelname, template, example=_message(record)
            )
        kind.count += 1

    @property
    def total(self) -> int:
        return sum(k.count for k in self.kinds.values())

    def by_count(self) -> list[LogKind]:
        """The kinds, the most frequent first (then by logger and template: a stable order)."""
        return sorted(self.kinds.values(), key=lambda k: (-k.count, k.logger, k.template))

    def lines(self) -> list[str]:
        """The report's section, in text."""
        n = self.total
        out = [f"{TITLE}: {n:,} line" + ("" if n == 1 else "s") + (":" if n else "")]
        for k in self.by_count():
            out.append(f"  {k.count:8,}  {k.level:7} {k.logger}: {k.label}")
            out.append(f"            e.g. {k.example}")
        return out

    def html(self) -> str:
        """The report's section, in HTML."""
        e = html.escape
        title = TITLE[0].upper() + TITLE[1:]
        if not self.kinds:
            return f"<h2>{e(title)}</h2><p>none</p>"
        rows = "".join(
            f'<tr><td class="n">{k.count:,}</td><td>{e(k.level)}</td><td>{e(k.logger)}</td>'
            f"<td>{e(k.label)}<br><small>e.g. {e(k.example)}</small></td></tr>"
            for k in self.by_count()
        )
        return (
            f"<h2>{e(title)}</h2><p>{self.total:,} lines</p><table><tr><th>lines</th>"
            f"<th>level</th><th>logger</th><th>message</th></tr>{rows}</table>"
        )


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # a malformed call: its template, rather than no line at all
        return str(record.msg)


#: How a line is passed on (`verify -v`): named, so that it does not read as verify's own.
ECHO_FORMAT = "protocol log: %(name)s %(levelname)s %(message)s"


class _Capture(logging.Handler):
    def __init__(self, log: ProtocolLog, echo: Callable[[str], None] | None) -> None:
        super().__init__(LEVEL)
        self.log = log
        self.echo = echo
        self.setFormatter(logging.Formatter(ECHO_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        self.log.add(record)
        if self.echo is not None:
            try:
                self.echo(self.format(record))
            except Exception:  # never fail the protocol's step over a line of its log
                self.handleError(record)


@contextlib.contextmanager
def captured(log: ProtocolLog, echo: Callable[[str], None] | None = None) -> Iterator[ProtocolLog]:
    """For the block's length: the `taskcustody` logger's records (WARNING and above) are
    counted into `log`, passed to `echo` (a formatted line) if given, and go nowhere else.
    Its handlers, level, propagation and `disabled` are restored afterwards, whatever they were
    (a caller that set up logging of its own gets it back as it was)."""
    logger = logging.getLogger(LOGGER)
    saved = (logger.handlers[:], logger.level, logger.propagate, logger.disabled)
    logger.handlers[:] = [_Capture(log, echo)]
    logger.setLevel(LEVEL)
    logger.propagate = False
    logger.disabled = False
    try:
        yield log
    finally:
        handlers, level, propagate, disabled = saved
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate
        logger.disabled = disabled
