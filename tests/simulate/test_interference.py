"""What collectives in flight take from the compute beside them (``interference.py``),
checked against the formula on hand-built modules: a GEMM loses the SMs NCCL's
channels hold (less the clock the freed power buys back), a memory-bound kernel the
HBM bandwidth the transfer moves, only for the part of it that overlaps, with the
collectives of K streams adding up; a loop's fast path keeps the pricing of its
unrolled twin; the range's ends and the target's switch."""

from __future__ import annotations

import dataclasses

import pytest

from xla_streams.collectives import StreamModel
from xla_streams.hlo import parse_module
from xla_streams.simulate import ErrorScale, Simulator, get_target, predict_range
from xla_streams.simulate.interference import factors
from xla_streams.simulate.targets import TargetError, target_with_overrides
from xla_streams.streams import assign_streams

# The alpha-beta model (no measured table): its costs are the formulas of test_simulate.
H100 = dataclasses.replace(get_target("h100"), perf_table_key=None)
REL = 1e-9
US = 1e-6

# A gather of 32 MiB over the 8 GPUs of a host (a ring on Simple: 24 channels), and
# beside it a bf16 GEMM of 2048^3 (bound by the matrix units) and an f32 negate of
# 32 MiB (bound by HBM); a multiply after the wait.
BESIDE = """HloModule beside, is_scheduled=true, num_partitions=8

ENTRY %main (p: f32[1024,1024], a: bf16[2048,2048], b: bf16[2048,2048], x: f32[8192,1024]) -> (f32[8192,1024], bf16[2048,2048], f32[8192,1024]) {
  %p = f32[1024,1024]{1,0} parameter(0)
  %a = bf16[2048,2048]{1,0} parameter(1)
  %b = bf16[2048,2048]{1,0} parameter(2)
  %x = f32[8192,1024]{1,0} parameter(3)
  %ag = (f32[1024,1024]{1,0}, f32[8192,1024]{1,0}) all-gather-start(%p), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, use_global_device_ids=true
  %d = bf16[2048,2048]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %n = f32[8192,1024]{1,0} negate(%x)
  %ag.done = f32[8192,1024]{1,0} all-gather-done(%ag)
  %m = f32[8192,1024]{1,0} multiply(%n, %n)
  ROOT %t = (f32[8192,1024]{1,0}, bf16[2048,2048]{1,0}, f32[8192,1024]{1,0}) tuple(%ag.done, %d, %m)
}
"""


def one_stream(sim: Simulator):  # type: ignore[no-untyped-def]
    return sim.run(assign_streams(sim.pairs, 1, "interval"))


def f_mat(sms: int, beta: float = 1 / 3) -> float:
    s = (H100.sm_count - sms) / H100.sm_count
    return max(H100.sustained_matrix_fraction / s, s ** -(1 - beta))


def f_mem(hbm: float) -> float:
    bandwidth = H100.memory_bandwidth * H100.memory_efficiency
    return bandwidth / (bandwidth - min(hbm, bandwidth / 2))


def test_a_gemm_loses_sms_and_a_memory_bound_kernel_hbm_while_a_ring_runs() -> None:
    sim = Simulator(parse_module(BESIDE), H100)
    gather = sim.specs[0].cost
    assert (gather.algorithm, gather.protocol, gather.sms, gather.hbm_per_byte) == (
        "ring", "simple", 24, 3.0,
    )  # fmt: skip
    overhead = H100.kernel_overhead
    bandwidth = H100.memory_bandwidth * H100.memory_efficiency
    dot_matrix = 2 * 2048**3 / (H100.matrix_flops["bf16"] * H100.matrix_efficiency)
    dot = dot_matrix + overhead  # matrix bound: 24.8 us against 8.5 us of memory
    negate = 2 * 8192 * 1024 * 4 / bandwidth + overhead
    multiply = 3 * 8192 * 1024 * 4 / bandwidth + overhead
    # The GEMM runs inside the gather's latency (32.2 us): its 24 CTAs hold 24 of 132
    # SMs, no HBM is moved yet. On 108 SMs at the power limit: max(sigma/s, s^-2/3).
    dot_beside = dot_matrix * f_mat(24) + overhead
    assert dot_beside < gather.latency
    # The negate starts in the latency (memory-bound: the SMs cost it nothing) and
    # runs on into the transfer, which moves 3 HBM bytes per byte at 360 GB/s.
    before = gather.latency - dot_beside
    factor = ((negate - overhead) * f_mem(3 * gather.bandwidth) + overhead) / negate
    negate_beside = before + (negate - before) * factor
    plain = one_stream(sim)
    assert plain.compute_time == pytest.approx(dot_beside + negate_beside + multiply, rel=REL)
    # The gather ends after both, the multiply runs after the wait, unslowed.
    assert plain.step_time == pytest.approx(gather.seconds + multiply, rel=REL)
    off = one_stream(Simulator(parse_module(BESIDE), dataclasses.replace(H100, interference=False)))
    assert off.compute_time == pytest.approx(dot + negate + multiply, rel=REL)


# The GEMM, then a negate of 512 MiB through HBM that outlasts the gather, then a
# negate of 32 MiB after the wait.
OUTLASTS = """HloModule outlasts, is_scheduled=true, num_partitions=8

ENTRY %main (p: f32[1024,1024], a: bf16[2048,2048], b: bf16[2048,2048], x: f32[65536,1024], y: f32[8192,1024]) -> (f32[8192,1024], bf16[2048,2048], f32[65536,1024], f32[8192,1024]) {
  %p = f32[1024,1024]{1,0} parameter(0)
  %a = bf16[2048,2048]{1,0} parameter(1)
  %b = bf16[2048,2048]{1,0} parameter(2)
  %x = f32[65536,1024]{1,0} parameter(3)
  %y = f32[8192,1024]{1,0} parameter(4)
  %ag = (f32[1024,1024]{1,0}, f32[8192,1024]{1,0}) all-gather-start(%p), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, use_global_device_ids=true
  %d = bf16[2048,2048]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %n = f32[65536,1024]{1,0} negate(%x)
  %ag.done = f32[8192,1024]{1,0} all-gather-done(%ag)
  %m = f32[8192,1024]{1,0} negate(%y)
  ROOT %t = (f32[8192,1024]{1,0}, bf16[2048,2048]{1,0}, f32[65536,1024]{1,0}, f32[8192,1024]{1,0}) tuple(%ag.done, %d, %n, %m)
}
"""


def test_only_the_overlapped_part_of_a_kernel_is_slowed() -> None:
    sim = Simulator(parse_module(OUTLASTS), H100)
    off = Simulator(parse_module(OUTLASTS), dataclasses.replace(H100, interference=False))
    kernels = off.kernels()
    gather = sim.specs[0].cost
    overhead = H100.kernel_overhead
    dot_beside = (kernels["d"][1] - overhead) * f_mat(24) + overhead
    negate = kernels["n"][1]
    assert dot_beside + negate > gather.seconds  # the negate outlasts the gather
    factor = ((negate - overhead) * f_mem(3 * gather.bandwidth) + overhead) / negate
    # Unslowed in the latency, slowed by `factor` until the gather ends at tau, then
    # the rest of it alone: tau + (t - tau/f) over the part after the latency.
    before = gather.latency - dot_beside
    during = gather.seconds - gather.latency
    after = negate - before - during / factor
    result = one_stream(sim)
    expected = dot_beside + before + during + after + kernels["m"][1]
    assert result.compute_time == pytest.approx(expected, rel=REL)
    assert result.step_time == pytest.approx(expected, rel=REL)
    assert result.exposed_communication == 0


# Two gathers whose groups share one device, so they may take two streams; a GEMM
# issued after both.
TWO = """HloModule two, is_scheduled=true, num_partitions=8

ENTRY %main (p0: f32[1024,1024], p1: f32[2048,1024], a: bf16[2048,2048], b: bf16[2048,2048]) -> (f32[4096,1024], f32[4096,1024], bf16[2048,2048]) {
  %p0 = f32[1024,1024]{1,0} parameter(0)
  %p1 = f32[2048,1024]{1,0} parameter(1)
  %a = bf16[2048,2048]{1,0} parameter(2)
  %b = bf16[2048,2048]{1,0} parameter(3)
  %ag.a = (f32[1024,1024]{1,0}, f32[4096,1024]{1,0}) all-gather-start(%p0), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}, use_global_device_ids=true
  %ag.b = (f32[2048,1024]{1,0}, f32[4096,1024]{1,0}) all-gather-start(%p1), channel_id=2, replica_groups={{0,4},{1,5},{2,6},{3,7}}, dimensions={0}, use_global_device_ids=true
  %d = bf16[2048,2048]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %ag.a.done = f32[4096,1024]{1,0} all-gather-done(%ag.a)
  %ag.b.done = f32[4096,1024]{1,0} all-gather-done(%ag.b)
  ROOT %t = (f32[4096,1024]{1,0}, f32[4096,1024]{1,0}, bf16[2048,2048]{1,0}) tuple(%ag.a.done, %ag.b.done, %d)
}
"""


def test_collectives_of_k_streams_hold_their_sms_together() -> None:
    sim = Simulator(parse_module(TWO), H100)
    a, b = (spec.cost for spec in sim.specs)
    dot_matrix = 2 * 2048**3 / (H100.matrix_flops["bf16"] * H100.matrix_efficiency)
    overhead = H100.kernel_overhead
    # On one stream the second gather queues: the GEMM beside the first alone. On two
    # both run (their latencies outlast the GEMM): it loses both kernels' SMs.
    one = sim.run(assign_streams(sim.pairs, 1, "interval"))
    two = sim.run(assign_streams(sim.pairs, 2, "interval"))
    assert one.compute_time == pytest.approx(dot_matrix * f_mat(a.sms) + overhead, rel=REL)
    assert two.compute_time == pytest.approx(dot_matrix * f_mat(a.sms + b.sms) + overhead, rel=REL)
    assert two.compute_time > one.compute_time


LOOP_BODY = """
%cond (p: (s32[], f32[65536])) -> pred[] {
  %p = (s32[], f32[65536]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(TRIP)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (q: (s32[], f32[65536])) -> (s32[], f32[65536]) {
  %q = (s32[], f32[65536]{0}) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %x = f32[65536]{0} get-tuple-element(%q), index=1
  %y = f32[65536]{0} negate(%x)
  ROOT %out = (s32[], f32[65536]{0}) tuple(%j, %y)
}
"""
GATHER = (
    "%ag = (f32[1024,1024]{1,0}, f32[8192,1024]{1,0}) all-gather-start(%g), channel_id=1, "
    "replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, use_global_device_ids=true"
)


def _scanned(trip: int) -> str:
    return f"""HloModule scanned, is_scheduled=true, num_partitions=8
{LOOP_BODY.replace("TRIP", str(trip))}
ENTRY %main (d: f32[65536], g: f32[1024,1024]) -> ((s32[], f32[65536]), f32[8192,1024]) {{
  %d = f32[65536]{{0}} parameter(0)
  %g = f32[1024,1024]{{1,0}} parameter(1)
  {GATHER}
  %zero = s32[] constant(0)
  %init = (s32[], f32[65536]{{0}}) tuple(%zero, %d)
  %loop = (s32[], f32[65536]{{0}}) while(%init), condition=%cond, body=%body, backend_config={{"known_trip_count":{{"n":"{trip}"}}}}
  %ag.done = f32[8192,1024]{{1,0}} all-gather-done(%ag)
  ROOT %t = ((s32[], f32[65536]{{0}}), f32[8192,1024]{{1,0}}) tuple(%loop, %ag.done)
}}
"""


def _unrolled(trip: int) -> str:
    """The same kernels in the same order, without the loop: the condition's compare
    and the body's negate ``trip`` times, and the compare once more."""
    lines = [
        "%zero = s32[] constant(0)",
        f"%n = s32[] constant({trip})",
    ]
    x = "%d"
    for k in range(trip):
        lines.append(f"%lt{k} = pred[] compare(%zero, %n), direction=LT")
        lines.append(f"%y{k} = f32[65536]{{0}} negate({x})")
        x = f"%y{k}"
    lines.append(f"%lt{trip} = pred[] compare(%zero, %n), direction=LT")
    body = "\n  ".join(lines)
    return f"""HloModule unrolled, is_scheduled=true, num_partitions=8

ENTRY %main (d: f32[65536], g: f32[1024,1024]) -> (f32[65536], f32[8192,1024], pred[]) {{
  %d = f32[65536]{{0}} parameter(0)
  %g = f32[1024,1024]{{1,0}} parameter(1)
  {GATHER}
  {body}
  %ag.done = f32[8192,1024]{{1,0}} all-gather-done(%ag)
  ROOT %t = (f32[65536]{{0}}, f32[8192,1024]{{1,0}}, pred[]) tuple({x}, %ag.done, %lt{trip})
}}
"""


@pytest.mark.parametrize("trip", [10, 100])
def test_a_loop_beside_a_collective_is_priced_as_its_unrolled_twin(trip: int) -> None:
    # The gather outlasts 10 iterations, 100 outlast it: iterations beside the gather
    # are slowed and are no template for the rest, which repeat once it is over.
    model = StreamModel(sync_on_compute=True)
    scanned = one_stream(Simulator(parse_module(_scanned(trip)), H100, model=model))
    unrolled = one_stream(Simulator(parse_module(_unrolled(trip)), H100, model=model))
    off = dataclasses.replace(H100, interference=False)
    plain = one_stream(Simulator(parse_module(_scanned(trip)), off, model=model))
    assert scanned.compute_time > plain.compute_time
    assert scanned.compute_time == pytest.approx(unrolled.compute_time, rel=1e-9)
    assert scanned.step_time == pytest.approx(unrolled.step_time, rel=1e-9)


def test_the_held_clock_is_not_charged_twice_and_the_range_spans_the_clock() -> None:
    sigma = H100.sustained_matrix_fraction
    # No collective: the held rate as it is.
    assert factors(H100, ErrorScale(), 0, 0.0) == (1.0, 1.0)
    s = 108 / 132
    expected = factors(H100, ErrorScale(), 24, 0.0)[0]
    low = factors(H100, ErrorScale.at("low"), 24, 0.0)[0]
    high = factors(H100, ErrorScale.at("high"), 24, 0.0)[0]
    assert expected == pytest.approx(max(sigma / s, s ** (-2 / 3)))  # 1.14
    assert low == pytest.approx(max(sigma / s, 1.0))  # 1.03: the clock buys it all back
    assert high == pytest.approx(1 / s)  # 1.22: no clock recovered
    assert (round(low, 2), round(expected, 2), round(high, 2)) == (1.03, 1.14, 1.22)
    # HBM: the low end moves 2 bytes where the FIFO's copy makes 3.
    d = 3 * 360e9
    assert factors(H100, ErrorScale(), 0, d)[1] == pytest.approx(f_mem(d))
    assert factors(H100, ErrorScale.at("low"), 0, d)[1] == pytest.approx(f_mem(2 * 360e9))
    # The range of BESIDE brackets its expected value.
    r = predict_range(Simulator(parse_module(BESIDE), H100))
    assert r.low < r.expected < r.high


def test_the_target_switch_is_a_boolean() -> None:
    assert target_with_overrides(H100, {"interference": False}).interference is False
    with pytest.raises(TargetError, match="interference must be true or false"):
        target_with_overrides(H100, {"interference": 1})
    with pytest.raises(TargetError, match="sm_count must be an integer of at least 1"):
        target_with_overrides(H100, {"sm_count": 0})
