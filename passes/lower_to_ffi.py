"""lower-to-ffi: run each assigned pair through the xla_streams runtime.

Every pair that has a collective stream becomes two typed-FFI custom calls in
the same schedule positions and under the same instruction names::

    %ar = f32[8]{0} custom-call(%x, %rid, %pid), custom_call_target="xla_streams_start",
          custom_call_has_side_effect=true, api_version=API_VERSION_TYPED_FFI,
          backend_config={op_id = 0 : i64, kind = "all-reduce", stream = 1 : i64, ...}
    %ar.done = f32[8]{0} custom-call(%ar, %x), custom_call_target="xla_streams_done",
          custom_call_has_side_effect=true, output_to_operand_aliasing={{}: (0, {})}, ...

The start enqueues the collective on stream k and returns; the done waits for
it. The done takes the start's result and the original operands, so XLA keeps
input and output buffers alive until the collective has finished, and its
result aliases the start's. The attributes (:class:`CollectiveCall` in
:mod:`xla_streams.runtime.abi`, the one definition of the custom calls) carry the
stream, kind, device groups as logical ids (replica * num_partitions +
partition), reduction, dimension (with, per operand, the number of blocks in
memory before it, so the runtime needs no layouts), op id and channel.

``backend=host`` (XLA:CPU) also passes ``replica-id()`` and ``partition-id()``
to the start, so the runtime knows its logical device without a device
assignment. ``backend=cuda`` takes the device assignment from ``devices``
(device ids in logical order, ``:``-separated; empty: the identity).

A pair the runtime cannot run (another kind, element type or reduction, a
gather dimension NCCL cannot address contiguously) is left to XLA on CUDA and
logged; on the host it is an error, since XLA:CPU has no async collectives.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass

from xla_streams.collectives import KINDS
from xla_streams.hlo import Computation, Instruction, Module, parse_shape
from xla_streams.hlo.attributes import decode, parse_int_list
from xla_streams.hlo.text import blank_comments
from xla_streams.option import choice, integer, option, sequence
from xla_streams.passes.base import Compilation, Fact, ModulePass, PipelineError
from xla_streams.runtime.abi import (
    BACKENDS,
    DONE_TARGET,
    ELEMENT_TYPES,
    FFI_KINDS,
    START_TARGET,
    Backend,
    CollectiveCall,
)
from xla_streams.streams import AsyncPair

# to_apply root opcode -> reduction name in the runtime (abi.REDUCTIONS).
REDUCTIONS = {
    "add": "add",
    "multiply": "multiply",
    "minimum": "min",
    "maximum": "max",
    "and": "and",
    "or": "or",
}
_FLOATS = frozenset({"f32", "bf16", "f16", "f64"})
# What hlo.Shape does not keep, per array in order: its dimensions as written (``<=``
# marks a dynamic one) and its layout, minor to major (``{1,0:T(8,128)}``: ``1,0``).
_ARRAY_SUFFIX = re.compile(r"\[([^\]]*)\](?:\{([^{}:]*)[^{}]*\})?")
log = logging.getLogger("xla_streams")


@dataclass(frozen=True)
class Leaf:
    """One array of a shape: element type, dimensions and physical order."""

    dtype: str
    dims: tuple[int, ...]
    major_to_minor: tuple[int, ...]
    dynamic: bool = False


def leaves(shape_text: str) -> list[Leaf]:
    """The arrays of a shape in order, e.g. ``(f32[2,4]{0,1}, s32[])``: element types and
    dimensions from :func:`xla_streams.hlo.parse_shape`, layouts from the text."""
    arrays = parse_shape(shape_text).leaves()
    suffixes = _ARRAY_SUFFIX.findall(blank_comments(shape_text))
    assert len(suffixes) == len(arrays), shape_text  # parse_shape read the same arrays
    result = []
    for array, (dims_text, layout) in zip(arrays, suffixes, strict=True):
        assert array.element_type is not None
        if layout.strip():
            order = tuple(reversed([int(x) for x in layout.split(",")]))
        else:
            order = tuple(range(len(array.dimensions)))
        result.append(Leaf(array.element_type, array.dimensions, order, "<=" in dims_text))
    return result


@dataclass(frozen=True)
class RuntimeCall:
    """What the runtime needs to know about a collective besides its groups."""

    kind: str
    dtype: str
    reduction: str  # "" for none
    dimension: int  # -1 for none
    outer: tuple[int, ...]  # per operand array: blocks before `dimension` in memory
    channel: int


def plan_collective(
    module: Module,
    op: Instruction,
    kind: str,
    operand_shapes: list[str],
    result_shape: str,
    backend: Backend,
) -> RuntimeCall | str:
    """The runtime's view of collective ``op`` or, if it cannot run it, the reason."""
    if kind not in FFI_KINDS:
        return f"the runtime does not implement {kind}"
    if op.attribute("slice_sizes") is not None:
        return "in-place collective-permute with slices"
    ins = [leaf for s in operand_shapes for leaf in leaves(s)]
    outs = leaves(result_shape)
    if not ins or len(ins) != len(outs):
        return f"{len(ins)} operand arrays but {len(outs)} result arrays"
    dtypes = {leaf.dtype for leaf in ins + outs}
    if len(dtypes) != 1:
        return f"mixed element types {sorted(dtypes)}"
    dtype = dtypes.pop()
    if dtype not in ELEMENT_TYPES[backend]:
        return f"element type {dtype} is not supported by the {backend} runtime"
    if any(leaf.dynamic for leaf in ins + outs):
        return "dynamic shapes"
    reduction = ""
    if KINDS[kind].reduces:
        found = reduction_of(module, op)
        if found is None:
            computation = op.attribute("to_apply")
            return f"reduction {computation} is not add/multiply/min/max/and/or of its parameters"
        reduction = found
        if reduction in ("and", "or") and dtype in _FLOATS:
            return f"'{reduction}' of {dtype}"
        if backend == "cuda" and reduction in ("and", "or") and dtype != "pred":
            return f"NCCL has no '{reduction}' for {dtype}"
    dimension = -1
    if kind in ("all-gather", "reduce-scatter", "all-to-all"):
        dims = decode(op, "dimensions", parse_int_list)
        if dims:
            dimension = dims[0]
        elif kind != "all-to-all":
            return f"{kind} without dimensions"
    outer: tuple[int, ...] = ()
    if dimension >= 0:
        blocks = []
        for a, b in zip(ins, outs, strict=True):
            if a.major_to_minor != b.major_to_minor:
                return "an operand and its result have different layouts"
            if dimension >= len(a.dims):
                return f"dimension {dimension} is outside the rank {len(a.dims)}"
            before = a.major_to_minor[: a.major_to_minor.index(dimension)]
            blocks.append(math.prod(a.dims[d] for d in before))
        outer = tuple(blocks)
        if backend == "cuda" and any(n != 1 for n in outer):
            return f"dimension {dimension} is not the most major one (NCCL needs contiguous blocks)"
    channel = op.attribute("channel_id")
    return RuntimeCall(kind, dtype, reduction, dimension, outer, int(channel or 0))


def reduction_of(module: Module, op: Instruction) -> str | None:
    """add/multiply/min/max/and/or when ``to_apply`` is that binary op of its two parameters."""
    name = op.attribute("to_apply")
    comp = module.computation(name.lstrip("%")) if name else None
    if comp is None:
        return None
    root = comp.root
    params = {i.name for i in comp.instructions if i.opcode == "parameter"}
    if root.opcode not in REDUCTIONS or len(params) != 2 or set(root.operand_names) != params:
        return None
    return REDUCTIONS[root.opcode]


@dataclass(frozen=True)
class LowerToFfi(ModulePass):
    name = "lower-to-ffi"
    requires = frozenset({Fact.ASYNC_PAIRS, Fact.STREAMS_ASSIGNED})

    backend: Backend = option(
        "host", choice(BACKENDS), "Which runtime runs the collectives: host (XLA:CPU) or cuda."
    )
    devices: tuple[int, ...] = option(
        (), sequence(integer(0), takes="distinct device ids (integers of at least 0), "
                     "':'-separated", separator=":", distinct=True, empty=True),
        "The module's device assignment, in logical order (the CUDA runtime's ranks; "
        "empty: the identity).",
    )  # fmt: skip

    def run(self, compilation: Compilation) -> None:
        assignment = compilation.assignment
        assert assignment is not None
        lower_to_ffi(
            compilation.module, compilation.pairs, assignment.stream_of, self.backend, self.devices
        )


def lower_to_ffi(
    module: Module,
    pairs: tuple[AsyncPair, ...],
    stream_of: dict[str, int | None],
    backend: Backend,
    devices: tuple[int, ...] = (),
) -> list[str]:
    """Lower every pair with a stream; returns the names of the starts lowered."""
    total = module.replica_count * module.num_partitions
    if devices and len(devices) != total:
        raise PipelineError(
            f"lower-to-ffi: devices lists {len(devices)} ids but the module has {total} devices"
        )
    logical_ids: dict[str, tuple[str, str]] = {}  # computation -> (replica-id, partition-id)
    users_of: dict[str, dict[str, list[str]]] = {}
    lowered = []
    for op_id, pair in enumerate(pairs):
        stream = stream_of.get(pair.key)
        if stream is None:
            continue
        comp = module.computation(pair.computation)
        assert comp is not None
        start, done = comp.get(pair.start), comp.get(pair.done)
        assert start is not None and done is not None
        if comp.name not in users_of:
            users_of[comp.name] = comp.users()
        plan = _plan_pair(module, comp, start, done, pair.kind, backend, users_of[comp.name])
        if isinstance(plan, str):
            message = f"lower-to-ffi: {pair.kind} '%{pair.start}' stays with XLA: {plan}"
            if backend == "host" and pair.kind in FFI_KINDS:
                raise PipelineError(message.replace("stays with XLA", "cannot be lowered"))
            log.info(message)
            continue
        spec, chain = plan
        # %t#1 (jax >= 0.11 dumps) stays an element of %t: XLA reads it back so.
        operands = [f"%{n}" + "".join(f"#{i}" for i in path) for n, path in start.operand_refs]
        if backend == "host":
            if comp.name not in logical_ids:
                logical_ids[comp.name] = _insert_logical_ids(comp, start)
            extra = [f"%{n}" for n in logical_ids[comp.name]]
        else:
            extra = []
        groups = pair.groups
        call = CollectiveCall(
            op_id=op_id,
            name=start.name,
            kind=spec.kind,
            stream=stream,
            reduction=spec.reduction,
            groups=tuple(d for g in groups for d in g),
            group_sizes=tuple(len(g) for g in groups),
            dimension=spec.dimension,
            outer=spec.outer,
            channel=spec.channel,
            num_partitions=module.num_partitions,
            device_ids=devices,
        )
        new_start = Instruction.create(
            comp,
            start.name,
            done.shape_text,
            "custom-call",
            ", ".join(operands + extra),
            _custom_call_attributes(start, START_TARGET, call.start_config()),
        )
        done_attributes = _custom_call_attributes(done, DONE_TARGET, call.done_config())
        done_attributes = {
            "output_to_operand_aliasing": _aliasing(done.shape_text),
            **done_attributes,
        }
        new_done = Instruction.create(
            comp,
            done.name,
            done.shape_text,
            "custom-call",
            ", ".join([f"%{start.name}", *operands]),
            done_attributes,
            is_root=done.is_root,
        )
        for link in chain:
            comp.remove(link)
        comp.replace(start, new_start)
        comp.replace(done, new_done)
        lowered.append(start.name)
    return lowered


def _plan_pair(
    module: Module,
    comp: Computation,
    start: Instruction,
    done: Instruction,
    kind: str,
    backend: Backend,
    users: dict[str, list[str]],
) -> tuple[RuntimeCall, list[Instruction]] | str:
    if start.opcode == "async-start":
        calls = start.attribute("calls")
        callee = module.computation(calls.lstrip("%")) if calls else None
        if callee is None:
            return "async-start without its computation"
        op = callee.root
    else:
        op = start
    # async-update links between start and done, to drop with them.
    chain: list[Instruction] = []
    link = comp.get(done.operand_names[0])
    while link is not None and link is not start:
        chain.append(link)
        link = comp.get(link.operand_names[0]) if link.operand_names else None
    if link is not start:
        return "the done does not complete this start"
    expected = {done.name, *(c.name for c in chain)}
    for name in (start.name, *(c.name for c in chain)):
        for user in users.get(name, ()):
            if user not in expected:
                return f"'%{user}' uses the start's result"
    try:
        operand_shapes = start.operand_shape_texts
    except Exception as e:  # an operand defined elsewhere: malformed input
        return str(e)
    plan = plan_collective(module, op, kind, operand_shapes, done.shape_text, backend)
    if isinstance(plan, str):
        return plan
    return plan, chain


def _custom_call_attributes(source: Instruction, target: str, config: str) -> dict[str, str]:
    attributes = {
        "custom_call_target": f'"{target}"',
        "custom_call_has_side_effect": "true",
    }
    for key in ("control-predecessors", "frontend_attributes", "metadata"):
        value = source.attribute(key)
        if value is not None:
            attributes[key] = value
    attributes["api_version"] = "API_VERSION_TYPED_FFI"
    attributes["backend_config"] = config
    return attributes


def _aliasing(shape_text: str) -> str:
    """The done's result is the start's result (operand 0), leaf by leaf."""
    shape = parse_shape(shape_text)
    if not shape.is_tuple:
        return "{{}: (0, {})}"
    count = len(shape.leaves())
    return "{" + ", ".join(f"{{{i}}}: (0, {{{i}}})" for i in range(count)) + "}"


def _insert_logical_ids(comp: Computation, before: Instruction) -> tuple[str, str]:
    names = []
    index = comp.instructions.index(before)
    for base, opcode in (
        ("xla_streams.replica_id", "replica-id"),
        ("xla_streams.partition_id", "partition-id"),
    ):
        name = comp.module.unique_name(base)
        comp.insert(index, Instruction.create(comp, name, "u32[]", opcode, "", {}))
        index += 1
        names.append(name)
    return names[0], names[1]
