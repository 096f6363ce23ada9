"""Discrete-event replay of a scheduled module on one GPU of the job.

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
- Two bounds, both without bandwidth sharing, and both leaving the compute and
  p2p lanes and XLA's pin of sync pairs to stream 0 as they are: the *lower
  bound* gives every collective its own stream (unbounded streams, ignoring
  the deadlock rule); the *rule bound* gives each group of pairs the deadlock
  rule ties together (``tied_units``) one stream of its own, the best any K
  can do while keeping the rule.

Predictions: step time, exposed communication, busy time per stream, for each
stream count K and policy, with the real assignment of ``assign-streams``.

Not modelled in the expected value (each makes real overlap somewhat worse
than predicted): NCCL kernels taking SMs and HBM bandwidth from the compute
kernels they overlap (``errors=ErrorScale(interference=...)`` slows compute that
starts while a collective is in flight; ``ranges.predict_range`` uses it for its
high end), several channels of one collective spreading over links differently
from a plain ring, and launch overheads saved by CUDA graphs. The time of one
device is predicted; ranks are assumed to run the same schedule in lockstep.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from xla_streams.collectives import (
    COLLECTIVE_OPCODES,
    POLICIES,
    STREAM_COUNTS,
    SYNC_PAIR_STREAM,
    Policy,
    StreamModel,
    device_groups,
)
from xla_streams.hlo import Computation, Instruction, Module
from xla_streams.hlo.attributes import decode, parse_backend_config
from xla_streams.simulate.cost import CollectiveCost, CostModel
from xla_streams.simulate.errors import TABLE_SMOOTH_BYTES, ErrorScale
from xla_streams.simulate.execution_streams import execution_streams
from xla_streams.simulate.profile import MeasuredCosts
from xla_streams.simulate.targets import Target
from xla_streams.streams import (
    AsyncPair,
    StreamAssignment,
    assign_streams,
    find_async_pairs,
    tied_units,
)

# Step tags of a compiled program. A compute step is (_COMPUTE, seconds, name, kind,
# bytes, flops, seconds of it measured); _SIDE_START/_SIDE_DONE start and wait for an
# async kernel on a side compute stream.
_COMPUTE, _START, _DONE, _SYNC, _FIRE, _WHILE, _SIDE_START, _SIDE_DONE = range(8)
# Lanes other than the collective streams 0..K-1.
COMPUTE_LANE = -1
P2P_LANE = -2
# Side compute stream k (XLA's computation_stream[k]) is lane SIDE_COMPUTE_LANE - k.
SIDE_COMPUTE_LANE = -100
# Bounds: streams of their own, numbered from here (only the drawing sees the
# numbers); in the lower bound each collective takes the lowest-numbered one
# idle when it starts (_DYNAMIC).
_UNLIMITED_BASE = 1_000_000
_DYNAMIC = -3
LOWER_BOUND_LABEL = "lower bound (unbounded streams, ignoring the deadlock rule)"
RULE_BOUND_LABEL = "rule bound (a stream for each group the deadlock rule ties)"
# Relative tolerance when deciding that two event times coincide.
_EPS = 1e-12
MAX_RECORDED_SLICES = 200_000

Step = tuple[Any, ...]
Progress = Callable[[str], None]


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


@dataclass
class Program:
    steps: list[Step]
    serial: float  # time with nothing overlapped: compute plus standalone collectives

    @property
    def compute_only(self) -> bool:
        """True when running it never touches a collective (its time is fixed)."""
        return all(step[0] == _COMPUTE for step in self.steps)


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
    if lane >= _UNLIMITED_BASE:
        return f"own stream {lane - _UNLIMITED_BASE}"
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


class _Job:
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


class _Network:
    """The collective streams: FIFO queues, latency phases, shared-bandwidth transfers."""

    def __init__(self, share: bool, recorder: _Recorder | None) -> None:
        self.share = share
        self.now = 0.0
        self.queues: dict[int, deque[_Job]] = {}
        self.running: dict[int, _Job] = {}
        self.transferring: list[_Job] = []
        self.usage: dict[int, int] = {}
        self.busy: dict[int, float] = {}
        self.recorder = recorder

    def submit(self, job: _Job) -> None:
        queue = self.queues.get(job.lane)
        if queue is None:
            queue = self.queues[job.lane] = deque()
        queue.append(job)

    def idle(self) -> bool:
        return not self.running and not any(self.queues.values())

    def run(self, until_time: float = math.inf, until_job: _Job | None = None) -> None:
        """Process events up to ``until_time`` or until ``until_job`` has finished."""
        while until_job is None or until_job.end is None:
            t_next = math.inf
            now = self.now
            for lane, queue in self.queues.items():
                if queue and lane not in self.running:
                    t_next = min(t_next, max(now, queue[0].ready))
            for job in self.running.values():
                t_next = min(t_next, job.finish_at if job.transferring else job.latency_end)
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
        tolerance = _EPS * max(abs(t), 1e-9)
        limit = t + tolerance
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
        for lane, queue in self.queues.items():
            if queue and lane not in self.running and queue[0].ready <= limit:
                job = queue.popleft()
                job.begin = t
                job.latency_end = t + job.spec.cost.latency
                self.running[lane] = job
                if job.latency_end <= t:
                    if job.remaining > 0:
                        self._start_transfer(job)
                        changed = True
                    else:
                        self._finish(job, t)
        if changed:
            self._rates()

    def _start_transfer(self, job: _Job) -> None:
        job.transferring = True
        self.transferring.append(job)
        usage = self.usage
        for r in job.spec.cost.resources:
            usage[r] = usage.get(r, 0) + 1

    def _finish(self, job: _Job, t: float) -> None:
        job.end = t
        job.remaining = 0.0
        del self.running[job.lane]
        if job.transferring:
            job.transferring = False
            self.transferring.remove(job)
            for r in job.spec.cost.resources:
                self.usage[r] -= 1
        self.busy[job.lane] = self.busy.get(job.lane, 0.0) + (t - job.begin)
        if self.recorder is not None:
            self.recorder.collective(job)

    def _rates(self) -> None:
        now = self.now
        usage = self.usage
        for job in self.transferring:
            cost = job.spec.cost
            share = 1.0
            if self.share and cost.resources:
                share = 1.0 / max(usage[r] for r in cost.resources)
            job.rate = cost.bandwidth * share
            job.finish_at = now + job.remaining / job.rate if job.rate > 0 else math.inf


class _Recorder:
    """Slices as the replay goes; without ``compute``, only collectives and waits."""

    def __init__(self, limit: int, compute: bool = True) -> None:
        self.slices: list[Slice] = []
        self.limit = limit
        self.compute = compute
        self.truncated = False

    def add(self, item: Slice) -> None:
        if len(self.slices) < self.limit:
            self.slices.append(item)
        else:
            self.truncated = True

    def collective(self, job: _Job) -> None:
        spec = job.spec
        assert job.end is not None
        standalone = spec.cost.seconds
        if spec.side:
            if self.compute:
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


class Simulator:
    """Compiles a module once (costs, programs) and replays it for any assignment."""

    def __init__(
        self,
        module: Module,
        target: Target,
        pairs: Sequence[AsyncPair] | None = None,
        *,
        model: StreamModel | None = None,
        progress: Progress | None = None,
        measured: MeasuredCosts | None = None,
        errors: ErrorScale | None = None,
    ) -> None:
        """``pairs`` as ``find-async-pairs`` found them, or found here under ``model``
        (default: the safe assumption, see :class:`StreamModel`). ``measured``: the
        program's own measured costs (``profile.load_profile(path).for_module(module)``),
        which replace the model's for the instructions they name. ``errors``: factors
        on the model's costs (``errors.py``; the ranges of ``ranges.predict_range``)."""
        self.module = module
        self.target = target
        self.cost = CostModel(module, target)
        self.measured = measured
        self.errors = errors or ErrorScale()
        self.pairs: tuple[AsyncPair, ...] = tuple(
            pairs if pairs is not None else find_async_pairs(module, model)
        )
        self.progress = progress
        self.notes: list[str] = []
        self.specs: list[CollectiveSpec] = [self._pair_spec(p) for p in self.pairs]
        # A start or done by (computation, name): XLA scopes names per computation.
        self._pair_of_start = {(p.computation, p.start): i for i, p in enumerate(self.pairs)}
        self._pair_of_done = {(p.computation, p.done): i for i, p in enumerate(self.pairs)}
        self._side_of_start: dict[str, int] = {}
        self._side_streams: dict[str, int] | None = None
        self._programs: dict[str, Program] = {}
        self._merged: dict[int, list[Step]] = {}
        self._compiling: set[str] = set()
        self._outcomes: dict[
            tuple[Any, ...], tuple[float, float, float, dict[int, float], float, float]
        ] = {}
        self.entry = self._compile(module.entry)
        self._entry_merged = self._merge(self.entry.steps)
        tabled = sum(1 for spec in self.specs if spec.cost.measured and not spec.profiled)
        if tabled:
            self.notes.append(
                f"{tabled} of {sum(1 for s in self.specs if not s.side)} collectives priced "
                f"from XLA's measured table ({target.perf_table_key})"
            )
        if measured is not None:
            unused = measured.unused()
            if unused:
                shown = ", ".join(unused[:5]) + (
                    f" and {len(unused) - 5} more" if len(unused) > 5 else ""
                )
                self.notes.append(
                    f"profile {measured.path}: {len(unused)} name(s) not in this module ({shown})"
                )

    # -- costs -------------------------------------------------------------------

    def _pair_spec(self, pair: AsyncPair) -> CollectiveSpec:
        cost, profiled = self._collective(pair.start, self.cost.collective(pair), pair.bytes)
        return CollectiveSpec(pair.start, pair.kind, pair.bytes, cost, pair, profiled=profiled)

    def _collective(
        self, name: str, cost: CollectiveCost, size: int
    ) -> tuple[CollectiveCost, bool]:
        """``cost`` with a measured time from the profile, or scaled by ``errors``."""
        errors = self.errors
        seconds = self.measured.get(name) if self.measured is not None else None
        if seconds is not None:
            seconds *= errors.profiled
            latency = min(cost.latency, seconds)
            transfer = seconds - latency
            if cost.wire_bytes <= 0 or transfer <= 0:
                return dataclasses.replace(cost, latency=seconds, wire_bytes=0.0), True
            return dataclasses.replace(
                cost, latency=latency, bandwidth=cost.wire_bytes / transfer
            ), True
        if errors.neutral:
            return cost, False
        if cost.measured:
            f = errors.table_large if size >= TABLE_SMOOTH_BYTES else errors.table_small
            return dataclasses.replace(
                cost, latency=cost.latency * f, bandwidth=cost.bandwidth / f
            ), False
        link = errors.network if cost.network else errors.nvlink
        return dataclasses.replace(
            cost, latency=cost.latency * errors.latency, bandwidth=cost.bandwidth / link
        ), False

    def _kernel(self, name: str, seconds: float, error: str) -> tuple[float, float]:
        """(seconds, of which measured) of a compute kernel: the profile's time if it has
        one, else the model's scaled by ``errors`` for the bound named ``error``."""
        measured = self.measured.get(name) if self.measured is not None else None
        if measured is not None:
            measured *= self.errors.profiled
            return measured, measured
        return seconds * self.errors.compute(error), 0.0

    def _side_stream(self, name: str) -> int:
        """XLA's compute stream for the async kernel started by ``name``."""
        if self._side_streams is None:
            self._side_streams = execution_streams(self.module, self.pairs).compute
        return self._side_streams.get(name, 0)

    def _add_side(self, inst: Instruction, seconds: float, kind: str, nbytes: int) -> int:
        spent, measured = self._kernel(inst.name, seconds, kind)
        cost = CollectiveCost("kernel", "none", spent, 0.0, 0.0, False, ())
        spec = CollectiveSpec(inst.name, kind, nbytes, cost, None, side=True, profiled=measured > 0)
        self.specs.append(spec)
        index = len(self.specs) - 1
        self._side_of_start[inst.name] = index
        return index

    # -- compiling ---------------------------------------------------------------

    def _compile(self, comp: Computation) -> Program:
        program = self._programs.get(comp.name)
        if program is not None:
            return program
        if comp.name in self._compiling:
            raise RuntimeError(f"computation '{comp.name}' calls itself")
        self._compiling.add(comp.name)
        steps: list[Step] = []
        serial = 0.0
        cost_of = self.cost.instruction
        for inst in comp.instructions:
            name = inst.name
            opcode = inst.opcode
            pair_index = self._pair_of_start.get((comp.name, name))
            if pair_index is not None:
                on_compute = self.pairs[pair_index].lane == "compute"
                steps.append((_SYNC if on_compute else _START, pair_index))
                serial += self.specs[pair_index].cost.seconds
                continue
            pair_index = self._pair_of_done.get((comp.name, name))
            if pair_index is not None:
                if self.pairs[pair_index].lane != "compute":
                    steps.append((_DONE, pair_index))
                continue
            if opcode in ("fusion-done", "async-done"):
                side = self._side_done(inst)
                if side is not None:
                    steps.append((_SIDE_DONE, side))
                    continue
            if self.cost.async_compute(inst):
                if opcode == "async-start":
                    wrapped = self._callee(inst, "calls")
                    assert wrapped is not None
                    program = self._compile(wrapped)
                    side = self._add_side(inst, program.serial, "async-compute", 0)
                    spec = self.specs[side]
                    if not spec.profiled:
                        # Its kernels, priced (or measured) one by one.
                        measured = sum(s[6] for s in program.steps if s[0] == _COMPUTE)
                        self.specs[side] = dataclasses.replace(
                            spec, profiled=0 < program.serial <= measured
                        )
                else:
                    cost = cost_of(inst)
                    side = self._add_side(inst, cost.seconds, cost.kind, cost.bytes)
                lane = SIDE_COMPUTE_LANE - self._side_stream(name)
                steps.append((_SIDE_START, side, lane))
                serial += self.specs[side].cost.seconds
                continue
            if opcode == "while":
                step = self._while(inst)
                steps.append(step)
                cond, body, trip = step[2], step[3], step[4]
                serial += trip * (cond.serial + body.serial) + cond.serial
            elif opcode in ("call", "conditional"):
                callee = self._callee_program(inst)
                if callee is not None:
                    steps.extend(callee.steps)
                    serial += callee.serial
            elif opcode in ("send", "recv"):
                # Unpaired: pipelined from an earlier iteration; its done is elsewhere.
                index = self._add_spec(inst, opcode)
                steps.append((_FIRE, index))
            elif opcode in ("send-done", "recv-done"):
                continue
            elif opcode in COLLECTIVE_OPCODES:
                index = self._add_spec(inst, opcode)
                steps.append((_SYNC, index))
                serial += self.specs[index].cost.seconds
            else:
                cost = cost_of(inst)
                if cost.seconds > 0:
                    seconds, measured = self._kernel(name, cost.seconds, cost.error)
                    steps.append(
                        (_COMPUTE, seconds, name, cost.kind, cost.bytes, cost.flops, measured)
                    )
                    serial += seconds
        self._compiling.discard(comp.name)
        program = Program(steps, serial)
        self._programs[comp.name] = program
        return program

    def _add_spec(self, inst: Instruction, kind: str) -> int:
        groups = device_groups(self.module, inst, kind)
        size = max(sum(s.byte_size for s in inst.operand_shapes), inst.shape.byte_size)
        cost, profiled = self._collective(
            inst.name, self.cost.collective_of(inst, kind, groups, size), size
        )
        self.specs.append(CollectiveSpec(inst.name, kind, size, cost, profiled=profiled))
        return len(self.specs) - 1

    def _side_done(self, done: Instruction) -> int | None:
        """The side kernel ``done`` waits for (None: not an async kernel's done)."""
        names = done.operand_names
        start = done.computation.get(names[0]) if names else None
        while start is not None and start.opcode.endswith("-update") and start.operand_names:
            start = start.computation.get(start.operand_names[0])
        return self._side_of_start.get(start.name) if start is not None else None

    def _callee(self, inst: Instruction, key: str) -> Computation | None:
        value = inst.attribute(key)
        if value is None:
            return None
        comp = self.cost.computations.get(value.strip().lstrip("%"))
        if comp is None:
            raise inst.error_at_attribute(key, 0, f"unknown computation '{value}'")
        return comp

    def _callee_program(self, inst: Instruction) -> Program | None:
        if inst.opcode == "call":
            comp = self._callee(inst, "to_apply")
            return self._compile(comp) if comp is not None else None
        names: list[str] = []
        branches = inst.attribute("branch_computations")
        if branches is not None:
            names = [n.strip().lstrip("%") for n in branches.strip("{}").split(",") if n.strip()]
        else:
            for key in ("true_computation", "false_computation"):
                value = inst.attribute(key)
                if value is not None:
                    names.append(value.strip().lstrip("%"))
        programs = []
        for n in names:
            comp = self.cost.computations.get(n)
            if comp is None:
                raise inst.error(f"unknown branch computation '{n}'")
            programs.append((self._compile(comp), n))
        if not programs:
            return None
        best, best_name = max(programs, key=lambda item: item[0].serial)
        if len(programs) > 1:
            self.notes.append(
                f"conditional %{inst.name}: ran its most expensive branch %{best_name} "
                f"(of {len(programs)})"
            )
        return best

    def _while(self, inst: Instruction) -> Step:
        body = self._callee(inst, "body")
        cond = self._callee(inst, "condition")
        if body is None or cond is None:
            raise inst.error("while without body= or condition=")
        trip, known = trip_count(inst)
        if not known:
            self.notes.append(
                f"while %{inst.name}: trip count unknown (no known_trip_count in its "
                "backend_config); its body was simulated once"
            )
        return (_WHILE, inst.name, self._compile(cond), self._compile(body), trip, known)

    def _merge(self, steps: list[Step]) -> list[Step]:
        """Consecutive compute steps folded into one, for replays that draw nothing."""
        key = id(steps)
        cached = self._merged.get(key)
        if cached is not None:
            return cached
        merged: list[Step] = []
        pending = pending_measured = 0.0
        for step in steps:
            if step[0] == _COMPUTE:
                pending += step[1]
                pending_measured += step[6]
                continue
            if pending:
                merged.append((_COMPUTE, pending, "", "", 0, 0.0, pending_measured))
                pending = pending_measured = 0.0
            if step[0] == _WHILE:
                cond, body = step[2], step[3]
                step = (
                    _WHILE, step[1],
                    Program(self._merge(cond.steps), cond.serial),
                    Program(self._merge(body.steps), body.serial),
                    step[4], step[5],
                )  # fmt: skip
            merged.append(step)
        if pending:
            merged.append((_COMPUTE, pending, "", "", 0, 0.0, pending_measured))
        self._merged[key] = merged
        return merged

    # -- replaying -----------------------------------------------------------------

    def run(
        self,
        assignment: StreamAssignment,
        *,
        record: bool = False,
        label: str | None = None,
        share_bandwidth: bool = True,
    ) -> SimResult:
        """Replay with ``assignment``'s streams; ``share_bandwidth`` turns the sharing
        of links between concurrent collectives on or off."""
        return self._result(
            self._lanes(assignment),
            share=share_bandwidth,
            record=record,
            label=label or f"K={assignment.streams} {assignment.policy}",
            streams=assignment.streams,
            policy=assignment.policy,
        )

    def collective_timeline(self, assignment: StreamAssignment) -> SimResult:
        """``run(assignment, record=True)`` with only the collectives' and the waits'
        slices: what explaining a prediction needs, at a fraction of the cost."""
        return self._result(
            self._lanes(assignment),
            share=True,
            record=True,
            compute_slices=False,
            label=f"K={assignment.streams} {assignment.policy}",
            streams=assignment.streams,
            policy=assignment.policy,
        )

    def _lanes(self, assignment: StreamAssignment) -> list[int]:
        lanes = []
        for pair in self.pairs:
            lane = self._fixed_lane(pair)
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
        docstring); neither shares bandwidth. XLA runs a sync pair of the communication
        lane on stream 0 whatever it is assigned (:class:`StreamModel`): so do both."""
        lanes = [
            SYNC_PAIR_STREAM
            if pair.lane == "communication" and pair.sync
            else self._fixed_lane(pair)
            for pair in self.pairs
        ]
        if respect_rule:
            # A group holding a sync pair goes where XLA pins that pair.
            index = {p.key: i for i, p in enumerate(self.pairs)}
            communication = [p for p in self.pairs if p.lane == "communication"]
            for u, unit in enumerate(tied_units(communication)):
                pinned = any(p.sync for p in unit)
                for p in unit:
                    lanes[index[p.key]] = SYNC_PAIR_STREAM if pinned else _UNLIMITED_BASE + u
        return self._result(
            [_DYNAMIC if lane is None else lane for lane in lanes],
            share=False,
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
            return COMPUTE_LANE  # its _SYNC step runs it there
        return None

    def _result(
        self,
        lanes: list[int],
        *,
        share: bool,
        record: bool,
        label: str,
        streams: int | None,
        policy: str | None,
        compute_slices: bool = True,
    ) -> SimResult:
        recorder = _Recorder(MAX_RECORDED_SLICES, compute_slices) if record else None
        # Different (K, policy) often give the same streams: replay each once.
        key = (share, *lanes)
        outcome = None if record else self._outcomes.get(key)
        if outcome is None:
            replay = _Replay(self, lanes, share=share, recorder=recorder)
            # Interference depends on when each kernel starts: no merged steps then.
            whole = (record and compute_slices) or self.errors.interference > 0
            replay.program(self.entry.steps if whole else self._entry_merged)
            replay.finish()
            lane_busy = dict(sorted(replay.network.busy.items()))
            lane_busy[COMPUTE_LANE] = replay.compute_busy
            outcome = (
                replay.t, replay.compute_busy, replay.exposed, lane_busy,
                replay.profiled, replay.modeled,
            )  # fmt: skip
            if not record:
                self._outcomes[key] = outcome
        step_time, compute_busy, exposed, lane_busy, profiled, modeled = outcome
        side = sum(busy for lane, busy in lane_busy.items() if lane <= SIDE_COMPUTE_LANE)
        return SimResult(
            label=label,
            streams=streams,
            policy=policy,
            step_time=step_time,
            compute_time=compute_busy,
            exposed_communication=exposed,
            lane_busy=dict(lane_busy),
            notes=list(self.notes),
            slices=recorder.slices if recorder is not None else None,
            truncated=recorder.truncated if recorder is not None else False,
            configs=() if streams is None or policy is None else ((streams, policy),),
            side_compute_time=side,
            profiled_time=profiled,
            modeled_time=modeled,
        )

    def kernels(self) -> dict[str, tuple[str, float]]:
        """Each compute instruction the replay charges (not collectives, not control
        flow; async kernels on side streams included): its name -> (cost class,
        seconds of one execution)."""
        found: dict[str, tuple[str, float]] = {}
        for program in self._programs.values():
            for step in program.steps:
                if step[0] == _COMPUTE:
                    found[step[2]] = (step[3], step[1])
                elif step[0] == _SIDE_START:
                    spec = self.specs[step[1]]
                    found[spec.name] = (spec.kind, spec.cost.seconds)
        return found

    def serial_time(self) -> float:
        """Everything one after another: compute plus every collective standalone."""
        return self.entry.serial


class _Replay:
    def __init__(
        self, sim: Simulator, lanes: list[int], share: bool, recorder: _Recorder | None
    ) -> None:
        """``lanes``: the lane of each pair (``_DYNAMIC``: an idle stream of its own);
        the other collectives' steps say their lanes."""
        self.sim = sim
        self.specs = sim.specs
        self.lanes = lanes
        self.network = _Network(share, recorder)
        self.recorder = recorder
        self.t = 0.0
        self.compute_busy = 0.0
        self.exposed = 0.0
        self.profiled = 0.0  # work measured (profile) and modelled, as run
        self.modeled = 0.0
        self.interference = sim.errors.interference
        self.in_flight: dict[int, _Job] = {}
        self.fired: list[_Job] = []

    def _count(self, spec: CollectiveSpec) -> None:
        if spec.profiled:
            self.profiled += spec.cost.seconds
        else:
            self.modeled += spec.cost.seconds

    def _collective_running(self) -> bool:
        """A collective (not a side kernel) is in flight now."""
        network = self.network
        network.run(until_time=self.t)
        return any(job.lane > SIDE_COMPUTE_LANE for job in network.running.values()) or any(
            queue and lane > SIDE_COMPUTE_LANE and queue[0].ready <= self.t
            for lane, queue in network.queues.items()
        )

    def program(self, steps: list[Step]) -> None:
        recorder = self.recorder
        network = self.network
        for step in steps:
            tag = step[0]
            if tag == _COMPUTE:
                seconds = step[1]
                self.profiled += step[6]
                self.modeled += seconds - step[6]
                if self.interference > 0 and self._collective_running():
                    seconds *= 1 + self.interference
                if recorder is not None and recorder.compute:
                    recorder.add(
                        Slice(
                            COMPUTE_LANE, step[2], step[3], self.t, seconds,
                            {"kind": step[3], "bytes": step[4], "flops": step[5],
                             "predicted_us": round(seconds * 1e6, 3)},
                        )
                    )  # fmt: skip
                self.t += seconds
                self.compute_busy += seconds
            elif tag == _START:
                index = step[1]
                lane = self.lanes[index]
                if lane == _DYNAMIC:
                    lane = self._idle_lane()
                job = _Job(index, self.specs[index], lane, self.t)
                self._count(job.spec)
                network.submit(job)
                self.in_flight[index] = job
            elif tag == _DONE:
                job = self.in_flight.pop(step[1])
                self._wait(job, "wait")
            elif tag == _SYNC:
                index = step[1]
                job = _Job(index, self.specs[index], COMPUTE_LANE, self.t)
                self._count(job.spec)
                network.submit(job)
                self._wait(job, None)
            elif tag == _FIRE:
                index = step[1]
                job = _Job(index, self.specs[index], P2P_LANE, self.t)
                self._count(job.spec)
                network.submit(job)
                self.fired.append(job)
            elif tag == _SIDE_START:
                index = step[1]
                job = _Job(index, self.specs[index], step[2], self.t)
                self._count(job.spec)
                network.submit(job)
                self.in_flight[index] = job
            elif tag == _SIDE_DONE:
                job = self.in_flight.pop(step[1])
                self._wait(job, "wait", exposed=False)
            else:
                self._loop(step)

    def _idle_lane(self) -> int:
        """The lowest-numbered unlimited stream with nothing running or queued now."""
        network = self.network
        network.run(until_time=self.t)
        lane = _UNLIMITED_BASE
        while lane in network.running or network.queues.get(lane):
            lane += 1
        return lane

    def _wait(self, job: _Job, wait_kind: str | None, *, exposed: bool = True) -> None:
        """Block the compute stream until ``job`` is over; the time is exposed
        communication unless ``exposed`` is False (a side kernel)."""
        if job.end is None:
            self.network.run(until_job=job)
        assert job.end is not None
        if job.end > self.t:
            waited = job.end - self.t
            if exposed:
                self.exposed += waited
            if self.recorder is not None and wait_kind is not None:
                self.recorder.add(
                    Slice(
                        COMPUTE_LANE, f"wait {job.spec.name}", wait_kind, self.t, waited,
                        {"kind": "wait", "collective": job.spec.name,
                         "predicted_us": round(waited * 1e6, 3)},
                    )
                )  # fmt: skip
            self.t = job.end

    def _loop(self, step: Step) -> None:
        _, name, cond, body, trip, _known = step
        network = self.network
        i = 0
        while i < trip:
            network.run(until_time=self.t)
            idle_before = network.idle() and not self.in_flight
            before = (
                self.t, self.compute_busy, self.exposed, dict(network.busy), self.profiled,
                self.modeled,
            )  # fmt: skip
            self.program(cond.steps)
            self.program(body.steps)
            i += 1
            if i >= trip:
                continue
            compute_only = cond.compute_only and body.compute_only
            if not compute_only:
                # The iteration's time depends on collectives: it repeats exactly only
                # when it started and ended with nothing in flight.
                if not idle_before:
                    continue
                network.run(until_time=self.t)
                if not (network.idle() and not self.in_flight):
                    continue
            # Every later iteration takes exactly as long as this one: add them up.
            repeats = trip - i
            t0, busy0, exposed0, lanes0, profiled0, modeled0 = before
            duration = self.t - t0
            if self.recorder is not None and self.recorder.compute:
                self.recorder.add(
                    Slice(
                        COMPUTE_LANE, f"{name}: {repeats} more iterations", "repeat", self.t,
                        duration * repeats,
                        {"kind": "repeat", "iterations": repeats,
                         "iteration_us": round(duration * 1e6, 3)},
                    )
                )  # fmt: skip
            self.t += duration * repeats
            self.compute_busy += (self.compute_busy - busy0) * repeats
            self.exposed += (self.exposed - exposed0) * repeats
            self.profiled += (self.profiled - profiled0) * repeats
            self.modeled += (self.modeled - modeled0) * repeats
            if not compute_only:
                # Idle network: its streams' busy time repeats too, and nothing is pending.
                for lane, busy in list(network.busy.items()):
                    network.busy[lane] = busy + (busy - lanes0.get(lane, 0.0)) * repeats
                network.now = self.t
            # A compute-only body leaves collectives in flight alone: they advance
            # lazily, when the compute stream next needs one.
            break
        self.program(cond.steps)

    def finish(self) -> None:
        """Let collectives nobody waits for (fired p2p) drain; they do not extend the step."""
        for job in self.in_flight.values():
            self._wait(job, "wait")
        self.in_flight.clear()
        self.network.run(until_time=self.t)


def trip_count(inst: Instruction) -> tuple[int, bool]:
    """``known_trip_count`` of a while (1 and False when XLA did not record one)."""
    config = decode(inst, "backend_config", parse_backend_config) or {}
    known = config.get("known_trip_count")
    if isinstance(known, dict) and "n" in known:
        try:
            return max(int(known["n"]), 0), True
        except (TypeError, ValueError):
            pass
    return 1, False


# -- what-if --------------------------------------------------------------------------


@dataclass
class WhatIf:
    """Predictions for every stream count and policy, and the two bounds.

    ``explanations`` say, for each (K, policy) predicted slower than the next
    smaller K under the same policy, why, naming the pairs that cause it.
    """

    module: str
    target: Target
    streams: tuple[int, ...]
    policies: tuple[Policy, ...]
    results: dict[tuple[int, str], SimResult]
    assignments: dict[tuple[int, str], StreamAssignment]
    lower_bound: SimResult
    rule_bound: SimResult
    serial: float
    pairs: tuple[AsyncPair, ...]
    specs: list[CollectiveSpec]
    notes: list[str]
    explanations: dict[tuple[int, str], str] = field(default_factory=dict)

    def result(self, streams: int, policy: str) -> SimResult:
        return self.results[(streams, policy)]

    @property
    def baseline(self) -> SimResult:
        """One collective stream: what XLA does today."""
        return self.results[(min(self.streams), self.policies[0])]

    def non_monotone(self) -> list[str]:
        """Why a larger K is predicted slower than a smaller one, where it is."""
        return list(self.explanations.values())

    def bounds(self) -> list[tuple[SimResult, str]]:
        """The two bounds, each with what it assumes."""
        return [
            (self.rule_bound, "each group of pairs the deadlock rule ties on a stream of its own"),
            (self.lower_bound, "every collective on a stream of its own"),
        ]


def what_if(
    module: Module,
    target: Target,
    streams: Iterable[int] = STREAM_COUNTS,
    policies: Iterable[Policy] = POLICIES,
    *,
    pairs: Sequence[AsyncPair] | None = None,
    model: StreamModel | None = None,
    progress: Progress | None = None,
    simulator: Simulator | None = None,
) -> WhatIf:
    """Simulate ``module`` for every K in ``streams`` under every policy."""
    streams = tuple(sorted(set(streams)))
    policies = tuple(policies)
    say = progress or (lambda _message: None)
    if simulator is None:
        say(f"cost model: {module.name}")
        simulator = Simulator(module, target, pairs, model=model, progress=progress)
    results: dict[tuple[int, str], SimResult] = {}
    assignments: dict[tuple[int, str], StreamAssignment] = {}
    for policy in policies:
        for k in streams:
            say(f"simulating K={k} {policy}")
            assignment = assign_streams(simulator.pairs, k, policy)
            assignments[(k, policy)] = assignment
            results[(k, policy)] = simulator.run(assignment)
    say("simulating the bounds")
    lower = simulator.bound(respect_rule=False)
    rule = simulator.bound(respect_rule=True)
    explanations = _explain_non_monotone(simulator, streams, policies, results, assignments)
    return WhatIf(
        module=module.name,
        target=target,
        streams=streams,
        policies=policies,
        results=results,
        assignments=assignments,
        lower_bound=lower,
        rule_bound=rule,
        serial=simulator.serial_time(),
        pairs=simulator.pairs,
        specs=simulator.specs,
        notes=list(simulator.notes),
        explanations=explanations,
    )


# Relative slack before a larger K counts as slower than a smaller one.
MONOTONE_TOLERANCE = 1e-9
# How many of the collectives waited for longer an explanation names, and how many
# collectives it names as sharing links with, or running ahead of, each.
MAX_VICTIMS = 3
MAX_CULPRITS = 5


def _explain_non_monotone(
    simulator: Simulator,
    streams: tuple[int, ...],
    policies: tuple[Policy, ...],
    results: dict[tuple[int, str], SimResult],
    assignments: dict[tuple[int, str], StreamAssignment],
) -> dict[tuple[int, str], str]:
    """For each K predicted slower than the K before it: replays without bandwidth
    sharing tell the two possible causes apart, and recorded replays name the pairs."""
    out: dict[tuple[int, str], str] = {}
    timelines: dict[tuple[tuple[str, int | None], ...], SimResult] = {}
    for policy in policies:
        for smaller, k in pairwise(streams):
            slow, fast = results[(k, policy)], results[(smaller, policy)]
            if slow.step_time <= fast.step_time * (1 + MONOTONE_TOLERANCE):
                continue
            slow_assignment, fast_assignment = (
                assignments[(k, policy)],
                assignments[(smaller, policy)],
            )
            unshared_slow = simulator.run(slow_assignment, share_bandwidth=False)
            unshared_fast = simulator.run(fast_assignment, share_bandwidth=False)
            head = (
                f"{policy}: K={k} ({slow.step_time * 1e3:.4f} ms) is predicted slower than "
                f"K={smaller} ({fast.step_time * 1e3:.4f} ms): "
            )
            if unshared_slow.step_time <= unshared_fast.step_time * (1 + MONOTONE_TOLERANCE):
                cause = (
                    "collectives that now run at the same time share link bandwidth, so "
                    "the one the compute stream waits for first finishes later than it would "
                    f"have queued alone (without sharing K={k} would take "
                    f"{unshared_slow.step_time * 1e3:.4f} ms, K={smaller} "
                    f"{unshared_fast.step_time * 1e3:.4f} ms)"
                )
            else:
                cause = (
                    f"the {policy} assignment for K={k} queues collectives behind "
                    f"different ones than for K={smaller}, and a collective the compute stream "
                    "needs early now waits behind a later one"
                )
            named = _named_causes(simulator, slow_assignment, fast_assignment, timelines)
            out[(k, policy)] = head + cause + "".join(f". {n}" for n in named)
    return out


def _named_causes(
    sim: Simulator,
    slow: StreamAssignment,
    fast: StreamAssignment,
    timelines: dict[tuple[tuple[str, int | None], ...], SimResult],
) -> list[str]:
    """One sentence for each collective the compute stream waits for longer under
    ``slow`` than under ``fast`` (longest first): which collectives share its links
    while it runs, and which run ahead of it on its stream, under ``slow``.
    ``timelines`` keeps the replays by streams, for the next call."""

    def timeline(assignment: StreamAssignment) -> SimResult:
        key = tuple(assignment.stream_of.items())
        if key not in timelines:
            timelines[key] = sim.collective_timeline(assignment)
        return timelines[key]

    slow_run = timeline(slow)
    fast_waits = _waits(timeline(fast))
    extra = {name: w - fast_waits.get(name, 0.0) for name, w in _waits(slow_run).items()}
    tolerance = MONOTONE_TOLERANCE * max(slow_run.step_time, 1e-12)
    victims = sorted((n for n, e in extra.items() if e > tolerance), key=lambda n: -extra[n])
    jobs = [s for s in slow_run.slices or () if s.collective]
    links = {spec.name: set(spec.cost.resources) for spec in sim.specs}
    sentences = []
    for name in victims[:MAX_VICTIMS]:
        sharing: dict[str, int] = {}  # collective -> its lane
        ahead: dict[str, int] = {}
        occurrences = [s for s in jobs if s.name == name]
        for v in occurrences:
            # When it was issued (its slice starts when its stream took it).
            ready = v.start - v.args["queued_us"] * 1e-6 - 1e-9
            end = v.start + v.duration
            for o in jobs:
                if o.name == name:
                    continue
                o_end = o.start + o.duration
                if o.lane == v.lane and o.start < v.start and o_end > ready:
                    ahead[o.name] = o.lane
                elif o.start < end and v.start < o_end and links[name] & links[o.name]:
                    sharing[o.name] = o.lane
        first = occurrences[0] if occurrences else None
        where = f"{first.kind}, {lane_name(first.lane)}" if first else "collective"
        sentence = f"%{name} ({where}) is waited for {extra[name] * 1e6:.1f} us longer"
        if sharing:
            sentence += f"; it shares link bandwidth with {_names(sharing)}"
        if ahead:
            stream = lane_name(next(iter(ahead.values())))
            sentence += f"; it queues on {stream} behind {_names(ahead)}"
        sentences.append(sentence)
    return sentences


def _waits(result: SimResult) -> dict[str, float]:
    """Per collective, how long the compute stream waited for it (a collective on the
    compute lane: its whole time)."""
    waits: dict[str, float] = {}
    for s in result.slices or ():
        if s.lane != COMPUTE_LANE:
            continue
        name = s.args.get("collective") if s.kind == "wait" else s.name if s.collective else None
        if name is not None:
            waits[name] = waits.get(name, 0.0) + s.duration
    return waits


def _names(lanes: dict[str, int]) -> str:
    """``%a (collective stream 1), %b (compute)``, at most MAX_CULPRITS, then a count."""
    items = [f"%{n} ({lane_name(lane)})" for n, lane in sorted(lanes.items())]
    more = len(items) - MAX_CULPRITS
    return ", ".join(items[:MAX_CULPRITS]) + (f" and {more} more" if more > 0 else "")
