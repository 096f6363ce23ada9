"""The tuner's options, in one place: :class:`TuneOptions`.

Its fields are the keywords of :func:`xla_streams.tune` and, spelled with dashes,
the flags of ``xla-streams tune`` (:mod:`xla_streams.cli.tune` makes them from these
fields). Each field has its default, and in its metadata an :class:`About`: its help,
the values it takes, and how the command line reads it. A TuneOptions is checked
once, when it is made: a value it cannot take is a :class:`TuneError` naming the
option and what it takes.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

from xla_streams import aot
from xla_streams.collectives import MAX_STREAMS, STREAM_COUNTS, check_streams
from xla_streams.hlo.attributes import MAX_DEVICES
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
# How the command line reads an option's text: as it is, a whole number, a real
# number, a true/false switch, comma-separated names or comma-separated whole numbers.
Kind = Literal["text", "integer", "number", "switch", "names", "integers"]


@dataclass(frozen=True)
class About:
    """What one option of :class:`TuneOptions` is: its help, the values it takes
    (``takes``, in words: "budget_s must be <takes>"; ``valid`` says whether a value is
    one), and how the command line reads it: as ``kind``, under ``flag`` (default: the
    field's name with dashes), with ``words`` that stand for a value there
    (``--cache-dir=none``: False); ``command_line=False``: not a flag."""

    help: str
    takes: str = ""
    valid: Callable[[Any], bool] = lambda value: True
    kind: Kind = "text"
    choices: tuple[str, ...] = ()
    flag: str = ""
    words: tuple[tuple[str, object], ...] = ()
    command_line: bool = True


def about(option: dataclasses.Field[Any]) -> About:
    """The :class:`About` of a field of :class:`TuneOptions`."""
    found: About = option.metadata["about"]
    return found


def _integer(value: Any, lowest: int, highest: float = float("inf")) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lowest <= value <= highest


def _real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _path(value: Any) -> bool:
    return value is None or isinstance(value, str | os.PathLike)


def _lever_names(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        return False
    names = [LEVER_ALIASES.get(v, v) for v in value if isinstance(v, str)]
    return (
        len(names) == len(value)
        and set(names) <= set(LEVER_NAMES)
        and len(set(names)) == len(names)
    )


def _stream_counts(value: Any) -> bool:
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        return False
    try:
        for k in value:
            check_streams(k)
    except ValueError:
        return False
    return True


_DEVICES = (
    f"a positive integer (at most {MAX_DEVICES}: the most devices a module's replica groups "
    "may address)"
)


@dataclass(frozen=True)
class TuneOptions:
    """How to tune a program: the topology it runs on, what the search may try and how
    long, what refines the simulator, where the compiles run, and what the result says.

    Made with keywords (``TuneOptions(devices=32, target="h200")``) and checked then.
    ``devices`` may stay None only for StableHLO (``tune_path``), whose module says
    it; once ``devices`` is known, ``devices_per_host`` None (the default) becomes 8,
    or every device when there are fewer (:meth:`topology`). Each field's help is
    below (``about(field).help``)."""

    devices: int | None = field(default=None, metadata={"about": About(
        "Number of GPUs the program runs on (all hosts together; for a dump or StableHLO "
        "file, default: its module's replicas x partitions).",
        _DEVICES, lambda v: v is None or _integer(v, 1, MAX_DEVICES), "integer",
    )})  # fmt: skip
    devices_per_host: int | None = field(default=None, metadata={"about": About(
        f"GPUs per host (default {DEFAULT_DEVICES_PER_HOST}, or every device when there are "
        "fewer; device d is on host d // M).",
        _DEVICES, lambda v: v is None or _integer(v, 1, MAX_DEVICES), "integer",
    )})  # fmt: skip
    hosts_per_domain: int | None = field(default=DEFAULT_HOSTS_PER_DOMAIN, metadata={"about": About(
        "Hosts per NVLink (scale-up) domain: 1 on H100/H200 HGX clusters (each host its "
        "own), more on multi-node NVLink systems (GB200 NVL72: 18 hosts of 4 GPUs); 0 (None in "
        "Python): all hosts in one.",
        "a positive integer (None, 0 on the command line: all hosts in one domain)",
        lambda v: v is None or _integer(v, 1), "integer", flag="hosts-per-nvlink-domain",
        words=(("0", None),),
    )})  # fmt: skip
    target: str = field(default="h100", metadata={"about": About(
        "The GPU to compile and predict for.",
        f"one of {', '.join(TARGET_NAMES)}",
        lambda v: isinstance(v, str) and v.lower() in TARGET_NAMES, choices=TARGET_NAMES,
    )})  # fmt: skip
    budget_compiles: int = field(default=DEFAULT_BUDGET_COMPILES, metadata={"about": About(
        "Evaluate at most this many option sets (compiled now, from the cache, or dropped): "
        "the budget that makes the search repeatable, the same result on a busy or a quiet "
        "machine. The default lets the embedded 32-GPU programs finish their neighbour check.",
        "a positive integer", lambda v: _integer(v, 1), "integer",
    )})  # fmt: skip
    budget_s: float = field(default=DEFAULT_BUDGET_S, metadata={"about": About(
        "A safety limit on wall time: stop starting compiles once this many seconds are "
        "spent (the result then says so: it depends on the machine's speed).",
        "a positive number of seconds", lambda v: _real(v) and v > 0, "number",
    )})  # fmt: skip
    headroom: float = field(default=DEFAULT_HEADROOM, metadata={"about": About(
        "Fraction of the GPU's memory kept free: a configuration fits when its peak is at "
        "most (1 - headroom) x HBM.",
        "a fraction from 0 to 1", lambda v: _real(v) and 0 <= v < 1, "number",
    )})  # fmt: skip
    levers: Sequence[str] | None = field(default=None, metadata={"about": About(
        "Search only these levers, in this order (default: all, in the order "
        f"{', '.join(LEVER_NAMES)}).",
        f"distinct names from: {', '.join(LEVER_NAMES)}", _lever_names, "names",
    )})  # fmt: skip
    streams: Sequence[int] = field(default=STREAM_COUNTS, metadata={"about": About(
        "The numbers of collective streams K a recommendation may use.",
        f"integers from 1 to {MAX_STREAMS}", _stream_counts, "integers",
    )})  # fmt: skip
    exhaustive: bool = field(default=False, metadata={"about": About(
        "Compile every configuration of the levers instead of searching (their product: "
        "for measuring the search, not for everyday use).",
        "true or false", lambda v: isinstance(v, bool), "switch",
    )})  # fmt: skip
    calibration: File | None = field(default=None, metadata={"about": About(
        "A calibration file (schema xla_streams.calibration.v1) of measured corrections to "
        "the cost model.",
        "a path", _path,
    )})  # fmt: skip
    perf_table: File | None = field(default=None, metadata={"about": About(
        "A collective performance table in XLA's format (as for "
        "--xla_gpu_experimental_collective_perf_table_path): the collectives it measured are "
        "priced from it.",
        "a path", _path,
    )})  # fmt: skip
    profile: File | None = field(default=None, metadata={"about": About(
        "A PGLE profile of this program (ProfiledInstructionsProto, text or binary): the "
        "instructions it names take their measured times.",
        "a path", _path,
    )})  # fmt: skip
    jobs: int | None = field(default=None, metadata={"about": About(
        "Compile this many candidates at once, in worker processes (default: one per core, "
        "at most one per 4 GiB of available memory, at most 8). A crash of XLA on a "
        "candidate kills its worker only; 0 compiles in this process (no start-up).",
        f"an integer from 0 to {MAX_JOBS}", lambda v: v is None or _integer(v, 0, MAX_JOBS),
        "integer",
    )})  # fmt: skip
    cache_dir: CacheDir = field(default=None, metadata={"about": About(
        "The disk cache of compiled candidates (default $XLA_STREAMS_CACHE_DIR, else "
        "~/.cache/xla_streams/tune); 'none' (False in Python): no cache.",
        "a path, or False (no cache)", lambda v: isinstance(v, bool) or _path(v),
        words=(("none", False), ("", False)),
    )})  # fmt: skip
    ray: str | None = field(default=None, metadata={"about": About(
        "Compile on a running Ray cluster: 'auto' (the one `ray start` runs here, or "
        "RAY_ADDRESS) or its address; needs the ray extra. Usage statistics stay off unless "
        "RAY_USAGE_STATS_ENABLED says otherwise.",
        "'auto' or an address", lambda v: v is None or isinstance(v, str),
    )})  # fmt: skip
    script: str = field(default=DEFAULT_SCRIPT, metadata={"about": About(
        "What the printed command runs.", "a shell command", lambda v: isinstance(v, str),
    )})  # fmt: skip
    program: str | None = field(default=None, metadata={"about": About(
        "The program's name in the result (default: the builder's, or the file's).",
        "a name", lambda v: v is None or isinstance(v, str), command_line=False,
    )})  # fmt: skip
    progress: TextIO | None = field(default=None, metadata={"about": About(
        "Where a line per step goes (e.g. sys.stderr; the command line's --progress).",
        "a text stream", lambda v: v is None or callable(getattr(v, "write", None)),
        command_line=False,
    )})  # fmt: skip

    def __post_init__(self) -> None:
        for option in dataclasses.fields(self):
            value = getattr(self, option.name)
            if not about(option).valid(value):
                raise TuneError(f"{option.name} must be {about(option).takes}, not {value!r}")
        # One spelling each from here on: what the search, the cache and the result use.
        if self.levers is not None:
            self._set("levers", tuple(LEVER_ALIASES.get(v, v) for v in self.levers))
        self._set("streams", tuple(self.streams))
        self._set("target", self.target.lower())
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


def _field_help() -> str:
    lines = [f"- ``{f.name}`` (default ``{f.default!r}``): {about(f).help}" for f in OPTIONS]
    return "\n".join(lines)


OPTIONS: tuple[dataclasses.Field[Any], ...] = dataclasses.fields(TuneOptions)
# help(TuneOptions) lists every field with its default and help, from the fields.
TuneOptions.__doc__ = f"{inspect.cleandoc(TuneOptions.__doc__ or '')}\n\n{_field_help()}\n"
