"""absl flags for the plugin: ``import xla_streams.plugin.flags`` in a program built on absl.app.

Defines ``--xla_streams_<setting>`` for every setting of
:data:`xla_streams.plugin.settings.SETTINGS` (``--xla_streams_collective_streams``,
``--xla_streams_policy``, ...). When the
command line is parsed and any of them is given, the plugin is turned on with
them, over the ``XLA_STREAMS_*`` environment variables (a flag wins over its
variable). A bad value stops the program at parse time, as any bad absl flag
does, with a message naming the flag and the accepted values.
"""

from __future__ import annotations

from typing import Any

from absl import flags

from xla_streams import plugin
from xla_streams.environment import FLAG_PREFIX
from xla_streams.plugin.settings import SETTINGS, Config, ConfigError

FLAG_NAMES = tuple(s.flag for s in SETTINGS)

# Strings, not typed flags, so that every bad value gets the same message as the
# environment variable would (absl's own messages do not list accepted values).
for _setting in SETTINGS:
    flags.DEFINE_string(_setting.flag, None, _setting.help_line())


def config_from_flags(
    values: dict[str, Any], environ: dict[str, str] | None = None
) -> Config | None:
    """The settings of the given flag values over the ``XLA_STREAMS_*`` environment."""
    return Config.from_env(environ, {s.name: values.get(s.flag) for s in SETTINGS})


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
    try:
        plugin.enable_config(config, "absl flags")
    except ConfigError as e:
        raise flags.ValidationError(str(e)) from None
    return True


flags.register_multi_flags_validator(list(FLAG_NAMES), _apply)  # type: ignore[no-untyped-call]
