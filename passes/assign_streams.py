"""assign-streams: give every pair on the communication lane one of K collective
streams, by the deadlock rule, the pins and a policy
(:mod:`xla_streams.streams.assignment` says how)."""

from __future__ import annotations

from dataclasses import dataclass

from xla_streams.collectives import DEFAULT_POLICY, DEFAULT_STREAMS, Policy, check_streams
from xla_streams.passes.base import Compilation, Fact, ModulePass
from xla_streams.streams import RuleWorkExceeded, assign_streams


@dataclass(frozen=True)
class AssignStreams(ModulePass):
    name = "assign-streams"
    requires = frozenset({Fact.ASYNC_PAIRS})
    ensures = frozenset({Fact.STREAMS_ASSIGNED})

    streams: int = DEFAULT_STREAMS
    policy: Policy = DEFAULT_POLICY

    def __post_init__(self) -> None:
        check_streams(self.streams)

    def run(self, compilation: Compilation) -> None:
        try:
            assignment = assign_streams(compilation.pairs, self.streams, self.policy)
        except RuleWorkExceeded as e:
            raise e.located(compilation.module) from None
        compilation.assignment = assignment
