"""Real JAX programs in ffi mode on the emulated CUDA runtime, XLA:CPU driving the
unchanged CUDA backend through the forwarding handlers (on_cpu.start()).

    python tests/runtime/emulated/xla_cpu_worker.py equal|hang
    python tests/runtime/emulated/xla_cpu_worker.py job PROCESS COORDINATOR   # 2 processes

Each scenario prints one ``RESULT <json>`` line. The programs are those of
tests/runtime/ffi_worker.py (8 CPU devices); its compile hook runs the ffi pipeline
for the CUDA runtime here: XLA:CPU's synchronous collectives split by asyncify,
then lowered to our custom calls with ``backend=cuda``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from xla_streams.runtime.emulator import on_cpu

CHECKS = on_cpu.start()  # before anything imports JAX, which loads CUDA libraries

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ffi_worker
import ffi_worker as programs  # noqa: E402  (it asks for 8 CPU devices)

if sys.argv[1] == "job":  # 2 processes of 4 devices
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax  # noqa: E402
import jax.extend.xla as jx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from xla_streams import runtime  # noqa: E402
from xla_streams.pipeline import PipelineSpec, build_pipeline  # noqa: E402
from xla_streams.plugin import hook  # noqa: E402
from xla_streams.plugin.xla_module import (  # noqa: E402
    device_assignment,
    module_text,
    to_proto,
)
from xla_streams.runtime import abi  # noqa: E402

SPEC = PipelineSpec.parse("asyncify,find-async-pairs,assign-streams,verify-streams,lower-to-ffi")


def callback(serialized: bytes) -> bytes | None:
    """The ffi pipeline for the CUDA runtime, while ffi_worker's STATE["ffi"] is set."""
    _, text = module_text(serialized)
    rewritten = programs.STATE["rewrite"](text) if programs.STATE["rewrite"] else text
    out = rewritten
    if programs.STATE["ffi"]:
        assignment = device_assignment(serialized)  # the CUDA runtime's ranks: device ids
        devices = assignment.device_ids if assignment is not None else ()
        pipeline = build_pipeline(4, runtime="cuda", devices=devices, spec=SPEC)
        compilation = hook.run_pipeline(rewritten, pipeline)
        if compilation.module.restructured:
            out = compilation.module.print()
            on_cpu.follow_schedule(out)
            programs.STATE["lowered"] += out.count(f'custom_call_target="{abi.START_TARGET}"')
    return None if out == text else to_proto(out)


def same(native: Any, ffi: Any) -> bool:
    flat_n, flat_f = jax.tree.leaves(native), jax.tree.leaves(ffi)
    return all(
        a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
        for a, b in zip(flat_n, flat_f, strict=True)
    )


def equal() -> dict[str, Any]:
    """Every kind and element type the CUDA runtime runs, against XLA's own results."""
    checks = []

    def check(name: str, fn: Any, args: tuple[Any, ...], rewrite: Any = None) -> None:
        native, ffi, lowered = programs.run_both(fn, args, rewrite)
        checks.append({"name": name, "equal": same(native, ffi), "lowered": lowered})

    for name in abi.ELEMENT_TYPES["cuda"]:
        if name in ("s64", "u64"):  # XLA:CPU's own collectives of these run as well,
            dtype = getattr(jnp, {"s64": "int64", "u64": "uint64"}[name])  # with x64 on
        else:
            dtype = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16,
                     "f64": jnp.float64, "s32": jnp.int32, "s8": jnp.int8, "pred": jnp.bool_,
                     "u8": jnp.uint8, "u32": jnp.uint32}[name]  # fmt: skip
        x = programs.data(dtype, (64, 8), seed=len(checks))
        check(f"kinds/{name}", programs.all_kinds(dtype), (x,))
        if dtype != jnp.bool_:
            xm = programs.data(dtype, (64, 8), seed=100 + len(checks), kind="multiply")
            mul = programs.swap_reducers({"add": "multiply"})
            check(f"reductions/{name}/multiply", programs.reductions(dtype), (xm,), mul)
    check("groups2d/f32", programs.groups2d(), (programs.data(jnp.float32, (64, 8), seed=7),))
    check("scan/f32", programs.scan_loop(), (programs.data(jnp.float32, (64, 8), seed=9),))
    return {"checks": checks}


def hang() -> dict[str, Any]:
    """A good all-reduce over the 8 devices, then one that devices 4-7 never reach: the
    step raises on devices 0-3 (their compute is host-synchronous, as on CPU devices)."""
    runtime.set_timeout(2.0)
    mesh = programs.mesh1d()

    def everyone(x: Any) -> Any:
        return jax.lax.psum(x, "x")

    def half(x: Any) -> Any:
        i = jax.lax.axis_index("x")
        return jax.lax.cond(i < 4, lambda v: jax.lax.psum(v, "x"), lambda v: v * 2, x)

    programs.STATE["ffi"] = True
    x = jnp.ones((64,), jnp.float32)
    good = np.asarray(jax.jit(programs.smap(mesh, everyone, P("x"), P("x")))(x))
    try:
        jax.block_until_ready(jax.jit(programs.smap(mesh, half, P("x"), P("x")))(x))
        error = None
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    return {"good": bool(np.all(good == 8)), "error": error}


def job(process: int) -> dict[str, Any]:
    """Two processes of 4 devices: one all-reduce and one all-gather across both, NCCL
    ids through JAX's distributed key-value store."""
    on_cpu.join_job()
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))

    def body(x: Any) -> Any:
        return jax.lax.psum(x, "x"), jax.lax.all_gather(x, "x", tiled=True)

    fn = jax.jit(programs.smap(mesh, body, P("x"), (P("x"), P())))
    programs.STATE["ffi"] = True
    sharding = jax.sharding.NamedSharding(mesh, P("x"))
    x = jax.make_array_from_callback(
        (8, 4), sharding, lambda index: np.arange(32, dtype=np.float32).reshape(8, 4)[index]
    )
    total, gathered = fn(x)
    rows = np.arange(32, dtype=np.float32).reshape(8, 4)
    local_total = [np.asarray(s.data) for s in total.addressable_shards]
    local_gathered = [np.asarray(s.data) for s in gathered.addressable_shards]
    return {
        "process": process,
        "lowered": programs.STATE["lowered"],
        "sum": all(np.array_equal(t, rows.sum(0, keepdims=True)) for t in local_total),
        "gather": all(np.array_equal(g, rows) for g in local_gathered),
    }


def main() -> int:
    if sys.argv[1] == "job":  # before anything starts JAX's backends
        jax.distributed.initialize(sys.argv[3], num_processes=2, process_id=int(sys.argv[2]))
    jax.config.update("jax_enable_x64", True)
    jx.register_hlo_module_transformation(
        callback, name="xla_streams_emulated", stage=jx.PipelineStage.POST_SCHEDULER,
        platforms=["cpu"],
    )  # fmt: skip
    scenario = sys.argv[1]
    if scenario == "job":
        result = job(int(sys.argv[2]))
    else:
        result = {"equal": equal, "hang": hang}[scenario]()
    result["reports"] = CHECKS.reports()
    result["collectives_run"] = len(CHECKS.op_log())
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
