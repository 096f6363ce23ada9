"""assign-streams: give every pair on the communication lane one of K collective
streams, by the deadlock rule, the pins and a policy
(:mod:`xla_streams.streams.assignment` says how)."""

from __future__ import annotations

from dataclasses import dataclass

from xla_streams.collectives import DEFAULT_POLICY, DEFAULT_STREAMS, POLICY, STREAMS, Policy
from xla_streams.option import option
from xla_streams.passes.base import Compilation, Fact, ModulePass
from xla_streams.streams import RuleWorkExceeded, assign_streams


@dataclass(frozen=True)
class AssignStreams(ModulePass):
    name = "assign-streams"
    requires = frozenset({Fact.ASYNC_PAIRS})
    ensures = frozenset({Fact.STREAMS_ASSIGNED})

    streams: int = option(
        DEFAULT_STREAMS,
        STREAMS,
        "The number of collective streams K to spread the collectives over.",
    )
    policy: Policy = option(
        DEFAULT_POLICY, POLICY,
        "How a collective picks its stream: 'interval' takes the lowest stream free when it "
        "starts; 'round-robin' takes the next stream in turn.",
    )  # fmt: skip

    def run(self, compilation: Compilation) -> None:
        try:
            assignment = assign_streams(compilation.pairs, self.streams, self.policy)
        except RuleWorkExceeded as e:
            raise e.located(compilation.module) from None
        compilation.assignment = assignment
