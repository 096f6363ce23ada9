"""The XLA options this package sets, reads or searches: one table, for jax 0.11.2 to 0.12.

Each is a ``DebugOptions`` field, spelled as ``compile(compiler_options=...)``
takes it and, with ``--`` in front, as ``XLA_FLAGS`` takes it. Names checked
against the option strings of the jaxlib/PJRT plugin builds of 0.11.2 and
0.12.0.1. Where a version renamed an option the table says so, and callers
never spell option names themselves.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

# At most this many async collectives in flight at once; 1 (the default) keeps one,
# and then there is nothing to spread over streams.
OVERLAP_LIMIT = "xla_gpu_experimental_parallel_collective_overlap_limit"
XLA_DEFAULT_OVERLAP_LIMIT = 1
# The same for collectives inside one NVLink domain (new in 0.11).
SCALE_UP_OVERLAP_LIMIT = "xla_gpu_experimental_parallel_scale_up_collective_overlap_limit"
# Communication streams an executable borrows: communication_stream[k] exists for k < this.
COMMUNICATION_STREAMS = "xla_gpu_executable_num_communication_streams"
# XLA's own two-stream runtime for collectives (alternates streams 0 and 1).
MULTI_STREAMING = "xla_gpu_experimental_enable_collective_multi_streaming"
WHILE_LOOP_DOUBLE_BUFFERING = "xla_gpu_enable_while_loop_double_buffering"
START_AS_EARLY_AS_POSSIBLE = "xla_gpu_experimental_collective_start_as_early_as_possible"

# The collective pipeliner (moves a scan's next-iteration collectives into this
# iteration). Enums since 0.11; the 0.10 booleans xla_gpu_enable_pipelined_<kind>
# survive only as deprecated XLA_FLAGS aliases and are refused as compile options.
PIPELINE = {
    "all-gather": "xla_gpu_pipeline_all_gather",
    "reduce-scatter": "xla_gpu_pipeline_reduce_scatter",
    "all-reduce": "xla_gpu_pipeline_all_reduce",
}
PIPELINING_ON = "COLLECTIVE_PIPELINING_MODE_ON"
PIPELINING_OFF = "COLLECTIVE_PIPELINING_MODE_OFF"
PIPELINING_DEFAULT = "COLLECTIVE_PIPELINING_MODE_DEFAULT"

# Bytes up to which XLA combines collectives of one kind into one.
COMBINE_THRESHOLD = {
    "all-gather": "xla_gpu_all_gather_combine_threshold_bytes",
    "reduce-scatter": "xla_gpu_reduce_scatter_combine_threshold_bytes",
    "all-reduce": "xla_gpu_all_reduce_combine_threshold_bytes",
}


# Collective matmul: XLA decomposes an all-gather/reduce-scatter feeding a GEMM into a
# loop of collective-permutes overlapped with partial GEMMs (windowed einsum), on its
# own streams when multi-streamed; the threshold (MiB of the GEMM's output) above which
# it does so: 100000 by default, i.e. never in practice; NVIDIA's JAX-Toolbox uses 0.
WINDOWED_EINSUM_MULTI_STREAMED = "xla_gpu_multi_streamed_windowed_einsum"
WINDOWED_EINSUM_THRESHOLD_MIB = "xla_gpu_threshold_for_windowed_einsum_mib"
# Which collectives XLA tags as running inside one scale-up (NVLink) domain, for the
# scale-up overlap limit: "" (none) or "scale_up_fabric" (by the topology's partitions).
COLLECTIVE_DOMAIN_ASSIGNMENT = "xla_gpu_collective_domain_assignment"
SCALE_UP_FABRIC = "scale_up_fabric"

# The most a threshold in bytes may be (XLA reads them as int64).
MAX_BYTES = 2**63 - 1
# The most collectives in flight an overlap limit may allow (0: unlimited, where XLA
# allows that).
MAX_OVERLAP_LIMIT = 64


@dataclass(frozen=True)
class Option:
    """One XLA option the tuner searches: its type, what values it may take, XLA's default.

    ``kind`` is ``bool``, ``int`` (an integer from ``low`` to ``high``) or ``enum`` (one
    of ``choices``, spelled as ``compile(compiler_options=...)`` takes it)."""

    name: str
    kind: str
    default: object
    low: int = 0
    high: int = 0
    choices: tuple[str, ...] = ()
    what: str = ""

    def check(self, value: object) -> object:
        """``value`` if this option can take it, else a ValueError saying what it takes."""
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            raise ValueError(f"expected true or false, got {_shown(value)}")
        if self.kind == "int":
            if isinstance(value, int) and not isinstance(value, bool):
                if self.low <= value <= self.high:
                    return value
                raise ValueError(f"expected an integer from {self.low} to {self.high}, got {value}")
            raise ValueError(f"expected an integer, got {_shown(value)}")
        if isinstance(value, str) and value in self.choices:
            return value
        shown = ", ".join(repr(c) for c in self.choices)
        raise ValueError(f"expected one of {shown}, got {_shown(value)}")


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return f"the string {value[:40]!r}" + ("..." if len(value) > 40 else "")
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if value is None:
        return "null"
    return f"a {type(value).__name__}"


_PIPELINING_MODES = (
    PIPELINING_DEFAULT,
    PIPELINING_ON,
    PIPELINING_OFF,
    "COLLECTIVE_PIPELINING_MODE_EXPLICIT",
)

# The options ``xla-streams tune`` searches, writes and (in a tune file) accepts: their
# types, ranges and XLA's own defaults, as the CUDA plugin of jax 0.12.0.1 reports its
# DebugOptions (its GPU dump's config.pbtxt). Note the reduce-scatter pipeliner: on by
# default there, so turning it "on" changes nothing.
OPTIONS: dict[str, Option] = {
    o.name: o
    for o in (
        Option(OVERLAP_LIMIT, "int", XLA_DEFAULT_OVERLAP_LIMIT, 1, MAX_OVERLAP_LIMIT,
               what="async collectives in flight at once"),
        Option(SCALE_UP_OVERLAP_LIMIT, "int", 1, 0, MAX_OVERLAP_LIMIT,
               what="scale-up (NVLink) collectives in flight at once; 0: unlimited"),
        Option(MULTI_STREAMING, "bool", False, what="XLA's own two collective streams"),
        Option(WHILE_LOOP_DOUBLE_BUFFERING, "bool", False, what="double-buffered while loops"),
        Option(START_AS_EARLY_AS_POSSIBLE, "bool", False,
               what="collectives start as early as their operands allow"),
        *(
            Option(name, "enum", PIPELINING_ON if kind == "reduce-scatter" else
                   PIPELINING_DEFAULT, choices=_PIPELINING_MODES,
                   what=f"the loop pipeliner for {kind}")
            for kind, name in PIPELINE.items()
        ),
        *(
            Option(name, "int", 31457287, 0, MAX_BYTES, what=f"bytes up to which {kind}s combine")
            for kind, name in COMBINE_THRESHOLD.items()
        ),
        Option(WINDOWED_EINSUM_MULTI_STREAMED, "bool", True,
               what="windowed einsum (collective matmul) on its own streams"),
        Option(WINDOWED_EINSUM_THRESHOLD_MIB, "int", 100000, 0, 2**31 - 1,
               what="MiB of GEMM output above which collective matmul is used"),
        Option(COLLECTIVE_DOMAIN_ASSIGNMENT, "enum", "", choices=("", SCALE_UP_FABRIC),
               what="collectives tagged as inside one NVLink domain"),
    )
}  # fmt: skip

# XLA's own default for each option above (what ``xla-streams tune`` compares against).
DEFAULTS: dict[str, object] = {name: o.default for name, o in OPTIONS.items()}


def check_option(name: str, value: object) -> object:
    """``value`` when ``name`` is an option of :data:`OPTIONS` that can take it; else a
    ValueError that says why (an option the tuner does not search, or the values it
    takes)."""
    option = OPTIONS.get(name)
    if option is None:
        raise ValueError(
            f"{name!r} is not an option xla-streams tune searches (those are: "
            f"{', '.join(sorted(OPTIONS))})"
        )
    return option.check(value)


# Enum values: ``compile(compiler_options=...)`` takes the value's full name
# (COLLECTIVE_PIPELINING_MODE_ON), XLA_FLAGS only what follows the prefix
# (``--xla_gpu_pipeline_all_gather=ON``): given the full name, XLA's flag parser
# fails and aborts the process (both seen on jax 0.12.0.1).
ENUM_PREFIXES = ("COLLECTIVE_PIPELINING_MODE_",)

# What an option's name and value may hold once written into XLA_FLAGS: anything else
# (whitespace, quotes, '=', a second '--flag') could smuggle in another flag.
_SAFE_NAME = re.compile(r"[A-Za-z0-9_]+")
_SAFE_VALUE = re.compile(r"-?[A-Za-z0-9_.+]*")


def native_mode(streams: int) -> dict[str, int]:
    """What native mode needs for ``streams`` collective streams: that many collectives
    in flight, and that many communication streams to run them on."""
    return {OVERLAP_LIMIT: streams, COMMUNICATION_STREAMS: streams}


def as_xla_flags(options: Mapping[str, object]) -> list[str]:
    """``--name=value`` for each option, as ``XLA_FLAGS`` spells it. Raises ValueError
    for a name or value that is not one word (letters, digits, ``_``, ``.``, ``+``, a
    leading ``-``): one that could add a second flag to XLA_FLAGS."""
    return [f"--{_flag_name(name)}={_flag_value(name, value)}" for name, value in options.items()]


def _flag_name(name: str) -> str:
    if not isinstance(name, str) or not _SAFE_NAME.fullmatch(name):
        raise ValueError(f"{name!r} cannot be an XLA option name")
    return name


def _flag_value(name: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if not isinstance(value, str | int | float):
        raise ValueError(f"{name}: {type(value).__name__} cannot be an XLA_FLAGS value")
    text = str(value)
    if not _SAFE_VALUE.fullmatch(text) or "--" in text:
        raise ValueError(
            f"{name}: {text[:40]!r} cannot go into XLA_FLAGS (one word of letters, digits "
            "and _ . + only: it must not add another flag)"
        )
    for prefix in ENUM_PREFIXES:
        if isinstance(value, str) and text.startswith(prefix) and len(text) > len(prefix):
            return text[len(prefix) :]
    return text


def with_options(
    xla_flags: str, wanted: Mapping[str, object]
) -> tuple[str, list[str], dict[str, str]]:
    """``xla_flags`` (an ``XLA_FLAGS`` value) with each of ``wanted`` the user has not set.

    Returns the new value, the ``--name=value`` flags added, and the user's own
    values for the wanted names they did set.
    """
    present = options_in(xla_flags)
    added = as_xla_flags({name: v for name, v in wanted.items() if name not in present})
    users = {name: present[name] for name in wanted if name in present}
    new = " ".join([xla_flags.strip(), *added]).strip() if added else xla_flags
    return new, added, users


def options_in(xla_flags: str) -> dict[str, str]:
    """The options an ``XLA_FLAGS`` value sets, by name (a bare ``--name`` is ``true``)."""
    present: dict[str, str] = {}
    for token in shlex.split(xla_flags) if xla_flags.strip() else []:
        match = re.fullmatch(r"--?([A-Za-z0-9_]+)(?:=(.*))?", token)
        if match:
            present[match.group(1)] = match.group(2) if match.group(2) is not None else "true"
    return present


def overlap_limit_in(xla_flags: str) -> int | None:
    """The :data:`OVERLAP_LIMIT` an ``XLA_FLAGS`` value sets, as a number; None when it
    sets none, or a value that is not a whole number."""
    return overlap_limit_of(options_in(xla_flags).get(OVERLAP_LIMIT))


def overlap_limit_of(value: object) -> int | None:
    """An :data:`OVERLAP_LIMIT` value as a number (an int, or digits as ``XLA_FLAGS`` or
    a tune result spell it); None for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 0 else None
    if isinstance(value, str) and re.fullmatch(r"[0-9]+", value):
        return int(value)
    return None


def without(xla_flags: str, flags: tuple[str, ...]) -> str:
    """``xla_flags`` without the ``--name=value`` tokens in ``flags``."""
    if not flags:
        return xla_flags
    tokens = shlex.split(xla_flags) if xla_flags.strip() else []
    return " ".join(shlex.quote(t) for t in tokens if t not in flags)
