"""``xla-streams demo``: compile a sharded transformer step and show its collectives
spread over collective streams.

The program is compiled with the plugin on, so the assignment is made inside
XLA's compile by the same hook an unmodified program gets from
``XLA_STREAMS_COLLECTIVE_STREAMS``: for this machine's GPUs when it has enough,
else for 8 H100s with no GPU at all (XLA's GPU compiler against a compile-only
topology, the ``gpu-aot`` extra; since jax 0.11 the hook runs there too). The
table of the assignment is printed, and the JSON report (schema
``xla_streams.assignment.v2``), the table and the index are written to a report
folder (a new temporary one unless ``--report-dir`` says where).
"""

from __future__ import annotations

import glob
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Literal, TextIO

from xla_streams import aot, jax_compat, plugin
from xla_streams.plugin import hook
from xla_streams.programs import PROGRAMS

Mode = Literal["auto", "gpu", "aot"]


class Unavailable(Exception):
    """The demo cannot run here as asked; the message says why and what to do."""


@dataclass(frozen=True)
class Outcome:
    where: str  # what it was compiled for, in words
    table: str
    json_path: str
    text_path: str


def run(
    program_name: str,
    streams: int,
    policy: str,
    *,
    report_dir: str | None = None,
    mode: Mode = "auto",
    target: str = "h100",
    out: TextIO,
) -> None:
    """Compile ``program_name`` with the plugin on and print its assignment. Raises Unavailable."""
    program = PROGRAMS[program_name]
    if mode == "auto":
        enough = visible_gpus() >= program.num_devices
        mode = "gpu" if enough and jax_compat.cuda_plugin_module() is not None else "aot"
    if mode == "aot":
        # The compile-only client needs no GPU; JAX must not try to open one.
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    report_dir = os.path.abspath(report_dir or tempfile.mkdtemp(prefix="xla_streams_demo_"))
    # Before JAX starts, so that the XLA options native mode needs take effect.
    plugin.enable(streams, policy=policy, report_dir=report_dir)
    hook.reset_stats()
    if mode == "gpu":
        devices, where = _gpus(program)
    else:
        devices, where = _compile_only(program, target)
    fn, args = program.build(devices)
    compiled: Any = fn.lower(*args).compile()  # type: ignore[attr-defined]
    name = compiled.as_text().split(",", 1)[0].removeprefix("HloModule ").strip()
    mine = [p for p in hook.stats().reports if os.path.basename(p).startswith(name + ".")]
    if not mine:
        raise Unavailable(f"the plugin wrote no report for module {name}; see the log above")
    json_path = mine[-1]
    text_path = json_path.removesuffix(".json") + ".txt"
    with open(text_path, encoding="utf-8") as f:
        table = f.read()
    out.write(
        f"{program.name}: {program.description.strip()}\n"
        f"compiled for {where}; {streams} collective streams, policy {policy}\n\n"
        f"{table}\n"
        f"report (JSON, schema xla_streams.assignment.v2): {json_path}\n"
        f"table: {text_path}\n"
        f"index of every module: {os.path.join(report_dir, 'index.txt')}\n"
        f"To do this inside any JAX program: XLA_STREAMS_COLLECTIVE_STREAMS={streams} "
        f"XLA_STREAMS_REPORT_DIR={report_dir} python your_program.py\n"
    )


def _gpus(program: Any) -> tuple[list[Any], str]:
    import jax

    devices = jax.devices()
    if devices[0].platform != "gpu" or len(devices) < program.num_devices:
        raise Unavailable(
            f"{program.name} needs {program.num_devices} GPUs, JAX sees "
            f"{len(devices)} {devices[0].platform} device(s); use --mode=aot"
        )
    kind = getattr(devices[0], "device_kind", "GPU")
    return devices[: program.num_devices], f"{program.num_devices} x {kind} (this machine)"


def _compile_only(program: Any, target: str) -> tuple[list[Any], str]:
    try:
        topology = aot.gpu_topology(target, program.num_devices, program.devices_per_host)
    except aot.GpuAotUnavailable as e:
        raise Unavailable(
            f"no GPU here, and {e}. Install with: pip install -e '.[gpu-aot]'"
        ) from None
    where = (
        f"{program.num_devices} x {target.upper()} without a GPU "
        "(XLA's GPU compiler, compile-only topology)"
    )
    return list(topology.devices), where


def visible_gpus() -> int:
    """NVIDIA GPUs this process may use, counted without starting CUDA or JAX."""
    found = len(glob.glob("/proc/driver/nvidia/gpus/*"))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip().lower() not in ("", "all"):
        found = min(found, len([d for d in visible.split(",") if d.strip()]))
    elif visible is not None and visible.strip() == "":
        found = 0
    return found
