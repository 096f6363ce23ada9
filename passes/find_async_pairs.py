"""find-async-pairs: every async collective start/done pair in every computation.

Reads the dedicated pairs (``all-reduce-start``/``-done`` ...), wrapped ones in both
spellings (``async-start(...), calls=%c`` around a collective, and the sugared
``reduce-scatter-start`` that ``compiled.as_text()`` prints) and send/recv. For
each it records the schedule positions, whether it is sync or pipelined, the
global device ids of its groups and the bytes it moves.
"""

from __future__ import annotations

from dataclasses import dataclass

from xla_streams.collectives import AsyncPair
from xla_streams.hlo import Computation, Instruction, Module
from xla_streams.hlo.attributes import (
    Groups,
    decode,
    parse_backend_config,
    parse_frontend_attributes,
    parse_replica_groups,
    parse_source_target_pairs,
)
from xla_streams.hlo.text import ScanError
from xla_streams.pipeline import Compilation, Fact, ModulePass, register

COLLECTIVES = frozenset(
    {
        "all-reduce",
        "all-gather",
        "reduce-scatter",
        "all-to-all",
        "ragged-all-to-all",
        "collective-permute",
        "collective-broadcast",
    }
)
_DONE_OF_SEND_RECV = {"send-done": "send", "recv-done": "recv"}
PIPELINE_ATTRIBUTE = "_xla_send_recv_pipeline"
# Computations executed as part of their caller's instruction (control flow);
# fusions, reducers and async wrappers are not.
_CONTROL_FLOW_CALLEES = {
    "while": ("condition", "body"),
    "conditional": ("branch_computations", "true_computation", "false_computation"),
    "call": ("to_apply",),
}


@register
@dataclass(frozen=True)
class FindAsyncPairs(ModulePass):
    name = "find-async-pairs"
    ensures = frozenset({Fact.ASYNC_PAIRS})

    def run(self, compilation: Compilation) -> None:
        compilation.pairs = tuple(find_async_pairs(compilation.module))


def find_async_pairs(module: Module) -> list[AsyncPair]:
    """All pairs of the module, ordered by when they start in the execution."""
    times = execution_times(module)
    pairs: list[AsyncPair] = []
    for comp in module.computations:
        position = {inst.name: i for i, inst in enumerate(comp.instructions)}
        starts_done: set[str] = set()
        for done in comp.instructions:
            start = _start_of(done, comp)
            if start is None:
                continue
            if start.name in starts_done:
                raise done.error(f"'%{start.name}' already has a done")
            starts_done.add(start.name)
            pairs.append(_pair(module, comp, start, done, position, times))
        for inst in comp.instructions:
            if _is_start(inst, comp) and inst.name not in starts_done and not _is_pipelined(inst):
                raise inst.error(f"async start '%{inst.name}' has no done in '{comp.name}'")
    pairs.sort(key=lambda p: p.start_time)
    return pairs


def execution_times(module: Module) -> dict[str, list[int]]:
    """Per computation, the time of each instruction in one execution of the program.

    Callees of control flow are laid out inside the calling instruction (at its
    first call), so a pair in flight across a `while` is in flight during its body.
    Computations not reached from ENTRY follow, in text order.
    """
    times: dict[str, list[int]] = {}
    clock = 0

    def visit(comp: Computation) -> None:
        nonlocal clock
        slots = times[comp.name] = []
        for inst in comp.instructions:
            clock += 1
            slots.append(clock)
            for key in _CONTROL_FLOW_CALLEES.get(inst.opcode, ()):
                value = inst.attribute(key)
                if value is None:
                    continue
                for name in value.strip("{}").split(","):
                    callee = module.computation(name.strip().lstrip("%"))
                    if callee is not None and callee.name not in times:
                        visit(callee)
            clock += 1  # the instruction ends after everything it called

    visit(module.entry)
    for comp in module.computations:
        if comp.name not in times:
            visit(comp)
    return times


def _start_of(done: Instruction, comp: Computation) -> Instruction | None:
    """The start that ``done`` completes, or None when ``done`` is no collective's done."""
    opcode = done.opcode
    if opcode in _DONE_OF_SEND_RECV:
        expected = _DONE_OF_SEND_RECV[opcode]
    elif opcode == "async-done":
        expected = "async-start"
    elif opcode.endswith("-done") and opcode.removesuffix("-done") in COLLECTIVES:
        expected = opcode.removesuffix("-done") + "-start"
    else:
        return None
    names = done.operand_names
    if not names:
        raise done.error(f"{opcode} has no operand")
    start = comp.get(names[0])
    # async-update links may sit between the start and the done.
    while start is not None and start.opcode.endswith("-update") and start.operand_names:
        start = comp.get(start.operand_names[0])
    if start is None or start.opcode != expected:
        if opcode in _DONE_OF_SEND_RECV and _is_pipelined(done):
            return None  # started in another iteration; XLA keeps it on its P2P stream
        found = f"'%{start.name}' ({start.opcode})" if start else f"'%{names[0]}'"
        raise done.error(
            f"the {expected} of {opcode} '%{done.name}' is missing: its operand is {found}"
        )
    if opcode == "async-done" and _wrapped(start) is None:
        return None  # an async computation that is not a collective
    return start


def _is_start(inst: Instruction, comp: Computation) -> bool:
    opcode = inst.opcode
    if opcode in ("send", "recv"):
        return True
    if opcode == "async-start":
        return _wrapped(inst) is not None
    return opcode.endswith("-start") and opcode.removesuffix("-start") in COLLECTIVES


def _wrapped(start: Instruction) -> Instruction | None:
    """The collective inside an ``async-start(...), calls=%c``; None if not a collective."""
    calls = start.attribute("calls")
    if calls is None:
        raise start.error("async-start without calls=")
    callee = start.computation.module.computation(calls.lstrip("%"))
    if callee is None:
        raise start.error_at_attribute("calls", 0, f"unknown computation '{calls}'")
    root = callee.root
    return root if root.opcode in COLLECTIVES else None


def _is_pipelined(inst: Instruction) -> bool:
    attributes = decode(inst, "frontend_attributes", parse_frontend_attributes)
    return attributes is not None and PIPELINE_ATTRIBUTE in attributes


def _pair(
    module: Module,
    comp: Computation,
    start: Instruction,
    done: Instruction,
    position: dict[str, int],
    times: dict[str, list[int]],
) -> AsyncPair:
    # The instruction that carries the collective's attributes.
    op = _wrapped(start) if start.opcode == "async-start" else start
    assert op is not None
    kind = op.opcode.removesuffix("-start")
    start_index, done_index = position[start.name], position[done.name]
    if done_index <= start_index:
        raise done.error(f"'%{done.name}' is scheduled before its start '%{start.name}'")
    slots = times[comp.name]
    return AsyncPair(
        computation=comp.name,
        start=start.name,
        done=done.name,
        kind=kind,
        start_index=start_index,
        done_index=done_index,
        start_time=slots[start_index],
        done_time=slots[done_index],
        sync=_is_sync(start) or (op is not start and _is_sync(op)),
        pipelined=_is_pipelined(start),
        groups=device_groups(module, op, kind),
        bytes=max(sum(o.shape.byte_size for o in start.operands), done.shape.byte_size),
        start_line=start.line,
    )


def _is_sync(inst: Instruction) -> bool:
    config = decode(inst, "backend_config", parse_backend_config)
    if config is None:
        return False
    collective = config.get("collective_backend_config", {})
    return bool(isinstance(collective, dict) and collective.get("is_sync", False))


def device_groups(module: Module, op: Instruction, kind: str) -> Groups:
    """The groups of global device ids (replica * num_partitions + partition) of ``op``.

    Follows XLA's collective group modes: without channel_id the ids are replicas;
    with one they are partitions, or with ``use_global_device_ids`` global ids.
    Permutes and send/recv give each source/target pair as a group.
    """
    replicas, partitions = module.replica_count, module.num_partitions
    has_channel = op.attribute("channel_id") is not None
    if kind in ("collective-permute", "send", "recv"):
        if kind == "collective-permute":
            pairs = decode(op, "source_target_pairs", parse_source_target_pairs)
        else:
            pairs = _send_recv_pairs(op)
        if pairs is None:
            raise op.error(f"{op.opcode} without source_target_pairs")
        groups: Groups = tuple(pairs)
        mode = "partition" if has_channel else "replica"
    else:
        groups = decode(op, "replica_groups", parse_replica_groups) or ()
        global_ids = op.attribute("use_global_device_ids") == "true"
        has_global_field = kind in ("all-reduce", "all-gather", "reduce-scatter")
        if not has_channel:
            mode = "replica"
        elif global_ids:
            mode = "global"
        elif has_global_field:
            mode = "replica-and-partition"
        else:
            mode = "partition"
    return _to_device_ids(op, groups, mode, replicas, partitions)


def _send_recv_pairs(op: Instruction) -> tuple[tuple[int, int], ...] | None:
    attributes = decode(op, "frontend_attributes", parse_frontend_attributes) or {}
    value = attributes.get("_xla_send_recv_source_target_pairs")
    if value is None:
        return None
    try:
        return parse_source_target_pairs(value)
    except ScanError as e:
        raise op.error_at_attribute(
            "frontend_attributes", 0, f"bad _xla_send_recv_source_target_pairs: {e.message}"
        ) from None


def _to_device_ids(
    op: Instruction, groups: Groups, mode: str, replicas: int, partitions: int
) -> Groups:
    total = replicas * partitions
    if mode == "global":
        result = groups or (tuple(range(total)),)
    elif mode == "partition":
        groups = groups or (tuple(range(partitions)),)
        result = tuple(
            tuple(r * partitions + p for p in g) for r in range(replicas) for g in groups
        )
    elif mode == "replica":
        groups = groups or (tuple(range(replicas)),)
        result = tuple(
            tuple(r * partitions + p for r in g) for p in range(partitions) for g in groups
        )
    else:  # replica-and-partition: every partition of the grouped replicas
        groups = groups or (tuple(range(replicas)),)
        result = tuple(
            tuple(r * partitions + p for r in g for p in range(partitions)) for g in groups
        )
    for group in result:
        for device in group:
            if not 0 <= device < total:
                raise op.error(
                    f"device {device} is outside the module's {total} devices "
                    f"(replica_count={replicas}, num_partitions={partitions})"
                )
    return result
