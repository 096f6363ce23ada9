"""``xla-streams tune``: the XLA settings and collective streams that make a program fastest,
found without a GPU.

    xla-streams tune train.py[:build] --devices=32 --devices-per-host=8 [--target=h100]
        [--json=tune.json] [--budget-compiles=200] [--calibration=cal.json] [--jobs=N]
    xla-streams tune DUMP_DIR_OR_FILE [--devices=N] --devices-per-host=8
    xla-streams tune --program=fsdp_tp_scan

DUMP_DIR_OR_FILE is a folder JAX wrote with ``JAX_DUMP_IR_TO=DIR python train.py``
(the training step is its largest module with a matrix multiply) or a file of
StableHLO (a dump file, or ``lowered.as_text(debug_info=True)`` saved): the
program's Python is not needed.

The command lives here so that ``cli/__init__.py`` only registers it
(:data:`FLAGS`, :func:`run_command`); the tuner is :mod:`xla_streams.tuning`.
Its flags are the options of :class:`~xla_streams.tuning.options.TuneOptions`
(:data:`OPTION_FLAGS`: their declarations, under their flags), and a few of its
own (the program, the output files, the progress lines). Importing this module
imports no JAX: the compiles do, once the command runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from xla_streams.option import Option, boolean, optional, path, text
from xla_streams.programs import PROGRAMS
from xla_streams.tuning.driver import ensure_deviceless, load_builder, tune, tune_path
from xla_streams.tuning.options import OPTIONS, TuneOptions
from xla_streams.tuning.result import SCHEMA, TuneError, TuneResult

__all__ = [
    "FLAGS",
    "OPTION_FLAGS",
    "TuneError",
    "TuneUsageError",
    "run_command",
]

STDIO = "-"
# The options of the tuner a command line spells: all but the program's name and the
# stream to write to, which the command finds itself (--program names an embedded
# program, --progress says whether to report).
OPTION_FLAGS = tuple(o for o in OPTIONS.values() if o.name not in ("program", "progress"))
_FILE = optional(path(metavar="FILE"), takes="a path")
FLAGS: tuple[Option[Any], ...] = (
    Option("program", None,
        "An embedded program (xla_streams/programs/) to tune instead of PROGRAM.py; its own "
        "device counts are the defaults.", optional(text(metavar="NAME"), takes="a name")),
    *OPTION_FLAGS,
    Option("json", None,
        f"Also write the result (schema {SCHEMA}) to this file ('-': standard output); "
        "XLA_STREAMS_CONFIG=FILE applies it.", _FILE),
    Option("hlo", None,
        "Also write the recommendation's scheduled module (HLO text) to this file, e.g. for "
        "`xla-streams simulate --html`.", _FILE),
    Option("progress", True, "Report progress on standard error.", boolean()),
)  # fmt: skip


def option_values(flag: Callable[[str], Any]) -> dict[str, Any]:
    """The options the flags give (``flag(name)`` reads one), by field of TuneOptions."""
    return {o.name: flag(o.name) for o in OPTION_FLAGS}


class TuneUsageError(TuneError):
    """A command line that cannot be run as written."""


def check_output(name: str, path: str | None) -> None:
    """Refuse, before any work, an output file that cannot be written: its folder is
    missing or not writable, or it is a folder (``name``: the flag that gives it)."""
    if path is None or path in ("", STDIO):
        return
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise TuneUsageError(f"--{name}={path}: no such folder '{parent}'")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise TuneUsageError(f"--{name}={path}: cannot write in '{parent}'")
    if target.is_dir():
        raise TuneUsageError(f"--{name}={path}: a folder, not a file")
    if target.exists() and not os.access(target, os.W_OK):
        raise TuneUsageError(f"--{name}={path}: not writable")


def run_command(
    positional: Sequence[str], flag: Callable[[str], Any], stderr: TextIO | None
) -> TuneResult:
    """``xla-streams tune`` on its parsed arguments (``flag(name)`` reads the flags of
    :func:`command_flags`); raises TuneUsageError or TuneError, which the CLI turns
    into one line and exit code 2."""
    embedded = flag("program")
    if embedded and positional:
        raise TuneUsageError("give PROGRAM.py[:BUILDER] or --program, not both")
    if not embedded and len(positional) != 1:
        found = " ".join(positional) or "none"
        raise TuneUsageError(
            "expected one PROGRAM.py[:BUILDER], JAX dump folder or StableHLO file (or "
            f"--program=NAME), found: {found}"
        )
    for name in ("json", "hlo"):
        check_output(name, flag(name))
    given = option_values(flag)
    devices, per_host = given["devices"], given["devices_per_host"]
    if devices is not None and per_host is not None and per_host > devices:
        raise TuneUsageError(f"--devices-per-host={per_host} is more than --devices={devices}")
    progress = stderr if flag("progress") else None
    ensure_deviceless()  # before PROGRAM.py can start JAX
    if embedded:
        spec = PROGRAMS.get(embedded)
        if spec is None:
            raise TuneUsageError(
                f"--program: unknown program '{embedded}'; known: {', '.join(sorted(PROGRAMS))}"
            )
        devices = devices or spec.num_devices
        per_host = min(per_host or spec.devices_per_host, devices)
        given.update(devices=devices, devices_per_host=per_host)
        return tune(spec.build, options=TuneOptions(**given, program=embedded, progress=progress))
    path = Path(positional[0])
    if path.is_dir() or (path.is_file() and path.suffix != ".py"):
        return tune_path(path, options=TuneOptions(**given, progress=progress))
    name, builder = load_builder(positional[0])
    if devices is None:
        raise TuneUsageError("--devices is required with PROGRAM.py")
    return tune(builder, options=TuneOptions(**given, program=name, progress=progress))
