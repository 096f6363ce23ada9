"""The protobuf wire format's varints and fields, as the hook and the table readers use them."""

from __future__ import annotations

import pytest

from xla_streams._wire import encode_varint, field, varint_at


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**32, 2**63 - 1, 2**64 - 1])
def test_varints_round_trip(value: int) -> None:
    data = b"\xff" + encode_varint(value) + b"\x00"
    assert varint_at(data, 1) == (value, len(data) - 1)


def test_known_encodings() -> None:
    assert encode_varint(300) == b"\xac\x02"  # the protobuf documentation's example
    assert field(1, 150) == b"\x08\x96\x01"
    assert field(2, b"testing") == b"\x12\x07testing"


@pytest.mark.parametrize(
    ("data", "message"),
    [(b"\x80\x80", "truncated varint at byte 2"), (b"\xff" * 11, "longer than 10 bytes")],
)
def test_bad_varints_are_errors(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        varint_at(data, 0)


def test_negative_values_are_refused_not_looped_on() -> None:
    with pytest.raises(ValueError, match="not negative"):
        encode_varint(-1)
