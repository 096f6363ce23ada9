"""What collectives in flight take from the compute kernels beside them: SMs, and the
HBM bandwidth they move, priced from NCCL's own channel rule and the GPU's numbers.

A kernel that runs while NCCL kernels hold ``C`` of the GPU's ``N`` SMs
(``nccl.py``: one SM per channel, for the collective's whole time, its latency
included) and move ``D`` bytes/s through HBM (``hbm_per_byte`` times the rate the
network gives each transfer) is slowed on each of its two parts:

- its matrix part by ``f_mat = max(sigma / s, s ** -(1 - beta))`` with ``s = (N - C)
  / N`` the share of SMs left to it and ``sigma`` the target's
  ``sustained_matrix_fraction``. Without collectives (``s = 1``) that is 1: the
  model's GEMM rate is already the rate held at the power limit (``sigma`` of the
  burst rate, MSMF over MAMF), so the held clock is not charged twice. On fewer SMs
  the GPU draws less power and its clock rises by ``s ** -beta`` until it reaches the
  burst clock: with ``P ~ C V^2 f`` and ``V ~ f`` in the DVFS range, ``beta = 1/3``
  (expected); the range's low end is ``beta = 1`` (throughput bound by power alone),
  its high end ``beta = 0`` (no clock recovered: ``1 / s``). On H100 one 24-channel
  ring gives ``s = 108/132`` and ``f_mat`` 1.14 (1.03 .. 1.22); two (K = 2) 1.35
  (1.32 .. 1.57);
- its memory part by ``f_mem = BW / (BW - min(D, BW / 2))``: the collective keeps
  the HBM bandwidth it needs while that is at most half of ``BW``
  (``achievable_memory_bandwidth``), a max-min fair split beyond. An 8-GPU ring at
  370 GB/s moves about 1.1 TB/s of H100's 2.97: 1.59.

The kernel takes ``max(matrix * f_mat, memory * f_mem)`` plus the rest of its time
(launch overhead, or the part of a memory-bound GEMM below its memory time) for as
long as the collectives run beside it, and its own time after: only its overlapped
part is slowed. A compute kernel's matrix and memory times come from the cost model
(``cost.py``); a kernel of the program's profile keeps the model's split.

The range moves both inputs with the other errors (``errors.py``): ``clock_recovery``
is ``beta`` (1 low, 0 high), ``collective_hbm`` scales ``hbm_per_byte`` (2/3 low:
registered buffers skip the FIFO copy, 2 bytes where there are 3; 1 high).
``Target.interference = False`` turns the term off.

Not priced: side compute streams (async fusions) run unslowed, and a collective whose
kernel waits for SMs a compute kernel holds (NVIDIA/nccl#1431) starts on time.
"""

from __future__ import annotations

from xla_streams.simulate.errors import ErrorScale
from xla_streams.simulate.targets import Target

# Below this share of SMs left to compute, NCCL holds them all: one SM stays for the
# kernel (NCCL's channels never exceed a GPU's SMs; K streams of them may).
_MIN_SMS_LEFT = 1


def factors(target: Target, errors: ErrorScale, sms: int, hbm: float) -> tuple[float, float]:
    """(``f_mat``, ``f_mem``) while collectives hold ``sms`` SMs and move ``hbm`` HBM
    bytes/s (before ``errors.collective_hbm``)."""
    n = target.sm_count
    f_mat = 1.0
    if sms > 0:
        s = max(n - sms, _MIN_SMS_LEFT) / n
        f_mat = max(target.sustained_matrix_fraction / s, s ** -(1.0 - errors.clock_recovery))
    f_mem = 1.0
    if hbm > 0:
        bandwidth = target.achievable_memory_bandwidth
        taken = min(hbm * errors.collective_hbm, bandwidth / 2)
        f_mem = bandwidth / (bandwidth - taken)
    return f_mat, f_mem


def slowdown(seconds: float, matrix: float, memory: float, f_mat: float, f_mem: float) -> float:
    """The factor on a kernel of ``seconds``, ``matrix`` and ``memory`` of it bound by
    the matrix units and by HBM, while the factors are ``f_mat`` and ``f_mem``."""
    body = max(matrix, memory)
    if body <= 0 or seconds <= 0:
        return 1.0
    return (max(matrix * f_mat, memory * f_mem) + seconds - body) / seconds
