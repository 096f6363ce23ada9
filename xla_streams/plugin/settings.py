"""The plugin's settings, in one place: the table :data:`SETTINGS` and a frozen, validated
:class:`Config`.

A Config comes from one of three sources, each with its own spelling of a
setting, so that an error names what the user actually wrote: the environment
(``XLA_STREAMS_POLICY``), absl flags (``--xla_streams_policy``) or keywords of
:func:`xla_streams.enable` (``policy=``). Every setting is in :data:`SETTINGS`
with its help text, which ``xla_streams.plugin.flags`` and the README use.

The plugin is on when ``collective_streams``, ``pipeline`` or ``config`` (a
``xla-streams tune`` result) is given. An explicit pipeline must agree with
``collective_streams``/``policy``/``mode`` where it says them, and options it
does not write take their values from them. This module imports neither JAX
nor the passes until a pipeline spec or a tune file has to be read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from xla_streams.collectives import (
    DEFAULT_POLICY,
    MAX_STREAMS,
    POLICIES,
    STREAMS_EXPECTED,
    Policy,
    check_streams,
    streams_from_text,
)
from xla_streams.passes.base import PipelineError
from xla_streams.pipeline import PipelineSpec
from xla_streams.runtime.abi import DEFAULT_TIMEOUT_S, checked_timeout, read_timeout
from xla_streams.tuning.result import TuneError, load_tune_result

# native: XLA runs each annotated collective on its own communication_stream[k].
# ffi: our custom calls run them (CUDA streams + NCCL, or host worker threads).
Mode = Literal["native", "ffi"]
MODES: tuple[Mode, ...] = ("native", "ffi")
LogLevel = Literal["warning", "info", "debug"]
LOG_LEVELS: tuple[LogLevel, ...] = ("warning", "info", "debug")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
BOOL_VALUES = ", ".join(v for pair in zip(_TRUE, _FALSE, strict=True) for v in pair)

ENV_PREFIX = "XLA_STREAMS_"
FLAG_PREFIX = "xla_streams_"
Source = Literal["env", "flag", "kwarg"]


class ConfigError(ValueError):
    """A setting that cannot be used; the message names it as the user spelled it."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(message)
        self.setting = setting


def spelled(setting: str, source: Source) -> str:
    """``XLA_STREAMS_POLICY``, ``--xla_streams_policy`` or ``policy``: ``setting`` in ``source``."""
    if source == "env":
        return ENV_PREFIX + setting.upper()
    if source == "flag":
        return "--" + FLAG_PREFIX + setting
    return setting


@dataclass(frozen=True)
class Config:
    """Validated plugin settings. Build with :meth:`from_env`, :meth:`from_values`."""

    collective_streams: int
    policy: Policy = DEFAULT_POLICY
    mode: Mode = "native"
    pipeline: PipelineSpec | None = None
    report_dir: str | None = None
    report_html: bool = False  # also a Perfetto trace and an HTML timeline per report
    strict: bool = False
    log: LogLevel = "info"
    timeout_s: float = DEFAULT_TIMEOUT_S
    # XLA options to set where the user has not (from a tune result), by DebugOptions name.
    xla_options: Mapping[str, object] = field(default_factory=dict)
    config: str | None = None  # the tune result they came from
    # XLA's collective performance table (checked to parse): XLA's own scheduler and
    # the reports' simulation price collectives from it.
    perf_table: str | None = None
    # Keep K streams where CUDA_DEVICE_MAX_CONNECTIONS=1 (else the plugin uses one).
    ignore_max_connections: bool = False

    def __post_init__(self) -> None:
        # Direct construction gets the same checks as the builders, named by keyword.
        for setting in SETTINGS:
            if setting.check is not None:
                setting.check(getattr(self, setting.name), f"{setting.name}=")
        _checked_xla_options(self.xla_options, "xla_options: ")
        if self.report_html and self.report_dir is None:
            raise ConfigError(
                "report_html",
                "XLA_STREAMS_REPORT_HTML (report_html) needs XLA_STREAMS_REPORT_DIR "
                "(report_dir): where to write the pages",
            )

    def describe(self) -> str:
        """One line for logs."""
        parts = [
            f"{self.collective_streams} collective streams",
            f"policy {self.policy}",
            f"mode {self.mode}",
        ]
        if self.config is not None:
            parts.append(f"tuned by {self.config}")
        if self.pipeline is not None:
            parts.append(f"pipeline '{self.pipeline.text}'")
        if self.report_dir is not None:
            parts.append(f"reports in {self.report_dir}")
        if self.perf_table is not None:
            parts.append(f"collective perf table {self.perf_table}")
        if self.strict:
            parts.append("strict")
        return ", ".join(parts)

    # -- builders -----------------------------------------------------------------

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config | None:
        """The settings of the ``XLA_STREAMS_*`` variables; None when the plugin is off.

        Empty variables count as unset. Raises ConfigError naming the variable.
        """
        environ = os.environ if environ is None else environ
        raw = {s.name: environ.get(spelled(s.name, "env"), "").strip() for s in SETTINGS}
        return cls.from_values({s: v for s, v in raw.items() if v}, "env")

    @classmethod
    def from_values(cls, values: Mapping[str, Any], source: Source) -> Config | None:
        """Settings given as text (env, flags) or Python values (keywords).

        Missing or None values are unset; None is returned when the plugin stays off.
        """
        return cls.from_layers([(values, source)])

    @classmethod
    def from_layers(cls, layers: Sequence[tuple[Mapping[str, Any], Source]]) -> Config | None:
        """Settings from several sources; a later layer overrides an earlier one.

        Each value is checked and, on error, named as its own source spells it
        (``--xla_streams_policy`` for a flag over ``XLA_STREAMS_POLICY`` from the
        environment).
        """
        parsed: dict[str, Any] = {}
        origin: dict[str, Source] = {}
        for values, source in layers:
            unknown = set(values) - set(BY_NAME)
            if unknown:
                name = sorted(unknown)[0]
                raise ConfigError(name, f"unknown setting '{name}'; settings: {', '.join(BY_NAME)}")
            for setting, value in values.items():
                if value is None:
                    continue
                parsed[setting] = _parse(setting, value, spelled(setting, source))
                origin[setting] = source
        if not {"collective_streams", "pipeline", "config"} & set(parsed):
            return None
        _apply_tune_file(parsed, origin)
        _reconcile_pipeline(parsed, origin)
        return cls(**parsed)


def ignored_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """``XLA_STREAMS_*`` variables that are set while the plugin is off (for a warning)."""
    environ = os.environ if environ is None else environ
    return [
        spelled(s.name, "env")
        for s in SETTINGS
        if s.name not in ("collective_streams", "pipeline", "config")
        and environ.get(spelled(s.name, "env"), "").strip()
    ]


# -- parsing each setting ---------------------------------------------------------------


def _parse_streams(value: Any, name: str) -> int:
    try:
        return streams_from_text(value) if isinstance(value, str) else check_streams(value)
    except ValueError:
        raise _bad_streams(value, name) from None


def _check_streams(value: Any, name: str) -> None:
    try:
        check_streams(value)
    except ValueError:
        raise _bad_streams(value, name) from None


def _bad_streams(value: Any, name: str) -> ConfigError:
    return ConfigError(
        "collective_streams", f"{_shown(name, value)} is not valid: expected {STREAMS_EXPECTED}"
    )


def _choice(
    accepted: tuple[str, ...],
) -> tuple[Callable[[Any, str], Any], Callable[[Any, str], None]]:
    """(parse, check) for a setting that is one of ``accepted``, case-insensitively."""

    def check(value: Any, name: str) -> None:
        if value not in accepted:
            raise ConfigError(
                _setting_of(name),
                f"{_shown(name, value)} is not valid; accepted values: {', '.join(accepted)}",
            )

    def parse(value: Any, name: str) -> Any:
        text = value.strip().lower() if isinstance(value, str) else value
        check(text, name)
        return text

    return parse, check


def _parse_bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(
        _setting_of(name), f"{_shown(name, value)} is not valid; accepted values: {BOOL_VALUES}"
    )


def _check_bool(value: Any, name: str) -> None:
    if not isinstance(value, bool):
        raise ConfigError(
            _setting_of(name), f"{_shown(name, value)} is not valid: expected True or False"
        )


# A number of seconds as text: ASCII digits, a point, an exponent (float() would also
# take other scripts' digits, "1_0", "inf").
_SECONDS = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _parse_timeout(value: Any, name: str) -> float:
    number = value
    if isinstance(value, str) and not _SECONDS.fullmatch(value.strip()):
        number = "nan"  # fails the check below, with its message
    try:
        return read_timeout(number, _shown(name, value))
    except ValueError as e:
        raise ConfigError("timeout_s", str(e)) from None


def _check_timeout(value: Any, name: str) -> None:
    try:
        checked_timeout(value, _shown(name, value))
    except ValueError as e:
        raise ConfigError("timeout_s", str(e)) from None


def _parse_path(setting: str, must_be: Literal["directory", "file"]) -> Callable[[Any, str], str]:
    def parse(value: Any, name: str) -> str:
        if not isinstance(value, str | os.PathLike):
            raise ConfigError(setting, f"{_shown(name, value)} is not a path")
        path = os.path.abspath(os.path.expanduser(os.fspath(value)))
        if must_be == "directory" and os.path.exists(path) and not os.path.isdir(path):
            raise ConfigError(setting, f"{_shown(name, value)} is not valid: not a directory")
        if must_be == "file" and not os.path.isfile(path):
            raise ConfigError(setting, f"{_shown(name, value)} is not valid: no such file")
        return path

    return parse


def _parse_pipeline(value: Any, name: str) -> PipelineSpec:
    if isinstance(value, PipelineSpec):
        return value
    if not isinstance(value, str):
        raise ConfigError("pipeline", f"{_shown(name, value)} is not a pipeline spec")
    try:
        return PipelineSpec.parse(value)
    except PipelineError as e:
        raise ConfigError("pipeline", f"{_shown(name, value)} is not valid: {e}") from None


def _check_pipeline(value: Any, name: str) -> None:
    if value is not None and not isinstance(value, PipelineSpec):
        raise ConfigError(
            "pipeline", f"{_shown(name, value)} is not a PipelineSpec: give the text to enable()"
        )


# What XLA_FLAGS cannot carry in a path: it splits its value at whitespace, and the
# plugin reads it back with shlex.
_UNSAFE_IN_XLA_FLAGS = frozenset(" \t\n\r\v\f'\"\\")


def _parse_perf_table(value: Any, name: str) -> str:
    """An existing file that parses as XLA's collective performance table (text or
    binary) and that XLA can read, as an absolute path that XLA_FLAGS can carry."""
    path = _parse_path("perf_table", "file")(value, name)
    if any(c in _UNSAFE_IN_XLA_FLAGS for c in path):
        raise ConfigError(
            "perf_table",
            f"{_shown(name, value)} is not valid: XLA_FLAGS cannot carry a path with spaces, "
            "quotes or backslashes; link or copy the table to a plain path",
        )
    # Not at module level: this module must not import the simulator (and the passes)
    # unless this setting is given.
    from xla_streams.simulate.measured import PerfTableError, check_xla_can_read, load_perf_table

    try:
        load_perf_table(path)
        check_xla_can_read(path)
    except PerfTableError as e:
        raise ConfigError("perf_table", f"{_shown(name, value)} is not valid: {e}") from None
    return path


def _check_perf_table(value: Any, name: str) -> None:
    if value is not None and not (isinstance(value, str) and os.path.isfile(value)):
        raise ConfigError(
            "perf_table", f"{_shown(name, value)} is not the path of a performance table"
        )


@dataclass(frozen=True)
class Setting:
    """One setting: its name (``XLA_STREAMS_<NAME>``, ``--xla_streams_<name>``,
    ``enable(<name>=)``), what it does, how a text or Python value is read,
    and how a value given to ``Config`` directly is checked."""

    name: str
    help: str
    parse: Callable[[Any, str], Any]
    check: Callable[[Any, str], None] | None = None


_POLICY = _choice(POLICIES)
_MODE = _choice(MODES)
_LOG = _choice(LOG_LEVELS)

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "collective_streams",
        f"turn the plugin on with K collective streams (1..{MAX_STREAMS})",
        _parse_streams,
        _check_streams,
    ),
    Setting(
        "policy",
        f"how a collective picks its stream: {', '.join(POLICIES)} (default {DEFAULT_POLICY})",
        *_POLICY,
    ),
    Setting(
        "mode",
        "native (default): XLA runs each annotated collective on its own communication "
        "stream; ffi: our custom calls run them",
        *_MODE,
    ),
    Setting(
        "pipeline",
        "an explicit pass pipeline, e.g. "
        "'find-async-pairs,assign-streams{streams=4},verify-streams,annotate-streams'",
        _parse_pipeline,
        _check_pipeline,
    ),
    Setting(
        "report_dir",
        "write <module>.<fingerprint>.json/.txt per compiled module with collectives, and "
        "index.json/index.txt, here",
        _parse_path("report_dir", "directory"),
    ),
    Setting(
        "report_html",
        f"also a Perfetto trace and an HTML timeline per report ({BOOL_VALUES})",
        _parse_bool,
        _check_bool,
    ),
    Setting(
        "strict",
        f"an internal error fails the compile instead of leaving the module unchanged "
        f"({BOOL_VALUES})",
        _parse_bool,
        _check_bool,
    ),
    Setting(
        "log",
        f"what the plugin prints: {', '.join(LOG_LEVELS)} (default info: the start-up line "
        "and, with reports on, one line per module)",
        *_LOG,
    ),
    Setting(
        "timeout_s",
        "ffi mode: a collective stuck this many seconds fails, naming it (default "
        f"{DEFAULT_TIMEOUT_S:g}, at most 7 days)",
        _parse_timeout,
        _check_timeout,
    ),
    Setting(
        "config",
        "a result of `xla-streams tune --json`: its XLA options, K and policy",
        _parse_path("config", "file"),
    ),
    Setting(
        "perf_table",
        "XLA's collective performance table (its collective_perf_table format, text or "
        "binary), checked at start-up: XLA's scheduler gets it as "
        "--xla_gpu_experimental_collective_perf_table_path (unless XLA_FLAGS sets that) and "
        "the HTML reports price collectives from it",
        _parse_perf_table,
        _check_perf_table,
    ),
    Setting(
        "ignore_max_connections",
        "keep K collective streams under CUDA_DEVICE_MAX_CONNECTIONS=1, which puts every CUDA "
        "stream on one hardware queue, where collectives on several streams can deadlock (by "
        f"default the plugin then keeps one; {BOOL_VALUES})",
        _parse_bool,
        _check_bool,
    ),
)
BY_NAME = {s.name: s for s in SETTINGS}


def _apply_tune_file(parsed: dict[str, Any], origin: Mapping[str, Source]) -> None:
    """Take K, policy and XLA options from a tune result; settings given beside it win."""
    path = parsed.get("config")
    if path is None:
        return
    name = spelled("config", origin["config"])
    try:
        best = load_tune_result(path).best
    except TuneError as e:  # it names the file and the field
        raise ConfigError("config", f"{name}: {e}") from None
    except Exception as e:  # RecursionError (deeply nested JSON), MemoryError, a bug
        raise ConfigError(
            "config", f"{name}: {path}: cannot read the tune result: {_reason(e)}"
        ) from None
    where = f"{name}: {path}: best."
    _check_streams(best.streams, f"{where}streams=")
    policy = BY_NAME["policy"].parse(best.policy, f"{where}policy=")
    parsed.setdefault("collective_streams", best.streams)
    parsed.setdefault("policy", policy)
    parsed["xla_options"] = _checked_xla_options(best.xla_flags, f"{where}xla_flags.")


# What a tune result's XLA option may look like before it goes into XLA_FLAGS: the
# tune file's own check (tuning.result) knows each option's type and range; this one
# only keeps anything that is not a single flag value out of XLA_FLAGS.
_OPTION_NAME = re.compile(r"xla_[a-z0-9_]+")
_OPTION_WORD = re.compile(r"[A-Za-z0-9_]+")


def _checked_xla_options(options: Mapping[str, object], where: str) -> dict[str, object]:
    """``options`` (name -> value) unless a name is not an XLA option name or a value
    is not a bool, an int or one word of ASCII letters, digits and '_'."""
    for option, value in options.items():
        if not (isinstance(option, str) and _OPTION_NAME.fullmatch(option)):
            raise ConfigError("config", f"{where}{option!r} is not an XLA option name")
        if isinstance(value, bool | int) or (
            isinstance(value, str) and _OPTION_WORD.fullmatch(value)
        ):
            continue
        raise ConfigError(
            "config",
            f"{where}{option}={value!r} is not valid: expected true, false, an integer or "
            "a word of ASCII letters, digits and '_'",
        )
    return dict(options)


def _reconcile_pipeline(parsed: dict[str, Any], origin: Mapping[str, Source]) -> None:
    """Check that an explicit pipeline agrees with the settings where it says them;
    fill collective_streams, policy and mode from it where it alone says them."""
    spec = parsed.get("pipeline")
    if spec is None:
        return
    name = spelled("pipeline", origin["pipeline"])
    for setting, option in (("collective_streams", "streams"), ("policy", "policy")):
        written = spec.written("assign-streams", option)
        if len(written) > 1:
            raise ConfigError("pipeline", f"{name}: its assign-streams passes disagree on {option}")
        if not written:
            continue
        value = BY_NAME[setting].parse(written.pop(), f"{name}: {option}=")
        if setting in parsed and parsed[setting] != value:
            raise ConfigError(
                "pipeline",
                f"{name} says {option}={value} but "
                f"{spelled(setting, origin[setting])}={parsed[setting]}; "
                "give one of them, or make them agree",
            )
        parsed[setting] = value
    lowers = spec.has("lower-to-ffi")
    annotates = spec.has("annotate-streams")
    mode = "ffi" if lowers else "native" if annotates else None
    if mode is not None and parsed.get("mode", mode) != mode:
        what = "lower-to-ffi" if lowers else "annotate-streams"
        raise ConfigError(
            "pipeline",
            f"{name} has {what}, which needs mode {mode}, but "
            f"{spelled('mode', origin['mode'])}={parsed['mode']}; drop one of them",
        )
    if mode is not None:
        parsed["mode"] = mode
    if "collective_streams" not in parsed:
        raise ConfigError(
            "pipeline",
            f"{name} has no assign-streams pass with streams=, so it does not say how many "
            f"collective streams the executable needs: also set "
            f"{spelled('collective_streams', origin['pipeline'])}",
        )


def _parse(setting: str, value: Any, name: str) -> Any:
    """``value`` of ``setting`` (spelled ``name``) as read by its parser; anything but a
    ConfigError the parser raises (a bug, RecursionError, MemoryError) becomes one
    naming the setting, so a bad value always stops the program the same way."""
    try:
        return BY_NAME[setting].parse(value, name)
    except ConfigError:
        raise
    except Exception as e:
        shown = _shown(name, value)
        if len(shown) > 200:
            shown = shown[:197] + "..."
        raise ConfigError(setting, f"{shown} cannot be read: {_reason(e)}") from None


def _reason(e: BaseException) -> str:
    """``RecursionError: the first line of its message``, at most 300 characters."""
    lines = str(e).strip().splitlines()
    reason = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
    return reason if len(reason) <= 300 else reason[:297] + "..."


def _shown(name: str, value: Any) -> str:
    """``XLA_STREAMS_POLICY='x'``, ``--xla_streams_policy=x`` or ``policy='x'``."""
    if name.startswith("--"):
        return f"{name}={value}"
    if name.endswith("="):
        return f"{name}{value!r}"
    if name.isupper():
        return f"{name}={str(value)!r}"
    return f"{name}={value!r}"


def _setting_of(name: str) -> str:
    bare = name.lstrip("-").rstrip("=").lower()
    for prefix in (FLAG_PREFIX, ENV_PREFIX.lower()):
        bare = bare.removeprefix(prefix)
    return bare


__all__ = [
    "BY_NAME",
    "MODES",
    "SETTINGS",
    "Config",
    "ConfigError",
    "Mode",
    "ignored_env",
    "spelled",
]
