"""The tuner's options, in one place: :class:`TuneOptions`.

Its fields are the keywords of :func:`xla_streams.tune` and, spelled with dashes,
the flags of ``xla-streams tune`` (:mod:`xla_streams.cli.tune` makes them from these
fields). Each field is an :class:`~xla_streams.option.Option`: its default, the
reader of its values (what it takes, in Python and on the command line) and its
help. A TuneOptions is checked once, when it is made: a value it cannot take is a
:class:`TuneError` naming the option and what it takes.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from xla_streams import aot
from xla_streams.collectives import MAX_STREAMS, STREAM_COUNTS, STREAMS
from xla_streams.hlo.attributes import MAX_DEVICES
from xla_streams.option import (
    Option,
    OptionError,
    Reader,
    boolean,
    check_fields,
    choice,
    integer,
    number,
    option,
    optional,
    options_of,
    path,
    sequence,
    text,
)
from xla_streams.tuning.levers import LEVER_ALIASES, LEVER_NAMES
from xla_streams.tuning.result import (
    DEFAULT_BUDGET_COMPILES,
    DEFAULT_BUDGET_S,
    DEFAULT_HEADROOM,
    DEFAULT_SCRIPT,
    TuneError,
)

# GPUs per host unless told: an H100/H200 HGX host.
DEFAULT_DEVICES_PER_HOST = 8
# Hosts per NVLink domain unless told: an H100/H200 HGX cluster, each host its own.
DEFAULT_HOSTS_PER_DOMAIN = 1
TARGET_NAMES = tuple(aot.GPU_CONFIGS)  # the GPUs we compile for without one
# The most compile processes: each may take a few GiB.
MAX_JOBS = 256

File = str | os.PathLike[str]
CacheDir = File | None | bool

# A number of devices, or None where the program says it (devices) or the topology
# decides (devices_per_host).
_DEVICES = optional(
    integer(1, MAX_DEVICES),
    takes=f"a positive integer (at most {MAX_DEVICES}: the most devices a module's replica "
    "groups may address)",
)


_LEVERS = f"distinct names from: {', '.join(LEVER_NAMES)}"


def _stream(value: Any) -> TextIO:
    if not callable(getattr(value, "write", None)):
        raise ValueError("expected a text stream")
    stream: TextIO = value
    return stream


def _no_text(text: str) -> Any:
    raise ValueError("expected a text stream, given in Python")


@dataclass(frozen=True)
class TuneOptions:
    """How to tune a program: the topology it runs on, what the search may try and how
    long, what refines the simulator, where the compiles run, and what the result says.

    Made with keywords (``TuneOptions(devices=32, target="h200")``) and checked then.
    ``devices`` may stay None only for StableHLO (``tune_path``), whose module says
    it; once ``devices`` is known, ``devices_per_host`` None (the default) becomes 8,
    or every device when there are fewer (:meth:`topology`). Each field's help is
    below (``options_of(TuneOptions)``)."""

    devices: int | None = option(None, _DEVICES,
        "Number of GPUs the program runs on (all hosts together; for a dump or StableHLO "
        "file, default: its module's replicas x partitions).",
    )  # fmt: skip
    devices_per_host: int | None = option(None, _DEVICES,
        f"GPUs per host (default {DEFAULT_DEVICES_PER_HOST}, or every device when there are "
        "fewer; device d is on host d // M).",
    )  # fmt: skip
    hosts_per_domain: int | None = option(DEFAULT_HOSTS_PER_DOMAIN,
        optional(integer(1), takes="a positive integer (None in Python, 0 on the command "
                 "line: all hosts in one domain)", words={"0": None}),
        "Hosts per NVLink (scale-up) domain: 1 on H100/H200 HGX clusters (each host its "
        "own), more on multi-node NVLink systems (GB200 NVL72: 18 hosts of 4 GPUs); 0 (None in "
        "Python): all hosts in one.",
        flag="hosts-per-nvlink-domain",
    )  # fmt: skip
    target: str = option("h100", choice(TARGET_NAMES), "The GPU to compile and predict for.")
    budget_compiles: int = option(DEFAULT_BUDGET_COMPILES, integer(1),
        "Evaluate at most this many option sets (compiled now, from the cache, or dropped): "
        "the budget that makes the search repeatable, the same result on a busy or a quiet "
        "machine. The default lets the embedded 32-GPU programs finish their neighbour check.",
    )  # fmt: skip
    budget_s: float = option(DEFAULT_BUDGET_S,
        number(0, takes="a positive number of seconds", above=True, metavar="SECONDS"),
        "A safety limit on wall time: stop starting compiles once this many seconds are "
        "spent (the result then says so: it depends on the machine's speed).",
    )  # fmt: skip
    headroom: float = option(DEFAULT_HEADROOM,
        number(0, 1, takes="a fraction from 0 to 1", below=True, metavar="FRACTION"),
        "Fraction of the GPU's memory kept free: a configuration fits when its peak is at "
        "most (1 - headroom) x HBM.",
    )  # fmt: skip
    levers: Sequence[str] | None = option(None,
        optional(sequence(choice(LEVER_NAMES, aliases=LEVER_ALIASES, metavar="LEVER"),
                          takes=_LEVERS, distinct=True), takes=_LEVERS),
        "Search only these levers, in this order (default: all, in the order "
        f"{', '.join(LEVER_NAMES)}).",
    )  # fmt: skip
    streams: Sequence[int] = option(STREAM_COUNTS,
        sequence(STREAMS, takes=f"integers from 1 to {MAX_STREAMS}"),
        "The numbers of collective streams K a recommendation may use.",
    )  # fmt: skip
    exhaustive: bool = option(False, boolean(),
        "Compile every configuration of the levers instead of searching (their product: "
        "for measuring the search, not for everyday use).",
    )  # fmt: skip
    calibration: File | None = option(None, optional(path(), takes="a path"),
        "A calibration file (schema xla_streams.calibration.v1) of measured corrections to "
        "the cost model.",
    )  # fmt: skip
    perf_table: File | None = option(None, optional(path(), takes="a path"),
        "A collective performance table in XLA's format (as for "
        "--xla_gpu_experimental_collective_perf_table_path): the collectives it measured are "
        "priced from it.",
    )  # fmt: skip
    profile: File | None = option(None, optional(path(), takes="a path"),
        "A PGLE profile of this program (ProfiledInstructionsProto, text or binary): the "
        "instructions it names take their measured times.",
    )  # fmt: skip
    jobs: int | None = option(None,
        optional(integer(0, MAX_JOBS), takes=f"an integer from 0 to {MAX_JOBS}"),
        "Compile this many candidates at once, in worker processes (default: one per core, "
        "at most one per 4 GiB of available memory, at most 8). A crash of XLA on a "
        "candidate kills its worker only; 0 compiles in this process (no start-up).",
    )  # fmt: skip
    cache_dir: CacheDir = option(None,
        optional(path(metavar="DIR"), takes="a path, or False (no cache)",
                 words={"none": False, "": False}, also=(None, True, False)),
        "The disk cache of compiled candidates (default $XLA_STREAMS_CACHE_DIR, else "
        "~/.cache/xla_streams/tune); 'none' (False in Python): no cache.",
    )  # fmt: skip
    ray: str | None = option(None,
        optional(text(metavar="ADDRESS"), takes="'auto' or an address"),
        "Compile on a running Ray cluster: 'auto' (the one `ray start` runs here, or "
        "RAY_ADDRESS) or its address; needs the ray extra. Usage statistics stay off unless "
        "RAY_USAGE_STATS_ENABLED says otherwise.",
    )  # fmt: skip
    script: str = option(DEFAULT_SCRIPT, text(metavar="COMMAND", takes="a shell command"),
        "What the printed command runs.")  # fmt: skip
    program: str | None = option(None, optional(text(metavar="NAME"), takes="a name"),
        "The program's name in the result (default: the builder's, or the file's).",
    )  # fmt: skip
    progress: TextIO | None = option(None,
        optional(Reader("a text stream", _no_text, _stream, "STREAM"), takes="a text stream"),
        "Where a line per step goes (e.g. sys.stderr; the command line's --progress).",
    )  # fmt: skip

    def __post_init__(self) -> None:
        # One spelling each from here on (a tuple, a lever's own name, a target in lower
        # case): what the search, the cache and the result use.
        try:
            check_fields(self)
        except OptionError as e:
            raise TuneError(str(e)) from None
        if self.devices is None:
            return
        if self.devices_per_host is None:
            self._set("devices_per_host", min(DEFAULT_DEVICES_PER_HOST, self.devices))
        devices, per_host, per_domain = self.topology()
        if per_host > devices:
            raise TuneError(f"devices_per_host={per_host} is more than devices={devices}")
        if devices % per_host:
            raise TuneError(f"devices={devices} is not a multiple of devices_per_host={per_host}")
        hosts = devices // per_host
        if per_domain is not None and hosts % per_domain:
            raise TuneError(f"hosts_per_domain={per_domain} does not divide the {hosts} host(s)")

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)

    def topology(self) -> tuple[int, int, int | None]:
        """``(devices, devices_per_host, hosts_per_domain)``: what the compile-only
        topology is built from. TuneError while ``devices`` is not known."""
        if self.devices is None or self.devices_per_host is None:
            raise TuneError("devices is required: the number of GPUs the program runs on")
        return self.devices, self.devices_per_host, self.hosts_per_domain


OPTIONS: dict[str, Option[Any]] = options_of(TuneOptions)
# help(TuneOptions) lists every option with its default and help, from the declarations.
TuneOptions.__doc__ = (
    f"{inspect.cleandoc(TuneOptions.__doc__ or '')}\n\n"
    + "\n".join(f"- ``{o.name}`` (default ``{o.default!r}``): {o.help}" for o in OPTIONS.values())
    + "\n"
)
