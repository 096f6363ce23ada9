"""A self-contained HTML report of the predictions: nothing fetched (no network, no
fonts), one small inline script that makes the timelines zoomable.

The timelines are inline SVG with one lane per stream, one collapsible section
per distinct assignment (every K and policy asked for) and per bound; the
tables are the what-if grid (K x policy) and the stream assignment, which says
where XLA really runs each pair. A K predicted slower than a smaller one carries
its explanation, with the pairs that cause it, in its section.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from xla_streams.collectives import KINDS, format_groups
from xla_streams.simulate.timeline import SimResult, Slice, lane_name, runs_on
from xla_streams.simulate.trace import lanes_of
from xla_streams.simulate.whatif import WhatIf

# Fill colour of each slice kind; lanes alternate two pale backgrounds.
KIND_COLORS: dict[str, str] = {
    "matmul": "#4e79a7",
    "memory": "#a0cbe8",
    "async-compute": "#76b7b2",
    "wait": "#e15759",
    "repeat": "#bab0ac",
    **{kind.name: kind.color for kind in KINDS.values()},
}
OTHER_COLOR = "#888888"
LANE_BACKGROUNDS = ("#eef2f7", "#f8fafc")
LABEL_WIDTH = 170
PLOT_WIDTH = 1000
# Slices are placed on a grid this many times finer than the plot's pixels, so
# that zooming in (up to this factor) shows real detail, not stretched blocks;
# the zoom goes on to MAX_ZOOM, beyond which the Perfetto trace is the tool.
OVERSAMPLE = 8
MAX_ZOOM = 64
LANE_HEIGHT = 26
LANE_GAP = 4
AXIS_HEIGHT = 24
MIN_UNITS = 1.0  # slices narrower than this many grid units merge with their neighbours
MAX_TITLES = 4000
MAX_ASSIGNMENT_ROWS = 500

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px;
       color: #1f2933; background: #ffffff; }
h1 { font-size: 22px; margin: 0 0 4px 0; }
h2 { font-size: 17px; margin: 28px 0 8px 0; border-bottom: 1px solid #d9e2ec; padding-bottom: 4px; }
details { margin: 10px 0; }
summary { font-size: 14px; font-weight: 600; cursor: pointer; }
p.why { font-size: 13px; background: #fff8e1; border-left: 3px solid #f0b429; padding: 4px 8px; }
.sub { color: #52606d; margin: 0 0 16px 0; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; }
.card { border: 1px solid #d9e2ec; border-radius: 6px; padding: 10px 14px; min-width: 160px; }
.card .v { font-size: 20px; font-weight: 600; }
.card .k { color: #52606d; font-size: 12px; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #d9e2ec; padding: 3px 8px; text-align: right; }
th { background: #f0f4f8; }
td.l, th.l { text-align: left; }
th[colspan] { text-align: center; }
p.key { font-size: 12px; color: #52606d; }
table.assignment td { white-space: nowrap; }
tr.lb td { font-style: italic; }
.best { background: #e3f9e5; }
.legend span { display: inline-block; margin-right: 14px; font-size: 12px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px;
            vertical-align: -2px; border-radius: 2px; }
svg text { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
svg.timeline { cursor: grab; touch-action: none; }
.notes li { margin: 3px 0; }
footer { margin-top: 28px; color: #7b8794; font-size: 12px; }
"""

# Wheel over a timeline zooms around the pointer, dragging pans, a double click
# resets; the time axis is redrawn for the visible window. Each SVG carries its
# geometry in data- attributes (see timeline_svg). Marks each SVG data-zoom=ready.
_ZOOM_SCRIPT = """
(function () {
  function nice(raw) {
    var base = Math.pow(10, Math.floor(Math.log10(raw)));
    var steps = [1, 2, 5, 10];
    for (var i = 0; i < steps.length; i++) if (raw <= steps[i] * base) return steps[i] * base;
    return 10 * base;
  }
  function label(t, step) {
    return step >= 1e-3 ? +(t * 1e3).toFixed(6) + " ms" : +(t * 1e6).toFixed(3) + " us";
  }
  document.querySelectorAll("svg.timeline").forEach(function (svg) {
    var d = svg.dataset, left = +d.left, width = +d.width, res = +d.res, span = +d.span;
    var height = +d.height, top = +d.top, slices = svg.querySelector("g.slices");
    var axis = svg.querySelector("g.axis"), a = 0, b = res, drag = null;
    function draw() {
      slices.setAttribute("transform", "translate(" + left + ",0) scale(" + width / (b - a) +
                          ",1) translate(" + -a + ",0)");
      var t0 = a / res * span, t1 = b / res * span, step = nice((t1 - t0) / 8), out = [];
      for (var t = Math.ceil(t0 / step) * step; t <= t1 + step * 1e-9; t += step) {
        var x = (left + (t - t0) / (t1 - t0) * width).toFixed(2);
        out.push('<line x1="' + x + '" y1="' + (top - 6) + '" x2="' + x + '" y2="' + height +
                 '" stroke="#d9e2ec" stroke-width="1"/><text x="' + x + '" y="' + (top - 10) +
                 '" font-size="10" fill="#52606d" text-anchor="middle">' + label(t, step) +
                 "</text>");
      }
      axis.innerHTML = out.join("");
    }
    function plotX(e) {
      var box = svg.getBoundingClientRect();
      return (e.clientX - box.left) * svg.viewBox.baseVal.width / box.width - left;
    }
    function clamp() {
      var w = b - a;
      if (a < 0) { a = 0; b = w; }
      if (b > res) { b = res; a = res - w; }
    }
    svg.addEventListener("wheel", function (e) {
      var x = plotX(e);
      if (x < 0 || x > width) return;
      e.preventDefault();
      var u = a + x / width * (b - a);
      var w = Math.min(res, Math.max(res / +d.maxZoom, (b - a) * Math.exp(e.deltaY * 0.002)));
      a = u - (u - a) * w / (b - a);
      b = a + w;
      clamp();
      draw();
    }, {passive: false});
    svg.addEventListener("pointerdown", function (e) {
      drag = {x: plotX(e), a: a, b: b};
      svg.setPointerCapture(e.pointerId);
    });
    svg.addEventListener("pointermove", function (e) {
      if (!drag) return;
      var shift = (plotX(e) - drag.x) / width * (drag.b - drag.a);
      a = drag.a - shift;
      b = drag.b - shift;
      clamp();
      draw();
    });
    svg.addEventListener("pointerup", function () { drag = null; });
    svg.addEventListener("dblclick", function () { a = 0; b = res; draw(); });
    draw();
    svg.setAttribute("data-zoom", "ready");
  });
})();
"""


def render_html(
    what: WhatIf,
    timelines: Sequence[SimResult],
    title: str | None = None,
    trace_href: str | None = None,
) -> str:
    """The report; ``timelines`` are recorded results (``record=True``) to draw, and
    ``trace_href`` the (relative) address of their Perfetto trace, for a link."""
    esc = html.escape
    best = best_result(what)
    base = what.baseline
    communication = sum(1 for p in what.pairs if p.lane == "communication")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title or f'xla_streams prediction: {what.module}')}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>What multi-streaming buys: {esc(what.module)}</h1>",
        f'<p class="sub">Predicted for {esc(what.target.description)} (target '
        f"<code>{esc(what.target.name)}</code>); {len(what.pairs)} async collective pairs, "
        f"{communication} of them on collective streams.</p>",
        '<section class="cards">',
        _card(f"K={base.streams} (one stream, as XLA runs today)", _ms(base.step_time)),
        _card(
            f"best: {best.label}",
            f"{_ms(best.step_time)} ({_speedup(base.step_time, best.step_time)})",
        ),
        _card(what.rule_bound.label, _ms(what.rule_bound.step_time)),
        _card(what.lower_bound.label, _ms(what.lower_bound.step_time)),
        _card("compute only", _ms(base.compute_time)),
        _card("exposed communication at K=1", _ms(base.exposed_communication)),
        "</section>",
        "<h2>What if: predicted step time by number of streams K and policy</h2>",
        _what_if_table(what, best),
        "<h2>Timelines</h2>",
        _legend(timelines),
        '<p class="key">One section per distinct assignment and per bound; click a title to '
        "open or close it. Over a timeline, the mouse wheel zooms (up to "
        f"{MAX_ZOOM}x), dragging pans, a double click resets."
        + (
            f' Every instruction, at any zoom: the <a href="{esc(trace_href)}">Perfetto '
            "trace</a> (open it in ui.perfetto.dev).</p>"
            if trace_href
            else " Every instruction, at any zoom: write the Perfetto trace too "
            "(<code>--trace</code>) and open it in ui.perfetto.dev.</p>"
        ),
    ]
    # One time scale for every timeline, so that they compare at a glance.
    span = max((r.step_time for r in timelines), default=0.0)
    for i, result in enumerate(timelines):
        why = [what.explanations[c] for c in result.configs if c in what.explanations]
        opened = result is timelines[0] or best.configs[0] in result.configs or bool(why)
        parts.append(
            f"<details{' open' if opened else ''}><summary>{esc(result.label)}: step "
            f"{_ms(result.step_time)} ({_speedup(base.step_time, result.step_time)}), exposed "
            f"communication {_ms(result.exposed_communication)}</summary>"
        )
        parts.extend(f'<p class="why">{esc(w)}</p>' for w in why)
        parts.append(timeline_svg(result, span, i))
        parts.append("</details>")
    parts.append("<h2>Stream assignment</h2>")
    parts.append(_assignment_table(what))
    notes = list(what.notes) + what.non_monotone()
    if any(r.truncated for r in timelines):
        notes.append("a timeline was too long to draw completely: it is cut off")
    if notes:
        parts.append('<h2>Notes</h2><ul class="notes">')
        parts.extend(f"<li>{esc(n)}</li>" for n in notes)
        parts.append("</ul>")
    parts.append(
        "<footer>Cost model and constants: <code>xla_streams/simulate/cost.py</code>, "
        "<code>xla_streams/simulate/targets.py</code>. Sources: "
        + "; ".join(esc(s) for s in what.target.sources)
        + f".</footer><script>{_ZOOM_SCRIPT}</script></body></html>"
    )
    return "\n".join(parts)


def best_result(what: WhatIf) -> SimResult:
    """The fastest configuration; ties go to fewer streams, then policy order."""
    ordered = [what.results[(k, p)] for k in what.streams for p in what.policies]
    return min(ordered, key=lambda r: round(r.step_time, 12))


def timeline_svg(result: SimResult, span: float | None = None, index: int = 0) -> str:
    """One lane per stream (compute on top), slices as rectangles, a time axis from 0
    to ``span`` seconds (default: the result's step time). ``index`` keeps the ids of
    several timelines on one page apart."""
    lanes = lanes_of(result)
    row = {lane: i for i, lane in enumerate(lanes)}
    span = max(span or result.step_time, 1e-12)
    resolution = PLOT_WIDTH * OVERSAMPLE
    scale = resolution / span  # grid units per second
    height = AXIS_HEIGHT + len(lanes) * (LANE_HEIGHT + LANE_GAP)
    width = LABEL_WIDTH + PLOT_WIDTH + 10
    clip = f"plot-{index}"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{html.escape(result.label)} timeline" data-left="{LABEL_WIDTH}" '
        f'data-width="{PLOT_WIDTH}" data-res="{resolution}" data-span="{span!r}" '
        f'data-height="{height}" data-top="{AXIS_HEIGHT}" data-max-zoom="{MAX_ZOOM}">'
        f'<defs><clipPath id="{clip}"><rect x="{LABEL_WIDTH}" y="0" width="{PLOT_WIDTH}" '
        f'height="{height}"/></clipPath></defs>'
    ]
    for lane, i in row.items():
        y = AXIS_HEIGHT + i * (LANE_HEIGHT + LANE_GAP)
        busy = result.lane_busy.get(lane, 0.0)
        out.append(
            f'<g class="lane" data-lane="{html.escape(lane_name(lane))}">'
            f'<rect x="{LABEL_WIDTH}" y="{y}" width="{PLOT_WIDTH}" height="{LANE_HEIGHT}" '
            f'fill="{LANE_BACKGROUNDS[i % 2]}"/>'
            f'<text x="{LABEL_WIDTH - 8}" y="{y + LANE_HEIGHT / 2 + 4}" text-anchor="end" '
            f'font-size="12" fill="#334e68">{html.escape(lane_name(lane))}</text>'
            f'<text x="{LABEL_WIDTH - 8}" y="{y + LANE_HEIGHT - 1}" text-anchor="end" '
            f'font-size="9" fill="#7b8794">busy {_ms(busy)}</text></g>'
        )
    out.append(f'<g class="axis">{"".join(_axis(span, height))}</g>')
    out.append(
        f'<g clip-path="url(#{clip})"><g class="slices" transform="translate({LABEL_WIDTH},0) '
        f'scale({PLOT_WIDTH / resolution:g},1)">'
    )
    by_lane: dict[int, list[Slice]] = {}
    for s in result.slices or ():
        if s.duration > 0 and s.lane in row:
            by_lane.setdefault(s.lane, []).append(s)
    titles = 0
    for lane, slices in by_lane.items():
        y = AXIS_HEIGHT + row[lane] * (LANE_HEIGHT + LANE_GAP) + 2
        h = LANE_HEIGHT - 4
        for x, w, kind, label in _merged(sorted(slices, key=lambda s: s.start), scale):
            color = KIND_COLORS.get(kind, OTHER_COLOR)
            title = ""
            if titles < MAX_TITLES:
                title = f"<title>{html.escape(label)}</title>"
                titles += 1
            out.append(
                f'<rect class="slice" x="{x:.2f}" y="{y}" width="{w:.2f}" height="{h}" '
                f'fill="{color}">{title}</rect>'
            )
    out.append("</g></g></svg>")
    return "".join(out)


def _merged(slices: list[Slice], scale: float) -> list[tuple[float, float, str, str]]:
    """(x, width, kind, tooltip) rectangles in grid units; runs of slices narrower than
    a grid unit become one."""
    items: list[tuple[float, float, str, str]] = []
    cluster: list[Slice] = []

    def flush() -> None:
        if not cluster:
            return
        start = cluster[0].start * scale
        end = max(s.start + s.duration for s in cluster) * scale
        weight: dict[str, float] = {}
        for s in cluster:
            weight[s.kind] = weight.get(s.kind, 0.0) + s.duration
        kind = max(weight, key=lambda k: weight[k])
        total = sum(s.duration for s in cluster)
        label = (
            _tooltip(cluster[0])
            if len(cluster) == 1
            else f"{len(cluster)} ops, {total * 1e6:.1f} us (mostly {kind})"
        )
        items.append((start, max(end - start, MIN_UNITS), kind, label))
        cluster.clear()

    for s in slices:
        width = s.duration * scale
        if width >= MIN_UNITS:
            flush()
            items.append((s.start * scale, width, s.kind, _tooltip(s)))
            continue
        if cluster and (s.start - cluster[-1].start - cluster[-1].duration) * scale > 0.5:
            flush()
        cluster.append(s)
        if (s.start + s.duration - cluster[0].start) * scale >= MIN_UNITS:
            flush()
    flush()
    return items


def _tooltip(s: Slice) -> str:
    extra = ""
    if s.args.get("bytes"):
        extra = f", {s.args['bytes']:,} bytes"
    return f"{s.name or s.kind} ({s.kind}): {s.duration * 1e6:.2f} us{extra}"


def _axis(span: float, height: int) -> list[str]:
    """Grid lines and labels of the whole span (the zoom script redraws them)."""
    step = _nice_step(span / 8)
    out = []
    t = 0.0
    while t <= span * (1 + 1e-9):
        x = LABEL_WIDTH + t / span * PLOT_WIDTH
        out.append(
            f'<line x1="{x:.2f}" y1="{AXIS_HEIGHT - 6}" x2="{x:.2f}" y2="{height}" '
            'stroke="#d9e2ec" stroke-width="1"/>'
            f'<text x="{x:.2f}" y="{AXIS_HEIGHT - 10}" font-size="10" fill="#52606d" '
            f'text-anchor="middle">{_time_label(t, step)}</text>'
        )
        t += step
    return out


def _nice_step(raw: float) -> float:
    if raw <= 0:
        return 1e-6
    exponent = math.floor(math.log10(raw))
    base = 10.0**exponent
    for m in (1, 2, 5, 10):
        if raw <= m * base:
            return m * base
    return 10 * base


def _time_label(t: float, step: float) -> str:
    if step >= 1e-3:
        return f"{round(t * 1e3, 6):g} ms"
    return f"{round(t * 1e6, 3):g} us"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _speedup(base: float, value: float) -> str:
    return f"{base / value:.2f}x" if value > 0 else "-"


def _card(key: str, value: str) -> str:
    return (
        f'<div class="card"><div class="k">{html.escape(key)}</div>'
        f'<div class="v">{html.escape(value)}</div></div>'
    )


def _what_if_table(what: WhatIf, best: SimResult) -> str:
    base = what.baseline.step_time
    head = ['<table class="whatif"><tr><th class="l" rowspan="2">K</th>']
    head += [f'<th colspan="4">{html.escape(p)}</th>' for p in what.policies]
    head.append("</tr><tr>")
    head += ["<th>step</th><th>exposed comm.</th><th>speedup</th><th>streams used</th>"] * len(
        what.policies
    )
    head.append("</tr>")
    rows = []
    for k in what.streams:
        cells = [f'<td class="l">{k}</td>']
        for p in what.policies:
            r = what.results[(k, p)]
            cls = ' class="best"' if r is best else ""
            used = what.assignments[(k, p)].streams_used
            cells.append(
                f"<td{cls}>{_ms(r.step_time)}</td><td>{_ms(r.exposed_communication)}</td>"
                f"<td>{_speedup(base, r.step_time)}</td><td>{used}</td>"
            )
        rows.append("<tr>" + "".join(cells) + "</tr>")
    span = 4 * len(what.policies)
    for bound, how in what.bounds():
        rows.append(
            f'<tr class="lb"><td class="l">{html.escape(bound.label)}</td>'
            f'<td colspan="{span}" class="l">{_ms(bound.step_time)} (exposed '
            f"{_ms(bound.exposed_communication)}, {_speedup(base, bound.step_time)}): {how}, "
            "no bandwidth sharing</td></tr>"
        )
    rows.append(
        f'<tr class="lb"><td class="l">serial</td><td colspan="{span}" class="l">'
        f"{_ms(what.serial)}: compute plus every collective, nothing overlapped</td></tr>"
    )
    return "".join(head) + "".join(rows) + "</table>"


def _assignment_table(what: WhatIf) -> str:
    configs = [(k, p) for p in what.policies for k in what.streams]
    head = [
        '<table class="assignment"><tr><th class="l">start</th><th class="l">kind</th>'
        '<th class="l">computation</th><th>bytes</th><th class="l">groups</th>'
        '<th class="l">link, algorithm</th><th>standalone</th><th class="l">XLA runs it on</th>'
    ]
    head += [f"<th>K={k}<br>{html.escape(p)}</th>" for k, p in configs]
    head.append("</tr>")
    rows = []
    for i, pair in enumerate(what.pairs[:MAX_ASSIGNMENT_ROWS]):
        cost = what.specs[i].cost
        groups = pair.groups
        group_text = format_groups(groups, pair.kind)
        cells = [
            f'<td class="l">%{html.escape(pair.start)}</td>',
            f'<td class="l">{html.escape(pair.kind)}</td>',
            f'<td class="l">{html.escape(pair.computation)}</td>',
            f"<td>{pair.bytes:,}</td>",
            f'<td class="l">{html.escape(group_text)}</td>',
            f'<td class="l">{"network" if cost.network else "NVLink"}, {cost.algorithm}/'
            f"{cost.protocol}</td>",
            f"<td>{cost.seconds * 1e6:.1f} us</td>",
            f'<td class="l">{html.escape(runs_on(pair))}</td>',
        ]
        for key in configs:
            assignment = what.assignments[key]
            stream = assignment.stream_of.get(pair.key)
            if pair.lane != "communication" or stream is None:
                text = "compute" if pair.lane == "compute" else "p2p"
            else:
                text = str(stream)
                if pair.start in assignment.serialized_by_rule:
                    text += "*"
                elif pair.start in assignment.serialized_by_bound:
                    text += "&dagger;"
            cells.append(f"<td>{text}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    more = len(what.pairs) - MAX_ASSIGNMENT_ROWS
    footer = f"<p>{more} more pairs not shown.</p>" if more > 0 else ""
    explanation = (
        '<p class="key">* queued behind a pair it shares two or more devices with (deadlock rule); '
        "&dagger; queued behind another pair because only K streams exist. "
        '"XLA runs it on" is where the compiled module puts it whatever the assignment '
        "says: sync pairs on the compute stream, or (for settings where XLA makes them async "
        "thunks) on collective stream 0, where they queue behind whatever is there; pipelined "
        "send/recv on XLA's P2P stream.</p>"
    )
    return "".join(head) + "".join(rows) + "</table>" + footer + explanation


def _legend(timelines: Sequence[SimResult]) -> str:
    kinds: list[str] = []
    for r in timelines:
        for s in r.slices or ():
            if s.kind not in kinds:
                kinds.append(s.kind)
    order = [k for k in KIND_COLORS if k in kinds] + [k for k in kinds if k not in KIND_COLORS]
    items = "".join(
        f'<span><i style="background:{KIND_COLORS.get(k, OTHER_COLOR)}"></i>'
        f"{html.escape(_kind_label(k))}</span>"
        for k in order
    )
    return f'<div class="legend">{items}</div>'


def _kind_label(kind: str) -> str:
    return {
        "matmul": "matmul kernel",
        "memory": "memory-bound kernel",
        "wait": "compute stream waiting on a done",
        "repeat": "repeated loop iterations",
        "async-compute": "async computation",
    }.get(kind, kind)


__all__ = [
    "KIND_COLORS",
    "best_result",
    "render_html",
    "timeline_svg",
]
