"""The pictures of a prediction: which timelines to draw, and the Perfetto trace and
HTML report that the plugin writes beside a module's report.

Imports no command-line code (the CLI reaches the plugin through its demo, and
the plugin reaches this) and no JAX.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from xla_streams._io import atomic_write_many
from xla_streams.collectives import POLICIES
from xla_streams.passes.base import Compilation, Fact
from xla_streams.simulate.html import render_html
from xla_streams.simulate.simulator import SimResult, Simulator, WhatIf, what_if
from xla_streams.simulate.targets import Target, get_target
from xla_streams.simulate.trace import trace_json

DEFAULT_STREAMS = (1, 2, 4, 8)


def record_timelines(sim: Simulator, what: WhatIf) -> list[SimResult]:
    """Every (K, policy) of ``what``, one timeline per distinct assignment (labelled
    with every configuration it stands for), then the rule bound and the lower bound."""
    groups: dict[tuple[tuple[str, int | None], ...], list[tuple[int, str]]] = {}
    for k in what.streams:
        for policy in what.policies:
            streams = what.assignments[(k, policy)].stream_of
            groups.setdefault(tuple(streams.items()), []).append((k, policy))
    timelines = []
    for configs in groups.values():
        label = " = ".join(f"K={k} {policy}" for k, policy in configs)
        if configs[0][0] == 1:
            label += " (one collective stream, as XLA runs today)"
        result = sim.run(what.assignments[configs[0]], record=True, label=label)
        timelines.append(dataclasses.replace(result, configs=tuple(configs)))
    timelines.append(sim.bound(respect_rule=True, record=True))
    timelines.append(sim.bound(respect_rule=False, record=True))
    return timelines


def pictures(sim: Simulator, what: WhatIf, trace_href: str | None = None) -> tuple[str, str]:
    """The Perfetto trace (JSON) and the HTML report of ``what``; the report links to
    the trace at ``trace_href`` when given."""
    timelines = record_timelines(sim, what)
    trace = trace_json(timelines, what.module, what.target)
    return trace, render_html(what, timelines, trace_href=trace_href)


def write_visual_report(
    compilation: Compilation,
    directory: str | Path,
    stem: str,
    target: str | Target = "h100",
    streams: Sequence[int] = DEFAULT_STREAMS,
) -> tuple[Path, Path]:
    """Write ``<stem>.trace.json`` and ``<stem>.html`` for a compilation into ``directory``.

    Uses the compilation's pairs when found (so the plugin's stream model) and
    predicts ``streams`` plus the compilation's own K under every policy. Returns
    the two paths.
    """
    chosen = get_target(target) if isinstance(target, str) else target
    directory = Path(directory)
    module = compilation.module
    pairs = compilation.pairs if Fact.ASYNC_PAIRS in compilation.facts else None
    sim = Simulator(module, chosen, pairs)
    ks = set(streams)
    if compilation.assignment is not None:
        ks.add(compilation.assignment.streams)
    what = what_if(module, chosen, sorted(ks), POLICIES, simulator=sim)
    trace_path, html_path = directory / f"{stem}.trace.json", directory / f"{stem}.html"
    trace, page = pictures(sim, what, trace_href=trace_path.name)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_many([(trace_path, trace), (html_path, page)])
    return trace_path, html_path
