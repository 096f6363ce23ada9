"""Which stream XLA:GPU runs each async operation on: its ``ExecutionStreamAssignment``.

XLA assigns streams after scheduling, on the final module
(``xla/service/gpu/execution_stream_assignment.cc``; this re-implements the rule,
it copies no code):

1. Computations are visited breadth-first from ENTRY; a ``while`` queues its body,
   then its condition, a ``conditional`` its branches, a ``call`` its callee (a
   computation reached twice is visited twice: the counters advance again, the
   first stream sticks).
2. Inside a computation the instructions are walked in *post-order*
   (``MakeInstructionPostOrder``: depth first from each instruction nothing uses,
   in the computation's order, operands left to right, control predecessors
   first), not in schedule order.
3. Each *scope start* takes the next stream of its kind: an async collective
   (all-gather, all-reduce, all-to-all, collective-broadcast, collective-permute,
   ragged-all-to-all, reduce-scatter; a send or recv) takes communication stream
   ``counter % C``; any other async start (``fusion-start``: the dynamic-slice
   copies XLA wraps, a non-collective ``async-start``) or a ``copy-start`` takes
   compute stream ``compute_counter % 4``. One counter per kind for the whole
   module. ``C`` is 2 with ``--xla_gpu_experimental_enable_collective_multi_streaming``
   and 1 without.
4. An explicit ``_xla_stream_annotation`` frontend attribute wins; pipelined
   send/recv keep XLA's P2P stream; collectives XLA turns synchronous after
   scheduling (a start and done with nothing between: ``AsyncPair.sync``) are no
   scope starts and take no stream.

Verified against XLA's thunk sequence on jax 0.12, deviceless (four collectives
scheduled AG, AG, AR, RS run on streams 0, 1, 1, 0: post-order AG, AG, RS, AR).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from xla_streams.collectives import COLLECTIVE_OPCODES, STREAM_ATTRIBUTE
from xla_streams.hlo import Computation, Instruction, Module
from xla_streams.hlo.attributes import decode, parse_frontend_attributes
from xla_streams.streams import AsyncPair, StreamAssignment

COMPUTE_STREAMS = 4  # kDefaultNumComputeStreams
MULTI_STREAMING_COMMUNICATION_STREAMS = 2  # kDefaultNumCommunicationStreams
# Opcodes that start an async computation XLA runs on a compute stream.
ASYNC_COMPUTE_STARTS = frozenset({"fusion-start", "copy-start"})
_CALLEES = {
    "while": ("body", "condition"),
    "conditional": ("branch_computations", "true_computation", "false_computation"),
    "call": ("to_apply",),
}


@dataclass(frozen=True)
class ExecutionStreams:
    """Per scope-start instruction name: its communication stream, or its compute stream
    (``compute``; the main compute stream is not one of them)."""

    communication: dict[str, int]
    compute: dict[str, int]


def execution_streams(
    module: Module,
    pairs: Iterable[AsyncPair] = (),
    *,
    communication_streams: int = 1,
) -> ExecutionStreams:
    """XLA's stream for each async operation of ``module`` (see the module docstring).

    ``pairs`` say which collectives XLA makes synchronous (``sync``, on the compute
    stream: no scope) and which are pipelined (XLA's P2P stream: left out); a
    collective start not among ``pairs`` counts as async.
    """
    by_start = {p.start: p for p in pairs}
    communication: dict[str, int] = {}
    compute: dict[str, int] = {}
    counter = compute_counter = 0
    canonical_channel: dict[str, str] = {}  # send/recv channel -> the start holding it
    queue: deque[Computation] = deque([module.entry])
    while queue:
        comp = queue.popleft()
        for inst in post_order(comp):
            kind = _scope_kind(inst, by_start.get(inst.name))
            if kind == "communication":
                channel = inst.attribute("channel_id") if inst.opcode in ("send", "recv") else None
                annotated = _annotation(inst)
                if channel is not None and channel in canonical_channel:
                    stream = communication.get(canonical_channel[channel], 0)
                elif annotated is not None:
                    stream = annotated
                else:
                    stream = counter % communication_streams
                    counter += 1
                if channel is not None:
                    canonical_channel.setdefault(channel, inst.name)
                communication.setdefault(inst.name, stream)
            elif kind == "compute":
                annotated = _annotation(inst)
                if annotated is None:
                    annotated = compute_counter % COMPUTE_STREAMS
                    compute_counter += 1
                compute.setdefault(inst.name, annotated)
            for key in _CALLEES.get(inst.opcode, ()):
                value = inst.attribute(key)
                if value is None:
                    continue
                for name in value.strip("{}").split(","):
                    callee = module.computation(name.strip().lstrip("%"))
                    if callee is not None:
                        queue.append(callee)
    return ExecutionStreams(communication, compute)


def xla_stream_assignment(
    module: Module, pairs: Iterable[AsyncPair], *, multi_streaming: bool = True
) -> StreamAssignment:
    """The streams XLA itself gives ``pairs``: with its collective multi-streaming
    (``--xla_gpu_experimental_enable_collective_multi_streaming``) two streams in turn
    in post-order, else all on stream 0. Pairs off the communication lane get None.
    Replay it with ``Simulator.run``."""
    pairs = tuple(pairs)
    streams = MULTI_STREAMING_COMMUNICATION_STREAMS if multi_streaming else 1
    found = execution_streams(module, pairs, communication_streams=streams).communication
    stream_of: dict[str, int | None] = {}
    for p in pairs:
        if not p.needs_stream:
            stream_of[p.key] = None
        elif p.sync:
            stream_of[p.key] = 0  # XLA 0.10.2 with a limit above 1: an async thunk on 0
        else:
            stream_of[p.key] = found.get(p.start, 0) % streams
    return StreamAssignment(streams=streams, policy="round-robin", stream_of=stream_of)


def post_order(comp: Computation) -> Iterator[Instruction]:
    """``MakeInstructionPostOrder``: depth first from each instruction without users (in
    the computation's order), operands left to right, control predecessors first."""
    used: set[str] = set()  # XLA's users(): data edges only, not control successors
    for inst in comp.instructions:
        used.update(inst.operand_names)
    visited: set[str] = set()
    for root in comp.instructions:
        if root.name in used or root.name in visited:
            continue
        # Iterative DFS: a node is emitted when met the second time.
        stack: list[tuple[Instruction, bool]] = [(root, False)]
        on_stack: set[str] = set()
        while stack:
            inst, expanded = stack.pop()
            if inst.name in visited:
                continue
            if expanded:
                visited.add(inst.name)
                yield inst
                continue
            if inst.name in on_stack:
                continue  # a cycle through control edges: XLA would reject the module
            on_stack.add(inst.name)
            stack.append((inst, True))
            # Popped last-in first-out: control predecessors are pushed last, so they
            # are visited before the operands, and operands are pushed in reverse so
            # the first is visited first (XLA pushes the same order on its stack).
            for name in reversed(inst.operand_names):
                operand = comp.get(name)
                if operand is not None and operand.name not in visited:
                    stack.append((operand, False))
            for name in _control_predecessors(inst):
                operand = comp.get(name)
                if operand is not None and operand.name not in visited:
                    stack.append((operand, False))


def _control_predecessors(inst: Instruction) -> list[str]:
    value = inst.attribute("control-predecessors")
    if not value:
        return []
    return [n.strip().lstrip("%") for n in value.strip("{}").split(",") if n.strip()]


def _scope_kind(inst: Instruction, pair: AsyncPair | None) -> str | None:
    opcode = inst.opcode
    if pair is not None:
        if pair.sync or pair.pipelined:
            return None
        return "communication"
    if opcode in ("send", "recv"):
        return "communication"
    if opcode.endswith("-start") and opcode.removesuffix("-start") in COLLECTIVE_OPCODES:
        return "communication"
    if opcode == "async-start":
        calls = inst.attribute("calls")
        callee = inst.computation.module.computation(calls.lstrip("%")) if calls else None
        if callee is not None and callee.root.opcode in COLLECTIVE_OPCODES:
            return "communication"
        return "compute"
    if opcode in ASYNC_COMPUTE_STARTS:
        return "compute"
    return None


def _annotation(inst: Instruction) -> int | None:
    attributes = decode(inst, "frontend_attributes", parse_frontend_attributes) or {}
    value = attributes.get(STREAM_ATTRIBUTE)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
