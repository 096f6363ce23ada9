"""XLA's measured collective times: its performance table, and the lookup XLA does in it.

XLA:GPU ships a table of collectives it measured on real hosts
(``xla/service/gpu/model/default_collective_perf_table.txtpb``, a text
``xla.gpu.DeviceHloInstructionProfiles``): per GPU kind (``sm_90`` is H100/H200,
``sm_100_B200``, ``sm_100_GB200`` ...), one ``network_throughput_bytes_per_sec``
for each measured HLO collective (kind, shape, replica groups). Its latency
estimator (``CollectiveInterpolator``, used by the SoL estimator the
latency-hiding scheduler runs on Hopper and Blackwell) turns that into a time.
The copy vendored here is ``data/collective_perf_table.txtpb`` (see
``data/README.md``); ``load_perf_table`` reads a user's own, text or binary, as
``--xla_gpu_experimental_collective_perf_table_path`` would.

The lookup, as XLA does it in its default configuration (openxla/xla
``collective_interpolator.cc`` and ``interpolator.h``; this module re-implements
the behaviour, it copies no code):

- the bytes are ``GpuHloCostAnalysis::BytesTransferred``: output bytes for
  all-reduce, all-gather and all-to-all, *input* bytes for reduce-scatter,
  operand bytes for collective-permute (:func:`transfer_bytes`); a table entry's
  bytes come from its shape the same way;
- only collectives whose first replica group lies on one host reach the table
  (XLA's ``SINGLE_PARTITION``: host = device id // devices per host); across
  hosts XLA uses its SoL model, and the simulator its alpha-beta model;
- an *exact* map keyed by (kind, the full replica-group list, the element type
  for the kinds that reduce), over bytes; else a *fallback* map keyed by kind
  over (bytes, group size), group layout and type ignored (a later entry for the
  same point wins); collective-permutes are keyed by their pattern
  (:class:`PermuteType`) and have no fallback;
- nothing is interpolated: bytes snap to the nearer power of two (a tie goes
  up) clamped to [1 KiB, 1 GiB], the group size likewise to [2, 8], and the
  throughput measured at that point applies to the real byte count:
  ``time = bytes / throughput``. So a time can jump down between neighbouring
  sizes (1.4 MiB snaps to 1 MiB, 1.6 MiB to 2 MiB), above 1 GiB time grows
  linearly at the 1 GiB rate, and below 1 KiB XLA scales it toward zero (the
  cost model floors it at the 1 KiB time instead: ``cost.py``).

Where XLA would abort (a snapped point the map lacks) or has no data, the
lookup returns None and the cost model keeps its alpha-beta estimate.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from xla_streams.collectives import KINDS
from xla_streams.simulate.textproto import (
    Message,
    ProtoError,
    Schema,
    decode_wire,
    parse_text,
)

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_TABLE_PATH = DATA_DIR / "collective_perf_table.txtpb"

# The kinds XLA's table holds measurements of.
TABLE_KINDS = tuple(k.name for k in KINDS.values() if k.perf_table)
# Kinds whose exact key includes the element type (XLA: RequiresAccumulation).
_ACCUMULATING = frozenset({"all-reduce", "reduce-scatter"})

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
# collective_interpolator.cc: kMin/kMaxDefaultTransferSizeBytes and
# kMin/kMaxDefaultNumberOfParticipatingDevices.
MIN_BYTES, MAX_BYTES = KIB, GIB
MIN_DEVICES, MAX_DEVICES = 2, 8

ELEMENT_BYTES: dict[str, float] = {
    "PRED": 1, "S1": 0.125, "U1": 0.125, "S2": 0.25, "U2": 0.25, "S4": 0.5, "U4": 0.5,
    "S8": 1, "U8": 1, "F8E5M2": 1, "F8E4M3": 1, "F8E4M3FN": 1, "F8E4M3B11FNUZ": 1,
    "F8E3M4": 1, "F8E5M2FNUZ": 1, "F8E4M3FNUZ": 1, "F8E8M0FNU": 1, "F4E2M1FN": 0.5,
    "S16": 2, "U16": 2, "F16": 2, "BF16": 2, "S32": 4, "U32": 4, "F32": 4,
    "S64": 8, "U64": 8, "F64": 8, "C64": 8, "C128": 16,
}  # fmt: skip

# xla.PrimitiveType numbers (xla_data.proto), for binary tables.
PRIMITIVE_TYPES: dict[int, str] = {
    0: "PRIMITIVE_TYPE_INVALID", 1: "PRED", 2: "S8", 3: "S16", 4: "S32", 5: "S64", 6: "U8",
    7: "U16", 8: "U32", 9: "U64", 10: "F16", 11: "F32", 12: "F64", 13: "TUPLE",
    14: "OPAQUE_TYPE", 15: "C64", 16: "BF16", 17: "TOKEN", 18: "C128", 19: "F8E5M2",
    20: "F8E4M3FN", 21: "S4", 22: "U4", 23: "F8E4M3B11FNUZ", 24: "F8E5M2FNUZ",
    25: "F8E4M3FNUZ", 26: "S2", 27: "U2", 28: "F8E4M3", 29: "F8E3M4", 30: "S1", 31: "U1",
    32: "F4E2M1FN", 33: "F8E8M0FNU", 34: "BUFFER", 35: "F6E3M2FN", 36: "F6E2M3FN",
}  # fmt: skip

# The fields of xla.gpu.DeviceHloInstructionProfiles XLA's table uses (field numbers
# from the descriptors compiled into jaxlib 0.12's CUDA plugin; see data/README.md).
PERF_TABLE_ROOT = "DeviceHloInstructionProfiles"
PERF_TABLE_SCHEMA: Schema = {
    "DeviceHloInstructionProfiles": {2: ("entries", "message:EntriesEntry")},
    "EntriesEntry": {1: ("key", "string"), 2: ("value", "message:HloInstructionProfileList")},
    "HloInstructionProfileList": {1: ("entries", "message:HloInstructionProfile")},
    "HloInstructionProfile": {
        1: ("instruction", "message:HloInstructionProto"),
        2: ("clock_cycles", "int64"),
        3: ("fingerprint", "string"),
        4: ("flops", "int64"),
        5: ("operands", "message:HloInstructionProto"),
        6: ("network_throughput_bytes_per_sec", "int64"),
    },
    "HloInstructionProto": {
        1: ("name", "string"),
        2: ("opcode", "string"),
        3: ("shape", "message:ShapeProto"),
        7: ("metadata", "message:OpMetadata"),
        14: ("dimensions", "int64"),
        26: ("channel_id", "int64"),
        35: ("id", "int64"),
        36: ("operand_ids", "int64"),
        38: ("called_computation_ids", "int64"),
        49: ("replica_groups", "message:ReplicaGroup"),
        52: ("source_target_pairs", "message:SourceTarget"),
        68: ("frontend_attributes", "message:FrontendAttributes"),
        71: ("use_global_device_ids", "bool"),
        82: ("statistics_viz", "message:StatisticsViz"),
        92: ("iota_collective_device_list", "message:IotaReplicaGroupListProto"),
    },
    "ShapeProto": {
        2: ("element_type", "enum:PrimitiveType"),
        3: ("dimensions", "int64"),
        4: ("tuple_shapes", "message:ShapeProto"),
        5: ("layout", "message:LayoutProto"),
        6: ("is_dynamic_dimension", "bool"),
    },
    "LayoutProto": {
        1: ("minor_to_major", "int64"),
        16: ("tail_padding_alignment_in_elements", "int64"),
    },
    "OpMetadata": {1: ("op_type", "string"), 2: ("op_name", "string")},
    "ReplicaGroup": {1: ("replica_ids", "int64")},
    "SourceTarget": {1: ("source", "int64"), 2: ("target", "int64")},
    "FrontendAttributes": {1: ("map", "message:StringMapEntry")},
    "StringMapEntry": {1: ("key", "string"), 2: ("value", "string")},
    "StatisticsViz": {
        1: ("stat_index_to_visualize", "int64"),
        2: ("statistics", "message:Statistic"),
    },
    "Statistic": {1: ("stat_name", "string"), 2: ("stat_val", "double")},
    "IotaReplicaGroupListProto": {
        1: ("num_replica_groups", "int64"),
        2: ("num_devices_per_group", "int64"),
        3: ("iota_reshape_dims", "int64"),
        4: ("iota_transpose_perm", "int32"),
    },
}
PERF_TABLE_ENUMS = {"PrimitiveType": PRIMITIVE_TYPES}

Groups = tuple[tuple[int, ...], ...]
Pairs = tuple[tuple[int, int], ...]


class PerfTableError(ProtoError):
    """A performance table that cannot be read or used; says ``path:line: what``."""


class PermuteType(Enum):
    """XLA's CollectivePermuteCostModelType: within or across hosts, and the pattern."""

    UNKNOWN = "unknown"
    INTRA_ONE_WAY = "intra-one-way"
    INTRA_TWO_WAY_ALL_MUTUAL = "intra-two-way-all-mutual"
    INTRA_TWO_WAY_HAS_NON_MUTUAL = "intra-two-way-has-non-mutual"
    INTER_ONE_WAY = "inter-one-way"
    INTER_TWO_WAY_ALL_MUTUAL = "inter-two-way-all-mutual"
    INTER_TWO_WAY_HAS_NON_MUTUAL = "inter-two-way-has-non-mutual"


def permute_type(pairs: Pairs, devices_per_host: int) -> PermuteType:
    """The pattern of a collective-permute's (source, target) pairs."""
    if not pairs:
        return PermuteType.UNKNOWN
    pair_set = set(pairs)
    inter = any(s // devices_per_host != t // devices_per_host for s, t in pairs)
    mutual = all((t, s) in pair_set for s, t in pairs)
    two_way = bool({s for s, _ in pairs} & {t for _, t in pairs})
    if inter:
        if two_way:
            return (
                PermuteType.INTER_TWO_WAY_ALL_MUTUAL
                if mutual
                else PermuteType.INTER_TWO_WAY_HAS_NON_MUTUAL
            )
        return PermuteType.INTER_ONE_WAY
    if two_way:
        return (
            PermuteType.INTRA_TWO_WAY_ALL_MUTUAL
            if mutual
            else PermuteType.INTRA_TWO_WAY_HAS_NON_MUTUAL
        )
    return PermuteType.INTRA_ONE_WAY


def iota_groups(
    num_groups: int, group_size: int, reshape_dims: Sequence[int], perm: Sequence[int]
) -> Groups:
    """An iota replica-group list expanded:
    ``iota(prod(dims)).reshape(dims).transpose(perm).reshape(num_groups, group_size)``.
    ValueError when the numbers disagree."""
    dims = list(reshape_dims) or [num_groups * group_size]
    order = list(perm) or list(range(len(dims)))
    total = math.prod(dims)
    if num_groups <= 0 or group_size <= 0 or total != num_groups * group_size:
        raise ValueError(
            f"{num_groups} groups of {group_size} devices do not fit iota dims {list(dims)}"
        )
    if sorted(order) != list(range(len(dims))):
        raise ValueError(f"iota_transpose_perm {order} is no permutation of {len(dims)} dims")
    strides = [math.prod(dims[i + 1 :]) for i in range(len(dims))]
    shape = [dims[p] for p in order]
    index = [0] * len(shape)
    flat: list[int] = []
    for _ in range(total):
        flat.append(sum(index[k] * strides[order[k]] for k in range(len(shape))))
        for k in reversed(range(len(shape))):
            index[k] += 1
            if index[k] < shape[k]:
                break
            index[k] = 0
    return tuple(tuple(flat[g * group_size : (g + 1) * group_size]) for g in range(num_groups))


def transfer_bytes(kind: str, output_bytes: int, group_size: int) -> int:
    """XLA's BytesTransferred from a collective's output size: a reduce-scatter counts
    its input (output x group size), every other kind its output."""
    return output_bytes * group_size if kind == "reduce-scatter" else output_bytes


def snap_pow2(n: int, low: int, high: int) -> int:
    """The nearer of the powers of two around ``n`` (a tie goes up), clamped to
    [low, high]: XLA's EuclideanComplementInterpolator per coordinate."""
    if n <= 1:
        return max(min(1, high), low)
    above = 1 << (n - 1).bit_length()
    below = above >> 1 if above != n else n
    snapped = below if n - below < above - n else above
    return max(min(snapped, high), low)


@dataclass(frozen=True)
class Measurement:
    """One measured collective of the table."""

    device: str  # the table key: "sm_90", "sm_100_B200" ...
    kind: str
    dtype: str
    dims: tuple[int, ...]  # its output shape
    groups: Groups  # replica groups (empty for a collective-permute)
    pairs: Pairs  # a collective-permute's (source, target) pairs
    throughput: int  # network_throughput_bytes_per_sec
    line: int = 0  # where it is in its file (0: binary)

    @property
    def group_size(self) -> int:
        return len(self.groups[0]) if self.groups else 2

    @property
    def group_shape(self) -> str:
        """``GxN``: G groups of N devices (``permute`` for a collective-permute)."""
        return f"{len(self.groups)}x{self.group_size}" if self.groups else "permute"

    @property
    def shape_bytes(self) -> int:
        return math.ceil(math.prod(self.dims) * ELEMENT_BYTES[self.dtype])

    @property
    def transfer_bytes(self) -> int:
        return transfer_bytes(self.kind, self.shape_bytes, self.group_size)

    @property
    def seconds(self) -> float:
        return self.transfer_bytes / self.throughput if self.throughput > 0 else math.inf


class PerfTable:
    """A performance table: its measurements for every GPU kind it holds.

    A table read with ``lazy=True`` (the vendored one) keeps each GPU kind's text
    and parses it when :meth:`for_device` first asks for it.
    """

    def __init__(
        self,
        path: str,
        measurements: Sequence[Measurement] = (),
        pending: dict[str, tuple[str, int]] | None = None,
    ) -> None:
        self.path = path
        self._by_device: dict[str, list[Measurement]] = {}
        for m in measurements:
            self._by_device.setdefault(m.device, []).append(m)
        # device -> (its text, the line it starts on), not parsed yet
        self._pending = dict(pending or {})
        self._tables: dict[tuple[str, int], CollectiveTable] = {}

    def __repr__(self) -> str:
        return f"<PerfTable {self.path}: {', '.join(self.devices())}>"

    def devices(self) -> tuple[str, ...]:
        """The GPU kinds (table keys) it has measurements for, sorted."""
        return tuple(sorted(set(self._by_device) | set(self._pending)))

    @property
    def measurements(self) -> tuple[Measurement, ...]:
        """Every measurement, in file order per GPU kind."""
        return tuple(m for device in self.devices() for m in self.device_measurements(device))

    def device_measurements(self, device: str) -> tuple[Measurement, ...]:
        pending = self._pending.pop(device, None)
        if pending is not None:
            text, first_line = pending
            root = _parse(text, self.path, first_line)
            for m in _measurements(root, self.path):
                self._by_device.setdefault(m.device, []).append(m)
        return tuple(self._by_device.get(device, ()))

    def for_device(self, device: str, devices_per_host: int = 8) -> CollectiveTable:
        """The lookup for one GPU kind (PerfTableError naming the kinds it has if it
        has none for ``device``)."""
        key = (device, devices_per_host)
        table = self._tables.get(key)
        if table is None:
            mine = self.device_measurements(device)
            if not mine:
                raise PerfTableError(
                    f"no measurements for '{device}'; the table has: "
                    + (", ".join(self.devices()) or "none"),
                    path=self.path,
                )
            table = self._tables[key] = CollectiveTable(device, mine, devices_per_host)
        return table


class CollectiveTable:
    """XLA's CollectiveInterpolator for one GPU kind (default path: exact map, then
    fallback; see the module docstring)."""

    def __init__(
        self, device: str, measurements: Sequence[Measurement], devices_per_host: int = 8
    ) -> None:
        self.device = device
        self.devices_per_host = devices_per_host
        self.measurements = tuple(measurements)
        # (kind, groups or permute type, dtype or None) -> {bytes: throughput}
        self.exact: dict[tuple[str, object, str | None], dict[int, int]] = {}
        # kind -> {(bytes, group size): throughput}, single-host entries only
        self.fallback: dict[str, dict[tuple[int, int], int]] = {}
        for m in self.measurements:  # a later entry overwrites, like XLA's map insert
            if m.kind == "collective-permute":
                pkey = (m.kind, permute_type(m.pairs, devices_per_host), None)
                self.exact.setdefault(pkey, {})[m.transfer_bytes] = m.throughput
                continue
            dtype = m.dtype if m.kind in _ACCUMULATING else None
            self.exact.setdefault((m.kind, m.groups, dtype), {})[m.transfer_bytes] = m.throughput
            if self.on_one_host(m.groups):
                points = self.fallback.setdefault(m.kind, {})
                points[(m.transfer_bytes, m.group_size)] = m.throughput

    def on_one_host(self, groups: Groups) -> bool:
        """XLA's SINGLE_PARTITION: the first replica group lies on one host."""
        return bool(groups) and len({d // self.devices_per_host for d in groups[0]}) == 1

    def throughput(
        self,
        kind: str,
        groups: Groups,
        nbytes: int,
        dtype: str = "F32",
        *,
        legacy_start_opcode: bool = False,
    ) -> int | None:
        """The bytes/s XLA would use for ``nbytes`` (BytesTransferred, see
        :func:`transfer_bytes`), or None where XLA does not use the table (across
        hosts, a kind or point it lacks, a throughput of 0).

        ``groups``: the replica groups as global device ids; for a
        collective-permute its (source, target) pairs. ``legacy_start_opcode``:
        the module has the dedicated ``all-reduce-start``/``all-gather-start``
        opcodes rather than jax 0.12's ``async-start`` wrappers; XLA then skips the
        exact map for those two kinds.
        """
        if kind not in TABLE_KINDS or not groups:
            return None
        if kind == "collective-permute":
            pairs = tuple((g[0], g[1]) for g in groups if len(g) == 2)
            ptype = permute_type(pairs, self.devices_per_host)
            if ptype.value.startswith("inter"):
                return None
            return self._at(self.exact.get((kind, ptype, None)), nbytes)
        if not self.on_one_host(groups):
            return None
        if not (legacy_start_opcode and kind in ("all-reduce", "all-gather")):
            key_dtype = dtype.upper() if kind in _ACCUMULATING else None
            points = self.exact.get((kind, groups, key_dtype))
            if points is not None:
                return self._at(points, nbytes)
        size = len(groups[0])
        if size > MAX_DEVICES:
            # XLA would clamp the group to 8 devices; too far from what was measured.
            return None
        fallback = self.fallback.get(kind)
        if fallback is None:
            return None
        point = (
            snap_pow2(nbytes, MIN_BYTES, MAX_BYTES),
            snap_pow2(size, MIN_DEVICES, MAX_DEVICES),
        )
        value = fallback.get(point)
        return value if value is not None and value > 0 else None

    @staticmethod
    def _at(points: dict[int, int] | None, nbytes: int) -> int | None:
        if points is None:
            return None
        value = points.get(snap_pow2(nbytes, MIN_BYTES, MAX_BYTES))
        return value if value is not None and value > 0 else None

    def seconds(
        self,
        kind: str,
        groups: Groups,
        nbytes: int,
        dtype: str = "F32",
        *,
        legacy_start_opcode: bool = False,
    ) -> float | None:
        """XLA's estimate, ``nbytes / throughput`` (None: see :meth:`throughput`)."""
        rate = self.throughput(kind, groups, nbytes, dtype, legacy_start_opcode=legacy_start_opcode)
        return None if rate is None else nbytes / rate


# -- reading ------------------------------------------------------------------------------


def parse_perf_table(text: str, path: str = "<string>", *, lazy: bool = False) -> PerfTable:
    """A table from its text format (PerfTableError at the line that is wrong). With
    ``lazy``, a table laid out as XLA writes it (each GPU kind an ``entries {`` block
    from column 0 to a ``}`` in column 0) is split by GPU kind now and each part parsed
    when first used."""
    if lazy:
        sections = device_sections(text)
        if sections is not None:
            return PerfTable(path, pending=sections)
    root = _parse(text, path)
    return PerfTable(path, _measurements(root, path))


def decode_perf_table(data: bytes, path: str = "<bytes>") -> PerfTable:
    """A table from its binary form (what jaxlib embeds, or a ``.pb`` file)."""
    return PerfTable(path, _measurements(_decode(data, path), path))


def load_perf_table(path: str | Path, *, lazy: bool = False) -> PerfTable:
    """A table in XLA's format (text, or binary as a ``.pb``), as a user gives one with
    ``--xla_gpu_experimental_collective_perf_table_path``. Errors say ``file:line``;
    unless ``lazy``, the whole table is read and checked now."""
    p = Path(path)
    data = _read(p)
    if _is_binary(p, data):
        return decode_perf_table(data, str(p))
    return parse_perf_table(data.decode("utf-8"), str(p), lazy=lazy)


def check_xla_can_read(path: str | Path) -> None:
    """PerfTableError where a table :func:`load_perf_table` reads would abort XLA: a
    collective whose devices are written as ``replica_groups`` (the deprecated field)
    rather than ``iota_collective_device_list``. jax 0.12's XLA fails a check
    (``array.h: new_num_elements == num_elements()``) at the first GPU compile that
    reads such a table (seen deviceless, 8 H100s); collective_perf_table_gen writes
    the iota form."""
    p = Path(path)
    data = _read(p)
    root = _decode(data, str(p)) if _is_binary(p, data) else _parse(data.decode("utf-8"), str(p))
    for device in root.messages("entries"):
        profiles = device.message("value")
        for profile in profiles.messages("entries") if profiles is not None else ():
            inst = profile.message("instruction")
            if inst is not None and inst.has("replica_groups"):
                raise PerfTableError(
                    f"{device.string('key')}: the {inst.string('opcode')}'s devices are written "
                    "as replica_groups, which XLA aborts on when it reads the table; write "
                    "iota_collective_device_list { num_replica_groups: G "
                    "num_devices_per_group: N iota_reshape_dims: ... iota_transpose_perm: ... }, "
                    "as collective_perf_table_gen does",
                    path=str(p),
                    line=inst.line_of("replica_groups"),
                )


@functools.cache
def default_perf_table() -> PerfTable:
    """The table vendored from XLA (``data/collective_perf_table.txtpb``), read once and
    each GPU kind parsed when first used."""
    return load_perf_table(DEFAULT_TABLE_PATH, lazy=True)


_SECTION = re.compile(r'^entries \{\n\s*key: "([^"\n]+)"\n', re.MULTILINE)
_SECTION_END = re.compile(r"^\}[ \t]*$", re.MULTILINE)


def device_sections(text: str) -> dict[str, tuple[str, int]] | None:
    """Each GPU kind's ``entries { ... }`` block with the line it starts on, if the text
    is laid out as XLA writes it (None otherwise: then it is parsed whole)."""
    sections: dict[str, tuple[str, int]] = {}
    pos, line = 0, 1
    for m in _SECTION.finditer(text):
        between = text[pos : m.start()]
        if any(s.strip() and not s.lstrip().startswith("#") for s in between.splitlines()):
            return None
        line += between.count("\n")
        end = _SECTION_END.search(text, m.end())
        if end is None or m.group(1) in sections:
            return None
        block = text[m.start() : end.end()]
        sections[m.group(1)] = (block, line)
        line += block.count("\n")
        pos = end.end()
    rest = text[pos:]
    if not sections or any(s.strip() and not s.lstrip().startswith("#") for s in rest.splitlines()):
        return None
    return sections


def _parse(text: str, path: str, first_line: int = 1) -> Message:
    try:
        return parse_text(text, path, first_line)
    except ProtoError as e:
        raise PerfTableError(e.message, path=e.path, line=e.line) from None


def _decode(data: bytes, path: str) -> Message:
    try:
        return decode_wire(data, PERF_TABLE_SCHEMA, PERF_TABLE_ROOT, PERF_TABLE_ENUMS, path)
    except ProtoError as e:
        raise PerfTableError(e.message, path=e.path, line=e.line) from None


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise PerfTableError(
            f"cannot read the performance table: {e.strerror}", path=str(path)
        ) from None


def _is_binary(path: Path, data: bytes) -> bool:
    """A ``.pb`` file, or one that does not start as text: XLA's binary form."""
    return path.suffix == ".pb" or not _looks_like_text(data)


def _looks_like_text(data: bytes) -> bool:
    try:
        head = data[:4096].decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(c.isprintable() or c in "\n\r\t" for c in head)


def device_entry(entry: Message, path: str) -> tuple[str, Message]:
    """A table's top-level ``entries { key: "sm_90" value { ... } }``: the GPU kind and
    its value (XLA's collective and matmul tables both map GPU kinds so)."""
    device = entry.string("key")
    value = entry.message("value")
    if not device or value is None:
        raise PerfTableError(
            "a top-level 'entries' needs a 'key' (the GPU, e.g. \"sm_90\") and a 'value'",
            path=path,
            line=entry.line,
        )
    return device, value


def _measurements(root: Message, path: str) -> list[Measurement]:
    measurements: list[Measurement] = []
    try:
        for entry in root.messages("entries"):
            device, profiles = device_entry(entry, path)
            for profile in profiles.messages("entries"):
                measurements.append(_measurement(device, profile, path))
    except PerfTableError:
        raise
    except ProtoError as e:  # a field of the wrong kind, or given twice
        raise PerfTableError(e.message, path=e.path, line=e.line) from None
    if not measurements:
        raise PerfTableError(
            'no measurements: expected `entries { key: "sm_90" value { entries { ... } } }`',
            path=path,
            line=root.line,
        )
    return measurements


def _measurement(device: str, profile: Message, path: str) -> Measurement:
    def fail(message: str, at: Message) -> PerfTableError:
        return PerfTableError(f"{device}: {message}", path=path, line=at.line)

    inst = profile.message("instruction")
    if inst is None:
        raise fail("a measurement without 'instruction'", profile)
    kind = inst.string("opcode")
    if kind not in TABLE_KINDS:
        raise fail(f"unsupported opcode '{kind}'; the table holds: {', '.join(TABLE_KINDS)}", inst)
    shape = inst.message("shape")
    if shape is None:
        raise fail("an instruction without 'shape'", inst)
    element = shape.one("element_type")
    dtype = PRIMITIVE_TYPES.get(element, "") if isinstance(element, int) else str(element or "")
    if dtype not in ELEMENT_BYTES:
        raise fail(f"unknown element_type '{element}'", shape)
    groups: Groups = ()
    iota = inst.message("iota_collective_device_list")
    if iota is not None:
        try:
            groups = iota_groups(
                iota.integer("num_replica_groups"),
                iota.integer("num_devices_per_group"),
                iota.integers("iota_reshape_dims"),
                iota.integers("iota_transpose_perm"),
            )
        except ValueError as e:
            raise fail(str(e), iota) from None
    else:
        groups = tuple(tuple(g.integers("replica_ids")) for g in inst.messages("replica_groups"))
    pairs = tuple(
        (p.integer("source"), p.integer("target")) for p in inst.messages("source_target_pairs")
    )
    if kind == "collective-permute":
        if not pairs:
            raise fail("a collective-permute without source_target_pairs", inst)
    elif not groups or any(len(g) != len(groups[0]) or not g for g in groups):
        raise fail(f"{kind} needs replica groups, all of one size", inst)
    dims = tuple(shape.integers("dimensions"))
    if any(d < 0 for d in dims):
        raise fail(f"negative dimension in {list(dims)}", shape)
    throughput = profile.integer("network_throughput_bytes_per_sec")
    if throughput < 0:
        raise fail(f"negative network_throughput_bytes_per_sec {throughput}", profile)
    return Measurement(device, kind, dtype, dims, groups, pairs, throughput, profile.line)
