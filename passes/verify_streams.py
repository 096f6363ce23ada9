"""verify-streams: check the stream assignment independently of how it was made.

Every pair is assigned exactly once; pairs that need a stream have one in
0..K-1 and sync/pipelined pairs have none; each done comes after its start;
and no two pairs in flight together that share two or more devices sit on
different streams (the deadlock rule).
"""

from __future__ import annotations

from dataclasses import dataclass

from xla_streams.collectives import AsyncPair, StreamAssignment
from xla_streams.pipeline import Compilation, Fact, ModulePass, VerificationError, register


@register
@dataclass(frozen=True)
class VerifyStreams(ModulePass):
    name = "verify-streams"
    requires = frozenset({Fact.ASYNC_PAIRS, Fact.STREAMS_ASSIGNED})
    ensures = frozenset({Fact.STREAMS_VERIFIED})

    def run(self, compilation: Compilation) -> None:
        assert compilation.assignment is not None
        verify_streams(compilation.pairs, compilation.assignment)


def verify_streams(
    pairs: tuple[AsyncPair, ...] | list[AsyncPair], assignment: StreamAssignment
) -> None:
    """Raise VerificationError naming the pair (or both pairs) that break an invariant."""
    seen: dict[str, AsyncPair] = {}
    for p in pairs:
        if p.start in seen:
            raise VerificationError(f"{_name(p)} appears twice")
        seen[p.start] = p
        if p.done_index <= p.start_index or p.done_time <= p.start_time:
            raise VerificationError(f"{_name(p)}: done is not after start")
        if p.start not in assignment.stream_of:
            raise VerificationError(f"{_name(p)} has no stream assignment")
        stream = assignment.stream_of[p.start]
        if p.needs_stream and (stream is None or not 0 <= stream < assignment.streams):
            raise VerificationError(
                f"{_name(p)} is on stream {stream}, outside 0..{assignment.streams - 1}"
            )
        if not p.needs_stream and stream is not None:
            why = "sync" if p.sync else "pipelined"
            raise VerificationError(f"{_name(p)} is {why} but was given stream {stream}")
    extra = set(assignment.stream_of) - set(seen)
    if extra:
        raise VerificationError(f"streams assigned to unknown pairs: {', '.join(sorted(extra))}")
    placed = [p for p in pairs if p.needs_stream]
    for i, p in enumerate(placed):
        for q in placed[i + 1 :]:
            p_stream, q_stream = assignment.stream_of[p.start], assignment.stream_of[q.start]
            if p.must_share_stream_with(q) and p_stream != q_stream:
                raise VerificationError(
                    f"deadlock rule broken: {_name(p)} on stream {p_stream} and {_name(q)} on "
                    f"stream {q_stream} are in flight together and share two or more devices"
                )


def _name(p: AsyncPair) -> str:
    return f"{p.kind} '%{p.start}' (computation '{p.computation}')"
