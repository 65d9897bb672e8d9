"""The HTML page of a verification run: self-contained (inline CSS and SVG, no external assets),
each counterexample drawn as a sequence diagram with a lifeline per worker, per server process and
for Redis. The plain-text report and the shapes both share are in `report.py`."""

from __future__ import annotations

import html

from . import narrate
from .fault_coverage import coverage_html
from .refusal_aiming import coverage_html as refusal_coverage_html
from .report import (
    BLIND_SPOTS_TITLE,
    Counterexample,
    DiagramStep,
    _counts_line,
    _faults_line,
    _where,
    blind_spots,
    counterexamples,
    totals_title,
    verdict,
)
from .run import Result

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
        return (
            int(server[1:]),
            int(inc) if inc else -1,
            1 if worker else 0,
            int(worker) if worker else -1,
        )

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
        out.append(
            f'<rect x="{cx - 62}" y="6" width="124" height="38" rx="4" fill="{fill}" '
            'stroke="#555"/>'
        )
        out.append(
            f'<text x="{cx}" y="22" text-anchor="middle" font-weight="bold">{e(name)}</text>'
        )
        out.append(
            f'<text x="{cx}" y="37" text-anchor="middle" font-size="10" fill="#555">{e(sub)}</text>'
        )
        out.append(
            f'<line x1="{cx}" y1="44" x2="{cx}" y2="{height - 6}" stroke="#999" '
            'stroke-dasharray="4 3"/>'
        )
    for row, s in enumerate(steps):
        y = _TOP + _ROW * row + _ROW // 2
        ax = x[s.actor]
        label = f"{s.index}. {s.label}"
        tip = f"<title>{e(s.text)}</title>"
        if s.kind in ("command", "lost"):
            end = redis_x - 4 if redis_x > ax else redis_x + 4
            out.append(
                f'<g>{tip}<line x1="{ax}" y1="{y}" x2="{end}" y2="{y}" stroke="#333" '
                'marker-end="url(#arr)"/>'
            )
            out.append(
                f'<text x="{(ax + redis_x) // 2}" y="{y - 5}" text-anchor="middle">'
                f"{e(label)}</text></g>"
            )
            if s.kind == "lost":
                mid = (ax + redis_x) // 2
                yy = y + 10
                out.append(
                    f'<g>{tip}<line x1="{redis_x}" y1="{yy}" x2="{mid}" y2="{yy}" '
                    'stroke="#c00" stroke-dasharray="5 3"/>'
                )
                out.append(
                    f'<path d="M{mid - 5},{yy - 5} L{mid + 5},{yy + 5} M{mid - 5},'
                    f'{yy + 5} L{mid + 5},{yy - 5}" stroke="#c00" stroke-width="2"/>'
                )
                out.append(
                    f'<text x="{mid - 10}" y="{yy + 4}" text-anchor="end" fill="#c00" '
                    'font-size="11">reply lost [fault]</text></g>'
                )
        elif s.kind == "crash":
            out.append(
                f'<g>{tip}<path d="M{ax - 8},{y - 8} L{ax + 8},{y + 8} M{ax - 8},{y + 8} '
                f'L{ax + 8},{y - 8}" stroke="#c00" stroke-width="3"/>'
            )
            out.append(f'<text x="{ax + 12}" y="{y + 4}" fill="#c00">{e(label)}</text></g>')
        elif s.kind == "clock":
            out.append(
                f'<g>{tip}<rect x="{_LEFT}" y="{y - 10}" width="{width - 2 * _LEFT}" '
                'height="20" fill="#f2f2f2" stroke="#bbb"/>'
            )
            out.append(
                f'<text x="{width // 2}" y="{y + 4}" text-anchor="middle" '
                f'font-style="italic">{e(label)}</text></g>'
            )
        else:  # a note on the actor's lifeline (stall, resume, restart, the handler)
            fill = "#fff4c2" if s.kind == "note" else "#e6f5e6"
            out.append(
                f'<g>{tip}<rect x="{ax - 64}" y="{y - 10}" width="128" height="20" '
                f'rx="3" fill="{fill}" stroke="#aa9"/>'
            )
            out.append(f'<text x="{ax}" y="{y + 4}" text-anchor="middle">{e(label)}</text></g>')
    out.append("</svg>")
    return "\n".join(out)


# -- HTML -----------------------------------------------------------------------------------------

_CSS = """
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 1200px; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
h3 { font-size: 1em; margin: .8em 0 .3em; }
.ok { color: #070; } .bad { color: #b00; }
table { border-collapse: collapse; margin: .5em 0; }
td, th { border: 1px solid #ccc; padding: 3px 10px; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.diagram { overflow-x: auto; border: 1px solid #ddd; padding: .5em; }
.property { border-left: 4px solid #b00; background: #fdf1f1; padding: .4em .9em; }
.property p { margin: .3em 0; } .why { font-style: italic; }
ol.steps { list-style: none; padding: 0; }
ol.steps > li { border: 1px solid #ddd; border-radius: 4px; margin: .6em 0; padding: .4em .8em; }
.action { font-weight: bold; } .num { color: #666; margin-right: .4em; }
.tag { font-weight: normal; font-size: .85em; background: #e6f0e6; border-radius: 3px;
  padding: 0 .4em; margin-left: .5em; }
ol.steps > li.phase { border: none; border-top: 2px dashed #7a7; border-radius: 0;
  color: #474; font-style: italic; }
.fault { margin: .2em 0; } .fault.some { color: #b00; } .fault.none { color: #666; }
.states { display: grid; grid-template-columns: 1fr 1fr; gap: .8em; }
.state { background: #f6f6f6; padding: .3em .7em; }
.state h4 { margin: .2em 0; font-size: .9em; color: #555; }
.state ul, .difference ul { margin: .2em 0; padding-left: 1.2em; }
.state li, .difference li { margin: .1em 0; }
li.meaning { list-style: none; font-weight: bold; color: #900; }
p.meaning { margin-left: 1.2em; font-weight: bold; color: #900; }
.difference { border-left: 4px solid #b00; background: #fdf1f1; padding: .3em .7em;
  margin-top: .4em; }
.difference h4 { margin: .2em 0; font-size: .9em; }
"""


def _table(rows: list[tuple[str, str]], numeric: bool = False) -> str:
    cls = ' class="n"' if numeric else ""
    body = "".join(
        f"<tr><th>{html.escape(k)}</th><td{cls}>{html.escape(v)}</td></tr>" for k, v in rows
    )
    return f"<table>{body}</table>"


def _items(lines: list[str]) -> str:
    """A list; an indented line (what the line above means) is set apart."""
    return (
        "<ul>"
        + "".join(
            f'<li class="meaning">{html.escape(x.strip())}</li>'
            if x.startswith(" ")
            else f"<li>{html.escape(x)}</li>"
            for x in lines
        )
        + "</ul>"
    )


def _state(title: str, lines: list[str], cls: str) -> str:
    return f'<div class="state {cls}"><h4>{html.escape(title)}</h4>{_items(lines)}</div>'


def _step_html(s: narrate.Step) -> str:
    e = html.escape
    cls, tag = (
        ("step recovery", ' <span class="tag">recovery</span>') if s.recovery else ("step", "")
    )
    out = [
        f'<li class="{cls}" data-step="{s.index}"><div class="action"><span class="num">'
        f"{s.index}.</span>{e(s.text)}{tag}</div>"
    ]
    if s.fault:
        out.append(f'<div class="fault some">fault: {e(s.fault)}</div>')
    else:
        out.append('<div class="fault none">fault: none</div>')
    if s.model is None:
        out.append(
            '<div class="state unread">state not read back after this step (a step '
            "inside a pass, or the step itself failed)</div>"
        )
    elif s.real is None:
        out.append(_state("state after it (the model's)", s.model, "model"))
    elif not s.difference:  # one state, full width: the two sides agree
        out.append(
            _state(
                "state after it, the model's (Redis read back the same)",
                s.model,
                "model redis same",
            )
        )
    else:  # side by side, then what differs
        out.append(
            '<div class="states">'
            + _state("state after it, the model's", s.model, "model")
            + _state("as read from Redis", s.real, "redis")
            + "</div>"
        )
        out.append(
            '<div class="difference"><h4>how Redis differs from the model</h4>'
            + _items(s.difference)
            + "</div>"
        )
    out.append("</li>")
    return "".join(out)


def counterexample_html(c: Counterexample) -> str:
    e = html.escape
    b = c.broken
    counts = f"<p>{e(_counts_line(c.counts))}</p>" if c.counts else ""
    out = [
        f'<section id="{c.anchor}" class="counterexample">',
        f"<h2>{e(c.title[0].upper() + c.title[1:])}</h2>",
        '<div class="property">',
        f'<p><strong>property broken: <span class="name">{e(b.property)}</span></strong>'
        + (f" ({e(b.side)})" if b.side else "")
        + "</p>",
        *(
            f'<p class="message meaning">{e(x.strip())}</p>'
            if x.startswith(" ")
            else f'<p class="message">{e(x)}</p>'
            for x in b.message
        ),
        f'<p class="why">why it matters: {e(b.why)}</p>',
        "</div>",
        f'<p class="faults">faults in this counterexample: {e(_faults_line(c.faults))}</p>',
        counts,
        f'<div class="diagram">{sequence_svg(c.diagram, c.title)}</div>',
        '<ol class="steps">',
        f'<li class="start"><div class="action"><span class="num">0.</span>{e(c.start)}</div>'
        + _state("state" + (f" ({c.start_note})" if c.start_note else ""), c.start_state, "model")
        + "</li>",
    ]
    for n, s in enumerate(c.steps):
        if s.recovery and (n == 0 or not c.steps[n - 1].recovery):
            out.append(f'<li class="phase">{e(narrate.RECOVERY_STARTS)}</li>')
        out.append(_step_html(s))
    if c.end:
        out.append(
            f'<li class="end"><div class="action"><span class="num">'
            f"{len(c.steps) + 1}.</span>{e(c.end)}</div></li>"
        )
    out += ["</ol>", "</section>"]
    return "\n".join(out)


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
        ("backend", result.versions.get("server", result.backend) + _where(result)),
        ("command", o.command()),
        ("total time", f"{result.seconds:.1f} s"),
    ]
    m = result.model
    if m is not None:
        b = m.bounds
        overview += [
            (
                "model check bounds",
                f"tasks={b.tasks} servers={b.servers} workers={b.workers} faults={b.faults}",
            ),
            (
                "states explored",
                f"{m.distinct_states:,} distinct, {m.states_generated:,} "
                f"generated, depth {m.depth}, {result.model_seconds:.1f} s",
            ),
            ("model check verdict", "all properties hold" if m.ok else f"{m.property} violated"),
        ]
    if o.stateful:
        s = result.stats
        overview += [
            ("stateful examples", f"{s.examples:,}"),
            (
                "stateful steps",
                f"{s.steps:,} ({s.recovery_steps:,} recovery), "
                f"{result.steps_per_second:,.0f} steps/s, "
                f"{result.stateful_seconds:.1f} s",
            ),
        ]
    parts += ['<section id="run"><h2>Run</h2>', _table(overview), "</section>"]
    parts += [counterexample_html(c) for c in counterexamples(result)]
    if not result.ok:
        parts.append(f"<p>Reproduce: <code>{e(o.command())}</code></p>")
    if o.stateful:
        title = totals_title(result)
        parts += [
            '<section id="totals">',
            f"<h2>{e(title[0].upper() + title[1:])}</h2>",
            "<h3>Faults injected, by kind</h3>",
            _table([(k, f"{v:,}") for k, v in sorted(result.stats.faults.items())], numeric=True)
            if result.stats.faults
            else "<p>none</p>",
        ]
        if result.stats.refusals:
            parts += [
                "<h3>Attempts the model refuses, made and refused, by kind</h3>",
                _table(
                    [(k, f"{v:,}") for k, v in sorted(result.stats.refusals.items())], numeric=True
                ),
            ]
        if result.failure is None:
            parts += [
                "<h3>Counts (all examples, after recovery)</h3>",
                _table([(k, f"{v:,}") for k, v in result.counts.items()], numeric=True),
            ]
        parts.append("</section>")
    if result.refusal_coverage is not None:
        parts += [
            '<section id="refusal-coverage">',
            refusal_coverage_html(result.refusal_coverage),
            "</section>",
        ]
    if result.coverage is not None:
        parts += ['<section id="fault-coverage">', coverage_html(result.coverage), "</section>"]
    if o.stateful:
        parts += ['<section id="protocol-log">', result.protocol_log.html(), "</section>"]
    spots = blind_spots(result)
    if spots:
        parts += [
            '<section id="blind-spots">',
            f"<h2>{e(BLIND_SPOTS_TITLE[0].upper() + BLIND_SPOTS_TITLE[1:])}</h2>",
            *(
                f"<h3>{e(heading[0].upper() + heading[1:])}</h3><ul>"
                + "".join(f"<li>{e(x)}</li>" for x in items)
                + "</ul>"
                for heading, items in spots
            ),
            "</section>",
        ]
    parts += [
        '<section id="versions"><h2>Versions</h2>',
        _table(sorted(result.versions.items())),
        "</section>",
        "</body></html>",
    ]
    return "\n".join(parts)
