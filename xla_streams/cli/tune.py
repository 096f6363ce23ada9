"""``xla-streams tune``: the XLA settings and collective streams that make a program fastest,
found without a GPU.

    xla-streams tune train.py[:build] --devices=32 --devices-per-host=8 [--target=h100]
        [--json=tune.json] [--budget-s=300] [--calibration=cal.json] [--jobs=N]
    xla-streams tune DUMP_DIR_OR_FILE [--devices=N] --devices-per-host=8
    xla-streams tune --program=fsdp_tp_scan

DUMP_DIR_OR_FILE is a folder JAX wrote with ``JAX_DUMP_IR_TO=DIR python train.py``
(the training step is its largest module with a matrix multiply) or a file of
StableHLO (a dump file, or ``lowered.as_text(debug_info=True)`` saved): the
program's Python is not needed.

The command lives here so that ``cli/__init__.py`` only registers it
(:func:`command_flags`, :func:`run_command`); the tuner is :mod:`xla_streams.tuning`.
Importing this module imports no JAX: the compiles do, once the command runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from xla_streams.cli import flags
from xla_streams.hlo.module import MAX_DEVICES
from xla_streams.programs import PROGRAMS
from xla_streams.tuning.driver import (
    DEFAULT_HOSTS_PER_DOMAIN,
    TARGET_NAMES,
    ensure_deviceless,
    load_builder,
    tune,
    tune_path,
)
from xla_streams.tuning.levers import LEVER_NAMES
from xla_streams.tuning.result import (
    DEFAULT_BUDGET_S,
    DEFAULT_HEADROOM,
    DEFAULT_SCRIPT,
    SCHEMA,
    TuneError,
    TuneResult,
)

__all__ = ["TuneError", "TuneUsageError", "command_flags", "run_command"]

STDIO = "-"
MAX_JOBS = 256


def command_flags() -> list[flags.Flag]:
    """The flags of ``xla-streams tune``."""
    return [
        flags.string(
            "program", None, "An embedded program (xla_streams/programs.py) to tune instead of "
            "PROGRAM.py; its own device counts are the defaults."
        ),
        flags.integer(
            "devices", None, "Number of GPUs the program runs on (all hosts together; for a "
            "dump, default: its module's partitions).", lower=1, upper=MAX_DEVICES
        ),
        flags.integer(
            "devices-per-host", None, "GPUs per host (default 8; device d is on host d // M).",
            lower=1, upper=MAX_DEVICES
        ),
        flags.integer(
            "hosts-per-nvlink-domain", DEFAULT_HOSTS_PER_DOMAIN, "Hosts per NVLink (scale-up) "
            "domain: 1 on H100/H200 HGX clusters (each host its own), more on multi-node NVLink "
            "systems (GB200 NVL72: 18 hosts of 4 GPUs); 0: all hosts in one.", lower=0
        ),
        flags.enum(
            "target", "h100", list(TARGET_NAMES), "The GPU to compile and predict for."
        ),
        flags.string(
            "json", None, f"Also write the result (schema {SCHEMA}) to this file ('-': standard "
            "output); XLA_STREAMS_CONFIG=FILE applies it.", metavar="FILE"
        ),
        flags.string(
            "hlo", None, "Also write the recommendation's scheduled module (HLO text) to this "
            "file, e.g. for `xla-streams simulate --html`."
        ),
        flags.real(
            "budget-s", DEFAULT_BUDGET_S,
            "Stop starting compiles once this many seconds are spent.", lower=1.0,
        ),
        flags.real(
            "headroom", DEFAULT_HEADROOM, "Fraction of the GPU's memory kept free: a "
            "configuration fits when its peak is at most (1 - headroom) x HBM.", lower=0.0,
            upper=0.9,
        ),
        flags.string(
            "calibration", None, "A calibration file (schema xla_streams.calibration.v1) of "
            "measured corrections to the cost model."
        ),
        flags.string(
            "perf-table", None, "A collective performance table in XLA's format (as for "
            "--xla_gpu_experimental_collective_perf_table_path): the collectives it measured are "
            "priced from it."
        ),
        flags.string(
            "profile", None, "A PGLE profile of this program (ProfiledInstructionsProto, text or "
            "binary): the instructions it names take their measured times."
        ),
        flags.names(
            "levers", None, "Search only these levers, in this order (default: all, in the "
            f"order {', '.join(LEVER_NAMES)})."
        ),
        flags.integer(
            "jobs", None, "Compile this many candidates at once, in worker processes (default: "
            "one per core, at most one per 4 GiB of available memory, at most 8). A crash of XLA "
            "on a candidate kills its worker only; 0 compiles in this process (no start-up).",
            lower=0, upper=MAX_JOBS
        ),
        flags.string(
            "cache-dir", None, "The disk cache of compiled candidates (default "
            "$XLA_STREAMS_CACHE_DIR, else ~/.cache/xla_streams/tune); 'none': no cache."
        ),
        flags.string(
            "ray", None, "Compile on a running Ray cluster: 'auto' (the one `ray start` runs "
            "here, or RAY_ADDRESS) or its address; needs the ray extra. Usage statistics stay "
            "off unless RAY_USAGE_STATS_ENABLED says otherwise."
        ),
        flags.string("script", DEFAULT_SCRIPT, "What the printed command runs."),
        flags.boolean("progress", True, "Report progress on standard error."),
    ]  # fmt: skip


class TuneUsageError(TuneError):
    """A command line that cannot be run as written."""


def check_output(flag_name: str, path: str | None) -> None:
    """Refuse, before any work, an output file that cannot be written: its folder is
    missing or not writable, or it is a folder."""
    if path is None or path in ("", STDIO):
        return
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise TuneUsageError(f"--{flag_name}={path}: no such folder '{parent}'")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise TuneUsageError(f"--{flag_name}={path}: cannot write in '{parent}'")
    if target.is_dir():
        raise TuneUsageError(f"--{flag_name}={path}: a folder, not a file")
    if target.exists() and not os.access(target, os.W_OK):
        raise TuneUsageError(f"--{flag_name}={path}: not writable")


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
    devices, per_host = flag("devices"), flag("devices-per-host")
    if devices is not None and per_host is not None and per_host > devices:
        raise TuneUsageError(f"--devices-per-host={per_host} is more than --devices={devices}")
    domain = flag("hosts-per-nvlink-domain")
    cache = flag("cache-dir")
    options: dict[str, Any] = {
        "hosts_per_domain": domain or None,
        "target": flag("target"),
        "budget_s": flag("budget-s"),
        "headroom": flag("headroom"),
        "calibration": flag("calibration"),
        "perf_table": flag("perf-table"),
        "profile": flag("profile"),
        "levers": flag("levers"),
        "progress": stderr if flag("progress") else None,
        "script": flag("script"),
        "jobs": flag("jobs"),
        "cache_dir": False if cache in ("none", "") else cache,
        "ray": flag("ray"),
    }
    ensure_deviceless()  # before PROGRAM.py can start JAX
    if embedded:
        spec = PROGRAMS.get(embedded)
        if spec is None:
            raise TuneUsageError(
                f"--program: unknown program '{embedded}'; known: {', '.join(sorted(PROGRAMS))}"
            )
        devices = devices or spec.num_devices
        per_host = per_host or spec.devices_per_host
        return tune(
            spec.build, devices=devices, devices_per_host=min(per_host, devices),
            program=embedded, **options,
        )  # fmt: skip
    given = Path(positional[0])
    if given.is_dir() or (given.is_file() and given.suffix != ".py"):
        return tune_path(given, devices=devices, devices_per_host=per_host or 8, **options)
    name, builder = load_builder(positional[0])
    if devices is None:
        raise TuneUsageError("--devices is required with PROGRAM.py")
    per_host = per_host or 8
    return tune(
        builder, devices=devices, devices_per_host=min(per_host, devices), program=name,
        **options,
    )  # fmt: skip
