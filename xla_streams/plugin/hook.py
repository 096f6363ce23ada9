"""The compile hook: one road for every module XLA compiles, in native and ffi mode.

XLA hands the hook its scheduled module (``PipelineStage.POST_SCHEDULER``) as a
serialized ``HloModuleProto``:

1. modules with no collective at all are skipped on a byte scan (XLA compiles
   many: autotuning candidates, fusions), with no report;
2. the proto is printed to HLO text (:mod:`xla_streams.plugin.xla_module`) and the
   pipeline runs over it: :func:`pipeline_for` (``pipeline.build_pipeline`` of
   the settings: the default passes, or the user's spec with the settings as
   defaults; on GPUs it has a model of, :func:`job_gpu`, ``fit-on-gpu`` keeps K to
   what they hold, with a warning where it lowers it);
3. what changed goes back to XLA (:func:`back_to_xla`): annotations written
   into XLA's own proto, a restructured module (ffi mode) through XLA's parser;
4. with a report directory, the module's reports and the index are written
   (:mod:`xla_streams.report`), after XLA has the module back; for a module JAX
   loads from its persistent cache, by :func:`report_cached`.

An internal error never breaks a compile unless the settings are strict: it is
logged with the module's name and the module goes on unchanged.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from xla_streams import jax_compat
from xla_streams import runtime as ffi_runtime
from xla_streams._log import logger
from xla_streams.collectives import (
    COLLECTIVE_OPCODES,
    KINDS,
    STREAM_COUNTS,
    StreamModel,
    device_groups,
)
from xla_streams.hlo import Module, parse_module
from xla_streams.passes.base import Compilation, Fact, ModulePass
from xla_streams.pipeline import PassManager, Runtime, build_pipeline
from xla_streams.plugin import xla_module

if TYPE_CHECKING:
    from xla_streams.plugin.settings import Config

_FINGERPRINT_CHARS = 16


class PluginError(RuntimeError):
    """Raised from inside XLA's compile in strict mode; XLA reports it as the compile's error."""


@dataclass
class Stats:
    """What the hook has done in this process (for tests and the demo)."""

    calls: int = 0
    changed: int = 0
    failed: int = 0
    reports: list[str] = field(default_factory=list)
    seconds: float = 0.0  # time spent in the hook


_lock = threading.Lock()
_stats = Stats()


_said: set[str] = set()


def _say_once(message: str) -> None:
    """Log ``message`` at info level the first time only (a process compiles many modules)."""
    with _lock:
        if message in _said:
            return
        _said.add(message)
    logger.info("%s", message)


def stats() -> Stats:
    """A copy of the hook's counters."""
    with _lock:
        return replace(_stats, reports=list(_stats.reports))


def reset_stats() -> None:
    global _stats
    with _lock:
        _stats = Stats()


# How an instruction's opcode is stored in an HloInstructionProto (field 2, a string):
# the opcodes of every collective, plain or async.
_COLLECTIVE_OPCODES = tuple(
    b"\x12" + bytes([len(op)]) + op
    for op in (
        *(name.encode() for name in COLLECTIVE_OPCODES),
        *(f"{name}-start".encode() for name in COLLECTIVE_OPCODES),
        b"async-start", b"send", b"recv",
    )
)  # fmt: skip


def has_collective(serialized: bytes) -> bool:
    """Whether a serialized module may hold a collective (false positives are fine)."""
    return any(op in serialized for op in _COLLECTIVE_OPCODES)


def transform(
    serialized: bytes, *, on_cpu: bool, config: Config, model: StreamModel
) -> bytes | None:
    """The compile hook: a serialized HloModuleProto in, the changed one (or None) out."""
    begin = time.perf_counter()
    with _lock:
        _stats.calls += 1
    name = "<unparsed module>"
    try:
        if not has_collective(serialized):
            out = None
        else:
            name, text = xla_module.module_text(serialized)
            compilation = _run_passes(
                serialized, name, text, on_cpu=on_cpu, config=config, model=model
            )
            if compilation is None:
                return None
            out = back_to_xla(serialized, compilation)
            if on_cpu and config.mode == "native":
                _say_once(
                    "XLA:CPU runs collectives synchronously, so native mode has nothing to put "
                    "on streams there; XLA_STREAMS_MODE=ffi runs them on streams (our host "
                    "runtime)"
                )
            # Only once XLA has the module back: a report describes what runs.
            if config.report_dir is not None:
                write_module_reports(compilation, text, config, html=_html(config, on_cpu))
    except Exception as e:
        with _lock:
            _stats.failed += 1
        reason = f"{type(e).__name__}: {e}"
        if config.strict:
            raise PluginError(f"xla_streams failed on module {name}: {reason}") from e
        logger.warning("module %s left unchanged: %s", name, reason)
        return None
    finally:
        with _lock:
            _stats.seconds += time.perf_counter() - begin
    if out is not None:
        with _lock:
            _stats.changed += 1
    return out


FROM_CACHE = "(from JAX's persistent compilation cache)"  # ends a report's line


def report_cached(
    serialized: bytes, *, on_cpu: bool, config: Config, model: StreamModel
) -> tuple[str, ...]:
    """The reports of a module whose executable JAX loaded from its persistent cache
    (:mod:`xla_streams.plugin.cache`): the pipeline run again over the module the hook was
    handed when it compiled, which gives the same streams (the settings and the overlap
    limit are part of the cache key). Returns the paths written; an error is logged with
    the module's name unless the settings are strict."""
    assert config.report_dir is not None
    name = "<unparsed module>"
    try:
        name, text = xla_module.module_text(serialized)
        compilation = _run_passes(serialized, name, text, on_cpu=on_cpu, config=config, model=model)
        if compilation is None:
            return ()
        return write_module_reports(
            compilation, text, config, html=_html(config, on_cpu), origin=FROM_CACHE
        )
    except Exception as e:
        reason = f"{type(e).__name__}: {e}"
        if config.strict:
            raise PluginError(f"xla_streams failed on module {name} {FROM_CACHE}: {reason}") from e
        logger.warning("no report for module %s %s: %s", name, FROM_CACHE, reason)
        return ()


def _run_passes(
    serialized: bytes, name: str, text: str, *, on_cpu: bool, config: Config, model: StreamModel
) -> Compilation | None:
    """The pipeline of ``config`` over one module (``text``, printed from ``serialized``);
    None where ffi mode leaves it to XLA (a collective across processes on XLA:CPU)."""
    assignment = xla_module.device_assignment(serialized)
    devices = assignment.device_ids if assignment is not None else ()
    gpu = None if on_cpu else job_gpu()
    passes = pipeline_for(config, on_cpu=on_cpu, model=model, devices=devices, gpu=gpu)
    module = parse_module(text, f"<module {name}>")
    if on_cpu and config.mode == "ffi":
        crossing = _cross_process_collective(module, assignment)
        if crossing is not None:
            _refuse_cross_process(name, crossing)
            return None
    compilation = PassManager(passes).run(Compilation(module))
    if compilation.assignment is not None and compilation.assignment.lowered:
        logger.warning("module %s: %s", name, compilation.assignment.lowered)
    return compilation


def job_gpu() -> str | None:
    """The target of the job's GPUs (``targets.target_of_gpus``), against whose SMs
    ``fit-on-gpu`` checks each assignment; None (said once) where a GPU has no target."""
    from xla_streams.simulate.targets import target_of_device, target_of_gpus

    kinds = jax_compat.gpu_device_kinds()
    if not kinds:
        return None
    target = target_of_gpus(kinds)
    if target is None:
        unknown = sorted(kind for kind in kinds if target_of_device(kind) is None)
        _say_once(
            f"xla_streams has no model of {', '.join(unknown)}: it cannot check that the "
            "NCCL kernels of K streams fit on the GPU at once (the deadlock rule's premise, "
            "docs/streams.md), so K is used as given"
        )
    return target


def _html(config: Config, on_cpu: bool) -> bool:
    """Whether a module's report gets its pictures: the simulator behind them models
    GPUs, not XLA:CPU."""
    return config.report_html and not on_cpu


def _cross_process_collective(
    module: Module, assignment: xla_module.DeviceAssignment | None
) -> str | None:
    """Why ffi mode cannot run ``module`` on XLA:CPU (its host runtime meets a
    collective's devices inside one process only), or None: the first collective whose
    devices belong to more than one process of a ``jax.distributed`` job, or a module
    without a device assignment in such a job."""
    processes = jax_compat.device_processes("cpu")
    if processes is None:
        if jax_compat.distributed_client() is None:
            return None
        return "this job has several processes and JAX's CPU devices are not known yet"
    if len(set(processes.values())) < 2:
        return None  # one process: every group is local
    ids = assignment.device_ids if assignment is not None else ()
    if not ids:
        return "the module has no device assignment in a job of several processes"
    for op in module.instructions():
        kind = op.opcode.removesuffix("-start")
        if kind not in KINDS or op.opcode.endswith("-done"):
            continue
        for group in device_groups(module, op, kind):
            owners = {processes.get(ids[d]) if d < len(ids) else None for d in group}
            if len(owners) > 1:
                ordered = sorted(owners, key=lambda p: (p is None, p or 0))
                shown = ", ".join("?" if p is None else str(p) for p in ordered)
                return f"{op.opcode} '{op.name}' has devices of processes {shown}"
    return None


def _refuse_cross_process(name: str, reason: str) -> None:
    """Say once (then at debug level) that a module is left to XLA, and why."""
    message = (
        f"ffi mode on XLA:CPU runs a collective inside one process only, and in module "
        f"{name} {reason}: its collectives are left to XLA (correct, but on no collective "
        f"streams); native mode (XLA_STREAMS_MODE=native) works across processes"
    )
    with _lock:
        first = "cross-process" not in _said
        _said.add("cross-process")
    if first:
        logger.warning("%s", message)
    else:
        logger.debug("%s", message)


def pipeline_for(
    config: Config,
    *,
    on_cpu: bool,
    model: StreamModel,
    devices: tuple[int, ...] = (),
    gpu: str | None = None,
) -> list[ModulePass]:
    """The passes the hook runs on a module of one platform: ffi mode lowers to the
    host runtime on CPU and to the CUDA runtime elsewhere; native mode annotates. On
    ``gpu`` (a target's name) K is kept to what fits on it (``fit-on-gpu``)."""
    runtime: Runtime = "xla"
    if config.mode == "ffi":
        runtime = "host" if on_cpu else "cuda"
        # Before XLA emits the custom calls, their targets must be registered.
        ffi_runtime.register(runtime)
        ffi_runtime.set_timeout(config.timeout_s)
    return build_pipeline(
        config.collective_streams,
        config.policy,
        runtime=runtime,
        model=model,
        devices=devices,
        spec=config.pipeline,
        gpu=gpu,
    )


def run_pipeline(text: str, passes: list[ModulePass], name: str | None = None) -> Compilation:
    """Parse one module's HLO text and run ``passes`` over it. Pure: the same text
    and passes give the same module and assignment in every process."""
    module = parse_module(text, f"<module {name}>" if name else "<module>")
    return PassManager(passes).run(Compilation(module))


def back_to_xla(serialized: bytes, compilation: Compilation) -> bytes | None:
    """The module to hand back to XLA: None when unchanged; annotations written into
    XLA's own proto; a restructured module through XLA's text parser."""
    module = compilation.module
    if module.restructured:
        return xla_module.to_proto(module.print())
    if module.frontend_attribute_edits:
        return xla_module.with_frontend_attributes(serialized, module.frontend_attribute_edits)
    return None


def fingerprint(text: str) -> str:
    """A stable short hash of a module's text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:_FINGERPRINT_CHARS]


def write_module_reports(
    compilation: Compilation, text: str, config: Config, *, html: bool = False, origin: str = ""
) -> tuple[str, ...]:
    """The module's reports (and the index; with ``html`` a trace and a timeline),
    logged in one line (ending with ``origin``, where the module came from); errors are
    logged unless strict. Returns the paths written."""
    from xla_streams.report import summary_line, write_reports

    assert config.report_dir is not None
    name = compilation.module.name
    if compilation.assignment is None:
        logger.debug("no report for module %s: the pipeline assigns no streams", name)
        return ()
    try:
        paths: tuple[str, ...] = write_reports(compilation, config.report_dir, fingerprint(text))
        if html:
            stem = os.path.basename(paths[0]).removesuffix(".json")
            paths += _write_visual_report(compilation, config, stem)
    except Exception as e:
        if config.strict:
            raise
        logger.warning("cannot write the report of module %s: %s", name, e)
        return ()
    logger.info(
        "%s; report %s%s", summary_line(compilation), paths[0], f" {origin}" if origin else ""
    )
    with _lock:
        _stats.reports.append(paths[0])
    return paths


def _write_visual_report(compilation: Compilation, config: Config, stem: str) -> tuple[str, ...]:
    """The trace and timeline of a report, collectives priced from the user's performance
    table (``XLA_STREAMS_PERF_TABLE``) when it has the GPU's measurements, else from the
    table vendored from XLA (said once)."""
    from xla_streams.simulate.measured import PerfTableError
    from xla_streams.simulate.visual import write_visual_report

    assert config.report_dir is not None and compilation.assignment is not None
    pairs = compilation.pairs if Fact.ASYNC_PAIRS in compilation.facts else None
    drawn = (compilation.module, pairs, config.report_dir, stem)
    streams = (*STREAM_COUNTS, compilation.assignment.streams)  # and the module's own K
    if config.perf_table is not None:
        try:
            written = write_visual_report(*drawn, streams=streams, perf_table=config.perf_table)
            return tuple(map(str, written))
        except PerfTableError as e:
            _say_once(f"the HTML reports price collectives from XLA's own table instead: {e}")
    return tuple(map(str, write_visual_report(*drawn, streams=streams)))
