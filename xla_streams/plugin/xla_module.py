"""The bridge between XLA's serialized HloModuleProto and our HLO text.

The compile hook gets a proto; the passes read text. The way back depends on
what the passes changed. Annotations (frontend attributes) are written straight
into the proto by :func:`with_frontend_attributes`, so every other byte XLA
gave us, every attribute its text printer or parser would lose included, goes
back unchanged: jax 0.11/0.12 print an async all-reduce with
``output_to_operand_aliasing={{1}: (0, {})}``, which their own text parser
rejects. Only structural rewrites (ffi mode) go through XLA's text parser.

Two things get lost on the way to text unless handled here: large constants
(XLA prints them as ``{...}`` by default, and reads that back without their
values) and the device counts (the
proto carries no module config, so the printed header has no
``replica_count``/``num_partitions`` and every device group would look like one
device). The counts, and the device of each logical id, come from the proto's
static device assignment instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from xla_streams import jax_compat
from xla_streams._wire import field, varint_at


@dataclass(frozen=True)
class DeviceAssignment:
    """``HloModuleProto.device_assignment`` (field 15): a replicas x partitions grid."""

    replica_count: int
    num_partitions: int
    # The device of logical id replica * num_partitions + partition; () if incomplete.
    device_ids: tuple[int, ...]


def device_assignment(serialized: bytes) -> DeviceAssignment | None:
    """The static device assignment of a serialized module, if it has one."""
    assignment = _last(serialized, 15, bytes)
    if assignment is None:
        return None
    replicas = _last(assignment, 1, int) or 0
    partitions = _last(assignment, 2, int) or 0
    if not replicas or not partitions:
        return None
    # One ComputationDevice (field 3) per partition, listing the device of each replica.
    columns = [_int64s(v) for n, v in _fields(assignment) if n == 3 and isinstance(v, bytes)]
    ids = tuple(
        columns[p][r]
        for r in range(replicas)
        for p in range(partitions)
        if p < len(columns) and r < len(columns[p])
    )
    return DeviceAssignment(replicas, partitions, ids if len(ids) == replicas * partitions else ())


def device_assignment_field(assignment: DeviceAssignment) -> bytes:
    """``assignment`` serialized as field 15, to append to a module proto without one.

    A module XLA parsed from text has no device assignment; XLA's own compile
    serializes one. Benchmarks and tests use this to hand the hook what a
    real compile would.
    """
    message = field(1, assignment.replica_count) + field(2, assignment.num_partitions)
    ids = assignment.device_ids
    for p in range(assignment.num_partitions if ids else 0):
        column = ids[p :: assignment.num_partitions]
        message += field(3, b"".join(field(1, d) for d in column))
    return field(15, message)


def with_device_counts(text: str, assignment: DeviceAssignment | None) -> str:
    """``text`` with ``replica_count``/``num_partitions`` in its header when missing."""
    if assignment is None:
        return text
    first, newline, rest = text.partition("\n")
    additions = [
        f"{key}={value}"
        for key, value in (
            ("replica_count", assignment.replica_count),
            ("num_partitions", assignment.num_partitions),
        )
        if value > 1 and not re.search(rf"[ ,]{key}=", first)
    ]
    if not additions:
        return text
    return ", ".join([first, *additions]) + newline + rest


def print_options() -> Any:
    """XLA's default print options, but with large constants in full."""
    options = _hlo().HloPrintOptions()
    options.print_large_constants = True
    return options


def module_text(serialized: bytes) -> tuple[str, str]:
    """(module name, HLO text our passes can read and XLA reads back exactly)."""
    module = _hlo().HloModule.from_serialized_hlo_module_proto(serialized)
    text = module.to_string(print_options())
    return str(module.name), with_device_counts(str(text), device_assignment(serialized))


def to_proto(text: str) -> bytes:
    """HLO text parsed by XLA's own parser, serialized."""
    return bytes(_hlo().hlo_module_from_text(text).as_serialized_hlo_module_proto())


# HloModuleProto.computations, HloComputationProto.instructions,
# HloInstructionProto.name and .frontend_attributes, FrontendAttributes.map (xla/service/hlo.proto).
_MODULE_COMPUTATIONS = 3
_COMPUTATION_INSTRUCTIONS = 2
_INSTRUCTION_NAME = 1
_INSTRUCTION_FRONTEND_ATTRIBUTES = 68
_FRONTEND_ATTRIBUTES_MAP = 1


def with_frontend_attributes(serialized: bytes, edits: Mapping[str, Mapping[str, str]]) -> bytes:
    """``serialized`` with frontend attributes set on the instructions named in ``edits``.

    ``edits`` maps an instruction name to the keys to set (other keys stay).
    Every other field is copied byte for byte; raises KeyError naming an
    instruction that is not in the module.
    """
    remaining = set(edits)

    def instruction(data: bytes) -> bytes:
        name = _last(data, _INSTRUCTION_NAME, bytes)
        key = name.decode("utf-8") if name is not None else None
        if key not in remaining:
            return data
        assert key is not None
        remaining.discard(key)
        current: dict[bytes, bytes] = {}
        kept = bytearray()
        for number, value, raw in _raw_fields(data):
            if number != _INSTRUCTION_FRONTEND_ATTRIBUTES:
                kept += raw
                continue
            assert isinstance(value, bytes)
            for entry_number, entry in _fields(value):
                if entry_number == _FRONTEND_ATTRIBUTES_MAP and isinstance(entry, bytes):
                    current[_last(entry, 1, bytes) or b""] = _last(entry, 2, bytes) or b""
        for k, v in edits[key].items():
            current[k.encode("utf-8")] = v.encode("utf-8")
        entries = b"".join(
            field(_FRONTEND_ATTRIBUTES_MAP, field(1, k) + field(2, v))
            for k, v in sorted(current.items())
        )
        return bytes(kept) + field(_INSTRUCTION_FRONTEND_ATTRIBUTES, entries)

    out = _map_submessages(
        serialized,
        _MODULE_COMPUTATIONS,
        lambda comp: _map_submessages(comp, _COMPUTATION_INSTRUCTIONS, instruction),
    )
    if remaining:
        raise KeyError(f"no instruction named {sorted(remaining)[0]!r} in the module")
    return out


def _map_submessages(data: bytes, number: int, change: Callable[[bytes], bytes]) -> bytes:
    """``data`` with each length-delimited field ``number`` replaced by ``change(value)``."""
    out = bytearray()
    for n, value, raw in _raw_fields(data):
        if n == number and isinstance(value, bytes):
            new = change(value)
            out += raw if new is value else field(n, new)
        else:
            out += raw
    return bytes(out)


def _hlo() -> Any:
    return jax_compat.hlo_bindings()


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of each top-level varint or length-delimited field."""
    for number, value, _ in _raw_fields(data):
        if value is not None:
            yield number, value


def _raw_fields(data: bytes) -> Iterator[tuple[int, int | bytes | None, bytes]]:
    """(field number, value, the field's bytes as stored) of each top-level field;
    the value is None for fixed-size fields, which nothing here reads."""
    i = 0
    while i < len(data):
        begin = i
        key, i = varint_at(data, i)
        number, wire = key >> 3, key & 7
        value: int | bytes | None
        if wire == 0:
            value, i = varint_at(data, i)
        elif wire == 2:
            size, i = varint_at(data, i)
            value = data[i : i + size]
            i += size
        elif wire == 1:
            value, i = None, i + 8
        elif wire == 5:
            value, i = None, i + 4
        else:  # groups: HloModuleProto has none
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if i > len(data):
            raise ValueError("truncated protobuf message")
        yield number, value, data[begin:i]


def _last[T](data: bytes, number: int, kind: type[T]) -> T | None:
    found = None
    for n, value in _fields(data):
        if n == number and isinstance(value, kind):
            found = value
    return found


def _int64s(message: bytes) -> list[int]:
    """Repeated int64 field 1 of a message, packed or not."""
    values: list[int] = []
    for number, value in _fields(message):
        if number != 1:
            continue
        if isinstance(value, int):
            values.append(value)
            continue
        i = 0
        while i < len(value):
            v, i = varint_at(value, i)
            values.append(v)
    return values
