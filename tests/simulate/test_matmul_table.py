"""GEMMs priced from XLA's measured matmul table (``simulate/matmul.py``).

The lookup is checked against the table's own points (each comes back as measured),
against the run times XLA's own tests expect from the same table
(``matmul_interpolator_test.cc``: H100 and B200, truncated to microseconds), between
points and outside the table; the range's ``matmul_table`` bound against the
table's spread; and a real deviceless compile's GEMMs against the table.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before anything imports JAX

from xla_streams import jax_compat
from xla_streams.hlo import parse_module
from xla_streams.simulate import CostModel, PerfTableError, get_target
from xla_streams.simulate.errors import MODEL_ERRORS
from xla_streams.simulate.matmul import (
    DEFAULT_MATMUL_TABLE_PATH,
    GemmShape,
    MatmulTable,
    default_matmul_table,
    load_matmul_table,
)

H100 = get_target("h100")
BF16 = "bf16xbf16->bf16"


def sm90() -> MatmulTable:
    table = default_matmul_table().for_device("sm_90")
    assert table is not None
    return table


def gemm(
    b: int, m: int, k: int, n: int, lhs: str = "bf16", rhs: str = "bf16", out: str = "bf16"
) -> GemmShape:
    return GemmShape(b, m, k, n, lhs, rhs, out)


@pytest.mark.slow
def test_the_tables_own_points_come_back_as_measured() -> None:
    for device in ("sm_90", "sm_100_B200"):
        table = default_matmul_table().for_device(device)
        assert table is not None
        for key, points in table.measured.items():
            lhs, rest = key.split("x", 1)
            rhs, out = rest.split("->")
            for (b, m, k, n), rate in points.items():
                shape = gemm(b, m, k, n, lhs, rhs, out)
                assert table.seconds(shape) == pytest.approx(shape.flops / rate, rel=1e-12)
    assert sum(len(p) for p in sm90().measured.values()) == 1875  # 375 shapes x 5 types


@pytest.mark.parametrize(
    ("device", "b", "m", "n", "k", "types", "xla_us"),
    [
        # matmul_interpolator_test.cc, DotSpec{b, m, n, k}: exact points, between
        # points, beyond the table's edges, types the table lacks.
        ("sm_90", 1, 1024, 4096, 512, ("bf16",) * 3, 12),
        ("sm_90", 4, 256, 1024, 256, ("bf16",) * 3, 6),
        ("sm_90", 1, 4096, 2048, 4096, ("bf16",) * 3, 90),
        ("sm_90", 1, 64, 64, 64, ("bf16",) * 3, 0),
        ("sm_90", 1, 1024, 4096, 513, ("bf16",) * 3, 12),
        ("sm_90", 1, 1024, 2048, 512, ("bf16",) * 3, 8),
        ("sm_90", 1, 2048, 2048, 2048, ("s8",) * 3, 67),
        ("sm_90", 8, 2048, 2048, 2048, ("s8",) * 3, 275),
        ("sm_90", 1, 2048, 2048, 2048, ("f8e4m3fn", "f8e4m3fn", "bf16"), 12),
        ("sm_100_B200", 1, 1024, 4096, 512, ("bf16",) * 3, 9),
        ("sm_100_B200", 4, 256, 1024, 256, ("bf16",) * 3, 6),
    ],
)
def test_lookup_matches_xlas_own_tests(
    device: str, b: int, m: int, n: int, k: int, types: tuple[str, str, str], xla_us: int
) -> None:
    table = default_matmul_table().for_device(device)
    assert table is not None
    seconds = table.seconds(gemm(b, m, k, n, *types))
    assert seconds is not None and int(seconds * 1e6) == xla_us


def test_between_points_a_weighted_average_of_the_corners() -> None:
    table = sm90()
    rates = table.measured[BF16]
    # n = 3072 lies halfway between 2048 and 4096: equal weights, the mean rate.
    below, above = rates[(1, 1024, 512, 2048)], rates[(1, 1024, 512, 4096)]
    assert table.throughput(gemm(1, 1024, 512, 3072)) == pytest.approx((below + above) / 2)
    # Nearer a corner, nearer its rate: weights 1 / (squared distance + 1).
    near = table.throughput(gemm(1, 1024, 512, 2100))
    assert near is not None and abs(near - below) < abs(near - above)
    w_below, w_above = 1 / (52**2 + 1), 1 / (1996**2 + 1)
    assert near == pytest.approx((below * w_below + above * w_above) / (w_below + w_above))


def test_outside_the_table_the_nearest_edges_rate() -> None:
    table = sm90()
    rates = table.measured[BF16]
    edge = rates[(1, 4096, 4096, 4096)]
    # Llama-2 7B's MLP GEMM (8192 tokens x 4096 -> 11008) runs at the 4096^3 rate.
    assert table.throughput(gemm(1, 8192, 4096, 11008)) == pytest.approx(edge)
    assert table.throughput(gemm(16, 4096, 4096, 4096)) == pytest.approx(
        rates[(4, 4096, 4096, 4096)]
    )
    assert table.throughput(gemm(1, 64, 64, 64)) == pytest.approx(rates[(1, 256, 256, 256)])
    # A type the table lacks: bf16's rates with the dimensions counted in bytes of the
    # output (4 for f32: twice bf16's), and the real FLOPs, not XLA's byte-scaled ones.
    mixed = gemm(1, 1024, 1024, 1024, "bf16", "bf16", "f32")
    assert table.throughput(mixed) == pytest.approx(rates[(1, 2048, 2048, 2048)])
    assert table.seconds(mixed) == pytest.approx(mixed.flops / rates[(1, 2048, 2048, 2048)])


def test_roofline_only_where_the_table_is_silent() -> None:
    shape = gemm(1, 4096, 4096, 4096)
    assert H100.gemm_seconds(shape) == pytest.approx(
        shape.flops / sm90().measured[BF16][(1,) + (4096,) * 3]
    )
    for name in ("a100", "gb200"):  # no section in XLA's matmul table
        assert get_target(name).gemm_seconds(shape) is None
    assert get_target("h200").gemm_seconds(shape) == H100.gemm_seconds(shape)  # both sm_90
    assert get_target("b200").gemm_seconds(shape) != H100.gemm_seconds(shape)


def test_a_rate_above_the_gpus_peak_is_no_measurement() -> None:
    """sm_90's FP8 entries reach 1.31 times H100's dense FP8 peak at its largest shapes:
    those are left to the roofline; the rest of the table prices as measured."""
    fp8 = "f8e4m3fn"
    rates = sm90().measured[f"{fp8}x{fp8}->bf16"]
    peak = H100.matrix_peak(fp8)
    above = [p for p, rate in rates.items() if rate > peak]
    assert len(above) == 29 and max(rates.values()) / peak == pytest.approx(1.31, abs=0.005)
    assert H100.gemm_seconds(gemm(*above[0], fp8, fp8, "bf16")) is None
    below = next(p for p, rate in rates.items() if rate < peak)
    shape = gemm(*below, fp8, fp8, "bf16")
    assert H100.gemm_seconds(shape) == pytest.approx(shape.flops / rates[below])
    bf16 = sm90().measured[BF16]
    assert max(bf16.values()) < 0.82 * H100.matrix_peak("bf16")


def test_the_matmul_bound_comes_from_the_tables_spread() -> None:
    """errors.py's matmul_table bound, recomputed from the vendored table (sm_90, BF16)."""
    table = sm90()
    rates = table.measured[BF16]

    def doubled(point: tuple[int, ...], axis: int) -> tuple[int, ...]:
        return tuple(2 * c if a == axis else c for a, c in enumerate(point))

    # Neighbouring grid points (every dimension >= 1024): how much a doubling moves the rate.
    gaps = sorted(
        rates[doubled(p, axis)] / rate
        for p, rate in rates.items()
        if min(p[1:]) >= 1024
        for axis in (1, 2, 3)
        if doubled(p, axis) in rates
    )
    gap = gaps[9 * len(gaps) // 10] - 1
    # The largest GEMMs' gain over their last doubling of a dimension.
    edge = (
        max(
            rates[doubled(p, axis)] / rates[p]
            for b in (1, 2, 4)
            for axis in (1, 2, 3)
            for p in [tuple(b if a == 0 else 2048 if a == axis else 4096 for a in range(4))]
        )
        - 1
    )
    # The same FP8 kernel under its three type keys.
    fp8 = [key for key in table.measured if key.startswith("f8")]
    spreads = sorted(
        max(table.measured[key][p] for key in fp8) / min(table.measured[key][p] for key in fp8)
        for p in table.measured[fp8[0]]
    )
    noise = spreads[9 * len(spreads) // 10] - 1
    assert (round(gap, 2), round(edge, 2), round(noise, 2)) == (0.29, 0.06, 0.04)
    [bound] = [b for b in MODEL_ERRORS if b.name == "matmul_table"]
    assert bound.high >= 1 + gap / 2 - 0.005
    assert bound.low <= 1 / ((1 + edge) * (1 + noise))


def test_a_bad_table_says_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "mine.txtpb"
    path.write_text(
        'entries {\n  key: "sm_90"\n  value {\n    entries {\n      b: 1\n      m: 0\n'
        '      n: 256\n      k: 256\n      flops { key: "bf16xbf16->bf16" value: 1 }\n'
        "    }\n  }\n}\n"
    )
    with pytest.raises(
        PerfTableError, match=r"mine.txtpb:4: sm_90: b, m, n and k must be positive"
    ):
        load_matmul_table(path).for_device("sm_90")
    path.write_text("entries { key: \n")
    with pytest.raises(PerfTableError, match=r"mine.txtpb:\d+"):
        load_matmul_table(path)


def test_the_vendored_table_keeps_xlas_header_and_the_targets_sections() -> None:
    text = DEFAULT_MATMUL_TABLE_PATH.read_text()
    head = text.split("entries {")[0]
    assert text.startswith("# Copyright 2026 The OpenXLA Authors.\n")
    assert "Licensed under the Apache License, Version 2.0" in head
    assert "proto-message: xla.GemmPerfTable" in head and "default_matmul_perf_table" in head
    assert default_matmul_table().devices() == ("sm_100_B200", "sm_90")
    readme = (DEFAULT_MATMUL_TABLE_PATH.parent / "README.md").read_text()
    for fact in ("matmul_perf_table.txtpb", "default_matmul_perf_table.txtpb", "Apache-2.0"):
        assert fact in readme


# -- a real compile ---------------------------------------------------------------------


def _compile() -> str:
    """One H100: a BF16 GEMM on a measured point, an f32 one, a 3x-too-big one."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from xla_streams.aot import compile_for_gpu, gpu_topology

    mesh = Mesh(np.array(gpu_topology("h100", 1, 1).devices), ("x",))
    on = NamedSharding(mesh, P())

    def step(a, w, c, v, x, u):  # type: ignore[no-untyped-def]
        return a @ w, c @ v, x @ u

    shapes = [
        ((2048, 4096), jnp.bfloat16), ((4096, 1024), jnp.bfloat16),
        ((1024, 512), jnp.float32), ((512, 2048), jnp.float32),
        ((12288, 4096), jnp.bfloat16), ((4096, 4096), jnp.bfloat16),
    ]  # fmt: skip
    args = [jax.ShapeDtypeStruct(s, t, sharding=on) for s, t in shapes]
    return compile_for_gpu(jax.jit(step), args, dump=False).as_text


@pytest.fixture(scope="module")
def compiled() -> str:
    assert jax_compat.cuda_plugin_module() is not None, (
        "install the gpu-aot extra (jax[cuda12]): pip install -e '.[test,gpu-aot]'"
    )
    return _compile()


@pytest.mark.slow
def test_a_compiled_modules_gemms_are_priced_from_the_table(compiled: str) -> None:
    module = parse_module(compiled, "gemms")
    model = CostModel(module, H100)
    roofline = CostModel(module, dataclasses.replace(H100, perf_table_key=None))
    rates = sm90().measured
    want = {
        (1, 2048, 4096, 1024, "bf16"): rates[BF16][(1, 2048, 4096, 1024)],
        (1, 1024, 512, 2048, "f32"): rates["f32xf32->f32"][(1, 1024, 512, 2048)],
        (1, 12288, 4096, 4096, "bf16"): rates[BF16][(1, 4096, 4096, 4096)],  # beyond: the edge
    }
    found = {}
    for inst in module.entry.instructions:
        cost = model.instruction(inst)
        if cost.kind != "matmul":
            continue
        assert cost.error == "matmul_table", inst.name
        shape = model._gemm_fusion(inst) if inst.opcode == "fusion" else None
        assert shape is not None, inst.text[:200]
        key = (shape.b, shape.m, shape.k, shape.n, shape.out)
        found[key] = cost
        assert cost.flops == shape.flops
        # The table's (burst) rate, held as the GPU holds it at its power limit.
        held = want[key] * H100.sustained_matrix_fraction
        assert cost.seconds == pytest.approx(shape.flops / held, rel=1e-9)
        # What the 70%-of-peak roofline said instead.
        assert roofline.instruction(inst).error == "matmul"
        assert roofline.instruction(inst).seconds != pytest.approx(cost.seconds, rel=0.01)
    assert set(found) == set(want)
