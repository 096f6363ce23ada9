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


# XLA's own default for each option above (and what ``xla-streams tune`` compares
# against), as the CUDA plugin of jax 0.12.0.1 reports its DebugOptions. Note the
# reduce-scatter pipeliner: on by default there, so turning it "on" changes nothing.
DEFAULTS: dict[str, object] = {
    OVERLAP_LIMIT: 1,
    SCALE_UP_OVERLAP_LIMIT: 1,
    MULTI_STREAMING: False,
    WHILE_LOOP_DOUBLE_BUFFERING: False,
    START_AS_EARLY_AS_POSSIBLE: False,
    PIPELINE["all-gather"]: PIPELINING_DEFAULT,
    PIPELINE["reduce-scatter"]: PIPELINING_ON,
    PIPELINE["all-reduce"]: PIPELINING_DEFAULT,
    **dict.fromkeys(COMBINE_THRESHOLD.values(), 31457287),
}

# Enum values: ``compile(compiler_options=...)`` takes the value's full name
# (COLLECTIVE_PIPELINING_MODE_ON), XLA_FLAGS only what follows the prefix
# (``--xla_gpu_pipeline_all_gather=ON``): given the full name, XLA's flag parser
# fails and aborts the process (both seen on jax 0.12.0.1).
ENUM_PREFIXES = ("COLLECTIVE_PIPELINING_MODE_",)


def native_mode(streams: int) -> dict[str, int]:
    """What native mode needs for ``streams`` collective streams: that many collectives
    in flight, and that many communication streams to run them on."""
    return {OVERLAP_LIMIT: streams, COMMUNICATION_STREAMS: streams}


def as_xla_flags(options: Mapping[str, object]) -> list[str]:
    """``--name=value`` for each option, as ``XLA_FLAGS`` spells it."""
    return [f"--{name}={_flag_value(value)}" for name, value in options.items()]


def _flag_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
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


def without(xla_flags: str, flags: tuple[str, ...]) -> str:
    """``xla_flags`` without the ``--name=value`` tokens in ``flags``."""
    if not flags:
        return xla_flags
    tokens = shlex.split(xla_flags) if xla_flags.strip() else []
    return " ".join(shlex.quote(t) for t in tokens if t not in flags)
