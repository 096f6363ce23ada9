#!/usr/bin/env python3
"""On a machine with NVIDIA GPUs: check that the plugin's collectives really run on
the streams its report assigns (native mode, the hook inside XLA's compile).

    python scripts/gpu_check_native.py [--streams 4] [--out DIR] [--steps 5]

Runs in well under 5 minutes on one H200 (three short child processes):

``on``   the embedded training step (``transformer_step`` with 8 or more GPUs,
         ``fsdp_unrolled`` over all of them with 2..7; with one GPU, 8 GPUs
         mocked by JAX's ``jax_mock_gpu_topology=1x8x1``: one real device, NCCL
         mocked) with only ``XLA_STREAMS_COLLECTIVE_STREAMS=K`` and
         ``XLA_STREAMS_REPORT_DIR`` set, an XLA dump, and XLA's runtime log of
         every async start (``TF_CPP_VMODULE=async_thunk=1``);
``off``  the same program without the plugin, for the numbers.

Checks, each PASS/FAIL:

1. the hook ran inside the GPU compile and wrote the step's report;
2. XLA's options: the dumped debug options have the overlap limit and the
   communication streams at K (the plugin put them in XLA_FLAGS);
3. compile: in XLA's ``thunk_sequence`` dump of the step every collective the
   report puts on stream k starts on ``communication_stream[k]``;
4. run: XLA's log of the executed async starts shows each collective on the
   report's stream id, and collectives on different streams on different CUDA
   streams (stream pointers), on every device;
5. the losses with and without the plugin are equal.

Exit status: 0 all checks passed, 1 one failed, 3 no GPU here (nothing run).
``--check-dump DIR --report FILE`` runs check 3 on an existing dump (for
example one from scripts/prove_native_streams.py --out), with no GPU.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from prove_native_streams import thunk_streams  # noqa: E402

CHILD_TIMEOUT_S = 150
# XLA's VLOG(1) in async_thunk.cc (0.10.2): "Execute async for `%s`: stream_id=%v, stream=%p";
# the id is read as the last number of its printed form, whatever that form is.
_RUNTIME_LOG = re.compile(r"Execute async(?: \w+)? for `([^`]+)`: stream_id=([^,]*), stream=(\S+)")
_DEVICE_PREFIX = re.compile(r"\[(\d+)\]")


# -- checks on files (no GPU needed) -------------------------------------------------------


def load_report(report_dir: str, module: str = "jit_step") -> dict[str, Any]:
    found = sorted(glob.glob(os.path.join(report_dir, f"{module}.*.json")))
    if not found:
        raise FileNotFoundError(f"no report for module {module} in {report_dir}")
    report: dict[str, Any] = json.loads(Path(found[0]).read_text())
    return report


def check_thunks(dump_dir: str, report: dict[str, Any]) -> tuple[bool, str]:
    """Every collective the report puts on stream k starts on communication_stream[k]."""
    module = report["module"]
    sequences = sorted(glob.glob(os.path.join(dump_dir, f"*.{module}.thunk_sequence.txt")))
    metadata = sorted(glob.glob(os.path.join(dump_dir, f"*.{module}.thunk_metadata.txt")))
    if not sequences or not metadata:
        return False, f"no thunk dump of {module} in {dump_dir}"
    streams = thunk_streams(Path(sequences[0]).read_text(), Path(metadata[0]).read_text())
    wrong = []
    checked = 0
    for c in report["collectives"]:
        if c["stream"] is None:
            continue
        checked += 1
        if streams.get(c["start"]) != c["stream"]:
            wrong.append(f"{c['start']}: report {c['stream']}, thunk {streams.get(c['start'])}")
    used = sorted({c["stream"] for c in report["collectives"] if c["stream"] is not None})
    if wrong:
        return False, f"{len(wrong)} of {checked} differ: " + "; ".join(wrong[:5])
    return True, f"{checked} collectives on communication_stream{used} as assigned"


def check_runtime_log(log: str, report: dict[str, Any]) -> tuple[bool, str]:
    """The executed async starts: stream ids as assigned, one CUDA stream per stream id."""
    assigned = {c["start"]: c["stream"] for c in report["collectives"] if c["stream"] is not None}
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


def check_debug_options(dump_dir: str, module: str, streams: int) -> tuple[bool, str]:
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


# -- the child: compile and run on this machine's GPUs ---------------------------------


def child(steps: int, result_path: str) -> int:
    import jax
    import numpy as np

    from xla_streams import plugin, programs

    devices = jax.devices()
    if devices[0].platform != "gpu":
        raise SystemExit(f"no GPU: JAX sees {devices}")
    if len(devices) >= 8:
        name, (fn, args) = "transformer_step", programs.transformer_step(devices[:8])
    else:
        name, (fn, args) = "fsdp_unrolled", programs.fsdp_unrolled(devices)
    key = [jax.random.key(0)]

    def concrete(spec: Any) -> Any:
        key[0], sub = jax.random.split(key[0])
        return jax.device_put(jax.random.normal(sub, spec.shape, spec.dtype) * 0.02, spec.sharding)

    params, *rest = jax.tree.map(concrete, args)
    begin = time.perf_counter()
    compiled = fn.lower(*args).compile()
    compile_s = time.perf_counter() - begin
    losses = []
    begin = time.perf_counter()
    for _ in range(steps):
        loss, params = compiled(params, *rest)
        losses.append(float(np.asarray(jax.device_get(loss))))
    jax.block_until_ready(params)
    run_s = (time.perf_counter() - begin) / max(steps, 1)
    stats = plugin.stats()
    result = {
        "program": name,
        "module": compiled.as_text().split(",", 1)[0].removeprefix("HloModule ").strip(),
        "devices": len(devices),
        "device_kind": devices[0].device_kind,
        "losses": losses,
        "compile_s": compile_s,
        "step_s": run_s,
        "hook_calls": stats.calls,
        "hook_failed": stats.failed,
        "reports": stats.reports,
        "plugin": repr(plugin.current()),
        "mock": bool(os.environ.get("JAX_MOCK_GPU_TOPOLOGY")),
    }
    Path(result_path).write_text(json.dumps(result, indent=1))
    return 0


def _run_child(
    out: Path, label: str, steps: int, env_extra: dict[str, str]
) -> tuple[dict[str, Any] | None, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_STREAMS_")}
    env.pop("JAX_PLATFORMS", None)
    env.update(env_extra)
    result = out / f"{label}.json"
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", str(result), "--steps", str(steps)],
            env=env,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as e:
        log = (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        (out / f"{label}.log").write_text(log)
        return None, f"timed out after {CHILD_TIMEOUT_S} s"
    (out / f"{label}.log").write_text(proc.stderr)
    if proc.returncode != 0 or not result.exists():
        return None, proc.stderr[-3000:]
    data: dict[str, Any] = json.loads(result.read_text())
    return data, proc.stderr


def visible_gpus() -> int:
    return len(glob.glob("/proc/driver/nvidia/gpus/*"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default="gpu_check_native_out")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--check-dump", default=None, help="check an existing XLA dump")
    parser.add_argument("--report", default=None, help="with --check-dump: the report JSON")
    ns = parser.parse_args(argv)
    if ns.child:
        return child(ns.steps, ns.child)
    if ns.check_dump:
        ok, why = check_thunks(ns.check_dump, json.loads(Path(ns.report).read_text()))
        print(f"[{'PASS' if ok else 'FAIL'}] thunks: {why}")
        return 0 if ok else 1

    gpus = visible_gpus()
    if gpus == 0:
        print("no NVIDIA GPU here: nothing checked (see scripts/prove_native_streams.py)")
        return 3
    out = Path(ns.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    dump, reports = out / "dump", out / "reports"
    common: dict[str, str] = {}
    if gpus == 1:
        common["JAX_MOCK_GPU_TOPOLOGY"] = "1x8x1"  # 8 devices, one real, NCCL mocked
    on_env = {
        **common,
        "XLA_STREAMS_COLLECTIVE_STREAMS": str(ns.streams),
        "XLA_STREAMS_REPORT_DIR": str(reports),
        "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump} "
        "--xla_dump_hlo_as_text".strip(),
        "TF_CPP_MIN_LOG_LEVEL": "0",
        "TF_CPP_VMODULE": "async_thunk=1",
    }
    results: list[tuple[str, bool, str]] = []
    on, log = _run_child(out, "on", ns.steps, on_env)
    if on is None:
        print(f"the plugin run failed:\n{log}")
        return 1
    module = on["module"]
    results.append(
        (
            "the hook ran inside the GPU compile",
            on["hook_calls"] > 0
            and on["hook_failed"] == 0
            and any(reports.glob(f"{module}.*.json")),
            f"{on['hook_calls']} modules, {on['hook_failed']} failed; {on['program']} on "
            f"{on['devices']} x {on['device_kind']}{' (mocked 8)' if on['mock'] else ''}",
        )
    )
    report = load_report(str(reports), module)
    results.append(("XLA options", *check_debug_options(str(dump), module, ns.streams)))
    results.append(("compile: thunks on the report's streams", *check_thunks(str(dump), report)))
    results.append(("run: executed on the report's streams", *check_runtime_log(log, report)))
    off, off_log = _run_child(out, "off", ns.steps, dict(common))
    if off is None:
        results.append(("losses equal with and without the plugin", False, off_log[-500:]))
    else:
        same = off["losses"] == on["losses"]
        results.append(
            (
                "losses equal with and without the plugin",
                same,
                f"on {on['losses']}, off {off['losses']}; step {on['step_s'] * 1000:.1f} ms "
                f"vs {off['step_s'] * 1000:.1f} ms",
            )
        )
    summary = report["summary"]
    print(
        f"{module}: {summary['async_pairs']} async pairs, {summary['assigned']} on "
        f"{summary['streams_used']} of {report['streams']} streams (report in {reports})"
    )
    for name, ok, why in results:
        print(f"[{'PASS' if ok else 'FAIL'}] {name}: {why}")
    (out / "summary.json").write_text(
        json.dumps([{"check": n, "ok": ok, "detail": w} for n, ok, w in results], indent=1)
    )
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
