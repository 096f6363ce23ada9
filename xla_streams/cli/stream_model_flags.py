"""The flags that say how a module was compiled (a StreamModel), shared by several
``xla-streams`` commands: the options of the find-async-pairs pass, which reads them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xla_streams.collectives import StreamModel
from xla_streams.option import Option, options_of
from xla_streams.pipeline import pass_class


def stream_model_flags() -> list[Option[Any]]:
    """--overlap-limit and --sync-on-compute: how the module was compiled (StreamModel)."""
    declared = options_of(pass_class("find-async-pairs"))
    return [declared["overlap_limit"], declared["sync_on_compute"]]


def stream_model(flag: Callable[[str], Any]) -> StreamModel:
    """The StreamModel that the flags of :func:`stream_model_flags` describe."""
    return StreamModel(flag("overlap_limit"), flag("sync_on_compute"))
