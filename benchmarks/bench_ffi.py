"""Overhead of one ffi-mode start/done pair against XLA's own collective, host backend.

    python benchmarks/bench_ffi.py                       # 8 CPU devices, a few sizes
    python benchmarks/bench_ffi.py --sizes 256 65536 --repeat 15 --loop 200

The program is ``fori_loop(loop, x -> psum(x) * c)`` under ``shard_map`` on 8
host devices, so each call runs ``--loop`` all-reduces of ``size`` f32 per
device back to back and the per-call dispatch is amortised away. It runs with
XLA's own (synchronous) CPU all-reduce and with the ffi pipeline (asyncify ...
lower-to-ffi{backend=host}), interleaved, after a warm-up each. Reported: the
median over ``--repeat`` calls of the time per collective, and the ratio
ffi / XLA. With nothing to overlap, the ratio is the pure cost of the runtime:
the start's operand copy, the hand-off to a stream worker and back, and the
asynchronous done.
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import platform
import statistics
import time
from typing import Any

import jax
import jax.extend.xla as jx
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from xla_streams import runtime
from xla_streams.runtime import hook
from xla_streams.xla_module import module_text, to_proto

FFI = {"on": False, "lowered": 0}
SPEC = hook.pipeline_spec("host", streams=4)


def callback(serialized: bytes) -> bytes | None:
    if not FFI["on"]:
        return None
    text = hook.transform_text(module_text(serialized)[1], SPEC)
    if text is None:
        return None
    FFI["lowered"] += text.count('custom_call_target="xla_streams_start"')
    return to_proto(text)


def program(loop: int) -> Any:
    mesh = Mesh(np.array(jax.devices()), ("x",))

    def body(x: Any) -> Any:
        return jax.lax.fori_loop(0, loop, lambda _, v: jax.lax.psum(v, "x") * 0.125, x)

    return jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)


def compile_both(size: int, loop: int) -> tuple[Any, Any, Any]:
    x = jnp.ones((8 * size,), jnp.float32)
    FFI["on"] = False
    native = jax.jit(program(loop)).lower(x).compile()
    FFI["on"] = True
    before = FFI["lowered"]
    ffi = jax.jit(program(loop)).lower(x).compile()
    FFI["on"] = False
    if FFI["lowered"] == before:
        raise SystemExit("bench_ffi: the ffi pipeline lowered nothing")
    return native, ffi, x


def timed(fn: Any, x: Any) -> float:
    began = time.perf_counter()
    jax.block_until_ready(fn(x))
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 16384, 262144])
    parser.add_argument("--repeat", type=int, default=11, help="timed calls per variant")
    parser.add_argument("--loop", type=int, default=100, help="collectives per call")
    args = parser.parse_args(argv)

    runtime.register("host")
    jx.register_hlo_module_transformation(
        callback, name="bench_ffi", stage=jx.PipelineStage.POST_SCHEDULER, platforms=["cpu"]
    )
    cpus = os.cpu_count()
    print(f"# {platform.machine()}, {cpus} CPUs, jax {jax.__version__}, 8 host devices")
    print(f"# {args.loop} all-reduces per call, median of {args.repeat} calls; pipeline: {SPEC}")
    header = f"{'f32/device':>11} {'bytes':>9} {'XLA us/op':>10} {'ffi us/op':>10} {'ratio':>7}"
    print(header)
    for size in args.sizes:
        native, ffi, x = compile_both(size, args.loop)
        np.testing.assert_allclose(np.asarray(native(x)), np.asarray(ffi(x)), rtol=1e-6)
        times: dict[str, list[float]] = {"native": [], "ffi": []}
        for _ in range(2):  # warm-up
            timed(native, x)
            timed(ffi, x)
        for _ in range(args.repeat):
            times["native"].append(timed(native, x))
            times["ffi"].append(timed(ffi, x))
        per_op = {k: statistics.median(v) / args.loop * 1e6 for k, v in times.items()}
        ratio = per_op["ffi"] / per_op["native"]
        print(
            f"{size:>11} {size * 4:>9} {per_op['native']:>10.1f} {per_op['ffi']:>10.1f} "
            f"{ratio:>7.2f}"
        )
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
