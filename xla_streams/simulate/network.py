"""The collective streams as the replay runs them (the model: ``simulator.py``): FIFO
queues, a latency phase and then a transfer that shares link bandwidth with the others in
flight (processor sharing); the same streams without sharing, where no event needs
processing; and the recorder of a timeline's slices."""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

from xla_streams.simulate.cost import CollectiveCost
from xla_streams.simulate.timeline import COMPUTE_LANE, SIDE_COMPUTE_LANE, Slice
from xla_streams.streams import AsyncPair

# Relative tolerance when deciding that two event times coincide.
_EPS = 1e-12


@dataclass(frozen=True)
class CollectiveSpec:
    """A collective the program issues: an async pair or a blocking one."""

    name: str
    kind: str
    bytes: int
    cost: CollectiveCost
    pair: AsyncPair | None = None
    # An async kernel on a side compute stream (kind: its cost class), not a collective.
    side: bool = False
    # Its time comes from the program's own profile.
    profiled: bool = False
    # A blocking collective's computation and position in its schedule (the compute
    # stream runs it there); None for the others.
    at: tuple[str, int] | None = None


class Job:
    """One run of a collective (or side kernel) on a lane: when it was issued, began, ended
    its latency and ended, and the bytes it has left to move at its current rate."""

    __slots__ = (
        "begin",
        "end",
        "finish_at",
        "lane",
        "latency_end",
        "rate",
        "ready",
        "remaining",
        "spec",
        "spec_index",
        "transferring",
    )

    def __init__(self, spec_index: int, spec: CollectiveSpec, lane: int, ready: float) -> None:
        self.spec_index = spec_index
        self.spec = spec
        self.lane = lane
        self.ready = ready
        self.begin = math.nan
        self.latency_end = math.nan
        self.end: float | None = None
        self.remaining = spec.cost.wire_bytes
        self.rate = 0.0
        self.finish_at = math.inf
        self.transferring = False


class Streams:
    """What both networks keep of the collectives they finish: the clock, each lane's
    busy time, the jobs in the order they finished, and the recorder."""

    def __init__(self, recorder: Recorder | None) -> None:
        self.now = 0.0
        self.busy: dict[int, float] = {}
        self.finished: list[Job] = []
        self.recorder = recorder

    def _settle(self, job: Job, t: float) -> None:
        """``job`` ends at ``t``."""
        job.end = t
        job.remaining = 0.0
        self.busy[job.lane] = self.busy.get(job.lane, 0.0) + (t - job.begin)
        self.finished.append(job)
        if self.recorder is not None:
            self.recorder.collective(job)


class Network(Streams):
    """The collective streams: FIFO queues, latency phases, shared-bandwidth transfers."""

    def __init__(self, share: bool, recorder: Recorder | None) -> None:
        super().__init__(recorder)
        self.share = share
        # The lanes with jobs waiting, and those jobs: a lane leaves when its queue empties.
        self.queues: dict[int, deque[Job]] = {}
        self.running: dict[int, Job] = {}
        self.transferring: list[Job] = []
        self.usage: dict[int, int] = {}
        # What the collectives running now take from compute (interference.py): the
        # SMs their kernels hold and the HBM bytes/s they move; ``changes`` counts the
        # events that may have changed them.
        self.sms = 0
        self.hbm = 0.0
        self.changes = 0
        self.queued_collectives = 0  # waiting on their streams (side kernels not counted)
        # next_event() until an event or a submission changes it (advancing the clock
        # short of it does not).
        self._next: float | None = None

    def submit(self, job: Job) -> None:
        queue = self.queues.get(job.lane)
        if queue is None:
            self.queues[job.lane] = deque((job,))
        else:
            queue.append(job)
        if job.lane > SIDE_COMPUTE_LANE:
            self.queued_collectives += 1
        self._next = None

    def idle(self) -> bool:
        return not self.running and not self.queues

    def lane_busy(self, lane: int) -> bool:
        """A job runs or waits on ``lane`` now."""
        return lane in self.running or lane in self.queues

    def collectives_pending(self) -> bool:
        """A collective (not a side kernel) is running or queued: compute beside it may
        be slowed now or later."""
        return self.sms > 0 or self.queued_collectives > 0

    def next_event(self) -> float:
        """When the next collective starts, ends its latency or finishes (inf: never)."""
        if self._next is not None:
            return self._next
        t_next = math.inf
        now = self.now
        running = self.running
        for lane, queue in self.queues.items():
            if lane not in running:
                ready = queue[0].ready
                t_next = min(t_next, ready if ready > now else now)
        for job in running.values():
            t_next = min(t_next, job.finish_at if job.transferring else job.latency_end)
        self._next = t_next
        return t_next

    def run(self, until_time: float = math.inf, until_job: Job | None = None) -> None:
        """Process events up to ``until_time`` or until ``until_job`` has finished."""
        while until_job is None or until_job.end is None:
            t_next = self.next_event()
            if t_next > until_time:
                self._advance(until_time)
                return
            if t_next == math.inf:
                if until_job is not None:
                    raise RuntimeError(f"collective '{until_job.spec.name}' can never finish")
                return
            self._advance(t_next)
            self._events(t_next)

    def _advance(self, t: float) -> None:
        dt = t - self.now
        if dt > 0:
            for job in self.transferring:
                job.remaining -= job.rate * dt
            self.now = t

    def _events(self, t: float) -> None:
        self.changes += 1
        limit = t + _EPS * (t if t > 1e-9 else 1e-9)  # the clock never runs below 0
        changed = False
        # Transfers that are complete and latencies that are over.
        due = [
            job
            for job in self.running.values()
            if (job.finish_at if job.transferring else job.latency_end) <= limit
        ]
        for job in due:
            if job.transferring or job.remaining <= 0:
                changed |= job.transferring
                self._finish(job, t)
            else:
                self._start_transfer(job)
                changed = True
        # Idle streams take their next collective.
        emptied = []
        for lane, queue in self.queues.items():
            if lane not in self.running and queue[0].ready <= limit:
                job = queue.popleft()
                if not queue:
                    emptied.append(lane)
                if lane > SIDE_COMPUTE_LANE:
                    self.queued_collectives -= 1
                job.begin = t
                job.latency_end = t + job.spec.cost.latency
                self.running[lane] = job
                self.sms += job.spec.cost.sms
                if job.latency_end <= t:
                    if job.remaining > 0:
                        self._start_transfer(job)
                        changed = True
                    else:
                        self._finish(job, t)
        for lane in emptied:
            del self.queues[lane]
        if changed:
            self._rates()
        self._next = None

    def _start_transfer(self, job: Job) -> None:
        job.transferring = True
        self.transferring.append(job)
        usage = self.usage
        for r in job.spec.cost.resources:
            usage[r] = usage.get(r, 0) + 1

    def _finish(self, job: Job, t: float) -> None:
        del self.running[job.lane]
        self.sms -= job.spec.cost.sms
        if job.transferring:
            job.transferring = False
            self.transferring.remove(job)
            for r in job.spec.cost.resources:
                self.usage[r] -= 1
        self._settle(job, t)

    def _rates(self) -> None:
        now = self.now
        usage = self.usage
        hbm = 0.0
        shared = usage.__getitem__
        for job in self.transferring:
            cost = job.spec.cost
            share = 1.0
            if self.share and cost.resources:
                share = 1.0 / max(map(shared, cost.resources))
            job.rate = cost.bandwidth * share
            job.finish_at = now + job.remaining / job.rate if job.rate > 0 else math.inf
            hbm += job.rate * cost.hbm_per_byte
        self.hbm = hbm


class UnsharedNetwork(Streams):
    """The collective streams when no link is shared: each collective takes its
    standalone time (latency, then its wire bytes at its bandwidth), so a stream is a
    FIFO queue whose next collective begins at the later of its issue and the end of
    the one before: known when it is issued. What the clock passes finishes, in order
    of end (as :class:`Network` finishes it). What the replay's bounds and its
    replays without sharing or interference run on; the same answers as a
    :class:`Network` with ``share=False``, with no events to process."""

    def __init__(self, recorder: Recorder | None) -> None:
        super().__init__(recorder)
        self._lane_end: dict[int, float] = {}
        self._ending: list[tuple[float, int, Job]] = []  # (end, issue order, job): a heap
        self._issued = 0

    def submit(self, job: Job) -> None:
        cost = job.spec.cost
        begin = max(job.ready, self._lane_end.get(job.lane, 0.0))
        job.begin = begin
        job.latency_end = begin + cost.latency
        end = job.latency_end
        if job.remaining > 0:
            end += job.remaining / cost.bandwidth if cost.bandwidth > 0 else math.inf
        self._lane_end[job.lane] = end
        heapq.heappush(self._ending, (end, self._issued, job))
        self._issued += 1

    def idle(self) -> bool:
        return not self._ending

    def lane_busy(self, lane: int) -> bool:
        """A job runs or waits on ``lane`` now."""
        return self._lane_end.get(lane, -math.inf) > self.now

    def run(self, until_time: float = math.inf, until_job: Job | None = None) -> None:
        """Finish what ends by ``until_time``, or until ``until_job`` has finished."""
        ending = self._ending
        while until_job is None or until_job.end is None:
            if not ending or (until_job is None and ending[0][0] > until_time):
                break
            end, _, job = ending[0]
            if end == math.inf:
                break
            heapq.heappop(ending)
            self.now = max(self.now, end)
            self._settle(job, end)
        if until_job is not None:
            if until_job.end is None:
                raise RuntimeError(f"collective '{until_job.spec.name}' can never finish")
        elif until_time < math.inf:
            self.now = max(self.now, until_time)


class Recorder:
    """Slices as the replay goes, up to ``limit`` of them."""

    def __init__(self, limit: int) -> None:
        self.slices: list[Slice] = []
        self.limit = limit
        self.truncated = False

    def add(self, item: Slice) -> None:
        if len(self.slices) < self.limit:
            self.slices.append(item)
        else:
            self.truncated = True

    def wait(self, job: Job, at: float, waited: float, kind: str) -> None:
        """The compute stream blocked from ``at`` for ``waited`` seconds on ``job``."""
        self.add(
            Slice(
                COMPUTE_LANE, f"wait {job.spec.name}", kind, at, waited,
                {"kind": "wait", "collective": job.spec.name,
                 "predicted_us": round(waited * 1e6, 3)},
            )
        )  # fmt: skip

    def collective(self, job: Job) -> None:
        spec = job.spec
        assert job.end is not None
        standalone = spec.cost.seconds
        if spec.side:
            self.add(
                Slice(
                    job.lane, spec.name, spec.kind, job.begin, job.end - job.begin,
                    {"kind": spec.kind, "bytes": spec.bytes, "async": True,
                     "predicted_us": round((job.end - job.begin) * 1e6, 3),
                     "queued_us": round((job.begin - job.ready) * 1e6, 3)},
                )
            )  # fmt: skip
            return
        self.add(
            Slice(
                job.lane,
                spec.name,
                spec.kind,
                job.begin,
                job.end - job.begin,
                {
                    "kind": spec.kind,
                    "bytes": spec.bytes,
                    "algorithm": spec.cost.algorithm,
                    "link": "network" if spec.cost.network else "nvlink",
                    "predicted_us": round((job.end - job.begin) * 1e6, 3),
                    "standalone_us": round(standalone * 1e6, 3),
                    "queued_us": round((job.begin - job.ready) * 1e6, 3),
                    "latency_us": round(spec.cost.latency * 1e6, 3),
                },
                collective=True,
            )
        )
