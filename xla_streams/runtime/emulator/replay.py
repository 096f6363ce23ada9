"""Replay scripts: a program lowered for the CUDA runtime, as ``xsim-replay`` plays it.

:func:`plan` walks a module that ``lower-to-ffi`` lowered for the CUDA runtime
(``build_pipeline(K, runtime="cuda")``) in schedule order, while bodies unrolled
``trips`` times, and gives every device the calls XLA:GPU would make: before
each start a producer kernel writes its operands on the compute stream, after
each done a consumer kernel reads its results and compares them with what the
collective must give, and then the buffers go back to the allocator, which
hands them to the next buffer of their size (XLA's allocator reuses memory the
same way). Buffers are scaled down to at most ``max_elements`` per member (the
runtime reads only element counts) and hold small integers, so every result is
exact in every element type and order of reduction.

:meth:`Plan.script` writes one process's script (a multi-process job gets one
per process, ``devices_per_process`` each, meeting through a key-value
directory). The format is read by ``csrc/replay.cc``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from xla_streams.hlo import Instruction, Module, Shape, parse_module
from xla_streams.runtime.abi import DONE_TARGET, START_TARGET, CollectiveCall, parse_attributes

NUMPY_TYPES = {
    "f32": np.float32,
    "f64": np.float64,
    "f16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "s8": np.int8,
    "s32": np.int32,
    "s64": np.int64,
    "u8": np.uint8,
    "u32": np.uint32,
    "u64": np.uint64,
    "pred": np.bool_,
}


@dataclass(frozen=True)
class Call:
    """One start or done as a device makes it: its instance (the j-th start of
    the program, loops unrolled) and the call's attributes."""

    what: str  # start | done
    instance: int
    call: CollectiveCall
    done_attributes: dict[str, int | str | tuple[int, ...]]
    operand_types: tuple[str, ...]
    operand_counts: tuple[int, ...]
    result_counts: tuple[int, ...]


@dataclass
class Plan:
    """Every device's calls, and the buffers and values that go with them."""

    devices: int
    calls: list[Call] = field(default_factory=list)  # one program, the same on every device

    def script(
        self,
        *,
        process: int = 0,
        devices_per_process: int | None = None,
        timeout_ms: int = 0,
        kv: str = "",
        skip: frozenset[tuple[int, int]] = frozenset(),
        at_ms: dict[int, int] | None = None,
        configure: dict[str, int] | None = None,
    ) -> str:
        """The script of one process (its devices are ``process * devices_per_process``
        onward, its local ordinals from 0). ``skip``: (device, instance) pairs whose
        start and done that device never calls (a device that never arrives);
        ``at_ms``: instance -> when, in milliseconds from the replay's start, every
        device makes that start (a later execution: a failed call skips the rest of
        its device's execution, as XLA stops one); ``configure``: emulator settings
        (``xsim_configure``: residency, connections, ...)."""
        per = devices_per_process or self.devices
        local = range(process * per, (process + 1) * per)
        lines = [f"# {len(self.calls)} calls on each of {self.devices} devices"]
        lines += [f"configure {key} {value}" for key, value in (configure or {}).items()]
        if timeout_ms:
            lines.append(f"timeout_ms {timeout_ms}")
        if per != self.devices:
            lines.append(f"process {process} {self.devices // per}")
            lines += [f"global {d - local.start} {d}" for d in local]
            lines.append(f"kv {kv}")
        inputs = self._inputs()
        for device in local:
            lines += self._buffers(device, inputs)
        for device in local:
            lines.append(f"thread {device - local.start}")
            lines += self._steps(device, inputs, skip, at_ms or {})
        return "\n".join(lines) + "\n"

    # -- values ---------------------------------------------------------------------

    def _inputs(self) -> dict[tuple[int, int], list[np.ndarray]]:
        """(device, instance) -> the start's operands, as the producer writes them."""
        inputs = {}
        for c in self.calls:
            if c.what != "start":
                continue
            for device in range(self.devices):
                inputs[device, c.instance] = [
                    _values(t, n, seed=device * 7 + c.instance * 3 + i * 5)
                    for i, (t, n) in enumerate(zip(c.operand_types, c.operand_counts, strict=True))
                ]
        return inputs

    def _expected(
        self, c: Call, device: int, inputs: dict[tuple[int, int], list[np.ndarray]]
    ) -> list[np.ndarray]:
        call = c.call
        mine = inputs[device, c.instance]
        kind = call.kind
        if kind == "collective-permute":
            pairs = _groups(call)
            out = [np.zeros_like(a) for a in mine]
            for source, target in pairs:
                if target == device:
                    out = [a.copy() for a in inputs[source, c.instance]]
            return out
        members = next(g for g in _groups(call) if device in g)
        rank, n = members.index(device), len(members)
        theirs = [inputs[m, c.instance] for m in members]
        if kind == "all-reduce":
            return [_reduce(call.reduction, [t[i] for t in theirs]) for i in range(len(mine))]
        if kind == "all-gather":
            return [np.concatenate([t[i] for t in theirs]) for i in range(len(mine))]
        if kind == "reduce-scatter":
            out = []
            for i in range(len(mine)):
                chunk = len(mine[i]) // n
                parts = [t[i][rank * chunk : (rank + 1) * chunk] for t in theirs]
                out.append(_reduce(call.reduction, parts))
            return out
        if kind == "all-to-all":
            if call.dimension < 0:  # one operand per member: operand p goes to member p
                return [theirs[p][rank].copy() for p in range(n)]
            out = []
            for i in range(len(mine)):
                chunk = len(mine[i]) // n
                blocks = [t[i][rank * chunk : (rank + 1) * chunk] for t in theirs]
                out.append(np.concatenate(blocks))
            return out
        raise ValueError(f"no expectation for {kind}")

    # -- script lines -----------------------------------------------------------------

    def _buffers(self, device: int, inputs: dict[tuple[int, int], list[np.ndarray]]) -> list[str]:
        lines = []
        for c in self.calls:
            if c.what != "start":
                continue
            for i, array in enumerate(inputs[device, c.instance]):
                lines.append(
                    f"buffer {_name(device, c, 'in', i)} {c.operand_types[i]} {array.nbytes}"
                )
            for i, count in enumerate(c.result_counts):
                element_type = c.operand_types[i]
                width = np.dtype(NUMPY_TYPES[element_type]).itemsize
                lines.append(f"buffer {_name(device, c, 'out', i)} {element_type} {count * width}")
        return lines

    def _steps(
        self,
        device: int,
        inputs: dict[tuple[int, int], list[np.ndarray]],
        skip: frozenset[tuple[int, int]],
        at_ms: dict[int, int],
    ) -> Iterator[str]:
        for c in self.calls:
            if c.what == "start" and c.instance in at_ms:
                yield f"at {at_ms[c.instance]}"
            if (device, c.instance) in skip:
                continue
            ins = [_name(device, c, "in", i) for i in range(len(c.operand_counts))]
            outs = [_name(device, c, "out", i) for i in range(len(c.result_counts))]
            yield f"label {c.call.name} (op {c.call.op_id} {c.what}, stream={c.call.stream})"
            if c.what == "start":
                for name, array in zip(ins, inputs[device, c.instance], strict=True):
                    yield f"fill {name} {_text(array)}"
                attributes = _attributes(c.call.start_attributes())
                yield f"start {' '.join(ins)} -> {' '.join(outs)} | {attributes}"
            else:
                attributes = _attributes(c.done_attributes)
                yield f"done {' '.join(outs + ins)} -> {' '.join(outs)} | {attributes}"
                for name, array in zip(outs, self._expected(c, device, inputs), strict=True):
                    yield f"check {name} {_text(array)}"
                yield f"free {' '.join(ins + outs)}"


def plan(module: Module | str, *, devices: int, trips: int = 2, max_elements: int = 64) -> Plan:
    """The replay of a module lowered for the CUDA runtime (its starts and dones in
    schedule order, while bodies ``trips`` times) on ``devices`` devices."""
    if isinstance(module, str):
        module = parse_module(module)
    calls: list[Call] = []
    instances: dict[int, list[int]] = {}  # op_id -> instances started, not yet done
    for inst in _schedule(module, module.entry.name, trips):
        config = inst.attribute("backend_config") or "{}"
        target = inst.attribute("custom_call_target")
        call = CollectiveCall.parse(config) if target == f'"{START_TARGET}"' else None
        if call is not None:
            instance = sum(1 for c in calls if c.what == "start")
            instances.setdefault(call.op_id, []).append(instance)
            calls.append(_start(inst, call, instance, max_elements))
            continue
        done = parse_attributes(config)
        op_id = done["op_id"]
        assert isinstance(op_id, int)
        start = next(c for c in calls if c.what == "start" and c.instance == instances[op_id][0])
        instances[op_id].pop(0)
        calls.append(
            Call(
                "done",
                start.instance,
                start.call,
                done,
                start.operand_types,
                start.operand_counts,
                start.result_counts,
            )
        )
    return Plan(devices, calls)


def _schedule(module: Module, computation: str, trips: int) -> Iterator[Instruction]:
    """The ffi starts and dones of a computation in schedule order, while bodies
    and called computations unrolled."""
    comp = module.computation(computation)
    assert comp is not None, computation
    for inst in comp.instructions:
        if inst.opcode == "custom-call" and inst.attribute("custom_call_target") in (
            f'"{START_TARGET}"',
            f'"{DONE_TARGET}"',
        ):
            yield inst
        elif inst.opcode == "while":
            body = (inst.attribute("body") or "").lstrip("%")
            for _ in range(trips):
                yield from _schedule(module, body, trips)
        elif inst.opcode == "call":
            yield from _schedule(module, (inst.attribute("to_apply") or "").lstrip("%"), trips)


def _start(inst: Instruction, call: CollectiveCall, instance: int, max_elements: int) -> Call:
    shapes = inst.operand_shapes
    types = tuple(_element_type(s) for s in shapes)
    n = max(call.group_sizes, default=1)
    originals = [max(1, math.prod(s.dimensions)) for s in shapes]
    kind = call.kind
    operands, results = [], []
    for count in originals:
        if kind == "all-gather":
            k = min(count, max_elements)
            operands.append(k)
            results.append(k * n)
        elif kind == "reduce-scatter":
            k = max(1, min(count // n, max_elements))
            operands.append(k * n)
            results.append(k)
        elif kind == "all-to-all" and call.dimension >= 0:
            k = max(1, min(count // n, max_elements))
            operands.append(k * n)
            results.append(k * n)
        else:  # all-reduce, collective-permute, a tuple all-to-all's operand
            k = min(count, max_elements)
            operands.append(k)
            results.append(k)
    return Call("start", instance, call, {}, types, tuple(operands), tuple(results))


def _element_type(shape: Shape) -> str:
    if shape.element_type is None or shape.element_type not in NUMPY_TYPES:
        raise ValueError(f"the replay has no element type for {shape}")
    return shape.element_type


def _groups(call: CollectiveCall) -> list[list[int]]:
    groups, at = [], 0
    for size in call.group_sizes:
        groups.append(list(call.groups[at : at + size]))
        at += size
    return groups


def _values(element_type: str, count: int, seed: int) -> np.ndarray:
    dtype = NUMPY_TYPES[element_type]
    base = (np.arange(count) * 3 + seed) % 9
    if element_type == "pred":
        return (base % 2).astype(dtype)
    if element_type.startswith("u"):
        return base.astype(dtype)
    return (base - 4).astype(dtype)


def _reduce(reduction: str, parts: list[np.ndarray]) -> np.ndarray:
    op = {"add": np.add, "multiply": np.multiply, "max": np.maximum, "min": np.minimum}[reduction]
    if parts[0].dtype == np.bool_:
        op = np.logical_or if reduction in ("add", "max", "or") else np.logical_and
    out = parts[0].copy()
    for p in parts[1:]:
        out = op(out, p).astype(parts[0].dtype)
    return out


def _text(array: np.ndarray) -> str:
    values = array.astype(np.float64) if array.dtype != np.bool_ else array.astype(np.int64)
    return " ".join(f"{v:g}" for v in values.tolist())


def _name(device: int, c: Call, side: str, index: int) -> str:
    return f"d{device}.i{c.instance}.{side}{index}"


def _attributes(items: dict[str, int | str | tuple[int, ...]]) -> str:
    out = []
    for key, value in items.items():
        if isinstance(value, int):
            out.append(f"{key}=i:{value}")
        elif isinstance(value, str):
            out.append(f"{key}=s:{value}")
        else:
            out.append(f"{key}=a:{','.join(map(str, value))}")
    return " ".join(out)


__all__ = ["Call", "Plan", "plan"]
