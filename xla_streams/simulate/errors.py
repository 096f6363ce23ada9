"""The model's stated errors: how far each of its inputs may be off, and where that
bound comes from. ``ranges.predict_range`` re-simulates with every input at the
optimistic end, then at the pessimistic end, to give a low and a high step time.

Each bound is a factor on a *time* (a bandwidth error is its inverse), low end
first:

- ``matmul`` [0.85, 1.25]: matmul kernels without measurements are priced at 70%
  of dense tensor-core peak (``targets.py``). cuBLAS BF16 GEMMs on H100 SXM reach
  600-800 TFLOPS of 989 (61-81%) when large; small and skinny ones fall well short
  of 70%, which the longer high end allows for.
- ``matmul_table`` [0.9, 1.15]: GEMMs priced from XLA's matmul table
  (``matmul.py``), bounded by the table's own spread (``sm_90``, BF16;
  ``tests/simulate/test_matmul_table.py`` recomputes each figure). Between two
  grid points the rate changes by up to 29% (90th percentile of the rate ratios of
  neighbouring points with every dimension at least 1024), and the true rate lies
  anywhere between them: half of that, 15%, is the high end. The table's largest
  GEMMs still gain up to 6% over their last doubling of a dimension (GEMMs beyond
  the table take its edge's rate), and the same FP8 kernel, measured under its
  three type keys, differs by up to 4% (90th percentile): 0.9 is the low end.
- ``attention`` [0.95, 1.25]: cuDNN flash attention priced from NVIDIA's
  published measurements (``attention.py``). The FlashAttention-3 paper (Shah et
  al. 2024, Fig. 5) measures cuDNN on H100 SXM at 595-609 TFLOP/s (BF16, head dim
  128, no mask, 4k-16k), 7-11% below the table's 642-669, and at shorter
  sequences (which take the table's 4k rate) lower still: 410 TFLOP/s at 1k under
  a causal mask against 518 at 4k, 21%. FlashAttention-3 itself, the fastest
  published Hopper kernel, reaches 638-648 there, within 3% of the table: 0.95.
- ``sustained`` [0.9, 1.05]: the held share of a burst-measured GEMM or
  attention rate (``Target.sustained_matrix_fraction``: MSMF over MAMF, one
  GPU). A step that keeps the GPU below its power limit for part of the time
  holds a higher clock then, up to the burst rate itself (0.84 of the time at the
  limit); 0.9 allows for GEMMs that run at the burst rate for 60% of their time.
  With all 8 GPUs of an H200 board busy, MSMF spreads 4.5% across them (B200: 10%;
  stas00/ml-engineering@082816f9 ``benchmarks/README.md``), and the slowest GPU
  paces a synchronous step: 1.05.
- ``memory`` [0.93, 1.3]: memory-bound kernels at BabelStream Triad's share of
  HBM peak (``Target.memory_efficiency``: 0.887 on H100). A kernel that only reads
  reaches more (BabelStream Dot, 3.18 of 3.35 TB/s: 0.93x the time); short
  kernels lose more to their launch and tail than the 2 us overhead the model
  adds.
- ``nvlink`` [0.8, 1.2]: NVLink collectives of the alpha-beta model run at 80%
  of 450 GB/s = 360 GB/s. nccl-tests show 370 GB/s busbw for rings (sjeaugey,
  NVIDIA/nccl-tests#212) and up to 480 GB/s for NVLink SHARP all-reduce
  (NVIDIA/nccl#1374, GTC S62129): 0.75x-1.0x of the modelled time; below a few
  MiB, fewer channels and protocol switches lower it further.
- ``network`` [0.98, 1.2]: 47 GB/s per 400 Gb/s NIC, from 46-48 GB/s busbw
  (AddyLaddy, NVIDIA/nccl-tests#290 and #319): 0.98x-1.02x; a congested or
  misconfigured fabric is slower (44.3 GB/s in NVIDIA/nccl-tests#319), and 4 hosts
  of 8 H100s over 8 x 400 Gb/s RoCE reach 320 GB/s all-reduce busbw
  (NVIDIA/nccl#1221) against the 8 x 47 = 376 the model gives: 1.18x, so the high
  end is 1.2x.
- ``latency`` [0.8, 2.0]: the per-step latencies of NCCL's own tuner
  (``tuning.cc``, ``targets.py``) price collectives the table does not cover.
  XLA's table measures small collectives at 1.5-4x what those latencies add up
  to (an 8-GPU all-reduce of 64 KiB: 39.7 us measured), hence the long high end.
- ``table_small`` [0.7, 1.4] and ``table_large`` [0.85, 1.1]: collectives priced
  from XLA's measured table (``measured.py``). Below 1 MiB its points are noisy
  and not monotonic (8-GPU all-reduce: 49.3 us at 1 KiB, 36.0 us at 2 KiB;
  all-to-all 65.0 us at 32 KiB, 23.7 us at 64 KiB): +-30-40%. From 1 MiB they
  are smooth; 1 GiB 8-GPU all-reduce is 398 GB/s busbw against 480 GB/s that
  NVLink SHARP reaches, so real runs may be faster.
- ``profiled`` [0.95, 1.05]: times from the program's own PGLE profile
  (``profile.py``) vary run to run by a few percent (JAX aggregates several
  profiled runs at the 90th percentile).
- ``clock_recovery`` [1, 0] and ``collective_hbm`` [2/3, 1]: what collectives in
  flight take from the compute beside them (``interference.py``), priced in the
  expected value from NCCL's channel rule (``nccl.py``). Neither is a factor on a
  time: ``clock_recovery`` is the exponent ``beta`` by which the clock rises on the
  SMs NCCL leaves to a GEMM at the power limit (``s ** -beta``): 1/3 expected (power
  ``~ f^3``), 1 at the low end (throughput bound by power alone), 0 at the high end
  (no clock recovered: a GEMM on a share ``s`` of the SMs takes ``1 / s`` the time);
  ``collective_hbm`` scales the HBM bytes NCCL moves per byte it receives (3 on
  Simple, 5 on LL): 1 expected and at the high end, 2/3 at the low end (registered
  buffers skip the FIFO's copy: 2 where there are 3). On H100 a kernel beside one
  24-channel ring is slowed 1.03 / 1.14 / 1.22 on its matrix time (low / expected /
  high); measured on 4 A100s and H100s training GPT and Llama models, overlapped
  compute runs 18.9% slower on average, 40% at worst (Lee et al. 2025, arXiv
  2507.03114).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ErrorBound:
    """One input's relative error: the factor on its time at each end, and why."""

    name: str
    low: float
    high: float
    source: str


MODEL_ERRORS: tuple[ErrorBound, ...] = (
    ErrorBound("matmul", 0.85, 1.25, "cuBLAS GEMMs reach 61-81% of dense peak; model: 70%"),
    ErrorBound(
        "matmul_table", 0.9, 1.15, "XLA's GEMM table: neighbours 29% apart, edge +6%, noise 4%"
    ),
    ErrorBound("attention", 0.95, 1.25, "cuDNN attention: FA3 paper 7-21% below NVIDIA's"),
    ErrorBound(
        "sustained", 0.9, 1.05, "held GEMM rate: MSMF/MAMF 0.84 at the power limit; 8 GPUs 4.5%"
    ),
    ErrorBound("memory", 0.93, 1.3, "BabelStream Triad on H100 0.887 of HBM peak, Dot 0.949"),
    ErrorBound("nvlink", 0.8, 1.2, "nccl-tests 370 (ring) - 480 (NVLS) GB/s; model: 360"),
    ErrorBound("network", 0.98, 1.2, "nccl-tests 46-48 GB/s per 400G NIC, 4x8 RoCE 320/376"),
    ErrorBound("latency", 0.8, 2.0, "XLA's table: small collectives 1.5-4x NCCL's latencies"),
    ErrorBound("table_small", 0.7, 1.4, "XLA's table below 1 MiB: noisy, +-30-40%"),
    ErrorBound("table_large", 0.85, 1.1, "XLA's table from 1 MiB: smooth; NVLS can beat it"),
    ErrorBound("profiled", 0.95, 1.05, "PGLE profile: run-to-run noise"),
    ErrorBound(
        "clock_recovery", 1.0, 0.0, "clock on the SMs NCCL leaves: s^-beta, beta 1/3 (P ~ f^3)"
    ),
    ErrorBound(
        "collective_hbm", 2 / 3, 1.0, "NCCL's HBM bytes per byte received: 3 (Simple), 2 direct"
    ),
)
# The ends of the bounds that are no factor on a time (interference.py).
NOT_TIME_FACTORS = frozenset({"clock_recovery", "collective_hbm"})
# Measured-table collectives of at least this many bytes use ``table_large``.
TABLE_SMOOTH_BYTES = 1 << 20


@dataclass(frozen=True)
class ErrorScale:
    """Factors the simulator applies to its costs (the defaults: the model as it stands).
    Time factors, except ``clock_recovery`` and ``collective_hbm``, the inputs of what
    collectives in flight take from compute (``interference.py``)."""

    matmul: float = 1.0
    matmul_table: float = 1.0
    attention: float = 1.0
    sustained: float = 1.0
    memory: float = 1.0
    nvlink: float = 1.0
    network: float = 1.0
    latency: float = 1.0
    table_small: float = 1.0
    table_large: float = 1.0
    profiled: float = 1.0
    clock_recovery: float = 1 / 3
    collective_hbm: float = 1.0

    @classmethod
    def at(cls, end: str, bounds: tuple[ErrorBound, ...] = MODEL_ERRORS) -> ErrorScale:
        """Every input at its ``"low"`` or ``"high"`` end."""
        if end not in ("low", "high"):
            raise ValueError(f"end must be 'low' or 'high', not {end!r}")
        return cls(**{b.name: getattr(b, end) for b in bounds})

    @property
    def neutral(self) -> bool:
        return self == ErrorScale()

    def compute(self, error: str) -> float:
        """The factor on a modelled compute kernel whose time carries the bound named
        ``error`` (``OpCost.error``: ``matmul``, ``matmul_table``, ``attention`` or
        ``memory``; any other kernel is not scaled). A burst-measured kernel
        (``matmul_table``, ``attention``) carries ``sustained`` as well."""
        if error not in _COMPUTE_ERRORS:
            return 1.0
        held = self.sustained if error in _BURST_MEASURED else 1.0
        factor: float = getattr(self, error)
        return factor * held


_COMPUTE_ERRORS = frozenset({"matmul", "matmul_table", "attention", "memory"})
_BURST_MEASURED = frozenset({"matmul_table", "attention"})
