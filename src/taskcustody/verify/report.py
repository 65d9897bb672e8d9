"""The report of a verification run: the counterexamples in one shape for both sources (the
model check and the stateful run), and the plain text for the terminal. The HTML page is
`report_html.py`."""

from __future__ import annotations

from dataclasses import dataclass

from taskcustody_model.checker import Trace
from taskcustody_model.state import initial_state
from taskcustody_model.trace import describe_action

from . import narrate
from .backends import REAL_SERVER_ONLY, REAL_SERVER_TESTS, how_to_cover
from .embedded import NoServerBinary, redis_server_binary
from .fault_coverage import coverage_lines
from .harness import StepRecord, actor_of
from .refusal_aiming import coverage_lines as refusal_coverage_lines
from .run import Failure, Result
from .seeding import DEFAULT_SEED

# -- the steps of a counterexample, in one shape for both sources ---------------------------------


@dataclass(frozen=True)
class DiagramStep:
    index: int
    actor: str  # lifeline: "s0#1 w0", "s0#1", "s0" (a claim), "" (the clock)
    label: str  # what happened, short ("take", "release")
    text: str  # the numbered step in words
    kind: str  # "command" | "lost" | "crash" | "note" | "clock"


_NOTES = {
    "stall_server": "stall [fault]",
    "resume_server": "resume",
    "restart_worker": "restart (supervisor)",
}


def _kind_and_label(name: str, command: str) -> tuple[str, str]:
    if name == "dropped_reply":
        return "lost", command
    if name == "cancel_before_send":
        return "lost", f"{command} (cancelled before the send)"
    if name in ("crash_worker", "crash_server"):
        return "crash", "crash [fault]"
    if name in _NOTES:
        return "note", _NOTES[name]
    if name == "advance_clock":
        return "clock", "clock advances one tick"
    return "command", name


def from_records(steps: list[StepRecord]) -> list[DiagramStep]:
    out = []
    for s in steps:
        kind, label = _kind_and_label(s.action.name, s.action.command)
        label += " (recovery)" if s.recovery else ""
        out.append(DiagramStep(s.index, s.actor, label, s.text, kind))
    return out


def from_trace(trace: Trace) -> list[DiagramStep]:
    out = []
    before = trace.initial
    for n, step in enumerate(trace.steps, 1):
        kind, label = _kind_and_label(step.action.name, step.action.command)
        out.append(
            DiagramStep(
                n, actor_of(step.action, before), label, describe_action(step.action, before), kind
            )
        )
        before = step.state
    return out


# -- the counterexamples, in words (narrate.py), for both layouts ------------------------------


@dataclass(frozen=True)
class Counterexample:
    """One counterexample as the report shows it."""

    anchor: str  # the HTML section's id
    title: str
    broken: narrate.Broken
    start: str  # step 0 in words
    start_state: list[str]
    start_note: str
    steps: list[narrate.Step]
    diagram: list[DiagramStep]
    faults: dict[str, int]  # the faults of this counterexample alone, by kind
    counts: dict[str, int]  # tallies of this example (empty: none)
    end: str = ""  # what follows the last step (a model trace's eventual violation)


def model_counterexample(trace: Trace) -> Counterexample:
    steps = narrate.from_trace(trace)
    return Counterexample(
        "model-counterexample",
        f"model checker's counterexample ({_steps(len(steps))}, shortest)",
        narrate.broken(trace.property, trace.message, steps[-1] if steps else None),
        "initial state",
        narrate.describe(trace.initial),
        "",
        steps,
        from_trace(trace),
        narrate.faults_by_kind(step.action for step in trace.steps),
        {},
        "then faults stop: no sequence of protocol steps recovers every task"
        if trace.eventual
        else "",
    )


def stateful_counterexample(result: Result, f: Failure) -> Counterexample:
    steps = narrate.from_records(f.steps)
    return Counterexample(
        "stateful-counterexample",
        f"stateful run's counterexample ({_steps(len(steps))}, shrunk), on the real implementation",
        narrate.broken(f.kind, f.message, steps[-1] if steps else None),
        "setup: tasks enqueued, servers claimed, workers registered",
        narrate.describe(initial_state(result.options.stateful_bounds)),
        "Redis matched the model",
        steps,
        from_records(f.steps),
        # (no tallies: the failing state could not be read back as a whole)
        narrate.faults_by_kind(s.action for s in f.steps),
        result.counts if f.tallies else {},
    )


def _steps(n: int) -> str:
    return f"{n} step" + ("" if n == 1 else "s")


def counterexamples(result: Result) -> list[Counterexample]:
    out = []
    m = result.model
    if m is not None and m.violation is not None:
        out.append(model_counterexample(m.violation))
    if result.failure is not None:
        out.append(stateful_counterexample(result, result.failure))
    return out


def _faults_line(faults: dict[str, int]) -> str:
    if not faults:
        return "none: the property broke on the protocol's own steps"
    return ", ".join(f"{k} x{v}" if v > 1 else k for k, v in faults.items())


def _counts_line(counts: dict[str, int]) -> str:
    return "counts in this example (read from Redis when it ended): " + ", ".join(
        f"{k} {v}" for k, v in counts.items()
    )


def _indented(lines: list[str], pad: str) -> list[str]:
    return [pad + x for x in lines]


def counterexample_text(c: Counterexample) -> list[str]:
    b = c.broken
    lines = [c.title + ":", f"  property broken: {b.property}" + (f" ({b.side})" if b.side else "")]
    lines += _indented(b.message, "    ")
    lines += [
        f"    why it matters: {b.why}",
        f"  faults in this counterexample: {_faults_line(c.faults)}",
    ]
    if c.counts:
        lines.append("  " + _counts_line(c.counts))
    lines.append(f"  0. {c.start}")
    lines.append("       state" + (f" ({c.start_note})" if c.start_note else "") + ":")
    lines += _indented(c.start_state, "         ")
    for n, s in enumerate(c.steps):
        if s.recovery and (n == 0 or not c.steps[n - 1].recovery):
            lines.append(f"  -- {narrate.RECOVERY_STARTS} --")
        lines.append(f"  {s.index}. {s.text}" + ("  [recovery]" if s.recovery else ""))
        lines.append(f"       fault: {s.fault or 'none'}")
        if s.model is None:
            lines.append(
                "       state: not read back after this step (a step inside a pass, "
                "or the step itself failed)"
            )
            continue
        lines.append("       state after it" + (", the model's:" if s.real is not None else ":"))
        lines += _indented(s.model, "         ")
        if s.real is None:
            continue
        if not s.difference:
            lines.append("       as read from Redis: the same")
            continue
        lines.append("       as read from Redis:")
        lines += _indented(s.real, "         ")
        lines.append("       how Redis differs from the model:")
        lines += _indented(s.difference, "         ")
    if c.end:
        lines.append(f"  {len(c.steps) + 1}. {c.end}")
    return lines


# -- what a fakeredis run cannot see (backends.py) -----------------------------------------------

BLIND_SPOTS_TITLE = "what this run cannot see on fakeredis, and how to cover it"


def blind_spots(result: Result) -> list[tuple[str, list[str]]]:
    """A fakeredis run's blind spots (backends.py), in two groups: what this run catches on a
    real server, with the command that covers it, and what only the repository's real-server
    tests cover; each a heading and its lines. [] for a run on a real server or without the
    stateful part."""
    if result.options.redis_url is not None or not result.options.stateful:
        return []
    try:
        binary = redis_server_binary()
    except NoServerBinary:
        binary = None
    reached = [f"{row.name}: {row.what} ({row.why})" for row in REAL_SERVER_ONLY if row.in_verify]
    tests_only = [
        f"{row.name} ({row.why}): "
        + ", ".join(dict.fromkeys(t.partition("::")[0] for t in row.tests))
        for row in REAL_SERVER_ONLY
        if not row.in_verify
    ]
    return [
        (f"caught by this run on a real server; {how_to_cover(binary)}", reached),
        (
            f"beyond this run, covered by the repository's real-server tests ({REAL_SERVER_TESTS})",
            tests_only,
        ),
    ]


# -- text -----------------------------------------------------------------------------------------


def verdict(result: Result) -> str:
    variant = result.options.variant
    if result.ok and result.partial:
        return (
            "PARTIAL: nothing failed in what was covered, but the time budget cut the run "
            "short (see parts)"
        )
    if result.ok:
        return "VERIFIED: every property held in every state and step explored"
    if (
        result.model_ok
        and result.failure is None
        and result.coverage is not None
        and not result.coverage.ok
    ):
        return (
            "FAULT COVERAGE NOT MET: every property held, but some fault kinds fired too "
            "rarely to count as checked (see fault coverage)"
        )
    if (
        result.model_ok
        and result.failure is None
        and result.refusal_coverage is not None
        and not result.refusal_coverage.ok
    ):
        return (
            "REFUSAL COVERAGE NOT MET: every property held, but some kinds of attempt the "
            "model refuses were made too rarely to count as checked (see refusal coverage)"
        )
    if variant != "correct":
        return f"VIOLATION FOUND in the broken design {variant!r} (as it should be)"
    return "VIOLATION FOUND: a property failed (see the counterexample)"


def totals_title(result: Result) -> str:
    n = result.stats.examples
    return (
        f"totals over all {n:,} example"
        + ("" if n == 1 else "s")
        + " of the stateful run"
        + (", not only the counterexample's" if result.failure else "")
    )


def _where(result: Result) -> str:
    url = result.options.redis_url
    if url and result.options.embedded:
        return f" (embedded: a throwaway server at {url}, stopped at the end)"
    return f" at {url}" if url else ""


def text_report(result: Result) -> str:
    o = result.options
    lines = [f"taskcustody verify -- {verdict(result)}", ""]
    server = result.versions.get("server", result.backend)
    where = _where(result)
    lines.append(
        f"design:        {o.variant}"
        + (" (with the prefetching worker)" if o.prefetch else "")
        + (" (with the asyncio worker)" if o.asyncio else "")
    )
    lines.append(f"backend:       {server}{where}")
    m = result.model
    if m is not None:
        b = m.bounds
        status = "all properties hold" if m.ok else f"VIOLATED: {m.property}"
        lines.append(
            f"model check:   tasks={b.tasks} servers={b.servers} workers={b.workers} "
            f"faults={b.faults}: {m.distinct_states:,} states explored ({m.states_generated:,} "
            f"generated), depth {m.depth}, {result.model_seconds:.1f} s -- {status}"
        )
    if o.stateful:
        s = result.stats
        b = o.stateful_bounds
        lines.append(
            f"stateful run:  tasks={b.tasks} servers={b.servers} workers={b.workers} "
            f"faults<={b.faults} per example; {s.examples:,} examples, {s.steps:,} steps "
            f"({s.recovery_steps:,} of them recovery), {result.steps_per_second:,.0f} steps/s, "
            f"{result.stateful_seconds:.1f} s"
            + (f", seed {o.seed}" if o.seed is not None else f", seed {DEFAULT_SEED}")
        )
    lines.append(f"time:          {result.seconds:.1f} s")
    lines.append(
        "versions:      "
        + ", ".join(f"{k} {v}" for k, v in result.versions.items() if k != "server")
    )
    for c in counterexamples(result):
        lines += ["", *counterexample_text(c)]
    if o.stateful:
        faults = sorted(result.stats.faults.items())
        lines += [
            "",
            totals_title(result) + ":",
            "  faults injected by kind:" + ("" if faults else " none"),
        ]
        lines += [f"    {kind:32} {n:8,}" for kind, n in faults]
        refused = sorted(result.stats.refusals.items())
        if refused:
            lines.append("  attempts the model refuses, made and refused, by kind:")
            lines += [f"    {kind:32} {n:8,}" for kind, n in refused]
        if result.failure is None:
            lines.append("  counts (all examples, after recovery):")
            lines += [f"    {k:32} {v:8,}" for k, v in result.counts.items()]
    if result.refusal_coverage is not None:
        lines += ["", *refusal_coverage_lines(result.refusal_coverage)]
    if result.coverage is not None:
        lines += ["", *coverage_lines(result.coverage)]
    if o.stateful:
        lines += ["", *result.protocol_log.lines()]
    spots = blind_spots(result)
    if spots:
        lines += ["", BLIND_SPOTS_TITLE + ":"]
        for heading, items in spots:
            lines += [f"  {heading}:", *(f"    - {x}" for x in items)]
    if not result.ok:
        lines += ["", f"reproduce: {o.command()}"]
    lines += ["", f"verdict: {verdict(result)}"]
    return "\n".join(lines)


# -- the sequence diagram -------------------------------------------------------------------------
