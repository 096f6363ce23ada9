"""The pictures of a prediction: which timelines to draw, and the Perfetto trace and
HTML report that the plugin writes beside a module's report.

The plugin's pages price collectives from the user's performance table when the
plugin has one (``XLA_STREAMS_PERF_TABLE``: ``write_visual_report(perf_table=)``),
and draw XLA's own multi-streaming beside the stream counts it predicts.

Imports no command-line code (the CLI reaches the plugin through its demo, and
the plugin reaches this) and no JAX.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence
from pathlib import Path

from xla_streams._io import atomic_write_many
from xla_streams.collectives import POLICIES, STREAM_COUNTS
from xla_streams.hlo import Module
from xla_streams.simulate.execution_streams import xla_stream_assignment
from xla_streams.simulate.html import render_html
from xla_streams.simulate.measured import PerfTable, load_perf_table
from xla_streams.simulate.simulator import Simulator
from xla_streams.simulate.targets import Target, get_target, with_perf_table
from xla_streams.simulate.timeline import SimResult
from xla_streams.simulate.trace import trace_json
from xla_streams.simulate.whatif import WhatIf, what_if
from xla_streams.streams import AsyncPair

XLA_MULTI_STREAMING_LABEL = "XLA multi-streaming (2 streams in turn, in post-order)"


def run_xla_multi_streaming(sim: Simulator, *, record: bool = False) -> SimResult:
    """``sim``'s module replayed on the streams XLA's own collective multi-streaming
    (``--xla_gpu_experimental_enable_collective_multi_streaming``) gives its pairs
    (:func:`~xla_streams.simulate.execution_streams.xla_stream_assignment`)."""
    assignment = xla_stream_assignment(sim.module, sim.pairs, multi_streaming=True)
    result = sim.run(assignment, record=record, label=XLA_MULTI_STREAMING_LABEL)
    # It stands for no (K, policy) of the what-if table.
    return dataclasses.replace(result, configs=())


def record_timelines(
    sim: Simulator, what: WhatIf, *, xla_multi_streaming: bool = False
) -> list[SimResult]:
    """Every (K, policy) of ``what``, one timeline per distinct assignment (labelled
    with every configuration it stands for), with ``xla_multi_streaming`` then XLA's own
    multi-streaming, then the rule bound and the lower bound."""
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
    if xla_multi_streaming:
        timelines.append(run_xla_multi_streaming(sim, record=True))
    timelines.append(sim.bound(respect_rule=True, record=True))
    timelines.append(sim.bound(respect_rule=False, record=True))
    return timelines


def pictures(
    sim: Simulator,
    what: WhatIf,
    trace_href: str | None = None,
    *,
    xla_multi_streaming: bool = False,
) -> tuple[str, str]:
    """The Perfetto trace (JSON) and the HTML report of ``what``; the report links to
    the trace at ``trace_href`` when given. ``xla_multi_streaming``: XLA's own
    multi-streaming drawn too."""
    timelines = record_timelines(sim, what, xla_multi_streaming=xla_multi_streaming)
    trace = trace_json(timelines, what.module, what.target)
    return trace, render_html(what, timelines, trace_href=trace_href)


def write_visual_report(
    module: Module,
    pairs: Sequence[AsyncPair] | None,
    directory: str | Path,
    stem: str,
    target: str | Target = "h100",
    streams: Sequence[int] = STREAM_COUNTS,
    *,
    perf_table: str | os.PathLike[str] | PerfTable | None = None,
) -> tuple[Path, Path]:
    """Write ``<stem>.trace.json`` and ``<stem>.html`` for ``module`` into ``directory``.

    Uses ``pairs`` when given (found with the plugin's stream model, say), else
    finds them; predicts each of ``streams`` under every policy, and XLA's own
    multi-streaming. ``perf_table``: a collective performance table in XLA's
    format (or its path; read once per path and modification time) to price
    collectives from instead of the vendored one. Returns the two paths.
    """
    chosen = get_target(target) if isinstance(target, str) else target
    if perf_table is not None:
        table = perf_table if isinstance(perf_table, PerfTable) else cached_perf_table(perf_table)
        chosen = with_perf_table(chosen, table)
    directory = Path(directory)
    sim = Simulator(module, chosen, pairs)
    what = what_if(module, chosen, sorted(set(streams)), POLICIES, simulator=sim)
    trace_path, html_path = directory / f"{stem}.trace.json", directory / f"{stem}.html"
    trace, page = pictures(sim, what, trace_href=trace_path.name, xla_multi_streaming=True)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_many([(trace_path, trace), (html_path, page)])
    return trace_path, html_path


def cached_perf_table(path: str | os.PathLike[str]) -> PerfTable:
    """:func:`~xla_streams.simulate.measured.load_perf_table`, read again only when the
    file changes (the plugin prices every module it reports from one table)."""
    resolved = os.path.abspath(os.fspath(path))
    try:
        stamp = os.stat(resolved).st_mtime_ns
    except OSError:
        stamp = -1  # load_perf_table says why it cannot be read
    return _load_perf_table(resolved, stamp)


@functools.lru_cache(maxsize=4)
def _load_perf_table(path: str, _stamp: int) -> PerfTable:
    return load_perf_table(path)
