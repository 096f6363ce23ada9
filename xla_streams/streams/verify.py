"""The verification: the stream assignment checked independently of how it was made.

Every pair is assigned exactly once; pairs on the communication lane have a
stream in 0..K-1 (a sync one the stream XLA runs it on), the others none; each
done comes after its start. Then the deadlock rule
(:func:`~xla_streams.streams.rule.must_share_stream`): the send and the recv of a
channel on one stream, and, checked on what the runtime executes rather than on
the intervals find-async-pairs computed, the pairs in flight together: the program is
walked from ENTRY in schedule order, entering the callee of every control-flow
instruction at each of its calls, keeping the set of collectives in flight (those of a
computation an async call runs on another thread: all of them, from the call's start
to its done); at each start, none in flight may share two or more devices with it on
another stream. Linear in the instructions executed; the rule's test indexes the
groups in flight by device (:class:`~xla_streams.streams.rule.InFlight`), its work
bounded by ``MAX_RULE_WORK``: past it the module is refused with an error at the
collective.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Sequence
from typing import Any

from xla_streams.collectives import SYNC_PAIR_STREAM
from xla_streams.hlo import Computation, Module
from xla_streams.hlo.attributes import CONTROL_FLOW_CALLEES, control_flow_callees
from xla_streams.streams.assignment import StreamAssignment
from xla_streams.streams.pairs import ASYNC_CALLS, AsyncPair, async_calls
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
        if p.key in seen:
            raise VerificationError(f"{_name(p)} appears twice")
        seen[p.key] = p
        if p.done_index <= p.start_index or any(b <= a for a, b in p.occurrences):
            raise VerificationError(f"{_name(p)}: done is not after start")
        if p.key not in assignment.stream_of:
            raise VerificationError(f"{_name(p)} has no stream assignment")
        stream = assignment.stream_of[p.key]
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
    placed = {p.key: p for p in pairs if p.needs_stream}
    # The sends and the recvs of each channel, by stream: one send and one recv on
    # different streams break the rule (linear, however many share a channel).
    for halves in permute_halves(placed.values()):
        on: dict[str, dict[int | None, AsyncPair]] = {"send": {}, "recv": {}}
        for p in halves:
            on[p.kind].setdefault(assignment.stream_of[p.key], p)
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
        # grouping -> stream -> pair key -> (pair, occurrences in flight)
        self.holders: dict[int, dict[int | None, dict[str, list[Any]]]] = {}
        self.count: dict[str, int] = {}  # pair key -> occurrences in flight

    def start(self, p: AsyncPair) -> None:
        stream = self.stream_of[p.key]
        for grouping in self.flight.conflicts(p):
            for other, held in self.holders[grouping].items():
                if other != stream:
                    q = next(iter(held.values()))[0]
                    raise VerificationError(
                        f"deadlock rule broken: {_name(q)} on stream {other} and {_name(p)} on "
                        f"stream {stream} are in flight together and share two or more devices"
                    )
        self.count[p.key] = self.count.get(p.key, 0) + 1
        begun = self.flight.begin(p)
        if begun is not None:
            held = self.holders.setdefault(begun, {}).setdefault(stream, {})
            held.setdefault(p.key, [p, 0])[1] += 1

    def done(self, p: AsyncPair) -> None:
        if not self.count.get(p.key):
            return  # a done met without its start (its computation entered mid-pair)
        self.count[p.key] -= 1
        grouping = self.flight.finish(p)
        if grouping is not None:
            by_stream = self.holders[grouping]
            stream = self.stream_of[p.key]
            entry = by_stream[stream][p.key]
            entry[1] -= 1
            if not entry[1]:
                del by_stream[stream][p.key]
                if not by_stream[stream]:
                    del by_stream[stream]


def _walk(module: Module, placed: dict[str, AsyncPair], assignment: StreamAssignment) -> None:
    # Per computation, the pairs that start (True) or end at each position.
    events: dict[str, dict[int, tuple[bool, AsyncPair]]] = {}
    for p in placed.values():
        at = events.setdefault(p.computation, {})
        at[p.start_index], at[p.done_index] = (True, p), (False, p)
    threads = _AsyncCalls(module, placed.values())
    stops = _Stops(events, threads)
    budget = MAX_WALK
    reached: set[str] = set()
    roots = [module.entry] + [c for c in module.computations if not c.is_entry]
    for root in roots:
        if root.name in reached:
            continue
        reached.add(root.name)
        if not stops.of(root):  # no pair and no call in it (most: fusions' computations)
            budget -= len(root.instructions)
            if budget < 0:
                raise _too_large()
            continue
        rule = _Rule(assignment)
        # A stack of frames: a computation, its next instruction's index, its events, and
        # the pairs of the async calls it has running, by the index of their done.
        stack: list[_Frame] = [(root, 0, events.get(root.name, {}), {})]
        while stack:
            comp, i, at, running = stack.pop()
            instructions = comp.instructions
            # Only the instructions where something happens are visited (a pair starts
            # or ends, an async call's done, a call); those between are counted.
            where = stops.of(comp)
            for stop in where[bisect.bisect_left(where, i) :]:
                budget -= stop + 1 - i
                if budget < 0:
                    raise _too_large()
                i = stop + 1
                if running:
                    for p in running.pop(stop, ()):
                        rule.done(p)
                event = at.get(stop)
                if event is not None:
                    if event[0]:
                        rule.start(event[1])
                    else:
                        rule.done(event[1])
                inst = instructions[stop]
                calls = _CALLS.get(inst.opcode)
                if calls is None:
                    continue
                if calls == "async":
                    called = threads.calls(comp).get(stop)
                    if called is not None:
                        done, inside = called
                        for p in inside:
                            rule.start(p)
                        running.setdefault(done, []).extend(inside)
                    continue
                # Control flow: the rest of this computation after its callees, the
                # first of which runs first.
                stack.append((comp, i, at, running))
                for _, name in reversed(control_flow_callees(inst)):
                    callee = module.computation(name)
                    if callee is not None:
                        reached.add(callee.name)
                        stack.append((callee, 0, events.get(callee.name, {}), {}))
                break
            else:
                budget -= len(instructions) - i
                if budget < 0:
                    raise _too_large()
                for p in running.pop(None, ()):  # an async call without a done
                    rule.done(p)


def _too_large() -> VerificationError:
    return VerificationError(
        f"the program executes more than {MAX_WALK} instructions; too large to verify"
    )


class _Stops:
    """Per computation, in order, the positions the walk must visit: where a placed pair
    starts or ends, where an instruction calls a computation, where an async call's done
    is; found once per computation, however often it runs."""

    def __init__(
        self, events: dict[str, dict[int, tuple[bool, AsyncPair]]], threads: _AsyncCalls
    ) -> None:
        self._events = events
        self._threads = threads
        self._of: dict[str, list[int]] = {}

    def of(self, comp: Computation) -> list[int]:
        found = self._of.get(comp.name)
        if found is None:
            calls = [i for i, inst in enumerate(comp.instructions) if inst.opcode in _CALLS]
            events = self._events.get(comp.name)
            if not calls and not events:
                found = []
            else:
                positions = {*calls, *(events or ())}
                if any(comp.instructions[i].opcode in ASYNC_CALLS for i in calls):
                    dones = (done for done, _ in self._threads.calls(comp).values())
                    positions.update(done for done in dones if done is not None)
                found = sorted(positions)
            self._of[comp.name] = found
        return found


# What an instruction calls, by opcode: computations as control flow, or another
# thread's computation asynchronously.
_CALLS = {**dict.fromkeys(CONTROL_FLOW_CALLEES, "control"), **dict.fromkeys(ASYNC_CALLS, "async")}
_Frame = tuple[
    Computation, int, dict[int, tuple[bool, AsyncPair]], dict[int | None, list[AsyncPair]]
]


class _AsyncCalls:
    """The async calls of each computation that run a computation (on another thread),
    with the placed pairs they run (in what they run, through control flow and nested
    async calls), found on first use."""

    def __init__(self, module: Module, placed: Iterable[AsyncPair]) -> None:
        self.module = module
        self._calls: dict[str, dict[int, tuple[int | None, list[AsyncPair]]]] = {}
        self._inside: dict[str, list[AsyncPair]] = {}
        self._by_computation: dict[str, list[AsyncPair]] = {}
        for p in placed:
            self._by_computation.setdefault(p.computation, []).append(p)

    def calls(self, comp: Computation) -> dict[int, tuple[int | None, list[AsyncPair]]]:
        """Start index -> (its done's index, the placed pairs it runs)."""
        found = self._calls.get(comp.name)
        if found is None:
            found = self._calls[comp.name] = {
                i: (done, [p for name in called for p in self.inside(name)])
                for i, (done, called) in async_calls(self.module, comp).items()
            }
        return found

    def inside(self, name: str) -> list[AsyncPair]:
        """The placed pairs of computation ``name`` and of all it runs."""
        found = self._inside.get(name)
        if found is None:
            found = []
            seen, todo = {name}, [name]
            while todo:
                comp = self.module.computation(todo.pop())
                if comp is None:
                    continue
                found.extend(self._by_computation.get(comp.name, ()))
                called = [c for _, cs in async_calls(self.module, comp).values() for c in cs]
                for inst in comp.instructions:
                    if inst.opcode in CONTROL_FLOW_CALLEES:
                        called.extend(c for _, c in control_flow_callees(inst))
                for c in called:
                    if c not in seen:
                        seen.add(c)
                        todo.append(c)
            self._inside[name] = found
        return found


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
