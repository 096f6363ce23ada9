#!/usr/bin/env python3
"""Everything that needs an NVIDIA GPU, measured in one command of under five minutes.

    python3 tools/gpu_check.py OUT_DIR             # on a machine with a GPU
    python3 tools/gpu_check.py OUT_DIR --dry-run   # anywhere: the plan, and every part
                                                     # that needs no GPU
    python3 tools/gpu_check.py OUT_DIR --emulated  # anywhere with CUDA's headers (make
                                                     # test): the checks that have a
                                                     # rehearsal, on the emulated runtime

Written for the H200 image: Python 3.12, jax/jaxlib 0.11.2 with the
jax-cuda13-plugin, nvidia-nccl-cu13, nvcc 13, no network. It runs from the
source tree (this script puts the repository on ``sys.path``; nothing is
installed and no wheel needs to travel: the image has jax), and its dry run on a
Python with only jax and jaxlib (``make gpu-check-bare``). The plugin is
switched on with ``xla_streams.enable()`` (its ``jax_plugins`` entry point
would need an install).

Checks, each in child processes with a time limit, so that a crash or a hang
costs one check, not the run (names as in ``OUT_DIR/gpu_check.json``):

``build``            ``python -m xla_streams.runtime.build --cuda``: the ffi runtime
                     against the image's CUDA 13 wheels. Runs while ``native`` does.
``conformance``      ``xsim-conformance`` (``xla_streams/runtime/emulator/csrc/``)
                     compiled against the image's CUDA runtime and NCCL and run: the
                     rules the emulator's stand-ins model, as expectations each
                     citing its document (event capture at record and wait time,
                     ``cudaEventElapsedTime``'s errors, the ``ncclInProgress``
                     sequence, abort; with two GPUs, a collective waiting for its
                     peer). ``make test`` runs the same program on the stand-ins.
                     Runs while ``native`` does.
``native``           native mode on the GPU. The embedded training step
                     (``transformer_step``, 8 devices: with one GPU, JAX's mock
                     topology makes this GPU one of 8 hosts and mocks NCCL) is
                     compiled and run with the plugin on (K=2 and K=4, one child
                     each), then, in the same process and with the same XLA
                     options, off. Passes when the hook ran, XLA's options are at
                     K, XLA's thunk dump puts every collective on the
                     ``communication_stream[k]`` the report gives it, and the
                     losses on and off are identical (autotuning off, so both
                     compiles pick the same kernels). Where the profiler trace
                     shows collective kernels, each report stream must map to a
                     CUDA stream of its own; where XLA logs its executed async
                     starts (``async_thunk`` VLOG), their stream ids are recorded.
``ffi``              the ffi runtime's CUDA backend, one rank: every collective kind
                     and element type against XLA's results; a collective on its
                     stream overlapping a matmul on the compute stream (CUDA
                     events, not host syncs; the runtime's trace is written as
                     ``ffi_trace.json``); two provoked errors (a bad buffer, an
                     NCCL communicator that never completes) raised in Python
                     naming the op; the cost of a start/done pair against XLA's
                     program at 1 KiB, 1 MiB and 64 MiB. Its correctness and error
                     parts are rehearsed on the emulated runtime (``--emulated``,
                     on XLA:CPU device 0); the timed parts need the GPU.
``sanitizer_racecheck``, ``sanitizer_synccheck``, ``sanitizer_memcheck``
                     where ``compute-sanitizer`` is found: the ffi check's
                     correctness part under its racecheck and synccheck tools, and
                     under memcheck with stream-ordered race tracking and XLA's
                     stream-ordered allocator. They check what happens inside
                     kernels (and allocation lifetimes in stream order), not the
                     order between streams. Run while ``native`` does.
``calibration``      one device's program of ``transformer_step`` compiled as users
                     get it (autotuning on), profiled; measured kernel time per
                     class (matmul, memory-bound) against the cost model's
                     prediction for the H200, and the step. Writes
                     ``calibration.json`` (``xla-streams simulate --calibration``)
                     and XLA's own PGLE profile of the run, ``pgle_profile.pb``
                     (``--xla_gpu_pgle_profile_file_or_directory_path``).
``plugin_overhead``  compile time of the step with the hook and without (median of
                     several compiles), and the time spent inside the hook.

``OUT_DIR/gpu_check.json`` (:class:`GpuCheckReport`, schema
``xla_streams.gpu_check.v1``, docs/formats.md) holds the versions, the GPU's name
and one :class:`Record` per check: ``name``, ``passed`` (null: not run),
``figures``, ``seconds``, ``error``, ``proves`` and ``does_not_prove``. Beside it:
``calibration.json``, ``pgle_profile.pb``, ``ffi_trace.json`` and, for a failed
check, its log's tail in ``logs/``.

Exit status: 0 every check that ran passed, 1 one failed, 2 no GPU here
(nothing run) or bad usage.
"""

# jax's public API is only partly annotated; its calls are checked when they run.
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import glob
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _path in (str(REPO), str(HERE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import xla_streams  # noqa: E402
from xla_streams import programs, runtime  # noqa: E402
from xla_streams.hlo import parse_module  # noqa: E402
from xla_streams.plugin import hook  # noqa: E402
from xla_streams.report import AssignmentReport  # noqa: E402
from xla_streams.runtime import abi, calls, emulator  # noqa: E402
from xla_streams.runtime import build as runtime_build  # noqa: E402
from xla_streams.runtime.emulator import on_cpu  # noqa: E402
from xla_streams.simulate import Simulator, get_target  # noqa: E402
from xla_streams.simulate.calibration import calibrate, load_calibration  # noqa: E402
from xla_streams.simulate.profiler_trace import (  # noqa: E402
    Kernel,
    find_trace,
    gpu_kernels,
    load_trace,
    seconds_by_instruction,
)
from xla_streams.simulate.targets import target_of_gpus  # noqa: E402
from xla_streams.xla_dump import thunk_streams  # noqa: E402

SCHEMA = "xla_streams.gpu_check.v1"
# The whole run; a session has 15 minutes of GPU time for everything, reruns included.
BUDGET_S = 280.0
PROGRAM = "transformer_step"
# One slice, 8 hosts of one GPU: this GPU is host 0, the other 7 and NCCL are mocked.
MOCK_TOPOLOGY = "1x8x1"
# Autotuning picks kernels by timing, so two compiles may pick different ones and
# round differently; off, on and off compile alike.
SAME_KERNELS = {"xla_gpu_autotune_level": 0}
TARGET = "h200"
CALIBRATION_FILE = "calibration.json"
PGLE_FILE = "pgle_profile.pb"
FFI_TRACE_FILE = "ffi_trace.json"
# The fixture the dry run calibrates against synthetic measurements.
DRY_RUN_MODULE = REPO / "hlo_fixtures" / "fsdp_unrolled.limit4.text.hlo"
DRY_RUN_RATIOS = {"matmul": 1.25, "memory": 0.8}
PROGRESS = "gpu_check:"  # children's lines the parent shows as they come
CHILD_STARTED = time.monotonic()  # a child's time limit counts from its start
LOG_TAIL = 4000

# XLA's VLOG(1) in async_thunk.cc (0.10.2): "Execute async for `%s`: stream_id=%v, stream=%p";
# the id is read as the last number of its printed form. Other versions may print
# nothing: then the thunk dump is the evidence.
_RUNTIME_LOG = re.compile(r"Execute async(?: \w+)? for `([^`]+)`: stream_id=([^,]*), stream=(\S+)")
_DEVICE_PREFIX = re.compile(r"\[(\d+)\]")


# -- the records -------------------------------------------------------------------------


@dataclass
class Record:
    """One check's entry in gpu_check.json; ``passed`` None: not run."""

    name: str
    proves: str
    does_not_prove: str
    passed: bool | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None


# What no compute-sanitizer tool sees (Compute Sanitizer manual, "Introduction":
# racecheck reports shared memory hazards, synccheck invalid uses of synchronization
# primitives).
SANITIZER_BLIND = (
    "the order between streams: the sanitizer looks inside kernels, so it sees neither our "
    "start/done events between the compute and collective streams (our handlers launch no "
    "kernel) nor NCCL's protocol between GPUs; the emulator's race checker (make test), "
    "which checks that order, has no GPU twin: here the conformance check and exact results "
    "stand for it"
)
PROVES = {
    "build": (
        "the ffi runtime's CUDA/NCCL library compiles and links against this image's CUDA "
        "wheels with the host C++ compiler (no nvcc needed)",
        "nothing about running it (the ffi check does that)",
    ),
    "conformance": (
        "the rules the emulator's stand-ins model hold for this image's CUDA runtime and "
        "NCCL, each expectation citing its document (figures: each one's name, detail and "
        "citation): a never-recorded event queries as cudaSuccess and is no wait; "
        "cudaEventElapsedTime fails for a never-recorded and for an untimed event and gives "
        "the time between two complete ones; a non-blocking communicator's init and a "
        "one-rank all-reduce return ncclInProgress or ncclSuccess and are polled to "
        "ncclSuccess, with an exact result; an idle communicator aborts; ncclGetVersion; "
        "with two GPUs, a collective waiting for its peer keeps its stream busy, a stream "
        "wait holds to the record current at the call, and the peer's call completes both "
        "with exact results. The same program passes on the stand-ins in make test",
        "what the expectations do not name: the emulator's deadlock model (hardware queues, "
        "co-resident kernels), its race checker, multi-process bootstrap, timings; with one "
        "GPU the two-device expectations are skipped (their records say so)",
    ),
    "native": (
        "on a real GPU client, with the plugin on, XLA honours the report: the thunk dump "
        "puts every async collective on the communication_stream[k] the report gives it, "
        "XLA's options are at K, and the program runs with losses bit-identical to the "
        "plugin off (same XLA options), at K=2 and K=4; the hook reads the GPU's kind "
        "as JAX lists it, for fit-on-gpu; where the profiler trace shows "
        "collective kernels, each report stream runs on a CUDA stream of its own",
        "with one GPU the 8-device program runs under JAX's mock topology (this GPU is one "
        "of 8 hosts, NCCL mocked): no data crosses a link, so nothing is shown about "
        "collectives on different streams overlapping on NVLink, about speed, or about "
        "cross-rank ordering (the deadlock rule is checked by verify-streams, not here)",
    ),
    "ffi": (
        "the ffi runtime's CUDA backend runs every collective kind the lowering emits, for "
        "every element type it accepts, with XLA's results; the compute stream waits on "
        "CUDA events, not on the host (two collectives on their streams hide behind a "
        "matmul on the compute stream in the runtime's CUDA-event trace, ffi_trace.json); "
        "errors reach Python as exceptions naming the op; the cost of a start/done pair "
        "at 1 KiB, 1 MiB, 64 MiB",
        "one rank: NCCL moves no data between GPUs (a one-rank collective is a local "
        "copy), so nothing is shown about multi-rank results, communicator bootstrap "
        "across processes, or bandwidth; XLA removes one-device collectives, so the XLA "
        "column times what XLA runs for the same program on one device (a copy or "
        "nothing), not an NCCL call",
    ),
    "sanitizer_racecheck": (
        "compute-sanitizer's racecheck over the ffi check's correctness part (every kind "
        "and element type through the CUDA backend, one rank): no shared-memory data hazard "
        "inside the kernels that ran (XLA's fusions and copies, NCCL's kernels) on those "
        "inputs",
        SANITIZER_BLIND,
    ),
    "sanitizer_synccheck": (
        "compute-sanitizer's synccheck over the ffi check's correctness part: no invalid use "
        "of synchronization primitives (__syncthreads, __syncwarp, cooperative groups, "
        "mbarriers) inside the kernels that ran",
        SANITIZER_BLIND,
    ),
    "sanitizer_memcheck": (
        "compute-sanitizer's memcheck with --track-stream-ordered-races all over the ffi "
        "check's correctness part, XLA allocating with cudaMallocAsync "
        "(XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async): no invalid device memory access in the "
        "kernels that ran, and no use of a stream-ordered allocation before its allocation "
        "or after its free in stream order",
        "reuse inside one allocation: an executable's buffers are sub-allocated from one "
        "allocation, so a collective racing a later user of its buffer within a step is not "
        "seen; beyond allocation lifetimes, nothing about the order between streams (our "
        "start/done events, NCCL's protocol between GPUs); the emulator's race checker "
        "(make test) has no GPU twin",
    ),
    "calibration": (
        "how far the cost model's compute predictions (matmul and memory-bound kernels) "
        "are from this GPU's measured kernel times on one device's program of "
        f"{PROGRAM}, as ratios the simulator takes (calibration.json)",
        "collective ratios (one GPU cannot time a multi-GPU collective; with mocked NCCL "
        "the step is compute only); each instruction counts once (the program is "
        "unrolled); the profiler adds a little time per kernel",
    ),
    "plugin_overhead": (
        "the compile time the plugin's hook adds on a real GPU client (median of several "
        "compiles with and without it, and the time measured inside the hook)",
        "run time: native mode adds none (XLA runs the same kernels, on other streams)",
    ),
}


def new_record(name: str) -> Record:
    proves, does_not = PROVES[name]
    return Record(name, proves, does_not)


@dataclass(frozen=True)
class GpuCheckReport:
    """``OUT_DIR/gpu_check.json``: schema ``xla_streams.gpu_check.v1``. Read by people
    (and the tests): nothing reads it back, so it has no ``from_json``."""

    dry_run: bool
    emulated: bool  # the rehearsal on the emulated CUDA runtime: no GPU used
    gpu: str | None
    versions: dict[str, Any]
    budget_s: float
    seconds: float
    checks: tuple[Record, ...]

    def to_json(self) -> str:
        data = {
            "schema": SCHEMA,
            "dry_run": self.dry_run,
            "emulated": self.emulated,
            "gpu": self.gpu,
            "versions": self.versions,
            "budget_s": self.budget_s,
            "seconds": self.seconds,
            "checks": [dataclasses.asdict(r) for r in self.checks],
        }
        return json.dumps(data, indent=1) + "\n"


# -- the parent ----------------------------------------------------------------------------


class Budget:
    """Seconds left of the whole run; each child gets what later checks can spare."""

    def __init__(self, total: float) -> None:
        self.deadline = time.monotonic() + total
        self.begin = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.begin

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def grant(self, wanted: float, reserve: float) -> float:
        """Up to ``wanted`` seconds, keeping ``reserve`` for what comes after."""
        return max(0.0, min(wanted, self.left() - reserve))


def say(budget: Budget, message: str) -> None:
    print(f"[gpu_check {budget.elapsed():6.1f}s] {message}", flush=True)


@dataclass
class Child:
    """A child process running one part of a check, its log and its result file."""

    label: str
    process: subprocess.Popen[bytes]
    log: Path
    result: Path
    deadline: float
    shown: int = 0  # bytes of the log already scanned for progress lines
    timed_out: bool = False

    def poll(self, budget: Budget) -> bool:
        """Show new progress lines; end the child past its deadline. True when done."""
        with open(self.log, "rb") as f:
            f.seek(self.shown)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.shown += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            if line.startswith(PROGRESS):
                say(budget, f"{self.label}: {line.removeprefix(PROGRESS).strip()}")
        if self.process.poll() is not None:
            return True
        if time.monotonic() > self.deadline:
            self.timed_out = True
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            return True
        return False

    def outcome(self) -> tuple[dict[str, Any], str | None]:
        """What the child recorded (also when it failed midway), and the error if any."""
        data: dict[str, Any] = {}
        if self.result.exists():
            data = json.loads(self.result.read_text())
        error = None
        if self.timed_out:
            error = f"{self.label}: timed out (its share of the time budget ran out)"
        elif self.process.returncode != 0:
            error = f"{self.label}: exit status {self.process.returncode}"
        if error is not None:
            error += "\n" + tail(self.log)
        return data, error


def tail(path: Path, size: int = LOG_TAIL) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-size:]


def start_child(
    work: Path, label: str, kind: str, options: list[str], env: dict[str, str], seconds: float,
    prefix: tuple[str, ...] = (),
) -> Child:  # fmt: skip
    """``kind``'s child in ``work/label``, run under ``prefix`` (a command that runs
    the command after it, such as compute-sanitizer)."""
    folder = work / label
    folder.mkdir(parents=True, exist_ok=True)
    log, result = folder / "log.txt", folder / "result.json"
    me = [sys.executable, str(Path(__file__).resolve())]
    command = [*prefix, *me, str(folder), "--child", kind]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command + options,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=child_env(env),
            cwd=REPO,
            start_new_session=True,  # its own process group, killed whole on a timeout
        )
    return Child(label, process, log, result, time.monotonic() + seconds)


def wait(children: list[Child], budget: Budget) -> None:
    running = list(children)
    while running:
        running = [c for c in running if not c.poll(budget)]
        if running:
            time.sleep(0.5)


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_STREAMS_", "JAX_"))}
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(
                os.pathsep
            ),
            "PYTHONUNBUFFERED": "1",
            "JAX_PLATFORMS": "cuda",
            # Several children share the GPU; none takes 75% of its memory up front.
            "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        }
    )
    env.update(extra)
    return env


def run_check(record: Record, body: Callable[[Record], None], out: Path) -> Record:
    """Run ``body``; whatever it raises becomes the record's error, never the run's end."""
    begin = time.monotonic()
    try:
        body(record)
    except Exception:
        record.passed = False
        record.error = (record.error + "\n" if record.error else "") + traceback.format_exc(limit=6)
    record.seconds = round(time.monotonic() - begin, 1)
    if record.passed is False and record.error:
        logs = out / "logs"
        logs.mkdir(exist_ok=True)
        (logs / f"{record.name}.txt").write_text(record.error)
    return record


# -- checks on files (no GPU; shared with the tests) ----------------------------------------


def load_report(report_dir: Path, module: str) -> AssignmentReport:
    found = sorted(report_dir.glob(f"{module}.*.json"))
    if not found:
        raise FileNotFoundError(f"no report for module {module} in {report_dir}")
    return AssignmentReport.from_json(found[0].read_text(), str(found[0]))


def check_thunks(dump_dir: str, report: AssignmentReport) -> tuple[bool, str]:
    """Every collective the report puts on stream k starts on communication_stream[k]."""
    module = report.module
    sequences = sorted(glob.glob(os.path.join(dump_dir, f"*.{module}.thunk_sequence.txt")))
    metadata = sorted(glob.glob(os.path.join(dump_dir, f"*.{module}.thunk_metadata.txt")))
    if not sequences or not metadata:
        return False, f"no thunk dump of {module} in {dump_dir}"
    streams = thunk_streams(Path(sequences[0]).read_text(), Path(metadata[0]).read_text())
    assigned = [c for c in report.collectives if c.stream is not None]
    wrong = [
        f"{c.start}: report {c.stream}, thunk {streams.get(c.start)}"
        for c in assigned
        if streams.get(c.start) != c.stream
    ]
    if not assigned:
        return False, "the report puts no collective on a stream"
    if wrong:
        return False, f"{len(wrong)} of {len(assigned)} differ: " + "; ".join(wrong[:5])
    used = sorted({c.stream for c in assigned if c.stream is not None})
    return True, f"{len(assigned)} collectives on communication_stream{used} as assigned"


def check_debug_options(dump_dir: str, module: str, streams: int) -> tuple[bool, str]:
    """XLA compiled with the overlap limit and the communication streams at K."""
    found = sorted(glob.glob(os.path.join(dump_dir, f"*.{module}.debug_options")))
    if not found:
        return False, "no debug_options in the dump"
    text = Path(found[0]).read_text()
    wanted = {
        "xla_gpu_experimental_parallel_collective_overlap_limit": streams,
        "xla_gpu_executable_num_communication_streams": streams,
    }
    values = {k: re.search(rf"{k}: (\d+)", text) for k in wanted}
    bad = {
        k: (m.group(1) if m else None)
        for k, m in values.items()
        if not m or int(m.group(1)) != wanted[k]
    }
    return (not bad), (f"both at {streams}" if not bad else f"unexpected: {bad}")


def check_fit_on_gpu(fit: dict[str, Any]) -> tuple[bool, str]:
    """Whether the hook, inside the compile, read the job's GPU as JAX lists its devices
    (the target of their kinds)."""
    kinds = fit.get("device_kinds") or []
    expected = target_of_gpus(kinds)
    return (
        bool(kinds) and fit.get("hook") == expected,
        f"{kinds}: the hook checks K against {fit.get('hook')}, expected {expected}",
    )


def check_runtime_log(log: str, report: AssignmentReport) -> tuple[bool, str]:
    """The executed async starts: stream ids as assigned, one CUDA stream per stream id."""
    assigned = {c.start: c.stream for c in report.collectives if c.stream is not None}
    seen: dict[tuple[str, str], set[int]] = {}  # (device, stream pointer) -> stream ids
    wrong = []
    executed = set()
    for line in log.splitlines():
        m = _RUNTIME_LOG.search(line)
        if m is None:
            continue
        numbers = re.findall(r"\d+", m.group(2))
        if not numbers or "comput" in m.group(2).lower():
            continue  # a compute stream: not a collective's
        name, stream_id, pointer = m.group(1), int(numbers[-1]), m.group(3)
        device = _DEVICE_PREFIX.search(line[: m.start()])
        key = (device.group(1) if device else "?", pointer)
        seen.setdefault(key, set()).add(stream_id)
        if name in assigned:
            executed.add(name)
            if assigned[name] != stream_id:
                wrong.append(f"{name}: report {assigned[name]}, ran on {stream_id}")
    if not executed:
        return False, "no 'Execute async' lines of the step's collectives in XLA's log"
    shared = {k: v for k, v in seen.items() if len(v) > 1}
    if wrong or shared:
        return False, f"{wrong[:5]} {'; one CUDA stream for ids ' + str(shared) if shared else ''}"
    ids = sorted({i for v in seen.values() for i in v})
    return True, (
        f"{len(executed)} of {len(assigned)} assigned collectives executed, on stream ids {ids}, "
        f"each id its own CUDA stream ({len(seen)} (device, stream) pairs)"
    )


def profile_placement(kernels: list[Kernel], report: AssignmentReport) -> dict[str, Any]:
    """Which CUDA stream the profiler saw each report stream's collective kernels on.

    ``readable`` is False when the trace has no kernel of a collective the report
    assigns (mocked NCCL may launch none); else ``passed`` says whether each report
    stream ran on a CUDA stream of its own, none of them the compute stream.
    """
    stream_of = {}
    for c in report.collectives:
        if c.stream is not None:
            stream_of[c.start] = c.stream
            stream_of[c.done] = c.stream
    lines_of: dict[int, set[tuple[int, int]]] = {}
    collective = [k for k in kernels if k.hlo_op in stream_of]
    for k in collective:
        lines_of.setdefault(stream_of[k.hlo_op], set()).add(k.line)
    if not collective:
        return {"readable": False, "why": "no kernel of an assigned collective in the trace"}
    busy: dict[tuple[int, int], float] = {}
    for k in kernels:
        if k.hlo_op not in stream_of:
            busy[k.line] = busy.get(k.line, 0.0) + k.duration
    compute = max(busy, key=lambda line: busy[line]) if busy else None
    own = all(len(lines) == 1 for lines in lines_of.values())
    distinct = len({line for lines in lines_of.values() for line in lines}) == len(lines_of)
    off_compute = all(compute not in lines for lines in lines_of.values())
    overlapping = sum(
        1
        for i, a in enumerate(collective)
        for b in collective[i + 1 :]
        if a.line != b.line and a.begin < b.begin + b.duration and b.begin < a.begin + a.duration
    )
    return {
        "readable": True,
        "passed": own and distinct and off_compute,
        "cuda_streams_by_report_stream": {
            str(s): sorted(f"{pid}/{tid}" for pid, tid in lines)
            for s, lines in sorted(lines_of.items())
        },
        "collective_kernels": len(collective),
        "overlapping_pairs_on_different_streams": overlapping,
    }


# -- the checks ----------------------------------------------------------------------------


def native_figures(folder: Path, data: dict[str, Any], streams: int) -> tuple[bool, dict[str, Any]]:
    """Judge one native child's output (plugin on at ``streams``, then off)."""
    figures: dict[str, Any] = {k: data.get(k) for k in ("program", "devices", "compile_s")}
    checks: dict[str, tuple[bool, str]] = {}
    module = data.get("module", "jit_step")
    hook = data.get("hook", {})
    report = load_report(folder / "reports", module)
    checks["hook ran"] = (
        hook.get("calls", 0) > 0 and hook.get("failed", 1) == 0,
        f"{hook.get('calls')} modules, {hook.get('failed')} failed",
    )
    checks["XLA options at K"] = check_debug_options(str(folder / "dump_on"), module, streams)
    checks["thunks on the report's streams"] = check_thunks(str(folder / "dump_on"), report)
    checks["the hook knows the GPU"] = check_fit_on_gpu(data.get("fit_on_gpu", {}))
    on, off = data.get("losses_on"), data.get("losses_off")
    checks["losses on == off"] = (bool(on) and on == off, f"on {on}, off {off}")
    figures["checks"] = {name: {"passed": ok, "detail": why} for name, (ok, why) in checks.items()}
    figures["runtime_log"] = check_runtime_log(tail(folder / "log.txt", 1 << 24), report)[1]
    figures["summary"] = dataclasses.asdict(report.summary)
    try:
        kernels, found = gpu_kernels(load_trace(find_trace(folder / "profile")))
        figures["profile"] = {**found, **profile_placement(kernels, report)}
    except (OSError, ValueError, KeyError) as e:  # no trace: the other evidence stands
        figures["profile"] = {"readable": False, "why": f"{type(e).__name__}: {e}"}
    profile_ok = figures["profile"].get("passed", True)
    return all(ok for ok, _ in checks.values()) and profile_ok, figures


def check_native(record: Record, children: dict[int, Child]) -> None:
    passed = True
    losses = {}
    for streams, child in children.items():
        data, error = child.outcome()
        try:
            ok, figures = native_figures(child.result.parent, data, streams)
        except Exception:  # judged apart: K=4's evidence survives K=2's failure
            ok, figures = False, {"judging failed": traceback.format_exc(limit=4)}
        figures["error"] = error
        record.figures[f"K={streams}"] = figures
        losses[streams] = data.get("losses_on")
        passed = passed and ok and error is None
    record.figures["losses equal across K"] = len({json.dumps(v) for v in losses.values()}) == 1
    record.passed = passed


def check_build(record: Record, child: Child) -> None:
    data, error = child.outcome()
    record.figures = data
    record.error = error
    record.passed = error is None and bool(data.get("library"))


def check_conformance(record: Record, child: Child) -> None:
    data, error = child.outcome()
    expectations = data.get("checks", [])
    record.figures = {
        "program": data.get("program"),
        "devices": data.get("devices"),
        "skipped": [f"{c['name']}: {c['detail']}" for c in expectations if c["passed"] is None],
        "expectations": expectations,
    }
    failed = [f"{c['name']}: {c['detail']}" for c in expectations if c["passed"] is False]
    record.error = error or ("failed: " + "; ".join(failed) if failed else None)
    record.passed = error is None and bool(expectations) and not failed


def ffi_passed(data: dict[str, Any], parts: tuple[str, ...]) -> bool:
    """Whether an ffi child ran ``parts`` and each passed (the overhead part measures,
    it has no verdict)."""
    return all(
        part in data if part == "overhead" else data.get(part, {}).get("passed") is True
        for part in parts
    )


def check_ffi(
    record: Record, work: Path, out: Path, budget: Budget, seconds: float, emulated: bool = False
) -> None:
    parts = FFI_REHEARSED if emulated else FFI_PARTS
    options = ["--parts", ",".join(parts), *(["--emulated"] if emulated else [])]
    child = start_child(work, "ffi", "ffi", options, EMULATED_ENV if emulated else {}, seconds)
    wait([child], budget)
    data, error = child.outcome()
    record.figures = {k: v for k, v in data.items() if k != "trace"}
    if emulated:
        record.figures["not rehearsed"] = (
            f"{', '.join(p for p in FFI_PARTS if p not in parts)}: timings, which need a GPU"
        )
    if "trace" in data:
        (out / FFI_TRACE_FILE).write_text(json.dumps(data["trace"]))
    record.error = error
    clean = data.get("emulator_reports", []) == []
    record.passed = error is None and ffi_passed(data, parts) and clean


# compute-sanitizer's tools (Compute Sanitizer manual, "Command Line Options"), each
# over the ffi check's correctness part: the record, then the tool, its options, and
# the child's environment.
SANITIZERS: dict[str, tuple[str, tuple[str, ...], dict[str, str]]] = {
    "sanitizer_racecheck": ("racecheck", ("--racecheck-report", "all"), {}),
    "sanitizer_synccheck": ("synccheck", (), {}),
    "sanitizer_memcheck": (
        "memcheck",
        ("--track-stream-ordered-races", "all"),
        {"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async"},  # stream-ordered allocations
    ),
}
# For every tool: wait for the child however long JAX takes to reach CUDA (by default
# the sanitizer gives up after 60 s); the child's own time limit still holds.
SANITIZER_OPTIONS = ("--launch-timeout", "0")
SANITIZER_FOUND = 99  # --error-exitcode: the tool reported an error
# Instrumented kernels run many times slower: the runtime's collectives get longer
# than their default timeout before they are declared hung.
SANITIZED_TIMEOUT_S = "900"


def find_sanitizer() -> str | None:
    """``compute-sanitizer`` on PATH, else in a CUDA toolkit (``$CUDA_HOME``, nvcc's,
    /usr/local/cuda) or an ``nvidia-cuda-sanitizer-api`` wheel (``nvidia/cu13/bin``)."""
    found = shutil.which("compute-sanitizer")
    if found is not None:
        return found
    spec = importlib.util.find_spec("nvidia")
    wheels = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    homes = [*runtime_build.default_homes(), *(d for w in wheels for d in sorted(w.iterdir()))]
    for home in homes:
        for path in (home / "bin", home / "compute-sanitizer"):
            if os.access(path / "compute-sanitizer", os.X_OK):
                return str(path / "compute-sanitizer")
    return None


def sanitizer_prefix(
    sanitizer: str, tool: str, options: tuple[str, ...], folder: Path, known: str
) -> tuple[tuple[str, ...], list[str]]:
    """The command that runs a child under ``tool``, writing its report to
    ``folder/sanitizer.<pid>.txt``, and the ``options`` left out because this
    compute-sanitizer does not know them (``known``: its --help)."""
    kept, left_out = [], []
    for name, value in zip(options[::2], options[1::2], strict=True):
        (kept if name in known else left_out).extend([name, value])
    prefix = (
        sanitizer, "--tool", tool, "--target-processes", "all",
        "--error-exitcode", str(SANITIZER_FOUND),
        "--log-file", str(folder / "sanitizer.%p.txt"), *kept,
    )  # fmt: skip
    return prefix, left_out[::2]


def start_sanitizers(work: Path, budget: Budget, records: dict[str, Record]) -> dict[str, Child]:
    """The ffi check's correctness part under each tool, at once (they time nothing);
    without compute-sanitizer, their records say so."""
    sanitizer = find_sanitizer()
    if sanitizer is None:
        for name in SANITIZERS:
            records[name].error = "not run: compute-sanitizer is neither on PATH nor in a toolkit"
        return {}
    known = _run([sanitizer, "--help"])
    children = {}
    for name, (tool, options, env) in SANITIZERS.items():
        folder = work / name
        prefix, left_out = sanitizer_prefix(
            sanitizer, tool, (*SANITIZER_OPTIONS, *options), folder, known
        )
        records[name].figures["command"] = " ".join(prefix)
        records[name].figures["options this compute-sanitizer does not know"] = left_out
        children[name] = start_child(
            work, name, "ffi", ["--parts", "kinds"],
            {**env, abi.TIMEOUT_ENV: SANITIZED_TIMEOUT_S}, budget.grant(150, 150), prefix,
        )  # fmt: skip
    return children


def check_sanitizer(record: Record, child: Child) -> None:
    data, error = child.outcome()
    reports = sorted(child.result.parent.glob("sanitizer.*.txt"))
    lines = [line for path in reports for line in path.read_text(errors="replace").splitlines()]
    record.figures["summary"] = [line.strip("= ") for line in lines if "SUMMARY" in line]
    record.figures["kinds"] = data.get("kinds")
    if child.process.returncode == SANITIZER_FOUND:
        error = f"{child.label}: compute-sanitizer reported errors:\n" + "\n".join(lines[-60:])
    elif error is not None and not reports:
        error += "\n(compute-sanitizer wrote no report: it may not have started)"
    record.error = error
    record.passed = error is None and ffi_passed(data, ("kinds",))


# The calibration runs one device's program of the step under the mock topology, and,
# should mocking fail on this image, an embedded program that needs one GPU only.
CALIBRATION_RUNS = {
    PROGRAM: ({"JAX_MOCK_GPU_TOPOLOGY": MOCK_TOPOLOGY},
              f"{PROGRAM}, one device's program (mock topology {MOCK_TOPOLOGY})"),
    "fsdp_unrolled": ({}, "fsdp_unrolled on one device"),
}  # fmt: skip


def check_calibration(
    record: Record, work: Path, out: Path, budget: Budget, versions: dict[str, Any]
) -> None:
    failed = []
    error: str | None = "no time left for a calibration run"
    for program, (env, _) in CALIBRATION_RUNS.items():
        seconds = budget.grant(60, 25)
        if seconds < 20:
            break
        child = start_child(
            work, f"calibration_{program}", "calibrate", ["--program", program], env, seconds
        )
        wait([child], budget)
        data, error = child.outcome()
        if error is None:
            break
        failed.append(error)
    record.figures["failed runs"] = failed
    if error is not None:
        raise RuntimeError("no calibration run succeeded")
    folder = child.result.parent
    kernels, found = gpu_kernels(load_trace(find_trace(folder / "profile")))
    measured = seconds_by_instruction(kernels, data["profiled_steps"])
    provenance = {
        "gpu": data["device_kind"],
        "jax": versions.get("jax", ""),
        "jaxlib": versions.get("jaxlib", ""),
        "date": datetime.date.today().isoformat(),
        "program": CALIBRATION_RUNS[program][1],
        "tool": "tools/gpu_check.py",
    }
    hlo = (folder / "module.hlo").read_text()
    calibration, figures = calibrate(hlo, measured, data["step_s"], provenance, TARGET)
    (out / CALIBRATION_FILE).write_text(calibration.to_json())
    record.figures.update(figures, profile=found, pgle=data.get("pgle"))
    if data.get("pgle", {}).get("bytes"):
        shutil.copy(folder / PGLE_FILE, out / PGLE_FILE)
    record.passed = set(figures["ratios"]) == {"matmul", "memory"}


def check_overhead(record: Record, work: Path, budget: Budget, seconds: float) -> None:
    env = {"JAX_MOCK_GPU_TOPOLOGY": MOCK_TOPOLOGY}
    options = ["--program", PROGRAM, "--seconds", str(int(seconds * 0.8))]
    child = start_child(work, "overhead", "overhead", options, env, seconds)
    wait([child], budget)
    data, error = child.outcome()
    record.error = error
    on, off = data.get("on_s", []), data.get("off_s", [])
    if on and off:
        median_on, median_off = statistics.median(on), statistics.median(off)
        record.figures = {
            "compiles": {"on": len(on), "off": len(off)},
            "median_on_s": round(median_on, 3),
            "median_off_s": round(median_off, 3),
            "overhead_s": round(median_on - median_off, 3),
            "overhead_percent": round(100 * (median_on / median_off - 1), 1),
            "hook_s_per_compile": data.get("hook_s_per_compile"),
            "hook_calls_off": data.get("hook_calls_off"),
        }
    record.passed = (
        error is None and len(on) >= 2 and len(off) >= 2 and data.get("hook_calls_off") == 0
    )


# -- the children (they need the GPU) --------------------------------------------------------


class Result:
    """A child's result file, rewritten at each step so that a crash keeps what was done."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {}

    def __setitem__(self, key: str, value: Any) -> None:
        self.data[key] = value
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(self.data, indent=1))
        os.replace(partial, self.path)  # whole or not at all, even if killed here


def progress(message: str) -> None:
    print(f"{PROGRESS} {message}", flush=True)


def build_program(name: str) -> tuple[Any, Any, list[Any]]:
    """(jitted step, its abstract arguments, the devices), for the GPU(s) JAX sees."""
    import jax

    devices = jax.devices()
    spec = programs.PROGRAMS[name]
    fn, args = spec.build(devices[: spec.num_devices])
    return fn, args, devices


def make_inputs(args: Any) -> Any:
    """Random arguments with the abstract ones' shapes and shardings, made on the devices
    (the same values every call: the runs on and off start alike)."""
    import jax

    leaves, tree = jax.tree.flatten(args)

    def make() -> Any:
        keys = jax.random.split(jax.random.key(0), len(leaves))
        values = [
            jax.random.normal(k, a.shape, a.dtype) * 0.02 for k, a in zip(keys, leaves, strict=True)
        ]
        return jax.tree.unflatten(tree, values)

    shardings = jax.tree.unflatten(tree, [a.sharding for a in leaves])
    return jax.jit(make, out_shardings=shardings)()


def run_steps(compiled: Any, inputs: Any, steps: int) -> tuple[list[float], list[float]]:
    """Losses and wall seconds of ``steps`` training steps (each waited for)."""
    import jax
    import numpy as np

    params, *batch = inputs
    losses, seconds = [], []
    for _ in range(steps):
        begin = time.perf_counter()
        loss, params = compiled(params, *batch)
        jax.block_until_ready((loss, params))
        seconds.append(time.perf_counter() - begin)
        # One device's copy: under the mock topology the others are not addressable.
        losses.append(float(np.asarray(loss.addressable_shards[0].data)))
    return losses, seconds


def profiled(log_dir: Path, compiled: Any, inputs: Any, steps: int) -> None:
    import jax

    with jax.profiler.trace(str(log_dir), create_perfetto_trace=True):
        run_steps(compiled, inputs, steps)


def child_native(folder: Path, streams: int, steps: int) -> None:
    """Plugin on at ``streams`` (switched on before JAX starts, as a user would), then off
    in the same process: XLA's options are the same both times."""
    result = Result(folder / "result.json")
    xla_streams.enable(streams, report_dir=str(folder / "reports"), strict=True)
    import jax

    progress(f"K={streams}: compiling {PROGRAM} with the plugin on")
    fn, args, devices = build_program(PROGRAM)
    result["program"] = PROGRAM
    result["devices"] = (
        f"{len(devices)} x {devices[0].device_kind} ({jax.local_device_count()} local)"
    )
    begin = time.perf_counter()
    compiled = fn.lower(*args).compile({**SAME_KERNELS, **dump_options(folder / "dump_on")})
    result["compile_s"] = round(time.perf_counter() - begin, 2)
    result["module"] = compiled.as_text().split(",", 1)[0].removeprefix("HloModule ").strip()
    stats = hook.stats()
    result["hook"] = {"calls": stats.calls, "failed": stats.failed, "seconds": stats.seconds}
    # The GPU fit-on-gpu checks K against, as the hook reads it from JAX's backends.
    result["fit_on_gpu"] = {
        "device_kinds": sorted({d.device_kind for d in jax.devices()}),
        "hook": hook.job_gpu(),
    }
    progress(f"K={streams}: running {steps} steps")
    result["losses_on"] = run_steps(compiled, make_inputs(args), steps)[0]
    progress(f"K={streams}: profiling")
    profiled(folder / "profile", compiled, make_inputs(args), 2)
    xla_streams.disable()
    jax.clear_caches()
    progress(f"K={streams}: compiling and running with the plugin off")
    plain = fn.lower(*args).compile({**SAME_KERNELS, **dump_options(folder / "dump_off")})
    result["losses_off"] = run_steps(plain, make_inputs(args), steps)[0]


def dump_options(folder: Path) -> dict[str, Any]:
    return {"xla_dump_to": str(folder), "xla_dump_hlo_as_text": True, "xla_dump_hlo_pass_re": ""}


def child_calibrate(folder: Path, program: str, steps: int) -> None:
    """One device's program as users compile it, timed and profiled."""
    from jax.experimental import profiler as jax_profiler

    result = Result(folder / "result.json")
    progress(f"compiling {program} (autotuning on)")
    fn, args, devices = build_program(program)
    result["device_kind"] = devices[0].device_kind
    compiled = fn.lower(*args).compile()
    (folder / "module.hlo").write_text(compiled.as_text())
    inputs = make_inputs(args)
    run_steps(compiled, inputs, 2)  # warm-up
    progress(f"timing {steps} steps")
    result["step_s"] = statistics.median(run_steps(compiled, make_inputs(args), steps)[1])
    progress("profiling")
    profiled(folder / "profile", compiled, make_inputs(args), steps)
    result["profiled_steps"] = steps
    # XLA's own per-instruction costs of the run, in the format its latency-hiding
    # scheduler reads (ProfiledInstructionsProto): the PGLE door. A bonus: its failure
    # is recorded, not fatal.
    try:
        run_dir = find_trace(folder / "profile").parent
        pgle = jax_profiler.get_profiled_instructions_proto(str(run_dir))
        (folder / PGLE_FILE).write_bytes(pgle)
        result["pgle"] = {"bytes": len(pgle)}
    except Exception as e:
        result["pgle"] = {"error": f"{type(e).__name__}: {e}"}


def child_overhead(folder: Path, program: str, seconds: float) -> None:
    """Compiles with the hook (the plugin on since start-up), then without it; the first
    compile of the process is a warm-up."""
    result = Result(folder / "result.json")
    xla_streams.enable(4)
    import jax

    fn, args, _ = build_program(program)
    fn.lower(*args).compile(SAME_KERNELS)
    deadline = CHILD_STARTED + seconds
    halfway = (time.monotonic() + deadline) / 2

    def timed() -> float:
        jax.clear_caches()
        begin = time.perf_counter()
        fn.lower(*args).compile(SAME_KERNELS)
        return time.perf_counter() - begin

    on: list[float] = []
    hook.reset_stats()
    # Half the time with the hook, half without, at least two compiles each, at most five.
    while len(on) < 5 and (len(on) < 2 or time.monotonic() < halfway):
        on.append(timed())
        result["on_s"] = on
        progress(f"with the hook: {on[-1]:.2f} s")
    stats = hook.stats()
    result["hook_s_per_compile"] = round(stats.seconds / len(on), 4)
    xla_streams.disable()
    hook.reset_stats()
    off: list[float] = []
    while len(off) < 5 and (len(off) < 2 or time.monotonic() < deadline):
        off.append(timed())
        result["off_s"] = off
        progress(f"without the hook: {off[-1]:.2f} s")
    result["hook_calls_off"] = hook.stats().calls


def child_build(folder: Path) -> None:
    result = Result(folder / "result.json")
    begin = time.perf_counter()
    found = subprocess.run(
        [sys.executable, "-m", "xla_streams.runtime.build", "--print"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    result["found"] = found.stdout.strip().splitlines()
    progress("compiling the CUDA runtime")
    built = subprocess.run(
        [sys.executable, "-m", "xla_streams.runtime.build", "--cuda", "--verbose"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    print(built.stdout + built.stderr, flush=True)
    result["seconds"] = round(time.perf_counter() - begin, 1)
    if built.returncode != 0:
        raise SystemExit(f"the build failed (exit {built.returncode})")
    result["library"] = built.stdout.strip().split(": ", 1)[-1]


# The ffi child: collectives called directly through the runtime's custom calls, on a
# one-rank communicator (the device group {0}).
FFI_KINDS = abi.FFI_KINDS
NUMPY_NAMES = {
    "f32": "float32", "bf16": "bfloat16", "f16": "float16", "f64": "float64",
    "s8": "int8", "s16": "int16", "s32": "int32", "s64": "int64", "pred": "bool",
    "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
}  # fmt: skip
# The element types lower-to-ffi hands the CUDA runtime, by XLA's and numpy's names.
FFI_DTYPES = {dtype: NUMPY_NAMES[dtype] for dtype in abi.ELEMENT_TYPES["cuda"]}
# The ffi check's parts, in order; those that time nothing are rehearsed on the
# emulated runtime (--emulated), on XLA:CPU with JAX_PLATFORMS=cpu.
FFI_PARTS = ("kinds", "events", "overhead", "errors")
FFI_REHEARSED = ("kinds", "errors")
EMULATED_ENV = {"JAX_PLATFORMS": "cpu"}
OVERHEAD_SIZES = {"1 KiB": 1 << 10, "1 MiB": 1 << 20, "64 MiB": 64 << 20}
EVENT_ELEMENTS = 1 << 28  # f32: 1 GiB, long enough to watch it overlap a matmul
MATMUL = 8192  # bf16 [8192, 8192] @ [8192, 8192]: about 1.1 TFLOP


def ffi_call_of(
    op_id: int, kind: str, stream: int, name: str = "", groups: tuple[int, ...] = (0,),
    device_ids: tuple[int, ...] = (),
) -> abi.CollectiveCall:  # fmt: skip
    """A one-rank collective's attributes, as lower-to-ffi would write them."""
    one_dimension = kind in ("all-gather", "reduce-scatter", "all-to-all")
    if kind == "collective-permute":
        groups = (0, 0)  # one (source, target) pair: to itself
    return abi.CollectiveCall(
        op_id=op_id,
        name=name or f"gpu_check.{kind}",
        kind=kind,
        stream=stream,
        reduction="add" if kind in ("all-reduce", "reduce-scatter") else "",
        groups=groups,
        group_sizes=(len(groups),),
        dimension=0 if one_dimension else -1,
        outer=(1,) if one_dimension else (),
        channel=op_id + 1,
        num_partitions=1,
        device_ids=device_ids,
    )


@functools.cache
def xla_collective(kind: str) -> Callable[[Any], Any]:
    """XLA's own one-rank ``kind``, jitted once (shard_map over this one device)."""
    import jax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(jax.devices()[:1], ("r",))
    body = {
        "all-reduce": lambda v: jax.lax.psum(v, "r"),
        "all-gather": lambda v: jax.lax.all_gather(v, "r", tiled=True),
        "reduce-scatter": lambda v: jax.lax.psum_scatter(v, "r", tiled=True),
        "all-to-all": lambda v: jax.lax.all_to_all(v, "r", 0, 0, tiled=True),
        "collective-permute": lambda v: jax.lax.ppermute(v, "r", [(0, 0)]),
    }[kind]
    spec = P("r")
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))


def child_ffi(folder: Path, parts: tuple[str, ...], emulated: bool) -> None:
    """The ffi check's ``parts`` on this GPU or, ``emulated``, on XLA:CPU device 0
    driving the CUDA backend on the emulated CUDA runtime and NCCL."""
    checks = on_cpu.start() if emulated else None  # before JAX starts its backends
    import jax

    jax.config.update("jax_enable_x64", True)  # f64, s64, u64
    result = Result(folder / "result.json")
    if not emulated:
        runtime.register("cuda")
    result["nccl_version"] = int(runtime.load("cuda").xs_cuda_nccl_version())
    bodies: dict[str, tuple[str, Callable[[], Any]]] = {
        "kinds": ("every kind and element type", functools.partial(ffi_kinds, result)),
        "events": ("events, not host syncs: two collectives beside a matmul", ffi_events),
        "overhead": ("the cost of a start/done pair", ffi_overhead),
        "errors": ("errors", ffi_errors),
    }
    for part in parts:
        message, body = bodies[part]
        progress(message)
        result[part] = body()
    if "events" in parts:
        result["trace"] = chrome_trace(runtime.trace_events())
    if checks is not None:
        result["emulator_reports"] = checks.reports()


def ffi_kinds(result: Result) -> dict[str, Any]:
    """Every kind, each on a stream of its own, for every element type, against XLA's
    one-rank collective (the cases so far are written to ``result`` as they come).

    Five collectives reading one buffer at once would do as well on a GPU, but the
    emulator's forwarding handler takes each start's operands as written by the host
    just before it, so a second start on a buffer an earlier collective still reads
    would read there as a race."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    cases: dict[str, str] = {}
    for dtype, numpy_name in FFI_DTYPES.items():
        x = (jnp.arange(4096) % (2 if dtype == "pred" else 97)).astype(numpy_name)

        def pairs(*operands: Any) -> tuple[Any, ...]:
            return tuple(
                calls.collective(ffi_call_of(i, kind, stream=i), [v])[0]
                for i, (kind, v) in enumerate(zip(FFI_KINDS, operands, strict=True))
            )

        # Each collective its own operand (a copy of x): five independent collectives.
        operands = [jnp.array(x, copy=True) for _ in FFI_KINDS]
        for kind, got in zip(FFI_KINDS, jax.jit(pairs)(*operands), strict=True):
            try:
                expected, source = xla_collective(kind)(x), "XLA"
            except Exception as e:  # JAX has no such collective for this type (bool psum)
                expected, source = x, f"the operand (XLA refused: {type(e).__name__})"
            same = bool(np.array_equal(np.asarray(got), np.asarray(expected)))
            cases[f"{kind} {dtype}"] = f"{'equal' if same else 'DIFFERENT'} to {source}"
        result["kinds"] = {"passed": False, "cases": cases}  # so far
    return {"passed": all(v.startswith("equal") for v in cases.values()), "cases": cases}


def child_conformance(folder: Path, emulated: bool) -> None:
    """xsim-conformance against this image's CUDA runtime and NCCL or, ``emulated``,
    the stand-ins (built with them)."""
    result = Result(folder / "result.json")
    if emulated:
        program = emulator.build().conformance
    else:
        progress("compiling xsim-conformance against the CUDA runtime and NCCL")
        program = emulator.build_conformance(folder)
    result["program"] = str(program)
    progress("running it")
    found = emulator.conformance(program)
    result["devices"] = found["devices"]
    result["checks"] = found["checks"]


def ffi_events() -> dict[str, Any]:
    """An all-reduce on stream 0 and an all-gather on stream 1 started, then a matmul on
    the compute stream, then their dones (an optimization barrier and the matmul as an
    operand of each done pin that order). Were a start to wait on the host for its
    collective, the compute stream would run the collectives' time and then the
    matmul's; with events, the collectives hide behind the matmul."""
    import jax
    import jax.numpy as jnp

    reduce, gather = ffi_call_of(100, "all-reduce", 0), ffi_call_of(101, "all-gather", 1)

    def step(x: Any, y: Any, a: Any, b: Any) -> Any:
        s1 = calls.start(reduce, [x], [jax.ShapeDtypeStruct(x.shape, x.dtype)])
        s2 = calls.start(gather, [y], [jax.ShapeDtypeStruct(y.shape, y.dtype)])
        s1, s2, a = jax.lax.optimization_barrier((s1, s2, a))
        m = jnp.dot(a, b, preferred_element_type=jnp.float32)
        # The matmul is an operand of each done: they run after it.
        return calls.done(reduce, s1, [x], m)[0], calls.done(gather, s2, [y], m)[0], m

    def matmul(a: Any, b: Any) -> Any:
        return jnp.dot(a, b, preferred_element_type=jnp.float32)

    x = jnp.arange(EVENT_ELEMENTS, dtype=jnp.float32) % 1000.0
    y = jnp.arange(EVENT_ELEMENTS, dtype=jnp.float32) % 777.0
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (MATMUL, MATMUL), jnp.bfloat16)
    b = jax.random.normal(kb, (MATMUL, MATMUL), jnp.bfloat16)
    run, alone = jax.jit(step), jax.jit(matmul)
    order = schedule_order(str(run.lower(x, y, a, b).compile().as_text()))
    jax.block_until_ready(run(x, y, a, b))  # communicators, autotuning
    matmul_ms = 1e3 * statistics.median(timed(lambda: alone(a, b), 5))
    runtime.enable_trace()
    runtime.clear_trace()
    jax.block_until_ready(run(x, y, a, b))
    events = [e for e in runtime.trace_events() if e.backend == "cuda"]
    collectives = [e for e in events if e.what == "collective"]
    windows = [e for e in events if e.what == "compute"]
    figures: dict[str, Any] = {"schedule": order, "matmul_alone_ms": round(matmul_ms, 3)}
    if len(collectives) != 2 or not windows:
        return {**figures, "passed": False, "why": f"{len(collectives)} collectives traced"}
    begin = min(w.begin_ms or 0.0 for w in windows)
    window = max(w.end_ms or 0.0 for w in windows) - begin
    spans = {
        c.stream: ((c.begin_ms or 0.0) - begin, (c.end_ms or 0.0) - begin) for c in collectives
    }
    collective_ms = sum(end - start for start, end in spans.values())
    # At least half the collectives' time hidden behind the matmul.
    hidden = window < matmul_ms + collective_ms / 2
    return {
        **figures,
        "passed": hidden,
        "compute_window_ms": round(window, 3),
        "collectives_ms": round(collective_ms, 3),
        "serialised_would_be_ms": round(matmul_ms + collective_ms, 3),
        "collective_ms_by_stream": {str(k): [round(t, 3) for t in v] for k, v in spans.items()},
    }


def schedule_order(hlo_text: str) -> list[str]:
    """The entry computation's runtime calls and matmul (cuBLAS call or GEMM fusion), in order."""
    entry = hlo_text[hlo_text.index("ENTRY") :]
    order = []
    for line in entry.split("\n"):
        target = re.search(r'custom_call_target="([^"]+)"', line)
        if target and target.group(1) in abi.TARGETS:
            order.append(target.group(1))
        elif re.search(r"cublas|gemm|matmul|\bdot\(", line, re.IGNORECASE):
            order.append("matmul")
    return [o for i, o in enumerate(order) if o != "matmul" or i == 0 or order[i - 1] != o]


def timed(call: Callable[[], Any], repeats: int) -> list[float]:
    """Wall seconds of ``repeats`` calls, each waited for."""
    import jax

    samples = []
    for _ in range(repeats):
        begin = time.perf_counter()
        jax.block_until_ready(call())
        samples.append(time.perf_counter() - begin)
    return samples


def ffi_overhead() -> dict[str, Any]:
    """Per call: a start/done all-reduce against XLA's program for the same psum."""
    import jax
    import jax.numpy as jnp

    ours = jax.jit(lambda v: calls.collective(ffi_call_of(200, "all-reduce", stream=0), [v])[0])
    figures = {}
    for label, size in OVERHEAD_SIZES.items():
        x = jnp.ones(size // 4, jnp.float32)
        times = {}
        for name, fn in (("ours", ours), ("xla", xla_collective("all-reduce"))):
            jax.block_until_ready(fn(x))  # compile
            repeats = 20 if size < 1 << 24 else 5
            times[name] = statistics.median(timed(functools.partial(fn, x), repeats))
        figures[label] = {
            "ours_us": round(times["ours"] * 1e6, 1),
            "xla_us": round(times["xla"] * 1e6, 1),
            "ratio": round(times["ours"] / times["xla"], 2),
        }
    return figures


def ffi_errors() -> dict[str, Any]:
    """Two provoked failures, each must surface as an exception naming the op: a result
    that does not fit the collective (refused before NCCL is called), and an NCCL
    communicator whose second member never arrives (device 0 twice in the group)."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones(1024, jnp.float32)
    wrong = jax.ShapeDtypeStruct((2048,), jnp.float32)  # a one-rank all-gather keeps 1024
    bad_shape = ffi_call_of(300, "all-gather", 0, "gpu_check.bad_shape")
    lonely = ffi_call_of(301, "all-reduce", 0, "gpu_check.lonely", (0, 1), device_ids=(0, 0))
    cases = {
        "bad_shape": lambda: calls.collective(bad_shape, [x], [wrong]),
        "lonely": lambda: calls.collective(lonely, [x]),
    }
    runtime.set_timeout(5.0)  # the lonely communicator gives up after this
    figures: dict[str, Any] = {}
    for name, call in cases.items():
        try:
            jax.block_until_ready(jax.jit(call)())
            figures[name] = "no exception"
        except Exception as e:
            figures[name] = f"{type(e).__name__}: {str(e)[:400]}"
    figures["passed"] = all(f"gpu_check.{n}" in figures[n] for n in cases)
    return figures


def chrome_trace(events: list[Any]) -> dict[str, Any]:
    """The runtime's CUDA-event trace as a Chrome trace (one line per stream)."""
    rows = [
        {"ph": "X", "pid": e.device, "tid": e.stream + 1, "name": f"{e.what} {e.name}",
         "ts": (e.begin_ms or 0.0) * 1e3, "dur": ((e.end_ms or 0.0) - (e.begin_ms or 0.0)) * 1e3}
        for e in events
        if e.backend == "cuda" and e.begin_ms is not None
    ]  # fmt: skip
    names = {row["tid"] for row in rows}
    meta = [
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": t,
         "args": {"name": "compute" if t == 0 else f"collective stream {t - 1}"}}
        for t in sorted(names)
    ]  # fmt: skip
    return {"traceEvents": meta + rows, "displayTimeUnit": "ns"}


# -- the run -----------------------------------------------------------------------------------


def gpu_present() -> bool:
    """Without importing JAX: the driver lists a GPU."""
    return bool(glob.glob("/proc/driver/nvidia/gpus/*")) or "GPU" in _run(["nvidia-smi", "-L"])


def versions() -> dict[str, Any]:
    found: dict[str, Any] = {"python": platform.python_version()}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith(("jax", "nvidia-nccl", "nvidia-cuda-nvcc", "nvidia-cuda-runtime")):
            found[name] = dist.version
    found["jax"] = found.get("jax", "not installed")
    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    if smi:
        found["gpu"], _, found["driver"] = smi.splitlines()[0].partition(", ")
    nvcc = _run(["nvcc", "--version"])
    if nvcc:
        found["nvcc"] = nvcc.splitlines()[-1]
    return found


def _run(command: list[str]) -> str:
    if shutil.which(command[0]) is None:
        return ""
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=30)
    return done.stdout.strip() if done.returncode == 0 else ""


def plan(out: Path, budget_s: float, emulated: bool) -> list[str]:
    """What a run does, in order (shown by every run; a dry run does no more)."""
    me = f"python3 {Path(__file__).name} FOLDER --child"
    head = f"budget {budget_s:.0f} s; results in {out / 'gpu_check.json'}"
    if emulated:
        return [
            head,
            f"then:    {me} conformance --emulated (xsim-conformance on the stand-ins)",
            f"         {me} ffi --parts {','.join(FFI_REHEARSED)} --emulated (kinds x "
            f"{len(FFI_DTYPES)} types, errors; XLA:CPU device 0 on the emulated runtime)",
        ]
    tools = ",".join(tool for tool, _, _ in SANITIZERS.values())
    return [
        head,
        f"at once: {me} build (python -m xla_streams.runtime.build --cuda)",
        f"         {me} native K=2 and K=4 (JAX_MOCK_GPU_TOPOLOGY={MOCK_TOPOLOGY}, "
        f"xla_streams.enable(K), {PROGRAM}, {SAME_KERNELS}, dumps, profile, then off)",
        f"         {me} conformance (xsim-conformance against the CUDA runtime and NCCL; "
        "two-device expectations with two GPUs)",
        f"built:   compute-sanitizer --tool {{{tools}}} {me} ffi --parts kinds "
        "(memcheck: --track-stream-ordered-races all, XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async)",
        f"then:    {me} ffi (kinds x {len(FFI_DTYPES)} types, events, "
        f"{', '.join(OVERHEAD_SIZES)}, errors) -> {FFI_TRACE_FILE}",
        f"         {me} calibrate ({PROGRAM}, one device, profile) -> {CALIBRATION_FILE}, "
        f"{PGLE_FILE}",
        f"         {me} overhead ({PROGRAM}: compiles with and without the hook)",
    ]


def dry_run_calibration(out: Path, record: Record) -> None:
    """The calibration path end to end, on a fixture with synthetic measurements: the
    ratios found must be the ones put in, and the file must read back the same."""
    text = DRY_RUN_MODULE.read_text()
    kernels = Simulator(parse_module(text, str(DRY_RUN_MODULE)), get_target(TARGET)).kernels()
    measured = {
        name: seconds * DRY_RUN_RATIOS[kind]
        for name, (kind, seconds) in kernels.items()
        if kind in DRY_RUN_RATIOS
    }
    provenance = {
        "gpu": "none (dry run)",
        "date": datetime.date.today().isoformat(),
        "program": DRY_RUN_MODULE.name,
        "tool": "tools/gpu_check.py --dry-run",
    }
    calibration, figures = calibrate(text, measured, 0.0, provenance, TARGET)
    path = out / CALIBRATION_FILE
    path.write_text(calibration.to_json())
    read_back = load_calibration(path)
    record.figures = {**figures, "file": str(path)}
    record.passed = read_back == calibration and all(
        abs(figures["ratios"][c] - r) < 1e-3 for c, r in DRY_RUN_RATIOS.items()
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for gpu_check.json and the artefacts")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="plan, and the GPU-free parts")
    mode.add_argument(
        "--emulated", action="store_true",
        help="the checks that have a rehearsal, on the emulated CUDA runtime (no GPU)",
    )  # fmt: skip
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the run")
    parser.add_argument("--steps", type=int, default=5, help="training steps per run")
    # A child writes into OUT, its folder.
    parser.add_argument("--child", metavar="KIND", help=argparse.SUPPRESS)
    parser.add_argument("--streams", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--program", default=PROGRAM, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=60.0, help=argparse.SUPPRESS)
    parser.add_argument("--parts", default=",".join(FFI_PARTS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return run_child(args)
    if args.budget < 60:
        parser.error("--budget must be at least 60 seconds")
    if not (args.dry_run or args.emulated) and not gpu_present():
        print(
            "gpu_check: no NVIDIA GPU here (neither /proc/driver/nvidia/gpus nor nvidia-smi "
            "lists one): nothing run. "
            "Use --dry-run to see the plan and run the parts that need no GPU, --emulated "
            "to rehearse on the emulated CUDA runtime.",
            file=sys.stderr,
        )
        return 2
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget)
    for line in plan(out, args.budget, args.emulated):
        say(budget, line)
    found = versions()
    if args.dry_run:
        records = run_dry(out)
    elif args.emulated:
        records = run_emulated(out, budget)
    else:
        records = run_all(out, budget, found, args.steps)
    report = GpuCheckReport(
        dry_run=args.dry_run,
        emulated=args.emulated,
        gpu=found.get("gpu"),
        versions=found,
        budget_s=args.budget,
        seconds=round(budget.elapsed(), 1),
        checks=tuple(records),
    )
    (out / "gpu_check.json").write_text(report.to_json())
    for r in records:
        verdict = {True: "PASS", False: "FAIL", None: "----"}[r.passed]
        why = f": {r.error.splitlines()[0]}" if r.error else ""
        say(budget, f"{verdict} {r.name} ({r.seconds} s){why}")
    say(budget, f"wrote {out / 'gpu_check.json'}")
    return 1 if any(r.passed is False for r in records) else 0


def run_dry(out: Path) -> list[Record]:
    records = [new_record(name) for name in PROVES]
    for r in records:
        r.figures = {"dry_run": "not run: needs a GPU"}
    calibration = next(r for r in records if r.name == "calibration")
    run_check(calibration, lambda r: dry_run_calibration(out, r), out)
    calibration.figures["dry_run"] = "synthetic measurements on a fixture; no GPU used"
    return records


def run_emulated(out: Path, budget: Budget) -> list[Record]:
    """The checks that have a rehearsal, on the emulated CUDA runtime; the rest are not run."""
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    records = {name: new_record(name) for name in PROVES}
    for r in records.values():
        r.figures = {"emulated": "not run: needs a GPU"}
    conformance = start_child(
        work, "conformance", "conformance", ["--emulated"], EMULATED_ENV, budget.grant(150, 60)
    )
    wait([conformance], budget)
    run_check(records["conformance"], lambda r: check_conformance(r, conformance), out)
    seconds = budget.grant(300, 0)
    run_check(records["ffi"], lambda r: check_ffi(r, work, out, budget, seconds, True), out)
    for name in ("conformance", "ffi"):
        records[name].figures["emulated"] = "on the emulated CUDA runtime and NCCL: no GPU used"
    shutil.rmtree(work, ignore_errors=True)
    return list(records.values())


def run_all(out: Path, budget: Budget, found: dict[str, Any], steps: int) -> list[Record]:
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    records = {name: new_record(name) for name in PROVES}
    # Phase one, at once: the build (CPU) beside the native runs, the conformance
    # program and, once the build is done, the sanitizers: none of them times anything.
    build = start_child(work, "build", "build", [], {}, budget.grant(150, 150))
    conformance = start_child(work, "conformance", "conformance", [], {}, budget.grant(90, 150))
    # XLA's log of each async start it executes, with its stream (check_runtime_log).
    mock = {"JAX_MOCK_GPU_TOPOLOGY": MOCK_TOPOLOGY, "TF_CPP_MIN_LOG_LEVEL": "0",
            "TF_CPP_VMODULE": "async_thunk=1"}  # fmt: skip
    native = {
        k: start_child(
            work, f"native_k{k}", "native", ["--streams", str(k), "--steps", str(steps)],
            mock, budget.grant(120, 150),
        )
        for k in (2, 4)
    }  # fmt: skip
    wait([build], budget)
    run_check(records["build"], lambda r: check_build(r, build), out)
    sanitizers = start_sanitizers(work, budget, records) if records["build"].passed else {}
    wait([*native.values(), conformance, *sanitizers.values()], budget)
    run_check(records["native"], lambda r: check_native(r, native), out)
    run_check(records["conformance"], lambda r: check_conformance(r, conformance), out)
    for name in SANITIZERS:
        if name in sanitizers:
            run_check(records[name], lambda r: check_sanitizer(r, sanitizers[r.name]), out)
        elif not records["build"].passed:
            records[name].error = "not run: the build failed"
    # Phase two, one at a time: these time things.
    if records["build"].passed:
        run_check(
            records["ffi"], lambda r: check_ffi(r, work, out, budget, budget.grant(75, 80)), out
        )
    else:
        records["ffi"].error = "not run: the build failed"
    run_check(records["calibration"], lambda r: check_calibration(r, work, out, budget, found), out)
    seconds = budget.grant(60, 0)
    if seconds >= 25:
        run_check(
            records["plugin_overhead"], lambda r: check_overhead(r, work, budget, seconds), out
        )
    else:
        records["plugin_overhead"].error = f"not run: {seconds:.0f} s of the budget left"
    shutil.rmtree(work, ignore_errors=True)
    return list(records.values())


def run_child(args: argparse.Namespace) -> int:
    kind, folder = args.child, args.out
    children: dict[str, Callable[[], None]] = {
        "build": lambda: child_build(folder),
        "native": lambda: child_native(folder, args.streams, args.steps),
        "conformance": lambda: child_conformance(folder, args.emulated),
        "ffi": lambda: child_ffi(folder, tuple(args.parts.split(",")), args.emulated),
        "calibrate": lambda: child_calibrate(folder, args.program, args.steps),
        "overhead": lambda: child_overhead(folder, args.program, args.seconds),
    }
    children[kind]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
