"""asyncify and lower-to-ffi on module text, and the hook glue; no program runs here.

tests/data/ffi_fixtures/*.hlo are XLA:CPU's scheduled modules of two programs in
tests/runtime/ffi_worker.py (``python tests/runtime/ffi_worker.py capture tests/data/ffi_fixtures``);
hlo_fixtures/*.text.hlo are the deviceless H100 compiles.
"""

from __future__ import annotations

import glob
import os
import re

import pytest
from conftest import hlo_module
from jaxlib import _hlo

from xla_streams.hlo import Instruction, Module, parse_module
from xla_streams.passes.base import Compilation, ModulePass, PipelineError
from xla_streams.passes.lower_to_ffi import leaves, plan_collective
from xla_streams.pipeline import PassManager, build_pipeline, parse_pipeline
from xla_streams.runtime.abi import DONE_TARGET, START_TARGET, CollectiveCall

HERE = os.path.dirname(__file__)
CPU_FIXTURES = sorted(glob.glob(os.path.join(HERE, "..", "data", "ffi_fixtures", "*.hlo")))
GPU_FIXTURES = sorted(glob.glob(os.path.join(HERE, "..", "..", "hlo_fixtures", "*.text.hlo")))
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
HOST = build_pipeline(4, runtime="host")
CUDA = build_pipeline(4, runtime="cuda")


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def run(text: str, passes: list[ModulePass] | str) -> tuple[Module, Compilation]:
    """Run ``passes`` (or a pipeline spec) over the module ``text``."""
    module = parse_module(text)
    if isinstance(passes, str):
        passes = parse_pipeline(passes)
    return module, PassManager(passes).run(Compilation(module))


def call_of(inst: Instruction) -> CollectiveCall:
    """The attributes of one of our custom calls, read back from its backend_config."""
    config = inst.attribute("backend_config")
    assert config is not None, inst.text
    return CollectiveCall.parse(config)


def targets(text: str, target: str) -> list[str]:
    """The lines of ``text`` that call ``target``."""
    return [line for line in text.split("\n") if f'custom_call_target="{target}"' in line]


def check_xla_accepts(text: str, *, exact_names: bool = True) -> None:
    """XLA parses the module and keeps our schedule; operands are defined before use.

    Without ``exact_names`` only the lengths are compared: XLA names the collective
    inside a sugared ``all-to-all-start`` after its opcode, and renames a clash.
    """
    parsed = _hlo.hlo_module_from_text(text)
    ours = parse_module(text)
    schedule = parsed.schedule()
    compared = 0
    for comp in parsed.computations():
        mine = ours.computation(comp.name)
        try:
            sequence = schedule.sequence(comp)
        except IndexError:  # fusion bodies, reducers: not scheduled
            continue
        if mine is None:  # a wrapper XLA made for a sugared async op
            continue
        if exact_names:
            assert [i.name for i in sequence] == [i.name for i in mine.instructions]
        else:
            assert len(sequence) == len(mine.instructions)
        compared += 1
    assert compared >= 1
    for comp in ours.computations:  # operands are defined before use
        seen: set[str] = set()
        for inst in comp.instructions:
            assert set(inst.operand_names) <= seen, inst.name
            seen.add(inst.name)


# -- asyncify ------------------------------------------------------------------------


@pytest.mark.parametrize("path", CPU_FIXTURES, ids=os.path.basename)
def test_asyncify_splits_each_collective_at_its_place(path: str) -> None:
    text = read(path)
    before = parse_module(text)
    module, _ = run(text, "asyncify")
    for comp in before.computations:
        after = module.computation(comp.name)
        assert after is not None
        originals = {i.name: i for i in comp.instructions if i.opcode in COLLECTIVES}
        names = [i.name for i in after.instructions]
        for name, original in originals.items():
            done = after.get(name)
            assert done is not None and done.opcode == f"{original.opcode}-done"
            start = after.get(done.operand_names[0])
            assert start is not None and start.opcode == f"{original.opcode}-start"
            # The start carries the collective's attributes and operands.
            assert start.attributes == original.attributes
            assert start.operand_names == original.operand_names
            # The start stands where the collective stood (among the other instructions).
            others = [i.name for i in comp.instructions if i.name not in originals]
            kept = [n for n in names if n in set(others) | {start.name}]
            position = [i.name for i in comp.instructions].index(name)
            expected = [i.name for i in comp.instructions[:position] if i.name not in originals]
            assert kept.index(start.name) == len(expected)
            # The done comes just before its first user (other dones may sit between).
            users = [i for i, inst in enumerate(after.instructions) if name in inst.operand_names]
            at = names.index(name)
            if users:
                assert all(u > at for u in users)
                between = after.instructions[at + 1 : users[0]]
                assert all(i.opcode.endswith("-done") for i in between)
            else:
                assert done.is_root and at == len(names) - 1
        # Nothing else changed.
        assert not [i for i in after.instructions if i.opcode in COLLECTIVES]
    check_xla_accepts(module.print(), exact_names=False)


def test_asyncify_leaves_what_the_runtime_cannot_run() -> None:
    text = """HloModule m, is_scheduled=true, num_partitions=2

%weird (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  %s = f32[] add(%a, %b)
  ROOT %u = f32[] multiply(%s, %b)
}

%addc (c: c64[], d: c64[]) -> c64[] {
  %c = c64[] parameter(0)
  %d = c64[] parameter(1)
  ROOT %e = c64[] add(%c, %d)
}

ENTRY %main (p: f32[8], q: c64[8]) -> (f32[8], c64[8], f32[8]) {
  %p = f32[8]{0} parameter(0)
  %q = c64[8]{0} parameter(1)
  %x = f32[8]{0} all-reduce(%p), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=%weird
  %y = c64[8]{0} all-reduce(%q), channel_id=2, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=%addc
  %z = f32[8]{0} collective-permute(%p), channel_id=3, source_target_pairs={{0,1},{1,0}}
  ROOT %t = (f32[8]{0}, c64[8]{0}, f32[8]{0}) tuple(%x, %y, %z)
}
"""
    module, compilation = run(text, HOST)
    out = module.print()
    assert "%x = f32[8]{0} all-reduce(%p)" in out  # reduction the runtime lacks: left sync
    assert "%y = c64[8]{0} all-reduce(%q)" in out  # element type the runtime lacks
    assert len(targets(out, START_TARGET)) == 1  # only the permute
    assert [p.kind for p in compilation.pairs] == ["collective-permute"]
    check_xla_accepts(out)


def test_asyncify_root_collective_gives_a_root_done() -> None:
    text = hlo_module(
        "HloModule m, is_scheduled=true, num_partitions=2",
        """\
ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %x = f32[8]{0} all-reduce(%p), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=%add
}
""",
    )
    module, _ = run(text, "asyncify")
    lines = module.print().rstrip("\n").split("\n")
    assert lines[-2] == "  ROOT %x = f32[8]{0} all-reduce-done(%x-start)"
    assert lines[-3].startswith("  %x-start = f32[8]{0} all-reduce-start(%p), channel_id=1")
    check_xla_accepts(module.print())


def test_asyncify_withdraws_earlier_pair_facts() -> None:
    text = read(CPU_FIXTURES[0])
    with pytest.raises(PipelineError, match="'lower-to-ffi' requires async-pairs"):
        run(text, "find-async-pairs,assign-streams,asyncify,lower-to-ffi")


# -- lower-to-ffi: host ----------------------------------------------------------------


@pytest.mark.parametrize("path", CPU_FIXTURES, ids=os.path.basename)
def test_host_pipeline_lowers_every_collective(path: str) -> None:
    text = read(path)
    sync = len(re.findall(rf" (?:{'|'.join(COLLECTIVES)})\(", text))
    module, compilation = run(text, HOST)
    out = module.print()
    starts, dones = targets(out, START_TARGET), targets(out, DONE_TARGET)
    assert len(starts) == len(dones) == len(compilation.pairs) == sync > 0
    assert compilation.assignment is not None
    for pair in compilation.pairs:
        comp = module.computation(pair.computation)
        assert comp is not None
        start, done = comp.get(pair.start), comp.get(pair.done)
        assert start is not None and done is not None
        assert start.opcode == done.opcode == "custom-call"
        for inst in (start, done):
            assert inst.attribute("custom_call_has_side_effect") == "true"
            assert inst.attribute("api_version") == "API_VERSION_TYPED_FFI"
        call = call_of(start)
        assert call.op_id == compilation.pairs.index(pair)
        assert call.stream == compilation.assignment.stream_of[pair.start]
        assert call.kind == pair.kind
        assert call.num_partitions == 8
        assert call.groups == tuple(d for g in pair.groups for d in g)
        assert call.group_sizes == tuple(len(g) for g in pair.groups)
        assert call.device_ids == ()  # the host runtime maps devices itself
        # The done carries what names its start, nothing more.
        assert call_of(done) == CollectiveCall(call.op_id, call.name, call.kind, call.stream)
        assert done.attribute("backend_config") == call.done_config()
        assert start.attribute("backend_config") == call.start_config()
        # Operands, then replica-id and partition-id; the done takes the start and operands.
        ids = start.operand_names[-2:]
        assert [comp.get(n).opcode for n in ids] == ["replica-id", "partition-id"]  # type: ignore[union-attr]
        assert done.operand_names == [start.name, *start.operand_names[:-2]]
        assert done.shape_text == start.shape_text
        aliasing = done.attribute("output_to_operand_aliasing")
        assert aliasing == "{{}: (0, {})}" or aliasing.startswith("{{0}: (0, {0}), {1}: (0, {1})")  # type: ignore[union-attr]
    check_xla_accepts(out)


def test_host_lowering_reads_reductions_dimensions_and_layouts() -> None:
    module, _ = run(read(os.path.join(HERE, "..", "data", "ffi_fixtures", "cpu_kinds.hlo")), HOST)
    calls = {}
    for inst in module.instructions():
        if f'custom_call_target="{START_TARGET}"' in inst.text:
            calls[inst.name.removesuffix("-start")] = call_of(inst)
    assert calls["psum.7"].reduction == "add"
    assert calls["pmax.7"].reduction == "max"
    assert calls["pmin.7"].reduction == "min"
    assert calls["all_gather.6"].dimension == 0
    # f32[8,64]{0,1}: dimension 1 is the physical major one, so no blocks precede it.
    assert calls["all_gather.7"].dimension == 1
    assert calls["all_gather.7"].outer == (1,)
    assert calls["all-to-all"].dimension == -1  # XLA:CPU's tuple form
    assert calls["ppermute.7"].groups == (0, 3, 3, 5, 5, 0)
    assert calls["ppermute.7"].reduction == ""


def test_outer_blocks_follow_the_layout() -> None:
    module = parse_module("""HloModule m, num_partitions=2

ENTRY %main (p: f32[4,8,2]) -> f32[4,16,2] {
  %p = f32[4,8,2]{2,1,0} parameter(0)
  ROOT %g = f32[4,16,2]{2,1,0} all-gather(%p), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, dimensions={1}
}
""")
    g = module.entry.get("g")
    assert g is not None
    plan = plan_collective(module, g, "all-gather", ["f32[4,8,2]{2,1,0}"], g.shape_text, "host")
    assert not isinstance(plan, str) and plan.outer == (4,) and plan.dimension == 1
    cuda = plan_collective(module, g, "all-gather", ["f32[4,8,2]{2,1,0}"], g.shape_text, "cuda")
    assert isinstance(cuda, str) and "most major" in cuda
    # {0,2,1}: dimension 1 is most major -> nothing before it.
    plan = plan_collective(
        module, g, "all-gather", ["f32[4,8,2]{0,2,1}"], "f32[4,16,2]{0,2,1}", "cuda"
    )
    assert not isinstance(plan, str) and plan.outer == (1,)
    assert leaves("(f32[2,3]{0,1}, /*index=1*/s8[], pred[4]{0})") == [
        leaves("f32[2,3]{0,1}")[0],
        leaves("s8[]")[0],
        leaves("pred[4]{0}")[0],
    ]
    assert leaves("f32[2,3]{0,1}")[0].major_to_minor == (1, 0)
    assert leaves("f32[8,128]{0,1:T(8,128)}")[0].major_to_minor == (1, 0)  # tiles ignored
    assert [leaf.dynamic for leaf in leaves("(f32[<=8]{0}, s32[2])")] == [True, False]
    assert leaves("(f32[<=8]{0}, s32[2])")[0].dims == (8,)


def test_host_lowering_refuses_what_it_cannot_run() -> None:
    text = """HloModule m, is_scheduled=true, num_partitions=2

%add (a: c64[], b: c64[]) -> c64[] {
  %a = c64[] parameter(0)
  %b = c64[] parameter(1)
  ROOT %s = c64[] add(%a, %b)
}

ENTRY %main (p: c64[8]) -> c64[8] {
  %p = c64[8]{0} parameter(0)
  %ar = c64[8]{0} all-reduce-start(%p), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=%add
  ROOT %d = c64[8]{0} all-reduce-done(%ar)
}
"""
    with pytest.raises(PipelineError, match="all-reduce '%ar' cannot be lowered: element type c64"):
        run(text, "find-async-pairs,assign-streams,lower-to-ffi{backend=host}")


def test_lower_to_ffi_options() -> None:
    with pytest.raises(PipelineError, match="backend=gpu is not valid: expected one of host, cuda"):
        PassManager.from_spec("lower-to-ffi{backend=gpu}")
    for devices in ("1:x", "1:1", "-1"):
        with pytest.raises(
            PipelineError, match=f"devices={devices} is not valid: expected distinct"
        ):
            PassManager.from_spec(f"lower-to-ffi{{backend=cuda,devices={devices}}}")


# -- lower-to-ffi: CUDA (the H100 fixtures) ------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("path", GPU_FIXTURES, ids=os.path.basename)
def test_cuda_pipeline_on_gpu_fixtures(path: str) -> None:
    text = read(path)
    module, compilation = run(text, CUDA)
    out = module.print()
    assert compilation.assignment is not None
    lowered = 0
    for pair in compilation.pairs:
        comp = module.computation(pair.computation)
        assert comp is not None
        start = comp.get(pair.start)
        assert start is not None
        stream = compilation.assignment.stream_of[pair.start]
        if start.opcode == "custom-call":
            lowered += 1
            assert stream is not None
            assert call_of(start).stream == stream
            assert "replica-id" not in out  # the CUDA runtime maps devices itself
        else:
            # Left to XLA: sync/pipelined pairs, send/recv, and layouts NCCL cannot address.
            assert stream is None or pair.kind in ("send", "recv") or pair.kind == "reduce-scatter"
    assert lowered == len(targets(out, START_TARGET)) > 0
    check_xla_accepts(out)


def test_cuda_lowering_passes_the_device_assignment() -> None:
    text = read(GPU_FIXTURES[0])
    devices = (3, 1, 2, 0, 4, 5, 6, 7)
    module, _ = run(text, build_pipeline(4, runtime="cuda", devices=devices))
    start = next(i for i in module.instructions() if START_TARGET in i.text)
    assert call_of(start).device_ids == devices
    with pytest.raises(PipelineError, match="devices lists 3 ids but the module has 8 devices"):
        run(text, build_pipeline(4, runtime="cuda", devices=(0, 1, 2)))


# -- the hook glue ----------------------------------------------------------------------


def test_default_pipelines_print_as_specs_that_parse_back() -> None:
    for passes in (HOST, CUDA, build_pipeline(2, "round-robin", runtime="cuda", devices=(0, 1))):
        assert parse_pipeline(",".join(p.spec() for p in passes)) == passes
    assert [p.name for p in HOST] == [
        "asyncify", "find-async-pairs", "assign-streams", "verify-streams", "lower-to-ffi",
    ]  # fmt: skip
