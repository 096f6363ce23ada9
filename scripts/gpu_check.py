"""GPU check of the ffi runtime's CUDA backend, on a machine with one NVIDIA GPU.

    python scripts/gpu_check.py            # about a minute; must finish in under 5
    python scripts/gpu_check.py --rebuild  # compile the CUDA library even if cached

What it does, and what passing means:

1. builds the CUDA library (``python -m xla_streams.runtime.build --cuda``) and
   registers ``xla_streams_start``/``xla_streams_done`` for platform CUDA;
2. jits one program that calls them directly: an all-reduce of 1 GiB on
   collective stream 0 and an all-gather of 1 GiB on stream 1, both on a
   one-rank NCCL communicator (device group ``{0}``), then a bf16 matmul on
   XLA's compute stream, then the two dones. An optimization barrier and the
   matmul's result as an extra operand of each done pin that order (checked in
   the compiled HLO);
3. checks the results (on one rank both collectives return their operand, and
   the matmul matches a reference run);
4. runs it with the runtime trace on: CUDA event timings of each collective on
   its stream and of the compute stream from the start's call to the done's.
   The collective stream overlapped the compute stream when every collective
   began before the matmul was half done and ended inside the compute window.
   Also printed: the compute window against the matmul alone and the
   collectives alone (serialised, the window would be their sum).

Exit status 0 when every check passed, 1 otherwise, 2 without a GPU. This
script was written without access to a GPU and has not been run yet.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave memory for NCCL

BUDGET_S = 300.0
GIB_F32 = 1 << 28  # elements of f32 in 1 GiB
MATMUL = 8192  # bf16 [8192, 8192] @ [8192, 8192]: about 1.1 TFLOP


def attributes(op_id: int, kind: str, stream: int, dimension: int = -1) -> dict[str, Any]:
    import numpy as np

    attrs: dict[str, Any] = {
        "op_id": np.int64(op_id),
        "name": f"gpu_check.{kind}",
        "kind": kind,
        "stream": np.int64(stream),
        "reduction": "add" if kind in ("all-reduce", "reduce-scatter") else "",
        "groups": np.array([0], dtype=np.int64),  # one group of one device: a one-rank comm
        "group_sizes": np.array([1], dtype=np.int64),
        "dimension": np.int64(dimension),
        "channel": np.int64(op_id + 1),
        "num_partitions": np.int64(1),
    }
    if dimension >= 0:
        attrs["outer"] = np.array([1], dtype=np.int64)
    return attrs


def build_program() -> Any:
    import jax
    import jax.numpy as jnp

    from xla_streams import runtime

    def start(x: Any, attrs: dict[str, Any]) -> Any:
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return jax.ffi.ffi_call(runtime.START_TARGET, out, has_side_effect=True)(x, **attrs)

    def done(started: Any, x: Any, after: Any, attrs: dict[str, Any]) -> Any:
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        keep = {k: attrs[k] for k in ("op_id", "name", "kind", "stream")}
        call = jax.ffi.ffi_call(
            runtime.DONE_TARGET, out, has_side_effect=True, input_output_aliases={0: 0}
        )
        return call(started, x, after, **keep)

    reduce_attrs = attributes(0, "all-reduce", stream=0)
    gather_attrs = attributes(1, "all-gather", stream=1, dimension=0)

    def step(x: Any, y: Any, a: Any, b: Any) -> Any:
        s1 = start(x, reduce_attrs)
        s2 = start(y, gather_attrs)
        # The matmul may only begin once both starts were issued...
        s1, s2, a = jax.lax.optimization_barrier((s1, s2, a))
        m = jnp.dot(a, b, preferred_element_type=jnp.float32)
        # ...and each done only after it (its result is an extra operand).
        return done(s1, x, m, reduce_attrs), done(s2, y, m, gather_attrs), m

    def matmul_only(a: Any, b: Any) -> Any:
        return jnp.dot(a, b, preferred_element_type=jnp.float32)

    return jax.jit(step), jax.jit(matmul_only)


def schedule_order(hlo_text: str) -> list[str]:
    """The entry computation's runtime calls and matmul (cuBLAS call or GEMM fusion), in order."""
    entry = hlo_text[hlo_text.index("ENTRY") :]
    order = []
    for line in entry.split("\n"):
        target = re.search(r'custom_call_target="([^"]+)"', line)
        if target and target.group(1).startswith("xla_streams_"):
            order.append(target.group(1))
        elif re.search(r"cublas|gemm|matmul|\bdot\(|dot_general", line, re.IGNORECASE):
            order.append("matmul")
    # A GEMM and its get-tuple-element are one matmul.
    return [o for i, o in enumerate(order) if o != "matmul" or i == 0 or order[i - 1] != o]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rebuild", action="store_true", help="recompile the CUDA library")
    parser.add_argument("--iterations", type=int, default=5, help="timed runs of each program")
    args = parser.parse_args(argv)
    began = time.monotonic()
    report: dict[str, Any] = {}
    failures: list[str] = []

    import jax
    import jax.numpy as jnp
    import numpy as np

    from xla_streams import runtime
    from xla_streams.runtime import build

    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        print("gpu_check: no GPU visible to JAX", file=sys.stderr)
        return 2
    report["device"] = str(gpus[0].device_kind)

    t = time.monotonic()
    path = build.build("cuda", force=args.rebuild, verbose=True)
    report["build_s"] = round(time.monotonic() - t, 1)
    report["library"] = str(path)
    runtime.register("cuda")
    report["nccl_version"] = int(runtime.load("cuda").xs_cuda_nccl_version())

    step, matmul_only = build_program()
    key = jax.random.key(0)
    ka, kb = jax.random.split(key)
    x = jnp.arange(GIB_F32, dtype=jnp.float32) % 1000.0
    y = (jnp.arange(GIB_F32, dtype=jnp.float32) % 777.0) - 3.0
    a = jax.random.normal(ka, (MATMUL, MATMUL), jnp.bfloat16)
    b = jax.random.normal(kb, (MATMUL, MATMUL), jnp.bfloat16)

    compiled = step.lower(x, y, a, b).compile()
    order = schedule_order(compiled.as_text())
    report["schedule"] = order
    expected = ["xla_streams_start"] * 2 + ["matmul"] + ["xla_streams_done"] * 2
    if order != expected:
        failures.append(f"schedule is {order}, expected {expected}")

    # Results (the first call also creates the communicators and tunes the matmul).
    d1, d2, m = jax.block_until_ready(step(x, y, a, b))
    reference = np.asarray(matmul_only(a, b))
    checks = {
        "all-reduce (one rank) returns its operand": bool(jnp.array_equal(d1, x)),
        "all-gather (one rank) returns its operand": bool(jnp.array_equal(d2, y)),
        "matmul unchanged": bool(np.allclose(np.asarray(m), reference, rtol=1e-3, atol=1e-2)),
    }
    report["results"] = checks
    failures += [name for name, ok in checks.items() if not ok]

    # The matmul alone, for comparison.
    for _ in range(2):
        jax.block_until_ready(matmul_only(a, b))
    alone = []
    for _ in range(args.iterations):
        t = time.perf_counter()
        jax.block_until_ready(matmul_only(a, b))
        alone.append((time.perf_counter() - t) * 1e3)
    matmul_ms = statistics.median(alone)
    report["matmul_alone_ms"] = round(matmul_ms, 3)

    # Traced runs.
    runtime.enable_trace()
    windows: list[dict[str, Any]] = []
    for _ in range(args.iterations):
        runtime.clear_trace()
        jax.block_until_ready(step(x, y, a, b))
        events = [e for e in runtime.trace_events() if e.backend == "cuda"]
        collectives = [e for e in events if e.what == "collective"]
        computes = {e.op_id: e for e in events if e.what == "compute"}
        if len(collectives) != 2 or len(computes) != 2:
            failures.append(f"trace has {len(collectives)} collectives, {len(computes)} windows")
            break
        window_begin = min(c.begin_ms or 0.0 for c in computes.values())
        window_end = max(c.end_ms or 0.0 for c in computes.values())
        run: dict[str, Any] = {"window_ms": round(window_end - window_begin, 3), "collectives": []}
        for c in collectives:
            assert c.begin_ms is not None and c.end_ms is not None
            run["collectives"].append(
                {
                    "kind": c.kind,
                    "stream": c.stream,
                    "begin_ms": round(c.begin_ms - window_begin, 3),
                    "end_ms": round(c.end_ms - window_begin, 3),
                    "inside_window": window_begin - 0.01 <= c.begin_ms
                    and c.end_ms <= window_end + 0.01,
                    "began_before_matmul_half": c.begin_ms < window_end - matmul_ms / 2,
                }
            )
        first, second = sorted(collectives, key=lambda e: e.stream)
        run["streams"] = [first.stream, second.stream]
        run["collective_streams_overlap"] = bool(
            (first.begin_ms or 0) < (second.end_ms or 0)
            and (second.begin_ms or 0) < (first.end_ms or 0)
        )
        run["collectives_ms"] = round(
            sum((c.end_ms or 0) - (c.begin_ms or 0) for c in collectives), 3
        )
        windows.append(run)
    report["traced_runs"] = windows
    if windows:
        best = min(windows, key=lambda r: r["window_ms"])
        overlapped = all(
            c["inside_window"] and c["began_before_matmul_half"] for c in best["collectives"]
        )
        report["overlap"] = {
            "collective stream overlapped the compute stream": overlapped,
            "collectives on two streams": best["streams"] == [0, 1],
            "window_ms": best["window_ms"],
            "matmul_alone_ms": round(matmul_ms, 3),
            "collectives_ms": best["collectives_ms"],
            "serialised_would_be_ms": round(matmul_ms + best["collectives_ms"], 3),
        }
        if not overlapped:
            failures.append("no overlap of the collective streams with the compute stream")
        if best["streams"] != [0, 1]:
            failures.append(f"collectives ran on streams {best['streams']}, not [0, 1]")

    report["seconds"] = round(time.monotonic() - began, 1)
    if report["seconds"] > BUDGET_S:
        failures.append(f"took {report['seconds']} s, over the {BUDGET_S:.0f} s budget")
    report["failures"] = failures
    print(json.dumps(report, indent=2))
    print("GPU CHECK " + ("PASSED" if not failures else "FAILED: " + "; ".join(failures)))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
