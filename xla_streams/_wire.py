"""The protobuf wire format's varints and length-delimited fields: what xla_streams
reads and writes of XLA's protos by hand (the HloModuleProto in the compile hook,
the measured collective tables and PGLE profiles), without the protobuf package.
Imports nothing: the compile hook uses it.
"""

from __future__ import annotations


def varint_at(data: bytes, pos: int) -> tuple[int, int]:
    """The base-128 varint at ``pos`` and the position after it; ValueError when it is
    truncated or longer than the 10 bytes of a 64-bit value."""
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError(f"truncated varint at byte {pos}")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError(f"varint longer than 10 bytes at byte {pos}")


def encode_varint(value: int) -> bytes:
    if value < 0:  # int64's ten-byte two's complement: nothing written here needs it
        raise ValueError(f"cannot encode {value}: a varint here is not negative")
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, value: bytes | int) -> bytes:
    """Field ``number`` holding a varint (an int) or length-delimited bytes."""
    if isinstance(value, int):
        return encode_varint(number << 3) + encode_varint(value)
    return encode_varint(number << 3 | 2) + encode_varint(len(value)) + value
