"""assign-streams: give every async pair one of K collective streams.

First the deadlock rule: pairs in flight together whose groups share two or
more devices are tied to one stream, and ties are transitive, so each
connected set of such pairs (a "unit") is placed as one. Its span, from its
first start to its last done, is contiguous because its pairs overlap in a chain.

Then a policy places the units:
- ``round-robin``: the i-th unit in start order gets stream i mod K, as XLA's
  own proposal (openxla/xla PR 22450) does for pairs;
- ``interval``: a unit takes the lowest-numbered stream that is free at its
  start; when all K are busy, the one that frees first (the shortest wait).
  With K at least the number of units in flight at once this is optimal
  interval colouring: nothing shares a stream unless the rule tied it.

The result depends only on the module text, so every process of a multi-host
job computes the same assignment.
"""

from __future__ import annotations

from dataclasses import dataclass

from xla_streams.collectives import MAX_STREAMS, AsyncPair, Policy, StreamAssignment
from xla_streams.pipeline import Compilation, Fact, ModulePass, register


@register
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
    placed = [p for p in pairs if p.needs_stream]
    units = tied_units(placed)
    if policy == "round-robin":
        unit_streams = [i % streams for i in range(len(units))]
    elif policy == "interval":
        unit_streams = _interval(units, streams)
    else:
        raise ValueError(f"unknown policy {policy!r}")
    stream_of: dict[str, int | None] = {p.start: None for p in pairs}
    unit_of: dict[str, int] = {}
    for u, (unit, stream) in enumerate(zip(units, unit_streams, strict=True)):
        for p in unit:
            stream_of[p.start] = stream
            unit_of[p.start] = u
    by_bound, by_rule = _serialized(placed, stream_of, unit_of)
    return StreamAssignment(streams, policy, stream_of, frozenset(by_bound), frozenset(by_rule))


def tied_units(pairs: list[AsyncPair]) -> list[list[AsyncPair]]:
    """Pairs the deadlock rule ties together, as groups in order of first start."""
    ordered = sorted(pairs, key=lambda p: p.start_time)
    parent = list(range(len(ordered)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    # Sweep in start order; only pairs still in flight can overlap the next one.
    active: list[int] = []
    for i, p in enumerate(ordered):
        active = [j for j in active if ordered[j].done_time > p.start_time]
        for j in active:
            if p.shares_devices_with(ordered[j]):
                parent[find(i)] = find(j)
        active.append(i)
    units: dict[int, list[AsyncPair]] = {}
    for i, p in enumerate(ordered):
        units.setdefault(find(i), []).append(p)
    return sorted(units.values(), key=lambda unit: unit[0].start_time)


def _interval(units: list[list[AsyncPair]], streams: int) -> list[int]:
    busy_until = [0] * streams  # done time of the last unit on each stream
    result = []
    for unit in units:
        begin = unit[0].start_time
        end = max(p.done_time for p in unit)
        free = [k for k in range(streams) if busy_until[k] < begin]
        stream = free[0] if free else min(range(streams), key=lambda k: (busy_until[k], k))
        busy_until[stream] = max(busy_until[stream], end)
        result.append(stream)
    return result


def _serialized(
    pairs: list[AsyncPair], stream_of: dict[str, int | None], unit_of: dict[str, int]
) -> tuple[set[str], set[str]]:
    """Pairs that start while an earlier pair on their stream is still in flight,
    split by cause: the deadlock rule (same unit) or the bound K (another unit)."""
    by_bound: set[str] = set()
    by_rule: set[str] = set()
    active: list[AsyncPair] = []
    for p in sorted(pairs, key=lambda p: p.start_time):
        active = [q for q in active if q.done_time > p.start_time]
        for q in active:
            if stream_of[q.start] == stream_of[p.start]:
                (by_rule if unit_of[q.start] == unit_of[p.start] else by_bound).add(p.start)
        active.append(p)
    return by_bound - by_rule, by_rule
