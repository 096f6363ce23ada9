"""The one table of hardware constants the cost model uses, with where each comes from.

Every number the simulator needs lives in a ``Target``; nothing else in
``xla_streams.simulate`` hard-codes a rate or a latency. Five targets ship:
``h100``, ``a100`` and ``h200`` (SXM parts in 8-GPU DGX/HGX hosts), ``b200`` (an
8-GPU DGX/HGX B200 host) and ``gb200`` (a GB200 NVL72 rack: 72 GPUs on one NVLink
domain, which the model treats as one "host"). Any field can be overridden from a
JSON file (``load_target``)::

    {"base": "h100", "name": "h100-measured", "link_efficiency": 0.72,
     "matrix_flops": {"bf16": 8.0e14}, "perf_table": "my_collectives.txtpb"}

Measured times
--------------

``perf_table_key`` names the GPU kind as XLA's performance tables key it (``sm_90``
for H100 and H200, by compute capability; ``sm_100_B200``; ``sm_100_GB200``; A100
has none), and with it the simulator prices from measurements where it has them:

- collectives inside one host from XLA's collective table (``measured.py``; all
  three kinds); ``perf_table`` holds a user's own table in XLA's format
  (``load_perf_table``), else the table vendored from XLA (``data/``) is used;
- GEMMs from XLA's matmul table (``matmul.py``; ``sm_90`` and ``sm_100_B200``);
- cuDNN fused attention from NVIDIA's published benchmarks (``attention.py``; all
  three kinds).

Everything else (collectives across hosts, kinds or group sizes the table lacks,
GEMMs on GB200, all of A100) uses the alpha-beta model and the roofline below.

Sources, by field
-----------------

Datasheet numbers (peak, dense, i.e. without the 2:4 sparsity factor the
datasheets star):

- ``matrix_flops``, ``memory_bandwidth``, ``nvlink_bandwidth``:
  NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column): FP64 Tensor Core
  67 TFLOPS, TF32 Tensor Core 989 TFLOPS sparse = 494.7 dense, BF16/FP16
  1,979 sparse = 989.4 dense, FP8 and INT8 3,958 sparse = 1,979 dense, GPU
  memory bandwidth 3.35 TB/s, NVLink 900 GB/s (bidirectional, so 450 GB/s each
  way). NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): same compute and
  NVLink as H100 SXM, HBM3e 4.8 TB/s. NVIDIA A100 Tensor Core GPU datasheet
  (A100 40GB SXM): FP64 Tensor Core 19.5, TF32 156 dense (312 sparse),
  BF16/FP16 312 dense (624 sparse), INT8 624 dense, HBM2 1,555 GB/s, NVLink
  600 GB/s (300 GB/s each way); A100 has no FP8, so FP8 dots run at the BF16
  rate. The A100 and H100 bandwidths agree with the GpuTargetConfigProto files
  in ``xla_streams/targets/`` (``memory_bandwidth``).
- B200 (NVIDIA DGX B200 / HGX B200 datasheets, per GPU = board / 8, dense =
  sparse / 2): FP4 18 PFLOPS sparse, FP8 and INT8 9 sparse = 4.5 dense, BF16/FP16
  4.5 sparse = 2.25 dense, TF32 2.25 sparse = 1.125 dense, FP64 37 TFLOPS (296
  per board); HBM3e 8 TB/s (64 TB/s per board); fifth-generation NVLink 1.8 TB/s
  (900 GB/s each way).
- GB200 (NVIDIA GB200 NVL72 datasheet, per GPU = rack / 72, dense = sparse / 2):
  FP8 and INT8 720 PFLOPS sparse per rack = 5 dense per GPU, BF16/FP16 360 = 2.5,
  TF32 180 = 1.25, FP64 3,240 TFLOPS = 45 per GPU; HBM3e 576 TB/s = 8 TB/s per
  GPU; NVLink 130 TB/s = 1.8 TB/s per GPU (900 GB/s each way) across all 72.
- ``network_bandwidth``: one NIC per GPU. DGX H100/H200 user guide:
  8 x ConnectX-7 at 400 Gb/s (NDR InfiniBand) = 50 GB/s per GPU each way.
  DGX A100 user guide: 8 x ConnectX-6 at 200 Gb/s (HDR) = 25 GB/s per GPU. DGX
  B200 user guide: 8 x ConnectX-7 at 400 Gb/s. GB200 NVL72: one 400 Gb/s
  ConnectX-7 per GPU for the compute fabric (DGX GB200 user guide: four per
  compute tray of four GPUs).
- ``devices_per_host``: 8 GPUs per DGX/HGX board; 72 for GB200 NVL72, whose
  NVLink spans the rack (the model's "host" is the NVLink domain).

NCCL's own cost model (``src/graph/tuning.cc`` of NVIDIA/nccl as of commit
01afd20: the ``baseLat`` and ``hwLat`` tables, microseconds, and the LL
bandwidth factor) for the latency terms, per protocol (``protocols``):

- ``simple`` (what NCCL uses for large messages): base latency 8.4 us for rings
  (``baseLat`` Ring/Simple) and 0 for trees; per ring step 3.4 us over NVLink and
  9.6 us over the network (``hwLat`` Ring/Simple); per tree step 28 and 50 us
  (``hwLat`` Tree/Simple, "the latency of a 256kB chunk"); full bandwidth.
- ``ll`` (low latency, small messages): base 3.6 us for rings and 4.4 us for
  trees; per ring step 0.47 / 2.7 us, per tree step 0.52 / 5.0 us (NVLink /
  network); a quarter of the bandwidth (``busBw *= 1.0/4.0`` for Ring/LL).

What NCCL's kernels hold (``nccl.py``: the channel rule per call; ``interference.py``:
what that costs the compute beside them), read from NCCL 2.30.7 (NVIDIA/nccl@5067397c):

- ``sm_count``: the SMs of the GPU, as XLA's GPU target configurations
  (``xla_streams/targets/*.txtpb``, ``core_count``) have them: 132 on H100 SXM and
  H200, 108 on A100, 148 on B200; GB200 takes B200's (the same Blackwell GPU; XLA
  ships no GB200 configuration).
- ``nccl_channels``, ``nccl_channels_network``: the channels of a communicator inside
  one host and across hosts (``comm->nChannels``). NCCL searches rings at the first
  speed of its per-architecture array the NVLink paths allow (``src/graph/search.cc``
  1051-1065, 1170-1174: 6 at 60 GB/s on 18 Hopper links of 20.6 GB/s, 6 at 40 on 12
  Ampere links, 8 at 90 on 18 Blackwell links of 40.1; ``src/graph/topo.h`` 19-24),
  doubles them once (search.cc 1036-1049) and again when it connects them
  (``src/graph/connect.cc`` 459-460): 24 on H100, H200 and A100, 32 on B200 and GB200
  (one NVLink domain). Logged: "24 coll channels, ... 16 nvls channels, 32 p2p
  channels, 32 p2p channels per peer" on 8 H100s (AWS p5), "32 coll channels, ... 24
  nvls channels" on GB200 NVL72, "Channel 23/24" on 8 A100s (NVIDIA/nccl-tests#100).
  Across hosts of 8 GPUs with 8 NICs a ring takes one channel per NIC at 48 GB/s,
  doubled once: 16 ("If you are on DGX with 8 NICs ... it would use 16 SMs",
  sjeaugey in NVIDIA/nccl#689; 16 trees logged in NVIDIA/nccl-tests#319).
- ``nvls_channels``: NVLink SHARP's CTAs (``src/transport/nvls.cc`` 155-157,
  209-213): 16 on Hopper, 24 on one Blackwell host (NCCL's default, on when the
  system supports it: ``NCCL_NVLS_ENABLE`` 2); 0 where it is off (A100 has none).
- ``nccl_max_channels``: a cap the environment sets (``NCCL_MAX_NCHANNELS``,
  connect.cc 492-506); 0 for none.
- ``network_unpack``: the network writes into GPU memory pages the kernel's own warps
  unpack (GPUDirect-TCPX and TCPXO: ``NCCL_NET_DEVICE_UNPACK``), which doubles a
  cross-host communicator below 16 channels (connect.cc 485-490) and moves 2 more
  HBM bytes per byte from the NIC (``src/device/network/unpack/unpack.h``).
- ``nccl_algorithms``: the algorithms an all-reduce may take, as the environment's
  ``NCCL_ALGO`` allows (the cost model's other collectives are rings either way):
  ring and tree unless a cluster's network restricts them.

Modelling assumptions (not datasheet numbers; override them with a JSON file, or
correct whole kernel classes with measured ratios: ``calibration.py``):

- ``matrix_efficiency`` 0.7: large GEMMs reach about 70% of dense tensor-core peak
  (the roofline of matmul kernels without measurements): a GEMM held at the
  power limit, as in a training step, reaches 71.6% of H200's BF16 peak (MSMF,
  below).
- ``sustained_matrix_fraction``: the share of a burst-measured GEMM or attention
  rate a GPU holds in a training step. XLA's matmul table (one warm-up and a
  median of five short runs per shape, on an otherwise idle GPU:
  ``xla/tools/matmul_perf_table_gen.cc``) and cuDNN's published attention
  throughput are burst measurements, taken at the boost clock; a training step
  keeps the tensor cores busy, draws the board's full power and runs at the
  clock that settles there. Stas Bekman's ``mamf-finder`` measures both on one
  GPU, with NVML clock and power per shape (stas00/ml-engineering, branch
  ``fast-mamf``, commit 082816f9, ``compute/accelerator/README.md``): H200 SXM
  BF16 841.9 TFLOP/s at 1980 MHz, 176 W (MAMF) against 708.5 held at 1465 MHz,
  693 W (MSMF), 0.842 (FP8 0.864); B200 1770.9 against 1456.3, 0.822 (FP8
  0.814). H100 SXM takes H200's: the same GH100 die, SM count and 700 W limit
  (its own MSMF is not measured). A100 and GB200 have no measurement, and no
  burst table of theirs is read (GB200's attention aside): 1.
- ``memory_efficiency``: the share of HBM peak a streaming kernel reaches,
  BabelStream's Triad (two reads and a write, as most fusions) on Azure's
  ND H100 v5 and ND H200 v5 (Azure/AI-benchmarking-guide, ``Azure Results``):
  2.97 of 3.35 TB/s on H100 (0.887), 4.15 of 4.8 on H200 (0.865). B200, GB200 and
  A100 have no such measurement here: 0.8.
- ``link_efficiency`` 0.8, NVLink: NCCL's bus bandwidth is about 80% of the
  link's peak (sjeaugey in NVIDIA/nccl-tests#212: "With the protocol overhead
  (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s" of 450 on H100;
  NCCL's model caps A100 at 235 GB/s of 300).
- ``network_efficiency`` 0.94, the network, on its own: nccl-tests busbw per
  400 Gb/s NDR NIC is 46-48 GB/s of 50 (AddyLaddy in NVIDIA/nccl-tests#290 and
  #319), 47/50. So a 27 MiB all-gather over 4 hosts (one GPU each) takes
  about 490 us: ring latency 37 us plus 3/4 x 27 MiB at 47 GB/s. A group with
  several GPUs on each host uses their NICs together (``cost.py``).
- ``network_nccl_tests`` (none built in; the A3 target files in
  ``xla_streams/targets/`` have one): a published nccl-tests run on the cluster's
  own network, whose share of line rate at each size replaces the flat
  ``network_efficiency`` for collectives across hosts (``nccl_tests.py``).
- ``kernel_overhead`` 2 us: the smallest time a kernel occupies the stream
  (launch gap plus the tail of a tiny grid).
- f32 dots run on TF32 tensor cores: XLA:GPU's default precision for f32
  dots (what JAX asks for unless ``jax_default_matmul_precision`` is set).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xla_streams._json import is_finite_number
from xla_streams.simulate.attention import AttentionCall, default_attention_table
from xla_streams.simulate.matmul import GemmShape, default_matmul_table
from xla_streams.simulate.measured import (
    CollectiveTable,
    PerfTable,
    PerfTableError,
    default_perf_table,
    load_perf_table,
)
from xla_streams.simulate.nccl_tests import NcclTestsError, NcclTestsRun

TERA = 1e12
PETA = 1e15
GIGA = 1e9
MICRO = 1e-6

# Element types of a dot's operands -> the key of the matrix rate it runs at.
MATRIX_RATE_OF_TYPE: dict[str, str] = {
    "f64": "fp64",
    "c128": "fp64",
    "f32": "tf32",
    "c64": "tf32",
    "bf16": "bf16",
    "f16": "bf16",
    "s8": "int8",
    "u8": "int8",
    "s4": "int8",
    "u4": "int8",
}
FP8_PREFIXES = ("f8", "f4")


@dataclass(frozen=True)
class Protocol:
    """Latencies (seconds) and bandwidth share of one NCCL protocol."""

    ring_base_latency: float
    tree_base_latency: float
    ring_step_latency_nvlink: float
    ring_step_latency_network: float
    tree_step_latency_nvlink: float
    tree_step_latency_network: float
    bandwidth_fraction: float = 1.0

    def ring_step_latency(self, network: bool) -> float:
        return self.ring_step_latency_network if network else self.ring_step_latency_nvlink

    def tree_step_latency(self, network: bool) -> float:
        return self.tree_step_latency_network if network else self.tree_step_latency_nvlink


SIMPLE = Protocol(
    ring_base_latency=8.4 * MICRO,
    tree_base_latency=0.0,
    ring_step_latency_nvlink=3.4 * MICRO,
    ring_step_latency_network=9.6 * MICRO,
    tree_step_latency_nvlink=28.0 * MICRO,
    tree_step_latency_network=50.0 * MICRO,
)
LL = Protocol(
    ring_base_latency=3.6 * MICRO,
    tree_base_latency=4.4 * MICRO,
    ring_step_latency_nvlink=0.47 * MICRO,
    ring_step_latency_network=2.7 * MICRO,
    tree_step_latency_nvlink=0.52 * MICRO,
    tree_step_latency_network=5.0 * MICRO,
    bandwidth_fraction=0.25,
)
DEFAULT_PROTOCOLS: dict[str, Protocol] = {"simple": SIMPLE, "ll": LL}
# The least rate (bytes or FLOP per second) a target file may give: below it a rate is a
# typo, and a step's time would overflow.
MIN_RATE = 1.0
# The algorithms the cost model prices an all-reduce with (NCCL's ring and tree).
ALL_REDUCE_ALGORITHMS = ("ring", "tree")


@dataclass(frozen=True)
class Target:
    """Rates in units per second, latencies in seconds, bandwidths in bytes/s per GPU
    per direction."""

    name: str
    gpu: str  # the GPU, in words
    # Dense tensor-core rates by precision class (keys of MATRIX_RATE_OF_TYPE and "fp8").
    matrix_flops: dict[str, float]
    memory_bandwidth: float
    nvlink_bandwidth: float
    network_bandwidth: float
    devices_per_host: int = 8
    # NCCL protocols a collective may use; the cost model takes the fastest.
    protocols: dict[str, Protocol] = field(default_factory=lambda: dict(DEFAULT_PROTOCOLS))
    matrix_efficiency: float = 0.7
    sustained_matrix_fraction: float = 1.0
    memory_efficiency: float = 0.8
    link_efficiency: float = 0.8  # NVLink
    network_efficiency: float = 0.94
    kernel_overhead: float = 2.0 * MICRO
    sources: tuple[str, ...] = field(default=())
    # Measured / predicted time per kernel class ("matmul", "memory") and collective
    # kind, from a calibration file (calibration.py); a class not listed keeps 1.
    calibration: dict[str, float] = field(default_factory=dict)
    # The GPU's key in XLA's performance tables, collective and matmul, and in the
    # attention measurements (None: no measurements).
    perf_table_key: str | None = None
    # A user's own table (load_perf_table); None: the one vendored from XLA.
    perf_table: PerfTable | None = None
    # False: collectives in flight take nothing from the compute they overlap
    # (``dataclasses.replace(target, interference=False)`` shows what the term costs).
    interference: bool = True
    # What NCCL's kernels hold (nccl.py): the GPU's SMs, the channels of a communicator
    # inside a host and across hosts, NVLink SHARP's (0: off), the environment's cap
    # (0: none), a network the kernels unpack on the GPU.
    sm_count: int = 132
    nccl_channels: int = 24
    nccl_channels_network: int = 16
    nvls_channels: int = 0
    nccl_max_channels: int = 0
    network_unpack: bool = False
    # The all-reduce algorithms NCCL_ALGO allows (the cost model's choice among them).
    nccl_algorithms: tuple[str, ...] = ALL_REDUCE_ALGORITHMS
    # The cluster's network as a published nccl-tests run measured it (nccl_tests.py):
    # collectives across hosts take the share of line rate it reached at their size.
    network_nccl_tests: NcclTestsRun | None = None

    @property
    def description(self) -> str:
        """The GPU and its host, as overridden (``devices_per_host``) or not."""
        return f"{self.gpu}, {self.devices_per_host} GPUs per host"

    def time_ratio(self, kind: str) -> float:
        """What the calibration multiplies predictions of ``kind`` by (1 without one)."""
        return self.calibration.get(kind, 1.0)

    def matrix_peak(self, element_type: str) -> float:
        """Dense tensor-core peak FLOP/s of a dot whose operands have ``element_type``."""
        if element_type.startswith(FP8_PREFIXES):
            key = "fp8"
        else:
            key = MATRIX_RATE_OF_TYPE.get(element_type, "tf32")
        return self.matrix_flops.get(key) or self.matrix_flops["bf16"]

    def matrix_rate(self, element_type: str) -> float:
        """Achievable FLOP/s of a dot whose operands have ``element_type``."""
        return self.matrix_peak(element_type) * self.matrix_efficiency

    @property
    def achievable_memory_bandwidth(self) -> float:
        return self.memory_bandwidth * self.memory_efficiency

    def link_bandwidth(self, network: bool) -> float:
        """Achievable bytes/s per GPU each way over NVLink or the network."""
        if network:
            return self.network_bandwidth * self.network_efficiency
        return self.nvlink_bandwidth * self.link_efficiency

    def measured_collectives(self) -> CollectiveTable | None:
        """XLA's measured collective times for this GPU (``perf_table``, else the
        vendored table), or None when the target has no ``perf_table_key``.
        PerfTableError when a user's table lacks the key."""
        if self.perf_table_key is None:
            return None
        table = self.perf_table if self.perf_table is not None else default_perf_table()
        return table.for_device(self.perf_table_key, self.devices_per_host)

    def gemm_seconds(self, gemm: GemmShape) -> float | None:
        """XLA's measured time of ``gemm`` on this GPU (``matmul.py``); None where XLA's
        matmul table has no measurements for it, or a rate above the GPU's dense peak
        (no GEMM runs faster: ``sm_90``'s FP8 entries reach 1.31 times H100's at the
        table's largest shapes, 29 of 375 points above it, while its BF16 and TF32 ones
        stay below 0.81)."""
        if self.perf_table_key is None:
            return None
        table = default_matmul_table().for_device(self.perf_table_key)
        rate = table.throughput(gemm) if table is not None else None
        if rate is None or not 0 < rate <= self.matrix_peak(gemm.lhs):
            return None
        return gemm.flops / rate

    def attention_seconds(self, call: AttentionCall) -> float | None:
        """The published time of fused attention ``call`` on this GPU
        (``attention.py``); None without measurements for this GPU."""
        if self.perf_table_key is None:
            return None
        return default_attention_table().seconds(self.perf_table_key, call)


H100 = Target(
    name="h100",
    gpu="NVIDIA H100 SXM5 80GB",
    matrix_flops={
        "fp64": 67 * TERA,
        "tf32": 494.7 * TERA,
        "bf16": 989.4 * TERA,
        "fp8": 1978.9 * TERA,
        "int8": 1978.9 * TERA,
    },
    memory_bandwidth=3.35 * TERA,
    nvlink_bandwidth=450 * GIGA,
    network_bandwidth=50 * GIGA,
    sustained_matrix_fraction=708.5 / 841.9,  # H200's MSMF / MAMF: the same die and power
    memory_efficiency=2.97 / 3.35,  # BabelStream Triad, Azure ND H100 v5
    sm_count=132,
    nccl_channels=24,
    nccl_channels_network=16,
    nvls_channels=16,
    sources=(
        "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column",
        "NVIDIA DGX H100 user guide: 8x ConnectX-7 400 Gb/s",
        "NVIDIA/nccl src/graph/tuning.cc baseLat/hwLat (Simple protocol)",
        "NVIDIA/nccl-tests#290, #319: 46-48 GB/s busbw per 400 Gb/s NIC",
        "NVIDIA/nccl#1221, #1649: 4 x 8 H100 all-reduce 320-380 GB/s busbw",
        "XLA's collective performance table, sm_90 (measured on H100)",
        "XLA's matmul performance table, sm_90",
        "NVIDIA/cudnn-frontend benchmark_results.csv: cuDNN attention on Hopper",
        "stas00/ml-engineering@082816f9: H200 BF16 MAMF 841.9, MSMF 708.5 TFLOP/s",
        "Azure/AI-benchmarking-guide: BabelStream Triad 2.97 TB/s, ND H100 v5",
        "XLA's h100_sxm.txtpb: core_count 132",
        "NVIDIA/nccl@5067397c: 24 channels in a host, 16 across, 16 NVLS (nccl.py)",
    ),
    perf_table_key="sm_90",
)

H200 = dataclasses.replace(
    H100,
    name="h200",
    gpu="NVIDIA H200 SXM 141GB",
    memory_bandwidth=4.8 * TERA,
    memory_efficiency=4.15 / 4.8,  # BabelStream Triad, Azure ND H200 v5
    sources=(
        "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column",
        "NVIDIA DGX H200 user guide: 8x ConnectX-7 400 Gb/s",
        "NVIDIA/nccl src/graph/tuning.cc baseLat/hwLat (Simple protocol)",
        "NVIDIA/nccl-tests#290, #319: 46-48 GB/s busbw per 400 Gb/s NIC",
        "NVIDIA/nccl#1221, #1649: 4 x 8 H100 all-reduce 320-380 GB/s busbw",
        "XLA's collective performance table, sm_90 (H100's NVLink 4, as XLA uses it)",
        "XLA's matmul performance table, sm_90 (H100's, as XLA uses it)",
        "NVIDIA/cudnn-frontend benchmark_results.csv: cuDNN attention on Hopper",
        "stas00/ml-engineering@082816f9: H200 BF16 MAMF 841.9, MSMF 708.5 TFLOP/s",
        "Azure/AI-benchmarking-guide: BabelStream Triad 4.15 TB/s, ND H200 v5",
        "XLA's h200_sxm.txtpb: core_count 132",
        "NVIDIA/nccl@5067397c: 24 channels in a host, 16 across, 16 NVLS (nccl.py)",
    ),
)

A100 = Target(
    name="a100",
    gpu="NVIDIA A100 SXM4 40GB",
    matrix_flops={
        "fp64": 19.5 * TERA,
        "tf32": 156 * TERA,
        "bf16": 312 * TERA,
        "int8": 624 * TERA,
    },
    memory_bandwidth=1.555 * TERA,
    nvlink_bandwidth=300 * GIGA,
    network_bandwidth=25 * GIGA,
    sm_count=108,
    nccl_channels=24,
    nccl_channels_network=16,
    sources=(
        "NVIDIA A100 Tensor Core GPU datasheet, A100 40GB SXM column",
        "NVIDIA DGX A100 user guide: 8x ConnectX-6 200 Gb/s",
        "NVIDIA/nccl src/graph/tuning.cc baseLat/hwLat (Simple protocol)",
        "XLA's a100_sxm_40.txtpb: core_count 108",
        "NVIDIA/nccl@5067397c: 24 channels in a host, 16 across, no NVLS (nccl.py)",
    ),
)

B200 = Target(
    name="b200",
    gpu="NVIDIA B200 (HGX/DGX B200)",
    matrix_flops={
        "fp64": 37 * TERA,
        "tf32": 1.125 * PETA,
        "bf16": 2.25 * PETA,
        "fp8": 4.5 * PETA,
        "int8": 4.5 * PETA,
    },
    memory_bandwidth=8 * TERA,
    nvlink_bandwidth=900 * GIGA,
    network_bandwidth=50 * GIGA,
    sources=(
        "NVIDIA DGX B200 / HGX B200 datasheets, per GPU",
        "NVIDIA DGX B200 user guide: 8x ConnectX-7 400 Gb/s",
        "NVIDIA/nccl src/graph/tuning.cc baseLat/hwLat (Simple protocol)",
        "XLA's collective performance table, sm_100_B200",
        "XLA's matmul performance table, sm_100_B200",
        "NVIDIA/cudnn-frontend sdpa_bf16_benchmark_results_NVIDIA_B200.csv",
        "stas00/ml-engineering@082816f9: B200 BF16 MAMF 1770.9, MSMF 1456.3 TFLOP/s",
        "XLA's b200.txtpb: core_count 148",
        "NVIDIA/nccl@5067397c: 32 channels in a host, 16 across, 24 NVLS (nccl.py)",
    ),
    sustained_matrix_fraction=1456.3 / 1770.9,  # MSMF / MAMF
    sm_count=148,
    nccl_channels=32,
    nccl_channels_network=16,
    nvls_channels=24,
    perf_table_key="sm_100_B200",
)

GB200 = Target(
    name="gb200",
    gpu="NVIDIA GB200 (NVL72 rack)",
    matrix_flops={
        "fp64": 45 * TERA,
        "tf32": 1.25 * PETA,
        "bf16": 2.5 * PETA,
        "fp8": 5 * PETA,
        "int8": 5 * PETA,
    },
    memory_bandwidth=8 * TERA,
    nvlink_bandwidth=900 * GIGA,
    network_bandwidth=50 * GIGA,
    devices_per_host=72,
    sources=(
        "NVIDIA GB200 NVL72 datasheet, per GPU (rack / 72)",
        "NVIDIA DGX GB200 user guide: a 400 Gb/s ConnectX-7 per GPU",
        "NVIDIA/nccl src/graph/tuning.cc baseLat/hwLat (Simple protocol)",
        "XLA's collective performance table, sm_100_GB200",
        "NVIDIA/cudnn-frontend sdpa_bf16_benchmark_results_NVIDIA_GB200.csv",
        "B200's SM count (XLA's b200.txtpb: 148), the same Blackwell GPU",
        "NVIDIA/nccl@5067397c: 32 channels in the NVLink domain, 24 NVLS (nccl.py)",
    ),
    sm_count=148,
    nccl_channels=32,
    nccl_channels_network=16,
    nvls_channels=24,
    perf_table_key="sm_100_GB200",
)

TARGETS: dict[str, Target] = {t.name: t for t in (H100, A100, H200, B200, GB200)}


# The GPUs a target describes, by what CUDA names them (jax.Device.device_kind): the
# SXM boards whose SMs and NVLink the targets count. A PCIe or NVL board has other
# links (and the H100 PCIe 114 SMs), so it takes none. First match wins.
DEVICE_KINDS = (
    ("GB200", "gb200"),
    ("B200", "b200"),
    ("H200", "h200"),
    ("H100 80GB HBM3", "h100"),
    ("H100 SXM", "h100"),
    ("A100-SXM4", "a100"),
)


def target_of_device(kind: str) -> str | None:
    """The target of a GPU named ``kind`` (e.g. "NVIDIA H100 80GB HBM3"), or None."""
    if {"NVL", "PCIe"} & set(kind.split()):
        return None
    return next((name for part, name in DEVICE_KINDS if part in kind), None)


def target_of_gpus(kinds: Iterable[str]) -> str | None:
    """The target of a job's GPUs named ``kinds``: of several, the one with the fewest
    SMs (so that every process computes the same assignment); None where one has no
    target."""
    names = [target_of_device(kind) for kind in kinds]
    known = [TARGETS[n] for n in names if n is not None]
    if not known or len(known) < len(names):
        return None
    return min(known, key=lambda t: (t.sm_count, t.name)).name


class TargetError(ValueError):
    """An unknown target name or a bad target file."""


def get_target(name: str) -> Target:
    try:
        return TARGETS[name.lower()]
    except KeyError:
        raise TargetError(f"unknown target '{name}'; known targets: {', '.join(TARGETS)}") from None


def load_target(path: str | Path, base: str | None = None) -> Target:
    """A target from a JSON object of overrides on ``base`` (or its own ``"base"`` key,
    default h100). ``matrix_flops`` entries are merged key by key."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise TargetError(f"cannot read target file {path}: {e}") from None
    if not isinstance(data, dict):
        raise TargetError(f"target file {path}: expected a JSON object")
    return target_with_overrides(get_target(str(data.pop("base", base or "h100"))), data, str(path))


def target_with_overrides(
    target: Target, overrides: dict[str, Any], origin: str = "overrides"
) -> Target:
    # Ratios come from a calibration file (calibration.py), with their provenance.
    fields = {f.name: f for f in dataclasses.fields(Target) if f.name != "calibration"}
    changes: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in fields:
            raise TargetError(
                f"{origin}: unknown target field '{key}'; fields: {', '.join(fields)}"
            )
        current = getattr(target, key)
        if key == "matrix_flops":
            if not isinstance(value, dict) or not all(
                is_finite_number(v) and v >= MIN_RATE for v in value.values()
            ):
                raise TargetError(
                    f"{origin}: matrix_flops must map precision names to FLOP/s of at least "
                    f"{MIN_RATE:g}"
                )
            changes[key] = {**current, **{k: float(v) for k, v in value.items()}}
        elif key == "protocols":
            changes[key] = _protocols(current, value, origin)
        elif key == "sources":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise TargetError(f"{origin}: sources must be a list of strings")
            changes[key] = tuple(value)
        elif key == "perf_table_key":
            if value is not None and not isinstance(value, str):
                raise TargetError(f"{origin}: perf_table_key must be a string or null")
            changes[key] = value
        elif key == "nccl_algorithms":
            named = isinstance(value, list) and all(isinstance(v, str) for v in value)
            if (
                not named
                or not value
                or not set(value) <= set(ALL_REDUCE_ALGORITHMS)
                or len(set(value)) < len(value)
            ):
                raise TargetError(
                    f"{origin}: nccl_algorithms must list some of "
                    f"{', '.join(ALL_REDUCE_ALGORITHMS)}, each once, not {value!r}"
                )
            changes[key] = tuple(value)
        elif key == "network_nccl_tests":
            try:
                changes[key] = None if value is None else NcclTestsRun.from_json(value, origin)
            except NcclTestsError as e:
                raise TargetError(str(e)) from None
        elif key == "perf_table":
            if value is None:
                changes[key] = None
            elif not isinstance(value, str):
                raise TargetError(f"{origin}: perf_table must be the path of a table or null")
            else:
                try:
                    changes[key] = load_perf_table(_relative_to(value, origin))
                except PerfTableError as e:
                    raise TargetError(f"{origin}: perf_table: {e}") from None
        elif isinstance(current, str):
            if not isinstance(value, str):
                raise TargetError(f"{origin}: {key} must be a string, not {value!r}")
            changes[key] = value
        elif isinstance(current, bool):
            if not isinstance(value, bool):
                raise TargetError(f"{origin}: {key} must be true or false, not {value!r}")
            changes[key] = value
        elif isinstance(current, int):  # a count: devices per host, SMs, channels
            least = 1 if key in ("devices_per_host", "sm_count") else 0
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise TargetError(f"{origin}: {key} must be an integer of at least {least}")
            changes[key] = value
        elif key.endswith(("_efficiency", "_fraction")):  # a share of a peak: divides
            if not is_finite_number(value) or not 0 < value <= 1:
                raise TargetError(f"{origin}: {key} must be a number in (0, 1], not {value!r}")
            changes[key] = float(value)
        elif key.endswith("_bandwidth"):  # divides a size
            if not is_finite_number(value) or value < MIN_RATE:
                raise TargetError(
                    f"{origin}: {key} must be bytes/s of at least {MIN_RATE:g}, not {value!r}"
                )
            changes[key] = float(value)
        else:
            if not is_finite_number(value) or value < 0:
                raise TargetError(f"{origin}: {key} must be a non-negative number, not {value!r}")
            changes[key] = float(value)
    result = dataclasses.replace(target, **changes)
    run = result.network_nccl_tests
    if run is not None and run.ranks_per_host > result.devices_per_host:
        raise TargetError(
            f"{origin}: network_nccl_tests ran {run.ranks_per_host} ranks to a host, "
            f"the target's hosts have {result.devices_per_host} GPUs"
        )
    if run is not None and max(share for _, share in run.shares(result.network_bandwidth)) > 1:
        raise TargetError(
            f"{origin}: network_nccl_tests: a busbw above ranks_per_host x network_bandwidth "
            f"({run.ranks_per_host} x {result.network_bandwidth / 1e9:g} GB/s): one is wrong"
        )
    return result


def _protocols(current: dict[str, Protocol], value: Any, origin: str) -> dict[str, Protocol]:
    if not isinstance(value, dict):
        raise TargetError(f"{origin}: protocols must map protocol names to objects")
    result = dict(current)
    names = {f.name for f in dataclasses.fields(Protocol)}
    for name, fields in value.items():
        if fields is None:
            result.pop(name, None)  # null removes a protocol
            continue
        if not isinstance(fields, dict):
            raise TargetError(f"{origin}: protocol '{name}' must be an object or null")
        unknown = set(fields) - names
        if unknown:
            raise TargetError(
                f"{origin}: protocol '{name}': unknown field(s) {', '.join(sorted(unknown))}; "
                f"fields: {', '.join(sorted(names))}"
            )
        if not all(is_finite_number(v) and v >= 0 for v in fields.values()):
            raise TargetError(f"{origin}: protocol '{name}': fields must be non-negative numbers")
        if not 0 < fields.get("bandwidth_fraction", 1.0) <= 1:
            raise TargetError(
                f"{origin}: protocol '{name}': bandwidth_fraction must be in (0, 1] (a share "
                "of the link)"
            )
        base = result.get(name)
        if base is None:
            missing = names - set(fields) - {"bandwidth_fraction"}
            if missing:
                raise TargetError(
                    f"{origin}: new protocol '{name}' needs {', '.join(sorted(missing))}"
                )
            result[name] = Protocol(**{k: float(v) for k, v in fields.items()})
        else:
            result[name] = dataclasses.replace(base, **{k: float(v) for k, v in fields.items()})
    if not result:
        raise TargetError(f"{origin}: at least one protocol must remain")
    return result


def with_perf_table(target: Target, table: PerfTable | str | Path | None) -> Target:
    """``target`` pricing its collectives from ``table`` (a table or its path, in XLA's
    format; None: the vendored one). The table must have the target's key."""
    if isinstance(table, str | Path):
        table = load_perf_table(table)
    changed = dataclasses.replace(target, perf_table=table)
    changed.measured_collectives()  # a PerfTableError now, not mid-simulation
    return changed


def _relative_to(path: str, origin: str) -> Path:
    """``path`` as written in a target file: relative to that file's folder."""
    p = Path(path)
    if p.is_absolute() or origin == "overrides":
        return p
    return Path(origin).parent / p
