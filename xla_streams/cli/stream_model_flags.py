"""Command-line flags shared by several ``xla-streams`` commands (one definition each)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xla_streams.cli import flags
from xla_streams.collectives import StreamModel
from xla_streams.xla_options import OVERLAP_LIMIT


def stream_model_flags() -> list[flags.Flag]:
    """--overlap-limit and --sync-on-compute: how the module was compiled (StreamModel)."""
    return [
        flags.integer(
            "overlap-limit", None,
            f"The {OVERLAP_LIMIT} the module was compiled with. It decides where XLA 0.10's "
            "sync collectives run: 1, the compute stream; above 1 (and by default, the safe "
            "assumption), communication stream 0.",
            lower=1,
        ),
        flags.boolean(
            "sync-on-compute", False,
            "The module comes from jax >= 0.11, which runs sync collectives on the compute "
            "stream at every overlap limit.",
        ),
    ]  # fmt: skip


def stream_model(flag: Callable[[str], Any]) -> StreamModel:
    """The StreamModel that the flags of :func:`stream_model_flags` describe."""
    return StreamModel(flag("overlap-limit") or 0, flag("sync-on-compute"))
