"""The cost model: a predicted time for every scheduled instruction and collective.

Compute (one GPU, on the compute stream):

- a matmul kernel (``dot``, ``convolution``, a fusion whose called computations
  contain one, e.g. ``kind=kCustom`` Triton gemm fusions, or a cuBLAS/cuDNN
  ``custom-call``) takes the roofline time
  ``max(flops / matrix_rate, bytes / memory_bandwidth) + kernel_overhead``;
- any other kernel (fusions, copies, unfused elementwise ops) is memory bound:
  ``bytes / memory_bandwidth + kernel_overhead``, where ``bytes`` is what it reads
  (all operands) plus what it writes (its shape);
- instructions that launch nothing (``parameter``, ``get-tuple-element``,
  ``tuple``, ``bitcast``, ``constant`` ...) take no time.

``matrix_rate`` and ``memory_bandwidth`` are the target's peaks times its
efficiency factors (``targets.py``); FLOPs of a dot are ``2 * (output elements) *
(product of the contracting dimensions)``, of a convolution ``2 * (output
elements) * (kernel elements / output features)``.

Collectives (alpha-beta, per algorithm and NCCL protocol, as NCCL's own tuner
models them): ``n`` devices in the largest replica group, ``h`` hosts it spans
(``devices_per_host`` per host), ``S`` the buffer size (``AsyncPair.bytes``: the
larger of what goes in and what comes out), ``B`` the achievable bandwidth of
the bottleneck link class (NVLink when the group sits inside one host, else the
network) times the protocol's ``bandwidth_fraction``, and per protocol ``base``
(ring or tree) and the per-step latencies ``a_nv``/``a_net`` of the algorithm:

- all-reduce, ring: ``base + (2(n-1) - 2(h-1)) a_nv + 2(h-1) a_net`` and
  ``2 (n-1)/n S`` bytes on the wire;
  tree (double binary tree across hosts, chains inside): ``base +
  2 ((n/h - 1) a_nv + ceil(log2 h) a_net)`` and ``2 S`` bytes.
- all-gather, reduce-scatter, ring: ``base + ((n-1) - (h-1)) a_nv + (h-1) a_net``
  and ``(n-1)/n S`` bytes.
- all-to-all, ragged-all-to-all, pairwise exchange: ``base + (n/h - 1) a_nv
  + (n - n/h) a_net`` and ``(n-1)/n S`` bytes.
- collective-broadcast, pipelined ring: the all-gather latency and ``S`` bytes.
- collective-permute, send, recv, one hop: ``base + a`` (``a_net`` when a pair
  crosses hosts) and ``S`` bytes.

Of all (algorithm, protocol) candidates the one with the smallest standalone
time is used, as NCCL's tuner picks: small buffers get LL (and, over many hosts,
the tree), large ones Simple rings. A group of one device is a local copy.

Simplifications: a kernel reads each operand whole (an in-place
``dynamic-update-slice`` fusion is charged for its whole buffer); one
bottleneck link class per collective (a ring across hosts moves all its bytes
at network speed); the host of device ``d`` is ``d // devices_per_host``.

A collective's standalone time is ``latency + wire_bytes / B``; the simulator
runs the latency unshared and the wire bytes through bandwidth shared with
other collectives on the same links.

A calibrated target (``calibration.py``) multiplies each kernel's time by its
class's measured ratio, and a collective's latency and transfer time by its
kind's.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from functools import cached_property

from xla_streams.collectives import KINDS, AsyncPair
from xla_streams.hlo import Computation, Instruction, Module
from xla_streams.hlo.attributes import decode, parse_backend_config, parse_int_list
from xla_streams.hlo.shape import Shape
from xla_streams.simulate.targets import Target

# Instructions that launch no kernel.
FREE_OPCODES = frozenset(
    {
        "parameter",
        "constant",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "after-all",
        "add-dependency",
        "opt-barrier",
        "domain",
        "async-update",
        "partition-id",
        "replica-id",
        # Their work is counted at the matching start.
        "copy-done",
        "async-done",
    }
)
# Kernels that multiply matrices when they are custom calls.
GEMM_CUSTOM_CALL_PREFIXES = ("__cublas$", "__cudnn$", "__triton_gemm")
CONV_OPCODES = frozenset({"convolution"})
_CUSTOM_CALL_TARGET = re.compile(r'"([^"]*)"')
# ``calls=%name`` read straight from the line: decoding every attribute of every
# fusion (long backend_config JSON) would dominate the cost model's time.
_CALLS = re.compile(r", calls=%?([^\s,{}()]+)")


@dataclass(frozen=True)
class OpCost:
    """The predicted time of one compute instruction and what it is made of."""

    seconds: float
    kind: str  # "matmul", "memory" or "free"
    flops: float = 0.0
    bytes: int = 0


FREE = OpCost(0.0, "free")


@dataclass(frozen=True)
class CollectiveCost:
    """One collective: an unshared latency, then ``wire_bytes`` at up to ``bandwidth``."""

    algorithm: str
    protocol: str
    latency: float
    wire_bytes: float
    bandwidth: float
    network: bool
    devices: tuple[int, ...]

    @property
    def seconds(self) -> float:
        """Standalone time: nothing else on its links."""
        transfer = self.wire_bytes / self.bandwidth if self.bandwidth > 0 else 0.0
        return self.latency + transfer

    @cached_property
    def resources(self) -> tuple[int, ...]:
        """The links it occupies: one per device and link class (NVLink or network)."""
        return tuple(2 * d + int(self.network) for d in self.devices)


class CostModel:
    """Costs of the instructions and collectives of one module on one target."""

    def __init__(self, module: Module, target: Target) -> None:
        self.module = module
        self.target = target
        self._flops_of_computation: dict[str, tuple[float, str]] = {}
        # Module.computation() rebuilds its index on every call; keep one.
        self.computations: dict[str, Computation] = {c.name: c for c in module.computations}

    # -- compute -------------------------------------------------------------------

    def instruction(self, inst: Instruction) -> OpCost:
        """Time of a compute instruction (control flow and collectives: see the simulator)."""
        opcode = inst.opcode
        if opcode in FREE_OPCODES:
            return FREE
        flops, element_type = 0.0, ""
        if opcode == "fusion":
            flops, element_type = self._called_flops(inst, "calls")
        elif opcode == "dot" or opcode in CONV_OPCODES:
            flops, element_type = self._matmul_flops(inst)
        elif opcode == "custom-call":
            flops, element_type = self._custom_call_flops(inst)
        nbytes = self._bytes(inst)
        target = self.target
        memory_time = nbytes / target.achievable_memory_bandwidth
        if flops > 0:
            compute_time = flops / target.matrix_rate(element_type)
            seconds = max(compute_time, memory_time) + target.kernel_overhead
            return OpCost(seconds * target.time_ratio("matmul"), "matmul", flops, nbytes)
        seconds = memory_time + target.kernel_overhead
        return OpCost(seconds * target.time_ratio("memory"), "memory", 0.0, nbytes)

    def _bytes(self, inst: Instruction) -> int:
        return inst.shape.byte_size + sum(shape.byte_size for shape in inst.operand_shapes)

    def _called_flops(self, inst: Instruction, key: str) -> tuple[float, str]:
        if key == "calls":
            m = _CALLS.search(inst.text)
            if m is not None and m.group(1) in self.computations:
                return self.computation_flops(self.computations[m.group(1)])
        name = inst.attribute(key)
        if name is None:
            return 0.0, ""
        comp = self.computations.get(name.strip().lstrip("%"))
        if comp is None:
            raise inst.error_at_attribute(key, 0, f"unknown computation '{name}'")
        return self.computation_flops(comp)

    def computation_flops(self, comp: Computation) -> tuple[float, str]:
        """Matmul FLOPs of a fused computation (nested fusions included) and the
        element type of its largest dot."""
        cached = self._flops_of_computation.get(comp.name)
        if cached is not None:
            return cached
        self._flops_of_computation[comp.name] = (0.0, "")  # guards against cycles
        total, best, best_type = 0.0, 0.0, ""
        for inst in comp.instructions:
            opcode = inst.opcode
            if opcode == "dot" or opcode in CONV_OPCODES:
                flops, element_type = self._matmul_flops(inst)
            elif opcode == "custom-call":
                flops, element_type = self._custom_call_flops(inst)
            elif opcode in ("fusion", "call"):
                flops, element_type = self._called_flops(
                    inst, "calls" if opcode == "fusion" else "to_apply"
                )
            else:
                continue
            total += flops
            if flops > best:
                best, best_type = flops, element_type
        result = (total, best_type)
        self._flops_of_computation[comp.name] = result
        return result

    def _matmul_flops(self, inst: Instruction) -> tuple[float, str]:
        operands = inst.operand_shapes
        if len(operands) < 2:
            return 0.0, ""
        lhs, rhs = operands[0], operands[1]
        out = _first_array(inst.shape)
        element_type = lhs.element_type or ""
        if inst.opcode == "dot":
            dims = decode(inst, "lhs_contracting_dims", parse_int_list) or ()
            contracted = math.prod(lhs.dimensions[d] for d in dims if d < len(lhs.dimensions))
            return 2.0 * _elements(out) * contracted, element_type
        return _conv_flops(inst, rhs, out), element_type

    def _custom_call_flops(self, inst: Instruction) -> tuple[float, str]:
        raw = inst.attribute("custom_call_target") or ""
        m = _CUSTOM_CALL_TARGET.fullmatch(raw)
        target = m.group(1) if m else raw
        if not target.startswith(GEMM_CUSTOM_CALL_PREFIXES):
            return 0.0, ""
        operands = inst.operand_shapes
        if len(operands) < 2:
            return 0.0, ""
        lhs, rhs = operands[0], operands[1]
        out = _first_array(inst.shape)
        element_type = lhs.element_type or ""
        if "conv" in target:
            return _conv_flops(inst, rhs, out), element_type
        config = decode(inst, "backend_config", parse_backend_config) or {}
        gemm = config.get("gemm_backend_config", config)
        numbers = gemm.get("dot_dimension_numbers", {}) if isinstance(gemm, dict) else {}
        dims = numbers.get("lhs_contracting_dimensions") if isinstance(numbers, dict) else None
        if isinstance(dims, list) and dims:
            contracted = math.prod(
                lhs.dimensions[int(d)] for d in dims if int(d) < len(lhs.dimensions)
            )
        else:
            # No dimension numbers: assume an unbatched (M,K)x(K,N) product.
            contracted = round(math.sqrt(_elements(lhs) * _elements(rhs) / max(_elements(out), 1)))
        return 2.0 * _elements(out) * contracted, element_type

    # -- collectives ---------------------------------------------------------------

    def collective(self, pair: AsyncPair) -> CollectiveCost:
        return collective_cost(pair.kind, pair.groups, pair.bytes, self.target)


def collective_cost(
    kind: str, groups: tuple[tuple[int, ...], ...], size: int, target: Target
) -> CollectiveCost:
    """The alpha-beta cost of one collective (see the module docstring for the formulas),
    times the target's calibration ratio for ``kind``."""
    cost = _model_cost(kind, groups, size, target)
    ratio = target.time_ratio(kind)
    if ratio == 1.0:
        return cost
    # Latency and transfer scale together, so the standalone time scales by the ratio
    # and bandwidth sharing keeps its meaning.
    return dataclasses.replace(cost, latency=cost.latency * ratio, bandwidth=cost.bandwidth / ratio)


def _model_cost(
    kind: str, groups: tuple[tuple[int, ...], ...], size: int, target: Target
) -> CollectiveCost:
    devices = tuple(sorted({d for g in groups for d in g}))
    n = max((len(g) for g in groups), default=1)
    per_host = target.devices_per_host
    h = max((len({d // per_host for d in g}) for g in groups), default=1)
    network = h > 1
    link = target.link_bandwidth(network)
    if n <= 1:
        # Nothing crosses a link: a local copy (read and write the buffer).
        latency = target.kernel_overhead + 2 * size / target.achievable_memory_bandwidth
        return CollectiveCost("local", "none", latency, 0.0, link, False, devices)
    if kind not in KINDS:
        raise ValueError(f"no cost model for collective kind '{kind}'")
    family = KINDS[kind].cost
    best: CollectiveCost | None = None
    for name, p in target.protocols.items():
        bandwidth = link * p.bandwidth_fraction
        a_nv, a_net = p.ring_step_latency(False), p.ring_step_latency(True)
        candidates: list[CollectiveCost] = []
        if family == "all-reduce":
            steps, inter = 2 * (n - 1), 2 * (h - 1)
            ring_latency = p.ring_base_latency + (steps - inter) * a_nv + inter * a_net
            tree_latency = p.tree_base_latency + 2 * (
                (n / h - 1) * p.tree_step_latency(False)
                + math.ceil(math.log2(h)) * p.tree_step_latency(True)
            )
            candidates.append(
                CollectiveCost(
                    "ring", name, ring_latency, 2 * (n - 1) / n * size, bandwidth, network, devices
                )
            )
            candidates.append(
                CollectiveCost("tree", name, tree_latency, 2.0 * size, bandwidth, network, devices)
            )
        elif family in ("ring", "broadcast"):
            latency = p.ring_base_latency + ((n - 1) - (h - 1)) * a_nv + (h - 1) * a_net
            wire = float(size) if family == "broadcast" else (n - 1) / n * size
            candidates.append(
                CollectiveCost("ring", name, latency, wire, bandwidth, network, devices)
            )
        elif family == "pairwise":
            local = n / h
            latency = p.ring_base_latency + (local - 1) * a_nv + (n - local) * a_net
            candidates.append(
                CollectiveCost(
                    "pairwise", name, latency, (n - 1) / n * size, bandwidth, network, devices
                )
            )
        else:
            latency = p.ring_base_latency + (a_net if network else a_nv)
            candidates.append(
                CollectiveCost("one-hop", name, latency, float(size), bandwidth, network, devices)
            )
        for c in candidates:
            if best is None or c.seconds < best.seconds:
                best = c
    assert best is not None  # targets always have a protocol
    return best


def _conv_flops(inst: Instruction, rhs: Shape, out: Shape) -> float:
    """2 * output elements * (kernel elements per output feature)."""
    labels = inst.attribute("dim_labels") or ""
    parts = labels.split("_")
    out_features = 0
    if len(parts) == 2 and "->" in parts[1]:
        kernel_labels = parts[1].split("->")[0]
        if "o" in kernel_labels and len(kernel_labels) == len(rhs.dimensions):
            out_features = rhs.dimensions[kernel_labels.index("o")]
    if out_features <= 0:
        out_features = rhs.dimensions[-1] if rhs.dimensions else 1
    return 2.0 * _elements(out) * _elements(rhs) / max(out_features, 1)


def _first_array(shape: Shape) -> Shape:
    leaves = shape.leaves()
    return leaves[0] if leaves else shape


def _elements(shape: Shape) -> int:
    return math.prod(shape.dimensions) if shape.element_type is not None else 0
