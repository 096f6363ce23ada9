"""The one reader of the project's JSON files, with located errors.

Every format (``docs/formats.md`` lists them) is a dataclass beside the code that
produces it, with ``to_json`` and ``from_json``; ``from_json`` reads through a
:class:`Value`, so each wrong field is reported the same way, as the file and the
field's path::

    tune.json: candidates[3].xla_flags: expected a JSON object, got a JSON array

:func:`load` and :func:`loads` turn what cannot be read at all (a missing file, bad
UTF-8, not JSON, nested too deeply, too large) into the same error, so a reader
never lets a ``json`` or ``OSError`` traceback through. The error type is the
caller's (``TuneError``, ``CalibrationError``, ...), so each front end keeps its own.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

MAX_BYTES = 64 << 20  # no project file comes near; a larger one is not ours


def is_finite_number(value: Any) -> bool:
    """A JSON number a float holds: not a bool, not NaN or Infinity (Python's json reads
    them), not an integer beyond any float (it reads integers of any length)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def load(
    path: str | os.PathLike[str],
    error: type[Exception] = ValueError,
    *,
    what: str = "file",
    max_bytes: int = MAX_BYTES,
) -> Value:
    """The JSON document in ``path``, or ``error("<path>: cannot read the <what>: ...")``."""
    where = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
        if len(raw) > max_bytes:
            raise error(f"{where}: larger than {max_bytes} bytes: not a {what}")
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise error(f"{where}: cannot read the {what}: {reason}") from None
    return loads(text, where, error, what=what)


def loads(
    text: str, where: str, error: type[Exception] = ValueError, *, what: str = "file"
) -> Value:
    """The JSON document ``text`` (read from ``where``), or ``error`` saying why not."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{where}: not JSON: {e}") from None
    except RecursionError:
        raise error(f"{where}: not a {what}: JSON nested too deeply") from None
    except ValueError as e:  # e.g. an integer with too many digits
        raise error(f"{where}: not JSON: {str(e).splitlines()[0]}") from None
    return Value(data, where, "", error)


def dumps(data: Any) -> str:
    """``data`` as every project file is written: indented, ASCII, no NaN, a final newline."""
    return json.dumps(data, indent=2, ensure_ascii=True, allow_nan=False) + "\n"


@dataclass(frozen=True)
class Value:
    """One value of a JSON document and where it is (file, path); each accessor
    returns it typed or raises the document's error at that path."""

    raw: Any
    where: str
    path: str
    error: type[Exception]

    def fail(self, message: str) -> NoReturn:
        at = f"{self.where}: {self.path}: " if self.path else f"{self.where}: "
        raise self.error(at + message)

    # -- containers ------------------------------------------------------------------

    def fields(self) -> dict[str, Value]:
        """An object's members."""
        if not isinstance(self.raw, dict):
            self.fail(f"expected a JSON object, got {describe(self.raw)}")
        return {
            k: self._child(f"{self.path}.{k}" if self.path else k, v) for k, v in self.raw.items()
        }

    def items(self) -> list[Value]:
        """An array's elements."""
        if not isinstance(self.raw, list):
            self.fail(f"expected a JSON array, got {describe(self.raw)}")
        return [self._child(f"{self.path}[{i}]", v) for i, v in enumerate(self.raw)]

    def __getitem__(self, key: str) -> Value:
        """A required member of an object."""
        value = self.get(key)
        if value is None:
            self._child(f"{self.path}.{key}" if self.path else key, None).fail("missing")
        return value

    def get(self, key: str) -> Value | None:
        """A member of an object, None when absent (a JSON null is present)."""
        if not isinstance(self.raw, dict):
            self.fail(f"expected a JSON object, got {describe(self.raw)}")
        if key not in self.raw:
            return None
        return self._child(f"{self.path}.{key}" if self.path else key, self.raw[key])

    def only(self, *keys: str) -> None:
        """Refuse members other than ``keys`` (formats that allow no extra fields)."""
        unknown = sorted(set(self.fields()) - set(keys))
        if unknown:
            self.fail(f"unknown key(s) {', '.join(unknown)}; expected {', '.join(keys)}")

    # -- scalars ---------------------------------------------------------------------

    def string(self) -> str:
        if not isinstance(self.raw, str):
            self.fail(f"expected a string, got {describe(self.raw)}")
        return self.raw

    def boolean(self) -> bool:
        if not isinstance(self.raw, bool):
            self.fail(f"expected true or false, got {describe(self.raw)}")
        return self.raw

    def integer(self, minimum: int | None = None, maximum: int | None = None) -> int:
        """An integer, at least ``minimum`` and at most ``maximum`` if given."""
        if not isinstance(self.raw, int) or isinstance(self.raw, bool):
            self.fail(f"expected an integer, got {describe(self.raw)}")
        low = minimum is not None and self.raw < minimum
        high = maximum is not None and self.raw > maximum
        if low or high:
            bound = (
                f">= {minimum}" if maximum is None
                else f"<= {maximum}" if minimum is None
                else f"in {minimum}..{maximum}"
            )  # fmt: skip
            self.fail(f"expected an integer {bound}, got {self.raw}")
        return self.raw

    def number(self, minimum: float | None = None) -> float:
        """A finite number (an integer is one), at least ``minimum`` if given."""
        if not is_finite_number(self.raw):
            self.fail(f"expected a number, got {describe(self.raw)}")
        if minimum is not None and self.raw < minimum:
            self.fail(f"expected a number >= {minimum}, got {self.raw}")
        return float(self.raw)

    def one_of[S: str](self, choices: tuple[S, ...]) -> S:
        """One of ``choices`` (typed as they are: a ``Literal``'s values give that type)."""
        text = self.string()
        for choice in choices:
            if choice == text:
                return choice
        self.fail(f"expected one of {', '.join(choices)}, got {text!r}")

    def nullable[T](self, read: Callable[[Value], T]) -> T | None:
        """None for a JSON null, else the value as ``read`` reads it (``Value.string``...)."""
        return None if self.raw is None else read(self)

    def schema(self, expected: str) -> None:
        """Refuse a document whose ``schema`` member is not ``expected``."""
        if not isinstance(self.raw, dict):
            self.fail(
                f'expected a JSON object with "schema": "{expected}", got {describe(self.raw)}'
            )
        found = self.raw.get("schema")
        if found != expected:
            self._child("schema", found).fail(f"expected {expected!r}, got {found!r}")

    def _child(self, path: str, raw: Any) -> Value:
        return Value(raw, self.where, path, self.error)


def describe(value: Any) -> str:
    """A JSON value's type as a message names it (short values shown)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})" if len(value) < 40 else "a string"
    if isinstance(value, list):
        return "a JSON array"
    if isinstance(value, dict):
        return "a JSON object"
    return type(value).__name__
