"""The stream assignment: every pair on the communication lane gets one of K collective
streams.

First the deadlock rule (:mod:`xla_streams.streams.rule`): pairs in flight
together (at any call of their computations) whose groups share two or more
devices are tied to one stream, and so are the send and the recv of one permute
(:func:`~xla_streams.streams.rule.must_share_stream`); ties are transitive, so
each connected set of such pairs (a "unit",
:func:`~xla_streams.streams.rule.tied_units`) is placed as one.

Then pins: a unit holding a pair XLA runs on a fixed stream whatever its
annotation (a sync pair on the communication lane: ``SYNC_PAIR_STREAM``, see
:class:`~xla_streams.collectives.StreamModel`) or a pair the module already
annotated with a stream below K (a user's pin) takes that stream.
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

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from xla_streams.collectives import POLICIES, SYNC_PAIR_STREAM, Policy, check_streams
from xla_streams.streams.pairs import AsyncPair, in_flight_order
from xla_streams.streams.rule import tied_units


@dataclass(frozen=True)
class StreamAssignment:
    """The collective stream of each pair (by :attr:`AsyncPair.key`: its start's name); None
    off the communication lane.

    ``reassigned`` maps a pair whose annotation in the module could not be kept
    to why (a stream >= K, or pins the deadlock rule cannot honour).
    """

    streams: int
    policy: Policy
    stream_of: dict[str, int | None]
    serialized_by_bound: frozenset[str] = frozenset()
    serialized_by_rule: frozenset[str] = frozenset()
    reassigned: dict[str, str] = field(default_factory=dict)
    # Why K is below the one asked for: its NCCL kernels would not all fit on the GPU
    # at once (``fit-on-gpu``, simulate/residency.py).
    lowered: str = ""

    @property
    def serialized(self) -> frozenset[str]:
        return self.serialized_by_bound | self.serialized_by_rule

    @property
    def streams_used(self) -> int:
        return len({s for s in self.stream_of.values() if s is not None})


def assign_streams(pairs: Sequence[AsyncPair], streams: int, policy: Policy) -> StreamAssignment:
    """The stream of each of ``pairs``, as this module's docstring says; RuleWorkExceeded
    where the deadlock rule runs past its work budget."""
    return assign_each(pairs, (streams,), (policy,))[(streams, policy)]


def assign_each(
    pairs: Sequence[AsyncPair], streams: Iterable[int], policies: Iterable[Policy]
) -> dict[tuple[int, Policy], StreamAssignment]:
    """:func:`assign_streams` for every K in ``streams`` under every policy, by (K,
    policy); the deadlock rule's units, which depend on the pairs alone, found once."""
    streams, policies = tuple(streams), tuple(policies)
    for k in streams:
        check_streams(k)
    for policy in policies:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}")
    placed = [p for p in pairs if p.needs_stream]
    units = tied_units(placed)
    return {
        (k, policy): _place(pairs, placed, units, k, policy) for policy in policies for k in streams
    }


def _place(
    pairs: Sequence[AsyncPair],
    placed: list[AsyncPair],
    units: list[list[AsyncPair]],
    streams: int,
    policy: Policy,
) -> StreamAssignment:
    """The assignment of ``units`` (of the ``placed`` pairs among ``pairs``) to
    ``streams`` streams under ``policy``."""
    reassigned: dict[str, str] = {}
    pins = [_pin(unit, streams, reassigned) for unit in units]
    busy_until = [0] * streams  # done time of the last unit on each stream
    stream_of: dict[str, int | None] = {p.key: None for p in pairs}
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
            stream_of[p.key] = stream
            unit_of[p.key] = u
    by_bound, by_rule = _serialized(placed, stream_of, unit_of)
    return StreamAssignment(
        streams, policy, stream_of, frozenset(by_bound), frozenset(by_rule), reassigned
    )


def _pin(unit: list[AsyncPair], streams: int, reassigned: dict[str, str]) -> int | None:
    """The stream ``unit`` must take, if any; records the pins it cannot keep."""
    fixed = [p for p in unit if p.sync]  # XLA runs these on SYNC_PAIR_STREAM, annotated or not
    wanted = [p for p in unit if not p.sync and p.annotation is not None]
    for p in wanted:
        if p.annotation is not None and p.annotation >= streams:
            reassigned[p.key] = f"annotation {p.annotation} names a stream >= K={streams}"
    valid = [p for p in wanted if p.key not in reassigned]
    chosen = fixed[0] if fixed else valid[0] if valid else None
    if chosen is None:
        return None
    stream = SYNC_PAIR_STREAM if chosen.sync else chosen.annotation
    assert stream is not None
    for p in valid:
        if p.annotation != stream:
            reassigned[p.key] = (
                f"annotation {p.annotation} dropped: the deadlock rule ties it to "
                f"'%{chosen.start}', which runs on stream {stream}"
            )
    return stream


def _serialized(
    pairs: list[AsyncPair], stream_of: dict[str, int | None], unit_of: dict[str, int]
) -> tuple[set[str], set[str]]:
    """Pairs that start while an earlier pair on their stream is still in flight,
    split by cause: the deadlock rule (same unit) or the bound K (another unit).
    A sweep that counts, per stream, the occurrences in flight of each unit and of
    each pair: linear in the occurrences (with a heap of done times)."""
    by_bound: set[str] = set()
    by_rule: set[str] = set()
    on_stream: dict[int | None, int] = {}  # stream -> occurrences in flight
    of_unit: dict[int, int] = {}  # unit -> occurrences in flight (a unit has one stream)
    of_pair: dict[str, int] = {}  # pair key -> occurrences in flight
    ending: list[tuple[int, int]] = []  # (done, index into pairs), a heap
    index = {p.key: i for i, p in enumerate(pairs)}
    for begin, end, p in in_flight_order(pairs):
        while ending and ending[0][0] <= begin:
            q = pairs[heapq.heappop(ending)[1]]
            on_stream[stream_of[q.key]] -= 1
            of_unit[unit_of[q.key]] -= 1
            of_pair[q.key] -= 1
        stream, unit, mine = stream_of[p.key], unit_of[p.key], of_pair.get(p.key, 0)
        same_unit = of_unit.get(unit, 0) - mine  # others of its unit in flight
        if same_unit:
            by_rule.add(p.key)
        elif on_stream.get(stream, 0) - mine:
            by_bound.add(p.key)
        on_stream[stream] = on_stream.get(stream, 0) + 1
        of_unit[unit] = of_unit.get(unit, 0) + 1
        of_pair[p.key] = mine + 1
        heapq.heappush(ending, (end, index[p.key]))
    return by_bound - by_rule, by_rule
