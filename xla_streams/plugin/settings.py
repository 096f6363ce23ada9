"""The plugin's settings: a frozen, validated :class:`Config`, read from the settings
of :mod:`xla_streams.environment`, the table of every variable.

A Config comes from one of three sources, each with its own spelling of a
setting, so that an error names what the user actually wrote: the environment
(``XLA_STREAMS_POLICY``), absl flags (``--xla_streams_policy``) or keywords of
:func:`xla_streams.enable` (``policy=``). Each value is read by its setting's
declaration (its reader: type and range); here the values become what the plugin
uses: a pipeline spec is parsed, a tune result loaded, a performance table checked.

The plugin is on when ``collective_streams``, ``pipeline`` or ``config`` (a
``xla-streams tune`` result) is given. An explicit pipeline must agree with
``collective_streams``/``policy``/``mode`` where it says them, and options it
does not write take their values from them. An ``XLA_STREAMS_*`` variable that is
not in the table stops the program when the plugin is on, as a bad value does: it is
most likely a misspelled setting, and the program would run with other settings
than the user asked for (:func:`ignored_env` names it for a warning while the
plugin is off). This module imports neither JAX nor the passes until a pipeline
spec or a tune file has to be read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from xla_streams.collectives import DEFAULT_POLICY, Policy
from xla_streams.environment import (
    DEFAULT_TIMEOUT_S,
    LOG_LEVELS,
    MODES,
    OTHER_VARIABLES,
    SETTINGS,
    SWITCHES,
    LogLevel,
    Mode,
    unknown,
)
from xla_streams.option import Option, OptionError, Source
from xla_streams.passes.base import PipelineError
from xla_streams.pipeline import PipelineSpec
from xla_streams.tuning.result import TuneError, load_tune_result

BY_NAME = {s.name: s for s in SETTINGS}


class ConfigError(ValueError):
    """A setting that cannot be used; the message names it as the user spelled it."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(message)
        self.setting = setting


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

    def __post_init__(self) -> None:
        # Direct construction gets the same checks as the builders, named by keyword.
        for setting in SETTINGS:
            value = getattr(self, setting.name)
            if setting.name == "pipeline":
                if value is not None and not isinstance(value, PipelineSpec):
                    raise ConfigError(
                        "pipeline", f"pipeline={value!r} is not a PipelineSpec: give the text "
                        "to enable()",
                    )  # fmt: skip
            elif value is not None or setting.name == "collective_streams":
                try:
                    object.__setattr__(self, setting.name, setting.check(value))
                except OptionError as e:
                    raise ConfigError(setting.name, str(e)) from None
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
    def from_env(
        cls, environ: Mapping[str, str] | None = None, flags: Mapping[str, Any] | None = None
    ) -> Config | None:
        """The settings of the ``XLA_STREAMS_*`` variables, and of absl's ``flags`` (by
        setting, over the variables); None when the plugin is off.

        Empty variables count as unset. Raises ConfigError naming the variable: a bad
        value of any variable of the table (the runtime's too, read later), or, with the
        plugin on, a variable that is not in the table.
        """
        environ = os.environ if environ is None else environ
        config = cls.from_layers([(env_values(environ), "env"), (flags or {}, "flag")])
        for variable in OTHER_VARIABLES:  # read later, where used: a bad value stops us now
            try:
                variable.from_env(environ)
            except OptionError as e:
                raise ConfigError(variable.name, str(e)) from None
        misspelled = unknown(environ)
        if config is not None and misspelled:
            name, message = next(iter(misspelled.items()))
            raise ConfigError(name, message)
        return config

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
                parsed[setting] = _read(BY_NAME[setting], value, source)
                origin[setting] = source
        if not SWITCHES & set(parsed):
            return None
        _apply_tune_file(parsed, origin)
        _reconcile_pipeline(parsed, origin)
        return cls(**parsed)


def env_values(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings the ``XLA_STREAMS_*`` variables give, as text, by name (empty: unset)."""
    environ = os.environ if environ is None else environ
    return {s.name: value for s in SETTINGS if (value := environ.get(s.env or "", "").strip())}


def ignored_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """``XLA_STREAMS_*`` settings that are set while the plugin is off (for a warning)."""
    given = env_values(environ)
    return [s.env or "" for s in SETTINGS if s.name in given and s.name not in SWITCHES]


# -- what a value becomes -----------------------------------------------------------------


def _pipeline(text: str, shown: str) -> PipelineSpec:
    try:
        return PipelineSpec.parse(text)
    except PipelineError as e:
        raise ConfigError("pipeline", f"{shown} is not valid: {e}") from None


# What XLA_FLAGS cannot carry in a path: it splits its value at whitespace, and the
# plugin reads it back with shlex.
_UNSAFE_IN_XLA_FLAGS = frozenset(" \t\n\r\v\f'\"\\")


def _perf_table(path: str, shown: str) -> str:
    """An existing file (the setting's reader says so) that parses as XLA's collective
    performance table (text or binary) and that XLA can read, as an absolute path
    that XLA_FLAGS can carry."""
    if any(c in _UNSAFE_IN_XLA_FLAGS for c in path):
        raise ConfigError(
            "perf_table",
            f"{shown} is not valid: XLA_FLAGS cannot carry a path with spaces, "
            "quotes or backslashes; link or copy the table to a plain path",
        )
    # Not at module level: this module must not import the simulator (and the passes)
    # unless this setting is given.
    from xla_streams.simulate.measured import PerfTableError, check_xla_can_read, load_perf_table

    try:
        load_perf_table(path)
        check_xla_can_read(path)
    except PerfTableError as e:
        raise ConfigError("perf_table", f"{shown} is not valid: {e}") from None
    return path


# The settings whose value, once read, becomes more than the text: (value, how the user
# wrote it) -> what the Config holds.
_BECOMES: dict[str, Callable[[Any, str], Any]] = {
    "pipeline": _pipeline,
    "perf_table": _perf_table,
}


def _read(setting: Option[Any], value: Any, source: Source) -> Any:
    """``value`` of ``setting`` as ``source`` gives it (text; a Python value from a
    keyword), as the Config holds it. A value it does not take is a ConfigError naming
    it; so is anything else that goes wrong (a bug, RecursionError, MemoryError), so
    that a bad value always stops the program the same way."""
    if value is None:
        return None
    try:
        if setting.name == "pipeline" and isinstance(value, PipelineSpec):
            return value
        read = setting.check(value) if source == "keyword" else setting.read(value, source)
        becomes = _BECOMES.get(setting.name)
        return read if becomes is None else becomes(read, setting.shown(value, source))
    except ConfigError:
        raise
    except OptionError as e:
        raise ConfigError(setting.name, str(e)) from None
    except Exception as e:
        shown = setting.shown(value, source)
        if len(shown) > 200:
            shown = shown[:197] + "..."
        raise ConfigError(setting.name, f"{shown} cannot be read: {_reason(e)}") from None


def _apply_tune_file(parsed: dict[str, Any], origin: Mapping[str, Source]) -> None:
    """Take K, policy and XLA options from a tune result; settings given beside it win."""
    path = parsed.get("config")
    if path is None:
        return
    name = BY_NAME["config"].spelled(origin["config"])
    try:
        best = load_tune_result(path).best
    except TuneError as e:  # it names the file and the field
        raise ConfigError("config", f"{name}: {e}") from None
    except Exception as e:  # RecursionError (deeply nested JSON), MemoryError, a bug
        raise ConfigError(
            "config", f"{name}: {path}: cannot read the tune result: {_reason(e)}"
        ) from None
    where = f"{name}: {path}: best."
    try:
        streams = BY_NAME["collective_streams"].check(best.streams, f"{where}streams")
        policy = BY_NAME["policy"].check(best.policy, f"{where}policy")
    except OptionError as e:
        raise ConfigError("config", str(e)) from None
    parsed.setdefault("collective_streams", streams)
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
    name = BY_NAME["pipeline"].spelled(origin["pipeline"])
    for setting, option in (("collective_streams", "streams"), ("policy", "policy")):
        written = spec.written("assign-streams", option)  # read by the pass's own options
        if len(written) > 1:
            raise ConfigError("pipeline", f"{name}: its assign-streams passes disagree on {option}")
        if not written:
            continue
        value = written.pop()
        if setting in parsed and parsed[setting] != value:
            raise ConfigError(
                "pipeline",
                f"{name} says {option}={value} but "
                f"{BY_NAME[setting].spelled(origin[setting])}={parsed[setting]}; "
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
            f"{BY_NAME['mode'].spelled(origin['mode'])}={parsed['mode']}; drop one of them",
        )
    if mode is not None:
        parsed["mode"] = mode
    if "collective_streams" not in parsed:
        raise ConfigError(
            "pipeline",
            f"{name} has no assign-streams pass with streams=, so it does not say how many "
            f"collective streams the executable needs: also set "
            f"{BY_NAME['collective_streams'].spelled(origin['pipeline'])}",
        )


def _reason(e: BaseException) -> str:
    """``RecursionError: the first line of its message``, at most 300 characters."""
    lines = str(e).strip().splitlines()
    reason = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
    return reason if len(reason) <= 300 else reason[:297] + "..."


__all__ = [
    "BY_NAME",
    "LOG_LEVELS",
    "MODES",
    "SETTINGS",
    "Config",
    "ConfigError",
    "LogLevel",
    "Mode",
    "env_values",
    "ignored_env",
]
