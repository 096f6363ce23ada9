"""xla_streams: run overlapping async collectives on several collective streams.

The JAX plugin turns on with ``XLA_STREAMS_COLLECTIVE_STREAMS=K`` in the
environment, or from Python::

    import xla_streams
    xla_streams.enable(collective_streams=4, report_dir="reports")  # before JAX starts
    with xla_streams.collective_streams(4): ...                      # just for a block
    xla_streams.disable()

Programs built on ``absl.app`` can ``import xla_streams.flags`` for
``--xla_streams_collective_streams=4`` and the other settings. Importing this
package does not import JAX.
"""

from xla_streams.config import Config, ConfigError
from xla_streams.plugin import collective_streams, current, disable, enable

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "collective_streams", "current", "disable", "enable"]
