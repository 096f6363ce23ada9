"""Fused attention as it runs: cuDNN flash-attention calls priced from measurements.

XLA lowers ``jax.nn.dot_product_attention(..., implementation="cudnn")`` to cuDNN
custom calls: ``__cudnn$fmhaSoftmax`` (forward; ``...Dropout``, ``...ScaleBias...``
and ``...F8`` variants) and ``__cudnn$fmhaSoftmaxBackward`` (backward). XLA's own
estimators see a custom call they cannot price (its SoL estimator charges about
10 us) and neither of XLA's tables measures attention, so the times here come from
NVIDIA's published cuDNN benchmarks (``data/attention_perf_table.csv``, each row
with its source): TFLOP/s per GPU kind, mask (causal or none), head dimension and
sequence length, forward and backward.

The call (:func:`attention_call`) is read from its ``cudnn_fmha_backend_config``:
batch, heads, query and key lengths from ``intermediate_tensor_shape`` (the
[batch, heads, queries, keys] score matrix), head dimensions from the last
dimension of the query and value operands, the mask from ``mask_type`` (``CAUSAL``,
``PADDING_CAUSAL``) and ``sliding_window_length``. Its FLOPs are counted as the
benchmarks count them (:attr:`AttentionCall.flops`): forward ``2 b h q k (d_qk +
d_v)`` (``4 b h s^2 d`` for equal lengths and dims), halved under a causal mask;
backward 2.5 times that (five matrix products against the forward's two). A
sliding window of ``w`` keys counts ``min(w, k)`` keys per query, unhalved, at the
causal rate. So the benchmark's FLOPs over its TFLOP/s is its measured time, and a
call of the same shape is priced at exactly that.

The lookup (:meth:`AttentionTable.tflops`): the GPU kind's rows for the pass and
the mask (a GPU measured under one mask only uses it for both), then those of the
nearest measured head dimension (all sources measure 128), then the rate at the
query length, linear in log2(length) between the measured lengths and the nearest
one's outside them. A GPU kind without rows (A100) returns None: the cost model
then prices the call with its FLOPs at the target's matrix rate.
"""

from __future__ import annotations

import bisect
import csv
import functools
import io
import math
from dataclasses import dataclass
from pathlib import Path

from xla_streams.hlo import Instruction
from xla_streams.hlo.attributes import decode, parse_backend_config
from xla_streams.simulate.measured import DATA_DIR, PerfTableError

DEFAULT_ATTENTION_TABLE_PATH = DATA_DIR / "attention_perf_table.csv"
FMHA_PREFIX = "__cudnn$fmha"
_CAUSAL_MASKS = frozenset({"CAUSAL", "PADDING_CAUSAL"})
# FlashAttention-2 (Dao 2023, sec. 3.1 and the benchmarks' flops()): the backward pass
# does 2.5 times the forward's FLOPs.
BACKWARD_FLOPS_RATIO = 2.5
_COLUMNS = (
    "gpu",
    "mask",
    "head_dim",
    "seq_len",
    "batch",
    "heads",
    "forward_tflops",
    "backward_tflops",
    "source",
)


@dataclass(frozen=True)
class AttentionCall:
    """One fused-attention kernel: its shape, mask and pass."""

    batch: int
    heads: int
    queries: int
    keys: int
    head_dim: int  # of queries and keys
    value_dim: int
    causal: bool
    backward: bool
    window: int = 0  # keys a query sees (sliding window); 0: all

    @property
    def flops(self) -> float:
        """FLOPs as the benchmarks count them (see the module docstring)."""
        keys = min(self.window, self.keys) if self.window > 0 else self.keys
        forward = 2.0 * self.batch * self.heads * self.queries * keys
        forward *= self.head_dim + self.value_dim
        if self.causal and self.window <= 0:
            forward /= 2
        return forward * BACKWARD_FLOPS_RATIO if self.backward else forward

    @property
    def masked(self) -> bool:
        """Run by the masked (causal) kernels: a causal mask or a sliding window."""
        return self.causal or self.window > 0


def attention_call(inst: Instruction) -> AttentionCall | None:
    """The fused attention custom call ``inst`` runs; None when it is no cuDNN
    attention or its config lacks the score matrix's shape."""
    call_target = (inst.attribute("custom_call_target") or "").strip('"')
    if not call_target.startswith(FMHA_PREFIX):
        return None
    config = decode(inst, "backend_config", parse_backend_config) or {}
    fmha = config.get("cudnn_fmha_backend_config")
    if not isinstance(fmha, dict):
        return None
    scores = fmha.get("intermediate_tensor_shape")
    dims = scores.get("dimensions") if isinstance(scores, dict) else None
    operands = inst.operand_shapes
    if not isinstance(dims, list) or len(dims) != 4 or len(operands) < 3:
        return None
    query, value = operands[0], operands[2]
    if not query.dimensions or not value.dimensions:
        return None
    batch, heads, queries, keys = (int(d) for d in dims)
    return AttentionCall(
        batch=batch,
        heads=heads,
        queries=queries,
        keys=keys,
        head_dim=query.dimensions[-1],
        value_dim=value.dimensions[-1],
        causal=str(fmha.get("mask_type", "")) in _CAUSAL_MASKS,
        backward="Backward" in call_target,
        window=int(fmha.get("sliding_window_length", 0) or 0),
    )


@dataclass(frozen=True)
class Measured:
    """One published point: TFLOP/s at a sequence length."""

    seq_len: int
    tflops: float
    source: str


class AttentionTable:
    """The published measurements, by (GPU kind, pass, masked) -> head dim -> points."""

    def __init__(self, path: str, rows: dict[tuple[str, bool, bool], dict[int, list[Measured]]]):
        self.path = path
        self.rows = rows

    def devices(self) -> tuple[str, ...]:
        return tuple(sorted({device for device, _, _ in self.rows}))

    def tflops(self, device: str, call: AttentionCall) -> float | None:
        """The TFLOP/s ``call`` runs at on ``device`` (None: no measurements for it)."""
        by_dim = self.rows.get((device, call.backward, call.masked))
        if by_dim is None:
            by_dim = self.rows.get((device, call.backward, not call.masked))
        if not by_dim:
            return None
        dim = min(by_dim, key=lambda d: (abs(math.log2(d) - math.log2(call.head_dim)), d))
        points = by_dim[dim]
        lengths = [p.seq_len for p in points]
        i = bisect.bisect_left(lengths, call.queries)
        if i < len(points) and lengths[i] == call.queries:
            return points[i].tflops
        if i == 0 or i == len(points):
            return points[min(i, len(points) - 1)].tflops
        below, above = points[i - 1], points[i]
        t = (math.log2(call.queries) - math.log2(below.seq_len)) / (
            math.log2(above.seq_len) - math.log2(below.seq_len)
        )
        return below.tflops + t * (above.tflops - below.tflops)

    def seconds(self, device: str, call: AttentionCall) -> float | None:
        rate = self.tflops(device, call)
        return call.flops / (rate * 1e12) if rate is not None and rate > 0 else None


def parse_attention_table(text: str, path: str = "<string>") -> AttentionTable:
    """The CSV of ``data/attention_perf_table.csv`` (``#`` lines are comments);
    PerfTableError naming the line that is wrong."""
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if not line.startswith("#")]
    reader = csv.reader(io.StringIO("\n".join(line for _, line in lines)))
    header = next(reader, None)
    if header is None or tuple(header) != _COLUMNS:
        line = lines[0][0] if lines else 1
        raise PerfTableError(f"expected the columns {','.join(_COLUMNS)}", path=path, line=line)
    rows: dict[tuple[str, bool, bool], dict[int, list[Measured]]] = {}
    for (number, _), fields in zip(lines[1:], reader, strict=True):
        if not fields:
            continue
        try:
            gpu, mask, dim, seq, _batch, _heads, forward, backward, source = fields
            values = int(dim), int(seq), float(forward), float(backward)
        except ValueError:
            raise PerfTableError(
                f"expected {len(_COLUMNS)} fields: a GPU kind, 'causal' or 'none', head dim, "
                "sequence length, batch, heads, forward and backward TFLOP/s, source",
                path=path,
                line=number,
            ) from None
        if mask not in ("causal", "none") or min(values) <= 0:
            raise PerfTableError(
                "the mask is 'causal' or 'none' and every number positive", path=path, line=number
            )
        head_dim, seq_len, forward_rate, backward_rate = values
        for backward_pass, rate in ((False, forward_rate), (True, backward_rate)):
            by_dim = rows.setdefault((gpu, backward_pass, mask == "causal"), {})
            by_dim.setdefault(int(head_dim), []).append(Measured(int(seq_len), rate, source))
    for by_dim in rows.values():
        for points in by_dim.values():
            points.sort(key=lambda p: p.seq_len)
    return AttentionTable(path, rows)


@functools.cache
def default_attention_table() -> AttentionTable:
    """The published measurements vendored in ``data/attention_perf_table.csv``."""
    path = Path(DEFAULT_ATTENTION_TABLE_PATH)
    return parse_attention_table(path.read_text(encoding="utf-8"), str(path))
