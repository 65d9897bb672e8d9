"""The report of a verification run: plain text for the terminal, and a self-contained HTML page
(inline CSS and SVG, no external assets) that draws each counterexample as a sequence diagram with
a lifeline per worker, per server process and for Redis."""

from __future__ import annotations

import html
from dataclasses import dataclass

from taskcustody_model.checker import Trace
from taskcustody_model.trace import describe_action, describe_state

from .harness import StepRecord, actor_of
from .run import Result

# -- the steps of a counterexample, in one shape for both sources ---------------------------------


@dataclass(frozen=True)
class DiagramStep:
    index: int
    actor: str  # lifeline: "s0#1 w0", "s0#1", "s0" (a claim), "" (the clock)
    label: str  # what happened, short ("take", "release")
    text: str  # the numbered step in words
    kind: str  # "command" | "lost" | "crash" | "note" | "clock"


_NOTES = {"stall_server": "stall [fault]", "resume_server": "resume",
          "restart_worker": "restart (supervisor)"}


def _kind_and_label(name: str, command: str) -> tuple[str, str]:
    if name == "dropped_reply":
        return "lost", command
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
        out.append(DiagramStep(s.index, s.actor, label, s.text, kind))
    return out


def from_trace(trace: Trace) -> list[DiagramStep]:
    out = []
    before = trace.initial
    for n, step in enumerate(trace.steps, 1):
        kind, label = _kind_and_label(step.action.name, step.action.command)
        out.append(DiagramStep(n, actor_of(step.action, before), label,
                               describe_action(step.action, before), kind))
        before = step.state
    return out


def numbered(steps: list[DiagramStep]) -> list[str]:
    return [f"{s.index:3}. {s.text}" for s in steps]


# -- text -----------------------------------------------------------------------------------------


def verdict(result: Result) -> str:
    variant = result.options.variant
    if result.ok and result.partial:
        return ("PARTIAL: nothing failed in what was covered, but the time budget cut the run "
                "short (see parts)")
    if result.ok:
        return "VERIFIED: every property held in every state and step explored"
    if variant != "correct":
        return f"VIOLATION FOUND in the broken design {variant!r} (as it should be)"
    return "VIOLATION FOUND: a property failed (see the counterexample)"


def text_report(result: Result) -> str:
    o = result.options
    lines = [f"taskcustody verify -- {verdict(result)}", ""]
    server = result.versions.get("server", result.backend)
    where = f" at {o.redis_url}" if o.redis_url else ""
    lines.append(f"design:        {o.variant}" + (" (with the prefetching worker)"
                                                     if o.prefetch else ""))
    lines.append(f"backend:       {server}{where}")
    m = result.model
    if m is not None:
        b = m.bounds
        status = "all properties hold" if m.ok else f"VIOLATED: {m.property}"
        lines.append(
            f"model check:   tasks={b.tasks} servers={b.servers} workers={b.workers} "
            f"faults={b.faults}: {m.distinct_states:,} states explored ({m.states_generated:,} "
            f"generated), depth {m.depth}, {result.model_seconds:.1f} s -- {status}")
    if o.stateful:
        s = result.stats
        b = o.stateful_bounds
        lines.append(
            f"stateful run:  tasks={b.tasks} servers={b.servers} workers={b.workers} "
            f"faults<={b.faults} per example; {s.examples:,} examples, {s.steps:,} steps "
            f"({s.recovery_steps:,} of them recovery), {result.steps_per_second:,.0f} steps/s, "
            f"{result.stateful_seconds:.1f} s"
            + (f", seed {o.seed}" if o.seed is not None else ", derandomized"))
        faults = sorted(s.faults.items())
        lines.append("faults injected by kind:" + ("" if faults else " none"))
        for kind, n in faults:
            lines.append(f"  {kind:32} {n:8,}")
        scope = "the failing example" if result.failure else "all examples, after recovery"
        lines.append(f"counts ({scope}):")
        for k, v in result.counts.items():
            lines.append(f"  {k:32} {v:8,}")
    lines.append(f"time:          {result.seconds:.1f} s")
    lines.append("versions:      " + ", ".join(
        f"{k} {v}" for k, v in result.versions.items() if k != "server"))
    if m is not None and m.violation is not None:
        lines += ["", f"model checker's counterexample ({len(m.violation)} steps, shortest):",
                  f"  property violated: {m.violation.property}: {m.violation.message}",
                  "    0. initial state"]
        lines += ["  " + x for x in numbered(from_trace(m.violation))]
        last = m.violation.steps[-1].state if m.violation.steps else m.violation.initial
        lines.append("  state after the last step:")
        lines.append(describe_state(last, indent="    "))
        if m.violation.eventual:
            lines.append("  then faults stop: no sequence of protocol steps recovers every task")
    f = result.failure
    if f is not None:
        lines += ["", f"stateful run's counterexample ({len(f.steps)} steps, shrunk), "
                      "on the real implementation:",
                  f"  {f.kind}: {f.message}", "    0. setup: tasks enqueued, servers claimed, "
                                                 "workers registered"]
        lines += ["  " + x for x in numbered(from_records(f.steps))]
    if not result.ok:
        lines += ["", f"reproduce: {o.command()}"]
    lines += ["", f"verdict: {verdict(result)}"]
    return "\n".join(lines)


# -- the sequence diagram -------------------------------------------------------------------------

_COL = 150
_ROW = 34
_TOP = 56
_LEFT = 20


def _lifelines(steps: list[DiagramStep]) -> list[str]:
    actors = {s.actor for s in steps}

    def key(a: str) -> tuple[int, int, int, int]:
        if a == "":
            return (-1, 0, 0, 0)
        server, _, rest = a.partition("#")
        inc, _, worker = rest.partition(" w")
        return (int(server[1:]), int(inc) if inc else -1, 1 if worker else 0,
                int(worker) if worker else -1)

    return [*sorted(actors, key=key), "Redis"]


def _lifeline_title(a: str) -> tuple[str, str]:
    if a == "Redis":
        return "Redis", "queue, lists, records"
    if a == "":
        return "clock", "ManualClock"
    server, _, rest = a.partition("#")
    inc, _, worker = rest.partition(" w")
    if worker:
        return f"worker {worker}", f"server {server[1:]}, inc. {inc}"
    if inc:
        return f"server {server[1:]}", f"incarnation {inc}"
    return f"server {server[1:]}", "(claiming its id)"


def sequence_svg(steps: list[DiagramStep], title: str = "") -> str:
    lanes = _lifelines(steps)
    x = {a: _LEFT + _COL // 2 + i * _COL for i, a in enumerate(lanes)}
    width = _LEFT * 2 + _COL * len(lanes)
    height = _TOP + _ROW * (len(steps) + 1) + 10
    redis_x = x["Redis"]
    e = html.escape
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12" '
        f'role="img" aria-label="{e(title or "sequence diagram")}">',
        '<defs><marker id="arr" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#333"/></marker></defs>',
    ]
    for a in lanes:
        name, sub = _lifeline_title(a)
        cx = x[a]
        fill = "#fde2e2" if a == "Redis" else "#e8eefc"
        out.append(f'<rect x="{cx - 62}" y="6" width="124" height="38" rx="4" fill="{fill}" '
                   'stroke="#555"/>')
        out.append(f'<text x="{cx}" y="22" text-anchor="middle" font-weight="bold">'
                   f'{e(name)}</text>')
        out.append(f'<text x="{cx}" y="37" text-anchor="middle" font-size="10" fill="#555">'
                   f'{e(sub)}</text>')
        out.append(f'<line x1="{cx}" y1="44" x2="{cx}" y2="{height - 6}" stroke="#999" '
                   'stroke-dasharray="4 3"/>')
    for row, s in enumerate(steps):
        y = _TOP + _ROW * row + _ROW // 2
        ax = x[s.actor]
        label = f"{s.index}. {s.label}"
        tip = f"<title>{e(s.text)}</title>"
        if s.kind in ("command", "lost"):
            end = redis_x - 4 if redis_x > ax else redis_x + 4
            out.append(f'<g>{tip}<line x1="{ax}" y1="{y}" x2="{end}" y2="{y}" stroke="#333" '
                       'marker-end="url(#arr)"/>')
            out.append(f'<text x="{(ax + redis_x) // 2}" y="{y - 5}" text-anchor="middle">'
                       f'{e(label)}</text></g>')
            if s.kind == "lost":
                mid = (ax + redis_x) // 2
                yy = y + 10
                out.append(f'<g>{tip}<line x1="{redis_x}" y1="{yy}" x2="{mid}" y2="{yy}" '
                           'stroke="#c00" stroke-dasharray="5 3"/>')
                out.append(f'<path d="M{mid - 5},{yy - 5} L{mid + 5},{yy + 5} M{mid - 5},'
                           f'{yy + 5} L{mid + 5},{yy - 5}" stroke="#c00" stroke-width="2"/>')
                out.append(f'<text x="{mid - 10}" y="{yy + 4}" text-anchor="end" fill="#c00" '
                           'font-size="11">reply lost [fault]</text></g>')
        elif s.kind == "crash":
            out.append(f'<g>{tip}<path d="M{ax - 8},{y - 8} L{ax + 8},{y + 8} M{ax - 8},{y + 8} '
                       f'L{ax + 8},{y - 8}" stroke="#c00" stroke-width="3"/>')
            out.append(f'<text x="{ax + 12}" y="{y + 4}" fill="#c00">{e(label)}</text></g>')
        elif s.kind == "clock":
            out.append(f'<g>{tip}<rect x="{_LEFT}" y="{y - 10}" width="{width - 2 * _LEFT}" '
                       'height="20" fill="#f2f2f2" stroke="#bbb"/>')
            out.append(f'<text x="{width // 2}" y="{y + 4}" text-anchor="middle" '
                       f'font-style="italic">{e(label)}</text></g>')
        else:  # a note on the actor's lifeline (stall, resume, restart, the handler)
            fill = "#fff4c2" if s.kind == "note" else "#e6f5e6"
            out.append(f'<g>{tip}<rect x="{ax - 64}" y="{y - 10}" width="128" height="20" '
                       f'rx="3" fill="{fill}" stroke="#aa9"/>')
            out.append(f'<text x="{ax}" y="{y + 4}" text-anchor="middle">{e(label)}</text></g>')
    out.append("</svg>")
    return "\n".join(out)


# -- HTML -----------------------------------------------------------------------------------------

_CSS = """
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 1200px; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
.ok { color: #070; } .bad { color: #b00; }
table { border-collapse: collapse; margin: .5em 0; }
td, th { border: 1px solid #ccc; padding: 3px 10px; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f6f6f6; padding: .8em; overflow-x: auto; }
.diagram { overflow-x: auto; border: 1px solid #ddd; padding: .5em; }
"""


def _table(rows: list[tuple[str, str]], numeric: bool = False) -> str:
    cls = ' class="n"' if numeric else ""
    body = "".join(f"<tr><th>{html.escape(k)}</th><td{cls}>{html.escape(v)}</td></tr>"
                   for k, v in rows)
    return f"<table>{body}</table>"


def html_report(result: Result) -> str:
    o = result.options
    e = html.escape
    cls = "ok" if result.ok else "bad"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>taskcustody verify: {e(o.variant)}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>taskcustody verify</h1>",
        f'<p class="{cls}"><strong>{e(verdict(result))}</strong></p>',
    ]
    overview: list[tuple[str, str]] = [
        ("design", o.variant),
        ("backend", result.versions.get("server", result.backend)
         + (f" at {o.redis_url}" if o.redis_url else "")),
        ("command", o.command()),
        ("total time", f"{result.seconds:.1f} s"),
    ]
    m = result.model
    if m is not None:
        b = m.bounds
        overview += [
            ("model check bounds", f"tasks={b.tasks} servers={b.servers} workers={b.workers} "
                                   f"faults={b.faults}"),
            ("states explored", f"{m.distinct_states:,} distinct, {m.states_generated:,} "
                                f"generated, depth {m.depth}, {result.model_seconds:.1f} s"),
            ("model check verdict", "all properties hold" if m.ok else f"{m.property} violated"),
        ]
    if o.stateful:
        s = result.stats
        overview += [
            ("stateful examples", f"{s.examples:,}"),
            ("stateful steps", f"{s.steps:,} ({s.recovery_steps:,} recovery), "
                               f"{result.steps_per_second:,.0f} steps/s, "
                               f"{result.stateful_seconds:.1f} s"),
        ]
    parts += ["<h2>Run</h2>", _table(overview)]
    if o.stateful:
        parts += ["<h2>Faults injected, by kind</h2>",
                  _table([(k, f"{v:,}") for k, v in sorted(result.stats.faults.items())],
                         numeric=True)]
        scope = "the failing example" if result.failure else "all examples, after recovery"
        parts += [f"<h2>Counts ({e(scope)})</h2>",
                  _table([(k, f"{v:,}") for k, v in result.counts.items()], numeric=True)]
    parts += ["<h2>Versions</h2>", _table(sorted(result.versions.items()))]
    if m is not None and m.violation is not None:
        steps = from_trace(m.violation)
        last = m.violation.steps[-1].state if m.violation.steps else m.violation.initial
        parts += [
            f"<h2>Model checker's counterexample ({len(steps)} steps, shortest)</h2>",
            f"<p>{e(m.violation.property)}: {e(m.violation.message)}</p>",
            f'<div class="diagram">{sequence_svg(steps, "model counterexample")}</div>',
            "<pre>" + e("\n".join(["  0. initial state", *numbered(steps),
                                   "state after the last step:",
                                   describe_state(last)])) + "</pre>",
        ]
    f = result.failure
    if f is not None:
        steps = from_records(f.steps)
        parts += [
            f"<h2>Stateful run's counterexample ({len(steps)} steps, shrunk)</h2>",
            f"<p>{e(f.kind)}: {e(f.message)}</p>",
            f'<div class="diagram">{sequence_svg(steps, "stateful counterexample")}</div>',
            "<pre>" + e("\n".join(["  0. setup: tasks enqueued, servers claimed, workers "
                                   "registered", *numbered(steps)])) + "</pre>",
            f"<p>Reproduce: <code>{e(o.command())}</code></p>",
        ]
    parts.append("</body></html>")
    return "\n".join(parts)
