"""annotate-streams: write each pair's stream into its start and done as the
frontend attribute ``_xla_stream_annotation="k"``, which XLA:GPU honours by
running the collective on ``communication_stream[k]``.

Sync pairs are left as they are: XLA runs them where the stream model says
whatever their annotation, except that an annotation of the module naming a
stream >= K is rewritten to 0, so no stream >= K is ever emitted. Existing
frontend attributes are kept; every other byte of the module stays.
"""

from __future__ import annotations

from dataclasses import dataclass

from xla_streams.collectives import STREAM_ATTRIBUTE
from xla_streams.passes.base import Compilation, Fact, ModulePass

__all__ = ["STREAM_ATTRIBUTE", "AnnotateStreams"]


@dataclass(frozen=True)
class AnnotateStreams(ModulePass):
    name = "annotate-streams"
    requires = frozenset({Fact.ASYNC_PAIRS, Fact.STREAMS_ASSIGNED})
    ensures = frozenset({Fact.STREAMS_ANNOTATED})

    def run(self, compilation: Compilation) -> None:
        assignment = compilation.assignment
        assert assignment is not None
        module = compilation.module
        for pair in compilation.pairs:
            stream = assignment.stream_of[pair.key]
            if stream is None or pair.sync:
                stale = pair.annotation is not None and pair.annotation >= assignment.streams
                if not stale:
                    continue
                stream = 0
            comp = module.computation(pair.computation)
            assert comp is not None
            for name in (pair.start, pair.done):
                inst = comp.get(name)
                assert inst is not None
                inst.set_frontend_attribute(STREAM_ATTRIBUTE, str(stream))
