"""XLA's own estimate of a step: the latency-hiding scheduler's schedule dump, read.

Compiled with ``xla_dump_to=DIR`` and ``xla_dump_latency_hiding_schedule=True``, XLA
writes ``DIR/<module>.schedule.txt``: the module proto (``hlo_module``), then one
``computation_schedules`` entry per computation the scheduler scheduled (the entry
and every while body), each with ``start_timestamp_cycles``/``end_timestamp_cycles``
per instruction and ``scheduler_statistics { total_cycles, <kind>_wasted_cycles... }``,
and ``cycles_per_microsecond`` (1 in jax 0.12: a cycle is a microsecond).

The times are those of the estimator XLA schedules with: in jax 0.12 the
speed-of-light one (``SolLatencyEstimator``) by default, which prices in-host
collectives from XLA's measured table, cross-host ones with a ring model over the
NIC speed it is told (``xla_gpu_analytical_latency_estimator_options`` in
``XLA_FLAGS``), fusions with its performance model, and falls back to the wrapped
"approximate" estimator for what it cannot price. That fallback is a placeholder,
not an estimate: an async pair it cannot price (an async fusion, a collective whose
communication type it cannot tell) is charged ``kHighLatency`` = 5,000 us, and an
instruction it has no model for (a cuDNN or other custom call) ``0.01 x kMediumCost``
= 10 us (``sol_latency_estimator.cc``, ``latency_hiding_scheduler.h``). Placeholder
pairs are named in :attr:`XlaEstimate.placeholders`, so a reader can leave them out:
:attr:`XlaEstimate.priced_step_us` is the step without the waits on them (a
computation's idle time is its communication's wasted cycles plus those waits).

A step is the entry's total plus, for each while loop, its body's total times its
``known_trip_count`` (nested loops multiply): the scheduler charges a while
instruction itself next to nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

from xla_streams.simulate.targets import Target
from xla_streams.simulate.textproto import Message, ProtoError, parse_text

# The wrapped estimator's latency for an async pair it cannot price
# (ApproximateLatencyEstimator::kHighLatency, latency_hiding_scheduler.h).
PLACEHOLDER_PAIR_US = 5000.0
# What XLA counts as communication among the scheduler's wasted cycles
# (SchedulerStatistics: fusion_ and call_wasted_cycles are not communication).
COMMUNICATION_WASTE = (
    "all_gather", "all_reduce", "all_to_all", "ragged_all_to_all", "collective_broadcast",
    "collective_permute", "reduce_scatter", "send", "recv",
)  # fmt: skip
# The collectives whose async pairs the estimator prices (opcodes as the dump names
# them: a dedicated start less "-start", or what an async-start's computation wraps).
_PRICED_COLLECTIVES = frozenset(
    {"all-gather", "all-reduce", "collective-permute", "reduce-scatter", "all-to-all",
     "ragged-all-to-all", "collective-broadcast"}
)  # fmt: skip


@dataclass(frozen=True)
class _Inst:
    name: str
    opcode: str
    operands: tuple[int, ...]
    collective: bool  # a start of a collective's async pair (dedicated or wrapped)


class ScheduleError(ValueError):
    """A schedule dump that cannot be read; says which file and why."""


@dataclass(frozen=True)
class ScheduledComputation:
    """One computation the scheduler scheduled, and how often a step runs it."""

    name: str
    total_us: float  # scheduler_statistics.total_cycles, in microseconds
    wasted_us: dict[str, float]  # <kind> -> its <kind>_wasted_cycles, in microseconds
    runs: int  # per step: 1 for the entry, the product of the enclosing trip counts
    # Its instructions' own times (end - start, summed): the rest of total_us is idle,
    # waiting on async pairs. Without placeholders that idle time is exactly the
    # communication's wasted cycles (checked on the embedded programs).
    busy_us: float = 0.0


@dataclass(frozen=True)
class Placeholder:
    """An async pair the estimator could not price, charged the flat placeholder."""

    computation: str
    start: str  # the start instruction's name
    opcode: str
    runs: int  # per step
    collective: bool = False  # a collective it could not price (else an async computation)


@dataclass(frozen=True)
class AsyncSpan:
    """An async collective pair XLA priced, and the time its schedule lets it run: from
    the start of its start to the start of its done, as XLA measures a pair's latency.
    That is at least the latency XLA charged it (equal where the schedule had to wait
    for it)."""

    computation: str
    start: str  # the start instruction's name
    opcode: str
    runs: int  # per step
    span_us: float


@dataclass(frozen=True)
class XlaEstimate:
    """XLA's estimate of one step of one module, from its schedule dump."""

    module: str
    path: str
    computations: tuple[ScheduledComputation, ...]
    placeholders: tuple[Placeholder, ...]
    collectives: tuple[AsyncSpan, ...] = ()  # the async collective pairs it priced

    @property
    def step_us(self) -> float:
        return sum(c.total_us * c.runs for c in self.computations)

    @property
    def exposed_communication_us(self) -> float:
        return sum(
            c.wasted_us.get(kind, 0.0) * c.runs
            for c in self.computations
            for kind in COMMUNICATION_WASTE
        )

    @property
    def priced_step_us(self) -> float:
        """:attr:`step_us` without the waits on placeholders: each computation's own
        instruction times and its communication's wasted cycles, times its runs. (A
        collective charged the placeholder stays in: its wait is communication.)"""
        return sum(
            (c.busy_us + sum(c.wasted_us.get(kind, 0.0) for kind in COMMUNICATION_WASTE)) * c.runs
            for c in self.computations
        )

    @property
    def placeholder_us(self) -> float:
        """The most the placeholders can add to :attr:`step_us` (each charged in full)."""
        return sum(PLACEHOLDER_PAIR_US * p.runs for p in self.placeholders)


def find_schedule(dump_dir: str | os.PathLike[str]) -> Path:
    """The one ``*.schedule.txt`` in ``dump_dir``; ScheduleError if none or several."""
    found = sorted(Path(dump_dir).glob("*.schedule.txt"))
    if len(found) != 1:
        what = "no" if not found else f"{len(found)}"
        raise ScheduleError(
            f"{dump_dir}: {what} *.schedule.txt files: compile with xla_dump_to={dump_dir} and "
            "xla_dump_latency_hiding_schedule=true, one module per folder"
        )
    return found[0]


def read_schedule(path: str | os.PathLike[str]) -> XlaEstimate:
    """XLA's estimate from the schedule dump at ``path`` (ScheduleError if unreadable)."""
    where = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ScheduleError(f"{where}: cannot read the schedule dump: {e}") from None
    return parse_schedule(text, where)


def parse_schedule(text: str, where: str = "<schedule>") -> XlaEstimate:
    """:func:`read_schedule` for the dump's text."""
    try:
        dump = parse_text(text, where)
        return _estimate(dump, where)
    except ProtoError as e:
        raise ScheduleError(str(e)) from None


def _estimate(dump: Message, where: str) -> XlaEstimate:
    module = dump.message("hlo_module")
    if module is None:
        raise ScheduleError(f"{where}: no hlo_module: not a latency-hiding schedule dump")
    if dump.number("cycles_per_microsecond", 1.0) <= 0:
        raise ScheduleError(f"{where}: cycles_per_microsecond must be positive")
    per_us = dump.number("cycles_per_microsecond", 1.0)
    names: dict[int, str] = {}  # computation id -> name
    instructions: dict[int, _Inst] = {}
    callees: dict[int, list[tuple[int, int]]] = {}  # computation -> [(callee, runs per call)]
    computations = module.messages("computations")
    roots = {  # computation id -> its root's opcode (what an async-start wraps)
        comp.integer("id"): inst.string("opcode")
        for comp in computations
        for inst in comp.messages("instructions")
        if inst.integer("id") == comp.integer("root_id")
    }
    for comp in computations:
        comp_id = comp.integer("id")
        names[comp_id] = comp.string("name")
        for inst in comp.messages("instructions"):
            opcode = inst.string("opcode")
            called = inst.integers("called_computation_ids")
            wrapped = roots.get(called[0], "") if opcode == "async-start" and called else ""
            instructions[inst.integer("id")] = _Inst(
                inst.string("name"),
                opcode,
                tuple(inst.integers("operand_ids")),
                collective=(wrapped or opcode.removesuffix("-start")) in _PRICED_COLLECTIVES,
            )
            per_call = _trip_count(inst) if opcode == "while" else 1
            callees.setdefault(comp_id, []).extend((callee, per_call) for callee in called)
    entry = module.integer("entry_computation_id")
    runs = _runs_per_step(entry, callees)
    scheduled = []
    placeholders = []
    spans = []
    for schedule in dump.messages("computation_schedules"):
        comp_id = schedule.integer("computation_id")
        if comp_id not in names:
            raise ScheduleError(
                f"{where}: a schedule names computation {comp_id}, not in the module"
            )
        stats = schedule.message("scheduler_statistics") or Message()
        scheduled.append(
            ScheduledComputation(
                name=names[comp_id],
                total_us=stats.number("total_cycles") / per_us,
                wasted_us={
                    field.removesuffix("_wasted_cycles"): float(value) / per_us
                    for field, value, _ in stats.fields
                    if field.endswith("_wasted_cycles")
                    and field != "total_wasted_cycles"
                    and isinstance(value, int | float)
                },
                runs=runs.get(comp_id, 0),
                busy_us=sum(
                    entry.number("end_timestamp_cycles") - entry.number("start_timestamp_cycles")
                    for entry in schedule.messages("instructions")
                )
                / per_us,
            )
        )
        found, priced = _async_pairs(schedule, instructions, names[comp_id], runs.get(comp_id, 0))
        placeholders += found
        spans += [dataclasses.replace(s, span_us=s.span_us / per_us) for s in priced]
    return XlaEstimate(
        module=module.string("name"),
        path=where,
        computations=tuple(scheduled),
        placeholders=tuple(placeholders),
        collectives=tuple(spans),
    )


def _trip_count(inst: Message) -> int:
    """A while's known trip count from its backend config (1 when XLA does not know it)."""
    try:
        config = json.loads(inst.string("backend_config") or "{}")
        return max(1, int(config["known_trip_count"]["n"]))
    except (ValueError, KeyError, TypeError):
        return 1


def _runs_per_step(entry: int, callees: dict[int, list[tuple[int, int]]]) -> dict[int, int]:
    """How many times a step runs each computation reachable from the entry (a call
    graph is acyclic; a computation called from several places adds up)."""
    runs: dict[int, int] = {}

    def visit(comp: int, times: int, depth: int) -> None:
        if depth > len(callees) + 1:  # a cycle: not a module XLA would have scheduled
            return
        runs[comp] = runs.get(comp, 0) + times
        for callee, per_call in callees.get(comp, ()):
            visit(callee, times * per_call, depth + 1)

    visit(entry, 1, 0)
    return runs


def _async_pairs(
    schedule: Message, instructions: dict[int, _Inst], computation: str, runs: int
) -> tuple[list[Placeholder], list[AsyncSpan]]:
    """The async pairs of one schedule: those the estimator charged the placeholder, and
    the collectives it priced with their spans (in cycles).

    By XLA's rule, an async pair that is no collective (``fusion-start``, ``copy-start``,
    an ``async-start`` around a computation) always is. A collective is when its done
    starts exactly :data:`PLACEHOLDER_PAIR_US` after its start starts: a done waits for
    its pair's latency (counted from the start's own start: an ``all-gather-start``
    that takes a cycle has its done 4,999 cycles after it ends) and no longer when
    nothing else holds it, and no priced collective of a step costs exactly 5 ms.
    """
    starts: dict[int, float] = {}
    out = []
    priced = []
    for entry in schedule.messages("instructions"):
        inst_id = entry.integer("id")
        inst = instructions.get(inst_id)
        if inst is None:
            continue
        if inst.opcode.endswith("-done") and inst.operands and inst.operands[0] in starts:
            start = instructions[inst.operands[0]]
            waited = entry.number("start_timestamp_cycles") - starts[inst.operands[0]]
            if not start.collective or abs(waited - PLACEHOLDER_PAIR_US) < 1e-3:
                out.append(
                    Placeholder(computation, start.name, start.opcode, runs, start.collective)
                )
            else:
                priced.append(AsyncSpan(computation, start.name, start.opcode, runs, waited))
        elif inst.opcode.endswith("-start"):
            starts[inst_id] = entry.number("start_timestamp_cycles")
    return out, priced


# The XLA_FLAGS option that tells XLA's estimator the cluster. XLA reads it once per
# process, from the environment: compile options do not reach it.
ESTIMATOR_OPTIONS_FLAG = "xla_gpu_analytical_latency_estimator_options"


def estimator_options(target: Target) -> str:
    """What to tell XLA's estimator of ``target``'s cluster (``sol_gpu_cost_model.cc``),
    as ``--xla_gpu_analytical_latency_estimator_options`` takes it: ``nic_speed_gbps``
    is the network share of one GPU in GB/s (XLA's ring model gives every GPU of a
    node a NIC of its own), ``gpus_per_node`` and ``partition_size`` the GPUs of a
    host, which is one NVLink domain. Without it XLA assumes 25 GB/s on H100 and
    charges a cross-host collective whose partition it cannot tell a flat 5 ms."""
    return (
        f"nic_speed_gbps={target.network_bandwidth / 1e9:g},"
        f"gpus_per_node={target.devices_per_host},partition_size={target.devices_per_host}"
    )
