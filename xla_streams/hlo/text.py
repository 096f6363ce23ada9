"""Bracket- and string-aware scanning of HLO text.

Attribute values nest (``{{0,1},{2,3}}``), embed JSON whose strings may hold any
bracket, and carry ``/*index=5*/`` comments, so splitting on commas or finding a
closing bracket must skip quoted strings and comments and track depth.

Every scan here is linear in the length of its input, hostile input included:
the plugin parses whatever a job compiles, and a regex that backtracks turns a
few hundred KB into minutes.
"""

from __future__ import annotations

import re

_NESTING = re.compile(r'[(){}\[\]"]|/\*')
# What the scans step over in one regex call: all but brackets, quotes and comments,
# a whole double-quoted string (with escapes) included, so that brackets inside it are
# never counted and the Python loop sees only brackets (a long JSON backend config holds
# dozens of strings and commas for a few brackets). _SKIP_TOP also stops at commas.
# Possessive throughout, so nothing backtracks: a quote whose string does not close
# costs one pass, and the scan stops there (an unterminated string), as it does at a
# "/*" (a comment, stepped over with one find(), or an unterminated one). Linear.
_STRING = r'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
_PLAIN = rf'[^"(){{}}\[\]/]++|{_STRING}|/(?!\*)'
# Whole bracket groups are stepped over too, when they nest at most two deep, each
# closed by its own kind, with no comment and no unterminated string: the Python loop
# would push and pop them with no error and no comma at depth 0, so it need not see
# them (`{0}`, `mesh[...] {...}`, `metadata={...}`, most JSON). Any other group fails
# to match, and the loop reads it bracket by bracket. A failed try stops at the first
# bracket nested deeper or not paired: each character is read at most three times, so
# the scans stay linear.
_FLAT_GROUP = rf"\((?:{_PLAIN})*+\)|\{{(?:{_PLAIN})*+\}}|\[(?:{_PLAIN})*+\]"
_GROUP = (
    rf"\((?:{_PLAIN}|{_FLAT_GROUP})*+\)|\{{(?:{_PLAIN}|{_FLAT_GROUP})*+\}}"
    rf"|\[(?:{_PLAIN}|{_FLAT_GROUP})*+\]"
)
_SKIP_NESTED = re.compile(rf"(?:{_PLAIN}|{_GROUP})*+", re.DOTALL)
_SKIP_TOP = re.compile(rf'(?:[^"(){{}}\[\],/]++|{_STRING}|/(?!\*)|{_GROUP})*+', re.DOTALL)
_STRING_OR_LINE_COMMENT = re.compile(rf'{_STRING}|"|//')
_CLOSER = {"(": ")", "{": "}", "[": "]"}
_CLOSERS = frozenset(_CLOSER.values())
# What XLA's lexer skips between tokens (a CRLF file leaves "\r" at line ends).
WHITESPACE = " \t\r\n"
# A name as XLA's lexer reads one (hlo_lexer.cc): a letter or `_`, then letters,
# digits, `_`, `.` and `-`. So no `/` (a `// x = ...` comment is no instruction), no
# `#` (`%t#1` refers to tuple element 1 of `%t`), no NUL and nothing non-ASCII.
NAME = r"[A-Za-z_][A-Za-z0-9_.\-]*"
_NAME = re.compile(NAME)
INT64_MAX = (1 << 63) - 1


class ScanError(Exception):
    """Raised with the offset (into the scanned string) where the text went wrong."""

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(message)
        self.offset = offset
        self.message = message


def split_top_level(s: str, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    """Spans of the comma-separated items of ``s[start:end]`` at bracket depth 0.

    Items are trimmed of surrounding whitespace; an empty range gives no items.
    """
    if end is None:
        end = len(s)
    spans: list[tuple[int, int]] = []
    piece = start
    if _NESTING.search(s, start, end) is None:
        # Nothing nests or quotes (most operand lists): commas split, no token loop.
        while (comma := s.find(",", piece, end)) >= 0:
            spans.append(_trim(s, piece, comma))
            piece = comma + 1
        last = _trim(s, piece, end)
        if spans or last[0] < last[1]:
            spans.append(last)
        return spans
    stack: list[tuple[str, int]] = []
    pos = start
    while True:
        m = (_SKIP_NESTED if stack else _SKIP_TOP).match(s, pos, end)
        if m is None or (pos := m.end()) >= end:  # None only past the end
            break
        c = s[pos]  # a comma at depth 0, a bracket, or what starts an unclosed string/comment
        if c == ",":
            spans.append(_trim(s, piece, pos))
            piece = pos + 1
        elif c in _CLOSER:
            stack.append((c, pos))
        elif c in _CLOSERS:
            if not stack or _CLOSER[stack[-1][0]] != c:
                expected = f"'{_CLOSER[stack[-1][0]]}'" if stack else "no closing bracket"
                raise ScanError(pos, f"unbalanced '{c}': expected {expected}")
            stack.pop()
        else:
            pos = _past_comment(s, pos, end)
            continue
        pos += 1
    if stack:
        opener, at = stack[-1]
        raise ScanError(at, f"'{opener}' is never closed: expected '{_CLOSER[opener]}'")
    last = _trim(s, piece, end)
    if spans or last[0] < last[1]:
        spans.append(last)
    return spans


def find_closing(s: str, open_index: int, end: int | None = None) -> int:
    """Index of the bracket that closes the one at ``s[open_index]``."""
    if end is None:
        end = len(s)
    # From inside the group: _SKIP_NESTED would step over the whole of it.
    depth = 1
    pos = open_index + 1
    while True:
        m = _SKIP_NESTED.match(s, pos, end)
        if m is None or (pos := m.end()) >= end:  # None only past the end
            break
        c = s[pos]
        if c in _CLOSER:
            depth += 1
        elif c in _CLOSERS:
            depth -= 1
            if depth == 0:
                return pos
        else:
            pos = _past_comment(s, pos, end)
            continue
        pos += 1
    raise ScanError(
        open_index, f"'{s[open_index]}' is never closed: expected '{_CLOSER[s[open_index]]}'"
    )


def code_end(s: str, start: int = 0) -> int:
    """Where a `//` comment (not in a string) starts in ``s[start:]``; else its end."""
    pos = start
    while (m := _STRING_OR_LINE_COMMENT.search(s, pos)) is not None:
        if m.group() == "//":
            return m.start()
        if m.group() == '"':
            break  # a string that never closes: no comment after it
        pos = m.end()
    return len(s)


def blank_comments(s: str) -> str:
    """``s`` with every ``/*...*/`` replaced by as many spaces, so offsets still hold.

    For text without quoted strings (shapes, operand lists, replica groups). An
    unterminated ``/*`` is left in place for the caller's grammar to reject.
    """
    if "/*" not in s:
        return s
    parts = []
    pos = 0
    while (i := s.find("/*", pos)) >= 0:
        j = s.find("*/", i + 2)
        if j < 0:
            break  # and so is every later "/*": one failed search, not one per "/*"
        parts.append(s[pos:i])
        parts.append(" " * (j + 2 - i))
        pos = j + 2
    parts.append(s[pos:])
    return "".join(parts)


def parse_int(digits: str, offset: int = 0) -> int:
    """A decimal int64 (XLA's integer type); ScanError at ``offset`` when out of range.

    Checked on length first: Python refuses to convert more than 4300 digits
    (ValueError), and a number that large is nothing XLA would read anyway.
    """
    if len(digits) < 19 and digits.isdigit() and digits.isascii():
        return int(digits)  # the common case, checked cheaply
    body = digits.strip(WHITESPACE).removeprefix("-")
    if not body.isdigit() or not body.isascii():
        raise ScanError(offset, f"expected an integer, found '{digits.strip(WHITESPACE)}'")
    if len(body) > 19 or int(body) > INT64_MAX:
        raise ScanError(offset, f"integer {digits.strip(WHITESPACE)[:30]} is out of range")
    return int(digits)


def operand_name(item: str) -> tuple[int, int]:
    """The span of the instruction name an operand ends with, its `%` left out: ``%x``,
    ``x``, or with the shape older XLA printed before it, ``f32[2] %x``, ``(s32[])%x``;
    an empty span at the end when ``item`` ends with no name."""
    end = len(item.rstrip(WHITESPACE))
    words = item.rsplit(None, 1) if end else [""]
    start = end - len(words[-1].rstrip(WHITESPACE))
    start += item.startswith("%", start)
    if _NAME.fullmatch(item, start, end) is None:
        start = item.rfind("%", 0, end) + 1
        if start == 0 or _NAME.fullmatch(item, start, end) is None:
            return end, end
    return start, end


def excerpt(text: str, limit: int = 80) -> str:
    """``text`` shortened for an error message (hostile input may be one huge token)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _past_comment(s: str, pos: int, end: int) -> int:
    """Where the comment opening at ``s[pos]`` ends; ScanError if it does not, or if
    ``s[pos]`` opens a string that does not close (what the _SKIP patterns stop at)."""
    if s[pos] == '"':
        raise ScanError(pos, "unterminated string")
    close = s.find("*/", pos + 2, end)
    if close < 0:
        raise ScanError(pos, "unterminated comment: expected '*/'")
    return close + 2


def _trim(s: str, start: int, end: int) -> tuple[int, int]:
    while start < end and s[start] in WHITESPACE:
        start += 1
    while end > start and s[end - 1] in WHITESPACE:
        end -= 1
    return start, end
