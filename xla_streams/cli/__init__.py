"""The ``xla-streams`` command line: offline tools for scheduled HLO text.

Every command has its own table of flags (``cli/flags.py``), so ``xla-streams CMD
--help`` shows only that command's flags. A command is one function and one entry in
``COMMANDS``::

    def _simulate(args: Args) -> int:
        path, text = args.input()                # the positional IN.hlo, or stdin for '-'
        ...
        args.output(args.flag("json"), result)   # written (atomically) only on success
        return EXIT_OK

    "simulate": Command("One line for `xla-streams --help`.", "IN.hlo [--streams=N]",
                        _simulate, flags=_assignment_flags),

``flags`` gives the command's flags: reuse ``_assignment_flags`` (--streams,
--policy, --json) or write a small function that adds to its list
(``flags.integer(...)``, ``flags.string(...)``...). Raise ``UsageError``
or ``InputError`` for user errors; HloError, PipelineError and
VerificationError are mapped to exit codes here.

Exit codes: 0 success; 1 the stream assignment failed verification; 2 bad
input or usage (malformed HLO, unknown pass, bad flag value, unreadable file).
User errors print one message and no traceback. Outputs are written only when
the whole command succeeded, each atomically (see ``xla_streams._io``).

An input is HLO text: UTF-8 (a byte that is not is an error at its line and
column; gzip data says to gunzip it), no NUL byte, at most ``MAX_INPUT_BYTES``
(1 GiB). A larger file is refused from its size before anything is read;
standard input, a pipe or a device is refused once that much has been read (and
at the first NUL, so ``/dev/zero`` at once).

Nothing here imports JAX: the offline commands start in well under a second.
The ``demo`` command imports its module only when run.
"""

from __future__ import annotations

import errno
import gc
import os
import stat
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn, TextIO

from xla_streams._io import atomic_write_many
from xla_streams._text import aligned
from xla_streams._version import __version__
from xla_streams.cli import flags
from xla_streams.cli.flags import Flag, FlagError
from xla_streams.cli.stream_model_flags import stream_model, stream_model_flags
from xla_streams.collectives import (
    DEFAULT_POLICY,
    DEFAULT_STREAMS,
    MAX_STREAMS,
    POLICIES,
    STREAM_COUNTS,
    streams_from_text,
)
from xla_streams.hlo import HloError, Module, parse_module
from xla_streams.passes.base import Compilation, ModulePass, PipelineError
from xla_streams.pipeline import PASSES, PassManager, build_pipeline, pass_class
from xla_streams.streams import VerificationError

PROG = "xla-streams"
STDIO = "-"
EXIT_OK = 0
EXIT_VERIFICATION = 1
EXIT_USAGE = 2
# The largest input read. The largest real modules are tens of MB of HLO text; a
# bigger input is a wrong file (or /dev/zero), refused rather than read into memory.
MAX_INPUT_BYTES = 1 << 30
_READ_CHUNK = 1 << 24


class UsageError(Exception):
    """A command line that cannot be run as written (exit code 2)."""


class InputError(Exception):
    """An input that cannot be read or an output that cannot be written (exit code 2)."""


@dataclass
class Args:
    """What a command gets: its parsed flags, its positional arguments, its streams."""

    command: str
    flags: dict[str, Any]  # every flag of the command, by name: its value
    positional: list[str]
    stdin: TextIO
    stdout: TextIO
    stderr: TextIO
    # (path, text) to write once the command has succeeded; "-" is stdout.
    outputs: list[tuple[str, str]] = field(default_factory=list)
    # Text for stderr once the command has succeeded (a table when stdout is taken).
    messages: list[str] = field(default_factory=list)

    def flag(self, name: str) -> Any:
        return self.flags[name]

    def input(self) -> tuple[str, str]:
        """The single positional input file: (its name for messages, its text)."""
        if len(self.positional) != 1:
            found = " ".join(self.positional) or "none"
            raise UsageError(f"expected one input file ('-' for standard input), found: {found}")
        path = self.positional[0]
        name = "standard input" if path == STDIO else f"'{path}'"
        where = "<stdin>" if path == STDIO else path
        try:
            if path == STDIO:
                # Bytes, so that nothing (a CR) is translated on the way to the output.
                buffer = getattr(self.stdin, "buffer", None)
                if buffer is None:  # a text stream (in-process callers): already decoded
                    text = self.stdin.read(MAX_INPUT_BYTES + 1)
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
            raise InputError(f"cannot read {name}: {_os_reason(e)}") from None
        return where, _decoded(data, where, name)

    def output(self, path: str | None, text: str) -> None:
        """Write ``text`` to ``path`` (``-``: stdout) when the command succeeds."""
        if path is not None and path != "":
            self.outputs.append((path, text))

    def uses_stdout(self, *names: str) -> bool:
        """True when one of the flags ``names`` (those the command has) is ``-``."""
        return any(n in self.flags and self.flag(n) == STDIO for n in names)


_HLO_INPUT = (("IN.hlo", "Scheduled HLO module text to read; '-' reads standard input."),)


@dataclass(frozen=True)
class Command:
    summary: str  # one line for `xla-streams --help`
    usage: str  # the arguments after `xla-streams CMD`
    run: Callable[[Args], int]
    flags: Callable[[], list[Flag]] = list
    description: str = ""  # more for `xla-streams CMD --help`
    arguments: tuple[tuple[str, str], ...] = _HLO_INPUT
    # Reads HLO text and ends (no JAX): it runs without the cyclic garbage collector,
    # which would walk a large module's ~10^5 objects again at every collection.
    text_only: bool = True


# -- flags shared by commands --------------------------------------------------------


def _streams_flags() -> list[Flag]:
    return [
        flags.integer(
            "streams", DEFAULT_STREAMS,
            f"Number of collective streams K to spread the collectives over (1..{MAX_STREAMS}).",
            read=streams_from_text,
        ),
        flags.enum(
            "policy", DEFAULT_POLICY, POLICIES,
            "How to pick a stream: 'interval' takes the lowest stream free when the "
            "collective starts; 'round-robin' takes the next stream in turn.",
        ),
    ]  # fmt: skip


def _assignment_flags() -> list[Flag]:
    return [
        *_streams_flags(),
        flags.string(
            "json", None, "Also write the assignment as JSON (schema xla_streams.assignment.v2) "
            "to this file ('-': standard output).", metavar="FILE",
        ),
        *stream_model_flags(),
    ]  # fmt: skip


def _opt_flags() -> list[Flag]:
    return [
        flags.string(
            "pipeline", None,
            "Passes to run, comma separated, options in braces: "
            "'find-async-pairs,assign-streams{streams=4,policy=interval}'. "
            "'' only parses and prints the module.",
            short="p", metavar="SPEC",
        ),
        flags.string(
            "output", STDIO, "Where to write the module ('-': standard output).",
            short="o", metavar="FILE",
        ),
        flags.boolean("time-passes", False, "Print how long each pass took to standard error."),
        flags.boolean(
            "print-after-all", False, "Print the module after every pass to standard error."
        ),
    ]  # fmt: skip


def _assign_flags() -> list[Flag]:
    return [
        *_assignment_flags(),
        flags.string(
            "output", None, "Write the annotated module to this file ('-': standard output).",
            short="o", metavar="FILE",
        ),
        flags.boolean("quiet", False, "Do not print the table.", short="q"),
    ]  # fmt: skip


# -- the commands --------------------------------------------------------------------


def _opt(args: Args) -> int:
    pipeline = args.flag("pipeline")
    if pipeline is None:
        raise UsageError("missing --pipeline (-p); use -p '' to only parse and print")
    path, text = args.input()
    manager = PassManager.from_spec(pipeline)
    if args.flag("print-after-all"):

        def dump(p: ModulePass, module: Module) -> None:
            args.stderr.write(f"// -----// IR after {p.spec()} //----- //\n{module.print()}\n")

        manager.print_after_all = dump
    module = parse_module(text, path)
    manager.run(Compilation(module))
    if args.flag("time-passes"):
        args.stderr.write(_timings(manager))
    args.output(args.flag("output"), module.print())
    return EXIT_OK


def _assign(args: Args) -> int:
    compilation = _assigned(args, annotate=True)
    _reports(args, compilation, quiet=args.flag("quiet"))
    args.output(args.flag("output"), compilation.module.print())
    return EXIT_OK


def _report(args: Args) -> int:
    _reports(args, _assigned(args, annotate=False), quiet=False)
    return EXIT_OK


def _demo_flags() -> list[Flag]:
    from xla_streams.aot import GPU_CONFIGS
    from xla_streams.programs import DEFAULT_PROGRAM, PROGRAMS

    return [
        *_streams_flags(),
        flags.enum(
            "program", DEFAULT_PROGRAM, sorted(PROGRAMS), "The embedded program to compile."
        ),
        flags.string(
            "report-dir", None,
            "Where the reports go (default: a new temporary folder, printed at the end).",
            metavar="DIR",
        ),
        flags.enum(
            "mode", "auto", ["auto", "gpu", "aot"],
            "gpu: compile for this machine's GPUs; aot: compile without a GPU; auto: gpu when "
            "there are enough GPUs, else aot.",
        ),
        flags.enum(
            "target", "h100", sorted(GPU_CONFIGS), "The GPU to compile for without one (aot)."
        ),
    ]  # fmt: skip


def _demo(args: Args) -> int:
    from xla_streams.cli import demo  # imports JAX: only for this command

    if args.positional:
        raise UsageError(f"demo takes no arguments, found: {' '.join(args.positional)}")
    try:
        demo.run(
            args.flag("program"),
            args.flag("streams"),
            args.flag("policy"),
            report_dir=args.flag("report-dir"),
            mode=args.flag("mode"),
            target=args.flag("target"),
            out=args.stdout,
        )
    except demo.Unavailable as e:
        raise InputError(str(e)) from None
    return EXIT_OK


def _simulate_flags() -> list[Flag]:
    from xla_streams.cli.simulate import command_flags

    return command_flags()


def _simulate(args: Args) -> int:
    from xla_streams.cli.simulate import run_cli

    return run_cli(args)


def _tune_flags() -> list[Flag]:
    from xla_streams.cli.tune import command_flags

    return command_flags()


def _tune(args: Args) -> int:
    # Imports JAX when it compiles: only for this command.
    from xla_streams.cli.tune import TuneError, TuneUsageError, run_command

    try:
        result = run_command(args.positional, args.flag, args.stderr)
    except TuneUsageError as e:
        raise UsageError(str(e)) from None
    except TuneError as e:
        raise InputError(str(e)) from None
    args.output(args.flag("json"), result.json_text())
    args.output(args.flag("hlo"), result.best_hlo)
    if args.uses_stdout("json", "hlo"):
        args.messages.append(result.table())
    else:
        args.output(STDIO, result.table())
    return EXIT_OK


_ASSIGNMENT_DEFAULTS = f"[--streams={DEFAULT_STREAMS}] [--policy={DEFAULT_POLICY}]"
_COUNTS = ", ".join(map(str, STREAM_COUNTS))

COMMANDS: dict[str, Command] = {
    "opt": Command(
        "Run a pipeline of passes over an HLO module and print the result.",
        "IN.hlo -p PIPELINE [-o OUT.hlo] [--time-passes] [--print-after-all]",
        _opt,
        _opt_flags,
        "Reads scheduled HLO text (as from `jax.jit(f).lower(...).compile().as_text()` or an "
        "XLA dump), runs the passes of PIPELINE in order and prints the module. Instructions "
        "no pass changed print back byte for byte.",
    ),
    "assign": Command(
        "Give every async collective one of K streams and write the annotated module.",
        f"IN.hlo {_ASSIGNMENT_DEFAULTS} [--output=OUT.hlo] [--json=OUT.json] [--quiet]",
        _assign,
        _assign_flags,
        "Finds every async collective start/done pair, assigns each a collective stream, "
        "checks the assignment (no two collectives that could deadlock on different "
        "streams) and writes the module with _xla_stream_annotation on every start and "
        "done. Prints a table of the assignment unless --quiet (to standard error when "
        "--output or --json is '-').",
    ),
    "report": Command(
        "Show which stream each async collective would get; the module is not changed.",
        f"IN.hlo {_ASSIGNMENT_DEFAULTS} [--json=OUT.json]",
        _report,
        _assignment_flags,
        "Prints the table that `assign` prints, without writing a module: every async "
        "collective, where it sits in the schedule, its devices and size, its stream, "
        "then a summary.",
    ),
    "simulate": Command(
        f"Predict the step time with K = {_COUNTS} streams under each policy; draw the timelines.",
        f"IN.hlo [--streams={','.join(map(str, STREAM_COUNTS))}] [--policy={','.join(POLICIES)}] "
        "[--trace=OUT.json] [--html=OUT.html] [--target=h100] [--target-file=T.json]",
        _simulate,
        _simulate_flags,
        "Replays the schedule on a cost model of the target GPU (xla_streams/simulate/) for "
        "each number of streams and policy, with the real stream assignment, and prints the "
        "predicted step time, exposed communication and speedup, against a lower bound. "
        "--trace writes a Perfetto/Chrome trace, --html a self-contained report.",
    ),
    "tune": Command(
        "Find the XLA overlap options and stream count that make a JAX program fastest (JAX).",
        "PROGRAM.py[:BUILDER] | DUMP_DIR_OR_FILE | --program=NAME  --devices=N "
        "[--devices-per-host=8] [--target=h100] [--json=OUT.json] [--budget-s=300] [--jobs=N]",
        _tune,
        _tune_flags,
        "Compiles the program without a GPU under candidate settings of XLA's overlap "
        "levers (overlap limit, loop pipelining, double buffering, early starts, XLA's "
        "multi-streaming, the NVLink domain and its overlap limit, combine thresholds, "
        "collective matmul), predicts each with its range with the simulator for K = "
        f"{_COUNTS} collective streams, keeps those that fit in memory, and prints them "
        "ranked with the command that runs the best. Compiles are cached on disk.",
        arguments=(
            (
                "PROGRAM.py[:BUILDER]",
                "A Python file defining BUILDER(devices) -> (jitted_fn, abstract_args), or a "
                "jax.stages.Lowered; devices are the topology's GPUs, host-major.",
            ),
            (
                "DUMP_DIR_OR_FILE",
                "Or, with no code: a JAX_DUMP_IR_TO folder (the training step is its largest "
                "module) or a file of lowered.as_text(debug_info=True).",
            ),
        ),
        text_only=False,
    ),
    "demo": Command(
        "Compile the demo transformer step and show its collectives spread over streams (JAX).",
        f"[--program=transformer_step] [--streams={DEFAULT_STREAMS}] [--mode=auto] "
        "[--report-dir=DIR]",
        _demo,
        _demo_flags,
        "Compiles an embedded sharded JAX program with the plugin on (for this machine's "
        "GPUs when it has enough, else for 8 H100s without a GPU), and prints the "
        "assignment the plugin made inside XLA's compile, with its report files.",
        arguments=(),
        text_only=False,
    ),
}


def _assigned(args: Args, *, annotate: bool) -> Compilation:
    path, text = args.input()
    passes = build_pipeline(
        args.flag("streams"),
        args.flag("policy"),
        runtime="xla" if annotate else None,
        model=stream_model(args.flag),
    )
    return PassManager(passes).run(Compilation(parse_module(text, path)))


def _reports(args: Args, compilation: Compilation, *, quiet: bool) -> None:
    from xla_streams.report import build_report, format_report

    report = build_report(compilation)
    args.output(args.flag("json"), report.to_json())
    if not quiet:
        table = format_report(report)
        if args.uses_stdout("json", "output"):
            args.messages.append(table)
        else:
            args.output(STDIO, table)


def _timings(manager: PassManager) -> str:
    total = sum(t for _, t in manager.timings)
    rows = [(name, f"{t * 1000:9.3f} ms") for name, t in [*manager.timings, ("total", total)]]
    return "\n".join(["pass timings:", *aligned(rows, indent="  ")]) + "\n"


# -- driver --------------------------------------------------------------------------


def main(
    argv: list[str] | None = None,
    *,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run one command; ``argv`` excludes the program name. Returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    if not argv:
        stderr.write(_main_help())
        return EXIT_USAGE
    name, rest = argv[0], argv[1:]
    if name in ("-h", "--help", "help"):
        stdout.write(_main_help())
        return EXIT_OK
    if name in ("--version", "version"):
        stdout.write(f"{PROG} {__version__}\n")
        return EXIT_OK
    command = COMMANDS.get(name)
    if command is None:
        stderr.write(f"{PROG}: error: unknown command '{name}'\n\n{_main_help()}")
        return EXIT_USAGE
    prog = f"{PROG} {name}"
    table = command.flags()
    args = Args(name, {}, rest, stdin, stdout, stderr)
    try:
        if _wants_help(rest):
            stdout.write(_command_help(name, command, table))
            return EXIT_OK
        args.flags, args.positional = flags.parse(rest, table)
        code = command.run(args)
        if code == EXIT_OK:
            _write_outputs(args)
        return code
    except HloError as e:
        stderr.write(f"{e}\n")
        return EXIT_USAGE
    except VerificationError as e:
        stderr.write(f"{prog}: verification failed: {e}\n")
        return EXIT_VERIFICATION
    except (UsageError, FlagError) as e:
        stderr.write(f"{prog}: error: {e}\nRun '{prog} --help' for usage.\n")
        return EXIT_USAGE
    except (PipelineError, InputError) as e:
        stderr.write(f"{prog}: error: {e}\n")
        return EXIT_USAGE


def _write_outputs(args: Args) -> None:
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
        reason = _os_reason(e)
        if e.errno == errno.ENXIO:  # opening a FIFO without a reader (never waited for)
            reason = "it is a FIFO and nothing is reading it (start the reader first)"
        raise InputError(f"cannot write '{e.filename or files[0][0]}': {reason}") from None
    for path, text in args.outputs:
        if path == STDIO:
            args.stdout.write(text)
    args.stdout.flush()
    for text in args.messages:
        args.stderr.write(text)


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


def _wants_help(argv: list[str]) -> bool:
    for arg in argv:
        if arg == "--":
            return False
        if arg in ("-h", "--help", "-help", "--helpfull"):
            return True
    return False


def _os_reason(e: BaseException) -> str:
    return e.strerror if isinstance(e, OSError) and e.strerror else str(e)


def _main_help() -> str:
    commands = "\n".join(aligned([(n, c.summary) for n, c in COMMANDS.items()], indent="  "))
    about = (
        "Spread the async collectives of a scheduled XLA (JAX) program over several "
        "collective streams, so that collectives that overlap in the schedule also run at "
        "the same time. The commands read and write HLO text and need no GPU."
    )
    return (
        f"usage: {PROG} COMMAND [ARGS...]\n\n{textwrap.fill(about, _WIDTH)}\n\n"
        f"commands:\n{commands}\n\n"
        f"Run '{PROG} COMMAND --help' for a command's arguments and flags.\n"
        "Exit codes: 0 success, 1 the assignment failed verification, 2 bad input or usage.\n"
    )


_WIDTH = 88
_INDENT = " " * 6


def _command_help(name: str, command: Command, table: list[Flag]) -> str:
    out = [f"usage: {PROG} {name} {command.usage}", "", command.summary]
    if command.description:
        out += ["", textwrap.fill(command.description, _WIDTH)]
    if command.arguments:
        out += ["", "arguments:"]
        for argument, text in command.arguments:
            out += [f"  {argument}", _wrap(text)]
    if name == "opt":
        out += ["", "passes (option defaults in braces):", _passes_help()]
    if table:
        out += ["", "flags:"]
        for f in table:
            text = f.help
            if f.boolean:
                spelled = f"--[no]{f.name}"
            else:
                spelled = f"--{f.name}={f.metavar}"
                if f.default is not None:
                    text += f" Default: {f.default!s}."
            short = f"-{f.short}, " if f.short else ""
            out += [f"  {short}{spelled}", _wrap(text)]
    return "\n".join(out) + "\n"


def _wrap(text: str) -> str:
    return textwrap.fill(
        text, _WIDTH, initial_indent=_INDENT, subsequent_indent=_INDENT, break_on_hyphens=False
    )


def _passes_help() -> str:
    """Each registered pass, its options and the first sentence of its module's docstring."""
    lines = []
    for name in sorted(PASSES):
        cls = pass_class(name)
        doc = (sys.modules[cls.__module__].__doc__ or "").strip().split("\n\n")[0]
        doc = " ".join(doc.split()).replace("``", "`")
        doc = doc.removeprefix(f"{name}: ")
        doc = doc.split(". ")[0].rstrip(".") + "."
        doc = doc[:1].upper() + doc[1:]
        lines += [f"  {cls().spec()}", _wrap(doc)]  # every option has a default
    return "\n".join(lines)


def run() -> NoReturn:
    """The console script's entry point."""
    command = COMMANDS.get(sys.argv[1]) if len(sys.argv) > 1 else None
    text_only = command is not None and command.text_only
    if text_only:
        gc.disable()
    try:
        code = main()
        sys.stdout.flush()
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except BrokenPipeError:
        # The reader went away (`xla-streams ... | head`): not an error of ours.
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(EXIT_OK) from None
    if text_only:
        gc.freeze()  # the OS frees the heap at exit; nothing to collect on the way out
    raise SystemExit(code)


if __name__ == "__main__":
    run()
