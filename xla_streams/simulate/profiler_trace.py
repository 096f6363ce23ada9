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

from xla_streams._json import is_finite_number


@dataclass(frozen=True)
class Kernel:
    """One GPU kernel of a profiler trace, on one CUDA stream (``line``)."""

    line: tuple[int | str, int | str]  # (pid, tid), as the trace writes them
    name: str
    hlo_op: str
    begin: float  # microseconds
    duration: float


def load_trace(path: Path) -> dict[str, Any]:
    """The trace in ``path`` (gzipped when its name ends in ``.gz``); OSError or
    ValueError for a file that is not one."""
    opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            data = json.load(f)
    except EOFError:  # a gzip stream cut short
        raise ValueError("not a whole gzip file: it ends early") from None
    except RecursionError:
        raise ValueError("not a Chrome-format trace: JSON nested too deeply") from None
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
        pid: name
        for e in events
        if e.get("name") == "process_name"
        and (pid := _id(e.get("pid"))) is not None
        and (name := _name(e)) is not None
    }
    lines = {
        (pid, tid): name
        for e in events
        if e.get("name") == "thread_name"
        and (pid := _id(e.get("pid"))) is not None
        and (tid := _id(e.get("tid"))) is not None
        and (name := _name(e)) is not None
    }
    gpus = {pid for pid, name in processes.items() if "GPU" in name}
    streams = {key for key, name in lines.items() if key[0] in gpus and name.startswith("Stream")}
    kernels = []
    for index, e in enumerate(trace.get("traceEvents", [])):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        line = (_id(e.get("pid")), _id(e.get("tid")))
        args = e.get("args")
        if line not in streams or not isinstance(args, dict) or "hlo_op" not in args:
            continue
        op, begin, duration = args["hlo_op"], e.get("ts", 0.0), e.get("dur", 0.0)
        timed = is_finite_number(begin) and is_finite_number(duration) and duration >= 0
        if not isinstance(op, str) or not timed:
            raise ValueError(
                f"traceEvents[{index}]: a kernel needs a string hlo_op and numbers ts and "
                f"dur (dur at least 0), found hlo_op={op!r}, ts={begin!r}, dur={duration!r}"
            )
        name = e.get("name")
        kernels.append(
            Kernel(line, name if isinstance(name, str) else "", op, float(begin), float(duration))
        )
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


def _id(value: Any) -> int | str | None:
    """A process or thread id as Chrome traces write one (a number or a string)."""
    return value if isinstance(value, int | str) and not isinstance(value, bool) else None


def _name(event: dict[str, Any]) -> str | None:
    """The name a metadata event gives its process or thread."""
    args = event.get("args")
    name = args.get("name") if isinstance(args, dict) else None
    return name if isinstance(name, str) else None
