"""``xla-streams simulate``: the what-if table for a scheduled module, and its pictures.

    xla-streams simulate IN.hlo --streams=1,2,4,8 --policy=interval,round-robin \\
        --trace=OUT.json --html=OUT.html [--target=h100 --target-file=T.json]

The command lives here so that ``cli.py`` only registers it (``define_flags``,
``run_cli``). ``simulate_command`` is the same for Python callers, and
``write_visual_report`` is what the plugin calls to drop a trace and an HTML
report for a compilation into its report directory.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from absl import flags

from xla_streams._io import atomic_write_many
from xla_streams.collectives import MAX_STREAMS, POLICIES, Policy
from xla_streams.hlo import HloError, Module, parse_module
from xla_streams.pipeline import Compilation, Fact
from xla_streams.simulate.html import best_result, render_html
from xla_streams.simulate.simulator import Progress, SimResult, Simulator, WhatIf, what_if
from xla_streams.simulate.targets import TARGETS, Target, TargetError, get_target, load_target
from xla_streams.simulate.trace import trace_json

if TYPE_CHECKING:
    from xla_streams.cli import Args

DEFAULT_STREAMS = (1, 2, 4, 8)
STDOUT = "-"  # the CLI's name for standard output
# Inputs at least this large report progress on stderr as they go.
PROGRESS_BYTES = 4 << 20


class UsageError(ValueError):
    """A bad flag value."""


@dataclass
class Simulation:
    """Everything one run produced; ``timelines`` only when pictures were asked for."""

    what: WhatIf
    timelines: list[SimResult]
    table: str
    trace: str | None = None
    html: str | None = None


# -- flag values ------------------------------------------------------------------------


def parse_streams(text: str | Sequence[int | str]) -> tuple[int, ...]:
    """``"1,2,4,8"`` (or a list) -> (1, 2, 4, 8); each from 1 to MAX_STREAMS."""
    items = text.split(",") if isinstance(text, str) else [str(k) for k in text]
    values = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        try:
            k = int(item)
        except ValueError:
            raise UsageError(f"--streams: '{item}' is not an integer") from None
        if not 1 <= k <= MAX_STREAMS:
            raise UsageError(f"--streams: {k} is outside 1..{MAX_STREAMS}")
        values.append(k)
    if not values:
        raise UsageError("--streams: give at least one stream count, e.g. 1,2,4,8")
    return tuple(sorted(set(values)))


def parse_policies(text: str | Sequence[str]) -> tuple[Policy, ...]:
    """``"interval,round-robin"`` (or a list) -> the policies, in the order given."""
    items = text.split(",") if isinstance(text, str) else list(text)
    result: list[Policy] = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        policy = next((p for p in POLICIES if p == item), None)
        if policy is None:
            raise UsageError(f"--policy: '{item}' is not one of {', '.join(POLICIES)}")
        if policy not in result:
            result.append(policy)
    if not result:
        raise UsageError(f"--policy: give at least one of {', '.join(POLICIES)}")
    return tuple(result)


def resolve_target(name: str = "h100", target_file: str | None = None) -> Target:
    """``--target`` by name, or ``--target-file`` overrides on top of it."""
    if target_file:
        return load_target(target_file, base=name)
    return get_target(name)


# -- the work ---------------------------------------------------------------------------


def simulate_module(
    module: Module,
    target: Target,
    streams: Sequence[int] = DEFAULT_STREAMS,
    policies: Sequence[Policy] = POLICIES,
    *,
    pictures: bool = False,
    progress: Progress | None = None,
    compilation: Compilation | None = None,
) -> Simulation:
    """The what-if predictions for ``module``, and its trace and HTML when ``pictures``."""
    pairs = compilation.pairs if compilation and Fact.ASYNC_PAIRS in compilation.facts else None
    if progress:
        count = sum(len(c.instructions) for c in module.computations)
        progress(f"cost model for {count} instructions")
    sim = Simulator(module, target, pairs, progress=progress)
    what = what_if(module, target, streams, policies, progress=progress, simulator=sim)
    result = Simulation(what, [], format_what_if(what))
    if pictures:
        if progress:
            progress("recording timelines")
        result.timelines = record_timelines(sim, what)
        result.trace = trace_json(result.timelines, module.name, target)
        result.html = render_html(what, result.timelines)
    return result


def record_timelines(
    sim: Simulator, what: WhatIf, extra: Sequence[tuple[int, Policy]] = ()
) -> list[SimResult]:
    """Timelines worth drawing: one stream (today), the best configuration, any
    ``extra`` (K, policy), and the lower bound."""
    keys: list[tuple[int, str]] = [(what.baseline.streams or 1, what.policies[0])]
    best = best_result(what)
    keys.append((best.streams or 1, best.policy or what.policies[0]))
    keys.extend(extra)
    timelines = []
    seen = set()
    for key in keys:
        if key in seen or key not in what.assignments:
            continue
        seen.add(key)
        label = what.results[key].label
        if key[0] == 1:
            label = "K=1 (one collective stream, as XLA runs today)"
        timelines.append(sim.run(what.assignments[key], record=True, label=label))
    timelines.append(
        sim.run(None, record=True, label="lower bound (unlimited streams, no bandwidth sharing)")
    )
    return timelines


def format_what_if(what: WhatIf) -> str:
    """The what-if table as aligned text."""
    base = what.baseline.step_time
    placed = sum(1 for p in what.pairs if p.needs_stream)
    lines = [
        f"module {what.module} on {what.target.name} ({what.target.description}): "
        f"{len(what.pairs)} async pairs, {placed} on collective streams",
        "predicted step time (exposed communication, speedup over K=1):",
    ]
    header = ["K", *what.policies]
    table = [header]
    for k in what.streams:
        row = [str(k)]
        for p in what.policies:
            r = what.results[(k, p)]
            row.append(
                f"{r.step_time * 1e3:.4f} ms ({r.exposed_communication * 1e3:.4f} ms, "
                f"{_ratio(base, r.step_time)})"
            )
        table.append(row)
    lines.extend(_aligned(table))
    busy = [header]
    for k in what.streams:
        row = [str(k)]
        for p in what.policies:
            lanes = what.results[(k, p)].lane_busy
            row.append(" ".join(f"{lanes.get(s, 0.0) * 1e3:.3f}" for s in range(k)))
        busy.append(row)
    lines.append("busy time of collective streams 0..K-1 (ms):")
    lines.extend(_aligned(busy))
    lb = what.lower_bound
    lines.append(
        f"lower bound: {lb.step_time * 1e3:.4f} ms ({lb.exposed_communication * 1e3:.4f} ms, "
        f"{_ratio(base, lb.step_time)}): every collective on its own stream, no bandwidth sharing"
    )
    lines.append(
        f"compute only: {what.baseline.compute_time * 1e3:.4f} ms; serial (nothing overlapped): "
        f"{what.serial * 1e3:.4f} ms"
    )
    for policy in what.policies:
        a = what.assignments[(max(what.streams), policy)]
        if a.serialized_by_rule or a.serialized_by_bound:
            lines.append(
                f"K={a.streams} {policy}: {len(a.serialized_by_rule)} pairs queue behind a pair "
                f"they share devices with (deadlock rule), {len(a.serialized_by_bound)} for want "
                "of streams"
            )
    for note in list(what.notes) + what.non_monotone():
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"


def _aligned(table: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
        for cells in table
    ]


def _ratio(base: float, value: float) -> str:
    return f"{base / value:.2f}x" if value > 0 else "-"


def progress_printer(err: TextIO) -> Progress:
    """Progress lines with the elapsed time, for long runs."""
    begin = time.perf_counter()

    def say(message: str) -> None:
        print(f"[simulate {time.perf_counter() - begin:6.2f}s] {message}", file=err, flush=True)

    return say


# -- entry points -----------------------------------------------------------------------


def define_flags(fv: flags.FlagValues) -> None:
    """The flags of ``xla-streams simulate``."""
    flags.DEFINE_string(
        "streams", ",".join(map(str, DEFAULT_STREAMS)),
        f"Numbers of collective streams K to predict, comma separated (each 1..{MAX_STREAMS}).",
        flag_values=fv,
    )  # fmt: skip
    flags.DEFINE_string(
        "policy", ",".join(POLICIES),
        f"Assignment policies to predict, comma separated: {', '.join(POLICIES)}.",
        flag_values=fv,
    )  # fmt: skip
    flags.DEFINE_string(
        "trace", None, "Write the predicted timelines as a Chrome/Perfetto trace (JSON) to "
        "this file; open it in ui.perfetto.dev or TensorBoard.", flag_values=fv,
    )  # fmt: skip
    flags.DEFINE_string(
        "html", None, "Write a self-contained HTML report (timelines, tables) to this file.",
        flag_values=fv,
    )  # fmt: skip
    flags.DEFINE_enum(
        "target", "h100", list(TARGETS),
        "The GPU to predict for (constants: xla_streams/simulate/targets.py).", flag_values=fv,
    )  # fmt: skip
    flags.DEFINE_string(
        "target-file", None, "JSON object overriding fields of --target, e.g. "
        '{"link_efficiency": 0.7, "devices_per_host": 4}.', flag_values=fv,
    )  # fmt: skip
    flags.DEFINE_bool(
        "progress", None, "Report progress on standard error (default: for inputs over "
        f"{PROGRESS_BYTES >> 20} MiB).", flag_values=fv,
    )  # fmt: skip


def run_cli(args: Args) -> int:
    """``xla-streams simulate``, on the CLI's parsed ``args``.

    Bad flag values raise absl's ``IllegalFlagValueError``, which the CLI reports
    as a usage error (exit 2) however ``cli`` was imported (``python -m`` too).
    """
    try:
        ks = parse_streams(args.flag("streams"))
        ps = parse_policies(args.flag("policy"))
        target = resolve_target(args.flag("target"), args.flag("target-file"))
    except (UsageError, TargetError) as e:
        raise flags.IllegalFlagValueError(str(e)) from None
    path, text = args.input()
    show = args.flag("progress")
    say = (
        progress_printer(args.stderr)
        if (show if show is not None else len(text) >= PROGRESS_BYTES)
        else None
    )
    if say:
        say(f"parsing {path}")
    module = parse_module(text, path)
    pictures = bool(args.flag("trace") or args.flag("html"))
    result = simulate_module(module, target, ks, ps, pictures=pictures, progress=say)
    args.output(args.flag("trace"), result.trace or "")
    args.output(args.flag("html"), result.html or "")
    if args.uses_stdout("trace", "html"):
        args.messages.append(result.table)
    else:
        args.output(STDOUT, result.table)
    return 0


def simulate_command(
    path: str,
    *,
    streams: str | Sequence[int] = DEFAULT_STREAMS,
    policies: str | Sequence[str] = POLICIES,
    trace: str | None = None,
    html: str | None = None,
    target: str = "h100",
    target_file: str | None = None,
    progress: bool | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """The command for Python callers: 0 on success, 2 on bad input (message on ``err``)."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        ks = parse_streams(streams)
        ps = parse_policies(policies)
        chosen = resolve_target(target, target_file)
        text = Path(path).read_text(encoding="utf-8")
        show = progress if progress is not None else len(text) >= PROGRESS_BYTES
        say = progress_printer(err) if show else None
        if say:
            say(f"parsing {path}")
        module = parse_module(text, path)
        result = simulate_module(module, chosen, ks, ps, pictures=bool(trace or html), progress=say)
        atomic_write_many(
            [(d, c) for d, c in ((trace, result.trace), (html, result.html)) if d and c is not None]
        )
    except (OSError, HloError, TargetError, UsageError) as e:
        print(f"xla-streams simulate: {e}", file=err)
        return 2
    out.write(result.table)
    return 0


def write_visual_report(
    compilation: Compilation,
    directory: str | Path,
    stem: str,
    target: str | Target = "h100",
    streams: Sequence[int] = DEFAULT_STREAMS,
) -> tuple[Path, Path]:
    """Write ``<stem>.trace.json`` and ``<stem>.html`` for a compilation into ``directory``.

    Uses the compilation's pairs when found and draws its own assignment (its K and
    policy) beside one stream and the lower bound; the what-if grid covers
    ``streams`` plus that K under every policy. Returns the two paths.
    """
    chosen = get_target(target) if isinstance(target, str) else target
    directory = Path(directory)
    module = compilation.module
    pairs = compilation.pairs if Fact.ASYNC_PAIRS in compilation.facts else None
    sim = Simulator(module, chosen, pairs)
    assignment = compilation.assignment
    ks = set(streams)
    extra: list[tuple[int, Policy]] = []
    if assignment is not None:
        ks.add(assignment.streams)
        extra.append((assignment.streams, assignment.policy))
    what = what_if(module, chosen, sorted(ks), POLICIES, simulator=sim)
    timelines = record_timelines(sim, what, extra)
    trace_path, html_path = directory / f"{stem}.trace.json", directory / f"{stem}.html"
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_many(
        [
            (trace_path, trace_json(timelines, module.name, chosen)),
            (html_path, render_html(what, timelines)),
        ]
    )
    return trace_path, html_path
