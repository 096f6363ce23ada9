"""What a replay predicts: the lanes work runs on, the slices of a timeline, and the
step time and busy times of one configuration of streams (``SimResult``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from xla_streams.collectives import SYNC_PAIR_STREAM
from xla_streams.streams import AsyncPair

# Lanes other than the collective streams 0..K-1.
COMPUTE_LANE = -1
P2P_LANE = -2
# Side compute stream k (XLA's computation_stream[k]) is lane SIDE_COMPUTE_LANE - k.
SIDE_COMPUTE_LANE = -100
# The bounds' streams of their own, numbered from here (only the drawing sees the
# numbers).
OWN_STREAM_LANE = 1_000_000


@dataclass(frozen=True)
class Slice:
    """One interval of the timeline, on a lane."""

    lane: int
    name: str
    kind: str
    start: float
    duration: float
    args: dict[str, Any] = field(default_factory=dict)
    collective: bool = False  # a collective's run (else compute, a wait or repeats)


@dataclass
class SimResult:
    """What one configuration of streams is predicted to do."""

    label: str
    streams: int | None  # None: a bound (streams of their own)
    policy: str | None
    step_time: float
    compute_time: float
    exposed_communication: float
    lane_busy: dict[int, float]
    notes: list[str]
    slices: list[Slice] | None = None
    truncated: bool = False
    # The (K, policy) configurations it stands for (several when they assign alike).
    configs: tuple[tuple[int, str], ...] = ()
    # Busy time of the side compute streams (async fusions), beside compute_time.
    side_compute_time: float = 0.0
    # Work (compute kernels, side kernels, collectives standalone; loops counted per
    # iteration) whose time came from the program's profile, and from the model.
    profiled_time: float = 0.0
    modeled_time: float = 0.0

    def lane_name(self, lane: int) -> str:
        return lane_name(lane)

    @property
    def profiled_fraction(self) -> float:
        """The share of the work whose time was measured (0 without a profile)."""
        total = self.profiled_time + self.modeled_time
        return self.profiled_time / total if total > 0 else 0.0


def lane_name(lane: int) -> str:
    if lane == COMPUTE_LANE:
        return "compute"
    if lane == P2P_LANE:
        return "p2p stream"
    if lane <= SIDE_COMPUTE_LANE:
        return f"side compute stream {SIDE_COMPUTE_LANE - lane}"
    if lane >= OWN_STREAM_LANE:
        return f"own stream {lane - OWN_STREAM_LANE}"
    return f"collective stream {lane}"


def runs_on(pair: AsyncPair) -> str:
    """Where XLA runs ``pair``, in words (its lane; see :class:`StreamModel`)."""
    if pair.lane == "compute":
        return "compute stream (sync: issued and waited for there)"
    if pair.lane == "p2p":
        return "XLA's P2P stream"
    if pair.sync:
        return f"collective stream {SYNC_PAIR_STREAM} (sync: XLA pins it there)"
    return "the collective stream assigned"
