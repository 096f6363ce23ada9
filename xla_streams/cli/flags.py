"""The flags of an ``xla-streams`` command: a table of :class:`Flag`, read by :func:`parse`.

A command lists its flags; ``xla-streams CMD --help`` prints that list and
nothing else. The spellings are absl's, which the command line used before and
XLA's own tools use: ``--name=value`` or ``--name value``, ``-s value`` for a
short name, one dash or two; a boolean is ``--name``, ``--noname`` or
``--no-name`` (or ``--name=true|false``); the last of repeated flags wins; ``--``
ends the flags; flags and arguments may interleave. Not absl itself: importing
absl.flags costs 20-30 ms, more than the rest of a command's start-up, and the
offline commands are judged against XLA's C++ on whole-process time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


class FlagError(ValueError):
    """A command line whose flags cannot be read (exit code 2)."""


@dataclass(frozen=True)
class Flag:
    """One flag: its name, default, help, and the reader of its value."""

    name: str
    default: Any
    help: str
    # Reads the value as given; raises ValueError saying what was expected.
    read: Callable[[str], Any] = str
    short: str | None = None
    metavar: str = ""  # the value in --help: `--name=METAVAR`
    boolean: bool = False


def string(
    name: str, default: str | None, help: str, *, short: str | None = None,
    metavar: str | None = None,
) -> Flag:  # fmt: skip
    return Flag(name, default, help, short=short, metavar=metavar or _metavar(name))


def boolean(name: str, default: bool | None, help: str, *, short: str | None = None) -> Flag:
    return Flag(name, default, help, _read_bool, short=short, boolean=True)


def integer(
    name: str, default: int | None, help: str, *, lower: int | None = None,
    upper: int | None = None, read: Callable[[str], int] | None = None,
) -> Flag:  # fmt: skip
    """An integer in [lower, upper] (ASCII decimal digits), or what ``read`` makes of it."""
    return Flag(name, default, help, read or _bounded(_read_int, lower, upper), metavar="N")


def real(name: str, default: float, help: str, *, lower: float, upper: float | None = None) -> Flag:
    return Flag(name, default, help, _bounded(_read_float, lower, upper), metavar=_metavar(name))


def enum(name: str, default: str, choices: Sequence[str], help: str) -> Flag:
    def read(value: str) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value

    return Flag(name, default, help, read, metavar="|".join(choices))


def names(name: str, default: list[str] | None, help: str) -> Flag:
    """A comma-separated list of names."""
    return Flag(name, default, help, _read_names, metavar="NAME,...")


def parse(argv: Sequence[str], table: Sequence[Flag]) -> tuple[dict[str, Any], list[str]]:
    """The value of every flag of ``table`` (its default unless ``argv`` sets it) and
    the positional arguments, in order. FlagError names the flag that is wrong."""
    by_name = {f.name: f for f in table} | {f.short: f for f in table if f.short}
    values = {f.name: f.default for f in table}
    positional: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            positional += argv[i:]
            break
        if not arg.startswith("-") or arg == "-":
            positional.append(arg)
            continue
        name, has_value, value = arg[2 if arg.startswith("--") else 1 :].partition("=")
        flag = by_name.get(name)
        if flag is None and not has_value:
            negated = by_name.get(name.removeprefix("no").removeprefix("-"))
            if name.startswith("no") and negated is not None and negated.boolean:
                values[negated.name] = False
                continue
        if flag is None:
            raise FlagError(f"unknown flag '{arg.partition('=')[0]}'")
        if flag.boolean and not has_value:
            value = "true"
        elif not has_value:
            if i == len(argv):
                raise FlagError(f"flag --{flag.name} needs a value")
            value = argv[i]
            i += 1
        try:
            values[flag.name] = flag.read(value)
        except ValueError as e:
            raise FlagError(f"flag --{flag.name}={value}: {e}") from None
    return values, positional


def _metavar(name: str) -> str:
    return name.upper().replace("-", "_")


def _read_bool(value: str) -> bool:
    lowered = value.lower()
    if lowered in ("true", "t", "1", "yes"):
        return True
    if lowered in ("false", "f", "0", "no"):
        return False
    raise ValueError("expected true or false")


def _read_int(value: str) -> int:
    digits = value.strip().removeprefix("-")
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 18:
        raise ValueError("expected an integer")
    return int(value)


def _read_float(value: str) -> float:
    # float() also reads '٤' (4) and '1_0' (10): a number here is ASCII, no separators.
    if not value.isascii() or "_" in value:
        raise ValueError("expected a number")
    try:
        number = float(value)
    except ValueError:
        raise ValueError("expected a number") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise ValueError("expected a finite number")
    return number


def _bounded[T: (int, float)](
    read: Callable[[str], T], lower: T | None, upper: T | None
) -> Callable[[str], T]:
    def bounded(value: str) -> T:
        number = read(value)
        if (lower is not None and number < lower) or (upper is not None and number > upper):
            low = "" if lower is None else f"at least {lower}"
            high = "" if upper is None else f"at most {upper}"
            raise ValueError(f"expected a number {' and '.join(filter(None, (low, high)))}")
        return number

    return bounded


def _read_names(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]
