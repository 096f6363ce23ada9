"""find-async-pairs: every async collective start/done pair of the module, and when
each is in flight (:func:`xla_streams.streams.find_async_pairs`)."""

from __future__ import annotations

from dataclasses import dataclass

from xla_streams.collectives import StreamModel
from xla_streams.option import boolean, integer, option
from xla_streams.passes.base import Compilation, Fact, ModulePass
from xla_streams.streams.pairs import check_scheduled, find_async_pairs
from xla_streams.xla_options import OVERLAP_LIMIT


@dataclass(frozen=True)
class FindAsyncPairs(ModulePass):
    """Options say how the module was compiled and who runs its collectives (see
    :class:`StreamModel`)."""

    name = "find-async-pairs"
    ensures = frozenset({Fact.ASYNC_PAIRS})

    overlap_limit: int = option(
        0, integer(0),
        f"The {OVERLAP_LIMIT} the module was compiled with. It decides where XLA 0.10's sync "
        "collectives run: 1, the compute stream; above 1, communication stream 0; 0 (unknown) "
        "assumes the latter, the safe assumption.",
    )  # fmt: skip
    sync_on_compute: bool = option(
        False, boolean(),
        "The module comes from jax >= 0.11, which runs sync collectives on the compute stream "
        "at every overlap limit.",
    )  # fmt: skip
    ffi: bool = option(False, boolean(), "Our runtime runs the collectives, not XLA.")

    def run(self, compilation: Compilation) -> None:
        check_scheduled(compilation.module)
        model = StreamModel(self.overlap_limit, self.sync_on_compute, self.ffi)
        compilation.pairs = tuple(find_async_pairs(compilation.module, model))
