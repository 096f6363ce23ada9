"""The verification: the stream assignment checked independently of how it was made.

Every pair is assigned exactly once; pairs on the communication lane have a
stream in 0..K-1 (a sync one the stream XLA runs it on), the others none; each
done comes after its start. Then the deadlock rule
(:func:`~xla_streams.streams.rule.must_share_stream`): the send and the recv of a
channel on one stream, and, checked on what the runtime executes rather than on
the intervals find-async-pairs computed, the pairs in flight together: the program is
walked from ENTRY in schedule order, entering the callee of every control-flow
instruction at each of its calls, keeping the set of collectives in flight; at
each start, none in flight may share two or more devices with it on another
stream. Linear in the instructions executed; the rule's test indexes the groups
in flight by device (:class:`~xla_streams.streams.rule.InFlight`), its work bounded
by ``MAX_RULE_WORK``: past it the module is refused with an error at the collective.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

from xla_streams.collectives import SYNC_PAIR_STREAM
from xla_streams.hlo import Module
from xla_streams.hlo.attributes import CONTROL_FLOW_CALLEES, control_flow_callees
from xla_streams.streams.assignment import StreamAssignment
from xla_streams.streams.pairs import AsyncPair
from xla_streams.streams.rule import InFlight, RuleWorkExceeded, permute_halves

# Instructions walked at most; a module needing more is refused, not half-checked.
MAX_WALK = 20_000_000


class VerificationError(Exception):
    """An invariant of the stream assignment does not hold."""


def verify_streams(
    pairs: Sequence[AsyncPair], assignment: StreamAssignment, module: Module | None = None
) -> None:
    """Raise VerificationError naming the pair (or both pairs) that break an invariant.

    Without ``module`` the rule is checked on the pairs' own occurrences.
    """
    seen: dict[str, AsyncPair] = {}
    for p in pairs:
        if p.start in seen:
            raise VerificationError(f"{_name(p)} appears twice")
        seen[p.start] = p
        if p.done_index <= p.start_index or any(b <= a for a, b in p.occurrences):
            raise VerificationError(f"{_name(p)}: done is not after start")
        if p.start not in assignment.stream_of:
            raise VerificationError(f"{_name(p)} has no stream assignment")
        stream = assignment.stream_of[p.start]
        if p.needs_stream and (stream is None or not 0 <= stream < assignment.streams):
            raise VerificationError(
                f"{_name(p)} is on stream {stream}, outside 0..{assignment.streams - 1}"
            )
        if p.needs_stream and p.sync and stream != SYNC_PAIR_STREAM:
            raise VerificationError(
                f"{_name(p)} is sync, so XLA runs it on stream {SYNC_PAIR_STREAM}, "
                f"but it was given stream {stream}"
            )
        if not p.needs_stream and stream is not None:
            raise VerificationError(
                f"{_name(p)} runs on the {p.lane} lane but was given stream {stream}"
            )
    extra = set(assignment.stream_of) - set(seen)
    if extra:
        raise VerificationError(f"streams assigned to unknown pairs: {', '.join(sorted(extra))}")
    placed = {p.start: p for p in pairs if p.needs_stream}
    # The sends and the recvs of each channel, by stream: one send and one recv on
    # different streams break the rule (linear, however many share a channel).
    for halves in permute_halves(placed.values()):
        on: dict[str, dict[int | None, AsyncPair]] = {"send": {}, "recv": {}}
        for p in halves:
            on[p.kind].setdefault(assignment.stream_of[p.start], p)
        for stream, p in on["send"].items():
            for other, q in on["recv"].items():
                if other != stream:
                    raise VerificationError(
                        f"{_name(p)} and {_name(q)} are the send and recv of one permute, but "
                        f"on streams {stream} and {other}"
                    )
    try:
        if module is None:
            _check_occurrences(list(placed.values()), assignment)
        else:
            _walk(module, placed, assignment)
    except RuleWorkExceeded as e:
        if module is None:
            raise VerificationError(str(e)) from None
        raise e.located(module) from None


class _Rule:
    """The deadlock rule over the pairs in flight: at each start, none in flight may
    share two or more devices with it on another stream (:class:`InFlight` finds the
    groupings that share; each keeps its holders in flight by stream)."""

    def __init__(self, assignment: StreamAssignment) -> None:
        self.stream_of = assignment.stream_of
        self.flight = InFlight()
        # grouping -> stream -> start name -> (pair, occurrences in flight)
        self.holders: dict[int, dict[int | None, dict[str, list[Any]]]] = {}
        self.count: dict[str, int] = {}  # start name -> occurrences in flight

    def start(self, p: AsyncPair) -> None:
        stream = self.stream_of[p.start]
        for grouping in self.flight.conflicts(p):
            for other, held in self.holders[grouping].items():
                if other != stream:
                    q = next(iter(held.values()))[0]
                    raise VerificationError(
                        f"deadlock rule broken: {_name(q)} on stream {other} and {_name(p)} on "
                        f"stream {stream} are in flight together and share two or more devices"
                    )
        self.count[p.start] = self.count.get(p.start, 0) + 1
        begun = self.flight.begin(p)
        if begun is not None:
            held = self.holders.setdefault(begun, {}).setdefault(stream, {})
            held.setdefault(p.start, [p, 0])[1] += 1

    def done(self, p: AsyncPair) -> None:
        if not self.count.get(p.start):
            return  # a done met without its start (its computation entered mid-pair)
        self.count[p.start] -= 1
        grouping = self.flight.finish(p)
        if grouping is not None:
            by_stream = self.holders[grouping]
            stream = self.stream_of[p.start]
            entry = by_stream[stream][p.start]
            entry[1] -= 1
            if not entry[1]:
                del by_stream[stream][p.start]
                if not by_stream[stream]:
                    del by_stream[stream]


def _walk(module: Module, placed: dict[str, AsyncPair], assignment: StreamAssignment) -> None:
    done_of = {p.done: p for p in placed.values()}
    budget = MAX_WALK
    reached: set[str] = set()
    roots = [module.entry] + [c for c in module.computations if not c.is_entry]
    for root in roots:
        if root.name in reached:
            continue
        rule = _Rule(assignment)
        # A stack of (computation, next instruction index) frames.
        stack = [(root, 0)]
        reached.add(root.name)
        while stack:
            comp, i = stack.pop()
            if i >= len(comp.instructions):
                continue
            budget -= 1
            if budget < 0:
                raise VerificationError(
                    f"the program executes more than {MAX_WALK} instructions; too large to verify"
                )
            inst = comp.instructions[i]
            stack.append((comp, i + 1))
            if inst.name in placed and comp.name == placed[inst.name].computation:
                rule.start(placed[inst.name])
            elif inst.name in done_of and comp.name == done_of[inst.name].computation:
                rule.done(done_of[inst.name])
            if inst.opcode not in CONTROL_FLOW_CALLEES:
                continue  # most instructions: they call nothing
            called = [
                callee
                for _, name in control_flow_callees(inst)
                if (callee := module.computation(name)) is not None
            ]
            for callee in reversed(called):  # the first runs first
                reached.add(callee.name)
                stack.append((callee, 0))


def _check_occurrences(pairs: list[AsyncPair], assignment: StreamAssignment) -> None:
    rule = _Rule(assignment)
    ending: list[tuple[int, int]] = []  # (done, pair index), a heap
    for a, b, i in sorted((a, b, i) for i, p in enumerate(pairs) for a, b in p.occurrences):
        while ending and ending[0][0] <= a:
            rule.done(pairs[heapq.heappop(ending)[1]])
        rule.start(pairs[i])
        heapq.heappush(ending, (b, i))


def _name(p: AsyncPair) -> str:
    return f"{p.kind} '%{p.start}' (computation '{p.computation}')"
