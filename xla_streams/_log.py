"""The package's logger: ``xla_streams: message`` on standard error.

A plain :mod:`logging` logger, so that it works in every program (absl's logging
shows only warnings outside ``absl.app``) and costs nothing to import. Its level
comes from ``XLA_STREAMS_LOG`` (:func:`configure`): ``info``, the default, shows
the start-up line and, with reports on, one line per compiled module.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("xla_streams")


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """Ours, so that configure() adds it once."""


def configure(level: str) -> None:
    """Print our messages at ``level`` (``warning``, ``info``, ``debug``) and above."""
    if not any(isinstance(h, _Handler) for h in logger.handlers):
        handler = _Handler()
        handler.setFormatter(logging.Formatter("xla_streams: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level.upper())
