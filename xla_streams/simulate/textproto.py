"""Protocol buffers as far as XLA's data files need them: the text format and the
binary wire format, read into one small tree (:class:`Message`).

JAX-free and standard library only: the simulator reads XLA's collective
performance table (``measured.py``) and PGLE profiles (``profile.py``) with it on
machines where jaxlib is absent. Text is parsed without a schema (fields by name);
binary is decoded with a hand-written :data:`Schema` naming the fields of the
messages the caller expects. Every error says where: ``path:line`` for text, the
byte offset for binary.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from xla_streams._wire import varint_at

Scalar = str | int | float | bool


class ProtoError(ValueError):
    """Input that is not the protocol buffer it should be; says ``path:line: what``."""

    def __init__(self, message: str, *, path: str = "<string>", line: int = 0) -> None:
        self.path = path
        self.line = line
        self.message = message
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {message}")


class EnumValue(str):
    """An enum written as a bare identifier (``F32``), not a quoted string."""


@dataclass
class Message:
    """A parsed message: its fields in file order (repeated fields repeat), each with
    the line it is on (0 for binary input), and the file it came from."""

    fields: list[tuple[str, Scalar | Message, int]] = field(default_factory=list)
    line: int = 0
    path: str = "<string>"

    def error(self, message: str, line: int | None = None) -> ProtoError:
        return ProtoError(message, path=self.path, line=self.line if line is None else line)

    def all(self, name: str) -> list[Scalar | Message]:
        return [v for n, v, _ in self.fields if n == name]

    def has(self, name: str) -> bool:
        return any(n == name for n, _, _ in self.fields)

    def line_of(self, name: str) -> int:
        for n, _, line in self.fields:
            if n == name:
                return line
        return self.line

    def one(self, name: str) -> Scalar | Message | None:
        values = self.all(name)
        if len(values) > 1:
            raise self.error(f"field '{name}' is given {len(values)} times", self.line_of(name))
        return values[0] if values else None

    def messages(self, name: str) -> list[Message]:
        out = []
        for n, v, line in self.fields:
            if n == name:
                if not isinstance(v, Message):
                    raise self.error(f"field '{name}' must be a message", line)
                out.append(v)
        return out

    def message(self, name: str) -> Message | None:
        value = self.one(name)
        if value is not None and not isinstance(value, Message):
            raise self.error(f"field '{name}' must be a message", self.line_of(name))
        return value

    def integer(self, name: str, default: int = 0) -> int:
        value = self.one(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"field '{name}' must be an integer", self.line_of(name))
        return value

    def integers(self, name: str) -> list[int]:
        out = []
        for n, v, line in self.fields:
            if n == name:
                if isinstance(v, bool) or not isinstance(v, int):
                    raise self.error(f"field '{name}' must be an integer", line)
                out.append(v)
        return out

    def number(self, name: str, default: float = 0.0) -> float:
        value = self.one(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(f"field '{name}' must be a number", self.line_of(name))
        return float(value)

    def string(self, name: str, default: str = "") -> str:
        value = self.one(name)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.error(f"field '{name}' must be a string or an enum", self.line_of(name))
        return value


# -- text format -------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<space>[ \t\r\f\v]+)
  | (?P<newline>\n)
  | (?P<comment>\#[^\n]*)
  | (?P<punct>[{}:;,<>\[\]])
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<number>[-+]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)[fF]?
                 |[-+]?(?:inf|infinity|nan)\b)
    """,
    re.VERBOSE,
)
_ESCAPES = {
    "n": 10, "t": 9, "r": 13, "\\": 92, "'": 39, '"': 34, "a": 7, "b": 8, "f": 12, "v": 11, "?": 63,
}  # fmt: skip
_WORDS: dict[str, Scalar] = {"true": True, "false": False, "True": True, "False": False}


def _unquote(literal: str, path: str, line: int) -> str:
    body, out, i = literal[1:-1], bytearray(), 0
    if "\\" not in body:
        return body  # nothing escaped: the text itself (most strings of XLA's tables)
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.extend(c.encode("utf-8"))
            i += 1
            continue
        e = body[i + 1]  # the token pattern guarantees a character after a backslash
        if e in _ESCAPES:
            out.append(_ESCAPES[e])
            i += 2
        elif e in "01234567":
            j = i + 1
            while j < len(body) and j < i + 4 and body[j] in "01234567":
                j += 1
            out.append(int(body[i + 1 : j], 8) & 0xFF)
            i = j
        elif e in "xX":
            j = i + 2
            while j < len(body) and j < i + 4 and body[j] in "0123456789abcdefABCDEF":
                j += 1
            if j == i + 2:
                raise ProtoError("\\x with no hex digits", path=path, line=line)
            out.append(int(body[i + 2 : j], 16))
            i = j
        else:
            raise ProtoError(f"unknown escape '\\{e}' in a string", path=path, line=line)
    return out.decode("utf-8", errors="replace")


def _tokens(text: str, path: str, first_line: int = 1) -> Iterator[tuple[str, str, int]]:
    """(kind, text, line) of each token: punct, string, ident or number."""
    line, pos, end = first_line, 0, len(text)
    match = _TOKEN.match
    while pos < end:
        m = match(text, pos)
        if m is None:
            raise ProtoError(f"unexpected character {text[pos]!r}", path=path, line=line)
        kind = m.lastgroup
        assert kind is not None
        pos = m.end()
        if kind == "newline":
            line += 1
        elif kind not in ("space", "comment"):
            yield kind, m.group(), line


def parse_text(text: str, path: str = "<string>", first_line: int = 1) -> Message:
    """Parse protocol-buffer text format (``name: value``, ``name {...}``,
    ``name: {...}``, ``name <...>``, ``name: [a, b]``) into a :class:`Message`.
    Strings are unquoted, numbers become int or float, ``true``/``false`` bool
    and other bare words :class:`EnumValue`. ``first_line``: the line ``text`` starts on
    in its file (for a part of one)."""
    tokens = list(_tokens(text, path, first_line))
    pos = 0
    closers = {"{": "}", "<": ">"}

    def scalar(kind: str, value: str, line: int) -> Scalar:
        if kind == "string":
            return _unquote(value, path, line)
        if kind == "number":
            # A float's `f` suffix goes (1.5f), but not the last letter of `inf` (XLA's
            # schedule dumps hold `-inf`: a softmax mask), nor a hexadecimal digit.
            bare = value.lstrip("+-").lower()
            word = value if bare.startswith(("0x", "inf", "nan")) else value.rstrip("fF")
            try:
                return int(word, 0)
            except ValueError:
                try:
                    return float(word)
                except ValueError:
                    raise ProtoError(f"bad number '{value}'", path=path, line=line) from None
        if value in _WORDS:
            return _WORDS[value]
        if value.lower() in ("inf", "infinity", "nan"):
            return float(value)
        return EnumValue(value)

    def fields(msg: Message, closer: str | None, opened_at: int) -> None:
        nonlocal pos
        while pos < len(tokens):
            kind, value, line = tokens[pos]
            if kind == "punct" and value == closer:
                pos += 1
                return
            if kind == "punct" and value in ";,":
                pos += 1
                continue
            if kind != "ident":
                raise ProtoError(f"expected a field name, found '{value}'", path=path, line=line)
            name = value
            pos += 1
            if pos >= len(tokens):
                raise ProtoError(f"field '{name}' has no value", path=path, line=line)
            kind, value, vline = tokens[pos]
            colon = kind == "punct" and value == ":"
            if colon:
                pos += 1
                if pos >= len(tokens):
                    raise ProtoError(f"field '{name}' has no value", path=path, line=line)
                kind, value, vline = tokens[pos]
            if kind == "punct" and value in closers:
                pos += 1
                sub = Message(line=line, path=path)
                fields(sub, closers[value], vline)
                msg.fields.append((name, sub, line))
            elif kind == "punct" and value == "[" and colon:
                pos += 1
                while True:
                    if pos >= len(tokens):
                        raise ProtoError(f"list of '{name}' is never closed", path=path, line=vline)
                    kind, value, eline = tokens[pos]
                    pos += 1
                    if kind == "punct" and value == "]":
                        break
                    if kind == "punct" and value == ",":
                        continue
                    if kind == "punct" and value in closers:
                        sub = Message(line=eline, path=path)
                        fields(sub, closers[value], eline)
                        msg.fields.append((name, sub, eline))
                    elif kind in ("string", "number", "ident"):
                        msg.fields.append((name, scalar(kind, value, eline), eline))
                    else:
                        raise ProtoError(
                            f"bad element '{value}' in the list of '{name}'", path=path, line=eline
                        )
            elif colon and kind in ("string", "number", "ident"):
                pos += 1
                if kind == "string":
                    # Adjacent string literals concatenate.
                    parts = [_unquote(value, path, vline)]
                    while pos < len(tokens) and tokens[pos][0] == "string":
                        parts.append(_unquote(tokens[pos][1], path, tokens[pos][2]))
                        pos += 1
                    msg.fields.append((name, "".join(parts), line))
                else:
                    msg.fields.append((name, scalar(kind, value, vline), line))
            else:
                raise ProtoError(f"bad value '{value}' for field '{name}'", path=path, line=vline)
        if closer is not None:
            raise ProtoError(
                f"'{ {'}': '{', '>': '<'}[closer] }' opened here is never closed",
                path=path,
                line=opened_at,
            )

    root = Message(line=first_line, path=path)
    fields(root, None, first_line)
    return root


# -- wire format -------------------------------------------------------------------

# A field's type: a scalar type name, "enum:<Enum>" (its value names from ``enums``)
# or "message:<Message>" (a name in the schema).
FieldType = str
# message name -> field number -> (field name, type)
Schema = Mapping[str, Mapping[int, tuple[str, FieldType]]]

_FIXED64_TYPES = frozenset({"double", "fixed64", "sfixed64"})
_FIXED32_TYPES = frozenset({"float", "fixed32", "sfixed32"})
_FIXED_WIDTH = {1: 8, 5: 4}  # wire type -> bytes: 1 is 64-bit, 5 is 32-bit


def read_varint(data: bytes, pos: int, path: str) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it; ProtoError naming ``path`` when
    it is truncated or too long."""
    try:
        return varint_at(data, pos)
    except ValueError as e:
        raise ProtoError(str(e), path=path) from None


def _fixed_value(data: bytes, pos: int, width: int, kind: str) -> Scalar:
    """The ``width``-byte little-endian field at ``pos``: a double or float, else a
    (s)fixed64 or (s)fixed32."""
    if kind in ("double", "float"):
        number: float = struct.unpack_from("<d" if width == 8 else "<f", data, pos)[0]
        return number
    value = int.from_bytes(data[pos : pos + width], "little")
    return _signed(value, 8 * width) if kind.startswith("sfixed") else value


def _signed(value: int, bits: int = 64) -> int:
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def _varint_value(raw: int, kind: str) -> Scalar:
    if kind == "bool":
        return raw != 0
    if kind in ("sint64", "sint32"):
        return (raw >> 1) ^ -(raw & 1)
    if kind in ("int64", "int32"):
        return _signed(raw)
    return raw


def decode_wire(
    data: bytes,
    schema: Schema,
    root: str,
    enums: Mapping[str, Mapping[int, str]] | None = None,
    path: str = "<bytes>",
) -> Message:
    """Decode binary ``data`` as message ``root`` of ``schema``. Fields the schema does
    not name are skipped; a malformed or truncated message is a ProtoError saying at
    which byte."""
    enums = enums or {}

    def decode(start: int, end: int, name: str) -> Message:
        fields_of = schema.get(name)
        if fields_of is None:
            raise ProtoError(f"no schema for message '{name}'", path=path)
        msg = Message(path=path)
        pos = start
        while pos < end:
            key, pos = read_varint(data, pos, path)
            number, wire = key >> 3, key & 7
            spec = fields_of.get(number)
            if wire == 0:
                raw, pos = read_varint(data, pos, path)
                if spec is not None:
                    fname, kind = spec
                    if kind.startswith("enum:"):
                        label = enums.get(kind[5:], {}).get(raw)
                        msg.fields.append(
                            (fname, EnumValue(label) if label is not None else raw, 0)
                        )
                    else:
                        msg.fields.append((fname, _varint_value(raw, kind), 0))
            elif wire in _FIXED_WIDTH:
                width = _FIXED_WIDTH[wire]
                if pos + width > end:
                    raise ProtoError(f"truncated {8 * width}-bit field at byte {pos}", path=path)
                if spec is not None:
                    fname, kind = spec
                    msg.fields.append((fname, _fixed_value(data, pos, width, kind), 0))
                pos += width
            elif wire == 2:
                length, pos = read_varint(data, pos, path)
                if pos + length > end:
                    raise ProtoError(
                        f"field {number} of '{name}' runs past the end of its message "
                        f"(byte {pos}, length {length})",
                        path=path,
                    )
                if spec is not None:
                    fname, kind = spec
                    if kind.startswith("message:"):
                        msg.fields.append((fname, decode(pos, pos + length, kind[8:]), 0))
                    elif kind == "string":
                        text = data[pos : pos + length].decode("utf-8", errors="replace")
                        msg.fields.append((fname, text, 0))
                    elif kind == "bytes":
                        msg.fields.append((fname, data[pos : pos + length].hex(), 0))
                    else:  # a packed repeated scalar
                        for element in _packed(data, pos, pos + length, kind, enums):
                            msg.fields.append((fname, element, 0))
                pos += length
            else:
                raise ProtoError(
                    f"unsupported wire type {wire} (field {number} of '{name}') at byte {pos}",
                    path=path,
                )
        if pos != end:
            raise ProtoError(f"message '{name}' overruns its length at byte {pos}", path=path)
        return msg

    return decode(0, len(data), root)


def _packed(
    data: bytes, pos: int, end: int, kind: str, enums: Mapping[str, Mapping[int, str]]
) -> Iterator[Scalar]:
    width = 8 if kind in _FIXED64_TYPES else 4 if kind in _FIXED32_TYPES else 0
    while pos < end:
        if width:
            if pos + width > end:
                raise ProtoError(f"truncated packed {kind} at byte {pos}", path="<packed>")
            yield _fixed_value(data, pos, width, kind)
            pos += width
        else:
            raw, pos = read_varint(data, pos, "<packed>")
            if kind.startswith("enum:"):
                label = enums.get(kind[5:], {}).get(raw)
                yield EnumValue(label) if label is not None else raw
            else:
                yield _varint_value(raw, kind)


# -- writing text ---------------------------------------------------------------------


def _literal(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, EnumValue):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, float):
        return repr(value)
    return str(value)


def format_text(msg: Message, indent: int = 0, width: int = 80) -> str:
    """``msg`` in text format, 2 spaces per level; a sub-message of scalars only that
    fits in ``width`` columns goes on one line (``{}`` when empty)."""
    out: list[str] = []
    _format(msg, indent, width, out)
    return "".join(out)


def _format(msg: Message, indent: int, width: int, out: list[str]) -> None:
    pad = " " * indent
    for name, value, _ in msg.fields:
        if not isinstance(value, Message):
            out.append(f"{pad}{name}: {_literal(value)}\n")
            continue
        if not value.fields:
            out.append(f"{pad}{name} {{}}\n")
            continue
        if all(not isinstance(v, Message) for _, v, _ in value.fields):
            inner = " ".join(
                f"{n}: {_literal(v)}" for n, v, _ in value.fields if not isinstance(v, Message)
            )
            line = f"{pad}{name} {{ {inner} }}"
            if len(line) <= width:
                out.append(line + "\n")
                continue
        out.append(f"{pad}{name} {{\n")
        _format(value, indent + 2, width, out)
        out.append(f"{pad}}}\n")
