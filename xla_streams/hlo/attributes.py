"""Decoders for attribute values: replica groups in every printed form, source-target
pairs, frontend attributes, backend_config JSON, integer lists, the computations an
instruction calls (and which of them run as control flow).

Each ``parse_*`` takes the raw value text and raises ScanError with an offset into
it; ``decode`` turns that into an HloError located in the instruction's line.

Device lists are expanded from counts the text declares (``[1,300000000]<=[...]``,
``mesh['a'=99999999999]``), so every count is checked against MAX_DEVICES before
anything is built from it, and every scan is linear in the value's length.
"""

from __future__ import annotations

import itertools
import re
from functools import lru_cache

from xla_streams.hlo.errors import HloError
from xla_streams.hlo.text import (
    WHITESPACE,
    ScanError,
    blank_comments,
    excerpt,
    find_closing,
    parse_int,
    split_top_level,
)

TYPE_CHECKING = False  # not typing's, nor json at import: the command line's start-up counts
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any, Protocol

    class _Attributed(Protocol):
        """What decoding needs of an instruction (``module.Instruction`` is one); named
        structurally so that this module, which ``module.py`` imports, imports nothing back."""

        @property
        def opcode(self) -> str: ...
        def attribute(self, key: str) -> str | None: ...
        def error_at_attribute(self, key: str, offset: int, message: str) -> HloError: ...


Groups = tuple[tuple[int, ...], ...]
# The most devices one module may address: replica_count x num_partitions, and
# the size of any iota or mesh device list. Passes expand these counts into
# device lists, so without a bound a 40-byte header (`replica_count=99999999999`)
# costs unbounded time and memory. 65536 is above any single XLA program today
# (the largest jobs run tens of thousands of GPUs); raise it here if one needs more.
MAX_DEVICES = 65536

# Whitespace may sit between any two tokens (XLA's lexer skips it); every
# pattern below is unambiguous, so a failed match costs one pass over the text.
_INT_LIST = re.compile(r"\{\s*(?:(-?\d+(?:\s*,\s*-?\d+)*)\s*)?\}")
_INT = re.compile(r"-?\d+")
_INT_SEQ = r"\d+(?:\s*,\s*\d+)*"
_TRANSPOSE = rf"(?:T\s*\(\s*({_INT_SEQ})\s*\)\s*)?"
_IOTA = re.compile(rf"\[\s*(\d+)\s*,\s*(\d+)\s*\]\s*<=\s*\[\s*({_INT_SEQ})\s*\]\s*{_TRANSPOSE}")
_DEVICE_IDS_IOTA = re.compile(rf"\s*\[\s*({_INT_SEQ})\s*\]\s*{_TRANSPOSE}")
_MESH_AXIS = re.compile(r"'([^']+)'\s*=\s*(\d+)")
_AXIS_REF = re.compile(r"'([^']+)'(?:\s*:\s*\(\s*(\d+)\s*\)\s*(\d+))?")
_FRONTEND_ITEM = re.compile(r'([A-Za-z_][\w.\-]*)=(?:"((?:[^"\\]|\\.)*)"|(\{.*\}))')
_MESH_FORM = "expected \"mesh['axis'=size,...] {'axis',...}\""
_COMPUTATION = re.compile(r"%?([^\s(){}%,]+)")  # as a computation's header names it
_CLOSER = {"[": "]", "(": ")", "{": "}"}

# Control-flow instructions and the attributes naming the computations they run as
# part of themselves, in the order they run them (a while's condition before its
# body; one branch of a conditional). Fusions, reducers and async wrappers are not
# control flow.
CONTROL_FLOW_CALLEES: dict[str, tuple[str, ...]] = {
    "while": ("condition", "body"),
    "conditional": ("branch_computations", "true_computation", "false_computation"),
    "call": ("to_apply",),
}


def decode[T](inst: _Attributed, key: str, parser: Callable[[str], T]) -> T | None:
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
        raise ScanError(0, f"expected a list of integers like '{{1,0}}', found '{excerpt(value)}'")
    return tuple(parse_int(n.group(), n.start()) for n in _INT.finditer(value, 0, m.end(1)))


def parse_computation_names(value: str) -> tuple[str, ...]:
    """The computations an attribute names, without ``%``: one (``calls=%c``,
    ``to_apply=``, ``body=``...) or a braced list (``branch_computations={%a, %b}``,
    ``called_computations=``); at least one."""
    start = len(value) - len(value.lstrip(WHITESPACE))
    end = len(value.rstrip(WHITESPACE))
    braced = value.startswith("{", start) and value.endswith("}", start, end) and end > start + 1
    if braced and "=" in value:
        raise ScanError(
            start, "an inline computation ('{...}' holding instructions): this front end reads "
            "computations defined on their own, before the instructions that call them",
        )  # fmt: skip
    spans = split_top_level(value, start + 1, end - 1) if braced else [(start, end)]
    names = []
    for a, b in spans:
        m = _COMPUTATION.fullmatch(value, a, b)
        if m is None:
            raise ScanError(a, f"expected a computation name, found '{excerpt(value[a:b])}'")
        names.append(m.group(1))
    if not names:
        raise ScanError(0, "expected at least one computation name")
    return tuple(names)


def control_flow_callees(inst: _Attributed) -> list[tuple[str, str]]:
    """(attribute, computation) for each computation ``inst`` runs as control flow
    (:data:`CONTROL_FLOW_CALLEES`), in the order it runs them."""
    return [
        (key, name)
        for key in CONTROL_FLOW_CALLEES.get(inst.opcode, ())
        for name in decode(inst, key, parse_computation_names) or ()
    ]


# A module repeats a few distinct group texts on every collective (one per mesh axis it
# reduces over), and expanding an iota or mesh form is the dearest decoding there is.
# Small: each entry may hold up to MAX_DEVICES ids.
@lru_cache(maxsize=16)
def parse_replica_groups(value: str) -> Groups:
    """Device groups from any printed form; ``()`` means one group of all devices.

    Forms: ``{{0,1},{2,3}}``, ``{}``, iota ``[2,4]<=[8]``, transposed iota
    ``[4,2]<=[2,4]T(1,0)`` and mesh axes ``mesh['x'=2,'y'=4] {'y'}`` (sub-axes
    ``'x':(pre)size``), with whitespace and ``/*...*/`` comments between tokens.
    """
    text = blank_comments(value)  # XLA's lexer skips comments; offsets stay put
    start = len(text) - len(text.lstrip(WHITESPACE))
    body = text.strip(WHITESPACE)
    try:
        if body.startswith("{"):
            return _distinct_groups(body)
        if body.startswith("["):
            return _iota_groups(body)
        if body.startswith("mesh"):
            return _mesh_groups(body)
    except ScanError as e:
        raise ScanError(start + e.offset, e.message) from None
    raise ScanError(0, "expected replica groups: '{{...}}', '[G,S]<=[dims]' or \"mesh[...] {...}\"")


def parse_source_target_pairs(value: str) -> tuple[tuple[int, int], ...]:
    """``{{0,1},{1,0}}`` -> ((0, 1), (1, 0)).

    Each device is a source at most once and a target at most once (XLA's
    verifier rejects repeats), so the pairs never outnumber the devices.
    """
    pairs = _explicit_groups(value)
    sources: set[int] = set()
    targets: set[int] = set()
    for at, group in pairs:
        if len(group) != 2:
            raise ScanError(0, f"expected {{source,target}} pairs, found a group of {len(group)}")
        source, target = group
        if source < 0 or target < 0:
            raise ScanError(at, f"negative device id in {{{source},{target}}}")
        for device, seen, role in ((source, sources, "source"), (target, targets, "target")):
            if device in seen:
                raise ScanError(at, f"device {device} is a {role} in more than one pair")
            seen.add(device)
    return tuple((g[0], g[1]) for _, g in pairs)


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
            raise ScanError(
                a, f"expected key=\"value\" or key={{...}}, found '{excerpt(value[a:b])}'"
            )
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
    text = _json(value, "invalid JSON string") if value.startswith('"') else value
    if not isinstance(text, str):
        raise ScanError(0, "expected a JSON object")
    config = _json(text, "invalid JSON")
    if not isinstance(config, dict):
        raise ScanError(0, "expected a JSON object")
    return config


def _json(text: str, what: str) -> Any:
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ScanError(e.pos, f"{what}: {e.msg}") from None
    except (ValueError, RecursionError) as e:
        # A number past Python's 4300-digit limit, or nesting past the recursion limit.
        raise ScanError(0, f"{what}: {excerpt(str(e))}") from None


def _explicit_groups(value: str) -> list[tuple[int, tuple[int, ...]]]:
    """``{{0,1},{2,3}}`` -> [(offset of each group, its ids)]."""
    if not (value.startswith("{") and value.endswith("}")):
        raise ScanError(0, "expected '{' ... '}'")
    groups = []
    for a, b in split_top_level(value, 1, len(value) - 1):
        try:
            groups.append((a, parse_int_list(value[a:b])))
        except ScanError as e:
            raise ScanError(a + e.offset, e.message) from None
    return groups


def _distinct_groups(value: str) -> Groups:
    """Explicit groups, each id once and no group empty (XLA's verifier rejects both)."""
    groups = _explicit_groups(value)
    seen: set[int] = set()
    for at, group in groups:
        if not group:
            raise ScanError(at, "empty replica group")
        for device in group:
            if device < 0:
                raise ScanError(at, f"negative device id {device}")
            if device in seen:
                raise ScanError(at, f"device {device} is in more than one replica group")
            seen.add(device)
    return tuple(group for _, group in groups)


def _iota_groups(value: str) -> Groups:
    m = _IOTA.fullmatch(value)
    if m is None:
        raise ScanError(
            0,
            f"expected '[groups,size]<=[dims]' with optional 'T(perm)', found '{excerpt(value)}'",
        )
    num_groups, group_size = parse_int(m.group(1), m.start(1)), parse_int(m.group(2), m.start(2))
    if num_groups < 1 or group_size < 1:
        raise ScanError(0, f"{num_groups}x{group_size} groups: expected at least one device each")
    if num_groups * group_size > MAX_DEVICES:
        raise ScanError(
            0,
            f"{num_groups}x{group_size} groups address more than the {MAX_DEVICES} devices "
            "a module may address (MAX_DEVICES)",
        )
    dims = [parse_int(d, m.start(3)) for d in m.group(3).split(",")]
    devices = _bounded_product(dims)
    if devices != num_groups * group_size:
        covered = "more than MAX_DEVICES" if devices is None else str(devices)
        raise ScanError(
            0,
            f"{num_groups}x{group_size} groups do not cover the {covered} devices of "
            f"{excerpt(str(dims))}",
        )
    perm = _permutation(m.group(4), m.start(4), len(dims))
    flat = _transposed_iota(dims, perm)
    return tuple(itertools.batched(flat, group_size))


def _mesh_groups(value: str) -> Groups:
    """``mesh['a'=2,'b'=4][, device_ids=(...)] {'b'}``: groups over the listed (sub-)axes."""
    axes_open, axes_close, devices_span, refs_open, refs_close = _mesh_layout(value)
    sizes = _mesh_axes(value, axes_open, axes_close)
    count = _bounded_product(sizes.values())
    assert count is not None  # _mesh_axes checked it
    devices = _mesh_devices(value, devices_span, count)
    refs = _axis_refs(value, refs_open, refs_close, sizes)
    # Split each axis at the boundaries of its referenced sub-axes, major to minor,
    # so that every referenced (sub-)axis is a run of whole refined dimensions.
    cuts: dict[str, set[int]] = {}  # axis -> its bounds, for the referenced axes
    first_at: dict[str, int] = {}  # axis -> where its first reference is written
    for name, span, at in refs:
        if name not in cuts:
            cuts[name], first_at[name] = {1, sizes[name]}, at
        cuts[name].update(span)
    refined: list[int] = []  # sizes of the refined dimensions, mesh-major first
    where: dict[str, tuple[int, list[int]]] = {}  # axis -> (its first refined index, bounds)
    for name, size in sizes.items():
        bounds = sorted(cuts.get(name) or {1, size})
        where[name] = (len(refined), bounds)
        for lo, hi in itertools.pairwise(bounds):
            if hi % lo:
                raise ScanError(first_at[name], f"sub-axes of mesh axis '{name}' overlap")
            refined.append(hi // lo)
    # Refined dimensions of the grouped axes, in the order listed (each at most once).
    order: list[int] = []
    chosen: set[int] = set()
    for name, (lo, hi), at in refs:
        first, bounds = where[name]
        run = range(first + bounds.index(lo), first + bounds.index(hi))
        if chosen.intersection(run):
            raise ScanError(at, "mesh axes to group over overlap")
        chosen.update(run)
        order.extend(run)
    others = [i for i in range(len(refined)) if i not in chosen]
    flat = _transposed_iota(refined, others + order)
    if devices is not None:
        flat = [devices[i] for i in flat]
    group_size = 1
    for i in order:
        group_size *= refined[i]
    return tuple(itertools.batched(flat, group_size))


def _mesh_layout(value: str) -> tuple[int, int, tuple[int, int] | None, int, int]:
    """Where the parts of a mesh form are.

    Returns the offsets of the ``[`` and ``]`` around the axes, the span of the
    device_ids text (None when absent) and of the ``{`` and ``}`` around the
    grouped axes. The insides are split later by split_top_level, which checks
    that their brackets pair up.
    """
    try:
        axes_open = _skip(value, len("mesh"))
        axes_close = _closing(value, axes_open, "[")
        pos = _skip(value, axes_close + 1)
        devices = None
        if value.startswith(",", pos):
            pos = _skip(value, pos + 1)
            if value.startswith("device_ids", pos):
                pos = _skip(value, pos + len("device_ids"))
                if value.startswith("=", pos):
                    pos = _skip(value, pos + 1)
            close = _closing(value, pos, "(")
            devices = (pos + 1, close)
            pos = _skip(value, close + 1)
        refs_close = _closing(value, pos, "{")
    except ScanError as e:
        raise ScanError(0, f"{_MESH_FORM} ({e.message})") from None
    if refs_close + 1 != len(value):
        raise ScanError(refs_close + 1, f"unexpected '{excerpt(value[refs_close + 1 :])}'")
    return axes_open, axes_close, devices, pos, refs_close


def _closing(value: str, at: int, opener: str) -> int:
    """Index of the bracket closing ``opener`` at ``value[at]``."""
    if not value.startswith(opener, at):
        raise ScanError(at, f"expected '{opener}'")
    close = find_closing(value, at)
    closer = _CLOSER[opener]
    if value[close] != closer:
        raise ScanError(close, f"unbalanced '{value[close]}': expected '{closer}'")
    return close


def _mesh_axes(value: str, axes_open: int, axes_close: int) -> dict[str, int]:
    """``['a'=2,'b'=4]`` -> {"a": 2, "b": 4}: distinct names, positive sizes, few devices."""
    sizes: dict[str, int] = {}
    count = 1
    for a, b in split_top_level(value, axes_open + 1, axes_close):
        m = _MESH_AXIS.fullmatch(value, a, b)
        if m is None:
            raise ScanError(a, f"expected a mesh axis 'name'=size, found '{excerpt(value[a:b])}'")
        name, digits = m.groups()
        size = parse_int(digits, m.start(2))
        if name in sizes:
            raise ScanError(a, f"duplicate mesh axis '{excerpt(name)}'")
        if size < 1:
            raise ScanError(m.start(2), f"mesh axis '{excerpt(name)}' has size {size}")
        count *= size
        if count > MAX_DEVICES:
            raise ScanError(
                m.start(2),
                f"the mesh has more than the {MAX_DEVICES} devices a module may address "
                "(MAX_DEVICES)",
            )
        sizes[name] = size
    return sizes


def _axis_refs(
    value: str, refs_open: int, refs_close: int, sizes: dict[str, int]
) -> list[tuple[str, tuple[int, int], int]]:
    """The grouped axes ``{'a','b':(2)2}`` as (axis, (pre-size, pre-size x size), offset)."""
    refs = []
    seen = set()
    for a, b in split_top_level(value, refs_open + 1, refs_close):
        ref = _AXIS_REF.fullmatch(value, a, b)
        if ref is None or ref.group(1) not in sizes:
            raise ScanError(
                a,
                f"expected a mesh axis of {excerpt(str(list(sizes)))}, "
                f"found '{excerpt(value[a:b])}'",
            )
        name, size = ref.group(1), sizes[ref.group(1)]
        span = (1, size)
        if ref.group(2) is not None:
            pre, sub = parse_int(ref.group(2), ref.start(2)), parse_int(ref.group(3), ref.start(3))
            if pre < 1 or sub < 2:  # XLA aborts on either
                raise ScanError(
                    a, f"sub-axis '{excerpt(value[a:b])}': expected (pre-size >= 1)size >= 2"
                )
            span = (pre, pre * sub)
            if size % span[1]:
                raise ScanError(
                    a, f"sub-axis '{excerpt(value[a:b])}' does not divide axis size {size}"
                )
        if (name, span) in seen:
            raise ScanError(a, "mesh axes to group over overlap")
        seen.add((name, span))
        refs.append((name, span, a))
    if not refs:  # XLA rejects a collective over no mesh axis
        raise ScanError(refs_open, "expected at least one mesh axis to group over, found '{}'")
    return refs


def _mesh_devices(value: str, span: tuple[int, int] | None, count: int) -> list[int] | None:
    """The device at each mesh position, in row-major order; None for the default, iota
    (device i at position i)."""
    if span is None:
        return None
    a, b = span
    text = value[a:b]
    if (iota := _DEVICE_IDS_IOTA.fullmatch(text)) is not None:
        dims = [parse_int(d, a + iota.start(1)) for d in iota.group(1).split(",")]
        if _bounded_product(dims) != count:
            raise ScanError(a, f"device_ids are not a permutation of the mesh's {count} devices")
        devices = _transposed_iota(dims, _permutation(iota.group(2), a + iota.start(2), len(dims)))
    else:
        try:
            devices = list(parse_int_list("{" + text + "}"))
        except ScanError:
            raise ScanError(a, f"expected device ids, found '{excerpt(text)}'") from None
    if sorted(devices) != list(range(count)):
        raise ScanError(a, f"device_ids are not a permutation of the mesh's {count} devices")
    return devices


def _permutation(text: str | None, at: int, rank: int) -> list[int]:
    """The ``T(...)`` permutation (identity when absent), checked."""
    if text is None:
        return list(range(rank))
    perm = [parse_int(p, at) for p in text.split(",")]
    if sorted(perm) != list(range(rank)):
        raise ScanError(at, f"T({excerpt(text)}) is not a permutation of {rank} dimensions")
    return perm


def _bounded_product(values: Iterable[int]) -> int | None:
    """The product of ``values``, or None once it passes MAX_DEVICES (never a huge int)."""
    product = 1
    for v in values:
        product *= v
        if product > MAX_DEVICES:
            return None
    return product


def _transposed_iota(dims: list[int], perm: list[int]) -> list[int]:
    """iota(prod(dims)) reshaped to ``dims``, transposed by ``perm``, flattened.

    Callers have checked prod(dims) <= MAX_DEVICES. Dimensions of size 1 change
    nothing and are skipped, so the work is O(prod(dims)) however many there are.
    """
    strides = [0] * len(dims)
    stride = 1
    for i in range(len(dims) - 1, -1, -1):
        strides[i] = stride
        stride *= dims[i]
    flat = [0]
    for p in perm:
        if dims[p] != 1:
            flat = [base + k * strides[p] for base in flat for k in range(dims[p])]
    return flat


def _skip(value: str, pos: int) -> int:
    while pos < len(value) and value[pos] in WHITESPACE:
        pos += 1
    return pos


__all__ = [
    "MAX_DEVICES",
    "Groups",
    "HloError",
    "decode",
    "format_frontend_attributes",
    "parse_backend_config",
    "parse_frontend_attributes",
    "parse_int_list",
    "parse_replica_groups",
    "parse_source_target_pairs",
]
