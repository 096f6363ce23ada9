"""verify-streams: check the stream assignment independently of how it was made.

Every pair is assigned exactly once; pairs on the communication lane have a
stream in 0..K-1 (a sync one the stream XLA runs it on), the others none; each
done comes after its start. Then the deadlock rule, checked on what the runtime
executes rather than on the intervals find-async-pairs computed: the program is
walked from ENTRY in schedule order, entering the callee of every control-flow
instruction at each of its calls, keeping the set of collectives in flight; at
each start, none in flight may share two or more devices with it on another
stream. Linear in the instructions executed times the collectives in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

from xla_streams.collectives import SYNC_PAIR_STREAM, AsyncPair, StreamAssignment
from xla_streams.hlo import Module
from xla_streams.passes.base import Compilation, Fact, ModulePass, VerificationError

# Control-flow instructions and the attributes naming what they run, in the order
# they run it (a while's condition before its body; one branch of a conditional).
_RUNS = {
    "while": ("condition", "body"),
    "conditional": ("branch_computations", "true_computation", "false_computation"),
    "call": ("to_apply",),
}
# Instructions walked at most; a module needing more is refused, not half-checked.
MAX_WALK = 20_000_000


@dataclass(frozen=True)
class VerifyStreams(ModulePass):
    name = "verify-streams"
    requires = frozenset({Fact.ASYNC_PAIRS, Fact.STREAMS_ASSIGNED})
    ensures = frozenset({Fact.STREAMS_VERIFIED})

    def run(self, compilation: Compilation) -> None:
        assert compilation.assignment is not None
        verify_streams(compilation.pairs, compilation.assignment, compilation.module)


def verify_streams(
    pairs: tuple[AsyncPair, ...] | list[AsyncPair],
    assignment: StreamAssignment,
    module: Module | None = None,
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
    by_channel: dict[int, list[AsyncPair]] = {}
    for p in placed.values():
        if p.channel is not None:  # sends and recvs
            by_channel.setdefault(p.channel, []).append(p)
    for p, q in ((p, q) for group in by_channel.values() for p in group for q in group):
        stream, other = assignment.stream_of[p.start], assignment.stream_of[q.start]
        if p.halves_of_one_permute(q) and stream != other:
            raise VerificationError(
                f"{_name(p)} and {_name(q)} are the send and recv of one permute, but on "
                f"streams {stream} and {other}"
            )
    if module is None:
        _check_occurrences(list(placed.values()), assignment)
    else:
        _walk(module, placed, assignment)


def _check(p: AsyncPair, in_flight: list[AsyncPair], assignment: StreamAssignment) -> None:
    stream = assignment.stream_of[p.start]
    for q in in_flight:
        if q is not p and assignment.stream_of[q.start] != stream and p.shares_devices_with(q):
            raise VerificationError(
                f"deadlock rule broken: {_name(q)} on stream {assignment.stream_of[q.start]} "
                f"and {_name(p)} on stream {stream} are in flight together and share two or "
                "more devices"
            )


def _walk(module: Module, placed: dict[str, AsyncPair], assignment: StreamAssignment) -> None:
    done_of = {p.done: p for p in placed.values()}
    budget = MAX_WALK
    reached: set[str] = set()
    roots = [module.entry] + [c for c in module.computations if not c.is_entry]
    for root in roots:
        if root.name in reached:
            continue
        in_flight: list[AsyncPair] = []
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
                p = placed[inst.name]
                _check(p, in_flight, assignment)
                in_flight.append(p)
            elif inst.name in done_of and comp.name == done_of[inst.name].computation:
                p = done_of[inst.name]
                if p in in_flight:
                    in_flight.remove(p)
            called = []
            for key in _RUNS.get(inst.opcode, ()):
                value = inst.attribute(key)
                for name in (value or "").strip("{}").split(","):
                    callee = module.computation(name.strip().lstrip("%"))
                    if callee is not None:
                        called.append(callee)
            for callee in reversed(called):  # the first runs first
                reached.add(callee.name)
                stack.append((callee, 0))


def _check_occurrences(pairs: list[AsyncPair], assignment: StreamAssignment) -> None:
    events = sorted((a, b, p.start) for p in pairs for a, b in p.occurrences)
    by_start = {p.start: p for p in pairs}
    active: list[tuple[int, AsyncPair]] = []
    for a, b, name in events:
        active = [(end, q) for end, q in active if end > a]
        _check(by_start[name], [q for _, q in active], assignment)
        active.append((b, by_start[name]))


def _name(p: AsyncPair) -> str:
    return f"{p.kind} '%{p.start}' (computation '{p.computation}')"
