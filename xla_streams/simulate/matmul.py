"""XLA's measured GEMM times: its matmul performance table, and the lookup XLA does in it.

XLA:GPU ships a table of GEMMs it measured on real GPUs
(``xla/service/gpu/model/default_matmul_perf_table.txtpb``, a text
``xla.GemmPerfTable``, compiled into jaxlib's CUDA plugin): per GPU kind (``sm_90``
is H100/H200, ``sm_100_B200`` ...), the FLOP/s of a batched matmul for every
``b`` in {1, 2, 4} and ``m``, ``n``, ``k`` in {256, ..., 4096} (powers of two), per
element-type combination (``bf16xbf16->bf16``, ``f32xf32->f32``, three FP8 ones).
XLA's SoL latency estimator prices dots with it (``MatmulInterpolator``). The copy
vendored here is ``data/matmul_perf_table.txtpb`` (see ``data/README.md``).

The lookup, as XLA does it (openxla/xla ``matmul_interpolator.cc``,
``matmul_interpolator_utils.cc`` and ``EuclideanWeightedAverageInterpolator`` in
``interpolator.h``, the versions jaxlib 0.12 embeds; this module re-implements the
behaviour, it copies no code):

- the key (:class:`GemmShape`): ``b`` the product of the lhs batch dimensions,
  ``m`` of the lhs dimensions neither batch nor contracting, ``k`` of the lhs
  contracting ones, ``n`` of the rhs dimensions neither batch nor contracting,
  and the element types of lhs, rhs and the output, spelled ``lhsxrhs->out``;
- a dot is looked up at the point ``(b, m, k, n)``: on each axis its power-of-two
  neighbours below and above (the point itself on the grid), clamped to the
  table's range ([1, 4] for ``b``, [256, 4096] for the others); the 16 corners'
  FLOP/s are averaged with weights ``1 / (squared distance + 1)`` (XLA computes
  the weights in single precision, as here). So a measured point comes back as
  measured, a point between them is a weighted average of its corners, and a point
  outside the range takes the FLOP/s of the nearest edge: a 8192-wide GEMM runs
  at the 4096-wide one's rate, a 64-wide one at the 256-wide one's;
- ``time = 2 b m n k / FLOP/s``;
- a type combination the table lacks (``bf16xbf16->f32``, ``s8``...) is looked up
  in the ``bf16xbf16->bf16`` measurements, with every dimension counted in bytes
  of the output type (a 4-byte output doubles the point against bf16's 2 bytes) over
  the range [512, 8192]. XLA then also multiplies those byte counts into the FLOPs
  (an 8x overcount for a 2-byte output, 64x for a 4-byte one); that is a units slip,
  not a measurement, so here the FLOPs are the real ones.

:func:`gemm_shape` reads the key from a ``dot`` (inside a GEMM fusion, XLA's
``IsTritonGemm``, with the fusion's output type) or a cuBLAS custom call's
``dot_dimension_numbers``. Where a GPU kind is missing (A100, GB200) or a point
XLA would not find, the lookup returns None and the cost model keeps its roofline.
"""

from __future__ import annotations

import functools
import itertools
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from xla_streams.hlo import Instruction
from xla_streams.hlo.attributes import decode, parse_int_list
from xla_streams.hlo.shape import Shape
from xla_streams.simulate.measured import (
    DATA_DIR,
    ELEMENT_BYTES,
    PerfTableError,
    device_entry,
    device_sections,
)
from xla_streams.simulate.textproto import Message, ProtoError, parse_text

DEFAULT_MATMUL_TABLE_PATH = DATA_DIR / "matmul_perf_table.txtpb"

Point = tuple[int, int, int, int]  # (b, m, k, n), XLA's order
# matmul_interpolator.cc: the range of each interpolator, (b, m, k, n).
TABLE_LOW: Point = (1, 256, 256, 256)
TABLE_HIGH: Point = (4, 4096, 4096, 4096)
FALLBACK_LOW: Point = (1, 512, 512, 512)
FALLBACK_HIGH: Point = (4, 8192, 8192, 8192)
# The measurements a type combination the table lacks is looked up in.
FALLBACK_KEY = "bf16xbf16->bf16"
# The bytes XLA's fallback counts its bf16 points in.
_FALLBACK_SCALE = 2
# interpolator.h: added to the squared distance of each corner.
_EPSILON = 1.0


@dataclass(frozen=True)
class GemmShape:
    """A matrix product as XLA's matmul table keys it (dimensions in elements)."""

    b: int
    m: int
    k: int
    n: int
    lhs: str  # element types, lowercase as HLO prints them
    rhs: str
    out: str

    @property
    def key(self) -> str:
        """XLA's ``MatmulDTypeKey``: ``bf16xbf16->bf16``."""
        return f"{self.lhs}x{self.rhs}->{self.out}"

    @property
    def flops(self) -> float:
        return 2.0 * self.b * self.m * self.n * self.k


def gemm_shape(dot: Instruction, out: Shape) -> GemmShape | None:
    """The key of ``dot`` (a ``dot`` instruction), whose result XLA types as ``out``
    (the dot's own shape, or the GEMM fusion's); None without two array operands."""
    operands = dot.operand_shapes
    if len(operands) < 2:
        return None
    dims: dict[str, Sequence[int]] = {
        name: decode(dot, name, parse_int_list) or ()
        for name in (
            "lhs_batch_dims",
            "lhs_contracting_dims",
            "rhs_batch_dims",
            "rhs_contracting_dims",
        )
    }
    return _shape(operands[0], operands[1], out, dims)


def gemm_shape_of_call(call: Instruction, numbers: dict[str, object]) -> GemmShape | None:
    """The key of a cuBLAS GEMM custom call from its backend config's
    ``dot_dimension_numbers`` (lists of dimension numbers, as JSON prints them)."""
    operands = call.operand_shapes
    if len(operands) < 2:
        return None
    dims: dict[str, Sequence[int]] = {}
    for name in ("lhs_batch", "lhs_contracting", "rhs_batch", "rhs_contracting"):
        # JSON leaves out an empty list: no batch dimensions; contracting ones must be there.
        value = numbers.get(f"{name}_dimensions", [] if "batch" in name else None)
        if not isinstance(value, list):
            return None
        dims[f"{name}_dims"] = [int(d) for d in value]
    leaves = call.shape.leaves()
    return _shape(operands[0], operands[1], leaves[0] if leaves else call.shape, dims)


def _shape(lhs: Shape, rhs: Shape, out: Shape, dims: dict[str, Sequence[int]]) -> GemmShape | None:
    if not (lhs.element_type and rhs.element_type and out.element_type):
        return None

    def size(shape: Shape, numbers: Sequence[int]) -> int:
        return math.prod(shape.dimensions[d] for d in numbers if 0 <= d < len(shape.dimensions))

    def free(shape: Shape, *used: Sequence[int]) -> int:
        taken = {d for numbers in used for d in numbers}
        return math.prod(n for d, n in enumerate(shape.dimensions) if d not in taken)

    return GemmShape(
        b=size(lhs, dims["lhs_batch_dims"]),
        m=free(lhs, dims["lhs_batch_dims"], dims["lhs_contracting_dims"]),
        k=size(lhs, dims["lhs_contracting_dims"]),
        n=free(rhs, dims["rhs_batch_dims"], dims["rhs_contracting_dims"]),
        lhs=lhs.element_type,
        rhs=rhs.element_type,
        out=out.element_type,
    )


class WeightedAverage:
    """XLA's ``EuclideanWeightedAverageInterpolator<4>`` with power-of-two
    neighbours: see the module docstring."""

    def __init__(self, points: dict[Point, float], low: Point, high: Point) -> None:
        self.points = points
        self.low = low
        self.high = high

    def __call__(self, point: Point) -> float | None:
        """The interpolated value at ``point``; None if a corner is not measured (XLA
        would abort: its lookup of the corner throws)."""
        sides = [
            (
                _clamp(_previous_power_of_two(x), self.low[d], self.high[d]),
                _clamp(_next_power_of_two(x), self.low[d], self.high[d]),
            )
            for d, x in enumerate(point)
        ]
        total = weights = 0.0
        # XLA's corner order: the first axis varies fastest (floating-point sums keep it).
        for n, k, m, b in itertools.product(*reversed(sides)):
            corner = (b, m, k, n)
            value = self.points.get(corner)
            if value is None:
                return None
            distance = sum((c - x) * (c - x) for c, x in zip(corner, point, strict=True))
            weight = _float32(1.0 / _float32(_float32(distance) + _EPSILON))
            total += value * weight
            weights += weight
        return total / weights


class MatmulTable:
    """XLA's MatmulInterpolator for one GPU kind."""

    def __init__(self, device: str, measured: dict[str, dict[Point, float]]) -> None:
        self.device = device
        self.measured = measured  # type key -> {(b, m, k, n): FLOP/s}
        self._exact = {
            key: WeightedAverage(points, TABLE_LOW, TABLE_HIGH) for key, points in measured.items()
        }
        bf16 = measured.get(FALLBACK_KEY, {})
        self._fallback = WeightedAverage(
            {
                (b, m * _FALLBACK_SCALE, k * _FALLBACK_SCALE, n * _FALLBACK_SCALE): v
                for (b, m, k, n), v in bf16.items()
            },
            FALLBACK_LOW,
            FALLBACK_HIGH,
        )
        # A model repeats a few GEMM shapes in every layer: each is interpolated once.
        self._throughput: dict[GemmShape, float | None] = {}

    def throughput(self, shape: GemmShape) -> float | None:
        """The FLOP/s XLA would use for ``shape`` (None: not in the table)."""
        if shape in self._throughput:
            return self._throughput[shape]
        rate = self._throughput[shape] = self._interpolate(shape)
        return rate

    def _interpolate(self, shape: GemmShape) -> float | None:
        exact = self._exact.get(shape.key)
        if exact is not None:
            return exact((shape.b, shape.m, shape.k, shape.n))
        if not self.measured.get(FALLBACK_KEY):
            return None
        scale = max(1, math.ceil(ELEMENT_BYTES.get(shape.out.upper(), 0)))
        return self._fallback((shape.b, shape.m * scale, shape.k * scale, shape.n * scale))

    def seconds(self, shape: GemmShape) -> float | None:
        """``shape``'s measured time (None: see :meth:`throughput`)."""
        rate = self.throughput(shape)
        return shape.flops / rate if rate is not None and rate > 0 else None


class MatmulPerfTable:
    """A matmul table file: each GPU kind's section, parsed when first asked for."""

    def __init__(
        self,
        path: str,
        pending: dict[str, tuple[str, int]] | None = None,
        tables: dict[str, MatmulTable] | None = None,
    ) -> None:
        self.path = path
        self._pending = dict(pending or {})  # device -> (its text, the line it starts on)
        self._tables = dict(tables or {})

    def devices(self) -> tuple[str, ...]:
        return tuple(sorted(set(self._pending) | set(self._tables)))

    def for_device(self, device: str) -> MatmulTable | None:
        """The lookup for one GPU kind; None when the table has no section for it."""
        table = self._tables.get(device)
        if table is None:
            pending = self._pending.pop(device, None)
            if pending is None:
                return None
            text, first_line = pending
            for entry in _parse(text, self.path, first_line).messages("entries"):
                table = self._tables[device] = _device_table(entry, self.path)
        return table


def parse_matmul_table(text: str, path: str = "<string>") -> MatmulPerfTable:
    """A table in XLA's text format (PerfTableError at the line that is wrong). Laid
    out as XLA writes it (each GPU kind an ``entries {`` block from column 0), each
    GPU kind is parsed when first used."""
    sections = device_sections(text)
    if sections is not None:
        return MatmulPerfTable(path, pending=sections)
    root = _parse(text, path, 1)
    tables = {t.device: t for t in (_device_table(e, path) for e in root.messages("entries"))}
    if not tables:
        raise PerfTableError(
            'no measurements: expected `entries { key: "sm_90" value { entries { ... } } }`',
            path=path,
            line=root.line,
        )
    return MatmulPerfTable(path, tables=tables)


def load_matmul_table(path: str | Path) -> MatmulPerfTable:
    """A matmul table in XLA's text format, as ``default_matmul_perf_table.txtpb``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PerfTableError(f"cannot read the matmul table: {e}", path=str(p)) from None
    return parse_matmul_table(text, str(p))


@functools.cache
def default_matmul_table() -> MatmulPerfTable:
    """The table vendored from XLA (``data/matmul_perf_table.txtpb``)."""
    return load_matmul_table(DEFAULT_MATMUL_TABLE_PATH)


def _device_table(entry: Message, path: str) -> MatmulTable:
    """One ``entries { key: "sm_90" value { entries { b m n k flops... } } }``."""
    device, value = device_entry(entry, path)
    measured: dict[str, dict[Point, float]] = {}
    for point in value.messages("entries"):
        b, m, k, n = (point.integer(axis) for axis in ("b", "m", "k", "n"))
        if min(b, m, k, n) <= 0:
            raise PerfTableError(
                f"{device}: b, m, n and k must be positive, not {(b, m, n, k)}",
                path=path,
                line=point.line,
            )
        for rate in point.messages("flops"):
            flops = rate.number("value")
            if flops <= 0:
                raise PerfTableError(
                    f"{device}: a measured FLOP/s must be positive, not {flops}",
                    path=path,
                    line=rate.line,
                )
            measured.setdefault(rate.string("key").lower(), {})[(b, m, k, n)] = flops
    return MatmulTable(device, measured)


def _parse(text: str, path: str, first_line: int) -> Message:
    try:
        return parse_text(text, path, first_line)
    except ProtoError as e:
        raise PerfTableError(e.message, path=e.path, line=e.line) from None


def _next_power_of_two(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _previous_power_of_two(n: int) -> int:
    """interpolator.h's PrevPowerOfTwo: the largest power of two not above ``n``."""
    return _next_power_of_two((n >> 1) + 1)


def _clamp(n: int, low: int, high: int) -> int:
    return min(max(low, n), high)


def _float32(x: float) -> float:
    """``x`` rounded to single precision, as XLA's weights are."""
    rounded: float = struct.unpack("f", struct.pack("f", x))[0]
    return rounded
