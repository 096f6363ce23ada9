"""Collectives priced from XLA's measured table (``simulate/measured.py``).

One-collective modules compiled deviceless for 8 H100s (each kind over 1x8, 2x4 and
4x2 groups, one module per kind and group shape holding sizes from 64 KiB to 1 GiB)
are simulated, and every collective must come within 20% of the time XLA measured
at that point: the entry of the vendored table, read directly (not through the
lookup under test). The lookup itself is checked against figures XLA's own
estimator logged for jax 0.12 (``TF_CPP_VMODULE=sol_latency_estimator=10``).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before anything imports JAX

from xla_streams import jax_compat
from xla_streams._wire import encode_varint, field
from xla_streams.hlo import parse_module
from xla_streams.simulate import (
    PerfTableError,
    Simulator,
    collective_cost,
    default_perf_table,
    get_target,
    load_perf_table,
    load_target,
    with_perf_table,
)
from xla_streams.simulate.measured import DEFAULT_TABLE_PATH, snap_pow2, transfer_bytes
from xla_streams.simulate.targets import TargetError

REPO = Path(__file__).resolve().parents[2]
H100 = get_target("h100")
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")
SHAPES = ((1, 8), (2, 4), (4, 2))
# XLA BytesTransferred of each collective: output bytes, reduce-scatter's input.
SIZES = (64 * KIB, MIB, 16 * MIB, 256 * MIB, GIB)
NO_COMBINING = {
    "xla_gpu_all_reduce_combine_threshold_bytes": 0,
    "xla_gpu_all_gather_combine_threshold_bytes": 0,
    "xla_gpu_reduce_scatter_combine_threshold_bytes": 0,
}


def iota(g: int, n: int) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(range(i * n, (i + 1) * n)) for i in range(g))


def measured_point(kind: str, g: int, n: int, nbytes: int) -> float:
    """Seconds XLA measured for exactly this collective (F32), from the table's entry."""
    found = [
        m
        for m in default_perf_table().device_measurements("sm_90")
        if (m.kind, m.group_shape, m.dtype, m.transfer_bytes) == (kind, f"{g}x{n}", "F32", nbytes)
    ]
    assert len(found) == 1, (kind, g, n, nbytes, len(found))
    return found[0].seconds


def _compile(kind: str, g: int, n: int) -> str:
    """One module: ``kind`` over groups of ``n`` (``g`` groups), once per size."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from xla_streams.aot import compile_for_gpu, gpu_topology

    devices = gpu_topology("h100", 8, 8).devices
    mesh = Mesh(np.array(devices).reshape(g, n), ("g", "x"))

    def one(x: jax.Array) -> jax.Array:
        if kind == "all-reduce":
            return jax.lax.psum(x, "x")
        if kind == "all-gather":
            return jax.lax.all_gather(x, "x", tiled=True)
        if kind == "reduce-scatter":
            return jax.lax.psum_scatter(x, "x", tiled=True)
        return jax.lax.all_to_all(x, "x", 0, 0, tiled=True)

    spec = P(("g", "x"))
    args = []
    for size in SIZES:
        local = size // 4 // (n if kind == "all-gather" else 1)
        args.append(
            jax.ShapeDtypeStruct((g * n * local,), jnp.float32, sharding=NamedSharding(mesh, spec))
        )
    specs = tuple(spec for _ in SIZES)
    fn = jax.jit(
        jax.shard_map(lambda *xs: tuple(map(one, xs)), mesh=mesh, in_specs=specs, out_specs=specs)
    )
    return compile_for_gpu(fn, args, compiler_options=NO_COMBINING, dump=False).as_text


@pytest.fixture(scope="module")
def modules() -> dict[tuple[str, int, int], str]:
    assert jax_compat.cuda_plugin_module() is not None, (
        "install the gpu-aot extra (jax[cuda12]): pip install -e '.[test,gpu-aot]'"
    )
    return {(kind, g, n): _compile(kind, g, n) for kind in KINDS for (g, n) in SHAPES}


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("g", "n"), SHAPES, ids=[f"{g}x{n}" for g, n in SHAPES])
def test_compiled_collectives_within_20_percent_of_xlas_table(
    modules: dict[tuple[str, int, int], str], kind: str, g: int, n: int
) -> None:
    module = parse_module(modules[(kind, g, n)], f"{kind}_{g}x{n}")
    sim = Simulator(module, H100)
    alpha_beta = Simulator(module, dataclasses.replace(H100, perf_table_key=None))
    specs = [s for s in sim.specs if not s.side]
    assert sorted(s.bytes for s in specs) == sorted(SIZES)
    for spec, model in zip(specs, [s for s in alpha_beta.specs if not s.side], strict=True):
        want = measured_point(kind, g, n, spec.bytes)
        got = spec.cost.seconds
        assert spec.cost.measured and spec.kind == kind
        assert got == pytest.approx(want, rel=0.20), (spec.name, spec.bytes, got, want)
        # The alpha-beta model it replaces priced small collectives 60-80% low.
        if spec.bytes == 64 * KIB:
            assert model.cost.seconds < 0.5 * want
    assert any("priced from XLA's measured table (sm_90)" in note for note in sim.notes)


# -- the lookup, against XLA's own estimator ----------------------------------------


@pytest.mark.parametrize(
    ("kind", "groups", "nbytes", "dtype", "xla_us"),
    [
        # Logged by jax 0.12's SolLatencyEstimator for deviceless 8xH100 compiles.
        ("all-gather", iota(1, 8), 8 * MIB, "F32", 65.056),
        ("all-reduce", iota(1, 8), 4 * KIB, "BF16", 32.512),
        ("reduce-scatter", iota(1, 8), 64 * MIB, "F32", 218.624),
        # 2.5 MiB snaps to 2 MiB; strided groups and BF16 miss the exact map.
        ("all-gather", iota(2, 4), int(2.5 * MIB), "F32", 35.72),
        ("reduce-scatter", ((0, 4), (1, 5), (2, 6), (3, 7)), 3 * MIB, "BF16", 23.784),
    ],
)
def test_lookup_matches_xlas_estimator(
    kind: str, groups: tuple[tuple[int, ...], ...], nbytes: int, dtype: str, xla_us: float
) -> None:
    table = default_perf_table().for_device("sm_90")
    assert table.seconds(kind, groups, nbytes, dtype) * 1e6 == pytest.approx(xla_us, abs=1e-3)


def test_snapping_and_clamping_as_xla_does() -> None:
    table = default_perf_table().for_device("sm_90")
    one_host = iota(1, 8)
    # Nearest power of two, a tie goes up, clamped to [1 KiB, 1 GiB].
    assert [snap_pow2(n, KIB, GIB) for n in (1000, 1536, 1535, 3 * MIB, 4 * GIB)] == [
        KIB, 2 * KIB, KIB, 4 * MIB, GIB,
    ]  # fmt: skip
    # So the time can drop between neighbouring sizes (measured 1 MiB vs 2 MiB rates).
    below = table.seconds("all-reduce", one_host, int(1.4 * MIB))
    above = table.seconds("all-reduce", one_host, int(1.6 * MIB))
    assert below is not None and above is not None and above < below
    # Beyond 1 GiB the 1 GiB rate applies linearly.
    assert table.seconds("all-reduce", one_host, 4 * GIB) == pytest.approx(
        4 * table.seconds("all-reduce", one_host, GIB)
    )
    # Below 1 KiB XLA scales toward zero; the cost model floors at the 1 KiB time.
    assert table.seconds("all-reduce", one_host, 512) == pytest.approx(
        table.seconds("all-reduce", one_host, KIB) / 2
    )
    tiny = collective_cost("all-reduce", one_host, 4, H100)
    assert tiny.measured and tiny.seconds == pytest.approx(
        table.seconds("all-reduce", one_host, KIB)
    )
    assert transfer_bytes("reduce-scatter", MIB, 8) == 8 * MIB


def test_across_hosts_stays_alpha_beta_with_the_networks_own_efficiency() -> None:
    # FSDP across 4 hosts: groups of 4 GPUs, one per host. nccl-tests give 46-48 GB/s
    # busbw per 400 Gb/s NIC, so a 27 MiB all-gather takes about 460-500 us.
    groups = tuple(tuple(range(i, 32, 8)) for i in range(8))
    cost = collective_cost("all-gather", groups, 27 * MIB, H100)
    assert cost.network and not cost.measured and cost.algorithm == "ring"
    assert 460e-6 <= cost.seconds <= 500e-6
    assert H100.link_bandwidth(True) == pytest.approx(47e9)
    assert H100.link_bandwidth(False) == pytest.approx(360e9)
    # XLA's table covers one host only: a 16-GPU group is modelled.
    assert not collective_cost("all-reduce", (tuple(range(16)),), MIB, H100).measured
    # A kind the table lacks is modelled too.
    assert not collective_cost("collective-broadcast", (tuple(range(8)),), MIB, H100).measured


@pytest.mark.slow
def test_targets_read_their_section() -> None:
    for name, key in (("h100", "sm_90"), ("h200", "sm_90"), ("b200", "sm_100_B200")):
        target = get_target(name)
        assert target.perf_table_key == key
        table = target.measured_collectives()
        assert table is not None and table.device == key
        assert collective_cost("all-gather", iota(1, 8), 16 * MIB, target).measured
    gb200 = get_target("gb200")
    assert gb200.devices_per_host == 72
    # The NVL72 domain: a 64-GPU all-reduce is one "host", measured exactly.
    cost = collective_cost("all-reduce", (tuple(range(64)),), 16 * MIB, gb200)
    table = gb200.measured_collectives()
    assert table is not None
    assert cost.measured and cost.seconds == pytest.approx(
        table.seconds("all-reduce", (tuple(range(64)),), 16 * MIB)
    )
    assert get_target("a100").measured_collectives() is None
    assert not collective_cost("all-reduce", iota(1, 8), MIB, get_target("a100")).measured


# -- a user's own table ---------------------------------------------------------------

USER_TABLE = """\
# my cluster, measured with collective_perf_table_gen
entries {
  key: "sm_90"
  value {
    entries {
      instruction {
        opcode: "all-reduce"
        shape { element_type: F32 dimensions: 262144 }
        replica_groups { replica_ids: [0, 1, 2, 3, 4, 5, 6, 7] }
      }
      network_throughput_bytes_per_sec: 10000000000
    }
  }
}
"""


def test_a_users_table_replaces_the_vendored_one(tmp_path: Path) -> None:
    path = tmp_path / "mine.txtpb"
    path.write_text(USER_TABLE)
    table = load_perf_table(path)
    assert table.devices() == ("sm_90",)
    mine = with_perf_table(H100, path)
    cost = collective_cost("all-reduce", iota(1, 8), MIB, mine)
    # 1 MiB at the 1 MiB point's 10 GB/s.
    assert cost.measured and cost.seconds == pytest.approx(MIB / 1e10)
    # What it lacks (another kind) is modelled, not taken from the vendored table.
    assert not collective_cost("all-gather", iota(1, 8), MIB, mine).measured
    # A target file names one relative to itself.
    (tmp_path / "t.json").write_text('{"base": "h100", "perf_table": "mine.txtpb"}')
    assert load_target(tmp_path / "t.json").perf_table is not None
    # A table without the target's GPU is refused up front, naming what it has.
    with pytest.raises(PerfTableError, match=r"no measurements for 'sm_100_B200'.*sm_90"):
        with_perf_table(get_target("b200"), path)
    (tmp_path / "bad.json").write_text('{"perf_table": "missing.txtpb"}')
    with pytest.raises(TargetError, match="cannot read the performance table"):
        load_target(tmp_path / "bad.json")


def test_a_binary_table_reads_like_the_text(tmp_path: Path) -> None:
    shape = field(2, 11) + field(3, encode_varint(262144))  # F32[262144], packed
    groups = field(49, b"".join(field(1, d) for d in range(8)))
    instruction = field(2, b"all-reduce") + field(3, shape) + groups
    profile = field(1, instruction) + field(6, 10_000_000_000)
    entry = field(1, b"sm_90") + field(2, field(1, profile))
    path = tmp_path / "mine.pb"
    path.write_bytes(field(2, entry))
    binary = load_perf_table(path).for_device("sm_90")
    text_path = tmp_path / "mine.txtpb"
    text_path.write_text(USER_TABLE)
    text = load_perf_table(text_path).for_device("sm_90")
    assert binary.seconds("all-reduce", iota(1, 8), MIB) == text.seconds(
        "all-reduce", iota(1, 8), MIB
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("entries { key: \"sm_90\" value { entries { instruction { opcode: \"all-reduce\"",
         r"mine.txtpb:1: '\{' opened here is never closed"),
        ("entries {\n  key: \"sm_90\"\n  value {\n    entries {\n      instruction {\n"
         "        opcode: \"sort\"\n      }\n    }\n  }\n}\n",
         r"mine.txtpb:5: sm_90: unsupported opcode 'sort'"),
        ("entries {\n  key: \"sm_90\"\n  value {\n    entries {\n      instruction {\n"
         "        opcode: \"all-gather\"\n        shape { element_type: F33 }\n      }\n"
         "    }\n  }\n}\n",
         r"mine.txtpb:7: sm_90: unknown element_type 'F33'"),
        ("entries {\n  key: \"sm_90\"\n  value {\n    entries {\n      instruction {\n"
         "        opcode: \"all-gather\"\n        shape { element_type: F32 dimensions: 8 }\n"
         "      }\n    }\n  }\n}\n",
         r"mine.txtpb:5: sm_90: all-gather needs replica groups"),
        ("entries { value { } }", r"mine.txtpb:1: a top-level 'entries' needs a 'key'"),
        ("entries { key: \"sm_90\" value { entries { instruction { opcode: @ } } } }",
         r"mine.txtpb:1: unexpected character '@'"),
        ("# nothing\n", r"mine.txtpb:1: no measurements"),
    ],
)  # fmt: skip
def test_a_bad_table_says_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "mine.txtpb"
    path.write_text(text)
    with pytest.raises(PerfTableError, match=message):
        load_perf_table(path)


# -- the vendored file ----------------------------------------------------------------------


@pytest.mark.slow
def test_the_vendored_table_keeps_xlas_header_and_the_targets_sections() -> None:
    text = DEFAULT_TABLE_PATH.read_text()
    assert text.startswith("# Copyright 2026 The OpenXLA Authors.\n")
    assert "Licensed under the Apache License, Version 2.0" in text.split("entries {")[0]
    assert "dc660322168302831d1cbc4c99683cd79671286e" in text.split("entries {")[0]
    assert default_perf_table().devices() == ("sm_100_B200", "sm_100_GB200", "sm_90")
    readme = (DEFAULT_TABLE_PATH.parent / "README.md").read_text()
    for fact in ("openxla/xla", "default_collective_perf_table.txtpb", "dc660322168302831d1"):
        assert fact in readme
    # Every measurement of the three sections reads, and the lazy split (each section
    # parsed when first used) gives the same measurements at the same lines.
    whole = load_perf_table(DEFAULT_TABLE_PATH)
    assert whole.measurements == default_perf_table().measurements
    assert len(whole.measurements) == 1808


@pytest.mark.slow
@pytest.mark.parametrize("table", ["collective", "matmul"])
def test_the_vendor_tool_reproduces_the_file_from_jaxlib(table: str) -> None:
    """tools/vendor_perf_table.py --from-plugin --table=... --check: the table compiled
    into the installed jax CUDA plugin (the collective one binary, decoded; the matmul
    one text) holds the vendored sections byte for byte."""
    import importlib.util
    import sys

    if jax_compat.cuda_plugin_module() is None:
        pytest.skip("no jax CUDA plugin")
    spec = importlib.util.spec_from_file_location(
        "vendor_tool", REPO / "tools/vendor_perf_table.py"
    )
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    sys.modules["vendor_tool"] = tool
    spec.loader.exec_module(tool)
    assert tool.main(["--from-plugin", f"--table={table}", "--check"]) == 0
