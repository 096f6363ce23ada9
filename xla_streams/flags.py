"""absl flags for the plugin: ``import xla_streams.flags`` in a program built on absl.app.

Defines ``--xla_streams_collective_streams``, ``--xla_streams_policy``,
``--xla_streams_mode``, ``--xla_streams_pipeline``, ``--xla_streams_report_dir``
and ``--xla_streams_strict``. When the command line is parsed and any of them is
given, the plugin is turned on with them, over the ``XLA_STREAMS_*`` environment
variables (a flag wins over its variable). A bad value stops the program at
parse time, as any bad absl flag does, with a message naming the flag and the
accepted values.
"""

from __future__ import annotations

from typing import Any

from absl import flags

from xla_streams.collectives import MAX_STREAMS, POLICIES
from xla_streams.config import (
    BOOL_VALUES,
    FLAG_PREFIX,
    MODES,
    SETTINGS,
    Config,
    ConfigError,
    spelled,
)

FLAG_NAMES = tuple(FLAG_PREFIX + s for s in SETTINGS)

# Strings, not typed flags, so that every bad value gets the same message as the
# environment variable would (absl's own messages do not list accepted values).
flags.DEFINE_string(
    FLAG_PREFIX + "collective_streams",
    None,
    f"Turn the xla_streams plugin on with this many collective streams (1..{MAX_STREAMS}).",
)
flags.DEFINE_string(
    FLAG_PREFIX + "policy", None, f"Stream assignment policy: {', '.join(POLICIES)}."
)
flags.DEFINE_string(FLAG_PREFIX + "mode", None, f"Plugin mode: {', '.join(MODES)}.")
flags.DEFINE_string(
    FLAG_PREFIX + "pipeline",
    None,
    "Explicit pass pipeline, e.g. "
    "'find-async-pairs,assign-streams{streams=4},verify-streams,annotate-streams'.",
)
flags.DEFINE_string(
    FLAG_PREFIX + "report_dir",
    None,
    "Write <module>.<fingerprint>.json/.txt assignment reports of every compiled module here.",
)
flags.DEFINE_string(
    FLAG_PREFIX + "report_html",
    None,
    f"Also write a Perfetto trace and an HTML timeline next to each report ({BOOL_VALUES}).",
)
flags.DEFINE_string(
    FLAG_PREFIX + "strict",
    None,
    f"Fail the compile on an internal error instead of leaving the module unchanged "
    f"({BOOL_VALUES}).",
)


def config_from_flags(
    values: dict[str, Any], environ: dict[str, str] | None = None
) -> Config | None:
    """The settings of the given flag values over the ``XLA_STREAMS_*`` environment."""
    import os

    environ = dict(os.environ) if environ is None else environ
    env_values = {s: environ.get(spelled(s, "env"), "").strip() or None for s in SETTINGS}
    flag_values = {s: values.get(FLAG_PREFIX + s) for s in SETTINGS}
    return Config.from_layers([(env_values, "env"), (flag_values, "flag")])


def _apply(values: dict[str, Any]) -> bool:
    if all(values.get(name) is None for name in FLAG_NAMES):
        return True  # no flag of ours given: the environment (if any) decides
    try:
        config = config_from_flags(values)
    except ConfigError as e:
        raise flags.ValidationError(str(e)) from None
    if config is None:
        names = ", ".join(f"--{n}" for n in FLAG_NAMES if values.get(n) is not None)
        raise flags.ValidationError(
            f"{names} given without --{FLAG_PREFIX}collective_streams: "
            "say how many collective streams to use"
        )
    from xla_streams import plugin

    try:
        plugin.enable_config(config, "absl flags")
    except ConfigError as e:
        raise flags.ValidationError(str(e)) from None
    return True


flags.register_multi_flags_validator(list(FLAG_NAMES), _apply)  # type: ignore[no-untyped-call]
