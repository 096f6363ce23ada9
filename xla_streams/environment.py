"""Every environment variable the package reads, in one table: :data:`VARIABLES`.

Each is an :class:`~xla_streams.option.Option` with its ``XLA_STREAMS_*`` name. The
plugin's settings (:data:`SETTINGS`) are also keywords of :func:`xla_streams.enable`
and, for a program built on absl, flags ``--xla_streams_<keyword>``; the plugin reads
them when JAX starts (:mod:`xla_streams.plugin.settings`). The others are read where
they are used: by the ffi runtime (:data:`CUDA_STREAM_PRIORITY`; :data:`TRACE`, which
its C++ reads) and by the caches (:data:`CACHE_DIR`).

A name with the prefix that is not in the table is most likely a misspelling of one
that is: :func:`unknown` names each with the nearest known one, and the plugin stops
the program on it, as on a bad value, when it is on (it warns when it is off).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from xla_streams.collectives import DEFAULT_POLICY, POLICY, STREAMS
from xla_streams.option import (
    Option,
    Reader,
    ascii_integer,
    boolean,
    choice,
    number,
    path,
    suggestion,
    text,
)

ENV_PREFIX = "XLA_STREAMS_"
FLAG_PREFIX = "xla_streams_"

# native: XLA runs each annotated collective on its own communication_stream[k].
# ffi: our custom calls run them (CUDA streams + NCCL, or host worker threads).
Mode = Literal["native", "ffi"]
MODES: tuple[Mode, ...] = ("native", "ffi")
LogLevel = Literal["warning", "info", "debug"]
LOG_LEVELS: tuple[LogLevel, ...] = ("warning", "info", "debug")


# A default of None: unset (the help says what that means).


def _variable(
    name: str, default: Any, reader: Reader[Any], help: str, flag: str = ""
) -> Option[Any]:
    return Option(name, default, help, reader, env=ENV_PREFIX + name.upper(), flag=flag)


def _setting(name: str, default: Any, reader: Reader[Any], help: str) -> Option[Any]:
    return _variable(name, default, reader, help, FLAG_PREFIX + name)


_FILE = path(must_be="file", absolute=True)

COLLECTIVE_STREAMS = _setting(
    "collective_streams", None, STREAMS, "Turn the plugin on with K collective streams."
)
POLICY_SETTING = _setting("policy", DEFAULT_POLICY, POLICY, "How a collective picks its stream.")
MODE = _setting(
    "mode", "native", choice(MODES),
    "native: XLA runs each annotated collective on its own communication stream; ffi: our "
    "custom calls run them.",
)  # fmt: skip
PIPELINE = _setting(
    "pipeline", None, text(metavar="SPEC", takes="a pipeline spec"),
    "An explicit pass pipeline, e.g. "
    "'find-async-pairs,assign-streams{streams=4},verify-streams,annotate-streams'.",
)  # fmt: skip
REPORT_DIR = _setting(
    "report_dir", None, path(must_be="directory", absolute=True, metavar="DIR"),
    "Write <module>.<fingerprint>.json/.txt per compiled module with collectives, and "
    "index.json/index.txt, here.",
)  # fmt: skip
REPORT_HTML = _setting(
    "report_html", False, boolean(), "Also a Perfetto trace and an HTML timeline per report."
)
STRICT = _setting(
    "strict", False, boolean(),
    "An internal error fails the compile instead of leaving the module unchanged.",
)  # fmt: skip
LOG = _setting(
    "log", "info", choice(LOG_LEVELS),
    "What the plugin prints: info is the start-up line and, with reports on, one line per "
    "module.",
)  # fmt: skip
DEFAULT_TIMEOUT_S = 300.0
# A timeout turns a hang into an error, so it is finite. The runtime counts it in
# whole milliseconds, so less than 1 ms would be no time at all; a collective still
# running after a week is hung, not slow, and a week of nanoseconds (6e14) stays far
# from overflowing the runtime's int64 deadlines (9.2e18). The native runtime holds
# the same bounds (runtime/abi.py says so, and its test checks them).
MIN_TIMEOUT_S = 0.001
MAX_TIMEOUT_S = 7 * 24 * 3600.0
TIMEOUT_S = _setting(
    "timeout_s", DEFAULT_TIMEOUT_S,
    number(MIN_TIMEOUT_S, MAX_TIMEOUT_S, metavar="SECONDS",
           takes=f"a number of seconds from {MIN_TIMEOUT_S:g} to {MAX_TIMEOUT_S:g} (7 days)"),
    "ffi mode: a collective stuck this many seconds fails, naming it.",
)  # fmt: skip
CONFIG = _setting(
    "config", None, _FILE,
    "A result of `xla-streams tune --json`: its XLA options, K and policy.",
)  # fmt: skip
PERF_TABLE = _setting(
    "perf_table", None, _FILE,
    "XLA's collective performance table (its collective_perf_table format, text or "
    "binary), checked at start-up: XLA's scheduler gets it as "
    "--xla_gpu_experimental_collective_perf_table_path (unless XLA_FLAGS sets that) and "
    "the HTML reports price collectives from it.",
)  # fmt: skip

# The plugin's settings, in the order the README lists them.
SETTINGS: tuple[Option[Any], ...] = (
    COLLECTIVE_STREAMS, POLICY_SETTING, MODE, PIPELINE, REPORT_DIR, REPORT_HTML, STRICT, LOG,
    TIMEOUT_S, CONFIG, PERF_TABLE,
)  # fmt: skip
# The settings that turn the plugin on.
SWITCHES = frozenset({"collective_streams", "pipeline", "config"})


def _priority(value: str) -> str:
    """A CUDA stream priority as the runtime's C++ reads it: a word, or an integer."""
    word = value.strip().lower()
    if word in ("high", "low", "default"):
        return word
    try:
        return str(ascii_integer(word))
    except ValueError:
        raise ValueError("expected high, low, default or an integer") from None


CUDA_STREAM_PRIORITY = _variable(
    "cuda_stream_priority", "high",
    Reader("high, low, default or an integer", _priority, _priority, "PRIORITY"),
    "ffi mode on CUDA: the priority of the collective streams: high (the device's "
    "greatest), low or default (0), or an integer.",
)  # fmt: skip
TRACE = _variable(
    "trace", "0", choice(("0", "1")),
    "ffi mode: 1 records the runtime's trace from its start (read by its C++; "
    "xla_streams.runtime.enable_trace() does it from Python).",
)  # fmt: skip
CACHE_DIR = _variable(
    "cache_dir", None, path(metavar="DIR"),
    "Where the ffi runtime's built libraries (default ~/.cache/xla_streams) and `xla-streams "
    "tune`'s compiles (default ~/.cache/xla_streams/tune) are cached; $XDG_CACHE_HOME "
    "replaces ~/.cache.",
)  # fmt: skip

# The variables that are not settings of the plugin: read where they are used.
OTHER_VARIABLES: tuple[Option[Any], ...] = (CUDA_STREAM_PRIORITY, TRACE, CACHE_DIR)
# Every variable the package reads.
VARIABLES: tuple[Option[Any], ...] = (*SETTINGS, *OTHER_VARIABLES)
BY_ENV = {o.env or "": o for o in VARIABLES}


def unknown(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``XLA_STREAMS_*`` variables set (not empty) that the package does not read,
    each with what to say of it: ``NAME is not a variable of xla_streams; did you mean
    KNOWN?``."""
    environ = os.environ if environ is None else environ
    return {
        name: f"{name} is not a variable of xla_streams"
        + (suggestion(name, BY_ENV, ENV_PREFIX) or " (the README's table lists them all)")
        for name, value in sorted(environ.items())
        if name.startswith(ENV_PREFIX) and name not in BY_ENV and value.strip()
    }
