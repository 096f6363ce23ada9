"""``xla-streams simulate``: the what-if table for a scheduled module, and its pictures.

    xla-streams simulate IN.hlo --streams=1,2,4,8 --policy=interval,round-robin \\
        --trace=OUT.json --html=OUT.html [--target=h100 --target-file=T.json]
        [--calibration=C.json] [--overlap-limit=N] [--sync-on-compute]

The command lives here so that ``cli.py`` only registers it (``define_flags``,
``run_cli``); ``simulate_command`` is the same for Python callers. Nothing here
imports the CLI: ``run_cli`` takes any object with the few members of the CLI's
arguments it uses (:class:`CliArgs`). The pictures, and the trace and HTML the
plugin writes, are in :mod:`xla_streams.simulate.visual`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

from absl import flags

from xla_streams._io import atomic_write_many
from xla_streams.cli.stream_model_flags import define_stream_model_flags, stream_model
from xla_streams.collectives import MAX_STREAMS, POLICIES, Policy, StreamModel
from xla_streams.hlo import HloError, Module, parse_module
from xla_streams.passes.base import Compilation, Fact
from xla_streams.simulate.calibration import CalibrationError, load_calibration
from xla_streams.simulate.simulator import Progress, Simulator, WhatIf, runs_on, what_if
from xla_streams.simulate.targets import TARGETS, Target, TargetError, get_target, load_target
from xla_streams.simulate.visual import DEFAULT_STREAMS, pictures

STDOUT = "-"  # the CLI's name for standard output
# Inputs at least this large report progress on stderr as they go.
PROGRESS_BYTES = 4 << 20


class CliArgs(Protocol):
    """What ``run_cli`` uses of the CLI's parsed arguments (``xla_streams.cli.Args``)."""

    stderr: TextIO
    messages: list[str]

    def flag(self, name: str) -> Any: ...

    def input(self) -> tuple[str, str]: ...

    def output(self, path: str | None, text: str) -> None: ...

    def uses_stdout(self, *names: str) -> bool: ...


class FlagListError(ValueError):
    """A --streams or --policy list that cannot be used."""


@dataclass
class Simulation:
    """Everything one run produced; ``trace`` and ``html`` only when pictures were asked for."""

    what: WhatIf
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
            raise FlagListError(f"--streams: '{item}' is not an integer") from None
        if not 1 <= k <= MAX_STREAMS:
            raise FlagListError(f"--streams: {k} is outside 1..{MAX_STREAMS}")
        values.append(k)
    if not values:
        raise FlagListError("--streams: give at least one stream count, e.g. 1,2,4,8")
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
            raise FlagListError(f"--policy: '{item}' is not one of {', '.join(POLICIES)}")
        if policy not in result:
            result.append(policy)
    if not result:
        raise FlagListError(f"--policy: give at least one of {', '.join(POLICIES)}")
    return tuple(result)


def resolve_target(
    name: str = "h100", target_file: str | None = None, calibration: str | None = None
) -> Target:
    """``--target`` by name, or ``--target-file`` overrides on top of it, then the
    ratios of ``--calibration`` for it."""
    target = load_target(target_file, base=name) if target_file else get_target(name)
    return load_calibration(calibration).apply(target) if calibration else target


# -- the work ---------------------------------------------------------------------------


def simulate_module(
    module: Module,
    target: Target,
    streams: Sequence[int] = DEFAULT_STREAMS,
    policies: Sequence[Policy] = POLICIES,
    *,
    model: StreamModel | None = None,
    pictures_for: str | None = None,
    progress: Progress | None = None,
    compilation: Compilation | None = None,
) -> Simulation:
    """The what-if predictions for ``module``, under ``model`` unless ``compilation``
    has its pairs; with ``pictures_for`` (the trace's address for the HTML's link,
    or "" for none) also its trace and HTML."""
    pairs = compilation.pairs if compilation and Fact.ASYNC_PAIRS in compilation.facts else None
    if progress:
        count = sum(len(c.instructions) for c in module.computations)
        progress(f"cost model for {count} instructions")
    sim = Simulator(module, target, pairs, model=model, progress=progress)
    what = what_if(module, target, streams, policies, progress=progress, simulator=sim)
    result = Simulation(what, format_what_if(what))
    if pictures_for is not None:
        if progress:
            progress("recording timelines")
        result.trace, result.html = pictures(sim, what, trace_href=pictures_for or None)
    return result


def format_what_if(what: WhatIf) -> str:
    """The what-if table as aligned text."""
    base = what.baseline.step_time
    places: dict[str, int] = {}
    for pair in what.pairs:
        where = runs_on(pair)
        places[where] = places.get(where, 0) + 1
    lines = [
        f"module {what.module} on {what.target.name} ({what.target.description}): "
        f"{len(what.pairs)} async pairs; XLA runs "
        + ", ".join(f"{n} on {where}" for where, n in places.items()),
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
    for bound, how in what.bounds():
        lines.append(
            f"{bound.label}: {bound.step_time * 1e3:.4f} ms "
            f"({bound.exposed_communication * 1e3:.4f} ms, {_ratio(base, bound.step_time)}): "
            f"{how}, no bandwidth sharing"
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
    flags.DEFINE_string(
        "calibration", None, "A calibration file (schema xla_streams.calibration.v1, as "
        "tools/gpu_check.py writes it): measured/predicted ratios per kernel class for "
        "--target.", flag_values=fv,
    )  # fmt: skip
    define_stream_model_flags(fv)
    flags.DEFINE_bool(
        "progress", None, "Report progress on standard error (default: for inputs over "
        f"{PROGRESS_BYTES >> 20} MiB).", flag_values=fv,
    )  # fmt: skip


def run_cli(args: CliArgs) -> int:
    """``xla-streams simulate``, on the CLI's parsed ``args``.

    Bad flag values raise absl's ``IllegalFlagValueError``, which the CLI reports
    as a usage error (exit 2) however ``cli`` was imported (``python -m`` too).
    """
    try:
        ks = parse_streams(args.flag("streams"))
        ps = parse_policies(args.flag("policy"))
        target = resolve_target(
            args.flag("target"), args.flag("target-file"), args.flag("calibration")
        )
    except (FlagListError, TargetError, CalibrationError) as e:
        raise flags.IllegalFlagValueError(str(e)) from None
    model = stream_model(args.flag)
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
    trace, page = args.flag("trace"), args.flag("html")
    result = simulate_module(
        module, target, ks, ps, model=model, pictures_for=_trace_href(trace, page), progress=say
    )
    args.output(trace, result.trace or "")
    args.output(page, result.html or "")
    if args.uses_stdout("trace", "html"):
        args.messages.append(result.table)
    else:
        args.output(STDOUT, result.table)
    return 0


def _trace_href(trace: str | None, html: str | None) -> str | None:
    """The trace's address relative to the HTML page ("": no link), None: no pictures."""
    if not (trace or html):
        return None
    if not (trace and html) or STDOUT in (trace, html):
        return ""
    return os.path.relpath(os.path.abspath(trace), os.path.dirname(os.path.abspath(html)))


def simulate_command(
    path: str,
    *,
    streams: str | Sequence[int] = DEFAULT_STREAMS,
    policies: str | Sequence[str] = POLICIES,
    trace: str | None = None,
    html: str | None = None,
    target: str = "h100",
    target_file: str | None = None,
    calibration: str | None = None,
    model: StreamModel | None = None,
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
        chosen = resolve_target(target, target_file, calibration)
        text = Path(path).read_text(encoding="utf-8")
        show = progress if progress is not None else len(text) >= PROGRESS_BYTES
        say = progress_printer(err) if show else None
        if say:
            say(f"parsing {path}")
        module = parse_module(text, path)
        result = simulate_module(
            module, chosen, ks, ps, model=model, pictures_for=_trace_href(trace, html),
            progress=say,
        )  # fmt: skip
        atomic_write_many(
            [(d, c) for d, c in ((trace, result.trace), (html, result.html)) if d and c is not None]
        )
    except (OSError, HloError, TargetError, CalibrationError, FlagListError) as e:
        print(f"xla-streams simulate: {e}", file=err)
        return 2
    out.write(result.table)
    return 0
