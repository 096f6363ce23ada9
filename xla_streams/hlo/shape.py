"""HLO shapes: ``f32[8,128]{1,0}``, ``bf16[<=4]``, tuples ``(s32[], f32[2]{0})``, ``token[]``,
buffers ``b(s32[4]{0})``."""

from __future__ import annotations

import re
from functools import lru_cache

from xla_streams.hlo.text import (
    INT64_MAX,
    ScanError,
    blank_comments,
    excerpt,
    parse_int,
    split_top_level,
)

# Bits per element; sub-byte types are packed, tokens and opaques carry no data.
ELEMENT_BITS: dict[str, int] = {
    "pred": 8,
    "s2": 2, "s4": 4, "s8": 8, "s16": 16, "s32": 32, "s64": 64,
    "u2": 2, "u4": 4, "u8": 8, "u16": 16, "u32": 32, "u64": 64,
    "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128,
    "f4e2m1fn": 4, "f8e3m4": 8, "f8e4m3": 8, "f8e4m3fn": 8, "f8e4m3fnuz": 8,
    "f8e4m3b11fnuz": 8, "f8e5m2": 8, "f8e5m2fnuz": 8, "f8e8m0fnu": 8,
    "token": 0, "opaque": 0,
}  # fmt: skip

# element type, dimensions, optional layout (tiles, memory space and the like).
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[((?:<=)?\d+(?:,(?:<=)?\d+)*)?\](\{[^{}]*\})?")
# Real tuples nest a few levels; the limit keeps hostile "((((...))))" from
# exhausting Python's recursion (a RecursionError is no located error).
MAX_TUPLE_DEPTH = 64


class Shape:
    """An array shape (``element_type`` set) or a tuple (``tuple_shapes`` set).

    Immutable and compared by value, as a frozen dataclass would be; written out so
    that the front end does not import ``dataclasses`` (which imports ``inspect``):
    the command line's start-up counts.
    """

    __slots__ = ("dimensions", "element_type", "tuple_shapes")
    __match_args__ = ("element_type", "dimensions", "tuple_shapes")

    element_type: str | None
    dimensions: tuple[int, ...]
    tuple_shapes: tuple[Shape, ...]

    def __init__(
        self,
        element_type: str | None,
        dimensions: tuple[int, ...] = (),
        tuple_shapes: tuple[Shape, ...] = (),
    ) -> None:
        object.__setattr__(self, "element_type", element_type)
        object.__setattr__(self, "dimensions", dimensions)
        object.__setattr__(self, "tuple_shapes", tuple_shapes)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field '{name}'")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field '{name}'")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Shape)
        return (self.element_type, self.dimensions, self.tuple_shapes) == (
            other.element_type,
            other.dimensions,
            other.tuple_shapes,
        )

    def __hash__(self) -> int:
        return hash((self.element_type, self.dimensions, self.tuple_shapes))

    def __repr__(self) -> str:
        return (
            f"Shape(element_type={self.element_type!r}, dimensions={self.dimensions!r}, "
            f"tuple_shapes={self.tuple_shapes!r})"
        )

    def __reduce__(
        self,
    ) -> tuple[type[Shape], tuple[str | None, tuple[int, ...], tuple[Shape, ...]]]:
        return (Shape, (self.element_type, self.dimensions, self.tuple_shapes))

    @property
    def is_tuple(self) -> bool:
        return self.element_type is None

    @property
    def byte_size(self) -> int:
        """Bytes of data in the shape (all tuple leaves), layouts and padding ignored."""
        if self.element_type is None:
            return sum(s.byte_size for s in self.tuple_shapes)
        elements = 1
        for d in self.dimensions:
            elements *= d
        return (elements * ELEMENT_BITS[self.element_type] + 7) // 8

    def leaves(self) -> tuple[Shape, ...]:
        if self.element_type is None:
            return tuple(leaf for s in self.tuple_shapes for leaf in s.leaves())
        return (self,)


@lru_cache(maxsize=1 << 14)
def parse_shape(text: str) -> Shape:
    """Parse one shape; raises ScanError (offset into ``text``) when it is not one.

    Cached: a large module repeats a few hundred distinct shapes many thousand
    times. Bounded, since the plugin parses every module a long job compiles.
    """
    text_nc = blank_comments(text)
    return _parse(text_nc, 0, len(text_nc), 0)


def _parse(s: str, start: int, end: int, depth: int) -> Shape:
    while start < end and s[start] == " ":
        start += 1
    if start < end and s[start] == "(":
        if s[end - 1] != ")":
            raise ScanError(end - 1, "expected ')' closing the tuple shape")
        if depth == MAX_TUPLE_DEPTH:
            raise ScanError(start, f"tuple shape nested deeper than {MAX_TUPLE_DEPTH} levels")
        items = split_top_level(s, start + 1, end - 1)
        return Shape(None, (), tuple(_parse(s, a, b, depth + 1) for a, b in items))
    if s.startswith("b(", start) and s[end - 1] == ")":
        # A buffer (what custom calls pin and update in place) holds one array: its data is
        # the array's, so it reads as that array.
        inner = _parse(s, start + 2, end - 1, depth + 1)
        if inner.is_tuple:
            raise ScanError(start + 2, "expected an array shape inside the buffer shape b(...)")
        return inner
    m = _ARRAY.fullmatch(s, start, end)
    if m is None:
        raise ScanError(
            start, f"expected a shape such as 'f32[8,128]{{1,0}}', found '{excerpt(s[start:end])}'"
        )
    element_type = m.group(1)
    if element_type not in ELEMENT_BITS:
        raise ScanError(start, f"unknown element type '{element_type}'")
    dims = m.group(2)
    at = m.start(2)
    dimensions = tuple(parse_int(d.removeprefix("<="), at) for d in dims.split(",")) if dims else ()
    # XLA refuses an array whose element count overflows int64 (and byte_size
    # is later summed and turned into floats by the cost model).
    elements = 1
    for d in dimensions:
        elements *= d
        if elements > INT64_MAX:
            raise ScanError(start, f"array shape '{excerpt(s[start:end])}' is too large for XLA")
    return Shape(element_type, dimensions)
