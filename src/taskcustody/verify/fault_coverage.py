"""The gate on fault coverage: which faults a run must inject, how often, and the verdict.

A stateful run in which a fault kind never fires checks nothing about it, and passes all the
same. The fault-coverage part of `taskcustody verify` (`parts.fault_coverage_part`) runs the
machine with a rule that aims at fault kinds (`aiming.with_aimed_faults`), and this module
judges its counts: every fault kind, and a lost reply of every command that can lose one, must
fire at least `MINIMUM` times, and each lost reply at least a third as often as the take's
(`RATIO`, the most frequent by far in the plain run), or the part fails with the counts.

The kinds are read from the code, not listed by hand: the fault actions of the model
(`taskcustody_model.FAULTS`) and the commands of its `dropped_reply` actions (its table
`LOSES_REPLY`, which `enabled_actions` reads), plus the lost replies the harness injects that
the model folds into nothing (`HARNESS_ONLY`). `tests/test_fault_coverage.py` checks that the
commands the worker and the server send are exactly these, or steps whose lost reply the model
has no action for.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from taskcustody_model import FAULTS, Bounds
from taskcustody_model import protocol as model_protocol

from .aiming import DROPPED

#: Every kind must fire at least this many times in the part's run.
MINIMUM = 5
#: ... and every lost reply at least 1/RATIO as often as the take's.
RATIO = 3
REFERENCE = f"{DROPPED}take"
#: Lost replies the harness injects although the model has no action for them: a heartbeat's
#: (the script ran; the process learns of a supersession one beat later, `Stepping._heartbeat`).
HARNESS_ONLY = ("heartbeat",)
#: Faults of the model that are not this part's: `dropped_reply` is counted per command, and a
#: handler's failure (`retry`) is the retrying machine's (`verify --variant promote-copies`).
NOT_COUNTED_HERE = ("dropped_reply", "retry")


def model_losable_commands() -> tuple[str, ...]:
    """The commands whose reply the model can lose: the keys of its `LOSES_REPLY` table, which
    its `enabled_actions` reads to offer a `dropped_reply` of a step."""
    return tuple(sorted(model_protocol.LOSES_REPLY))


def losable_commands() -> tuple[str, ...]:
    """Every command whose lost reply the stateful run injects."""
    return tuple(sorted({*model_losable_commands(), *HARNESS_ONLY}))


def fault_kinds(bounds: Bounds) -> tuple[str, ...]:
    """The fault actions the run's bounds enable (a wipe only with `redis_faults`)."""
    kinds = set(FAULTS) - set(NOT_COUNTED_HERE)
    if not bounds.redis_faults:
        kinds.discard("redis_wipe")
    if not bounds.cancels_before_send:
        kinds.discard("cancel_before_send")
    return tuple(sorted(kinds))


def required_kinds(bounds: Bounds) -> tuple[str, ...]:
    """The count keys (`RunStats.faults`) the gate requires: fault kinds, then lost replies."""
    return fault_kinds(bounds) + tuple(f"{DROPPED}{c}" for c in losable_commands())


@dataclass
class CountGate:
    """A coverage gate's verdict: the counts of the kinds it requires, the least each needed,
    and what falls short. Shared with the refusal gate (`refusal_aiming.RefusalCoverage`)."""

    counts: dict[str, int]
    minimum: int
    #: one line per shortfall, beginning with its kind (`count_lines`, `count_html` mark it):
    #: the kind, its count, and what it needed
    short: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.short


@dataclass(kw_only=True)
class Coverage(CountGate):
    """The counts of the fault kinds and lost replies a run requires, and what falls short."""

    ratio: int = RATIO
    #: the kinds the run aimed at again, alone, because its first examples left them short
    #: (`run.run_fault_coverage`)
    aimed_again: tuple[str, ...] = ()

    def aimed_again_line(self) -> str:
        """The line that says which kinds were aimed at again ("" if none was)."""
        if not self.aimed_again:
            return ""
        return f"aimed at again, alone: {', '.join(self.aimed_again)}"

    def short_kinds(self) -> tuple[str, ...]:
        """The kinds that fall short, in the order of `counts`."""
        marked = _short_kinds(self.short)
        return tuple(k for k in self.counts if k in marked)

    def summary(self) -> str:
        """One line: the verdict and, if it fails, every shortfall."""
        if self.ok:
            least = min(self.counts.items(), key=lambda kv: kv[1], default=("-", 0))
            return (
                f"{len(self.counts)} kinds, each at least {self.minimum} times "
                f"(fewest: {least[0]} {least[1]})"
            )
        return "fault coverage short: " + "; ".join(self.short)


def judge(
    counts: Mapping[str, int],
    kinds: Sequence[str],
    minimum: int = MINIMUM,
    ratio: int = RATIO,
    reference: int | None = None,
) -> Coverage:
    """The gate: each of `kinds` at least `minimum` times in `counts`, and each lost reply at
    least a `ratio`-th of the take's (or of `reference`, the take's count to judge by: the one
    before kinds were aimed at again)."""
    own = {k: int(counts.get(k, 0)) for k in kinds}
    cov = Coverage(own, minimum, ratio=ratio)
    if reference is None:
        reference = own.get(REFERENCE, 0)
    for k, n in own.items():
        if n < minimum:
            cov.short.append(f"{k} fired {n} times, fewer than the minimum {minimum}")
        elif k.startswith(DROPPED) and k != REFERENCE and n * ratio < reference:
            cov.short.append(
                f"{k} fired {n} times, less than 1/{ratio} of {REFERENCE}'s {reference}"
            )
    return cov


def coverage_lines(cov: Coverage) -> list[str]:
    """The terminal report's section: every kind's count, marked where it falls short."""
    return count_lines(
        f"fault coverage (each kind >= {cov.minimum}, each lost reply >= "
        f"1/{cov.ratio} of {REFERENCE})",
        cov.counts,
        cov.short,
    )


def coverage_html(cov: Coverage) -> str:
    return count_html(
        "Fault coverage",
        f"each kind at least {cov.minimum} times, each lost "
        f"reply at least 1/{cov.ratio} of {REFERENCE}",
        cov.counts,
        cov.short,
    )


def _short_kinds(short: Sequence[str]) -> set[str]:
    """The kinds named by a gate's shortfall lines (each line begins with its kind)."""
    return {line.split(" ", 1)[0] for line in short}


def count_lines(heading: str, counts: Mapping[str, int], short: Sequence[str]) -> list[str]:
    """A coverage gate's terminal section: `heading` and the verdict, then every kind's count,
    marked where it falls short (`short`: the gate's shortfall lines). Shared with the refusal
    gate (`refusal_aiming.coverage_lines`)."""
    lines = [f"{heading}: {'NOT MET' if short else 'met'}"]
    marked = _short_kinds(short)
    for k, n in counts.items():
        lines.append(f"    {k:32} {n:8,}" + ("   <- short" if k in marked else ""))
    return lines


def count_html(
    title: str, requirement: str, counts: Mapping[str, int], short: Sequence[str]
) -> str:
    """A coverage gate's HTML section: `title`, what it requires and the verdict, and a table of
    every kind's count, marked where it falls short. Shared with the refusal gate."""
    e = html.escape
    marked = _short_kinds(short)
    rows = "".join(
        f'<tr><td>{e(k)}</td><td class="num">{n:,}</td>'
        f"<td>{'short' if k in marked else ''}</td></tr>"
        for k, n in counts.items()
    )
    verdict = "NOT MET: " + "; ".join(short) if short else "met"
    return f"<h2>{title}</h2><p>{e(requirement)}: {e(verdict)}</p><table>{rows}</table>"
