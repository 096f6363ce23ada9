"""Bracket- and string-aware scanning of HLO text.

Attribute values nest (``{{0,1},{2,3}}``), embed JSON whose strings may hold any
bracket, and carry ``/*index=5*/`` comments, so splitting on commas or finding a
closing bracket must skip quoted strings and track depth.
"""

from __future__ import annotations

import re

# A whole double-quoted string (with escapes) is one token, so brackets inside
# it are never counted; a lone quote is an unterminated string.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|"|/\*.*?\*/|[(){}\[\],]')
_CLOSER = {"(": ")", "{": "}", "[": "]"}


class ScanError(Exception):
    """Raised with the offset (into the scanned string) where the text went wrong."""

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(message)
        self.offset = offset
        self.message = message


def split_top_level(s: str, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    """Spans of the comma-separated items of ``s[start:end]`` at bracket depth 0.

    Items are trimmed of surrounding spaces; an empty range gives no items.
    """
    if end is None:
        end = len(s)
    spans: list[tuple[int, int]] = []
    stack: list[tuple[str, int]] = []
    piece = start
    for m in _TOKENS.finditer(s, start, end):
        token = m.group()
        c = token[0]
        if c == '"':
            if len(token) == 1:
                raise ScanError(m.start(), "unterminated string")
        elif c in _CLOSER:
            stack.append((c, m.start()))
        elif c in ")}]":
            if not stack or _CLOSER[stack[-1][0]] != c:
                expected = f"'{_CLOSER[stack[-1][0]]}'" if stack else "no closing bracket"
                raise ScanError(m.start(), f"unbalanced '{c}': expected {expected}")
            stack.pop()
        elif c == "," and not stack:
            spans.append(_trim(s, piece, m.start()))
            piece = m.end()
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
    depth = 0
    for m in _TOKENS.finditer(s, open_index, end):
        token = m.group()
        c = token[0]
        if c == '"':
            if len(token) == 1:
                raise ScanError(m.start(), "unterminated string")
        elif c in _CLOSER:
            depth += 1
        elif c in ")}]":
            depth -= 1
            if depth == 0:
                return m.start()
    raise ScanError(
        open_index, f"'{s[open_index]}' is never closed: expected '{_CLOSER[s[open_index]]}'"
    )


def check_balanced(s: str, start: int = 0) -> None:
    """Raise ScanError at the first bracket or quote of ``s[start:]`` that does not pair up."""
    split_top_level(s, start, len(s))


def _trim(s: str, start: int, end: int) -> tuple[int, int]:
    while start < end and s[start] == " ":
        start += 1
    while end > start and s[end - 1] == " ":
        end -= 1
    return start, end
