"""The plugin's settings, in one place: a frozen, validated :class:`Config`.

A Config comes from one of three sources, each with its own spelling of a
setting, so that an error names what the user actually wrote:

===================  ==================================  =================================
setting              environment variable                absl flag / ``enable()`` keyword
===================  ==================================  =================================
collective_streams   ``XLA_STREAMS_COLLECTIVE_STREAMS``  ``--xla_streams_collective_streams``
policy               ``XLA_STREAMS_POLICY``              ``--xla_streams_policy``
mode                 ``XLA_STREAMS_MODE``                ``--xla_streams_mode``
pipeline             ``XLA_STREAMS_PIPELINE``            ``--xla_streams_pipeline``
report_dir           ``XLA_STREAMS_REPORT_DIR``          ``--xla_streams_report_dir``
report_html          ``XLA_STREAMS_REPORT_HTML``         ``--xla_streams_report_html``
strict               ``XLA_STREAMS_STRICT``              ``--xla_streams_strict``
===================  ==================================  =================================

The plugin is on when ``collective_streams`` or ``pipeline`` is given. An
explicit pipeline must agree with ``collective_streams``/``policy`` where it
says them (``assign-streams{streams=4,policy=interval}``). This module imports
neither JAX nor the passes until a pipeline spec has to be checked.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from xla_streams.collectives import MAX_STREAMS, POLICIES, Policy

# native: XLA runs each annotated collective on its own communication_stream[k].
# ffi: our custom calls run them (CUDA streams + NCCL, or host worker threads).
Mode = Literal["native", "ffi"]
MODES: tuple[Mode, ...] = ("native", "ffi")
DEFAULT_POLICY: Policy = "interval"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
BOOL_VALUES = ", ".join(v for pair in zip(_TRUE, _FALSE, strict=True) for v in pair)

ENV_PREFIX = "XLA_STREAMS_"
FLAG_PREFIX = "xla_streams_"
SETTINGS = (
    "collective_streams", "policy", "mode", "pipeline", "report_dir", "report_html", "strict",
)  # fmt: skip
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
    pipeline: str | None = None
    report_dir: str | None = None
    report_html: bool = False  # also a Perfetto trace and an HTML timeline per report
    strict: bool = False

    def __post_init__(self) -> None:
        # Direct construction gets the same checks as the builders, named by keyword.
        _check_streams(self.collective_streams, "collective_streams=")
        _check_choice(self.policy, POLICIES, "policy=")
        _check_mode(self.mode, "mode=")
        for setting in ("strict", "report_html"):
            value = getattr(self, setting)
            if not isinstance(value, bool):
                raise ConfigError(
                    setting, f"{setting}={value!r} is not valid: expected True or False"
                )
        if self.report_html and self.report_dir is None:
            raise ConfigError("report_html", "report_html needs report_dir: where to write")
        if self.report_dir is not None and not isinstance(self.report_dir, str):
            raise ConfigError("report_dir", f"report_dir={self.report_dir!r} is not a path")

    # -- what the plugin runs -----------------------------------------------------

    def pipeline_spec(self, on_cpu: bool = False) -> str:
        """The pass pipeline the hook runs on every compiled module of a platform.

        ffi mode lowers to the host runtime on CPU (after splitting XLA:CPU's
        synchronous collectives) and to the CUDA runtime elsewhere; the CUDA
        spec keeps a ``{devices}`` placeholder that each module's device
        assignment fills in.
        """
        if self.pipeline is not None:
            return self.pipeline
        if self.mode == "ffi":
            from xla_streams.runtime.hook import pipeline_spec

            if on_cpu:
                return pipeline_spec("host", self.collective_streams, self.policy)
            return pipeline_spec("cuda", self.collective_streams, self.policy, "{devices}")
        return (
            f"find-async-pairs,assign-streams{{streams={self.collective_streams},"
            f"policy={self.policy}}},verify-streams,annotate-streams"
        )

    def describe(self) -> str:
        """One line for logs."""
        parts = [
            f"{self.collective_streams} collective streams",
            f"policy {self.policy}",
            f"mode {self.mode}",
        ]
        if self.pipeline is not None:
            parts.append(f"pipeline '{self.pipeline}'")
        if self.report_dir is not None:
            parts.append(f"reports in {self.report_dir}")
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
        raw = {s: environ.get(spelled(s, "env"), "").strip() for s in SETTINGS}
        return cls.from_values({s: v for s, v in raw.items() if v}, "env")

    @classmethod
    def from_values(cls, values: Mapping[str, Any], source: Source) -> Config | None:
        """Settings given as text (env, flags) or Python values (keywords).

        Missing or None values are unset; None is returned when neither
        ``collective_streams`` nor ``pipeline`` is set (the plugin stays off).
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
            unknown = set(values) - set(SETTINGS)
            if unknown:
                name = sorted(unknown)[0]
                raise ConfigError(
                    name, f"unknown setting '{name}'; settings: {', '.join(SETTINGS)}"
                )
            for setting, value in values.items():
                if value is None:
                    continue
                parsed[setting] = _PARSERS[setting](value, spelled(setting, source))
                origin[setting] = source
        if "collective_streams" not in parsed and "pipeline" not in parsed:
            return None
        _reconcile_pipeline(parsed, origin)
        return cls(**parsed)

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)


def ignored_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """``XLA_STREAMS_*`` variables that are set while the plugin is off (for a warning)."""
    environ = os.environ if environ is None else environ
    return [
        spelled(s, "env")
        for s in SETTINGS
        if s not in ("collective_streams", "pipeline")
        and environ.get(spelled(s, "env"), "").strip()
    ]


# -- parsing each setting ---------------------------------------------------------------


def _parse_streams(value: Any, name: str) -> int:
    if isinstance(value, str):
        text = value.strip()
        try:
            number = int(text, 10)
        except ValueError:
            raise ConfigError(
                "collective_streams",
                f"{_shown(name, value)} is not valid: expected an integer from 1 to {MAX_STREAMS}",
            ) from None
        value = number
    _check_streams(value, name)
    return int(value)


def _check_streams(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_STREAMS:
        raise ConfigError(
            "collective_streams",
            f"{_shown(name, value)} is not valid: expected an integer from 1 to {MAX_STREAMS}",
        )


def _parse_policy(value: Any, name: str) -> Policy:
    text = value.strip() if isinstance(value, str) else value
    _check_choice(text, POLICIES, name)
    return cast(Policy, text)


def _check_choice(value: Any, accepted: tuple[str, ...], name: str) -> None:
    if value not in accepted:
        setting = _setting_of(name)
        raise ConfigError(
            setting, f"{_shown(name, value)} is not valid; accepted values: {', '.join(accepted)}"
        )


def _parse_mode(value: Any, name: str) -> Mode:
    text = value.strip().lower() if isinstance(value, str) else value
    _check_mode(text, name)
    return cast(Mode, text)


def _check_mode(value: Any, name: str) -> None:
    _check_choice(value, MODES, name)


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


def _parse_report_dir(value: Any, name: str) -> str:
    if not isinstance(value, str | os.PathLike):
        raise ConfigError("report_dir", f"{_shown(name, value)} is not a path")
    path = os.path.abspath(os.path.expanduser(os.fspath(value)))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError("report_dir", f"{_shown(name, value)} is not valid: not a directory")
    return path


def _parse_pipeline(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ConfigError("pipeline", f"{_shown(name, value)} is not a pipeline spec")
    from xla_streams.pipeline import PipelineError, parse_pipeline

    try:
        parse_pipeline(value)
    except PipelineError as e:
        raise ConfigError("pipeline", f"{_shown(name, value)} is not valid: {e}") from None
    return value.strip()


_PARSERS: dict[str, Callable[[Any, str], Any]] = {
    "collective_streams": _parse_streams,
    "policy": _parse_policy,
    "mode": _parse_mode,
    "pipeline": _parse_pipeline,
    "report_dir": _parse_report_dir,
    "report_html": _parse_bool,
    "strict": _parse_bool,
}


def _reconcile_pipeline(parsed: dict[str, Any], origin: Mapping[str, Source]) -> None:
    """Fill collective_streams/policy from an explicit pipeline, or check they agree."""
    spec = parsed.get("pipeline")
    if spec is None:
        return
    from xla_streams.pipeline import parse_pipeline

    assigns = [p for p in parse_pipeline(spec) if p.name == "assign-streams"]
    name = spelled("pipeline", origin["pipeline"])
    for setting, option in (("collective_streams", "streams"), ("policy", "policy")):
        values = {getattr(p, option) for p in assigns}
        if len(values) > 1:
            raise ConfigError("pipeline", f"{name}: its assign-streams passes disagree on {option}")
        if not values:
            continue
        (value,) = values
        if setting in parsed and parsed[setting] != value:
            raise ConfigError(
                "pipeline",
                f"{name} says {option}={value} but "
                f"{spelled(setting, origin[setting])}={parsed[setting]}; "
                "give one of them, or make them agree",
            )
        parsed[setting] = value
    if "collective_streams" not in parsed:
        raise ConfigError(
            "pipeline",
            f"{name} has no assign-streams pass, so it does not say how many collective "
            "streams the executable needs: also set "
            f"{spelled('collective_streams', origin['pipeline'])}",
        )


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
