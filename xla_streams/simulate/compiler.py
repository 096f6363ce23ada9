"""A module compiled once for the replay: each computation's steps (compute kernels
priced by the cost model or measured by a profile, the collectives it issues and waits
for, async kernels on side compute streams, loops), and the collectives' costs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from xla_streams.collectives import COLLECTIVE_OPCODES, StreamModel, device_groups
from xla_streams.hlo import Computation, Instruction, Module
from xla_streams.hlo.attributes import decode, parse_backend_config
from xla_streams.simulate.cost import CollectiveCost, CostModel
from xla_streams.simulate.errors import TABLE_SMOOTH_BYTES, ErrorScale
from xla_streams.simulate.execution_streams import execution_streams
from xla_streams.simulate.network import CollectiveSpec
from xla_streams.simulate.profile import MeasuredCosts
from xla_streams.simulate.targets import Target
from xla_streams.simulate.timeline import SIDE_COMPUTE_LANE
from xla_streams.streams import AsyncPair, find_async_pairs

# Step tags. A compute step is (COMPUTE, seconds, name, kind, bytes, flops, seconds of it
# measured, kernels), ``kernels`` its kernels' (seconds, matrix seconds, memory
# seconds), one or those folded into it (``_merge``): what in-flight collectives slow.
# START/DONE issue and wait for an async pair, SYNC runs a collective and waits for it,
# FIRE issues a send or recv whose done is elsewhere, WHILE is (WHILE, name, condition,
# body, trip count, known), SIDE_START/SIDE_DONE start and wait for an async kernel on a
# side compute stream.
COMPUTE, START, DONE, SYNC, FIRE, WHILE, SIDE_START, SIDE_DONE = range(8)

Step = tuple[Any, ...]
Progress = Callable[[str], None]


@dataclass
class CompiledComputation:
    """A computation compiled for the replay: its steps, and its time with nothing
    overlapped."""

    steps: list[Step]
    serial: float  # time with nothing overlapped: compute plus standalone collectives

    @property
    def compute_only(self) -> bool:
        """True when running it never touches a collective (its time is fixed)."""
        return all(step[0] == COMPUTE for step in self.steps)


class CompiledModule:
    """A module compiled for the replay: its pairs, the collectives it issues (``specs``),
    and the entry computation's steps."""

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
        cost: CostModel | None = None,
    ) -> None:
        """``pairs`` as ``find-async-pairs`` found them, or found here under ``model``
        (default: the safe assumption, see :class:`StreamModel`). ``measured``: the
        program's own measured costs (``profile.load_profile(path).for_module(module)``),
        which replace the model's for the instructions they name. ``errors``: factors
        on the model's costs (``errors.py``; the ranges of ``ranges.predict_range``).
        ``cost``: the cost model of another compile of ``module`` for ``target``, whose
        prices this one reuses."""
        if cost is not None and (cost.module is not module or cost.target is not target):
            raise ValueError("a cost model is shared only by compiles of its module and target")
        self.module = module
        self.target = target
        self.cost = cost if cost is not None else CostModel(module, target)
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
        self._programs: dict[str, CompiledComputation] = {}
        self._merged: dict[int, list[Step]] = {}
        self._compiling: set[str] = set()
        self._host_transfers: set[str] = set()
        self.entry = self._compile(module.entry)
        # The entry with consecutive compute steps folded, for replays that draw nothing.
        self.merged_entry = self._merge(self.entry.steps)
        collectives = sum(1 for s in self.specs if not s.side)
        tabled = sum(1 for spec in self.specs if spec.cost.measured and not spec.profiled)
        if tabled:
            self.notes.append(
                f"{tabled} of {collectives} collectives priced "
                f"from XLA's measured table ({target.perf_table_key})"
            )
        swept = sum(
            1 for spec in self.specs if spec.cost.protocol == "nccl-tests" and not spec.profiled
        )
        if swept:
            self.notes.append(
                f"{swept} of {collectives} collectives priced from the nccl-tests run of "
                f"{target.name}'s network, by the bytes each puts through a NIC"
            )
        if self._host_transfers:
            self.notes.append(
                f"{len(self._host_transfers)} send/recv with the host (is_host_transfer=true) "
                "not priced: a copy over PCIe to or from the host, no device collective"
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

    def _compile(self, comp: Computation) -> CompiledComputation:
        program = self._programs.get(comp.name)
        if program is not None:
            return program
        if comp.name in self._compiling:
            raise RuntimeError(f"computation '{comp.name}' calls itself")
        self._compiling.add(comp.name)
        steps: list[Step] = []
        serial = 0.0
        cost_of = self.cost.instruction
        for position, inst in enumerate(comp.instructions):
            name = inst.name
            opcode = inst.opcode
            pair_index = self._pair_of_start.get((comp.name, name))
            if pair_index is not None:
                on_compute = self.pairs[pair_index].lane == "compute"
                steps.append((SYNC if on_compute else START, pair_index))
                serial += self.specs[pair_index].cost.seconds
                continue
            pair_index = self._pair_of_done.get((comp.name, name))
            if pair_index is not None:
                if self.pairs[pair_index].lane != "compute":
                    steps.append((DONE, pair_index))
                continue
            if opcode in ("fusion-done", "async-done"):
                side = self._side_done(inst)
                if side is not None:
                    steps.append((SIDE_DONE, side))
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
                        measured = sum(s[6] for s in program.steps if s[0] == COMPUTE)
                        self.specs[side] = dataclasses.replace(
                            spec, profiled=0 < program.serial <= measured
                        )
                else:
                    cost = cost_of(inst)
                    side = self._add_side(inst, cost.seconds, cost.kind, cost.bytes)
                lane = SIDE_COMPUTE_LANE - self._side_stream(name)
                steps.append((SIDE_START, side, lane))
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
            elif opcode in ("send", "recv") and inst.attribute("is_host_transfer") == "true":
                self._host_transfers.add(name)  # no device collective: not priced
            elif opcode in ("send", "recv"):
                # Unpaired: pipelined from an earlier iteration; its done is elsewhere.
                index = self._add_spec(inst, opcode)
                steps.append((FIRE, index))
            elif opcode in ("send-done", "recv-done"):
                continue
            elif opcode in COLLECTIVE_OPCODES:
                index = self._add_spec(inst, opcode, at=(comp.name, position))
                steps.append((SYNC, index))
                serial += self.specs[index].cost.seconds
            else:
                cost = cost_of(inst)
                if cost.seconds > 0:
                    seconds, measured = self._kernel(name, cost.seconds, cost.error)
                    scale = seconds / cost.seconds  # the profile's or the errors' factor
                    parts = (seconds, cost.matrix_seconds * scale, cost.memory_seconds * scale)
                    steps.append(
                        (COMPUTE, seconds, name, cost.kind, cost.bytes, cost.flops, measured,
                         (parts,))
                    )  # fmt: skip
                    serial += seconds
        self._compiling.discard(comp.name)
        program = CompiledComputation(steps, serial)
        self._programs[comp.name] = program
        return program

    def _add_spec(self, inst: Instruction, kind: str, at: tuple[str, int] | None = None) -> int:
        groups = device_groups(self.module, inst, kind)
        size = max(sum(s.byte_size for s in inst.operand_shapes), inst.shape.byte_size)
        cost, profiled = self._collective(
            inst.name, self.cost.collective_of(inst, kind, groups, size), size
        )
        self.specs.append(CollectiveSpec(inst.name, kind, size, cost, profiled=profiled, at=at))
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

    def _callee_program(self, inst: Instruction) -> CompiledComputation | None:
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
        return (WHILE, inst.name, self._compile(cond), self._compile(body), trip, known)

    def _merge(self, steps: list[Step]) -> list[Step]:
        """Consecutive compute steps folded into one, for replays that draw nothing."""
        key = id(steps)
        cached = self._merged.get(key)
        if cached is not None:
            return cached
        merged: list[Step] = []
        pending = pending_measured = 0.0
        kernels: list[tuple[float, float, float]] = []
        for step in steps:
            if step[0] == COMPUTE:
                pending += step[1]
                pending_measured += step[6]
                kernels.extend(step[7])
                continue
            if pending:
                merged.append((COMPUTE, pending, "", "", 0, 0.0, pending_measured, tuple(kernels)))
                pending = pending_measured = 0.0
                kernels = []
            if step[0] == WHILE:
                cond, body = step[2], step[3]
                step = (
                    WHILE, step[1],
                    CompiledComputation(self._merge(cond.steps), cond.serial),
                    CompiledComputation(self._merge(body.steps), body.serial),
                    step[4], step[5],
                )  # fmt: skip
            merged.append(step)
        if pending:
            merged.append((COMPUTE, pending, "", "", 0, 0.0, pending_measured, tuple(kernels)))
        self._merged[key] = merged
        return merged

    def kernels(self) -> dict[str, tuple[str, float]]:
        """Each compute instruction the replay charges (not collectives, not control
        flow; async kernels on side streams included): its name -> (cost class,
        seconds of one execution)."""
        found: dict[str, tuple[str, float]] = {}
        for program in self._programs.values():
            for step in program.steps:
                if step[0] == COMPUTE:
                    found[step[2]] = (step[3], step[1])
                elif step[0] == SIDE_START:
                    spec = self.specs[step[1]]
                    found[spec.name] = (spec.kind, spec.cost.seconds)
        return found

    def serial_time(self) -> float:
        """Everything one after another: compute plus every collective standalone, but a
        send or recv whose done is elsewhere (pipelined from an earlier iteration), which
        no step waits for here, as the replay lets it drain without extending the step."""
        return self.entry.serial


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
