"""Where the tuner's compiles happen and what they compile for: topologies shaped like
real clusters, the levers this XLA has, the disk cache, and worker processes.

Deviceless compiles of small programs (a second each) and of the FSDP x TP scan
program (a few seconds); the gpu-aot extra is needed.
"""

from __future__ import annotations

import io
import os
import textwrap
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before anything imports JAX

import pytest
from conftest import CompiledStandIn

import xla_streams
from xla_streams import aot, jax_compat, programs
from xla_streams import xla_options as xo
from xla_streams.collectives import StreamModel
from xla_streams.hlo import parse_module
from xla_streams.streams import find_async_pairs
from xla_streams.tuning.cache import CompileCache, Refused
from xla_streams.tuning.compiling import (
    CachedCompiler,
    LocalCompiler,
    PoolCompiler,
    ProgramSource,
    default_jobs,
)
from xla_streams.tuning.driver import tune_lowered

# A two-layer FSDP training step over all devices (weights sharded, gathered for the
# forward pass, gradients reduce-scattered): a second to compile, several collectives.
SMALL = textwrap.dedent(
    """\
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    def build(devices):
        mesh = Mesh(np.array(devices), ("d",))
        s = NamedSharding(mesh, P("d"))

        def loss(w, x):
            return jnp.tanh(jnp.tanh(x @ w[0]) @ w[1]).sum()

        @jax.jit
        def step(w, x):
            return w - 0.1 * jax.grad(loss)(w, x)

        w = jax.ShapeDtypeStruct((2, 1024, 1024), jnp.float32, sharding=NamedSharding(mesh, P(None, "d")))
        x = jax.ShapeDtypeStruct((64 * len(devices), 1024), jnp.float32, sharding=s)
        return step, (w, x)
    """
)


def small_build() -> Any:
    namespace: dict[str, Any] = {}
    exec(compile(SMALL, "small_program.py", "exec"), namespace)
    return namespace["build"]


def small_source() -> ProgramSource:
    build = small_build()
    devices = aot.gpu_topology("h100", 8, 8, 1).devices
    fn, args = build(devices)
    text, ids, jit_options = jax_compat.lowered_compile_inputs(fn.lower(*args))
    return ProgramSource(text, ids, jit_options, "h100", 8, 8, 1)


# -- topologies ---------------------------------------------------------------------------


@pytest.mark.slow
def test_topology_shapes_follow_the_nvlink_domains() -> None:
    assert aot.topology_shape(32, 8, 1) == "4x1x8"  # an HGX H100 cluster: a host per domain
    assert aot.topology_shape(32, 8) == "1x4x8"  # all hosts in one domain (the fixtures')
    assert aot.topology_shape(72, 4, 18) == "1x18x4"  # a GB200 NVL72 rack
    assert aot.topology_shape(8, 8, 1) == "1x1x8"
    with pytest.raises(ValueError, match="do not split into NVLink domains of 3"):
        aot.topology_shape(32, 8, 3)
    devices = aot.gpu_topology("h100", 16, 8, 1).devices
    # Host-major in every shape: device d on host d // 8; the partition is the host.
    assert [d.process_index for d in sorted(devices, key=lambda d: d.id)] == [0] * 8 + [1] * 8
    assert {tuple(d.coords) for d in devices if d.id == 9} == {(1, 0, 1)}


@pytest.mark.slow
def test_only_collectives_inside_one_host_are_scale_up_when_hosts_are_domains() -> None:
    """XLA takes a topology partition for one NVLink domain: with each host its own, its
    scale-up domain assignment tags the in-host (tensor parallel) collectives only,
    not the FSDP ones across hosts; with both hosts in one partition, all."""
    tagged_by_shape = {}
    for per_domain in (1, None):
        devices = aot.gpu_topology("h100", 16, 8, per_domain).devices
        fn, args = programs.fsdp_tp_mlp_scan(devices)
        options = {xo.COLLECTIVE_DOMAIN_ASSIGNMENT: xo.SCALE_UP_FABRIC}
        text = aot.compile_for_gpu(fn, args, compiler_options=options, dump=False).as_text
        module = parse_module(text)
        pairs = [p for p in find_async_pairs(module, StreamModel(1, True)) if not p.sync]
        tagged = {}
        for p in pairs:
            start = module.computation(p.computation).get(p.start)  # type: ignore[union-attr]
            in_host = all(len({d // 8 for d in g}) == 1 for g in p.groups)
            tagged[p.start] = ("SCALE_UP" in start.text, in_host)  # type: ignore[union-attr]
        tagged_by_shape[per_domain] = tagged
    per_host = tagged_by_shape[1].values()
    assert any(in_host for _, in_host in per_host) and any(not h for _, h in per_host)
    assert all(is_tagged == in_host for is_tagged, in_host in per_host)
    assert all(is_tagged for is_tagged, _ in tagged_by_shape[None].values())


@pytest.mark.slow
def test_tune_compiles_for_the_cluster_s_shape() -> None:
    result = xla_streams.tune(
        small_build(), devices=16, devices_per_host=8, levers=["overlap-limit"],
        budget_compiles=10, jobs=0, cache_dir=False,
    )  # fmt: skip
    assert result.topology == "2x1x8"
    assert "(topology 2x1x8)" in result.table()


# -- the levers this XLA has ------------------------------------------------------------------


@pytest.mark.slow
def test_this_xla_takes_every_option_the_tuner_searches() -> None:
    source = small_source()
    searched = {
        xo.WINDOWED_EINSUM_THRESHOLD_MIB: 0,
        xo.COLLECTIVE_DOMAIN_ASSIGNMENT: xo.SCALE_UP_FABRIC,
        xo.SCALE_UP_OVERLAP_LIMIT: 2,
        xo.COMBINE_THRESHOLD["all-reduce"]: 16 << 20,
        xo.COMBINE_THRESHOLD["all-gather"]: 8 << 30,
        xo.PIPELINE["reduce-scatter"]: xo.PIPELINING_OFF,
    }
    batch = [{**xo.DEFAULTS, name: value} for name, value in searched.items()]
    batch.append({**xo.DEFAULTS, "xla_gpu_no_such_option": 1})
    pool = PoolCompiler(source, 2)
    try:
        *each, unknown = pool.compile_many(batch)
    finally:
        pool.close()
    assert isinstance(unknown, Refused) and "No such compile option" in str(unknown)
    for (name, _), result in zip(searched.items(), each, strict=True):
        assert "No such compile option" not in str(result), name
    # jax 0.12.0.1's XLA crashes (SIGSEGV) compiling this FSDP step with collective
    # matmul for every GEMM: in a worker that is one refused candidate, not a dead tuner.
    windowed = each[0]
    if isinstance(windowed, Refused):
        assert "XLA's compile died: the worker was killed by SIGSEGV" in str(windowed)
    assert all(not isinstance(r, Refused) for r in each[1:]), each


class _OlderXla:
    """A stand-in for an XLA without the windowed-einsum threshold option."""

    def __init__(self) -> None:
        self.text = (Path(__file__).resolve().parents[2] / "hlo_fixtures" /
                     "fsdp_scan.default.text.hlo").read_text()  # fmt: skip
        self.calls: list[dict[str, object]] = []

    def compile(self, compiler_options: dict[str, object]) -> CompiledStandIn:
        self.calls.append(compiler_options)
        if xo.WINDOWED_EINSUM_THRESHOLD_MIB in compiler_options:
            raise RuntimeError(
                f"INVALID_ARGUMENT: No such compile option: '{xo.WINDOWED_EINSUM_THRESHOLD_MIB}'"
            )
        return CompiledStandIn(self.text, temp=1 << 20)


def test_an_option_this_xla_lacks_is_dropped_from_every_compile() -> None:
    older = _OlderXla()
    result = tune_lowered(
        older, program="p", devices=8, levers=["windowed-einsum", "overlap-limit"]
    )
    # The baseline was compiled again without it, and so was every candidate after.
    assert xo.WINDOWED_EINSUM_THRESHOLD_MIB in older.calls[0]
    assert all(xo.WINDOWED_EINSUM_THRESHOLD_MIB not in c for c in older.calls[1:])
    assert any(s.startswith("windowed-einsum: this XLA has no option") for s in result.skipped)
    assert any("has no option xla_gpu_threshold_for_windowed_einsum_mib" in n for n in result.notes)


# -- the disk cache and worker processes ------------------------------------------------------


@pytest.mark.slow
def test_a_second_tune_of_an_unchanged_program_compiles_nothing(tmp_path: Path) -> None:
    runs = []
    # Each from the same call site: the program's StableHLO holds the source locations of
    # its lowering, its caller's too, so a tune called from elsewhere is another module.
    for _ in range(3):
        if len(runs) == 2:  # before the third: spoil an entry
            entries = sorted(tmp_path.glob("*/*.json.gz"))
            assert len(entries) == runs[0].evaluated
            entries[0].write_bytes(b"not gzip")
        runs.append(
            xla_streams.tune(
                small_build(),
                devices=8,
                levers=["overlap-limit", "start-early"],
                budget_compiles=20,
                jobs=0,
                cache_dir=tmp_path,
            )
        )
    first, second, third = runs
    assert first.compiles == first.evaluated >= 4 and first.cache_hits == 0
    assert second.compiles == 0 and second.cache_hits == first.evaluated
    assert [c.to_json() for c in second.candidates] == [c.to_json() for c in first.candidates]
    assert "from the cache" not in first.table().splitlines()[0]
    assert f"{second.cache_hits} from the cache" in second.table().splitlines()[0]
    # An entry that cannot be read is compiled again.
    assert third.compiles == 1 and third.cache_hits == first.evaluated - 1


def test_the_cache_key_holds_everything_a_compile_depends_on(tmp_path: Path) -> None:
    source = small_source()
    cache = CompileCache(tmp_path)
    base = source.cache_base()
    key = cache.key(base, xo.DEFAULTS)
    assert key == cache.key(dict(base), dict(xo.DEFAULTS))  # stable
    assert key != cache.key(base, {**xo.DEFAULTS, xo.OVERLAP_LIMIT: 2})
    assert key != cache.key({**base, "topology": "1x1x8x"}, xo.DEFAULTS)
    assert key != cache.key({**base, "module": "0" * 64}, xo.DEFAULTS)
    for name in ("jax", "jaxlib"):
        assert name in base["versions"]  # type: ignore[operator]
    # True and 1 are different options for XLA: they are different keys.
    assert cache.key(base, {"x": True}) != cache.key(base, {"x": 1})


@pytest.mark.slow
def test_worker_processes_compile_what_this_process_compiles() -> None:
    source = small_source()
    options = [{**xo.DEFAULTS, xo.OVERLAP_LIMIT: v} for v in (1, 2)]
    here = LocalCompiler(source).compile_many(options)
    pool = PoolCompiler(source, 2)
    try:
        there = pool.compile_many(options)
        assert [p.process for p in pool._pool if p.process is not None]  # they ran
    finally:
        pool.close()
    assert [r.text for r in there] == [r.text for r in here]  # type: ignore[union-attr]
    assert [r.memory for r in there] == [r.memory for r in here]  # type: ignore[union-attr]
    assert 1 <= default_jobs() <= (os.cpu_count() or 1)


@pytest.mark.slow
def test_jobs_compile_the_batches_in_parallel_with_the_same_result(tmp_path: Path) -> None:
    err = io.StringIO()
    levers = ["overlap-limit", "start-early"]
    common = {"levers": levers, "budget_compiles": 10, "cache_dir": False}
    alone = xla_streams.tune(small_build(), devices=8, jobs=0, **common)
    together = xla_streams.tune(small_build(), devices=8, jobs=2, progress=err, **common)
    # After the joint move (the limit 2 with start-early), the descent's other limits were
    # one batch: announced together, then compiled.
    lines = err.getvalue().splitlines()
    announced = [i for i, line in enumerate(lines) if "compile 3:" in line or "compile 4:" in line]
    assert announced == [announced[0], announced[0] + 1]
    assert [c.predicted_step_ms for c in together.candidates] == [
        c.predicted_step_ms for c in alone.candidates
    ]


@pytest.mark.slow
def test_cached_compiler_compiles_only_what_it_lacks(tmp_path: Path) -> None:
    class Counting(LocalCompiler):
        calls = 0

        def compile_many(self, options: Any) -> Any:
            Counting.calls += len(options)
            return super().compile_many(options)

    source = small_source()
    compiler = CachedCompiler(Counting(source), CompileCache(tmp_path), source.cache_base())
    opts = [{**xo.DEFAULTS, xo.OVERLAP_LIMIT: v} for v in (1, 2)]
    assert compiler.will_compile(opts[0])
    compiler.compile_many(opts[:1])
    assert not compiler.will_compile(opts[0]) and compiler.will_compile(opts[1])
    compiler.compile_many(opts)
    assert Counting.calls == 2
