"""What the passes know about async collectives: the pairs, when they are in flight,
which devices they involve, and the stream assignment made for them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Policy = Literal["interval", "round-robin"]
POLICIES: tuple[Policy, ...] = ("interval", "round-robin")
MAX_STREAMS = 64


@dataclass(frozen=True)
class AsyncPair:
    """One async collective: its start and done instructions and what it does.

    ``start_index``/``done_index`` are positions in the computation's schedule;
    ``start_time``/``done_time`` are positions in the whole program's execution
    order (callee computations laid out inside their caller), so two pairs are
    in flight together exactly when these intervals intersect.
    """

    computation: str
    start: str
    done: str
    kind: str
    start_index: int
    done_index: int
    start_time: int
    done_time: int
    sync: bool
    pipelined: bool
    groups: tuple[tuple[int, ...], ...]
    bytes: int
    start_line: int = 0
    _group_sets: tuple[frozenset[int], ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_group_sets", tuple(frozenset(g) for g in self.groups))

    @property
    def needs_stream(self) -> bool:
        """Sync pairs run on the compute stream, pipelined p2p on XLA's own P2P streams."""
        return not (self.sync or self.pipelined)

    def overlaps(self, other: AsyncPair) -> bool:
        """True when both are in flight at some point of the execution."""
        return self.start_time < other.done_time and other.start_time < self.done_time

    def shares_devices_with(self, other: AsyncPair) -> bool:
        """The deadlock rule's test: some group of each shares two or more devices."""
        return any(len(a & b) >= 2 for a in self._group_sets for b in other._group_sets)

    def must_share_stream_with(self, other: AsyncPair) -> bool:
        """Both in flight together and sharing two devices: on different streams NCCL
        could run them in different orders on different ranks, and hang."""
        return self.overlaps(other) and self.shares_devices_with(other)


@dataclass(frozen=True)
class StreamAssignment:
    """The collective stream of each pair (by start name); None for sync/pipelined pairs."""

    streams: int
    policy: Policy
    stream_of: dict[str, int | None]
    serialized_by_bound: frozenset[str] = frozenset()
    serialized_by_rule: frozenset[str] = frozenset()

    @property
    def serialized(self) -> frozenset[str]:
        return self.serialized_by_bound | self.serialized_by_rule

    @property
    def streams_used(self) -> int:
        return len({s for s in self.stream_of.values() if s is not None})


def max_in_flight(pairs: list[AsyncPair] | tuple[AsyncPair, ...]) -> int:
    """Largest number of the given pairs in flight at one time."""
    events = sorted([(p.start_time, 1) for p in pairs] + [(p.done_time, -1) for p in pairs])
    best = current = 0
    for _, delta in events:
        current += delta
        best = max(best, current)
    return best
