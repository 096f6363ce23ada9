"""The commands that run passes over HLO text: ``opt`` (any pipeline), ``assign`` and
``report`` (the default one, which assigns the streams)."""

from __future__ import annotations

import sys
from typing import Any

from xla_streams import option
from xla_streams._text import aligned
from xla_streams.cli.command import EXIT_OK, Args, Command, UsageError, wrap
from xla_streams.cli.inputs import STDIO
from xla_streams.cli.stream_model_flags import stream_model, stream_model_flags
from xla_streams.hlo import Module, parse_module
from xla_streams.option import Option, options_of
from xla_streams.passes.base import Compilation, ModulePass
from xla_streams.pipeline import PASSES, PassManager, build_pipeline, pass_class

# An output file; None: not written.
_FILE = option.optional(option.path(metavar="FILE"), takes="a path")


def streams_flags() -> list[Option[Any]]:
    """--streams and --policy: the options of the assign-streams pass."""
    declared = options_of(pass_class("assign-streams"))
    return [declared["streams"], declared["policy"]]


def _assignment_flags() -> list[Option[Any]]:
    return [
        *streams_flags(),
        Option("json", None, "Also write the assignment as JSON (schema "
               "xla_streams.assignment.v2) to this file ('-': standard output).", _FILE),
        *stream_model_flags(),
    ]  # fmt: skip


def _opt_flags() -> list[Option[Any]]:
    return [
        Option("pipeline", None,
            "Passes to run, comma separated, options in braces: "
            "'find-async-pairs,assign-streams{streams=4,policy=interval}'. "
            "'' only parses and prints the module.",
            option.optional(option.text(metavar="SPEC"), takes="a pipeline spec"), short="p"),
        Option("output", STDIO, "Where to write the module ('-': standard output).",
               option.path(metavar="FILE"), short="o"),
        Option("time_passes", False, "Print how long each pass took to standard error.",
               option.boolean()),
        Option("print_after_all", False, "Print the module after every pass to standard error.",
               option.boolean()),
    ]  # fmt: skip


def _assign_flags() -> list[Option[Any]]:
    return [
        *_assignment_flags(),
        Option("output", None, "Write the annotated module to this file ('-': standard output).",
               _FILE, short="o"),
        Option("quiet", False, "Do not print the table.", option.boolean(), short="q"),
    ]  # fmt: skip


def _opt(args: Args) -> int:
    pipeline = args.flag("pipeline")
    if pipeline is None:
        raise UsageError("missing --pipeline (-p); use -p '' to only parse and print")
    path, text = args.input()
    manager = PassManager.from_spec(pipeline)
    if args.flag("print_after_all"):

        def dump(p: ModulePass, module: Module) -> None:
            args.stderr.write(f"// -----// IR after {p.spec()} //----- //\n{module.print()}\n")

        manager.print_after_all = dump
    module = parse_module(text, path)
    assignment = manager.run(Compilation(module)).assignment
    if assignment is not None and assignment.lowered:
        args.stderr.write(f"note: {assignment.lowered}\n")
    if args.flag("time_passes"):
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


def _passes_help() -> str:
    """Each registered pass, its options and the first sentence of its module's docstring."""
    lines = ["passes (option defaults in braces):"]
    for name in sorted(PASSES):
        cls = pass_class(name)
        doc = (sys.modules[cls.__module__].__doc__ or "").strip().split("\n\n")[0]
        doc = " ".join(doc.split()).replace("``", "`")
        doc = doc.removeprefix(f"{name}: ")
        doc = doc.split(". ")[0].rstrip(".") + "."
        doc = doc[:1].upper() + doc[1:]
        lines += [f"  {cls().spec()}", wrap(doc)]  # every option has a default
    return "\n".join(lines)


_ASSIGNMENT = ("streams", "policy")

OPT = Command(
    "Run a pipeline of passes over an HLO module and print the result.",
    "IN.hlo -p SPEC",
    _opt,
    _opt_flags,
    ("output", "time_passes", "print_after_all"),
    "Reads scheduled HLO text (as from `jax.jit(f).lower(...).compile().as_text()` or an "
    "XLA dump), runs the passes of the pipeline SPEC in order and prints the module. "
    "Instructions no pass changed print back byte for byte.",
    more_help=_passes_help,
)
ASSIGN = Command(
    "Give every async collective one of K streams and write the annotated module.",
    "IN.hlo",
    _assign,
    _assign_flags,
    (*_ASSIGNMENT, "output", "json", "quiet"),
    "Finds every async collective start/done pair, assigns each a collective stream, "
    "checks the assignment (no two collectives that could deadlock on different "
    "streams) and writes the module with _xla_stream_annotation on every start and "
    "done. Prints a table of the assignment unless --quiet (to standard error when "
    "--output or --json is '-').",
)
REPORT = Command(
    "Show which stream each async collective would get; the module is not changed.",
    "IN.hlo",
    _report,
    _assignment_flags,
    (*_ASSIGNMENT, "json"),
    "Prints the table that `assign` prints, without writing a module: every async "
    "collective, where it sits in the schedule, its devices and size, its stream, "
    "then a summary.",
)
