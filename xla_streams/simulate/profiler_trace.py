"""A JAX profiler trace, read: the GPU kernels it measured, each on its CUDA stream and
charged to its HLO instruction.

``jax.profiler.trace(DIR, create_perfetto_trace=True)`` around a few steps writes
``DIR/plugins/profile/<run>/perfetto_trace.json.gz`` (older versions
``<host>.trace.json.gz``), a Chrome-format trace. What a calibration
(:func:`xla_streams.simulate.calibration.calibrate`) and the GPU check's placement
check need of it is here: :func:`find_trace`, :func:`load_trace`, :func:`gpu_kernels`
and :func:`seconds_by_instruction`.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Kernel:
    """One GPU kernel of a profiler trace, on one CUDA stream (``line``)."""

    line: tuple[int, int]  # (pid, tid)
    name: str
    hlo_op: str
    begin: float  # microseconds
    duration: float


def load_trace(path: Path) -> dict[str, Any]:
    """The trace in ``path`` (gzipped when its name ends in ``.gz``); OSError or
    ValueError for a file that is not one."""
    opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ValueError("not a Chrome-format trace: no list of traceEvents")
    return data


def find_trace(log_dir: Path) -> Path:
    """The Chrome-format trace ``jax.profiler.trace(log_dir, create_perfetto_trace=True)``
    wrote (the newest run's)."""
    for pattern in ("perfetto_trace.json.gz", "*.trace.json.gz"):
        found = sorted(log_dir.glob(f"plugins/profile/*/{pattern}"))
        if found:
            return found[-1]
    raise FileNotFoundError(f"no profiler trace under {log_dir}/plugins/profile")


def gpu_kernels(trace: dict[str, Any]) -> tuple[list[Kernel], dict[str, Any]]:
    """The kernels on the GPUs' CUDA stream lines that carry an ``hlo_op``, and what was
    found (process and line names), for when the trace is not as expected.

    JAX's traces name a GPU's process ``/device:GPU:N`` and its CUDA streams
    ``Stream #N(...)``; other lines of the GPU (XLA Ops, XLA Modules) repeat the
    kernels' times and are left out.
    """
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict)]
    processes = {
        e.get("pid"): e.get("args", {}).get("name", "")
        for e in events
        if e.get("name") == "process_name"
    }
    lines = {
        (e.get("pid"), e.get("tid")): e.get("args", {}).get("name", "")
        for e in events
        if e.get("name") == "thread_name"
    }
    gpus = {pid for pid, name in processes.items() if "GPU" in name}
    streams = {key for key, name in lines.items() if key[0] in gpus and name.startswith("Stream")}
    kernels = [
        Kernel((e["pid"], e["tid"]), e.get("name", ""), str(e["args"]["hlo_op"]),
               float(e.get("ts", 0.0)), float(e.get("dur", 0.0)))
        for e in events
        if e.get("ph") == "X"
        and (e.get("pid"), e.get("tid")) in streams
        and "hlo_op" in e.get("args", {})
    ]  # fmt: skip
    found = {
        "gpu_processes": sorted(processes[p] for p in gpus),
        "stream_lines": sorted(lines[k] for k in streams),
        "kernels": len(kernels),
    }
    return kernels, found


def seconds_by_instruction(kernels: list[Kernel], steps: int) -> dict[str, float]:
    """Kernel time per HLO instruction in one step, of a trace of ``steps`` steps."""
    total: dict[str, float] = {}
    for k in kernels:
        total[k.hlo_op] = total.get(k.hlo_op, 0.0) + k.duration * 1e-6
    return {name: seconds / steps for name, seconds in total.items()}
