"""The command framework: what a command is (:class:`Command`), what it gets
(:class:`Args`), its errors and exit codes, its help, and the writing of its outputs.

A command is one function and one :class:`Command`: its summary, usage, flags (each an
:class:`~xla_streams.option.Option`, read under its name: ``args.flag("time_passes")``
for ``--time-passes``) and help. Raise :class:`UsageError` or
:class:`~xla_streams.cli.inputs.InputError` for user errors.

Exit codes: 0 success; 1 the stream assignment failed verification; 2 bad
input or usage (malformed HLO, unknown pass, bad flag value, unreadable file).
Outputs are written only when the whole command succeeded, each atomically (see
``xla_streams._io``).
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TextIO

from xla_streams._io import atomic_write_many
from xla_streams.cli.inputs import STDIO, InputError, os_reason, read_input
from xla_streams.option import Option

PROG = "xla-streams"
EXIT_OK = 0
EXIT_VERIFICATION = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """A command line that cannot be run as written (exit code 2)."""


class Args:
    """What a command gets: its parsed flags, its positional arguments, its streams."""

    def __init__(
        self,
        command: str,
        flags: dict[str, Any],
        positional: list[str],
        stdin: TextIO,
        stdout: TextIO,
        stderr: TextIO,
    ) -> None:
        self.command = command
        self.flags = flags  # every flag of the command, by name: its value
        self.positional = positional
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        # (path, text) to write once the command has succeeded; "-" is stdout.
        self.outputs: list[tuple[str, str]] = []
        # Text for stderr once the command has succeeded (a table when stdout is taken).
        self.messages: list[str] = []

    def flag(self, name: str) -> Any:
        return self.flags[name]

    def input(self) -> tuple[str, str]:
        """The single positional input file: (its name for messages, its text)."""
        if len(self.positional) != 1:
            found = " ".join(self.positional) or "none"
            raise UsageError(f"expected one input file ('-' for standard input), found: {found}")
        return read_input(self.positional[0], self.stdin)

    def output(self, path: str | None, text: str) -> None:
        """Write ``text`` to ``path`` (``-``: stdout) when the command succeeds."""
        if path is not None and path != "":
            self.outputs.append((path, text))

    def uses_stdout(self, *names: str) -> bool:
        """True when one of the flags ``names`` (those the command has) is ``-``."""
        return any(n in self.flags and self.flag(n) == STDIO for n in names)


HLO_INPUT = (("IN.hlo", "Scheduled HLO module text to read; '-' reads standard input."),)


class Command(NamedTuple):
    summary: str  # one line for `xla-streams --help`
    usage: str  # the arguments after `xla-streams CMD`, and the flags it needs
    run: Callable[[Args], int]
    flags: Callable[[], Sequence[Option[Any]]] = tuple
    shown: tuple[str, ...] = ()  # flags the usage line shows, with their defaults
    description: str = ""  # more for `xla-streams CMD --help`
    arguments: tuple[tuple[str, str], ...] = HLO_INPUT
    more_help: Callable[[], str] | None = None  # a section of its own, after the arguments
    # Reads HLO text and ends (no JAX): it runs without the cyclic garbage collector,
    # which would walk a large module's ~10^5 objects again at every collection.
    text_only: bool = True


def write_outputs(args: Args) -> None:
    """Write every output, all files or none, then standard output and messages."""
    files: list[tuple[str, str]] = []
    seen: set[str] = set()
    for path, text in args.outputs:
        if path in seen:
            where = "standard output" if path == STDIO else f"'{path}'"
            raise UsageError(f"two outputs would be written to {where}")
        seen.add(path)
        if path != STDIO:
            files.append((path, text))
    try:
        atomic_write_many(files)
    except OSError as e:
        reason = os_reason(e)
        if e.errno == errno.ENXIO:  # opening a FIFO without a reader (never waited for)
            reason = "it is a FIFO and nothing is reading it (start the reader first)"
        raise InputError(f"cannot write '{e.filename or files[0][0]}': {reason}") from None
    for path, text in args.outputs:
        if path == STDIO:
            args.stdout.write(text)
    args.stdout.flush()
    for text in args.messages:
        args.stderr.write(text)


def wants_help(argv: list[str]) -> bool:
    for arg in argv:
        if arg == "--":
            return False
        if arg in ("-h", "--help", "-help", "--helpfull"):
            return True
    return False


WIDTH = 88
_INDENT = " " * 6


def usage(name: str, command: Command, table: Sequence[Option[Any]]) -> str:
    """``usage: xla-streams CMD ARGS [--flag=DEFAULT]...``: the flags ``shown`` with their
    defaults as a user types them."""
    by_name = {o.name: o for o in table}
    shown = []
    for flag in (by_name[n] for n in command.shown):
        if flag.reader.switch:
            shown.append(f"[--{flag.flag_name}]")
        else:
            shown.append(f"[{flag.usage(flag.default)}]")
    start = f"usage: {PROG} {name}"
    return fill(
        " ".join(filter(None, [start, command.usage, *shown])),
        subsequent_indent=" " * (len(start) + 1),
        break_long_words=False,
        break_on_hyphens=False,
    )


def command_help(name: str, command: Command, table: Sequence[Option[Any]]) -> str:
    out = [usage(name, command, table), "", command.summary]
    if command.description:
        out += ["", fill(command.description)]
    if command.arguments:
        out += ["", "arguments:"]
        for argument, text in command.arguments:
            out += [f"  {argument}", wrap(text)]
    if command.more_help is not None:
        out += ["", command.more_help()]
    if table:
        out += ["", "flags:"]
        for f in table:
            short = f"-{f.short}, " if f.short else ""
            out += [f"  {short}{f.usage()}", wrap(f.help_line())]
    return "\n".join(out) + "\n"


def wrap(text: str) -> str:
    return fill(text, initial_indent=_INDENT, subsequent_indent=_INDENT, break_on_hyphens=False)


def fill(text: str, **options: Any) -> str:
    """``text`` wrapped at WIDTH (``textwrap.fill``'s options); textwrap is loaded for
    help only, not at every start."""
    import textwrap

    return textwrap.fill(text, WIDTH, **options)
