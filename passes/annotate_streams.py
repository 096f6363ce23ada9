"""annotate-streams: write each pair's stream into its start and done as the
frontend attribute ``_xla_stream_annotation="k"``, which XLA:GPU honours by
running the collective on ``communication_stream[k]``.

Existing frontend attributes are kept; every other byte of the module stays.
"""

from __future__ import annotations

from dataclasses import dataclass

from xla_streams.hlo import Instruction
from xla_streams.hlo.attributes import decode, format_frontend_attributes, parse_frontend_attributes
from xla_streams.pipeline import Compilation, Fact, ModulePass, register

STREAM_ATTRIBUTE = "_xla_stream_annotation"


@register
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
            stream = assignment.stream_of[pair.start]
            if stream is None:
                continue
            comp = module.computation(pair.computation)
            assert comp is not None
            for name in (pair.start, pair.done):
                inst = comp.get(name)
                assert inst is not None
                set_frontend_attribute(inst, STREAM_ATTRIBUTE, str(stream))


def set_frontend_attribute(inst: Instruction, key: str, value: str) -> None:
    attributes = decode(inst, "frontend_attributes", parse_frontend_attributes) or {}
    if attributes.get(key) == value:
        return
    attributes[key] = value
    inst.set_attribute("frontend_attributes", format_frontend_attributes(attributes))
