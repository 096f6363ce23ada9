"""The command line's flag reader: :func:`parse` reads a command's table of
:class:`~xla_streams.option.Option`, each under its flag (``Option.flag_name``).

A command lists its flags; ``xla-streams CMD --help`` prints that list and
nothing else. The spellings are absl's, which the command line used before and
XLA's own tools use: ``--name=value`` or ``--name value``, ``-s value`` for a
short name, one dash or two; a switch is ``--name``, ``--noname`` or
``--no-name`` (or ``--name=true|false``); the last of repeated flags wins; ``--``
ends the flags; flags and arguments may interleave. Not absl itself: importing
absl.flags costs 20-30 ms, more than the rest of a command's start-up, and the
offline commands are judged against XLA's C++ on whole-process time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from xla_streams.option import Option, OptionError, suggestion


class FlagError(ValueError):
    """A command line whose flags cannot be read (exit code 2)."""


def parse(argv: Sequence[str], table: Sequence[Option[Any]]) -> tuple[dict[str, Any], list[str]]:
    """The value of every option of ``table``, by name (its default unless ``argv`` sets
    it), and the positional arguments, in order. FlagError names the flag that is wrong,
    and the nearest flag to one that is unknown."""
    by_flag = {o.flag_name: o for o in table} | {o.short: o for o in table if o.short}
    values = {o.name: o.default for o in table}
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
        found = by_flag.get(name)
        if found is None and not has_value:
            negated = by_flag.get(name.removeprefix("no").removeprefix("-"))
            if name.startswith("no") and negated is not None and negated.reader.switch:
                values[negated.name] = False
                continue
        if found is None:
            given = arg.partition("=")[0]
            known = [f"--{o.flag_name}" for o in table]
            raise FlagError(f"unknown flag '{given}'{suggestion(given, known, '--')}")
        if found.reader.switch and not has_value:
            value = "true"
        elif not has_value:
            if i == len(argv):
                raise FlagError(f"flag --{found.flag_name} needs a value")
            value = argv[i]
            i += 1
        try:
            values[found.name] = found.read(value, "flag")
        except OptionError as e:
            raise FlagError(str(e)) from None
    return values, positional
