"""``xla-streams simulate``: the what-if table for a scheduled module, and its pictures.

    xla-streams simulate IN.hlo --streams=1,2,4,8 --policy=interval,round-robin \\
        --trace=OUT.json --html=OUT.html --json=OUT.json [--target=h100
        --target-file=T.json] [--calibration=C.json] [--perf-table=TABLE.txtpb]
        [--profile=PGLE.pbtxt] [--xla-schedule=FILE|DIR] [--overlap-limit=N]
        [--sync-on-compute]

Besides the what-if table for each K and policy it predicts XLA's own
collective multi-streaming (``xla_stream_assignment``: streams 0 and 1 in turn,
in post-order), the range of the K=1 step time when every modelled input is at
either end of its error bound (``predict_range``), with a PGLE profile how much of
the step was measured rather than modelled, and with XLA's schedule dump of the same
module (``--xla-schedule``) XLA's own estimate beside ours, split alike into kernels
and exposed communication. ``--json`` writes all of it
(:class:`~xla_streams.simulate.prediction.Prediction`, schema ``xla_streams.simulate.v1``).

The command lives here so that ``cli.py`` only registers it (``command_flags``,
``run_cli``); ``simulate_command`` is the same for Python callers. ``run_cli``
takes any object with the few members of the CLI's arguments it uses
(:class:`CliArgs`). The work is :func:`xla_streams.simulate.simulation.simulate_module`;
the pictures, and the trace and HTML the plugin writes, are in
:mod:`xla_streams.simulate.visual`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

from xla_streams._io import atomic_write_many
from xla_streams.cli import flags
from xla_streams.cli.inputs import InputError
from xla_streams.cli.stream_model_flags import stream_model, stream_model_flags
from xla_streams.collectives import (
    MAX_STREAMS,
    POLICIES,
    STREAM_COUNTS,
    STREAMS,
    Policy,
    StreamModel,
)
from xla_streams.hlo import HloError, parse_module
from xla_streams.option import Option, boolean, choice, optional, path, text
from xla_streams.simulate.calibration import CalibrationError, load_calibration
from xla_streams.simulate.compiler import Progress
from xla_streams.simulate.measured import PerfTableError
from xla_streams.simulate.prediction import SCHEMA
from xla_streams.simulate.profile import Profile, ProfileError, load_profile
from xla_streams.simulate.simulation import simulate_module
from xla_streams.simulate.targets import (
    TARGETS,
    Target,
    TargetError,
    get_target,
    load_target,
    with_perf_table,
)
from xla_streams.simulate.xla_estimate import (
    ScheduleError,
    XlaEstimate,
    find_schedule,
    read_schedule,
)

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
            values.append(STREAMS.read(item))
        except ValueError as e:
            raise FlagListError(f"--streams: '{item}' is not valid: {e}") from None
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
    name: str = "h100",
    target_file: str | None = None,
    calibration: str | None = None,
    perf_table: str | None = None,
) -> Target:
    """``--target`` by name, or ``--target-file`` overrides on top of it, then the
    ratios of ``--calibration`` for it, pricing collectives from ``--perf-table``
    (see :func:`use_perf_table` for its errors)."""
    target = load_target(target_file, base=name) if target_file else get_target(name)
    if perf_table:
        target = use_perf_table(target, perf_table)
    return load_calibration(calibration).apply(target) if calibration else target


def use_perf_table(target: Target, path: str) -> Target:
    """``target`` pricing collectives from the table at ``path``: PerfTableError when it
    cannot be read or lacks the target's GPU, TargetError when the target has no key
    in XLA's tables (the table would go unused)."""
    if target.perf_table_key is None:
        raise TargetError(
            f"target '{target.name}' has no key in XLA's performance tables, so a table "
            'would not be used; set "perf_table_key" (e.g. "sm_80") in a --target-file'
        )
    return with_perf_table(target, path)


def read_profile(path: str) -> Profile:
    """``--profile``: a PGLE profile (ProfileError, ``file:line``, when unreadable)."""
    return load_profile(path)


def read_xla_schedule(path: str) -> XlaEstimate:
    """``--xla-schedule``: XLA's schedule dump, a ``<module>.schedule.txt`` or the dump
    folder holding one (ScheduleError, naming the file, when it cannot be read)."""
    return read_schedule(find_schedule(path) if os.path.isdir(path) else path)


# -- the work ---------------------------------------------------------------------------


def progress_printer(err: TextIO) -> Progress:
    """Progress lines with the elapsed time, for long runs."""
    begin = time.perf_counter()

    def say(message: str) -> None:
        print(f"[simulate {time.perf_counter() - begin:6.2f}s] {message}", file=err, flush=True)

    return say


# -- entry points -----------------------------------------------------------------------


_FILE = optional(path(metavar="FILE"), takes="a path")
# The flags of ``xla-streams simulate``.
FLAGS: tuple[Option[Any], ...] = (
    Option("streams", ",".join(map(str, STREAM_COUNTS)),
        f"Numbers of collective streams K to predict, comma separated (each 1..{MAX_STREAMS}).",
        text(metavar="K,...")),
    Option("policy", ",".join(POLICIES),
        f"Assignment policies to predict, comma separated: {', '.join(POLICIES)}.",
        text(metavar="POLICY,...")),
    Option("trace", None, "Write the predicted timelines as a Chrome/Perfetto trace (JSON) to "
        "this file; open it in ui.perfetto.dev or TensorBoard.", _FILE),
    Option("html", None,
        "Write a self-contained HTML report (timelines, tables) to this file.", _FILE),
    Option("target", "h100",
        "The GPU to predict for (constants: xla_streams/simulate/targets.py).",
        choice(list(TARGETS))),
    Option("target_file", None, "JSON object overriding fields of --target, e.g. "
        '{"link_efficiency": 0.7, "devices_per_host": 4}.', _FILE),
    Option("calibration", None, "A calibration file (schema xla_streams.calibration.v1, as "
        "`xla-streams calibrate` or tools/gpu_check.py writes it): measured/predicted "
        "ratios per kernel class for --target.", _FILE),
    Option("perf_table", None, "XLA's collective performance table (the text or binary "
        "DeviceHloInstructionProfiles that --xla_gpu_experimental_collective_perf_table_path "
        "takes) to price collectives inside a host from, instead of the table vendored from "
        "XLA.", _FILE),
    Option("profile", None, "A PGLE profile of this program (ProfiledInstructionsProto, text "
        "or binary, from jax.experimental.profiler.get_profiled_instructions_proto or "
        "JAX_ENABLE_PGLE): the instructions it names take their measured time, and the "
        "output says how much of the step was measured.", _FILE),
    Option("xla_schedule", None, "XLA's latency-hiding schedule of this module (the "
        "<module>.schedule.txt a compile with xla_dump_to=DIR and "
        "xla_dump_latency_hiding_schedule=true writes, or DIR): XLA's own estimate of "
        "the step beside ours, split alike into kernels and exposed communication.",
        optional(path(metavar="FILE|DIR"), takes="a path")),
    Option("json", None, f"Also write the prediction as JSON (schema {SCHEMA}) to this file "
        "('-': standard output).", _FILE),
    *stream_model_flags(),
    Option("progress", None, "Report progress on standard error (default: for inputs over "
        f"{PROGRESS_BYTES >> 20} MiB).", optional(boolean(), takes="true or false")),
)  # fmt: skip


def run_cli(args: CliArgs) -> int:
    """``xla-streams simulate``, on the CLI's parsed ``args``.

    Bad flag values (a performance table or a profile that cannot be read among
    them, named ``file:line``) raise ``flags.FlagError``, which the CLI
    reports as a usage error (exit 2) however ``cli`` was imported (``python -m`` too).
    """
    try:
        ks = parse_streams(args.flag("streams"))
        ps = parse_policies(args.flag("policy"))
        target = resolve_target(
            args.flag("target"), args.flag("target_file"), args.flag("calibration")
        )
    except (FlagListError, TargetError, CalibrationError) as e:
        raise flags.FlagError(str(e)) from None
    table_path, profile_path = args.flag("perf_table"), args.flag("profile")
    schedule_path = args.flag("xla_schedule")
    try:
        if table_path:
            target = use_perf_table(target, table_path)
    except (PerfTableError, TargetError) as e:
        raise flags.FlagError(f"--perf-table: {e}") from None
    try:
        profile = read_profile(profile_path) if profile_path else None
    except ProfileError as e:
        raise flags.FlagError(f"--profile: {e}") from None
    try:
        estimate = read_xla_schedule(schedule_path) if schedule_path else None
    except ScheduleError as e:
        raise flags.FlagError(f"--xla-schedule: {e}") from None
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
    trace, page, report = args.flag("trace"), args.flag("html"), args.flag("json")
    try:
        result = simulate_module(
            module, target, ks, ps, model=model, pictures_for=_trace_href(trace, page),
            progress=say, profile=profile, xla_estimate=estimate,
        )  # fmt: skip
    except PerfTableError as e:  # a target file's perf_table_key the table lacks
        raise InputError(f"perf_table_key: {e}") from None
    args.output(trace, result.trace or "")
    args.output(page, result.html or "")
    if report:
        args.output(report, result.prediction().to_json())
    if args.uses_stdout("trace", "html", "json"):
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
    streams: str | Sequence[int] = STREAM_COUNTS,
    policies: str | Sequence[str] = POLICIES,
    trace: str | None = None,
    html: str | None = None,
    json_path: str | None = None,
    target: str = "h100",
    target_file: str | None = None,
    calibration: str | None = None,
    perf_table: str | None = None,
    profile: str | None = None,
    xla_schedule: str | None = None,
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
        chosen = resolve_target(target, target_file, calibration, perf_table)
        loaded = read_profile(profile) if profile else None
        estimate = read_xla_schedule(xla_schedule) if xla_schedule else None
        text = Path(path).read_text(encoding="utf-8")
        show = progress if progress is not None else len(text) >= PROGRESS_BYTES
        say = progress_printer(err) if show else None
        if say:
            say(f"parsing {path}")
        module = parse_module(text, path)
        result = simulate_module(
            module, chosen, ks, ps, model=model, pictures_for=_trace_href(trace, html),
            progress=say, profile=loaded, xla_estimate=estimate,
        )  # fmt: skip
        report = result.prediction().to_json() if json_path else None
        atomic_write_many(
            [
                (d, c)
                for d, c in ((trace, result.trace), (html, result.html), (json_path, report))
                if d and c is not None
            ]
        )
    except (
        OSError, HloError, TargetError, CalibrationError, FlagListError, PerfTableError,
        ProfileError, ScheduleError,
    ) as e:  # fmt: skip
        print(f"xla-streams simulate: {e}", file=err)
        return 2
    out.write(result.table)
    return 0
