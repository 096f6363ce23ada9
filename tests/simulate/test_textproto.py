"""The protobuf readers: the wire decoder of XLA's binary tables and PGLE profiles, and
the text format's numbers as XLA writes them."""

from __future__ import annotations

import math
import struct

import pytest

from xla_streams.simulate.textproto import ProtoError, decode_wire, parse_text

SCHEMA = {
    "M": {
        1: ("d", "double"),
        2: ("f", "float"),
        3: ("s64", "sfixed64"),
        4: ("s32", "sfixed32"),
        5: ("u32", "fixed32"),
        6: ("packed_s32", "sfixed32"),
        7: ("packed_d", "double"),
    }
}


def _key(number: int, wire: int) -> bytes:
    return bytes([number << 3 | wire])


def test_fixed_width_fields_read_alone_and_packed() -> None:
    data = (
        _key(1, 1) + struct.pack("<d", 2.5)
        + _key(2, 5) + struct.pack("<f", -0.5)
        + _key(3, 1) + struct.pack("<q", -7)
        + _key(4, 5) + struct.pack("<i", -3)
        + _key(5, 5) + struct.pack("<I", 4_000_000_000)
        + _key(6, 2) + bytes([8]) + struct.pack("<ii", -1, 2)
        + _key(7, 2) + bytes([16]) + struct.pack("<dd", 1.0, -2.0)
    )  # fmt: skip
    msg = decode_wire(data, SCHEMA, "M")
    assert [(name, value) for name, value, _ in msg.fields] == [
        ("d", 2.5), ("f", -0.5), ("s64", -7), ("s32", -3), ("u32", 4_000_000_000),
        ("packed_s32", -1), ("packed_s32", 2), ("packed_d", 1.0), ("packed_d", -2.0),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_key(1, 1) + b"\0" * 7, "truncated 64-bit field at byte 1"),
        (_key(2, 5) + b"\0" * 3, "truncated 32-bit field at byte 1"),
        (_key(7, 2) + bytes([12]) + b"\0" * 12, "truncated packed double at byte 10"),
    ],
)
def test_truncated_fixed_width_fields_are_errors(data: bytes, message: str) -> None:
    with pytest.raises(ProtoError, match=message):
        decode_wire(data, SCHEMA, "M")


def test_text_numbers_with_a_suffix_and_the_words_for_infinity() -> None:
    """XLA's schedule dumps write a softmax mask's ``f32s: -inf``: the ``f`` that ends
    ``inf`` is no float suffix (it once read as ``-in``, a bad number)."""
    msg = parse_text("a: -inf b: inf c: 1.5f d: 0xf e: nan g: -2e3F h: infinity")
    values = {name: value for name, value, _ in msg.fields}
    assert values["a"] == -math.inf and values["b"] == math.inf and values["h"] == math.inf
    assert values["c"] == 1.5 and values["d"] == 15 and values["g"] == -2000.0
    assert math.isnan(values["e"])  # type: ignore[arg-type]
