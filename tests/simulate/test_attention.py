"""cuDNN fused attention priced from NVIDIA's published measurements (``attention.py``).

Every published point comes back as its measured time; between sequence lengths the
rate moves linearly in log2(length), outside them it is the nearest point's; the
mask, the pass and a sliding window change the FLOPs the way the benchmarks count
them. A real deviceless compile of ``jax.nn.dot_product_attention(implementation=
"cudnn")``, forward and backward, causal and not, is priced from the table.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before anything imports JAX

from xla_streams import jax_compat
from xla_streams.hlo import parse_module
from xla_streams.simulate import CostModel, PerfTableError, get_target
from xla_streams.simulate.attention import (
    DEFAULT_ATTENTION_TABLE_PATH,
    AttentionCall,
    attention_call,
    default_attention_table,
    parse_attention_table,
)

H100 = get_target("h100")


def call(seq: int, *, causal: bool, backward: bool = False, dim: int = 128, **kw: int):
    return AttentionCall(2, 16, seq, seq, dim, dim, causal, backward, **kw)


def published() -> list[dict[str, str]]:
    text = DEFAULT_ATTENTION_TABLE_PATH.read_text()
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    return list(csv.DictReader(io.StringIO("\n".join(lines))))


def test_every_published_point_comes_back_as_measured() -> None:
    table = default_attention_table()
    rows = published()
    assert {r["gpu"] for r in rows} == {"sm_90", "sm_100_B200", "sm_100_GB200"}
    for row in rows:
        for backward, column in ((False, "forward_tflops"), (True, "backward_tflops")):
            c = AttentionCall(
                int(row["batch"]), int(row["heads"]), int(row["seq_len"]), int(row["seq_len"]),
                int(row["head_dim"]), int(row["head_dim"]), row["mask"] == "causal", backward,
            )  # fmt: skip
            rate = float(row[column]) * 1e12
            assert table.seconds(row["gpu"], c) == pytest.approx(c.flops / rate, rel=1e-12)


def test_flops_as_the_benchmarks_count_them() -> None:
    full = call(4096, causal=False)
    assert full.flops == 4 * 2 * 16 * 4096**2 * 128
    assert call(4096, causal=True).flops == full.flops / 2
    assert call(4096, causal=True, backward=True).flops == 2.5 * full.flops / 2
    # A sliding window of 512 keys: each query sees 512, nothing halved.
    window = call(4096, causal=True, window=512)
    assert window.flops == full.flops * 512 / 4096 and window.masked


def test_between_and_beyond_the_measured_lengths() -> None:
    table = default_attention_table()
    rate = {int(r["seq_len"]): float(r["forward_tflops"]) for r in published()
            if (r["gpu"], r["mask"]) == ("sm_90", "causal")}  # fmt: skip
    # Halfway in log2 between 4096 and 8192: the mean rate.
    middle = round(math.sqrt(4096 * 8192))
    assert table.tflops("sm_90", call(middle, causal=True)) == pytest.approx(
        (rate[4096] + rate[8192]) / 2, rel=1e-4
    )
    # Shorter than measured: the 4096 rate; longer: the 65536 one.
    assert table.tflops("sm_90", call(2048, causal=True)) == rate[4096]
    assert table.tflops("sm_90", call(1 << 18, causal=True)) == rate[65536]
    # Head dim 64 takes the only measured one, 128; Blackwell measured causal only.
    assert table.tflops("sm_90", call(4096, causal=True, dim=64)) == rate[4096]
    assert table.tflops("sm_100_B200", call(4096, causal=False)) == table.tflops(
        "sm_100_B200", call(4096, causal=True)
    )
    assert table.tflops("sm_80", call(4096, causal=True)) is None


def test_causal_and_backward_priced_as_they_run() -> None:
    """What the generic GEMM rule missed: the causal mask halves the work at a lower
    rate, the backward does 2.5 times the forward's work at a lower rate still."""
    fwd, causal = (
        H100.attention_seconds(call(8192, causal=False)),
        H100.attention_seconds(call(8192, causal=True)),
    )
    bwd = H100.attention_seconds(call(8192, causal=True, backward=True))
    assert fwd is not None and causal is not None and bwd is not None
    assert 0.5 * fwd < causal < fwd  # half the FLOPs at 573 TFLOP/s, not 669
    assert bwd > 2.5 * causal  # 2.5 times the FLOPs at 464 TFLOP/s, not 573
    assert get_target("a100").attention_seconds(call(8192, causal=True)) is None


def test_a_bad_table_says_file_and_line() -> None:
    with pytest.raises(PerfTableError, match=r"t.csv:1: expected the columns"):
        parse_attention_table("gpu,mask\n", "t.csv")
    header = "gpu,mask,head_dim,seq_len,batch,heads,forward_tflops,backward_tflops,source"
    with pytest.raises(PerfTableError, match=r"t.csv:3: the mask is 'causal' or 'none'"):
        parse_attention_table(f"# c\n{header}\nsm_90,sliding,128,4096,1,16,500,400,x\n", "t.csv")
    with pytest.raises(PerfTableError, match=r"t.csv:2: expected 9 fields"):
        parse_attention_table(f"{header}\nsm_90,causal,128,4096\n", "t.csv")


# -- a real compile ---------------------------------------------------------------------

SEQ, HEADS, DIM = 4096, 8, 128


def _compile() -> str:
    """One H100: causal and unmasked cuDNN attention over [2, 4096, 8, 128], and its
    gradient."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from xla_streams.aot import compile_for_gpu, gpu_topology

    mesh = Mesh(np.array(gpu_topology("h100", 1, 1).devices), ("x",))
    spec = jax.ShapeDtypeStruct(
        (2, SEQ, HEADS, DIM), jnp.bfloat16, sharding=NamedSharding(mesh, P())
    )

    def loss(q, k, v):  # type: ignore[no-untyped-def]
        causal = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
        full = jax.nn.dot_product_attention(q, k, v, implementation="cudnn")
        return (causal.astype(jnp.float32) + full.astype(jnp.float32)).sum()

    return compile_for_gpu(jax.jit(jax.grad(loss, (0, 1, 2))), [spec] * 3, dump=False).as_text


@pytest.fixture(scope="module")
def compiled() -> str:
    assert jax_compat.cuda_plugin_module() is not None, (
        "install the gpu-aot extra (jax[cuda12]): pip install -e '.[test,gpu-aot]'"
    )
    return _compile()


@pytest.mark.slow
def test_a_compiled_modules_attention_is_priced_from_the_measurements(compiled: str) -> None:
    module = parse_module(compiled, "attention")
    model = CostModel(module, H100)
    no_data = CostModel(module, dataclasses.replace(H100, perf_table_key=None))
    rate = {(r["mask"], pass_): float(r[f"{pass_}_tflops"]) for r in published()
            for pass_ in ("forward", "backward")
            if (r["gpu"], r["seq_len"]) == ("sm_90", str(SEQ))}  # fmt: skip
    seen = set()
    for inst in module.entry.instructions:
        if inst.opcode != "custom-call":
            continue
        found = attention_call(inst)
        if found is None:
            continue
        assert (found.batch, found.heads, found.queries, found.keys) == (2, HEADS, SEQ, SEQ)
        assert (found.head_dim, found.value_dim) == (DIM, DIM)
        mask, pass_ = (
            "causal" if found.causal else "none",
            "backward" if found.backward else "forward",
        )
        seen.add((mask, pass_))
        cost = model.instruction(inst)
        assert (cost.kind, cost.error, cost.flops) == ("matmul", "attention", found.flops)
        # The published (burst) rate, held as the GPU holds it at its power limit.
        held = rate[(mask, pass_)] * 1e12 * H100.sustained_matrix_fraction
        assert cost.seconds == pytest.approx(found.flops / held, rel=1e-9)
        # Without measurements: the same FLOPs at 70% of the BF16 peak.
        roofline = no_data.instruction(inst)
        assert (roofline.error, roofline.flops) == ("matmul", found.flops)
    assert seen == {("causal", "forward"), ("causal", "backward"), ("none", "forward"),
                    ("none", "backward")}  # fmt: skip
