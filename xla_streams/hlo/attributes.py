"""Decoders for attribute values: replica groups in every printed form, source-target
pairs, frontend attributes, backend_config JSON, integer lists.

Each ``parse_*`` takes the raw value text and raises ScanError with an offset into
it; ``decode`` turns that into an HloError located in the instruction's line.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable
from typing import Any, TypeVar

from xla_streams.hlo.errors import HloError
from xla_streams.hlo.module import Instruction
from xla_streams.hlo.text import ScanError, find_closing, split_top_level

T = TypeVar("T")

Groups = tuple[tuple[int, ...], ...]

_INT_LIST = re.compile(r"\{\s*(-?\d+(?:\s*,\s*-?\d+)*)?\s*\}")
_IOTA = re.compile(r"\[(\d+),(\d+)\]<=\[(\d+(?:,\d+)*)\](?:T\((\d+(?:,\d+)*)\))?")
# mesh['a'=2,'b'=4][, device_ids=(0,4,...) | device_ids=([2,4]T(1,0))] {'b'}
_MESH = re.compile(r"mesh\[([^\]]*)\](?:, device_ids=\((.*)\))?\s*\{([^}]*)\}")
_DEVICE_IDS_IOTA = re.compile(r"\[(\d+(?:,\d+)*)\](?:T\((\d+(?:,\d+)*)\))?")
_MESH_AXIS = re.compile(r"'([^']+)'=(\d+)")
_AXIS_REF = re.compile(r"'([^']+)'(?::\((\d+)\)(\d+))?")
_FRONTEND_ITEM = re.compile(r'([A-Za-z_][\w.\-]*)=(?:"((?:[^"\\]|\\.)*)"|(\{.*\}))')


def decode(inst: Instruction, key: str, parser: Callable[[str], T]) -> T | None:
    """``parser`` applied to attribute ``key`` of ``inst`` (None when absent)."""
    value = inst.attribute(key)
    if value is None:
        return None
    try:
        return parser(value)
    except ScanError as e:
        raise inst.error_at_attribute(key, e.offset, f"bad {key}: {e.message}") from None


def parse_int_list(value: str) -> tuple[int, ...]:
    """``{1,0}`` -> (1, 0)."""
    m = _INT_LIST.fullmatch(value)
    if m is None:
        raise ScanError(0, f"expected a list of integers like '{{1,0}}', found '{value}'")
    body = m.group(1)
    return tuple(int(x) for x in body.split(",")) if body else ()


def parse_replica_groups(value: str) -> Groups:
    """Device groups from any printed form; ``()`` means one group of all devices.

    Forms: ``{{0,1},{2,3}}``, ``{}``, iota ``[2,4]<=[8]``, transposed iota
    ``[4,2]<=[2,4]T(1,0)`` and mesh axes ``mesh['x'=2,'y'=4] {'y'}`` (sub-axes
    ``'x':(pre)size``).
    """
    value = value.strip()
    if value.startswith("{"):
        return _explicit_groups(value)
    if value.startswith("["):
        return _iota_groups(value)
    if value.startswith("mesh["):
        return _mesh_groups(value)
    raise ScanError(0, "expected replica groups: '{{...}}', '[G,S]<=[dims]' or \"mesh[...] {...}\"")


def parse_source_target_pairs(value: str) -> tuple[tuple[int, int], ...]:
    """``{{0,1},{1,0}}`` -> ((0, 1), (1, 0))."""
    pairs = _explicit_groups(value)
    for group in pairs:
        if len(group) != 2:
            raise ScanError(0, f"expected {{source,target}} pairs, found a group of {len(group)}")
    return tuple((g[0], g[1]) for g in pairs)


def parse_frontend_attributes(value: str) -> dict[str, str]:
    """``{a="1",b={{0,1}}}`` -> {"a": "1", "b": "{{0,1}}"}.

    Values are kept as printed (escapes included); XLA prints a value that begins
    with ``{`` bare and any other quoted.
    """
    if not (value.startswith("{") and value.endswith("}")):
        raise ScanError(0, "expected '{key=\"value\",...}'")
    result = {}
    for a, b in split_top_level(value, 1, len(value) - 1):
        m = _FRONTEND_ITEM.fullmatch(value, a, b)
        if m is None:
            raise ScanError(a, f"expected key=\"value\" or key={{...}}, found '{value[a:b]}'")
        result[m.group(1)] = m.group(2) if m.group(2) is not None else m.group(3)
    return result


def format_frontend_attributes(attributes: dict[str, str]) -> str:
    """Inverse of parse_frontend_attributes, keys sorted as XLA prints them."""
    items = (f"{k}={v}" if _is_braced(v) else f'{k}="{v}"' for k, v in sorted(attributes.items()))
    return "{" + ",".join(items) + "}"


def _is_braced(value: str) -> bool:
    """One balanced ``{...}``: the values XLA prints without quotes."""
    if not value.startswith("{"):
        return False
    try:
        return find_closing(value, 0) == len(value) - 1
    except ScanError:
        return False


def parse_backend_config(value: str) -> dict[str, Any]:
    """The backend_config JSON object (XLA may also print it as a quoted JSON string)."""
    text = value
    if value.startswith('"'):
        try:
            text = json.loads(value)
        except json.JSONDecodeError as e:
            raise ScanError(e.pos, f"invalid JSON string: {e.msg}") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise ScanError(e.pos, f"invalid JSON: {e.msg}") from None
    if not isinstance(config, dict):
        raise ScanError(0, "expected a JSON object")
    return config


def _explicit_groups(value: str) -> Groups:
    if not (value.startswith("{") and value.endswith("}")):
        raise ScanError(0, "expected '{' ... '}'")
    groups = []
    for a, b in split_top_level(value, 1, len(value) - 1):
        try:
            groups.append(parse_int_list(value[a:b]))
        except ScanError as e:
            raise ScanError(a, e.message) from None
    return tuple(groups)


def _iota_groups(value: str) -> Groups:
    m = _IOTA.fullmatch(value)
    if m is None:
        raise ScanError(
            0, f"expected '[groups,size]<=[dims]' with optional 'T(perm)', found '{value}'"
        )
    num_groups, group_size = int(m.group(1)), int(m.group(2))
    dims = [int(d) for d in m.group(3).split(",")]
    perm = [int(p) for p in m.group(4).split(",")] if m.group(4) else list(range(len(dims)))
    if num_groups * group_size != math.prod(dims):
        raise ScanError(
            0,
            f"{num_groups}x{group_size} groups do not cover the {math.prod(dims)} devices of "
            f"{dims}",
        )
    if sorted(perm) != list(range(len(dims))):
        raise ScanError(
            m.start(4), f"T({m.group(4)}) is not a permutation of {len(dims)} dimensions"
        )
    flat = _transposed_iota(dims, perm)
    return tuple(tuple(flat[g * group_size : (g + 1) * group_size]) for g in range(num_groups))


def _mesh_groups(value: str) -> Groups:
    m = _MESH.fullmatch(value)
    if m is None:
        raise ScanError(0, "expected \"mesh['axis'=size,...] {'axis',...}\"")
    axes = [(name, int(size)) for name, size in _MESH_AXIS.findall(m.group(1))]
    sizes = dict(axes)
    devices = _mesh_devices(value, m, math.prod(sizes.values()))
    refs = []
    for a, b in split_top_level(value, m.start(3), m.end(3)):
        ref = _AXIS_REF.fullmatch(value, a, b)
        if ref is None or ref.group(1) not in sizes:
            raise ScanError(a, f"expected a mesh axis of {list(sizes)}, found '{value[a:b]}'")
        name, pre, size = ref.group(1), ref.group(2), ref.group(3)
        span = (1, sizes[name]) if pre is None else (int(pre), int(pre) * int(size))
        if sizes[name] % span[1]:
            raise ScanError(a, f"sub-axis '{value[a:b]}' does not divide axis size {sizes[name]}")
        refs.append((name, span))
    # Split each axis at the boundaries of its referenced sub-axes, major to minor,
    # so that every referenced (sub-)axis is a run of whole refined dimensions.
    refined: list[tuple[str, int, int]] = []  # (axis, lower boundary, factor)
    for name, size in axes:
        bounds = sorted({1, size} | {b for n, span in refs if n == name for b in span})
        refined.extend((name, lo, hi // lo) for lo, hi in itertools.pairwise(bounds))
    # refined dims are listed major-first per axis: boundaries grow toward the minor end.
    order: list[int] = []
    for name, (lo, hi) in refs:
        order.extend(
            i for i, (n, b, f) in enumerate(refined) if n == name and lo <= b and b * f <= hi
        )
    others = [i for i in range(len(refined)) if i not in order]
    dims = [f for _, _, f in refined]
    flat = [devices[i] for i in _transposed_iota(dims, others + order)]
    group_size = math.prod(dims[i] for i in order)
    return tuple(tuple(flat[g : g + group_size]) for g in range(0, len(flat), group_size))


def _mesh_devices(value: str, m: re.Match[str], count: int) -> list[int]:
    """The device at each mesh position, in row-major order (default: iota)."""
    text = m.group(2)
    if text is None:
        return list(range(count))
    if (iota := _DEVICE_IDS_IOTA.fullmatch(text)) is not None:
        dims = [int(d) for d in iota.group(1).split(",")]
        perm = (
            [int(p) for p in iota.group(2).split(",")] if iota.group(2) else list(range(len(dims)))
        )
        if sorted(perm) != list(range(len(dims))):
            raise ScanError(m.start(2), f"T({iota.group(2)}) is not a permutation of {dims}")
        devices = _transposed_iota(dims, perm)
    else:
        try:
            devices = list(parse_int_list("{" + text + "}"))
        except ScanError:
            raise ScanError(m.start(2), f"expected device ids, found '{text}'") from None
    if sorted(devices) != list(range(count)):
        raise ScanError(
            m.start(2), f"device_ids are not a permutation of the mesh's {count} devices"
        )
    return devices


def _transposed_iota(dims: list[int], perm: list[int]) -> list[int]:
    """iota(prod(dims)) reshaped to ``dims``, transposed by ``perm``, flattened."""
    strides = [math.prod(dims[i + 1 :]) for i in range(len(dims))]
    out_dims = [dims[p] for p in perm]
    out_strides = [strides[p] for p in perm]
    flat = [0]
    for size, stride in zip(out_dims, out_strides, strict=True):
        flat = [base + k * stride for base in flat for k in range(size)]
    return flat


def decode_or_error(inst: Instruction, key: str, parser: Callable[[str], T]) -> T:
    """Like ``decode`` but a missing attribute is an error too."""
    result = decode(inst, key, parser)
    if result is None:
        raise inst.error(f"expected attribute '{key}' on {inst.opcode}")
    return result


__all__ = [
    "Groups",
    "HloError",
    "decode",
    "decode_or_error",
    "format_frontend_attributes",
    "parse_backend_config",
    "parse_frontend_attributes",
    "parse_int_list",
    "parse_replica_groups",
    "parse_source_target_pairs",
]
