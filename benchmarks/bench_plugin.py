#!/usr/bin/env python3
"""What the plugin costs a compile: jit compile time with and without it.

    python benchmarks/bench_plugin.py [--runs 7] [--program transformer_step] [--reports]

Two figures:

1. CPU, in the compile: the embedded program compiled by ``jax.jit`` for 8 CPU
   host devices, fresh every time (a new jit object each run, the persistent
   compilation cache off), alternately with the plugin on (``enable``) and off.
   Median of ``--runs`` each, and their ratio. Target: at most 1.05x. XLA:CPU
   has no async pairs, so this is the hook's fixed cost: proto -> text ->
   parse -> passes -> (nothing changed) -> None.
2. GPU, estimated: the program compiled for 8 H100s without a GPU (needs the
   ``gpu-aot`` extra), and the hook's own entry point (``plugin.transform``) run
   on the scheduled module that compile produced, which has all its async
   pairs, so the hook does its full work: print, parse, assign, verify,
   annotate, print, parse back into XLA. (The compile-only client does not call
   the hook itself.) Ratio: (compile + hook) / compile.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def cpu_compile_seconds(program: Any, devices: list[Any]) -> tuple[float, float]:
    """(wall, CPU) seconds of one fresh compile; CPU time (all threads of this process)
    is less disturbed by other work on a shared machine."""
    fn, args = program.build(devices)  # a new jit object: nothing cached
    lowered = fn.lower(*args)
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    lowered.compile()
    return time.perf_counter() - wall, time.process_time() - cpu


def bench_cpu(program_name: str, runs: int, reports: bool) -> dict[str, Any]:
    import jax

    from xla_streams import plugin
    from xla_streams.programs import PROGRAMS

    jax.config.update("jax_enable_compilation_cache", False)
    program = PROGRAMS[program_name]
    devices = jax.devices()[: program.num_devices]
    report_dir = tempfile.mkdtemp(prefix="bench_plugin_") if reports else None
    cpu_compile_seconds(program, devices)  # warm up JAX itself
    plugin.enable(4)
    cpu_compile_seconds(program, devices)  # and the plugin (first import of the passes)
    on: list[tuple[float, float]] = []
    off: list[tuple[float, float]] = []
    hook: list[float] = []
    for i in range(2 * runs):
        if (i + i // 2) % 2:  # off, on, on, off, off, on, ...: no side is always second
            plugin.enable(4, report_dir=report_dir)
            before = plugin.stats().seconds
            on.append(cpu_compile_seconds(program, devices))
            hook.append(plugin.stats().seconds - before)
        else:
            plugin.disable()
            off.append(cpu_compile_seconds(program, devices))
    plugin.disable()
    wall_on, wall_off = (statistics.median(t[0] for t in runs_) for runs_ in (on, off))
    cpu_on, cpu_off = (statistics.median(t[1] for t in runs_) for runs_ in (on, off))
    min_on, min_off = (min(t[0] for t in runs_) for runs_ in (on, off))
    return {
        "off": wall_off,
        "on": wall_on,
        "ratio": wall_on / wall_off,
        "min_off": min_off,
        "min_on": min_on,
        "min_ratio": min_on / min_off,
        "cpu_off": cpu_off,
        "cpu_on": cpu_on,
        "cpu_ratio": cpu_on / cpu_off,
        "hook": statistics.median(hook),
        "hook_share": statistics.median(hook) / wall_off,
        "runs": runs,
    }


def bench_gpu_estimate(program_name: str, runs: int) -> dict[str, Any] | None:
    import importlib.util

    from xla_streams import xla_module

    if importlib.util.find_spec("jax_cuda12_plugin") is None:
        return None
    from xla_streams import aot, plugin
    from xla_streams.config import Config
    from xla_streams.programs import PROGRAMS

    program = PROGRAMS[program_name]
    topology = aot.gpu_topology("h100", program.num_devices, program.devices_per_host)
    options = {k: int(v) for k, v in plugin.native_xla_flags(4).items()}
    compile_times: list[float] = []
    executable = None
    for _ in range(max(1, runs // 2)):
        fn, args = program.build(topology.devices)
        lowered = fn.lower(*args)
        begin = time.perf_counter()
        executable = lowered.compile(options)
        compile_times.append(time.perf_counter() - begin)
    assert executable is not None
    (module,) = executable.runtime_executable().hlo_modules()
    proto = module.as_serialized_hlo_module_proto()
    text = module.to_string(xla_module.print_options())
    counts = (1, program.num_devices)
    # Give the hook the device assignment XLA's own compile would serialize.
    proto += xla_module.device_assignment_field(xla_module.DeviceAssignment(*counts, ()))
    plugin.enable_config(Config(4), "bench")
    hook_times: list[float] = []
    changed = None
    for _ in range(runs):
        begin = time.perf_counter()
        changed = plugin.transform(proto)
        hook_times.append(time.perf_counter() - begin)
    plugin.disable()
    compile_s, hook_s = statistics.median(compile_times), statistics.median(hook_times)
    return {
        "compile": compile_s,
        "hook": hook_s,
        "ratio": (compile_s + hook_s) / compile_s,
        "annotated": changed is not None,
        "lines": text.count("\n"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--program", default="transformer_step")
    parser.add_argument("--reports", action="store_true", help="also write reports (CPU)")
    parser.add_argument("--no-gpu-estimate", action="store_true")
    ns = parser.parse_args(argv)
    cpu = bench_cpu(ns.program, ns.runs, ns.reports)
    print(
        f"CPU jit compile of {ns.program} (8 host devices), median of {cpu['runs']} fresh "
        f"compiles each:\n"
        f"  wall: off {cpu['off']:.3f} s, on {cpu['on']:.3f} s: {cpu['ratio']:.3f}x "
        f"(fastest: {cpu['min_off']:.3f} s, {cpu['min_on']:.3f} s: {cpu['min_ratio']:.3f}x)\n"
        f"  CPU time: off {cpu['cpu_off']:.3f} s, on {cpu['cpu_on']:.3f} s: "
        f"{cpu['cpu_ratio']:.3f}x\n"
        f"  the hook itself: {cpu['hook'] * 1000:.1f} ms = "
        f"{1 + cpu['hook_share']:.3f}x of the compile"
    )
    if not ns.no_gpu_estimate:
        gpu = bench_gpu_estimate(ns.program, ns.runs)
        if gpu is None:
            print("GPU estimate skipped: needs the gpu-aot extra")
        else:
            print(
                f"GPU (8 x H100, deviceless) compile {gpu['compile']:.3f} s; the hook on its "
                f"scheduled module ({gpu['lines']} lines, annotated: {gpu['annotated']}) "
                f"{gpu['hook'] * 1000:.1f} ms: {gpu['ratio']:.3f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
