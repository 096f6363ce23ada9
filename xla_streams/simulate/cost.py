"""The cost model: a predicted time for every scheduled instruction and collective.

Compute (one GPU, on the compute stream):

- a GEMM (a ``dot``, a GEMM fusion: a fusion whose computation holds one ``dot``,
  as XLA's Triton ``__triton_gemm``/``gemm_fusion_*`` fusions do, or a cuBLAS
  ``__cublas$gemm``/``__cublas$lt$matmul`` custom call) takes the time XLA
  measured for its shape, from XLA's matmul table as XLA's own
  ``MatmulInterpolator`` looks it up (``matmul.py``), at the rate the GPU holds
  under a training step's power (``Target.sustained_matrix_fraction``: the table
  was measured in bursts at the boost clock); XLA itself reads the table
  for dots, Triton GEMM fusions and cuBLASLt calls only, the legacy cuBLAS call is
  the same GEMM; a table rate above the GPU's dense peak is no measurement
  (``Target.gemm_seconds``);
- a cuDNN fused-attention call (``__cudnn$fmha*``, forward or backward) takes the
  time NVIDIA measured for cuDNN flash attention of its shape and mask
  (``attention.py``), held as a GEMM is;
- both at least the memory-bound time below (a GEMM fusion may read more than its
  GEMM: a fused prologue);
- a matmul kernel without measurements (a target without XLA's tables: A100,
  GB200's GEMMs; a ``convolution``; a fusion of several dots; other cuBLAS/cuDNN
  calls) takes the roofline time
  ``max(flops / matrix_rate, bytes / memory_bandwidth) + kernel_overhead``
  (an attention call's FLOPs counted as ``attention.py`` counts them);
- any other kernel (fusions, copies, unfused elementwise ops) is memory bound:
  ``bytes / memory_bandwidth + kernel_overhead``, where ``bytes`` is what it reads
  plus what it writes;
- instructions that launch nothing (``parameter``, ``get-tuple-element``,
  ``tuple``, ``bitcast``, ``constant`` ...) take no time.

Bytes are what the kernel touches, as XLA's own cost analysis counts them
(``HloCostAnalysis``/``GpuHloCostAnalysis``: operand *utilization*):

- a fusion reads each parameter in the fraction its fused computation uses: a
  ``dynamic-slice`` or ``slice`` reads its slice of its operand (so a loop body
  that takes layer ``i`` of stacked weights reads one layer, not the stack), a
  ``gather`` what it gathers; the fraction flows back from the root through
  every other instruction unchanged (capped at the whole parameter);
- an in-place ``dynamic-update-slice``, the root of a fusion or an element of
  its root tuple (or a bitcast of one), writes the update and reads none of the
  buffer it updates: XLA runs it in place (``CanEmitDynamicUpdateSliceInPlace``)
  and its cost analysis counts the update slice (``HandleFusion`` via
  ``FusionProcessOutputBytesAccessed``). Outside a fusion it moves ``2 x update``
  (``HandleDynamicUpdateSlice``); a plain ``dynamic-slice``/``slice``/``gather``
  reads and writes its output;
- everything else writes its shape.

An async fusion (``fusion-start``/``fusion-done``, dynamic-slice and
dynamic-update-slice copies XLA wraps with ``DynamicSliceCopyFusionAsyncWrapper``
to run on a side compute stream) is one kernel: priced here once, at its start,
from the fusion it calls; the simulator runs it off the main compute stream.

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

Across hosts, ``B`` depends on how many of the group's GPUs, ``m``, share a host
(each with its NIC, as in DGX/HGX hosts; ``m`` counted on the group's emptiest
host), because NCCL lays a ring through a host's GPUs in turn and spreads its
channels over their NICs: a ring crosses each host boundary once per channel, so a
GPU sends ``1/m`` of its ring bytes through its NIC and the rest over NVLink. So
``B = min(m B_net, B_nvlink m/(m-1))`` for rings: 8 GPUs a host give 8 x 47 = 376
GB/s (nccl-tests: 4 x 8 H100 all-reduce busbw 320 GB/s over RoCE, NVIDIA/nccl#1221;
"approximately 380 GB/s" multi-node, sjeaugey in NVIDIA/nccl#1649; 192 GB/s for
DGX A100's 8 x 200 Gb/s, AddyLaddy in NVIDIA/nccl#1576), one GPU a host one NIC's
47 GB/s. A tree moves its ``2 S`` through the host's ``m`` NICs and along an NVLink
chain: ``B = min(m B_net, B_nvlink)``. An all-to-all sends the ``(n-m)/n S`` bound
for other hosts through each GPU's own NIC and ``(m-1)/n S`` over NVLink, whichever
takes longer.

Of all (algorithm, protocol) candidates the one with the smallest standalone
time is used, as NCCL's tuner picks: small buffers get LL (and, over many hosts,
the tree), large ones Simple rings. A group of one device is a local copy.

Measured collectives: where the target has XLA's measured table
(``Target.perf_table_key``, ``measured.py``) and it covers the collective (one
host, a kind and group size it measured), the standalone time is XLA's own
estimate from the table instead (below the table's smallest size, 1 KiB, that
size's time: a smaller message is no faster). It keeps the model's latency (at
most the measured time) and moves its wire bytes in the rest of the measured
time, so concurrent collectives still share link bandwidth. A collective across
hosts on a target with an nccl-tests run of its network (``network_nccl_tests``,
``nccl_tests.py``) takes the time that run measured for as many bytes through each
GPU's NIC (the wire bytes at the NIC's rate over the model's link rate, the
protocol's overhead left out), with its own latency in place of the run's, the same
way. Elsewhere (other collectives across hosts, A100) the alpha-beta model stands.

Simplifications: one bottleneck link class per collective (a collective across
hosts shares the NICs' bandwidth with other collectives, not NVLink's); the host of
device ``d`` is ``d // devices_per_host``; every GPU has a NIC of its own.

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
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from xla_streams.collectives import KINDS
from xla_streams.hlo import Computation, Instruction, Module
from xla_streams.hlo.attributes import decode, parse_backend_config, parse_int_list
from xla_streams.hlo.shape import Shape
from xla_streams.simulate import nccl
from xla_streams.simulate.attention import attention_call
from xla_streams.simulate.matmul import GemmShape, gemm_shape, gemm_shape_of_call
from xla_streams.simulate.measured import MIN_BYTES
from xla_streams.simulate.targets import Target
from xla_streams.streams import AsyncPair

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
        "fusion-done",
        "fusion-update",
    }
)
# Async fusions: the start launches the kernel (on a side compute stream).
ASYNC_FUSION_START = "fusion-start"
# Ops that read only a part of their first operand: the fraction is their output's.
_SLICING = frozenset({"dynamic-slice", "slice", "gather"})
_DUS = "dynamic-update-slice"
# Kernels that multiply matrices when they are custom calls.
GEMM_CUSTOM_CALL_PREFIXES = ("__cublas$", "__cudnn$", "__triton_gemm")
# cuBLAS GEMM calls (xla/service/gpu/cublas_cudnn.cc): XLA's matmul table prices them.
CUBLAS_GEMM_TARGETS = frozenset({"__cublas$gemm", "__cublas$lt$matmul", "__cublas$lt$matmul$f8"})
CONV_OPCODES = frozenset({"convolution"})
_CUSTOM_CALL_TARGET = re.compile(r'"([^"]*)"')
# ``calls=%name`` read straight from the line: decoding every attribute of every
# fusion (long backend_config JSON) would dominate the cost model's time.
_CALLS = re.compile(r", calls=%?([^\s,{}()]+)")


@dataclass(frozen=True)
class OpCost:
    """The predicted time of one compute instruction and what it is made of.
    ``error``: the name of the error bound its time carries (``errors.py``): ``matmul``
    (the roofline), ``matmul_table`` (XLA's GEMM measurements), ``attention``
    (published attention measurements) or ``memory``."""

    seconds: float
    kind: str  # "matmul", "memory" or "free"
    flops: float = 0.0
    bytes: int = 0
    error: str = ""
    # The part of ``seconds`` the matrix units bound and the part HBM bounds (each
    # alone; the kernel takes the larger, plus its overhead): what in-flight
    # collectives slow (interference.py).
    matrix_seconds: float = 0.0
    memory_seconds: float = 0.0


FREE = OpCost(0.0, "free")


@dataclass(frozen=True)
class CollectiveCost:
    """One collective: an unshared latency, then ``wire_bytes`` at up to ``bandwidth``.
    ``measured``: its standalone time is XLA's measured one (``measured.py``). ``sms``:
    the SMs its NCCL kernel holds while it runs, ``hbm_per_byte`` the HBM bytes it moves
    per wire byte (``nccl.py``)."""

    algorithm: str
    protocol: str
    latency: float
    wire_bytes: float
    bandwidth: float
    network: bool
    devices: tuple[int, ...]
    measured: bool = False
    sms: int = 0
    hbm_per_byte: float = 0.0

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
    """Costs of the instructions and collectives of one module on one target, each
    priced once: the simulators of a prediction's range share one (``errors.py`` scales
    the costs, it does not change them)."""

    def __init__(self, module: Module, target: Target) -> None:
        self.module = module
        self.target = target
        self._instructions: dict[Instruction, OpCost] = {}
        self._callees: dict[Instruction, Computation | None] = {}  # _fused's answers
        # By (kind, groups, bytes, element type): a layer's collectives recur in every layer.
        self._collectives: dict[
            tuple[str, tuple[tuple[int, ...], ...], int, str | None], CollectiveCost
        ] = {}
        self._flops_of_computation: dict[str, tuple[float, str]] = {}
        # fused computation -> (fraction read of each parameter, bytes written)
        self._fused_io: dict[str, tuple[dict[int, float], int]] = {}
        # Module.computation() rebuilds its index on every call; keep one.
        self.computations: dict[str, Computation] = {c.name: c for c in module.computations}

    # -- compute -------------------------------------------------------------------

    def instruction(self, inst: Instruction) -> OpCost:
        """Time of a compute instruction (control flow and collectives: see the simulator)."""
        cost = self._instructions.get(inst)
        if cost is None:
            cost = self._instructions[inst] = self._price(inst)
        return cost

    def _price(self, inst: Instruction) -> OpCost:
        opcode = inst.opcode
        if opcode in FREE_OPCODES:
            return FREE
        nbytes = self._bytes(inst)
        target = self.target
        memory_time = nbytes / target.achievable_memory_bandwidth
        measured = self._measured(inst)
        if measured is not None:
            seconds, flops, error = measured
            held = seconds / target.sustained_matrix_fraction  # burst measurements, held rate
            seconds = max(held, memory_time + target.kernel_overhead)
            ratio = target.time_ratio("matmul")
            return OpCost(
                seconds * ratio, "matmul", flops, nbytes, error, held * ratio, memory_time * ratio
            )
        flops, element_type = 0.0, ""
        if opcode in ("fusion", ASYNC_FUSION_START):
            flops, element_type = self._called_flops(inst, "calls")
        elif opcode == "dot" or opcode in CONV_OPCODES:
            flops, element_type = self._matmul_flops(inst)
        elif opcode == "custom-call":
            flops, element_type = self._custom_call_flops(inst)
        if flops > 0:
            compute_time = flops / target.matrix_rate(element_type)
            seconds = max(compute_time, memory_time) + target.kernel_overhead
            ratio = target.time_ratio("matmul")
            return OpCost(
                seconds * ratio, "matmul", flops, nbytes, "matmul", compute_time * ratio,
                memory_time * ratio,
            )  # fmt: skip
        seconds = memory_time + target.kernel_overhead
        ratio = target.time_ratio("memory")
        return OpCost(seconds * ratio, "memory", 0.0, nbytes, "memory", 0.0, memory_time * ratio)

    def _measured(self, inst: Instruction) -> tuple[float, float, str] | None:
        """(seconds, FLOPs, error bound) of a GEMM or attention kernel from the
        target's measurements; None where it has none for ``inst``."""
        opcode = inst.opcode
        if opcode == "custom-call":
            call_target = _custom_call_target(inst)
            call = attention_call(inst)
            if call is not None:
                seconds = self.target.attention_seconds(call)
                return None if seconds is None else (seconds, call.flops, "attention")
            if call_target not in CUBLAS_GEMM_TARGETS:
                return None
            gemm = gemm_shape_of_call(inst, _dot_numbers(inst))
        elif opcode == "dot":
            gemm = gemm_shape(inst, _first_array(inst.shape))
        elif opcode == "fusion":
            gemm = self._gemm_fusion(inst)
        else:
            return None
        seconds = self.target.gemm_seconds(gemm) if gemm is not None else None
        return None if seconds is None or gemm is None else (seconds, gemm.flops, "matmul_table")

    def _gemm_fusion(self, inst: Instruction) -> GemmShape | None:
        """A GEMM fusion's key (XLA's ``IsTritonGemm``: one ``dot`` in its computation,
        typed with the fusion's output)."""
        comp = self._fused(inst)
        if comp is None:
            return None
        dots = [i for i in comp.instructions if i.opcode == "dot"]
        return gemm_shape(dots[0], _first_array(inst.shape)) if len(dots) == 1 else None

    def _bytes(self, inst: Instruction) -> int:
        """What the kernel reads and writes (see the module docstring)."""
        opcode = inst.opcode
        if opcode in ("fusion", ASYNC_FUSION_START):
            comp = self._fused(inst)
            if comp is not None:
                fractions, written = self.fused_io(comp)
                read = sum(
                    shape.byte_size * fractions.get(k, 1.0)
                    for k, shape in enumerate(inst.operand_shapes)
                )
                return round(read) + written
        elif opcode == _DUS:
            shapes = inst.operand_shapes
            if len(shapes) >= 2:
                return 2 * shapes[1].byte_size + sum(s.byte_size for s in shapes[2:])
        elif opcode in _SLICING:
            shapes = inst.operand_shapes
            return 2 * inst.shape.byte_size + sum(s.byte_size for s in shapes[1:])
        return inst.shape.byte_size + sum(shape.byte_size for shape in inst.operand_shapes)

    def _fused(self, inst: Instruction) -> Computation | None:
        """The computation ``inst`` calls (``calls=``), if it names one of the module's."""
        if inst in self._callees:
            return self._callees[inst]
        m = _CALLS.search(inst.text)
        comp = self.computations.get(m.group(1)) if m is not None else None
        self._callees[inst] = comp
        return comp

    def fused_io(self, comp: Computation) -> tuple[dict[int, float], int]:
        """Of a fused computation: the fraction of each parameter (by number) its
        kernel reads, and the bytes it writes (XLA's utilization analysis)."""
        cached = self._fused_io.get(comp.name)
        if cached is not None:
            return cached
        root = comp.root
        elements = [root]
        if root.opcode == "tuple":
            elements = [comp.get(n) or root for n in root.operand_names]
        in_place: set[str] = set()
        written = 0
        for element in elements:
            dus = _through_bitcasts(element)
            if dus is not None and dus.opcode == _DUS and len(dus.operand_names) >= 2:
                in_place.add(dus.name)
                written += dus.operand_shapes[1].byte_size
            else:
                written += element.shape.byte_size
        use: dict[str, float] = {root.name: 1.0}
        for inst in reversed(comp.instructions):
            u = use.get(inst.name, 0.0)
            if u == 0.0:
                continue
            names = inst.operand_names
            if not names:
                continue
            # Only the first operand of a slicing or an in-place update is read in part.
            first = names[0]
            use[first] = use.get(first, 0.0) + u * _first_operand_use(inst, in_place)
            for name in names[1:]:
                use[name] = use.get(name, 0.0) + u
        fractions: dict[int, float] = {}
        for inst in comp.instructions:
            if inst.opcode == "parameter":
                try:
                    number = int(inst.operands_text.strip())
                except ValueError:
                    continue
                fractions[number] = min(use.get(inst.name, 0.0), 1.0)
        result = (fractions, written)
        self._fused_io[comp.name] = result
        return result

    def _called_flops(self, inst: Instruction, key: str) -> tuple[float, str]:
        if key == "calls":
            called = self._fused(inst)
            if called is not None:
                return self.computation_flops(called)
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
        operands = _product_operands(inst)
        if operands is None:
            return 0.0, ""
        lhs, rhs, out, element_type = operands
        if inst.opcode == "dot":
            dims = decode(inst, "lhs_contracting_dims", parse_int_list) or ()
            contracted = math.prod(lhs.dimensions[d] for d in dims if d < len(lhs.dimensions))
            return 2.0 * _elements(out) * contracted, element_type
        return _conv_flops(inst, rhs, out), element_type

    def _custom_call_flops(self, inst: Instruction) -> tuple[float, str]:
        call_target = _custom_call_target(inst)
        operands = _product_operands(inst)
        if not call_target.startswith(GEMM_CUSTOM_CALL_PREFIXES) or operands is None:
            return 0.0, ""
        lhs, rhs, out, element_type = operands
        attention = attention_call(inst)
        if attention is not None:
            return attention.flops, element_type
        if "conv" in call_target:
            return _conv_flops(inst, rhs, out), element_type
        dims = _dot_numbers(inst).get("lhs_contracting_dimensions")
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
        comp = self.computations.get(pair.computation)
        start = comp.get(pair.start) if comp is not None else None
        return self.collective_of(start, pair.kind, pair.groups, pair.bytes)

    def collective_of(
        self, inst: Instruction | None, kind: str, groups: tuple[tuple[int, ...], ...], size: int
    ) -> CollectiveCost:
        """The cost of collective ``inst`` (its element type keys XLA's table)."""
        dtype = element_type(inst)
        key = (kind, groups, size, dtype)
        cost = self._collectives.get(key)
        if cost is None:
            cost = self._collectives[key] = collective_cost(
                kind, groups, size, self.target, dtype=dtype
            )
        return cost

    def async_compute(self, inst: Instruction) -> bool:
        """``inst`` starts a kernel XLA runs on a side compute stream: an async fusion
        (``fusion-start``), or an ``async-start`` around something no collective."""
        if inst.opcode == ASYNC_FUSION_START:
            return True
        if inst.opcode != "async-start":
            return False
        callee = self._fused(inst)
        return callee is not None and callee.root.opcode not in KINDS


def element_type(inst: Instruction | None) -> str | None:
    """The element type of a collective's first operand, as XLA's table spells it
    (``F32``); None when unknown."""
    if inst is None:
        return None
    for shape in inst.operand_shapes:
        for leaf in shape.leaves():
            if leaf.element_type:
                return leaf.element_type.upper()
    return None


def collective_cost(
    kind: str,
    groups: tuple[tuple[int, ...], ...],
    size: int,
    target: Target,
    *,
    dtype: str | None = None,
) -> CollectiveCost:
    """The cost of one collective: XLA's measured time where the target's table covers
    it, else the alpha-beta model (see the module docstring), times the target's
    calibration ratio for ``kind``. ``dtype``: its element type (``F32``), which XLA's
    table keys reducing collectives by."""
    cost = _model_cost(kind, groups, size, target)
    if cost.algorithm != "local":
        cost = _with_kernel(cost, kind, groups, size, target)
    measured = _measured_cost(cost, kind, groups, size, target, dtype) or _nccl_tests_cost(
        cost, kind, size, target
    )
    if measured is not None:
        cost = measured
    ratio = target.time_ratio(kind)
    if ratio == 1.0:
        return cost
    # Latency and transfer scale together, so the standalone time scales by the ratio
    # and bandwidth sharing keeps its meaning.
    return dataclasses.replace(cost, latency=cost.latency * ratio, bandwidth=cost.bandwidth / ratio)


def _with_kernel(
    cost: CollectiveCost,
    kind: str,
    groups: tuple[tuple[int, ...], ...],
    size: int,
    target: Target,
) -> CollectiveCost:
    """``cost`` with what its NCCL kernel holds, for the algorithm and protocol it
    picked (``nccl.py``)."""
    family = KINDS[kind].cost
    largest = max(groups, key=len, default=())
    # A permute's communicator is every device of its pairs.
    ranks = len(cost.devices) if family == "one-hop" else len(largest)
    hosts = Counter(d // target.devices_per_host for d in largest)
    k = nccl.kernel(
        target,
        family,
        size,
        ranks=ranks,
        network=cost.network,
        local=min(hosts.values(), default=1),
        algorithm=cost.algorithm,
        protocol=cost.protocol,
    )
    return dataclasses.replace(cost, sms=k.ctas, hbm_per_byte=k.hbm_per_byte)


def _measured_cost(
    model: CollectiveCost,
    kind: str,
    groups: tuple[tuple[int, ...], ...],
    size: int,
    target: Target,
    dtype: str | None,
) -> CollectiveCost | None:
    """``model`` re-timed to XLA's measured standalone time, if the table covers it."""
    if model.network or model.algorithm == "local":
        return None
    table = target.measured_collectives()
    if table is None:
        return None
    seconds = table.seconds(kind, groups, max(size, MIN_BYTES), dtype or "F32")
    if seconds is None or not math.isfinite(seconds):
        return None
    return _retimed(model, seconds, algorithm="measured", protocol="xla-table", measured=True)


def _nccl_tests_cost(
    model: CollectiveCost, kind: str, size: int, target: Target
) -> CollectiveCost | None:
    """``model``, a collective across hosts, re-timed to the target's nccl-tests run
    (``nccl_tests.py``) by the bytes it puts through each GPU's NIC, its latency moved
    from the run's ring to its own."""
    run = target.network_nccl_tests
    if run is None or not model.network or model.wire_bytes <= 0 or model.bandwidth <= 0:
        return None
    # The model moves its wire bytes at the NICs' rate times the GPUs that share the
    # transfer, times its protocol's share of the link: what one NIC carries is the
    # wire bytes at the NIC's own rate. (The run's share holds NCCL's protocol.)
    link = model.bandwidth / target.protocols[model.protocol].bandwidth_fraction
    nic_bytes = model.wire_bytes * target.link_bandwidth(True) / link
    measured = run.seconds(nic_bytes, target.network_bandwidth)
    # The run's time holds the latency of its own ranks and hosts. NCCL's latency grows
    # with the steps of a ring or the depth of a tree, over NVLink and over the network
    # (tuning.cc): the same collective over the run's devices says how much of the
    # measured time was latency, and ``model`` what its own is, in the same proportion
    # (the run may be faster than NCCL's figures: then all of it was latency).
    per_host = target.devices_per_host
    hosts = run.ranks // run.ranks_per_host
    at_run = _model_cost(
        kind,
        (tuple(h * per_host + i for h in range(hosts) for i in range(run.ranks_per_host)),),
        size,
        target,
    )
    run_latency = min(at_run.latency, measured)
    scale = run_latency / at_run.latency if at_run.latency > 0 else 1.0
    seconds = measured - run_latency + model.latency * scale
    return _retimed(model, seconds, protocol="nccl-tests")


def _retimed(model: CollectiveCost, seconds: float, **changes: Any) -> CollectiveCost:
    """``model`` taking ``seconds`` standalone: its latency (at most that), then its wire
    bytes in the rest, so concurrent collectives still share link bandwidth."""
    latency = min(model.latency, seconds)
    transfer = seconds - latency
    if model.wire_bytes <= 0 or transfer <= 0:
        return dataclasses.replace(model, latency=seconds, wire_bytes=0.0, **changes)
    return dataclasses.replace(
        model, latency=latency, bandwidth=model.wire_bytes / transfer, **changes
    )


def _model_cost(
    kind: str, groups: tuple[tuple[int, ...], ...], size: int, target: Target
) -> CollectiveCost:
    devices = tuple(sorted({d for g in groups for d in g}))
    largest = max(groups, key=len, default=())
    n = max(len(largest), 1)
    per_host = target.devices_per_host
    hosts = Counter(d // per_host for d in largest)
    h = max(len(hosts), 1)
    network = h > 1
    link = target.link_bandwidth(network)
    # GPUs of the group on its emptiest host: their NICs carry that host's share.
    local = min(hosts.values(), default=1)
    if n <= 1:
        # Nothing crosses a link: a local copy (read and write the buffer).
        latency = target.kernel_overhead + 2 * size / target.achievable_memory_bandwidth
        return CollectiveCost("local", "none", latency, 0.0, link, False, devices)
    if kind not in KINDS:
        raise ValueError(f"no cost model for collective kind '{kind}'")
    family = KINDS[kind].cost
    best: CollectiveCost | None = None
    ring_link, tree_link, pairwise_link = link, link, link
    if network:
        ring_link, tree_link, pairwise_link = _cross_host_links(n, local, target)
    for name, p in target.protocols.items():
        bandwidth = link * p.bandwidth_fraction
        ring_bw, tree_bw = ring_link * p.bandwidth_fraction, tree_link * p.bandwidth_fraction
        a_nv, a_net = p.ring_step_latency(False), p.ring_step_latency(True)
        candidates: list[CollectiveCost] = []
        if family == "all-reduce":
            steps, inter = 2 * (n - 1), 2 * (h - 1)
            ring_latency = p.ring_base_latency + (steps - inter) * a_nv + inter * a_net
            tree_latency = p.tree_base_latency + 2 * (
                (n / h - 1) * p.tree_step_latency(False)
                + math.ceil(math.log2(h)) * p.tree_step_latency(True)
            )
            ring = CollectiveCost(
                "ring", name, ring_latency, 2 * (n - 1) / n * size, ring_bw, network, devices
            )
            tree = CollectiveCost("tree", name, tree_latency, 2.0 * size, tree_bw, network, devices)
            candidates += [c for c in (ring, tree) if c.algorithm in target.nccl_algorithms]
        elif family in ("ring", "broadcast"):
            latency = p.ring_base_latency + ((n - 1) - (h - 1)) * a_nv + (h - 1) * a_net
            wire = float(size) if family == "broadcast" else (n - 1) / n * size
            candidates.append(
                CollectiveCost("ring", name, latency, wire, ring_bw, network, devices)
            )
        elif family == "pairwise":
            per_host_group = n / h
            latency = (
                p.ring_base_latency + (per_host_group - 1) * a_nv + (n - per_host_group) * a_net
            )
            candidates.append(
                CollectiveCost(
                    "pairwise",
                    name,
                    latency,
                    (n - 1) / n * size,
                    pairwise_link * p.bandwidth_fraction,
                    network,
                    devices,
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


def _cross_host_links(n: int, local: int, target: Target) -> tuple[float, float, float]:
    """The bytes/s per GPU of a group of ``n`` GPUs across hosts, ``local`` of them on
    a host (each with its own NIC), for the ring, tree and pairwise algorithms'
    wire bytes (see the module docstring)."""
    net, nvlink = target.link_bandwidth(True), target.link_bandwidth(False)
    if local <= 1:
        return net, net, net
    ring = min(local * net, nvlink * local / (local - 1))
    tree = min(local * net, nvlink)
    # Each GPU sends (n - local)/n of its buffer over its own NIC, (local - 1)/n over
    # NVLink; the wire bytes are (n - 1)/n of it.
    seconds = max((n - local) / net, (local - 1) / nvlink)
    return ring, tree, (n - 1) / seconds


def _custom_call_target(inst: Instruction) -> str:
    """A custom call's ``custom_call_target``, unquoted."""
    raw = inst.attribute("custom_call_target") or ""
    m = _CUSTOM_CALL_TARGET.fullmatch(raw)
    return m.group(1) if m else raw


def _dot_numbers(inst: Instruction) -> dict[str, object]:
    """A cuBLAS call's ``dot_dimension_numbers`` (its backend config's
    ``gemm_backend_config``); empty when it has none."""
    config = decode(inst, "backend_config", parse_backend_config) or {}
    gemm = config.get("gemm_backend_config", config)
    numbers = gemm.get("dot_dimension_numbers", {}) if isinstance(gemm, dict) else {}
    return numbers if isinstance(numbers, dict) else {}


def _through_bitcasts(inst: Instruction) -> Instruction | None:
    """``inst``, or what a chain of bitcasts at it starts from (in its computation)."""
    seen = 0
    while inst.opcode == "bitcast" and seen < 64:
        names = inst.operand_names
        operand = inst.computation.get(names[0]) if names else None
        if operand is None:
            return None
        inst, seen = operand, seen + 1
    return inst


def _first_operand_use(inst: Instruction, in_place: set[str]) -> float:
    """The fraction of its first operand that ``inst`` reads per unit of its own use
    (every other operand it reads whole)."""
    opcode = inst.opcode
    if opcode in _SLICING:
        operand = _elements(inst.operand_shapes[0])
        return min(_elements(_first_array(inst.shape)) / operand, 1.0) if operand else 1.0
    if opcode == _DUS:
        if inst.name in in_place:
            return 0.0
        shapes = inst.operand_shapes
        whole = _elements(shapes[0])
        return (whole - _elements(shapes[1])) / whole if whole and len(shapes) > 1 else 1.0
    return 1.0


def _product_operands(inst: Instruction) -> tuple[Shape, Shape, Shape, str] | None:
    """A matrix product's (lhs, rhs, output, element type), or None without two operands."""
    operands = inst.operand_shapes
    if len(operands) < 2:
        return None
    lhs = operands[0]
    return lhs, operands[1], _first_array(inst.shape), lhs.element_type or ""


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
