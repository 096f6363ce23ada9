"""verify-streams: check the stream assignment independently of how it was made
(:mod:`xla_streams.streams.verify` says what it checks); VerificationError where an
invariant does not hold."""

from __future__ import annotations

from dataclasses import dataclass

from xla_streams.passes.base import Compilation, Fact, ModulePass
from xla_streams.streams import verify_streams


@dataclass(frozen=True)
class VerifyStreams(ModulePass):
    name = "verify-streams"
    requires = frozenset({Fact.ASYNC_PAIRS, Fact.STREAMS_ASSIGNED})
    ensures = frozenset({Fact.STREAMS_VERIFIED})

    def run(self, compilation: Compilation) -> None:
        assert compilation.assignment is not None
        verify_streams(compilation.pairs, compilation.assignment, compilation.module)
