"""xla_streams: run overlapping async collectives on several collective streams.

The JAX plugin turns on with ``XLA_STREAMS_COLLECTIVE_STREAMS=K`` in the
environment, or from Python::

    import xla_streams
    xla_streams.enable(collective_streams=4, report_dir="reports")  # before JAX starts
    with xla_streams.collective_streams(4): ...                      # just for a block
    xla_streams.disable()
    result = xla_streams.tune(build, devices=32, devices_per_host=8)  # find the settings
    # the same, with the options as one value:
    result = xla_streams.tune(build, options=xla_streams.TuneOptions(devices=32))

Programs built on ``absl.app`` can ``import xla_streams.plugin.flags`` for
``--xla_streams_collective_streams=4`` and the other settings. Importing this
package imports nothing else (PEP 562): the names below load on first use, so
the command line starts fast and JAX is imported only where it is needed.
"""

from __future__ import annotations

import importlib

# Not typing's: importing typing costs the command line a few milliseconds, and
# type checkers read any TYPE_CHECKING as theirs.
TYPE_CHECKING = False

# Public name -> the module that defines it.
_EXPORTS = {
    "__version__": "xla_streams._version",
    "Config": "xla_streams.plugin.settings",
    "ConfigError": "xla_streams.plugin.settings",
    "collective_streams": "xla_streams.plugin",
    "current": "xla_streams.plugin",
    "disable": "xla_streams.plugin",
    "enable": "xla_streams.plugin",
    "TuneOptions": "xla_streams.tuning.options",
    "tune": "xla_streams.tuning.driver",
    "tune_lowered": "xla_streams.tuning.driver",
    "tune_path": "xla_streams.tuning.driver",
}
__all__ = [
    "Config",
    "ConfigError",
    "TuneOptions",
    "collective_streams",
    "current",
    "disable",
    "enable",
    "tune",
    "tune_lowered",
    "tune_path",
]

if TYPE_CHECKING:
    from typing import Any

    from xla_streams._version import __version__ as __version__
    from xla_streams.plugin import collective_streams, current, disable, enable
    from xla_streams.plugin.settings import Config, ConfigError
    from xla_streams.tuning.driver import tune, tune_lowered, tune_path
    from xla_streams.tuning.options import TuneOptions


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'xla_streams' has no attribute '{name}'")
    return getattr(importlib.import_module(module), name)
