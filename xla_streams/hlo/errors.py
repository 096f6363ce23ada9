"""The one error type for bad input: where it is and what was expected there."""

from __future__ import annotations

_CONTEXT = 60  # characters of the offending line shown on each side of the caret


class HloError(Exception):
    """Malformed or unsupported HLO text, located at ``path:line:column`` (1-based)."""

    def __init__(
        self, message: str, *, path: str, line: int, column: int, source_line: str = ""
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.line = line
        self.column = column
        self.source_line = source_line

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}:{self.column}: error: {self.message}"
        if not self.source_line:
            return where
        # Lines of scheduled HLO run to thousands of characters: show a window.
        start = max(0, self.column - 1 - _CONTEXT)
        end = self.column - 1 + _CONTEXT
        prefix = "..." if start > 0 else ""
        suffix = "..." if end < len(self.source_line) else ""
        shown = prefix + self.source_line[start:end] + suffix
        caret = " " * (len(prefix) + self.column - 1 - start) + "^"
        return f"{where}\n  {shown}\n  {caret}"
