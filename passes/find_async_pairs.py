"""find-async-pairs: every async collective start/done pair of the module, and when
each is in flight (:func:`xla_streams.streams.find_async_pairs`)."""

from __future__ import annotations

from dataclasses import dataclass

from xla_streams.collectives import StreamModel
from xla_streams.passes.base import Compilation, Fact, ModulePass
from xla_streams.streams.pairs import check_scheduled, find_async_pairs


@dataclass(frozen=True)
class FindAsyncPairs(ModulePass):
    """Options say how the module was compiled and who runs its collectives (see
    :class:`StreamModel`): ``overlap_limit`` (0: unknown), ``sync_on_compute``
    (jax >= 0.11), ``ffi`` (our runtime, not XLA)."""

    name = "find-async-pairs"
    ensures = frozenset({Fact.ASYNC_PAIRS})

    overlap_limit: int = 0
    sync_on_compute: bool = False
    ffi: bool = False

    def __post_init__(self) -> None:
        if self.overlap_limit < 0:
            raise ValueError(f"overlap_limit must be 0 (unknown) or more, not {self.overlap_limit}")

    def run(self, compilation: Compilation) -> None:
        check_scheduled(compilation.module)
        model = StreamModel(self.overlap_limit, self.sync_on_compute, self.ffi)
        compilation.pairs = tuple(find_async_pairs(compilation.module, model))
