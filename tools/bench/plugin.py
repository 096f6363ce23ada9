"""What the plugin costs a compile: jit compile time with and without it.

    python tools/bench.py plugin [--runs 7] [--program transformer_step] [--reports]

Two figures:

1. CPU, in the compile: the embedded program compiled by ``jax.jit`` for 8 CPU
   host devices, fresh every time (a new jit object each run, the persistent
   compilation cache off), alternately with the plugin on (``enable``) and off.
   Median of ``--runs`` each, and their ratio. Target: at most 1.05x. XLA:CPU
   has no async pairs, so this is the hook's fixed cost: proto -> text ->
   parse -> passes -> (nothing changed) -> None.
2. GPU: the program compiled for 8 H100s without a GPU (needs the ``gpu-aot``
   extra; since jax 0.11 the compile-only client calls the hook), alternately
   with the plugin on and off, the options native mode needs given to both as
   compile options. Here the hook does its full work on a module with all its
   async pairs: print, parse, assign, verify, annotate into XLA's proto.
"""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

from bench.runner import interleaved, machine, suite_parser
from xla_streams import aot, jax_compat, plugin, xla_options
from xla_streams.plugin import hook
from xla_streams.programs import PROGRAMS


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

    jax.config.update("jax_enable_compilation_cache", False)
    program = PROGRAMS[program_name]
    devices = jax.devices()[: program.num_devices]
    report_dir = tempfile.mkdtemp(prefix="bench_plugin_") if reports else None
    cpu_compile_seconds(program, devices)  # warm up JAX itself
    plugin.enable(4)
    cpu_compile_seconds(program, devices)  # and the plugin (first import of the passes)

    def on() -> tuple[float, float, float]:
        plugin.enable(4, report_dir=report_dir)
        before = hook.stats().seconds
        wall, cpu = cpu_compile_seconds(program, devices)
        return wall, cpu, hook.stats().seconds - before

    def off() -> tuple[float, float, float]:
        plugin.disable()
        return (*cpu_compile_seconds(program, devices), 0.0)

    timed = interleaved({"off": off, "on": on}, runs, warmups=0)
    plugin.disable()
    in_hook = [t[2] for t in timed["on"]]
    wall_on, wall_off = (statistics.median(t[0] for t in timed[side]) for side in ("on", "off"))
    cpu_on, cpu_off = (statistics.median(t[1] for t in timed[side]) for side in ("on", "off"))
    min_on, min_off = (min(t[0] for t in timed[side]) for side in ("on", "off"))
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
        "hook": statistics.median(in_hook),
        "hook_share": statistics.median(in_hook) / wall_off,
        "runs": runs,
    }


def bench_gpu(program_name: str, runs: int) -> dict[str, Any] | None:
    if jax_compat.cuda_plugin_module() is None:
        return None
    program = PROGRAMS[program_name]
    topology = aot.gpu_topology("h100", program.num_devices, program.devices_per_host)
    options = xla_options.native_mode(4)

    def compile_seconds() -> float:
        fn, args = program.build(topology.devices)
        lowered = fn.lower(*args)
        begin = time.perf_counter()
        lowered.compile(options)
        return time.perf_counter() - begin

    compile_seconds()  # warm up

    def on() -> tuple[float, float]:
        plugin.enable(4)
        before = hook.stats().seconds
        seconds = compile_seconds()
        return seconds, hook.stats().seconds - before

    def off() -> tuple[float, float]:
        plugin.disable()
        return compile_seconds(), 0.0

    timed = interleaved({"off": off, "on": on}, runs, warmups=0)
    plugin.disable()
    in_hook = [t[1] for t in timed["on"]]
    compile_off, compile_on = (statistics.median(t[0] for t in timed[s]) for s in ("off", "on"))
    return {
        "off": compile_off,
        "on": compile_on,
        "ratio": compile_on / compile_off,
        "hook": statistics.median(in_hook),
        "changed": hook.stats().changed,
    }


def main(argv: list[str]) -> int:
    parser = suite_parser("plugin", __doc__)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--program", default="transformer_step")
    parser.add_argument("--reports", action="store_true", help="also write reports (CPU)")
    parser.add_argument("--no-gpu", action="store_true", help="skip the deviceless GPU figure")
    ns = parser.parse_args(argv)
    cpu = bench_cpu(ns.program, ns.runs, ns.reports)
    print(machine())
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
    if not ns.no_gpu:
        gpu = bench_gpu(ns.program, ns.runs)
        if gpu is None:
            print("GPU figure skipped: needs the gpu-aot extra")
        else:
            print(
                f"GPU compile for 8 x H100 (deviceless), median of {ns.runs} each: off "
                f"{gpu['off']:.3f} s, on {gpu['on']:.3f} s: {gpu['ratio']:.3f}x; the hook "
                f"itself {gpu['hook'] * 1000:.1f} ms ({gpu['changed']} modules annotated)"
            )
    return 0
