"""assign-streams: give every pair on the communication lane one of K collective streams.

First the deadlock rule: pairs in flight together (at any call of their
computations) whose groups share two or more devices are tied to one stream, and
so are the send and the recv of one permute (``AsyncPair.must_share_stream_with``);
ties are transitive, so each connected set of such pairs (a "unit") is placed as one.

Then pins: a unit holding a pair XLA runs on a fixed stream whatever its
annotation (a sync pair on the communication lane: ``SYNC_PAIR_STREAM``, see
:class:`StreamModel`) or a pair the
module already annotated with a stream below K (a user's pin) takes that stream.
Pins that cannot all hold (two in one unit; an annotation >= K) are re-assigned
and listed in ``StreamAssignment.reassigned`` with the reason: the rule wins
over a pin, and no stream >= K is ever used.

Then a policy places the other units, in order of first start:
- ``round-robin``: the i-th unit gets stream i mod K, as XLA's own proposal
  (openxla/xla PR 22450) does for pairs;
- ``interval``: a unit takes the lowest-numbered stream that is free at its
  start; when all K are busy, the one that frees first (the shortest wait).
  Without pins and with K at least the number of units in flight at once this
  is optimal interval colouring: nothing shares a stream unless the rule tied it.

The result depends only on the module text and the options, so every process
of a multi-host job computes the same assignment.
"""

from __future__ import annotations

from dataclasses import dataclass

from xla_streams.collectives import (
    MAX_STREAMS,
    SYNC_PAIR_STREAM,
    AsyncPair,
    Policy,
    StreamAssignment,
    in_flight_order,
)
from xla_streams.passes.base import Compilation, Fact, ModulePass


@dataclass(frozen=True)
class AssignStreams(ModulePass):
    name = "assign-streams"
    requires = frozenset({Fact.ASYNC_PAIRS})
    ensures = frozenset({Fact.STREAMS_ASSIGNED})

    streams: int = 4
    policy: Policy = "interval"

    def __post_init__(self) -> None:
        check_streams(self.streams)

    def run(self, compilation: Compilation) -> None:
        compilation.assignment = assign_streams(compilation.pairs, self.streams, self.policy)


def check_streams(streams: int) -> None:
    if isinstance(streams, bool) or not isinstance(streams, int) or not 1 <= streams <= MAX_STREAMS:
        raise ValueError(f"streams must be an integer from 1 to {MAX_STREAMS}, not {streams!r}")


def assign_streams(
    pairs: tuple[AsyncPair, ...] | list[AsyncPair], streams: int, policy: Policy
) -> StreamAssignment:
    check_streams(streams)
    if policy not in ("interval", "round-robin"):
        raise ValueError(f"unknown policy {policy!r}")
    placed = [p for p in pairs if p.needs_stream]
    units = tied_units(placed)
    reassigned: dict[str, str] = {}
    pins = [_pin(unit, streams, reassigned) for unit in units]
    busy_until = [0] * streams  # done time of the last unit on each stream
    stream_of: dict[str, int | None] = {p.start: None for p in pairs}
    unit_of: dict[str, int] = {}
    for u, (unit, pin) in enumerate(zip(units, pins, strict=True)):
        begin = unit[0].start_time
        if pin is not None:
            stream = pin
        elif policy == "round-robin":
            stream = u % streams
        else:
            free = [k for k in range(streams) if busy_until[k] < begin]
            stream = free[0] if free else min(range(streams), key=lambda k: (busy_until[k], k))
        busy_until[stream] = max(busy_until[stream], max(b for p in unit for _, b in p.occurrences))
        for p in unit:
            stream_of[p.start] = stream
            unit_of[p.start] = u
    by_bound, by_rule = _serialized(placed, stream_of, unit_of)
    return StreamAssignment(
        streams, policy, stream_of, frozenset(by_bound), frozenset(by_rule), reassigned
    )


def tied_units(pairs: list[AsyncPair]) -> list[list[AsyncPair]]:
    """Pairs the deadlock rule ties together, as groups in order of first start."""
    index = {p.start: i for i, p in enumerate(pairs)}
    parent = list(range(len(pairs)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    # Sweep in start order; only occurrences still in flight can overlap the next one.
    active: list[tuple[int, AsyncPair]] = []
    for begin, end, p in in_flight_order(pairs):
        active = [(done, q) for done, q in active if done > begin]
        for _, q in active:
            if p.shares_devices_with(q):
                parent[find(index[p.start])] = find(index[q.start])
        active.append((end, p))
    by_channel: dict[int, int] = {}
    for p in pairs:
        if p.kind in ("send", "recv") and p.channel is not None:
            first = by_channel.setdefault(p.channel, index[p.start])
            parent[find(index[p.start])] = find(first)
    units: dict[int, list[AsyncPair]] = {}
    for p in sorted(pairs, key=lambda p: (p.start_time, p.start)):
        units.setdefault(find(index[p.start]), []).append(p)
    return sorted(units.values(), key=lambda unit: (unit[0].start_time, unit[0].start))


def _pin(unit: list[AsyncPair], streams: int, reassigned: dict[str, str]) -> int | None:
    """The stream ``unit`` must take, if any; records the pins it cannot keep."""
    fixed = [p for p in unit if p.sync]  # XLA runs these on SYNC_PAIR_STREAM, annotated or not
    wanted = [p for p in unit if not p.sync and p.annotation is not None]
    for p in wanted:
        if p.annotation is not None and p.annotation >= streams:
            reassigned[p.start] = f"annotation {p.annotation} names a stream >= K={streams}"
    valid = [p for p in wanted if p.start not in reassigned]
    chosen = fixed[0] if fixed else valid[0] if valid else None
    if chosen is None:
        return None
    stream = SYNC_PAIR_STREAM if chosen.sync else chosen.annotation
    assert stream is not None
    for p in valid:
        if p.annotation != stream:
            reassigned[p.start] = (
                f"annotation {p.annotation} dropped: the deadlock rule ties it to "
                f"'%{chosen.start}', which runs on stream {stream}"
            )
    return stream


def _serialized(
    pairs: list[AsyncPair], stream_of: dict[str, int | None], unit_of: dict[str, int]
) -> tuple[set[str], set[str]]:
    """Pairs that start while an earlier pair on their stream is still in flight,
    split by cause: the deadlock rule (same unit) or the bound K (another unit)."""
    by_bound: set[str] = set()
    by_rule: set[str] = set()
    active: list[tuple[int, AsyncPair]] = []
    for begin, end, p in in_flight_order(pairs):
        active = [(done, q) for done, q in active if done > begin]
        for _, q in active:
            if q is not p and stream_of[q.start] == stream_of[p.start]:
                (by_rule if unit_of[q.start] == unit_of[p.start] else by_bound).add(p.start)
        active.append((end, p))
    return by_bound - by_rule, by_rule
