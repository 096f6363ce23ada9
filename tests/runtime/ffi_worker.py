"""End-to-end programs for the ffi runtime on 8 CPU devices, run in a subprocess.

    python tests/runtime/ffi_worker.py equal|overlap|timeout|mismatch|direct|aliased
    python tests/runtime/ffi_worker.py capture tests/data/ffi_fixtures   # the modules test_ffi_passes reads

Each scenario prints one ``RESULT <json>`` line and exits 0 when it ran. The
tests in test_ffi_runtime.py check what it reports. The compile hook here runs
the ffi pipeline (asyncify, find-async-pairs, assign-streams, verify-streams,
lower-to-ffi) only while ``STATE["ffi"]`` is set, so every program also runs
with XLA's own collectives for reference; ``STATE["rewrite"]`` swaps reduction
computations (add -> multiply, ...) in both runs to reach reductions JAX has
no primitive for.
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import ctypes
import dataclasses
import json
import re
import time
from typing import Any

import jax
import jax.extend.xla as jx
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from xla_streams import runtime
from xla_streams.pipeline import build_pipeline
from xla_streams.plugin import hook
from xla_streams.plugin.xla_module import module_text, to_proto
from xla_streams.runtime import abi, calls

STATE: dict[str, Any] = {"ffi": False, "rewrite": None, "lowered": 0, "modules": []}
STREAMS = 4


def callback(serialized: bytes) -> bytes | None:
    _, text = module_text(serialized)
    rewritten = STATE["rewrite"](text) if STATE["rewrite"] else text
    out = rewritten
    if STATE["ffi"]:
        compilation = hook.run_pipeline(rewritten, build_pipeline(STREAMS, runtime="host"))
        if compilation.module.restructured:
            out = compilation.module.print()
            STATE["lowered"] += out.count(f'custom_call_target="{abi.START_TARGET}"')
            STATE["modules"].append(out)
    return None if out == text else to_proto(out)


def swap_reducers(mapping: dict[str, str]) -> Any:
    """A rewrite turning each collective's reduction computation root op per ``mapping``."""

    def rewrite(text: str) -> str:
        reducers = set(re.findall(r"(?:all-reduce|reduce-scatter)\(.*?to_apply=%?([\w.\-]+)", text))
        lines = text.split("\n")
        current = None
        for i, line in enumerate(lines):
            m = re.match(r"%?([\w.\-]+) \(.*\) -> .* \{$", line)
            if m:
                current = m.group(1)
            elif current in reducers and line.startswith("  ROOT "):
                for old, new in mapping.items():
                    lines[i] = re.sub(rf"(= \S+ ){old}\(", rf"\g<1>{new}(", lines[i])
        return "\n".join(lines)

    return rewrite


def combine_all_reduces(text: str) -> str:
    """Two all-reduces of parameters -> one all-reduce of both (XLA's combined form)."""
    lines = text.split("\n")
    at = [i for i, line in enumerate(lines) if " all-reduce(" in line]
    if len(at) != 2:
        return text
    pattern = r"  (?:ROOT )?(%\S+) = (\S+) all-reduce\((%\S+)\), (.*)$"
    a, b = (re.match(pattern, lines[i]) for i in at)
    assert a is not None and b is not None
    lines[at[0]] = "\n".join(
        [
            f"  %combined = ({a[2]}, {b[2]}) all-reduce({a[3]}, {b[3]}), {a[4]}",
            f"  {a[1]} = {a[2]} get-tuple-element(%combined), index=0",
            f"  {b[1]} = {b[2]} get-tuple-element(%combined), index=1",
        ]
    )
    del lines[at[1]]
    return "\n".join(lines)


def run_both(fn: Any, args: tuple[Any, ...], rewrite: Any = None) -> tuple[Any, Any, int]:
    """fn(*args) with XLA's collectives (None if XLA:CPU cannot run them) and with the ffi
    runtime, and the number of pairs lowered."""
    STATE["rewrite"] = rewrite
    try:
        STATE["ffi"] = False
        jax.clear_caches()
        try:
            native = jax.tree.map(np.asarray, jax.jit(fn)(*args))
        except jax.errors.JaxRuntimeError as e:
            if "UNIMPLEMENTED" not in str(e):
                raise
            native = None
        STATE["ffi"] = True
        before = STATE["lowered"]
        jax.clear_caches()
        ffi = jax.tree.map(np.asarray, jax.jit(fn)(*args))
        return native, ffi, STATE["lowered"] - before
    finally:
        STATE["ffi"] = False
        STATE["rewrite"] = None


def data(dtype: Any, shape: tuple[int, ...], seed: int, kind: str = "add") -> Any:
    rng = np.random.default_rng(seed)
    if dtype == jnp.bool_:
        return jnp.asarray(rng.integers(0, 2, shape).astype(bool))
    values = [-1, 1, 2] if kind == "multiply" else list(range(-4, 5))
    if kind in ("and", "or"):
        values = list(range(0, 16))
    return jnp.asarray(rng.choice(values, shape)).astype(dtype)


def mesh1d() -> Mesh:
    return Mesh(np.array(jax.devices()), ("x",))


def mesh2d() -> Mesh:
    return Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))


def smap(mesh: Mesh, body: Any, in_specs: Any, out_specs: Any) -> Any:
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def all_kinds(dtype: Any) -> Any:
    """Every kind on 8 devices; ``x`` is [64, 8] sharded on rows (8 rows per device)."""
    numeric = dtype != jnp.bool_
    perm = [(i, (i + 1) % 8) for i in range(8)]
    partial_perm = [(0, 3), (3, 5), (5, 0)]  # devices 1, 2, 4, 6, 7 receive zeros

    def body(x: Any) -> Any:
        out = {
            "pmax": jax.lax.pmax(x, "x"),
            "pmin": jax.lax.pmin(x, "x"),
            "gather0": jax.lax.all_gather(x, "x", axis=0, tiled=True),
            "gather1": jax.lax.all_gather(x, "x", axis=1, tiled=True),
            "a2a0": jax.lax.all_to_all(x, "x", 0, 0, tiled=True),
            "a2a1": jax.lax.all_to_all(x, "x", 1, 1, tiled=True),
            "permute": jax.lax.ppermute(x, "x", perm),
            "permute_partial": jax.lax.ppermute(x, "x", partial_perm),
        }
        if numeric:
            out["psum"] = jax.lax.psum(x, "x")
            out["scatter0"] = jax.lax.psum_scatter(x, "x", scatter_dimension=0, tiled=True)
            out["scatter1"] = jax.lax.psum_scatter(x, "x", scatter_dimension=1, tiled=True)
        return out

    specs = {
        k: P("x")
        for k in [
            "pmax",
            "pmin",
            "a2a0",
            "a2a1",
            "permute",
            "permute_partial",
            "psum",
            "scatter0",
            "scatter1",
        ]
    }
    specs.update({"gather0": P(), "gather1": P()})
    if not numeric:
        for k in ("psum", "scatter0", "scatter1"):
            specs.pop(k)
    return smap(mesh1d(), body, P("x"), specs)


def reductions(dtype: Any) -> Any:
    """psum and psum_scatter (their reducers get rewritten) plus pmax/pmin."""

    def body(x: Any) -> Any:
        if dtype == jnp.bool_:
            return jax.lax.pmax(x, "x"), jax.lax.pmin(x, "x")
        return jax.lax.psum(x, "x"), jax.lax.psum_scatter(x, "x", scatter_dimension=0, tiled=True)

    return smap(mesh1d(), body, P("x"), (P("x"), P("x")))


def groups2d() -> Any:
    """Collectives over one axis of a 2x4 mesh (groups of 2 and of 4) and over both."""

    def body(x: Any) -> Any:
        return (
            jax.lax.psum(x, "a"),
            jax.lax.all_gather(x, "b", axis=0, tiled=True),
            jax.lax.psum_scatter(x, ("a", "b"), scatter_dimension=0, tiled=True),
            jax.lax.ppermute(x, "b", [(i, (i + 1) % 4) for i in range(4)]),
            jax.lax.all_to_all(x, "b", 0, 0, tiled=True),
        )

    return smap(mesh2d(), body, P(("a", "b")), (P(("a", "b")),) * 5)


def scan_loop() -> Any:
    """Collectives inside a while loop: occurrences of one op in one run."""

    def body(x: Any) -> Any:
        def step(carry: Any, _: Any) -> Any:
            a, b, c = carry
            y = jax.lax.ppermute(a, "x", [(i, (i + 1) % 8) for i in range(8)])
            # b and c are carried straight through collectives: their results share
            # the loop buffer with their operands.
            return (
                jnp.tanh(y) + jax.lax.psum(a, "x") * 1e-3,
                jax.lax.pmax(b, "x"),
                jax.lax.ppermute(c, "x", [(i, (i + 3) % 8) for i in range(8)]),
            ), None

        return jax.lax.scan(step, (x, x * 2, x - 1), None, length=5)[0]

    return smap(mesh1d(), body, P("x"), (P("x"), P("x"), P("x")))


def equal() -> dict[str, Any]:
    checks: list[dict[str, Any]] = []

    def check(
        name: str, fn: Any, args: tuple[Any, ...], rewrite: Any = None, reduce: Any = None
    ) -> None:
        native, ffi, lowered = run_both(fn, args, rewrite)
        flat_f, _ = jax.tree.flatten(ffi)
        same = None
        if native is not None:
            flat_n, _ = jax.tree.flatten(native)
            same = all(
                a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
                for a, b in zip(flat_n, flat_f, strict=True)
            )
        # equal: same as XLA's own collectives; None where XLA:CPU lacks the reduction.
        record = {"name": name, "equal": same, "lowered": lowered}
        if reduce is not None:  # the all-reduce against numpy: the rewrite took effect
            blocks = np.asarray(args[0]).reshape(8, -1, *args[0].shape[1:])
            expected = np.tile(reduce(blocks, axis=0), (8,) + (1,) * (blocks.ndim - 2))
            record["numpy"] = bool(
                np.array_equal(np.asarray(flat_f[0]), expected.astype(flat_f[0].dtype))
            )
        checks.append(record)

    dtypes = {
        "f32": jnp.float32,
        "bf16": jnp.bfloat16,
        "f16": jnp.float16,
        "f64": jnp.float64,
        "s32": jnp.int32,
        "s8": jnp.int8,
        "pred": jnp.bool_,
        "u8": jnp.uint8,  # values from 252: min and max are unsigned
        "u32": jnp.uint32,
    }
    for name, dtype in dtypes.items():
        x = data(dtype, (64, 8), seed=len(checks))
        check(f"kinds/{name}", all_kinds(dtype), (x,))
        if dtype == jnp.bool_:
            rewrite = swap_reducers({"maximum": "or", "minimum": "and"})
            check("reductions/pred/or,and", reductions(dtype), (x,), rewrite, np.logical_or.reduce)
            continue
        xm = data(dtype, (64, 8), seed=100 + len(checks), kind="multiply")
        mul = swap_reducers({"add": "multiply"})
        check(f"reductions/{name}/multiply", reductions(dtype), (xm,), mul, np.multiply.reduce)
        if dtype in (jnp.int32, jnp.int8):
            xb = data(dtype, (64, 8), seed=200 + len(checks), kind="and")
            rewrite_and, rewrite_or = swap_reducers({"add": "and"}), swap_reducers({"add": "or"})
            check(
                f"reductions/{name}/and",
                reductions(dtype),
                (xb,),
                rewrite_and,
                np.bitwise_and.reduce,
            )
            check(
                f"reductions/{name}/or", reductions(dtype), (xb,), rewrite_or, np.bitwise_or.reduce
            )
    check("groups2d/f32", groups2d(), (data(jnp.float32, (64, 8), seed=7),))
    check("groups2d/s32", groups2d(), (data(jnp.int32, (64, 8), seed=8),))
    check("scan/f32", scan_loop(), (data(jnp.float32, (64, 8), seed=9),))
    two = smap(
        mesh1d(),
        lambda x, y: (jax.lax.psum(x, "x"), jax.lax.psum(y, "x")),
        (P("x"), P("x")),
        (P("x"), P("x")),
    )
    x, y = data(jnp.float32, (64, 8), seed=10), data(jnp.float32, (64, 8), seed=11)
    check("combined/f32", two, (x, y), combine_all_reduces)
    # Past the size the runtime runs in the last start (1 MiB in all): stream workers,
    # reductions over several blocks, non-temporal stores (all-reduce results of 16 MiB
    # in all), and slices that do not divide evenly.
    check("large/f32", all_kinds(jnp.float32), (data(jnp.float32, (8 * 8192, 64), seed=12),))
    check("large/bf16", all_kinds(jnp.bfloat16), (data(jnp.bfloat16, (8 * 16384, 8), seed=13),))
    check("uneven/f32", uneven(), (data(jnp.float32, (8 * 40961, 7), seed=14),))
    lib = runtime.load("host")
    lib.xs_host_staged_operands.restype = ctypes.c_int64
    return {"checks": checks, "staged": lib.xs_host_staged_operands()}


def uneven() -> Any:
    """Collectives of arrays that 8 members and 64-byte lines do not divide evenly."""

    def body(x: Any) -> Any:
        return (
            jax.lax.psum(x, "x"),
            jax.lax.pmin(x, "x"),
            jax.lax.all_gather(x, "x", axis=0, tiled=True),
            jax.lax.ppermute(x, "x", [(i, (i + 5) % 8) for i in range(8)]),
        )

    return smap(mesh1d(), body, P("x"), (P("x"), P("x"), P(), P("x")))


def overlap() -> dict[str, Any]:
    """Two collectives on different streams in flight together, and compute between a start
    and its done, as the runtime trace records them."""
    mesh = mesh2d()
    n = 1 << 22  # 16 MiB of f32 per device and collective

    def probe(x: Any, spin_us: int, label: str) -> Any:
        return jax.ffi.ffi_call(
            abi.COMPUTE_TARGET, jax.ShapeDtypeStruct(x.shape, x.dtype), has_side_effect=True
        )(x, spin_us=np.int64(spin_us), label=label)

    def body(x: Any, y: Any) -> Any:
        s = jax.lax.psum(x, "a")  # groups {0,4},{1,5},...: share one device with...
        g = jax.lax.psum(y, "b")  # ...groups {0,1,2,3},{4,5,6,7}: may use another stream
        z = probe(x[:1024] * 2, 200_000, "between")
        return s * 2 + 1, g + 1, z

    fn = smap(mesh, body, (P(("a", "b")), P(("a", "b"))), (P(("a", "b")),) * 3)
    x = jnp.ones((8 * n,), jnp.float32)
    y = jnp.full((8 * n,), 2.0, jnp.float32)
    STATE["ffi"] = True
    jitted = jax.jit(fn)
    compiled = jitted.lower(x, y).compile()
    jax.block_until_ready(jitted(x, y))  # warm up the worker threads
    runtime.enable_trace()
    best: dict[str, Any] = {}
    for _attempt in range(3):
        runtime.clear_trace()
        out = jax.block_until_ready(jitted(x, y))
        events = runtime.trace_events()
        result = analyse_overlap(events)
        result["values_ok"] = bool(
            np.all(np.asarray(out[0]) == 5.0) and np.all(np.asarray(out[1]) == 9.0)
        )
        best = result
        if result["streams_overlap"] and result["compute_between"]:
            break
    best["schedule"] = re.findall(r'custom_call_target="(\w+)"', STATE["modules"][-1])
    best["compiled_has_custom_calls"] = abi.START_TARGET in compiled.as_text()
    return best


def analyse_overlap(events: list[runtime.TraceEvent]) -> dict[str, Any]:
    by_device: dict[int, list[runtime.TraceEvent]] = {}
    for e in events:
        by_device.setdefault(e.device, []).append(e)
    streams_overlap = []
    compute_between = []
    streams_used = sorted({e.stream for e in events if e.what == "collective"})
    for device, evs in sorted(by_device.items()):
        coll = [e for e in evs if e.what == "collective"]
        for a in coll:
            for b in coll:
                if a.stream < b.stream and a.begin_ns < b.end_ns and b.begin_ns < a.end_ns:
                    streams_overlap.append([device, a.name, a.stream, b.name, b.stream])
        starts = {e.op_id: e for e in evs if e.what == "start"}
        dones = {e.op_id: e for e in evs if e.what == "done"}
        for c in (e for e in evs if e.what == "compute"):
            for op_id, s in starts.items():
                d = dones.get(op_id)
                if d is not None and s.end_ns <= c.begin_ns and c.end_ns <= d.end_ns:
                    compute_between.append([device, s.name, c.name])
    return {
        "events": len(events),
        "streams_used": streams_used,
        "streams_overlap": streams_overlap[:8],
        "compute_between": compute_between[:8],
    }


def runtime_collective(
    kind: str,
    xs: list[Any],
    out_shapes: list[tuple[int, ...]],
    op_id: int,
    *,
    name: str,
    stream: int = 0,
    alias_operands: bool = False,
    **overrides: Any,
) -> list[Any]:
    """One collective over mesh1d's 8 devices through the runtime's start and done custom
    calls, called directly with the attributes lower-to-ffi writes (``overrides`` replace
    them); ``alias_operands`` makes the start write into its operands, as XLA may."""
    ids = jax.lax.axis_index("x").astype(jnp.uint32)
    zero = jnp.zeros((), jnp.uint32)
    call = abi.CollectiveCall(
        op_id=op_id,
        name=name,
        kind=kind,
        stream=stream,
        reduction="add" if kind in ("all-reduce", "reduce-scatter") else "",
        groups=tuple(range(8)),
        group_sizes=(8,),
        num_partitions=8,
    )
    call = dataclasses.replace(call, **overrides)
    results = [jax.ShapeDtypeStruct(shape, xs[0].dtype) for shape in out_shapes]
    return calls.collective(call, xs, results, ids=(zero, ids), alias_operands=alias_operands)


def timeout() -> dict[str, Any]:
    """A collective that half the devices never reach fails after the timeout."""
    runtime.set_timeout(2.0)

    def body(x: Any) -> Any:
        i = jax.lax.axis_index("x")
        return jax.lax.cond(i < 4, lambda v: jax.lax.psum(v, "x"), lambda v: v * 2, x)

    fn = jax.jit(smap(mesh1d(), body, P("x"), P("x")))
    STATE["ffi"] = True
    began = time.monotonic()
    try:
        jax.block_until_ready(fn(jnp.ones((64,), jnp.float32)))
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}", "seconds": time.monotonic() - began}
    return {"error": None, "seconds": time.monotonic() - began}


def mismatch() -> dict[str, Any]:
    """Devices bringing different shapes to one collective, and buffers that do not fit it."""
    mesh = mesh1d()

    def collective(x: Any, op_id: int, kind: str = "all-reduce", out_shape: Any = None) -> Any:
        gather = {"dimension": 0, "outer": (1,)}
        extra = gather if kind == "all-gather" else {}
        (out,) = runtime_collective(
            kind, [x], [out_shape or x.shape], op_id, name="mismatched", **extra
        )
        return out

    def across(x: Any) -> Any:  # devices 0-3 bring f32[4], devices 4-7 f32[8]
        i = jax.lax.axis_index("x")
        small = lambda v: jnp.pad(collective(v[:4], 7), (0, 4))  # noqa: E731
        large = lambda v: collective(v, 7)  # noqa: E731
        return jax.lax.cond(i < 4, small, large, x)

    def local(x: Any) -> Any:  # an all-gather whose result is not 8 times its operand
        return collective(x, 8, kind="all-gather", out_shape=x.shape)

    runtime.set_timeout(20.0)
    results = {}
    for name, body in (("across", across), ("local", local)):
        fn = jax.jit(smap(mesh, body, P("x"), P("x")))
        x = jax.device_put(jnp.ones((64,), jnp.float32), NamedSharding(mesh, P("x")))
        try:
            jax.block_until_ready(fn(x))
            results[name] = None
        except Exception as e:
            results[name] = f"{type(e).__name__}: {e}"
    return results


def aliased() -> dict[str, Any]:
    """Starts whose result shares its operand's buffer (input_output_aliases, which
    lower-to-ffi never writes): peers must still read the operand from before the
    collective, so the runtime copies it at the start."""
    mesh = mesh1d()
    lib = runtime.load("host")
    lib.xs_host_staged_operands.restype = ctypes.c_int64
    before = lib.xs_host_staged_operands()

    def call(
        kind: str, x: Any, op_id: int, groups: tuple[int, ...], group_sizes: tuple[int, ...]
    ) -> Any:
        (out,) = runtime_collective(
            kind,
            [x],
            [x.shape],
            op_id,
            name=f"aliased.{kind}",
            alias_operands=True,
            groups=groups,
            group_sizes=group_sizes,
        )
        return out

    shift = [(i, (i + 1) % 8) for i in range(8)]

    def body(x: Any) -> Any:
        summed = call("all-reduce", x, 1, tuple(range(8)), (8,))
        permuted = call("collective-permute", x, 2, tuple(d for p in shift for d in p), (2,) * 8)
        return summed, permuted

    fn = jax.jit(smap(mesh, body, P("x"), (P("x"), P("x"))))
    x = data(jnp.float32, (64, 16), seed=5)
    summed, permuted = (np.asarray(a) for a in fn(x))
    blocks = np.asarray(x).reshape(8, 8, 16)
    return {
        "all-reduce": bool(np.array_equal(summed, np.tile(blocks.sum(0), (8, 1)))),
        "collective-permute": bool(np.array_equal(permuted, np.roll(blocks, 1, 0).reshape(64, 16))),
        "staged": lib.xs_host_staged_operands() - before,
    }


def direct() -> dict[str, Any]:
    """The custom calls called directly: a gather dimension with blocks before it in memory
    (outer > 1, which XLA:CPU's layouts avoid) and collectives of two operands."""
    mesh = mesh1d()

    def call(kind: str, xs: list[Any], outs: list[Any], op_id: int, **extra: Any) -> Any:
        return runtime_collective(
            kind, xs, outs, op_id, name=f"direct.{kind}", stream=op_id % 2, **extra
        )

    def body(x: Any, y: Any) -> Any:  # x, y: [4, 16] row major per device
        outer = {"dimension": 1, "outer": (4,)}
        (gathered,) = call("all-gather", [x], [(4, 128)], 1, **outer)
        (scattered,) = call("reduce-scatter", [x], [(4, 2)], 2, **outer)
        (exchanged,) = call("all-to-all", [x], [(4, 16)], 3, **outer)
        two = call("all-reduce", [x, y], [(4, 16), (4, 16)], 4)
        return gathered, scattered, exchanged, two[0], two[1]

    fn = jax.jit(smap(mesh, body, (P("x"), P("x")), (P("x"),) * 5))
    x = data(jnp.float32, (32, 16), seed=3)
    y = data(jnp.float32, (32, 16), seed=4)
    got = [np.asarray(a) for a in fn(x, y)]
    xb = np.asarray(x).reshape(8, 4, 16)  # per device
    yb = np.asarray(y).reshape(8, 4, 16)
    gathered = np.concatenate(list(xb), axis=1)  # [4, 128], the same on every device
    summed = xb.sum(0)  # [4, 16]
    scattered = [summed[:, 2 * d : 2 * d + 2] for d in range(8)]
    exchanged = [
        np.concatenate([xb[s][:, 2 * d : 2 * d + 2] for s in range(8)], axis=1) for d in range(8)
    ]
    expected = [
        np.concatenate([gathered] * 8, axis=0),
        np.concatenate(scattered, axis=0),
        np.concatenate(exchanged, axis=0),
        np.concatenate([summed] * 8, axis=0),
        np.concatenate([yb.sum(0)] * 8, axis=0),
    ]
    names = [
        "all-gather/outer",
        "reduce-scatter/outer",
        "all-to-all/outer",
        "all-reduce/x",
        "all-reduce/y",
    ]
    return {n: bool(np.array_equal(g, e)) for n, g, e in zip(names, got, expected, strict=True)}


def capture() -> dict[str, Any]:
    """Write XLA:CPU's scheduled modules (with module config) for the text-level tests."""
    out_dir = sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    captured: list[tuple[str, Any]] = []

    def grab(serialized: bytes) -> bytes | None:
        _, text = module_text(serialized)
        captured.append(text)
        return None

    jx.register_hlo_module_transformation(
        grab, name="xla_streams_capture", stage=jx.PipelineStage.POST_SCHEDULER, platforms=["cpu"]
    )
    x = data(jnp.float32, (64, 8), seed=1)
    written = {}
    for name, fn in (("cpu_kinds", all_kinds(jnp.float32)), ("cpu_scan", scan_loop())):
        captured.clear()
        jax.jit(fn).lower(x).compile()
        text = next(t for t in captured if "all-reduce(" in t or "collective-permute(" in t)
        path = os.path.join(out_dir, f"{name}.hlo")
        with open(path, "w") as f:
            f.write(text)
        written[name] = path
    return written


def main() -> int:
    scenario = sys.argv[1]
    jax.config.update("jax_enable_x64", True)
    runtime.register("host")
    jx.register_hlo_module_transformation(
        callback, name="xla_streams_test", stage=jx.PipelineStage.POST_SCHEDULER, platforms=["cpu"]
    )
    scenarios = {
        "equal": equal,
        "overlap": overlap,
        "timeout": timeout,
        "mismatch": mismatch,
        "capture": capture,
        "direct": direct,
        "aliased": aliased,
    }
    result = scenarios[scenario]()
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
