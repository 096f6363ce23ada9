"""``xla-streams demo``: compile a sharded transformer step and show its collectives
spread over collective streams.

On a machine with enough NVIDIA GPUs the program is compiled for them with the
plugin on, so the assignment is made inside XLA's compile by the same hook an
unmodified program gets from ``XLA_STREAMS_COLLECTIVE_STREAMS``. Without them
it is compiled for 8 H100s with no GPU at all (XLA's GPU compiler against a
compile-only topology, the ``gpu-aot`` extra) and the plugin's pipeline runs on
the scheduled module that compile produced. Either way the table of the
assignment is printed and the JSON report (schema
``xla_streams.assignment.v1``) and the table are written to a report folder.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, TextIO

from xla_streams.collectives import MAX_STREAMS, POLICIES

PROG = "xla-streams demo"
DEFAULT_REPORT_DIR = "xla_streams_reports"
EXIT_OK = 0
EXIT_UNAVAILABLE = 2


@dataclass(frozen=True)
class Outcome:
    mode: str  # "gpu" or "aot"
    where: str  # what it was compiled for, in words
    table: str
    json_path: str
    text_path: str


def _parser() -> argparse.ArgumentParser:
    from xla_streams.programs import DEFAULT_PROGRAM, PROGRAMS

    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Compile an embedded sharded JAX program (real GPUs when there are enough, "
            "else 8 H100s without a GPU), assign its async collectives to K collective "
            "streams, print the assignment and write its report."
        ),
    )
    parser.add_argument(
        "--program",
        default=DEFAULT_PROGRAM,
        choices=sorted(PROGRAMS),
        help=f"the program to compile (default {DEFAULT_PROGRAM})",
    )
    parser.add_argument(
        "--streams",
        type=_streams,
        default=4,
        metavar="K",
        help=f"collective streams, 1..{MAX_STREAMS} (default 4)",
    )
    parser.add_argument("--policy", default="interval", choices=POLICIES)
    parser.add_argument(
        "--report-dir",
        default=None,
        metavar="DIR",
        help=f"where the report goes (default ./{DEFAULT_REPORT_DIR}, or a temporary "
        "folder when the current one is not writable)",
    )
    parser.add_argument(
        "--mode",
        default="auto",
        choices=("auto", "gpu", "aot"),
        help="gpu: compile on this machine's GPUs with the plugin; aot: compile without a "
        "GPU; auto (default): gpu when there are enough GPUs, else aot",
    )
    parser.add_argument(
        "--target", default="h100", choices=("h100", "a100"), help="GPU for aot (default h100)"
    )
    return parser


def _streams(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_STREAMS:
        raise argparse.ArgumentTypeError(f"expected an integer from 1 to {MAX_STREAMS}")
    return value


def visible_gpus() -> int:
    """NVIDIA GPUs this process may use, counted without starting CUDA or JAX."""
    found = len(glob.glob("/proc/driver/nvidia/gpus/*"))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip().lower() not in ("", "all"):
        found = min(found, len([d for d in visible.split(",") if d.strip()]))
    elif visible is not None and visible.strip() == "":
        found = 0
    return found


def _report_dir(chosen: str | None) -> str:
    if chosen is not None:
        return os.path.abspath(chosen)
    here = os.path.abspath(DEFAULT_REPORT_DIR)
    try:
        os.makedirs(here, exist_ok=True)
        if os.access(here, os.W_OK):
            return here
    except OSError:
        pass
    return tempfile.mkdtemp(prefix="xla_streams_reports_")


def main(argv: list[str] | None = None, *, out: TextIO | None = None) -> int:
    """Run the demo; ``argv`` excludes ``xla-streams demo``. Returns the exit code."""
    out = out or sys.stdout
    ns = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    from xla_streams.programs import PROGRAMS

    program = PROGRAMS[ns.program]
    mode = ns.mode
    if mode == "auto":
        has_plugin = importlib.util.find_spec("jax_cuda12_plugin") is not None
        mode = "gpu" if has_plugin and visible_gpus() >= program.num_devices else "aot"
    report_dir = _report_dir(ns.report_dir)
    try:
        if mode == "gpu":
            outcome = _on_gpus(program, ns.streams, ns.policy, report_dir)
        else:
            outcome = _without_gpu(program, ns.streams, ns.policy, report_dir, ns.target)
    except _Unavailable as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    out.write(
        f"{program.name}: {program.description.strip()}\n"
        f"compiled for {outcome.where}; {ns.streams} collective streams, policy {ns.policy}\n\n"
    )
    out.write(outcome.table)
    out.write(
        f"\nreport (JSON, schema xla_streams.assignment.v1): {outcome.json_path}\n"
        f"table: {outcome.text_path}\n"
        f"To do this inside any JAX program: XLA_STREAMS_COLLECTIVE_STREAMS={ns.streams} "
        f"XLA_STREAMS_REPORT_DIR={report_dir} python your_program.py\n"
    )
    return EXIT_OK


class _Unavailable(Exception):
    pass


def _without_gpu(program: Any, streams: int, policy: str, report_dir: str, target: str) -> Outcome:
    """Compile for ``program.num_devices`` GPUs with no GPU; run the pipeline on the result."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from xla_streams import aot
    from xla_streams.config import Config
    from xla_streams.plugin import native_xla_flags, process_text
    from xla_streams.report import build_report, format_report

    try:
        topology = aot.gpu_topology(target, program.num_devices, program.devices_per_host)
    except aot.GpuAotUnavailable as e:
        raise _Unavailable(
            f"no GPU here, and {e}. Install with: pip install -e '.[gpu-aot]'"
        ) from None
    fn, args = program.build(topology.devices)
    # The options the plugin would put in XLA_FLAGS.
    options = {name: int(value) for name, value in native_xla_flags(streams).items()}
    compiled = aot.compile_for_gpu(fn, args, compiler_options=options, dump=False)
    config = Config(collective_streams=streams, policy=policy, report_dir=report_dir)  # type: ignore[arg-type]
    processed = process_text(compiled.as_text, config)
    json_path, text_path = processed.reports
    table = format_report(build_report(processed.compilation))
    where = (
        f"{program.num_devices} x {target.upper()} without a GPU "
        "(XLA's GPU compiler, compile-only topology)"
    )
    return Outcome("aot", where, table, json_path, text_path)


def _on_gpus(program: Any, streams: int, policy: str, report_dir: str) -> Outcome:
    """Compile for this machine's GPUs with the plugin on: the hook makes the report."""
    from xla_streams import plugin

    plugin.enable(streams, policy=policy, report_dir=report_dir)
    import jax

    devices = jax.devices()
    if devices[0].platform != "gpu" or len(devices) < program.num_devices:
        raise _Unavailable(
            f"{program.name} needs {program.num_devices} GPUs, JAX sees "
            f"{len(devices)} {devices[0].platform} device(s); use --mode=aot"
        )
    fn, args = program.build(devices[: program.num_devices])
    compiled = fn.lower(*args).compile()
    name = compiled.as_text().split(",", 1)[0].removeprefix("HloModule ").strip()
    mine = [p for p in plugin.stats().reports if os.path.basename(p).startswith(name + ".")]
    if not mine:
        raise _Unavailable(f"the plugin wrote no report for module {name}; see the log above")
    json_path = mine[-1]
    text_path = json_path.removesuffix(".json") + ".txt"
    with open(text_path, encoding="utf-8") as f:
        table = f.read()
    kind = getattr(devices[0], "device_kind", "GPU")
    where = f"{program.num_devices} x {kind} (this machine; assigned inside XLA's compile)"
    return Outcome("gpu", where, table, json_path, text_path)


if __name__ == "__main__":
    sys.exit(main())
