"""Cost of one ffi-mode start/done pair against XLA's own collective, host backend.

    python tools/bench.py ffi                       # 8 CPU devices, 1 KiB .. 16 MiB
    python tools/bench.py ffi --sizes 256 65536 --repeat 15 --loop 200

The program is ``fori_loop(loop, x -> psum(x) * c)`` under ``shard_map`` on 8
host devices, so each call runs ``--loop`` all-reduces of ``size`` f32 per
device back to back and the per-call dispatch is amortised away (by default the
loop is shorter the larger the message). It runs with XLA's own (synchronous)
CPU all-reduce and with the ffi pipeline (asyncify ... lower-to-ffi{backend=host}),
calls of the two interleaved after two warm-ups each. Reported: the median over
``--repeat`` calls of the time per collective, and the median over the pairs of
calls (one of each, run one after the other: they saw about the same load) of the
ratio ffi / XLA.

With nothing to overlap, the ratio is the pure cost of the runtime: the
rendezvous, the hand-off to the stream workers (none for small messages, which
the last start runs), the reduction (each worker a slice of every member's
result, read from the operands in place) and the asynchronous done. On a
machine with fewer cores than devices, other load moves both columns; compare
ratios, not times, between runs.
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

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

from bench.runner import interleaved, suite_parser
from xla_streams import runtime
from xla_streams.pipeline import build_pipeline
from xla_streams.plugin import hook
from xla_streams.plugin.xla_module import module_text
from xla_streams.runtime import abi

FFI = {"on": False, "lowered": 0}


def callback(serialized: bytes) -> bytes | None:
    if not FFI["on"]:
        return None
    compilation = hook.run_pipeline(module_text(serialized)[1], build_pipeline(4, runtime="host"))
    lowered = compilation.module.print().count(f'custom_call_target="{abi.START_TARGET}"')
    FFI["lowered"] += lowered
    return hook.back_to_xla(serialized, compilation)


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


def loop_for(size: int) -> int:
    """Collectives per call: about 256 MiB of operands in all, 10 to 100. Enough to
    amortise what each call costs once: XLA:CPU allocates its buffers per call, and
    the first touch of each page faults."""
    return max(10, min(100, (256 << 20) // (8 * size * 4)))


def label(size: int) -> str:
    kib = size * 4 // 1024
    return f"{kib // 1024} MiB" if kib >= 1024 else f"{kib} KiB"


def main(argv: list[str]) -> int:
    parser = suite_parser("ffi", __doc__)
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[256, 16384, 262144, 4194304], help="f32/device"
    )
    parser.add_argument("--repeat", type=int, default=11, help="timed calls per variant")
    parser.add_argument("--loop", type=int, help="collectives per call (default: by size)")
    args = parser.parse_args(argv)

    runtime.register("host")
    jx.register_hlo_module_transformation(
        callback, name="bench_ffi", stage=jx.PipelineStage.POST_SCHEDULER, platforms=["cpu"]
    )
    cpus = os.cpu_count()
    print(f"# {platform.machine()}, {cpus} CPUs, jax {jax.__version__}, 8 host devices")
    pipeline = ",".join(p.spec() for p in build_pipeline(4, runtime="host"))
    print(f"# median of {args.repeat} calls per variant, interleaved; pipeline: {pipeline}")
    header = (
        f"{'per device':>11} {'bytes':>9} {'loop':>5} {'XLA us/op':>10} {'ffi us/op':>10} "
        f"{'ratio':>7}"
    )
    print(header)
    for size in args.sizes:
        loop = args.loop or loop_for(size)
        native, ffi, x = compile_both(size, loop)
        np.testing.assert_allclose(np.asarray(native(x)), np.asarray(ffi(x)), rtol=1e-6)
        sides = {"native": native, "ffi": ffi}
        times = interleaved(
            {k: lambda f=f, x=x: timed(f, x) for k, f in sides.items()}, args.repeat, warmups=2
        )
        per_op = {k: statistics.median(v) / loop * 1e6 for k, v in times.items()}
        # Each ffi call against the XLA call of its round, which saw the same load.
        ratio = statistics.median(f / n for f, n in zip(times["ffi"], times["native"], strict=True))
        print(
            f"{label(size):>11} {size * 4:>9} {loop:>5} {per_op['native']:>10.1f} "
            f"{per_op['ffi']:>10.1f} {ratio:>7.2f}"
        )
        sys.stdout.flush()
    return 0
