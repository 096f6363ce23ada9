"""Discrete-event replay of a scheduled module on one GPU of the job: the ``Simulator``.

It compiles the module once (``compiler.py``) and replays it for each assignment
(``replay.py``) over the collective streams (``network.py``); ``whatif.py`` sweeps the
stream counts and policies.

The model:

- The compute stream executes the schedule in order, each instruction for the
  time the cost model gives it.
- An async start queues its collective on its collective stream (the stream
  assignment's, or XLA's P2P stream for pipelined send/recv). A collective
  begins when it is issued (its operands are ready: everything before the
  start on the compute stream has run) and its stream has finished the
  collectives queued before it (streams are FIFO).
- A done blocks the compute stream until its collective has finished; the time
  blocked is *exposed communication*.
- Each pair runs where XLA runs it (``AsyncPair.lane``, from the
  :class:`~xla_streams.collectives.StreamModel`): on the compute lane the compute
  stream issues it and waits, as for a collective that is not async at all; on
  the p2p lane it goes to XLA's P2P stream; on the communication lane to the
  assignment's stream, sync pairs included (XLA pins those to stream 0, where
  they queue behind whatever is there, and the compute stream waits at once).
- A collective first spends its latency (unshared), then moves its wire bytes.
  Collectives transferring at the same time over the same link (a device's
  NVLink, or its network port) share its bandwidth equally (processor
  sharing); a collective moves at the pace of its most shared link.
- An async fusion (``fusion-start``/``fusion-done``: the dynamic-slice and
  dynamic-update-slice copies XLA wraps to run beside the main compute) runs
  once, on a side compute stream (the one XLA gives it, round robin over 4;
  ``execution_streams.py``): it begins at its start, FIFO on its stream, and
  the compute stream waits for it at its done only if it is not over yet.
  Waiting for one is no exposed communication.
- With measured costs (``measured=``, a PGLE profile: ``profile.py``), an
  instruction the profile names takes its measured time instead of the
  model's; a collective its measured standalone time (start to done). The
  result says how much of the work was measured (``profiled_time``) and how
  much modelled (``modeled_time``).
- A ``while`` runs its condition and body ``known_trip_count`` times (then the
  condition once more); without a known trip count it runs once and the result
  says so. As soon as an iteration starts and ends with no collective in flight,
  every later iteration is identical, so they are added without replaying them.
  A ``conditional`` runs its most expensive branch; ``call`` runs its callee.
- Two bounds, both without bandwidth sharing or interference, and both leaving
  the compute and p2p lanes and XLA's pin of sync pairs to stream 0 as they are:
  the *lower bound* gives every collective its own stream (unbounded streams,
  ignoring the deadlock rule); the *rule bound* gives each group of pairs the
  deadlock rule ties together (``tied_units``) one stream of its own, the best any
  K can do while keeping the rule.

Predictions: step time, exposed communication, busy time per stream, for each
stream count K and policy, with the real assignment of ``assign-streams``.

- A compute kernel that runs while collectives are in flight is slowed by what
  their NCCL kernels take from it: the SMs their channels hold and the HBM bandwidth
  their transfers move (``interference.py``, from NCCL's channel rule in
  ``nccl.py``), for the part of it that overlaps them, in ``Replay.compute_time``.
  Collectives of K streams in flight at once add up.

Not modelled (each makes real overlap somewhat worse than predicted): several
channels of one collective spreading over links differently from a plain ring, a
collective kept waiting for SMs a compute kernel holds, and launch overheads saved
by CUDA graphs. The time of one device is predicted; ranks are assumed to run the
same schedule in lockstep.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, NamedTuple

from xla_streams.collectives import SYNC_PAIR_STREAM
from xla_streams.simulate.compiler import CompiledModule
from xla_streams.simulate.errors import ErrorScale
from xla_streams.simulate.network import Job, Recorder
from xla_streams.simulate.replay import DYNAMIC_LANE, Replay
from xla_streams.simulate.timeline import (
    COMPUTE_LANE,
    OWN_STREAM_LANE,
    P2P_LANE,
    SIDE_COMPUTE_LANE,
    SimResult,
)
from xla_streams.streams import AsyncPair, StreamAssignment, tied_units

LOWER_BOUND_LABEL = "lower bound (unbounded streams, ignoring the deadlock rule)"
RULE_BOUND_LABEL = "rule bound (a stream for each group the deadlock rule ties)"
MAX_RECORDED_SLICES = 200_000


class Replayed(NamedTuple):
    """What a replay adds up, and the collectives and waits that explain it."""

    step_time: float
    compute_busy: float
    exposed: float
    lane_busy: dict[int, float]
    profiled: float
    modeled: float
    finished: list[Job]  # the collectives, in the order they finished
    waits: list[tuple[Job, float]]  # Replay.waits


class Simulator(CompiledModule):
    """Compiles a module once (costs, programs: ``CompiledModule``) and replays it for
    any assignment."""

    @cached_property
    def _outcomes(self) -> dict[tuple[Any, ...], Replayed]:
        """Each replay's outcome by its lanes: different (K, policy) often give the same
        lanes, each replayed once."""
        return {}

    def with_errors(self, errors: ErrorScale) -> Simulator:
        """This module compiled with its costs scaled by ``errors`` (the ends of a
        prediction's range), priced by this simulator's cost model; one per scale."""
        scaled = self._scaled.get(errors)
        if scaled is None:
            scaled = self._scaled[errors] = Simulator(
                self.module, self.target, self.pairs, measured=self.measured, errors=errors,
                cost=self.cost,
            )  # fmt: skip
        return scaled

    @cached_property
    def _scaled(self) -> dict[ErrorScale, Simulator]:
        return {}

    def run(
        self,
        assignment: StreamAssignment,
        *,
        record: bool = False,
        label: str | None = None,
        share_bandwidth: bool = True,
        interference: bool = True,
    ) -> SimResult:
        """Replay with ``assignment``'s streams; ``share_bandwidth`` turns the sharing
        of links between concurrent collectives on or off, ``interference`` what they
        take from the compute beside them (``interference.py``)."""
        return self._result(
            self._lanes(assignment),
            share=share_bandwidth,
            interference=interference,
            record=record,
            label=label or f"K={assignment.streams} {assignment.policy}",
            streams=assignment.streams,
            policy=assignment.policy,
        )

    def replayed(self, assignment: StreamAssignment) -> Replayed:
        """The replay ``run(assignment)`` makes (the same one: replays are kept by their
        lanes), with its collectives as they ran and the compute stream's waits on them:
        what explaining a prediction reads."""
        return self._outcome(self._lanes(assignment), share=True, interference=True)

    @cached_property
    def _fixed_lanes(self) -> list[tuple[AsyncPair, int | None]]:
        return [(pair, self._fixed_lane(pair)) for pair in self.pairs]

    def _lanes(self, assignment: StreamAssignment) -> list[int]:
        lanes = []
        for pair, lane in self._fixed_lanes:
            if lane is None:
                stream = assignment.stream_of.get(pair.key)
                if stream is None:
                    raise ValueError(
                        f"the assignment gives no stream to '%{pair.start}', which runs on a "
                        "collective stream"
                    )
                lane = stream
            lanes.append(lane)
        return lanes

    def bound(self, *, respect_rule: bool, record: bool = False) -> SimResult:
        """The lower bound (``respect_rule=False``) or the rule bound (see the module
        docstring); neither shares bandwidth, and neither slows the compute beside the
        collectives (no interference: a bound is the best the streams can do). XLA runs
        a sync pair of the communication lane on stream 0 whatever it is assigned
        (:class:`StreamModel`): so do both."""
        lanes = [
            SYNC_PAIR_STREAM if pair.lane == "communication" and pair.sync else lane
            for pair, lane in self._fixed_lanes
        ]
        if respect_rule:
            # A group holding a sync pair goes where XLA pins that pair.
            index = {p.key: i for i, p in enumerate(self.pairs)}
            communication = [p for p in self.pairs if p.lane == "communication"]
            for u, unit in enumerate(tied_units(communication)):
                pinned = any(p.sync for p in unit)
                for p in unit:
                    lanes[index[p.key]] = SYNC_PAIR_STREAM if pinned else OWN_STREAM_LANE + u
        return self._result(
            [DYNAMIC_LANE if lane is None else lane for lane in lanes],
            share=False,
            interference=False,
            record=record,
            label=RULE_BOUND_LABEL if respect_rule else LOWER_BOUND_LABEL,
            streams=None,
            policy=None,
        )

    @staticmethod
    def _fixed_lane(pair: AsyncPair) -> int | None:
        """The lane of a pair off the communication lane; None: a collective stream."""
        if pair.lane == "p2p":
            return P2P_LANE
        if pair.lane == "compute":
            return COMPUTE_LANE  # its SYNC step runs it there
        return None

    def _result(
        self,
        lanes: list[int],
        *,
        share: bool,
        interference: bool,
        record: bool,
        label: str,
        streams: int | None,
        policy: str | None,
    ) -> SimResult:
        recorder = Recorder(MAX_RECORDED_SLICES) if record else None
        outcome = self._outcome(lanes, share=share, interference=interference, recorder=recorder)
        return self._as_result(outcome, recorder, label=label, streams=streams, policy=policy)

    def _outcome(
        self,
        lanes: list[int],
        *,
        share: bool,
        interference: bool,
        recorder: Recorder | None = None,
    ) -> Replayed:
        """The replay on ``lanes``: with a ``recorder``, a new one drawing every slice,
        else the one made before with the same lanes if any (different (K, policy) often
        give the same streams)."""
        key = (share, interference, *lanes)
        outcome = None if recorder is not None else self._outcomes.get(key)
        if outcome is not None:
            return outcome
        replay = Replay(self, lanes, share=share, recorder=recorder, interference=interference)
        replay.program(self.entry.steps if recorder is not None else self.merged_entry)
        replay.finish()
        lane_busy = dict(sorted(replay.network.busy.items()))
        lane_busy[COMPUTE_LANE] = replay.compute_busy
        outcome = Replayed(
            replay.t, replay.compute_busy, replay.exposed, lane_busy, replay.profiled,
            replay.modeled, replay.network.finished, replay.waits,
        )  # fmt: skip
        if recorder is None:
            self._outcomes[key] = outcome
        return outcome

    def _as_result(
        self,
        outcome: Replayed,
        recorder: Recorder | None,
        *,
        label: str,
        streams: int | None,
        policy: str | None,
    ) -> SimResult:
        lane_busy = outcome.lane_busy
        side = sum(busy for lane, busy in lane_busy.items() if lane <= SIDE_COMPUTE_LANE)
        return SimResult(
            label=label,
            streams=streams,
            policy=policy,
            step_time=outcome.step_time,
            compute_time=outcome.compute_busy,
            exposed_communication=outcome.exposed,
            lane_busy=dict(lane_busy),
            notes=list(self.notes),
            slices=recorder.slices if recorder is not None else None,
            truncated=recorder.truncated if recorder is not None else False,
            configs=() if streams is None or policy is None else ((streams, policy),),
            side_compute_time=side,
            profiled_time=outcome.profiled,
            modeled_time=outcome.modeled,
        )
