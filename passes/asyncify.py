"""asyncify: split XLA:CPU's synchronous collectives into start/done pairs.

XLA:CPU keeps every collective synchronous. For ffi mode on CPU each
all-reduce, all-gather, reduce-scatter, all-to-all and collective-permute that
the host runtime can run becomes XLA's own async form, the start where the
collective stood and the done just before its first user (a done that is the
computation's result goes last)::

    %x = f32[8]{0} all-reduce(%a), ...      ->   %x-start = f32[8]{0} all-reduce-start(%a), ...
    %y = f32[8]{0} exp(%b)                        %y = f32[8]{0} exp(%b)
    %z = f32[8]{0} add(%x, %y)                    %x = f32[8]{0} all-reduce-done(%x-start)
                                                  %z = f32[8]{0} add(%x, %y)

so that compute scheduled in between runs while the collective is in flight.
The done keeps the collective's name, so users need no rewriting. reduce-scatter
and all-to-all use the sugared ``reduce-scatter-start`` spelling XLA prints and
parses. The result is one IR for the rest of the pipeline: find-async-pairs
reads these pairs like any other, and lower-to-ffi turns them into the runtime's
custom calls (XLA:CPU itself cannot run async collectives). Facts about pairs
established before this pass no longer hold, so it withdraws them.
"""

from __future__ import annotations

from dataclasses import dataclass

from xla_streams.collectives import KINDS
from xla_streams.hlo import Computation, Instruction, Module
from xla_streams.passes.base import Compilation, Fact, ModulePass
from xla_streams.passes.lower_to_ffi import plan_collective
from xla_streams.runtime.abi import FFI_KINDS

_STALE = frozenset(
    {Fact.ASYNC_PAIRS, Fact.STREAMS_ASSIGNED, Fact.STREAMS_VERIFIED, Fact.STREAMS_ANNOTATED}
)


@dataclass(frozen=True)
class Asyncify(ModulePass):
    name = "asyncify"

    def run(self, compilation: Compilation) -> None:
        if asyncify(compilation.module):
            compilation.pairs = ()
            compilation.assignment = None
            compilation.facts -= _STALE


def asyncify(module: Module) -> list[str]:
    """Split every collective the host runtime can run; returns the names split."""
    split: list[str] = []
    for comp in module.computations:
        split.extend(_asyncify_computation(module, comp))
    return split


def _asyncify_computation(module: Module, comp: Computation) -> list[str]:
    candidates = [
        inst
        for inst in comp.instructions
        if inst.opcode in FFI_KINDS
        and not isinstance(
            plan_collective(
                module,
                inst,
                inst.opcode,
                inst.operand_shape_texts,
                inst.shape_text,
                "host",
            ),
            str,
        )
    ]
    if not candidates:
        return []
    position = {inst.name: i for i, inst in enumerate(comp.instructions)}
    first_user = _first_users(comp, {c.name for c in candidates}, position)
    end = len(comp.instructions)
    dones_before: dict[int, list[Instruction]] = {}
    starts: dict[str, Instruction] = {}
    for c in candidates:
        start, done = _split(comp, c)
        starts[c.name] = start
        at = first_user.get(c.name, end if c.is_root else position[c.name] + 1)
        dones_before.setdefault(at, []).append(done)
    schedule: list[Instruction] = []
    for i, inst in enumerate(comp.instructions):
        schedule.extend(dones_before.get(i, []))
        schedule.append(starts.get(inst.name, inst))
    schedule.extend(dones_before.get(end, []))
    comp.reschedule(schedule)
    return [c.name for c in candidates]


def _first_users(comp: Computation, names: set[str], position: dict[str, int]) -> dict[str, int]:
    """Schedule index of the first user (operand or control successor) of each name."""
    first: dict[str, int] = {}
    for i, inst in enumerate(comp.instructions):
        referenced = set(inst.operand_names)
        control = inst.attribute("control-predecessors")
        if control:
            referenced |= {
                n.strip().lstrip("%") for n in control.strip("{}").split(",") if n.strip()
            }
        for name in referenced & names:
            if name not in first and i > position[name]:
                first[name] = i
    return first


def _split(comp: Computation, c: Instruction) -> tuple[Instruction, Instruction]:
    kind = c.opcode
    operand_shapes = c.operand_shape_texts
    ins = operand_shapes[0] if len(operand_shapes) == 1 else f"({', '.join(operand_shapes)})"
    if KINDS[kind].async_form == "wrapped":  # the wrapper's ((operands), result)
        start_shape = f"(({', '.join(operand_shapes)}), {c.shape_text})"
    elif kind == "all-reduce":  # reduces in place: the start holds the result
        start_shape = c.shape_text
    else:  # all-gather, collective-permute: (operand, result)
        start_shape = f"({ins}, {c.shape_text})"
    start_name = comp.module.unique_name(f"{c.name}-start")
    start = Instruction.create(
        comp, start_name, start_shape, f"{kind}-start", c.operands_text, dict(c.attributes)
    )
    done_attributes = {}
    if c.attribute("metadata") is not None:
        done_attributes["metadata"] = c.attributes["metadata"]
    done = Instruction.create(
        comp, c.name, c.shape_text, f"{kind}-done", f"%{start_name}", done_attributes,
        is_root=c.is_root,
    )  # fmt: skip
    return start, done
