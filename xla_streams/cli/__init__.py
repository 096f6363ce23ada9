"""The ``xla-streams`` command line: offline tools for scheduled HLO text.

:data:`COMMANDS` registers every command; :mod:`xla_streams.cli.command` is the
framework they share (what a command is and gets, its help, its outputs),
:mod:`xla_streams.cli.inputs` reads HLO input, :mod:`xla_streams.cli.flags` reads
flags. A command is one function and one entry in ``COMMANDS``::

    def _simulate(args: Args) -> int:
        path, text = args.input()                # the positional IN.hlo, or stdin for '-'
        ...
        args.output(args.flag("json"), result)   # written (atomically) only on success
        return EXIT_OK

    "simulate": Command("One line for `xla-streams --help`.", "IN.hlo", _simulate,
                        flags=_simulate_flags, shown=("streams", "policy")),

``opt``, ``assign`` and ``report`` live in :mod:`xla_streams.cli.opt`; ``simulate``,
``tune`` and ``demo`` in modules of their own, imported only when one runs (or shows
its help): HloError, PipelineError and VerificationError are mapped to exit codes
here, and user errors print one message and no traceback.

Nothing here imports JAX: the offline commands start in well under a second.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Sequence
from typing import Any, NoReturn, TextIO

from xla_streams import option
from xla_streams._text import aligned
from xla_streams._version import __version__
from xla_streams.cli import flags
from xla_streams.cli.command import (
    EXIT_OK,
    EXIT_USAGE,
    EXIT_VERIFICATION,
    PROG,
    Args,
    Command,
    UsageError,
    command_help,
    fill,
    wants_help,
    write_outputs,
)
from xla_streams.cli.flags import FlagError
from xla_streams.cli.inputs import STDIO, InputError
from xla_streams.cli.opt import ASSIGN, OPT, REPORT, streams_flags
from xla_streams.collectives import STREAM_COUNTS
from xla_streams.hlo import HloError
from xla_streams.option import Option, suggestion
from xla_streams.passes.base import PipelineError


def _demo_flags() -> list[Option[Any]]:
    from xla_streams.aot import GPU_CONFIGS
    from xla_streams.programs import DEFAULT_PROGRAM, PROGRAMS

    return [
        *streams_flags(),
        Option("program", DEFAULT_PROGRAM, "The embedded program to compile.",
               option.choice(sorted(PROGRAMS), metavar="NAME")),
        Option("report_dir", None,
               "Where the reports go (default: a new temporary folder, printed at the end).",
               option.optional(option.path(metavar="DIR"), takes="a path")),
        Option("mode", "auto",
               "gpu: compile for this machine's GPUs; aot: compile without a GPU; auto: gpu when "
               "there are enough GPUs, else aot.", option.choice(("auto", "gpu", "aot"))),
        Option("target", "h100", "The GPU to compile for without one (aot).",
               option.choice(sorted(GPU_CONFIGS))),
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
            report_dir=args.flag("report_dir"),
            mode=args.flag("mode"),
            target=args.flag("target"),
            out=args.stdout,
        )
    except demo.Unavailable as e:
        raise InputError(str(e)) from None
    return EXIT_OK


def _simulate_flags() -> Sequence[Option[Any]]:
    from xla_streams.cli.simulate import FLAGS

    return FLAGS


def _simulate(args: Args) -> int:
    from xla_streams.cli.simulate import run_cli

    return run_cli(args)


def _calibrate_flags() -> Sequence[Option[Any]]:
    from xla_streams.cli.calibrate import FLAGS

    return FLAGS


def _calibrate(args: Args) -> int:
    from xla_streams.cli.calibrate import run_cli

    return run_cli(args)


def _tune_flags() -> Sequence[Option[Any]]:
    from xla_streams.cli.tune import FLAGS

    return FLAGS


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


_COUNTS = ", ".join(map(str, STREAM_COUNTS))

COMMANDS: dict[str, Command] = {
    "opt": OPT,
    "assign": ASSIGN,
    "report": REPORT,
    "simulate": Command(
        f"Predict the step time with K = {_COUNTS} streams under each policy; draw the timelines.",
        "IN.hlo",
        _simulate,
        _simulate_flags,
        ("streams", "policy", "trace", "html", "target", "target_file"),
        "Replays the schedule on a cost model of the target GPU (xla_streams/simulate/) for "
        "each number of streams and policy, with the real stream assignment, and prints the "
        "predicted step time, exposed communication and speedup, against a lower bound. "
        "--trace writes a Perfetto/Chrome trace, --html a self-contained report.",
    ),
    "calibrate": Command(
        "Measure the cost model's error on a GPU: a calibration file from a profiler trace.",
        "IN.hlo --trace=DIR_OR_FILE",
        _calibrate,
        _calibrate_flags,
        ("steps", "target", "json"),
        "Reads the kernel times a profiler trace (jax.profiler.trace) measured of the module "
        "IN.hlo over --steps steps, compares them per kernel class (matmul, memory) with the "
        "cost model's prediction for --target, and prints the ratios; --json writes them as "
        "the calibration file that `simulate --calibration` and `tune --calibration` read.",
    ),
    "tune": Command(
        "Find the XLA overlap options and stream count that make a JAX program fastest (JAX).",
        "PROGRAM.py[:BUILDER] | DUMP_DIR_OR_FILE | --program=NAME",
        _tune,
        _tune_flags,
        ("devices", "devices_per_host", "target", "json", "budget_compiles", "jobs"),
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
        "",
        _demo,
        _demo_flags,
        ("program", "streams", "mode", "report_dir"),
        "Compiles an embedded sharded JAX program with the plugin on (for this machine's "
        "GPUs when it has enough, else for 8 H100s without a GPU), and prints the "
        "assignment the plugin made inside XLA's compile, with its report files.",
        arguments=(),
        text_only=False,
    ),
}


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
        stderr.write(
            f"{PROG}: error: unknown command '{name}'{suggestion(name, COMMANDS)}\n\n{_main_help()}"
        )
        return EXIT_USAGE
    prog = f"{PROG} {name}"
    table = command.flags()
    args = Args(name, {}, rest, stdin, stdout, stderr)
    try:
        if wants_help(rest):
            stdout.write(command_help(name, command, table))
            return EXIT_OK
        args.flags, args.positional = flags.parse(rest, table)
        code = command.run(args)
        if code == EXIT_OK:
            write_outputs(args)
        return code
    except HloError as e:
        stderr.write(f"{e}\n")
        return EXIT_USAGE
    except (UsageError, FlagError) as e:
        stderr.write(f"{prog}: error: {e}\nRun '{prog} --help' for usage.\n")
        return EXIT_USAGE
    except (PipelineError, InputError) as e:
        stderr.write(f"{prog}: error: {e}\n")
        return EXIT_USAGE
    except Exception as e:
        # Imported here: only a command that loaded the analyses can have raised it.
        from xla_streams.streams import VerificationError

        if not isinstance(e, VerificationError):
            raise
        stderr.write(f"{prog}: verification failed: {e}\n")
        return EXIT_VERIFICATION


def _main_help() -> str:
    commands = "\n".join(aligned([(n, c.summary) for n, c in COMMANDS.items()], indent="  "))
    about = (
        "Spread the async collectives of a scheduled XLA (JAX) program over several "
        "collective streams, so that collectives that overlap in the schedule also run at "
        "the same time. The commands read and write HLO text and need no GPU."
    )
    return (
        f"usage: {PROG} COMMAND [ARGS...]\n\n{fill(about)}\n\n"
        f"commands:\n{commands}\n\n"
        f"Run '{PROG} COMMAND --help' for a command's arguments and flags.\n"
        "Exit codes: 0 success, 1 the assignment failed verification, 2 bad input or usage.\n"
    )


def run() -> NoReturn:
    """The command line's entry point (the console script reaches it through
    ``xla_streams.__main__``)."""
    command = COMMANDS.get(sys.argv[1]) if len(sys.argv) > 1 else None
    text_only = command is not None and command.text_only
    if text_only:
        gc.disable()
    else:  # the console script imported this with the collector off (__main__.py)
        gc.enable()
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
