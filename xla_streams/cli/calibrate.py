"""``xla-streams calibrate``: a calibration file from a profiler trace of a real run.

    xla-streams calibrate MODULE.hlo --trace=TRACE --steps=N --target=h200 \\
        --json=calibration.json

``MODULE.hlo`` is the module the GPU ran (``compiled.as_text()``), ``TRACE`` what
``jax.profiler.trace(DIR, create_perfetto_trace=True)`` wrote around ``N`` of its
steps (the folder ``DIR`` or the trace file in it). The kernel time of each
instruction per step, against the cost model's prediction for ``--target``, gives one
ratio per kernel class (:func:`xla_streams.simulate.calibration.calibrate`); the file
(schema ``xla_streams.calibration.v1``) is what ``xla-streams simulate
--calibration`` and ``tune --calibration`` read.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from xla_streams._text import aligned
from xla_streams.cli import flags
from xla_streams.cli.command import Args
from xla_streams.hlo import parse_module
from xla_streams.option import Option, choice, integer, optional, path, text
from xla_streams.simulate.calibration import SCHEMA, calibrate
from xla_streams.simulate.profiler_trace import (
    find_trace,
    gpu_kernels,
    load_trace,
    seconds_by_instruction,
)
from xla_streams.simulate.targets import TARGETS

_FILE = optional(path(metavar="FILE"), takes="a path")

FLAGS: tuple[Option[Any], ...] = (
    Option("trace", None, "The profiler trace of the run: the folder jax.profiler.trace(DIR, "
        "create_perfetto_trace=True) wrote, or the trace file in it (.json or .json.gz).",
        optional(path(metavar="DIR_OR_FILE"), takes="a path")),
    Option("steps", 1, "How many steps of the module the trace holds.", integer(1)),
    Option("target", "h100", "The GPU the trace was measured on (the cost model's constants: "
        "xla_streams/simulate/targets.py).", choice(list(TARGETS))),
    Option("gpu", None, "The GPU's name as the run saw it (jax.devices()[0].device_kind), "
        "kept in the file's provenance.", optional(text(), takes="a name")),
    Option("json", None, f"Write the calibration (schema {SCHEMA}) to this file ('-': "
        "standard output).", _FILE),
)  # fmt: skip


def run_cli(args: Args) -> int:
    """``xla-streams calibrate``: a trace that cannot be read, or that measured nothing of
    the module, is a ``flags.FlagError`` naming ``--trace``."""
    given = args.flag("trace")
    if given is None:
        raise flags.FlagError("missing --trace: the profiler trace of the run")
    steps, target = args.flag("steps"), args.flag("target")
    path, text = args.input()
    module = parse_module(text, path)
    try:
        trace_path = find_trace(Path(given)) if Path(given).is_dir() else Path(given)
        kernels, found = gpu_kernels(load_trace(trace_path))
    except (OSError, ValueError) as e:
        raise flags.FlagError(f"--trace: cannot read '{given}': {e}") from None
    measured = seconds_by_instruction(kernels, steps)
    names = {i.name for c in module.computations for i in c.instructions}
    if not kernels or not names & measured.keys():
        raise flags.FlagError(
            f"--trace: {trace_path} measured no instruction of module {module.name}: "
            f"{found['kernels']} kernel(s) with an hlo_op on the lines "
            f"{', '.join(found['stream_lines']) or 'none'} of the GPU processes "
            f"{', '.join(found['gpu_processes']) or 'none'}; is it a trace of this module?"
        )
    provenance = {
        "date": datetime.date.today().isoformat(),
        "program": f"{module.name} ({path})",
        "tool": "xla-streams calibrate",
        "trace": str(trace_path),
    }
    if args.flag("gpu"):
        provenance["gpu"] = args.flag("gpu")
    calibration, figures = calibrate(text, measured, None, provenance, target)
    args.output(args.flag("json"), calibration.to_json())
    table = _table(figures, target, len(kernels), steps, trace_path)
    if args.uses_stdout("json"):
        args.messages.append(table)
    else:
        args.output("-", table)
    return 0


def _table(figures: dict[str, Any], target: str, kernels: int, steps: int, trace: Path) -> str:
    rows = [["class", "instructions", "predicted", "measured", "ratio"]]
    for name, c in figures["classes"].items():
        ratio = figures["ratios"].get(name)
        rows.append(
            [name, str(c["instructions"]), f"{c['predicted_ms']:.4f} ms",
             f"{c['measured_ms']:.4f} ms", "-" if ratio is None else f"{ratio:.4f}"]
        )  # fmt: skip
    step = figures["step"]
    lines = [
        f"{kernels} GPU kernels in {trace}, {steps} step(s); per step, on {target}:",
        *aligned(rows, indent="  "),
        f"compute of a step: {step['predicted_compute_ms']:.4f} ms predicted, "
        f"{step['calibrated_compute_ms']:.4f} ms calibrated",
    ]
    return "\n".join(lines) + "\n"
