"""A self-contained HTML report of the predictions: no network, no scripts, no fonts
to fetch. The timelines are inline SVG with one lane per stream; the tables are
the what-if grid (K x policy), the summary and the stream assignment."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path

from xla_streams.simulate.simulator import SimResult, Slice, WhatIf, lane_name
from xla_streams.simulate.trace import lanes_of

# Fill colour of each slice kind; lanes alternate two pale backgrounds.
KIND_COLORS: dict[str, str] = {
    "matmul": "#4e79a7",
    "memory": "#a0cbe8",
    "async-compute": "#76b7b2",
    "wait": "#e15759",
    "repeat": "#bab0ac",
    "all-gather": "#59a14f",
    "reduce-scatter": "#f28e2b",
    "all-reduce": "#b07aa1",
    "all-to-all": "#edc948",
    "ragged-all-to-all": "#edc948",
    "collective-permute": "#9c755f",
    "send": "#9c755f",
    "recv": "#9c755f",
    "collective-broadcast": "#ff9da7",
}
OTHER_COLOR = "#888888"
LANE_BACKGROUNDS = ("#eef2f7", "#f8fafc")
LABEL_WIDTH = 170
PLOT_WIDTH = 1000
LANE_HEIGHT = 26
LANE_GAP = 4
AXIS_HEIGHT = 24
MIN_PIXELS = 1.0  # slices narrower than this are merged with their neighbours
MAX_TITLES = 4000
MAX_ASSIGNMENT_ROWS = 500

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px;
       color: #1f2933; background: #ffffff; }
h1 { font-size: 22px; margin: 0 0 4px 0; }
h2 { font-size: 17px; margin: 28px 0 8px 0; border-bottom: 1px solid #d9e2ec; padding-bottom: 4px; }
h3 { font-size: 14px; margin: 18px 0 6px 0; }
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
.notes li { margin: 3px 0; }
footer { margin-top: 28px; color: #7b8794; font-size: 12px; }
"""


def render_html(what: WhatIf, timelines: Sequence[SimResult], title: str | None = None) -> str:
    """The report; ``timelines`` are recorded results (``record=True``) to draw."""
    esc = html.escape
    best = best_result(what)
    base = what.baseline
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title or f'xla_streams prediction: {what.module}')}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>What multi-streaming buys: {esc(what.module)}</h1>",
        f'<p class="sub">Predicted for {esc(what.target.description)} (target '
        f"<code>{esc(what.target.name)}</code>); {len(what.pairs)} async collective pairs, "
        f"{sum(1 for p in what.pairs if p.needs_stream)} of them on collective streams.</p>",
        '<section class="cards">',
        _card(f"K={base.streams} (one stream, as XLA runs today)", _ms(base.step_time)),
        _card(
            f"best: {best.label}",
            f"{_ms(best.step_time)} ({_speedup(base.step_time, best.step_time)})",
        ),
        _card("lower bound (unlimited streams, no sharing)", _ms(what.lower_bound.step_time)),
        _card("compute only", _ms(base.compute_time)),
        _card("exposed communication at K=1", _ms(base.exposed_communication)),
        "</section>",
        "<h2>What if: predicted step time by number of streams K and policy</h2>",
        _what_if_table(what, best),
        "<h2>Timelines</h2>",
        _legend(timelines),
    ]
    # One time scale for every timeline, so that they compare at a glance.
    span = max((r.step_time for r in timelines), default=0.0)
    for result in timelines:
        parts.append(
            f"<h3>{esc(result.label)}: step {_ms(result.step_time)}, exposed communication "
            f"{_ms(result.exposed_communication)}</h3>"
        )
        parts.append(timeline_svg(result, span))
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
        + ".</footer></body></html>"
    )
    return "\n".join(parts)


def write_html(
    path: str | Path, what: WhatIf, timelines: Sequence[SimResult], title: str | None = None
) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(what, timelines, title), encoding="utf-8")
    return path


def best_result(what: WhatIf) -> SimResult:
    """The fastest configuration; ties go to fewer streams, then policy order."""
    ordered = [what.results[(k, p)] for k in what.streams for p in what.policies]
    return min(ordered, key=lambda r: round(r.step_time, 12))


def timeline_svg(result: SimResult, span: float | None = None) -> str:
    """One lane per stream (compute on top), slices as rectangles, a time axis from 0
    to ``span`` seconds (default: the result's step time)."""
    lanes = lanes_of(result)
    row = {lane: i for i, lane in enumerate(lanes)}
    span = max(span or result.step_time, 1e-12)
    scale = PLOT_WIDTH / span
    height = AXIS_HEIGHT + len(lanes) * (LANE_HEIGHT + LANE_GAP)
    width = LABEL_WIDTH + PLOT_WIDTH + 10
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{html.escape(result.label)} timeline">'
    ]
    out.extend(_axis(span, scale, height))
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
    by_lane: dict[int, list[Slice]] = {}
    for s in result.slices or ():
        if s.duration > 0 and s.lane in row:
            by_lane.setdefault(s.lane, []).append(s)
    titles = 0
    for lane, slices in by_lane.items():
        y = AXIS_HEIGHT + row[lane] * (LANE_HEIGHT + LANE_GAP) + 2
        h = LANE_HEIGHT - 4
        for x, w, kind, label in _pixels(sorted(slices, key=lambda s: s.start), scale):
            color = KIND_COLORS.get(kind, OTHER_COLOR)
            title = ""
            if titles < MAX_TITLES:
                title = f"<title>{html.escape(label)}</title>"
                titles += 1
            out.append(
                f'<rect class="slice" x="{LABEL_WIDTH + x:.2f}" y="{y}" width="{w:.2f}" '
                f'height="{h}" fill="{color}">{title}</rect>'
            )
    out.append("</svg>")
    return "".join(out)


def _pixels(slices: list[Slice], scale: float) -> list[tuple[float, float, str, str]]:
    """(x, width, kind, tooltip) rectangles; runs of sub-pixel slices become one."""
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
        items.append((start, max(end - start, MIN_PIXELS), kind, label))
        cluster.clear()

    for s in slices:
        width = s.duration * scale
        if width >= MIN_PIXELS:
            flush()
            items.append((s.start * scale, width, s.kind, _tooltip(s)))
            continue
        if cluster and (s.start - cluster[-1].start - cluster[-1].duration) * scale > 0.5:
            flush()
        cluster.append(s)
        if (s.start + s.duration - cluster[0].start) * scale >= MIN_PIXELS:
            flush()
    flush()
    return items


def _tooltip(s: Slice) -> str:
    extra = ""
    if s.args.get("bytes"):
        extra = f", {s.args['bytes']:,} bytes"
    return f"{s.name or s.kind} ({s.kind}): {s.duration * 1e6:.2f} us{extra}"


def _axis(span: float, scale: float, height: int) -> list[str]:
    step = _nice_step(span / 8)
    out = []
    t = 0.0
    while t <= span * (1 + 1e-9):
        x = LABEL_WIDTH + t * scale
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
        return f"{t * 1e3:g} ms"
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
    lb = what.lower_bound
    span = 4 * len(what.policies)
    rows.append(
        f'<tr class="lb"><td class="l">lower bound</td><td colspan="{span}" class="l">'
        f"{_ms(lb.step_time)} (exposed {_ms(lb.exposed_communication)}, "
        f"{_speedup(base, lb.step_time)}): every collective on its own stream, no "
        "bandwidth sharing</td></tr>"
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
        '<th class="l">link, algorithm</th><th>standalone</th>'
    ]
    head += [f"<th>K={k}<br>{html.escape(p)}</th>" for k, p in configs]
    head.append("</tr>")
    rows = []
    for i, pair in enumerate(what.pairs[:MAX_ASSIGNMENT_ROWS]):
        cost = what.specs[i].cost
        groups = pair.groups
        sizes = sorted({len(g) for g in groups})
        group_text = f"{len(groups)} x {'/'.join(map(str, sizes))} devices"
        cells = [
            f'<td class="l">%{html.escape(pair.start)}</td>',
            f'<td class="l">{html.escape(pair.kind)}</td>',
            f'<td class="l">{html.escape(pair.computation)}</td>',
            f"<td>{pair.bytes:,}</td>",
            f'<td class="l">{html.escape(group_text)}</td>',
            f'<td class="l">{"network" if cost.network else "NVLink"}, {cost.algorithm}/'
            f"{cost.protocol}</td>",
            f"<td>{cost.seconds * 1e6:.1f} us</td>",
        ]
        for key in configs:
            assignment = what.assignments[key]
            stream = assignment.stream_of.get(pair.start)
            if stream is None:
                text = "sync" if pair.sync else "p2p"
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
        "&dagger; queued behind another pair because only K streams exist; sync pairs run on "
        "the compute stream, pipelined send/recv on XLA's P2P stream.</p>"
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
    "write_html",
]
