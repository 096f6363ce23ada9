"""What a command reads: HLO text, from a file or standard input, at most
:data:`MAX_INPUT_BYTES`.

An input is UTF-8 (a byte that is not is an error at its line and column; gzip data
says to gunzip it) with no NUL byte. A larger file is refused from its size before
anything is read; standard input, a pipe or a device is refused once that much has
been read (and at the first NUL, so ``/dev/zero`` at once).
"""

from __future__ import annotations

import os
import stat
from typing import Any, TextIO

from xla_streams.hlo import HloError

STDIO = "-"
# The largest input read. The largest real modules are tens of MB of HLO text; a
# bigger input is a wrong file (or /dev/zero), refused rather than read into memory.
MAX_INPUT_BYTES = 1 << 30
_READ_CHUNK = 1 << 24


class InputError(Exception):
    """An input that cannot be read or an output that cannot be written (exit code 2)."""


def read_input(path: str, stdin: TextIO) -> tuple[str, str]:
    """The HLO text at ``path`` (``-``: ``stdin``): (its name for messages, its text).
    InputError where it cannot be read or is too large, HloError where it is no text."""
    name = "standard input" if path == STDIO else f"'{path}'"
    where = "<stdin>" if path == STDIO else path
    try:
        if path == STDIO:
            # Bytes, so that nothing (a CR) is translated on the way to the output.
            buffer = getattr(stdin, "buffer", None)
            if buffer is None:  # a text stream (in-process callers): already decoded
                text = stdin.read(MAX_INPUT_BYTES + 1)
                if len(text) > MAX_INPUT_BYTES:
                    raise InputError(_too_large(name))
                return where, text
            data = _read_capped(buffer, name)
        else:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                if stat.S_ISREG(st.st_mode) and st.st_size > MAX_INPUT_BYTES:
                    raise InputError(_too_large(name, st.st_size))
                data = _read_capped(f, name)
    except OSError as e:
        raise InputError(f"cannot read {name}: {os_reason(e)}") from None
    return where, _decoded(data, where, name)


def _too_large(name: str, size: int | None = None) -> str:
    has = f"is {size} bytes," if size is not None else "holds"
    return (
        f"{name} {has} more than the {MAX_INPUT_BYTES} bytes (1 GiB) an input may be "
        "(MAX_INPUT_BYTES): HLO text of the largest programs is tens of MB"
    )


def _read_capped(f: Any, name: str) -> bytes:
    """At most MAX_INPUT_BYTES from ``f``, InputError past them; reading stops after a
    chunk holding a NUL byte, which HLO text never holds (the caller says where)."""
    chunks: list[bytes] = []
    total = 0
    while chunk := f.read(min(_READ_CHUNK, MAX_INPUT_BYTES + 1 - total)):
        chunks.append(chunk)
        total += len(chunk)
        if total > MAX_INPUT_BYTES:
            raise InputError(_too_large(name))
        if b"\0" in chunk:
            break
    return b"".join(chunks)


def _decoded(data: bytes, where: str, name: str) -> str:
    """``data`` as UTF-8 text; an HloError at the line and column of the first byte that
    is not UTF-8, or of the first NUL (HLO text holds none)."""
    nul = data.find(b"\0")
    try:
        text = (data[:nul] if nul >= 0 else data).decode("utf-8")
    except UnicodeDecodeError as e:
        if data.startswith(b"\x1f\x8b"):
            what = "gzip-compressed data: gunzip it first"
        else:
            what = f"binary data: byte 0x{data[e.start]:02x} is not UTF-8"
        raise _byte_error(data, e.start, where, f"{name} is not HLO text ({what})") from None
    if nul >= 0:
        raise _byte_error(data, nul, where, f"{name} is not HLO text (a NUL byte)")
    return text


def _byte_error(data: bytes, at: int, where: str, what: str) -> HloError:
    """An HloError at byte ``at`` of ``data``, everything before which is UTF-8."""
    line_start = data.rfind(b"\n", 0, at) + 1
    line_end = data.find(b"\n", at, at + 10_000)
    line = data[line_start : line_end if line_end >= 0 else at + 200]
    return HloError(
        f"{what}; give the text that compiled.as_text() or an --xla_dump_to "
        "*after_optimizations.txt file holds",
        path=where,
        line=data.count(b"\n", 0, at) + 1,
        column=len(data[line_start:at].decode("utf-8")) + 1,  # characters, as parse errors
        source_line=(
            line.decode("utf-8", "replace").replace("\0", "?").rstrip("\r")
            if at - line_start < 10_000
            else ""
        ),
    )


def os_reason(e: BaseException) -> str:
    return e.strerror if isinstance(e, OSError) and e.strerror else str(e)
