"""The cost model, the schedule simulator, its calibration and its pictures.

The hand-built modules have answers worked out on paper: every expected value is
computed here from the documented constants of ``targets.py`` with the formula
written out, and the simulator must match it exactly (to rounding). Each async
pair has work between its start and done, as in real schedules (XLA makes a pair
with nothing in between synchronous). Then every fixture is simulated, the
trace and HTML are checked for structure, and the HTML is rendered in headless
Chromium: its screenshot inspected and its zoom script seen to run.
"""

from __future__ import annotations

import dataclasses
import html
import importlib.util
import io
import itertools
import json
import math
import re
import shutil
import struct
import subprocess
import sys
import zlib
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest
from conftest import ADD_REDUCER

from xla_streams.cli.simulate import parse_policies, parse_streams, simulate_command
from xla_streams.collectives import StreamModel
from xla_streams.hlo import parse_module
from xla_streams.jax_compat import hlo_bindings
from xla_streams.passes.base import Compilation
from xla_streams.pipeline import PassManager
from xla_streams.simulate import Simulator, WhatIf, collective_cost, get_target, what_if
from xla_streams.simulate.calibration import (
    SCHEMA,
    Calibration,
    CalibrationError,
    compare_kernel_classes,
    load_calibration,
)
from xla_streams.simulate.cost import CostModel
from xla_streams.simulate.html import KIND_COLORS, LANE_BACKGROUNDS, OVERSAMPLE, render_html
from xla_streams.simulate.simulation import format_what_if
from xla_streams.simulate.simulator import LOWER_BOUND_LABEL, RULE_BOUND_LABEL
from xla_streams.simulate.targets import Target, TargetError, load_target, target_with_overrides
from xla_streams.simulate.timeline import COMPUTE_LANE
from xla_streams.simulate.trace import lane_tid, trace_events
from xla_streams.simulate.visual import record_timelines, write_visual_report
from xla_streams.streams import assign_streams

REPO = Path(__file__).resolve().parents[2]
FIXTURES = sorted((REPO / "hlo_fixtures").glob("*.hlo"))
# The alpha-beta model alone: the expected values below are its formulas. Collectives
# priced from XLA's measured table are tested in test_measured_collectives.py, what
# collectives in flight take from compute in test_interference.py.
H100 = dataclasses.replace(get_target("h100"), perf_table_key=None, interference=False)
SIMPLE = H100.protocols["simple"]
LL = H100.protocols["ll"]
REL = 1e-9


def nvlink(t: Target = H100) -> float:
    """Achievable NVLink bytes/s per GPU each way."""
    return t.nvlink_bandwidth * t.link_efficiency


def net(t: Target = H100) -> float:
    """Achievable network bytes/s per GPU each way (its own efficiency)."""
    return t.network_bandwidth * t.network_efficiency


def memory(t: Target = H100) -> float:
    return t.memory_bandwidth * t.memory_efficiency


def predict(
    text: str, target: Target = H100, streams=(1, 2), policies=("interval",), model=None
) -> WhatIf:
    return what_if(parse_module(text), target, streams, policies, model=model)


def negate(elements: int, t: Target = H100) -> float:
    """An f32 negate of ``elements``: read and write them, plus the kernel overhead."""
    return 2 * elements * 4 / memory(t) + t.kernel_overhead


# -- 1. two independent collectives: one stream vs two ----------------------------------

# A gathers inside each host of 4 devices (NVLink), B across the two hosts (network):
# their groups share one device at most, so they may take different streams, and
# they use different links, so nothing is shared.
TWO_INDEPENDENT = """HloModule two_independent, is_scheduled=true, num_partitions=8

ENTRY %main (p0: f32[1024,1024], p1: f32[2048,1024]) -> (f32[4096,1024], f32[4096,1024], f32[1024,1024]) {
  %p0 = f32[1024,1024]{1,0} parameter(0)
  %p1 = f32[2048,1024]{1,0} parameter(1)
  %ag.a = (f32[1024,1024]{1,0}, f32[4096,1024]{1,0}) all-gather-start(%p0), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}, use_global_device_ids=true
  %ag.b = (f32[2048,1024]{1,0}, f32[4096,1024]{1,0}) all-gather-start(%p1), channel_id=2, replica_groups={{0,4},{1,5},{2,6},{3,7}}, dimensions={0}, use_global_device_ids=true
  %w = f32[1024,1024]{1,0} negate(%p0)
  %ag.a.done = f32[4096,1024]{1,0} all-gather-done(%ag.a)
  %ag.b.done = f32[4096,1024]{1,0} all-gather-done(%ag.b)
  ROOT %t = (f32[4096,1024]{1,0}, f32[4096,1024]{1,0}, f32[1024,1024]{1,0}) tuple(%ag.a.done, %ag.b.done, %w)
}
"""


def test_two_independent_collectives_one_stream_vs_two() -> None:
    target = target_with_overrides(H100, {"devices_per_host": 4})
    what = predict(TWO_INDEPENDENT, target)
    s = 4096 * 1024 * 4  # bytes of each gathered output
    # A: ring all-gather over n=4 devices in one host, Simple protocol:
    #   t_A = base + (n-1) a_nv + (n-1)/n S / B_nvlink
    t_a = (
        SIMPLE.ring_base_latency + 3 * SIMPLE.ring_step_latency_nvlink + 3 / 4 * s / nvlink(target)
    )
    # B: ring all-gather over n=2 devices on h=2 hosts: the one step crosses the network:
    #   t_B = base + ((n-1) - (h-1)) a_nv + (h-1) a_net + (n-1)/n S / B_network
    t_b = SIMPLE.ring_base_latency + SIMPLE.ring_step_latency_network + 1 / 2 * s / net(target)
    a, b = what.specs
    assert (a.cost.algorithm, a.cost.protocol, a.cost.network) == ("ring", "simple", False)
    assert (b.cost.algorithm, b.cost.protocol, b.cost.network) == ("ring", "simple", True)
    assert a.cost.seconds == pytest.approx(t_a, rel=REL)
    assert b.cost.seconds == pytest.approx(t_b, rel=REL)

    one, two = what.result(1, "interval"), what.result(2, "interval")
    assert what.assignments[(2, "interval")].stream_of == {"ag.a": 0, "ag.b": 1}
    # One stream: B starts when A is done. Two: both run at once on separate links.
    assert one.step_time == pytest.approx(t_a + t_b, rel=REL)
    assert two.step_time == pytest.approx(max(t_a, t_b), rel=REL)
    for bound in (what.lower_bound, what.rule_bound):
        assert bound.step_time == pytest.approx(max(t_a, t_b), rel=REL)
    # Only the small negate to hide behind: the rest is exposed.
    t_w = negate(1024 * 1024, target)
    assert t_w < min(t_a, t_b)
    assert one.exposed_communication == pytest.approx(t_a + t_b - t_w, rel=REL)
    assert one.lane_busy[0] == pytest.approx(t_a + t_b, rel=REL)
    assert two.lane_busy[0] == pytest.approx(t_a, rel=REL)
    assert two.lane_busy[1] == pytest.approx(t_b, rel=REL)


# -- 2. a collective hidden behind a dot --------------------------------------------------

HIDDEN = f"""HloModule hidden, is_scheduled=true, num_partitions=8

{ADD_REDUCER}
ENTRY %main (a: bf16[8192,8192], b: bf16[8192,8192], g: f32[16777216]) -> (bf16[8192,8192], f32[16777216]) {{
  %a = bf16[8192,8192]{{1,0}} parameter(0)
  %b = bf16[8192,8192]{{1,0}} parameter(1)
  %g = f32[16777216]{{0}} parameter(2)
  %ar = f32[16777216]{{0}} all-reduce-start(%g), channel_id=1, replica_groups={{{{0,1,2,3,4,5,6,7}}}}, use_global_device_ids=true, to_apply=%add
  %dot = bf16[8192,8192]{{1,0}} dot(%a, %b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  %ar.done = f32[16777216]{{0}} all-reduce-done(%ar)
  ROOT %t = (bf16[8192,8192]{{1,0}}, f32[16777216]{{0}}) tuple(%dot, %ar.done)
}}
"""


def test_collective_fully_hidden_behind_a_dot() -> None:
    what = predict(HIDDEN)
    m = n = k = 8192
    # Roofline: max(flops / matrix rate, bytes / memory bandwidth) + kernel overhead.
    flops = 2 * m * n * k
    nbytes = 3 * m * n * 2  # two bf16 operands read, one bf16 result written
    t_dot = (
        max(flops / (H100.matrix_flops["bf16"] * H100.matrix_efficiency), nbytes / memory())
        + H100.kernel_overhead
    )
    # Ring all-reduce of S = 64 MiB over 8 devices in one host:
    #   base + 2(n-1) a_nv + 2(n-1)/n S / B_nvlink
    size = 16777216 * 4
    t_ar = (
        SIMPLE.ring_base_latency
        + 14 * SIMPLE.ring_step_latency_nvlink
        + 2 * 7 / 8 * size / nvlink()
    )
    assert what.specs[0].cost.seconds == pytest.approx(t_ar, rel=REL)
    assert t_ar < t_dot  # the paper's premise: it fits behind the dot
    for result in (*what.results.values(), what.lower_bound, what.rule_bound):
        assert result.step_time == pytest.approx(t_dot, rel=REL)
        assert result.exposed_communication == 0.0
        assert result.compute_time == pytest.approx(t_dot, rel=REL)


# -- 3. two collectives sharing the same links -------------------------------------------

# Pairs {0,1},{2,3}.. and {0,2},{1,3}..: groups share one device at most, so two
# streams are allowed, but every device's NVLink carries both.
SHARED = """HloModule shared, is_scheduled=true, num_partitions=8

ENTRY %main (p0: f32[2048,1024], p1: f32[4096,1024]) -> (f32[4096,1024], f32[8192,1024]) {
  %p0 = f32[2048,1024]{1,0} parameter(0)
  %p1 = f32[4096,1024]{1,0} parameter(1)
  %ag.a = (f32[2048,1024]{1,0}, f32[4096,1024]{1,0}) all-gather-start(%p0), channel_id=1, replica_groups={{0,1},{2,3},{4,5},{6,7}}, dimensions={0}, use_global_device_ids=true
  %ag.b = (f32[4096,1024]{1,0}, f32[8192,1024]{1,0}) all-gather-start(%p1), channel_id=2, replica_groups={{0,2},{1,3},{4,6},{5,7}}, dimensions={0}, use_global_device_ids=true
  %w = f32[2048,1024]{1,0} negate(%p0)
  %ag.a.done = f32[4096,1024]{1,0} all-gather-done(%ag.a)
  %ag.b.done = f32[8192,1024]{1,0} all-gather-done(%ag.b)
  ROOT %t = (f32[4096,1024]{1,0}, f32[8192,1024]{1,0}) tuple(%ag.a.done, %ag.b.done)
}
"""


def test_bandwidth_sharing_of_two_collectives_on_the_same_links() -> None:
    what = predict(SHARED)
    bw = nvlink()
    # Both are n=2 rings inside the host: the same latency L = base + a_nv.
    latency = SIMPLE.ring_base_latency + SIMPLE.ring_step_latency_nvlink
    w_a = 1 / 2 * (4096 * 1024 * 4)  # (n-1)/n S_A bytes on the wire
    w_b = 1 / 2 * (8192 * 1024 * 4)  # twice as many
    for spec in what.specs:
        assert spec.cost.latency == pytest.approx(latency, rel=REL)
        assert spec.cost.protocol == "simple"
    assert what.specs[1].cost.wire_bytes == 2 * what.specs[0].cost.wire_bytes == 2 * w_a
    # Two streams: both transfer from L at B/2 each; A ends at L + 2 W_A/B, then B
    # moves its last W_B - W_A alone at B:  L + 2 W_A/B + (W_B - W_A)/B = L + (W_A+W_B)/B.
    a_end = latency + 2 * w_a / bw
    two_streams = latency + (w_a + w_b) / bw
    # One stream: one after the other, each at full bandwidth: 2L + (W_A + W_B)/B.
    one_stream = 2 * latency + (w_a + w_b) / bw
    # Lower bound (no sharing): the longer one alone: L + W_B/B.
    assert what.result(2, "interval").step_time == pytest.approx(two_streams, rel=REL)
    assert what.result(1, "interval").step_time == pytest.approx(one_stream, rel=REL)
    assert what.lower_bound.step_time == pytest.approx(latency + w_b / bw, rel=REL)
    # The negate hides behind A whatever K is.
    assert negate(2048 * 1024) < latency + w_a / bw
    # The recorded timeline shows A ending at L + 2 W_A/B.
    sim = Simulator(parse_module(SHARED), H100)
    recorded = sim.run(what.assignments[(2, "interval")], record=True)
    ends = {s.name: s.start + s.duration for s in recorded.slices or () if s.lane != COMPUTE_LANE}
    assert ends["ag.a"] == pytest.approx(a_end, rel=REL)
    assert ends["ag.b"] == pytest.approx(two_streams, rel=REL)
    # Without sharing, two streams would reach the lower bound.
    unshared = sim.run(what.assignments[(2, "interval")], share_bandwidth=False)
    assert unshared.step_time == pytest.approx(latency + w_b / bw, rel=REL)


# The compute stream needs A first, then works, then needs B: with two streams
# sharing the links A arrives later than it would have queued alone.
FIRST_NEEDED = """HloModule first_needed, is_scheduled=true, num_partitions=8

ENTRY %main (p0: f32[2048,1024], p1: f32[2048,1024], x: f32[N]) -> (f32[4096,1024], f32[4096,1024], f32[N], f32[2048,1024]) {
  %p0 = f32[2048,1024]{1,0} parameter(0)
  %p1 = f32[2048,1024]{1,0} parameter(1)
  %x = f32[N]{0} parameter(2)
  %ag.a = (f32[2048,1024]{1,0}, f32[4096,1024]{1,0}) all-gather-start(%p0), channel_id=1, replica_groups={{0,1},{2,3},{4,5},{6,7}}, dimensions={0}, use_global_device_ids=true
  %ag.b = (f32[2048,1024]{1,0}, f32[4096,1024]{1,0}) all-gather-start(%p1), channel_id=2, replica_groups={{0,2},{1,3},{4,6},{5,7}}, dimensions={0}, use_global_device_ids=true
  %w = f32[2048,1024]{1,0} negate(%p0)
  %ag.a.done = f32[4096,1024]{1,0} all-gather-done(%ag.a)
  %work = f32[N]{0} negate(%x)
  %ag.b.done = f32[4096,1024]{1,0} all-gather-done(%ag.b)
  ROOT %t = (f32[4096,1024]{1,0}, f32[4096,1024]{1,0}, f32[N], f32[2048,1024]{1,0}) tuple(%ag.a.done, %ag.b.done, %work, %w)
}
""".replace("N]", "8388608]")


def test_more_streams_can_be_slower_and_the_table_says_why() -> None:
    what = predict(FIRST_NEEDED)
    bw = nvlink()
    latency = SIMPLE.ring_base_latency + SIMPLE.ring_step_latency_nvlink
    w = 1 / 2 * (4096 * 1024 * 4)
    work = negate(8388608)
    assert negate(2048 * 1024) < latency + w / bw  # the small negate hides behind A
    # K=1: A at L + W/B, work after it; B queued behind A ends at 2L + 2W/B.
    one = max(latency + w / bw + work, 2 * latency + 2 * w / bw)
    # K=2: A and B share the links and both end at L + 2W/B; then the work.
    two = latency + 2 * w / bw + work
    assert what.result(1, "interval").step_time == pytest.approx(one, rel=REL)
    assert what.result(2, "interval").step_time == pytest.approx(two, rel=REL)
    assert two > one
    [why] = what.non_monotone()
    assert "K=2" in why and "share link bandwidth" in why
    # The pairs are named: the compute stream waits W/B longer for A, because B shares
    # A's links on the other stream.
    waited = f"{w / bw * 1e6:.1f} us"
    assert (
        f"%ag.a (all-gather, collective stream 0) is waited for {waited} longer; it shares "
        "link bandwidth with %ag.b (collective stream 1)"
    ) in why
    assert what.explanations == {(2, "interval"): why}
    assert "note: interval: K=2" in format_what_if(what)


# Round robin on 3 streams puts %ag.d behind the big %ag.a, on 2 behind the small %ag.b;
# the compute stream needs %ag.d before a long kernel. No two groups share two devices:
# no ties.
QUEUED_BEHIND = """HloModule queued_behind, is_scheduled=true, num_partitions=8

ENTRY %main (big: f32[8192,1024], p: f32[256,1024], x: f32[N]) -> (f32[16384,1024], f32[512,1024], f32[512,1024], f32[512,1024], f32[N], f32[256,1024]) {
  %big = f32[8192,1024]{1,0} parameter(0)
  %p = f32[256,1024]{1,0} parameter(1)
  %x = f32[N]{0} parameter(2)
  %ag.a = (f32[8192,1024]{1,0}, f32[16384,1024]{1,0}) all-gather-start(%big), channel_id=1, replica_groups={{0,1},{2,3},{4,5},{6,7}}, dimensions={0}, use_global_device_ids=true
  %ag.b = (f32[256,1024]{1,0}, f32[512,1024]{1,0}) all-gather-start(%p), channel_id=2, replica_groups={{0,2},{1,3},{4,6},{5,7}}, dimensions={0}, use_global_device_ids=true
  %ag.c = (f32[256,1024]{1,0}, f32[512,1024]{1,0}) all-gather-start(%p), channel_id=3, replica_groups={{0,4},{1,5},{2,6},{3,7}}, dimensions={0}, use_global_device_ids=true
  %ag.d = (f32[256,1024]{1,0}, f32[512,1024]{1,0}) all-gather-start(%p), channel_id=4, replica_groups={{0,3},{1,2},{4,7},{5,6}}, dimensions={0}, use_global_device_ids=true
  %w = f32[256,1024]{1,0} negate(%p)
  %ag.d.done = f32[512,1024]{1,0} all-gather-done(%ag.d)
  %work = f32[N]{0} negate(%x)
  %ag.c.done = f32[512,1024]{1,0} all-gather-done(%ag.c)
  %ag.b.done = f32[512,1024]{1,0} all-gather-done(%ag.b)
  %ag.a.done = f32[16384,1024]{1,0} all-gather-done(%ag.a)
  ROOT %t = (f32[16384,1024]{1,0}, f32[512,1024]{1,0}, f32[512,1024]{1,0}, f32[512,1024]{1,0}, f32[N], f32[256,1024]{1,0}) tuple(%ag.a.done, %ag.b.done, %ag.c.done, %ag.d.done, %work, %w)
}
""".replace("N]", "41943040]")


def test_the_table_names_the_collective_a_slower_k_queues_behind() -> None:
    what = predict(QUEUED_BEHIND, streams=(2, 3), policies=("round-robin",))
    assert what.assignments[(3, "round-robin")].stream_of["ag.d"] == 0
    assert what.assignments[(2, "round-robin")].stream_of["ag.d"] == 1
    [why] = what.non_monotone()
    assert "queues collectives behind different ones" in why
    assert "%ag.d (all-gather, collective stream 0) is waited for" in why
    assert "it queues on collective stream 0 behind %ag.a (collective stream 0)" in why


# -- loops, sync pairs ---------------------------------------------------------------------

LOOP = """HloModule loop, is_scheduled=true, num_partitions=8

%cond (p: (s32[], bf16[4096,4096], bf16[1024,1024])) -> pred[] {
  %p = (s32[], bf16[4096,4096]{1,0}, bf16[1024,1024]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (q: (s32[], bf16[4096,4096], bf16[1024,1024])) -> (s32[], bf16[4096,4096], bf16[1024,1024]) {
  %q = (s32[], bf16[4096,4096]{1,0}, bf16[1024,1024]{1,0}) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %data = bf16[4096,4096]{1,0} get-tuple-element(%q), index=1
  %w = bf16[1024,1024]{1,0} get-tuple-element(%q), index=2
  %cp = (bf16[4096,4096]{1,0}, bf16[4096,4096]{1,0}) collective-permute-start(%data), channel_id=1, source_target_pairs={{0,1},{1,2},{2,3},{3,4},{4,5},{5,6},{6,7},{7,0}}
  %mm = bf16[1024,1024]{1,0} dot(%w, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %cp.done = bf16[4096,4096]{1,0} collective-permute-done(%cp)
  ROOT %out = (s32[], bf16[4096,4096]{1,0}, bf16[1024,1024]{1,0}) tuple(%j, %cp.done, %mm)
}

ENTRY %main (d: bf16[4096,4096], v: bf16[1024,1024]) -> (s32[], bf16[4096,4096], bf16[1024,1024]) {
  %d = bf16[4096,4096]{1,0} parameter(0)
  %v = bf16[1024,1024]{1,0} parameter(1)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[4096,4096]{1,0}, bf16[1024,1024]{1,0}) tuple(%zero, %d, %v)
  ROOT %loop = (s32[], bf16[4096,4096]{1,0}, bf16[1024,1024]{1,0}) while(%init), condition=%cond, body=%body, TRIP
}
"""


def _loop(trip: str) -> str:
    return LOOP.replace("TRIP", trip)


def test_while_loops_multiply_by_their_trip_count() -> None:
    what = predict(_loop('backend_config={"known_trip_count":{"n":"5"}}'))
    cond = 9 / memory() + H100.kernel_overhead  # compare: reads 2 x s32, writes a pred
    dot = (
        max(
            2 * 1024**3 / (H100.matrix_flops["bf16"] * H100.matrix_efficiency),
            3 * 1024**2 * 2 / memory(),
        )
        + H100.kernel_overhead
    )
    # One hop over NVLink: base + a_nv + S / B.
    permute = (
        SIMPLE.ring_base_latency + SIMPLE.ring_step_latency_nvlink + 4096 * 4096 * 2 / nvlink()
    )
    assert permute > dot
    # Each iteration: the condition, then the body waits for the permute after the dot.
    expected = 5 * (cond + permute) + cond
    for result in (*what.results.values(), what.lower_bound):
        assert result.step_time == pytest.approx(expected, rel=REL)
        assert result.exposed_communication == pytest.approx(5 * (permute - dot), rel=REL)
        assert result.compute_time == pytest.approx(6 * cond + 5 * dot, rel=REL)
    assert what.notes == []


def test_unknown_trip_count_runs_once_and_says_so() -> None:
    once = predict(_loop('backend_config={"operation_queue_id":"0"}'))
    five = predict(_loop('backend_config={"known_trip_count":{"n":"5"}}'))
    assert any("trip count unknown" in n and "%loop" in n for n in once.notes)
    cond = (
        once.baseline.compute_time - (five.baseline.compute_time - once.baseline.compute_time) / 4
    )
    assert cond > 0
    assert once.baseline.step_time < five.baseline.step_time


# The module above with a send to the host and a recv from it (a host callback's copies).
WITH_HOST_TRANSFERS = TWO_INDEPENDENT.replace(
    "  %w = f32[1024,1024]{1,0} negate(%p0)\n",
    """  %w = f32[1024,1024]{1,0} negate(%p0)
  %tok = token[] after-all()
  %to.host = (f32[1024,1024]{1,0}, u32[], token[]) send(%w, %tok), channel_id=3, is_host_transfer=true
  %to.host.done = token[] send-done(%to.host), channel_id=3, is_host_transfer=true
  %from.host = (f32[16]{0}, u32[], token[]) recv(%to.host.done), channel_id=4, is_host_transfer=true
  %from.host.done = (f32[16]{0}, token[]) recv-done(%from.host), channel_id=4, is_host_transfer=true
""",
)


def test_host_transfers_are_no_collectives_and_the_notes_say_they_are_not_priced() -> None:
    plain, host = predict(TWO_INDEPENDENT), predict(WITH_HOST_TRANSFERS)
    assert "is_host_transfer=true" in WITH_HOST_TRANSFERS
    assert len(host.pairs) == len(plain.pairs) == 2
    for key, result in plain.results.items():
        assert host.results[key].step_time == pytest.approx(result.step_time, rel=REL)
    assert plain.notes == []
    assert host.notes == [
        "2 send/recv with the host (is_host_transfer=true) not priced: a copy over PCIe "
        "to or from the host, no device collective"
    ]


def test_repeated_iterations_appear_in_the_timeline() -> None:
    module = parse_module(_loop('backend_config={"known_trip_count":{"n":"50"}}'))
    sim = Simulator(module, H100)
    fast = sim.run(assign_streams(sim.pairs, 2, "interval"))
    recorded = sim.run(assign_streams(sim.pairs, 2, "interval"), record=True)
    assert recorded.step_time == pytest.approx(fast.step_time, rel=REL)
    repeats = [s for s in recorded.slices or () if s.kind == "repeat"]
    # The first iteration starts and ends with nothing in flight: the other 49 repeat it.
    assert len(repeats) == 1 and repeats[0].args["iterations"] == 49


OUTER = """HloModule outer, is_scheduled=true, num_partitions=8

%cond (p: (s32[], f32[65536])) -> pred[] {
  %p = (s32[], f32[65536]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(10)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (q: (s32[], f32[65536])) -> (s32[], f32[65536]) {
  %q = (s32[], f32[65536]{0}) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %x = f32[65536]{0} get-tuple-element(%q), index=1
  %y = f32[65536]{0} negate(%x)
  ROOT %out = (s32[], f32[65536]{0}) tuple(%j, %y)
}

ENTRY %main (d: f32[65536], g: f32[1024,1024]) -> ((s32[], f32[65536]), f32[8192,1024]) {
  %d = f32[65536]{0} parameter(0)
  %g = f32[1024,1024]{1,0} parameter(1)
  %ag = (f32[1024,1024]{1,0}, f32[8192,1024]{1,0}) all-gather-start(%g), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, use_global_device_ids=true
  %zero = s32[] constant(0)
  %init = (s32[], f32[65536]{0}) tuple(%zero, %d)
  %loop = (s32[], f32[65536]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"TRIP"}}
  %ag.done = f32[8192,1024]{1,0} all-gather-done(%ag)
  ROOT %t = ((s32[], f32[65536]{0}), f32[8192,1024]{1,0}) tuple(%loop, %ag.done)
}
"""


@pytest.mark.parametrize("trip", [10, 100])
def test_collective_in_flight_across_a_compute_only_loop(trip: int) -> None:
    what = predict(OUTER.replace("TRIP", str(trip)))
    cond = 9 / memory() + H100.kernel_overhead
    negate = 2 * 65536 * 4 / memory() + H100.kernel_overhead
    loop = trip * (cond + negate) + cond
    # Ring all-gather of 32 MiB over the 8 devices of the host.
    gather = SIMPLE.ring_base_latency + 7 * SIMPLE.ring_step_latency_nvlink
    gather += 7 / 8 * 8192 * 1024 * 4 / nvlink()
    for result in (*what.results.values(), what.lower_bound):
        assert result.step_time == pytest.approx(max(loop, gather), rel=REL)
        assert result.exposed_communication == pytest.approx(max(0.0, gather - loop), abs=1e-15)
        assert result.lane_busy.get(0, gather) == pytest.approx(gather, rel=REL)


SYNC = f"""HloModule sync, is_scheduled=true, num_partitions=8

{ADD_REDUCER}
ENTRY %main (g: f32[1048576]) -> f32[1048576] {{
  %g = f32[1048576]{{0}} parameter(0)
  %ar = f32[1048576]{{0}} all-reduce-start(%g), channel_id=1, replica_groups={{{{0,1,2,3,4,5,6,7}}}}, use_global_device_ids=true, to_apply=%add, backend_config={{"collective_backend_config":{{"is_sync":true}}}}
  ROOT %ar.done = f32[1048576]{{0}} all-reduce-done(%ar)
}}
"""


def test_sync_pairs_run_where_xla_runs_them() -> None:
    # Settings unknown (the safe assumption): XLA's async thunk on stream 0.
    what = predict(SYNC)
    t_ar = what.specs[0].cost.seconds
    assert what.assignments[(2, "interval")].stream_of == {"ar": 0}
    # jax >= 0.11: on the compute stream.
    on_compute = predict(SYNC, model=StreamModel(sync_on_compute=True))
    assert on_compute.assignments[(2, "interval")].stream_of == {"ar": None}
    for w, lanes in ((what, {COMPUTE_LANE, 0}), (on_compute, {COMPUTE_LANE})):
        for result in (*w.results.values(), w.lower_bound, w.rule_bound):
            assert result.step_time == pytest.approx(t_ar, rel=REL)
            assert result.exposed_communication == pytest.approx(t_ar, rel=REL)
            assert {lane for lane, busy in result.lane_busy.items() if busy > 0} <= lanes
    assert "collective stream 0 (sync: XLA pins it there)" in format_what_if(what)
    assert "compute stream (sync" in format_what_if(on_compute)


def test_a_module_without_async_pairs_is_headed_so() -> None:
    plain = (
        SYNC.replace("all-reduce-start", "all-reduce")
        .replace("  ROOT %ar.done = f32[1048576]{0} all-reduce-done(%ar)\n", "")
        .replace("  %ar =", "  ROOT %ar =")
    )
    what = predict(plain)
    assert what.pairs == () and len(what.specs) == 1  # priced, as a synchronous collective
    headline = format_what_if(what).splitlines()[0]
    assert headline.endswith(": 0 async pairs"), headline


# Issue 9's module: an async all-reduce inside each host, an async all-gather
# across hosts, and a sync all-reduce over all 8 devices inside both intervals.
SYNC_INSIDE = f"""HloModule sync_inside, is_scheduled=true, num_partitions=8

{ADD_REDUCER}
ENTRY %main (a: f32[4194304], b: f32[1048576], c: f32[1048576], v: f32[1024]) -> (f32[4194304], f32[8388608], f32[1048576], f32[1024]) {{
  %a = f32[4194304]{{0}} parameter(0)
  %b = f32[1048576]{{0}} parameter(1)
  %c = f32[1048576]{{0}} parameter(2)
  %v = f32[1024]{{0}} parameter(3)
  %ar1 = f32[4194304]{{0}} all-reduce-start(%a), channel_id=1, replica_groups={{{{0,1,2,3}},{{4,5,6,7}}}}, use_global_device_ids=true, to_apply=%add
  %ag = (f32[1048576]{{0}}, f32[8388608]{{0}}) all-gather-start(%b), channel_id=2, replica_groups={{{{0,4}},{{1,5}},{{2,6}},{{3,7}}}}, dimensions={{0}}, use_global_device_ids=true
  %w = f32[1024]{{0}} negate(%v)
  %ar2 = f32[1048576]{{0}} all-reduce-start(%c), channel_id=3, replica_groups={{{{0,1,2,3,4,5,6,7}}}}, use_global_device_ids=true, to_apply=%add, backend_config={{"collective_backend_config":{{"is_sync":true}}}}
  %ar2.done = f32[1048576]{{0}} all-reduce-done(%ar2)
  %ar1.done = f32[4194304]{{0}} all-reduce-done(%ar1)
  %ag.done = f32[8388608]{{0}} all-gather-done(%ag)
  ROOT %t = (f32[4194304]{{0}}, f32[8388608]{{0}}, f32[1048576]{{0}}, f32[1024]{{0}}) tuple(%ar1.done, %ag.done, %ar2.done, %w)
}}
"""


def test_a_sync_pair_on_stream_0_queues_behind_what_is_there() -> None:
    what = predict(SYNC_INSIDE, streams=(1, 2, 4))
    t1, t2, t3 = (spec.cost.seconds for spec in what.specs)
    # The sync all-reduce shares 2+ devices with both async pairs while they are in
    # flight: the deadlock rule ties all three to stream 0, where XLA runs it.
    for k in (1, 2, 4):
        assert set(what.assignments[(k, "interval")].stream_of.values()) == {0}
        # It queues behind both; the compute stream waits for it after the negate.
        assert what.result(k, "interval").step_time == pytest.approx(t1 + t2 + t3, rel=REL)
    assert what.rule_bound.step_time == pytest.approx(t1 + t2 + t3, rel=REL)
    # Ignoring the rule, the async pairs take streams of their own: the sync one runs alone.
    t_w = negate(1024)
    assert what.lower_bound.step_time == pytest.approx(max(t_w + t3, t1, t2), rel=REL)
    assert what.lower_bound.step_time < what.rule_bound.step_time
    # On the compute stream (jax >= 0.11) the sync one is in no stream's queue.
    on_compute = predict(SYNC_INSIDE, streams=(2,), model=StreamModel(sync_on_compute=True))
    assert on_compute.assignments[(2, "interval")].stream_of == {"ar1": 0, "ag": 1, "ar2": None}
    assert on_compute.result(2, "interval").step_time < t1 + t2 + t3


# A computation called from two places: its pair runs (and is assigned) at each call.
TWICE = """HloModule twice, is_scheduled=true, num_partitions=8

%sub (p: f32[1048576]) -> f32[8388608] {
  %p = f32[1048576]{0} parameter(0)
  %ag = (f32[1048576]{0}, f32[8388608]{0}) all-gather-start(%p), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, use_global_device_ids=true
  %w = f32[1048576]{0} negate(%p)
  ROOT %ag.done = f32[8388608]{0} all-gather-done(%ag)
}

ENTRY %main (a: f32[1048576], b: f32[1048576]) -> (f32[8388608], f32[8388608]) {
  %a = f32[1048576]{0} parameter(0)
  %b = f32[1048576]{0} parameter(1)
  %first = f32[8388608]{0} call(%a), to_apply=%sub
  %second = f32[8388608]{0} call(%b), to_apply=%sub
  ROOT %t = (f32[8388608]{0}, f32[8388608]{0}) tuple(%first, %second)
}
"""


def test_a_pair_runs_at_every_call_of_its_computation() -> None:
    what = predict(TWICE)
    [pair] = what.pairs
    assert len(pair.occurrences) == 2
    t_ag, t_w = what.specs[0].cost.seconds, negate(1048576)
    assert t_w < t_ag
    for result in (*what.results.values(), what.lower_bound, what.rule_bound):
        # Each call: the negate hides behind the gather, then waits for the rest of it.
        assert result.step_time == pytest.approx(2 * t_ag, rel=REL)
    assert what.result(2, "interval").lane_busy[0] == pytest.approx(2 * t_ag, rel=REL)


# -- the cost model ---------------------------------------------------------------------------

KERNELS = """HloModule kernels, is_scheduled=true

%gemm (l: bf16[512,256], r: bf16[256,128]) -> bf16[512,128] {
  %l = bf16[512,256]{1,0} parameter(0)
  %r = bf16[256,128]{1,0} parameter(1)
  ROOT %d = bf16[512,128]{1,0} dot(%l, %r), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%elementwise (e: f32[1024]) -> f32[1024] {
  %e = f32[1024]{0} parameter(0)
  ROOT %n = f32[1024]{0} negate(%e)
}

ENTRY %main (a: bf16[512,256], b: bf16[256,128], c: f32[1024], i: f32[8,32,32,16], k: f32[3,3,16,64]) -> bf16[512,128] {
  %a = bf16[512,256]{1,0} parameter(0)
  %b = bf16[256,128]{1,0} parameter(1)
  %c = f32[1024]{0} parameter(2)
  %i = f32[8,32,32,16]{3,2,1,0} parameter(3)
  %k = f32[3,3,16,64]{3,2,1,0} parameter(4)
  %gemm_fusion = bf16[512,128]{1,0} fusion(%a, %b), kind=kCustom, calls=%gemm, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
  %cublas = (bf16[512,128]{1,0}, s8[1048576]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  %loop_fusion = f32[1024]{0} fusion(%c), kind=kLoop, calls=%elementwise
  %conv = f32[8,32,32,64]{3,2,1,0} convolution(%i, %k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
  %view = f32[32,32]{1,0} bitcast(%c)
  ROOT %result = bf16[512,128]{1,0} get-tuple-element(%cublas), index=0
}
"""


def test_cost_model_kernels() -> None:
    module = parse_module(KERNELS)
    model = CostModel(module, H100)
    cost = {inst.name: model.instruction(inst) for inst in module.entry.instructions}
    bf16_rate = H100.matrix_flops["bf16"] * H100.matrix_efficiency
    gemm_flops = 2 * 512 * 128 * 256
    gemm_bytes = (512 * 256 + 256 * 128 + 512 * 128) * 2
    gemm_time = max(gemm_flops / bf16_rate, gemm_bytes / memory()) + H100.kernel_overhead
    assert (cost["gemm_fusion"].kind, cost["gemm_fusion"].flops) == ("matmul", gemm_flops)
    assert cost["gemm_fusion"].seconds == pytest.approx(gemm_time, rel=REL)
    assert (cost["cublas"].kind, cost["cublas"].flops) == ("matmul", gemm_flops)
    loop = cost["loop_fusion"]
    assert (loop.kind, loop.bytes) == ("memory", 2 * 1024 * 4)
    assert loop.seconds == pytest.approx(2 * 1024 * 4 / memory() + H100.kernel_overhead, rel=REL)
    # Convolution: 2 * output elements * (3*3*16 kernel elements per output feature),
    # f32 at the TF32 tensor-core rate.
    conv_flops = 2 * (8 * 32 * 32 * 64) * (3 * 3 * 16)
    assert cost["conv"].flops == conv_flops
    conv_bytes = (8 * 32 * 32 * 16 + 3 * 3 * 16 * 64 + 8 * 32 * 32 * 64) * 4
    tf32_rate = H100.matrix_flops["tf32"] * H100.matrix_efficiency
    assert cost["conv"].seconds == pytest.approx(
        max(conv_flops / tf32_rate, conv_bytes / memory()) + H100.kernel_overhead, rel=REL
    )
    for free in ("a", "view", "result"):
        assert cost[free].seconds == 0.0


def test_collective_algorithm_and_protocol_choice() -> None:
    one_host = ((0, 1, 2, 3, 4, 5, 6, 7),)
    # A 4-byte all-reduce: latency-bound, so LL (smaller latencies) wins over Simple.
    tiny = collective_cost("all-reduce", one_host, 4, H100)
    assert (tiny.algorithm, tiny.protocol) == ("ring", "ll")
    ll_ring = (
        LL.ring_base_latency + 14 * LL.ring_step_latency_nvlink + 2 * 7 / 8 * 4 / (nvlink() * 0.25)
    )
    assert tiny.seconds == pytest.approx(ll_ring, rel=REL)
    # One device on each of 8 hosts, small buffer: the tree's log2(8) network steps
    # beat the ring's 2(8-1):  4.4 + 2*(0*0.52 + 3*5.0) us  <  3.6 + 14*2.7 us.
    spread = (tuple(range(0, 64, 8)),)
    small = collective_cost("all-reduce", spread, 1024, H100)
    assert (small.algorithm, small.protocol, small.network) == ("tree", "ll", True)
    tree = LL.tree_base_latency + 2 * (3 * LL.tree_step_latency_network) + 2 * 1024 / (net() * 0.25)
    assert small.seconds == pytest.approx(tree, rel=REL)
    # A large buffer: the Simple ring, bandwidth-optimal.
    large = collective_cost("all-reduce", spread, 1 << 30, H100)
    assert (large.algorithm, large.protocol) == ("ring", "simple")
    # all-to-all across 2 hosts of 8: 7 NVLink steps and 8 network steps; each GPU sends
    # the half of its buffer bound for the other host through its own NIC (the 7/16 for
    # its own host's GPUs go over NVLink, in less time).
    a2a = collective_cost("all-to-all", (tuple(range(16)),), 1 << 28, H100)
    expected = SIMPLE.ring_base_latency + 7 * SIMPLE.ring_step_latency_nvlink
    expected += 8 * SIMPLE.ring_step_latency_network + 8 / 16 * (1 << 28) / net()
    assert (a2a.algorithm, a2a.seconds) == ("pairwise", pytest.approx(expected, rel=REL))
    # A ring over 4 hosts of 8 GPUs crosses each host boundary once per channel, and
    # NCCL spreads the channels over the host's 8 NICs: 8 x 47 GB/s (nccl#1649: about
    # 380 GB/s multi-node all-reduce busbw on H100), below NVLink's 360 x 8/7.
    full = collective_cost("all-reduce", (tuple(range(32)),), 1 << 30, H100)
    assert (full.algorithm, full.network) == ("ring", True)
    assert full.bandwidth == pytest.approx(8 * net(), rel=REL)
    assert 2 * 31 / 32 * (1 << 30) / full.seconds == pytest.approx(359e9, rel=0.01)
    # A permute pair crossing hosts: one network hop.
    hop = collective_cost("collective-permute", ((7, 8),), 1 << 26, H100)
    expected = SIMPLE.ring_base_latency + SIMPLE.ring_step_latency_network + (1 << 26) / net()
    assert (hop.algorithm, hop.seconds) == ("one-hop", pytest.approx(expected, rel=REL))


def test_targets_and_overrides(tmp_path: Path) -> None:
    for name in ("h100", "a100", "h200"):
        t = get_target(name)
        assert t.sources and t.description and t.matrix_flops["bf16"] > 0
    assert get_target("h200").memory_bandwidth > get_target("h100").memory_bandwidth
    # A100 has no FP8: FP8 dots run at the BF16 rate.
    assert get_target("a100").matrix_rate("f8e4m3fn") == get_target("a100").matrix_rate("bf16")
    path = tmp_path / "t.json"
    path.write_text(
        json.dumps(
            {
                "base": "a100",
                "name": "mine",
                "link_efficiency": 0.5,
                "matrix_flops": {"bf16": 1e14},
                "protocols": {"ll": None, "simple": {"ring_base_latency": 1e-6}},
            }
        )
    )
    t = load_target(path)
    assert (t.name, t.link_efficiency, t.matrix_flops["bf16"]) == ("mine", 0.5, 1e14)
    assert t.matrix_flops["tf32"] == get_target("a100").matrix_flops["tf32"]
    assert list(t.protocols) == ["simple"] and t.protocols["simple"].ring_base_latency == 1e-6
    path.write_text('{"link_efficency": 0.5}')
    with pytest.raises(TargetError, match="unknown target field 'link_efficency'"):
        load_target(path)
    # Words and lists of words are what they say, never a str() of something else.
    for field, value, message in (
        ("sources", 5, "sources must be a list of strings"),
        ("sources", "one source", "sources must be a list of strings"),
        ("name", ["x"], "name must be a string, not ['x']"),
        # Rates divide sizes and FLOPs; Python's json reads NaN, which is no rate.
        ("nvlink_bandwidth", 0, "nvlink_bandwidth must be bytes/s of at least 1, not 0"),
        ("network_bandwidth", float("nan"), "network_bandwidth must be bytes/s of at least 1"),
        ("matrix_flops", {"bf16": 0}, "matrix_flops must map precision names to FLOP/s of at"),
        ("kernel_overhead", float("inf"), "kernel_overhead must be a non-negative number"),
        ("kernel_overhead", 10**400, "kernel_overhead must be a non-negative number"),
        (
            "protocols",
            {"simple": {"bandwidth_fraction": 0}},
            "protocol 'simple': bandwidth_fraction must be in (0, 1]",
        ),
    ):
        path.write_text(json.dumps({field: value}))
        with pytest.raises(TargetError, match=re.escape(message)):
            load_target(path)
    # A share of a peak divides a time: 0 (or more than the peak) is no share.
    for field, value in (("sustained_matrix_fraction", 0), ("memory_efficiency", 1.5)):
        path.write_text(json.dumps({field: value}))
        with pytest.raises(TargetError, match=rf"{field} must be a number in \(0, 1\]"):
            load_target(path)
    with pytest.raises(TargetError, match="unknown target 'tpu'"):
        get_target("tpu")


# -- calibration ---------------------------------------------------------------------------------


PROVENANCE = {"gpu": "NVIDIA H200", "jax": "0.11.2", "date": "2026-08-30", "program": "test"}


def test_calibration_file_round_trip(tmp_path: Path) -> None:
    calibration = Calibration(
        {"h200": {"matmul": 1.25, "memory": 0.5, "all-reduce": 1.5}, "h100": {"memory": 2.0}},
        PROVENANCE,
    )
    path = tmp_path / "calibration.json"
    path.write_text(calibration.to_json())
    data = json.loads(path.read_text())
    assert data["schema"] == SCHEMA == "xla_streams.calibration.v1"
    assert data["targets"]["h200"] == {
        "matmul": 1.25,
        "memory": 0.5,
        "collective": {"all-reduce": 1.5},
    }
    assert load_calibration(path) == calibration
    assert Calibration.from_json(calibration.to_json()) == calibration
    calibrated = calibration.apply(get_target("h200"))
    assert calibrated.calibration == {"matmul": 1.25, "memory": 0.5, "all-reduce": 1.5}
    assert "NVIDIA H200" in calibrated.sources[-1]


def test_calibration_scales_each_class() -> None:
    ratios = {"matmul": 2.0, "memory": 0.5, "all-reduce": 1.5}
    calibrated = Calibration({"h100": ratios}, PROVENANCE).apply(H100)
    module = parse_module(KERNELS)
    plain, scaled = CostModel(module, H100), CostModel(module, calibrated)
    for inst in module.entry.instructions:
        before, after = plain.instruction(inst), scaled.instruction(inst)
        assert after.seconds == pytest.approx(
            before.seconds * ratios.get(before.kind, 1.0), rel=REL
        )
    group = (tuple(range(8)),)
    for kind, ratio in (("all-reduce", 1.5), ("all-gather", 1.0)):
        base = collective_cost(kind, group, 1 << 24, H100)
        cost = collective_cost(kind, group, 1 << 24, calibrated)
        assert cost.seconds == pytest.approx(base.seconds * ratio, rel=REL)
        assert cost.wire_bytes == base.wire_bytes  # sharing still splits the same bytes
    # The dot alone decides HIDDEN's step: twice as long.
    assert predict(HIDDEN, calibrated).baseline.step_time == pytest.approx(
        2 * predict(HIDDEN).baseline.step_time, rel=REL
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"targets": {"h100": {"matmul": 1.0}}},
         "schema: expected 'xla_streams.calibration.v1', got None"),
        ({"schema": SCHEMA, "targets": {"h100": {"gemm": 1.0}}},
         "targets.h100.gemm: unknown class 'gemm'; classes: matmul, memory, collective"),
        ({"schema": SCHEMA, "targets": {"h100": {"matmul": 0}}},
         "targets.h100.matmul: a ratio must be a positive number, got a number (0)"),
        ({"schema": SCHEMA, "targets": {"h100": {"matmul": True}}},
         "targets.h100.matmul: a ratio must be a positive number, got a boolean"),
        ({"schema": SCHEMA, "targets": {"h100": {"collective": {"psum": 1.0}}}},
         "targets.h100.collective.psum: unknown collective kind 'psum'"),
        ({"schema": SCHEMA, "targets": {"h100": {"collective": [1.0]}}},
         "targets.h100.collective: expected a JSON object, got a JSON array"),
        ({"schema": SCHEMA, "targets": {}}, "targets: expected the ratios of at least one target"),
        ({"schema": SCHEMA}, "targets: missing"),
        ({"schema": SCHEMA, "provenance": {"gpu": 1}, "targets": {"h100": {}}},
         "provenance.gpu: expected a string, got a number (1)"),
        ({"schema": SCHEMA, "targets": {"h100": {}}, "extra": 1},
         "unknown key(s) extra; expected schema, provenance, targets"),
    ],
)  # fmt: skip
def test_bad_calibration_files_say_what_is_wrong_and_where(
    tmp_path: Path, data: dict, message: str
) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match="^" + re.escape(f"{path}: {message}")):
        load_calibration(path)
    with pytest.raises(CalibrationError, match="^" + re.escape(f"c.json: {message}")):
        Calibration.from_json(json.dumps(data), "c.json")


def test_a_calibration_file_that_is_not_json_or_not_there(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text('{"schema": ')
    with pytest.raises(CalibrationError, match="^" + re.escape(f"{path}: not JSON: ")):
        load_calibration(path)
    missing = tmp_path / "missing.json"
    with pytest.raises(
        CalibrationError, match=re.escape(f"{missing}: cannot read the calibration")
    ):
        load_calibration(missing)


def test_calibration_for_another_target_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(Calibration({"h200": {"matmul": 1.1}}, PROVENANCE).to_json())
    with pytest.raises(CalibrationError, match="no ratios for target 'h100' .it has: h200."):
        load_calibration(path).apply(H100)
    hlo = tmp_path / "m.hlo"
    hlo.write_text(HIDDEN)
    err = io.StringIO()
    assert simulate_command(str(hlo), calibration=str(path), err=err) == 2
    assert "no ratios for target 'h100'" in err.getvalue()
    out = io.StringIO()
    assert simulate_command(str(hlo), target="h200", calibration=str(path), out=out) == 0


def test_compare_kernel_classes() -> None:
    module = parse_module(KERNELS)
    model = CostModel(module, H100)
    cost = {inst.name: model.instruction(inst) for inst in module.entry.instructions}
    # Measured: matmuls 1.5x and memory-bound kernels 0.8x the model; %conv not measured.
    measured = {
        name: c.seconds * (1.5 if c.kind == "matmul" else 0.8)
        for name, c in cost.items()
        if c.kind != "free" and name != "conv"
    }
    classes = compare_kernel_classes(module, H100, measured)
    assert classes["matmul"].instructions == 2  # the GEMM fusion and the cuBLAS call
    assert classes["matmul"].ratio == pytest.approx(1.5, rel=REL)
    assert classes["memory"].instructions == 1
    assert classes["memory"].ratio == pytest.approx(0.8, rel=REL)
    assert classes["matmul"].predicted == pytest.approx(
        cost["gemm_fusion"].seconds + cost["cublas"].seconds, rel=REL
    )


# -- the trace ---------------------------------------------------------------------------------


def _timelines(text: str, streams=(1, 2)) -> tuple[WhatIf, list]:
    module = parse_module(text)
    sim = Simulator(module, H100)
    what = what_if(module, H100, streams, ("interval", "round-robin"), simulator=sim)
    return what, record_timelines(sim, what)


def test_trace_is_a_valid_chrome_trace() -> None:
    _what, timelines = _timelines(SHARED)
    trace = json.loads(json.dumps(trace_events(timelines, "shared", H100)))
    events = trace["traceEvents"]
    assert trace["displayTimeUnit"] == "ns"
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    # K=1 (both policies alike), K=2 (alike too), the rule bound, the lower bound.
    assert len(processes) == len(timelines) == 4
    assert [r.label for r in timelines] == [
        "K=1 interval = K=1 round-robin (one collective stream, as XLA runs today)",
        "K=2 interval = K=2 round-robin",
        RULE_BOUND_LABEL,
        LOWER_BOUND_LABEL,
    ]
    assert timelines[1].configs == ((2, "interval"), (2, "round-robin"))
    slices = [e for e in events if e["ph"] == "X"]
    assert slices
    for e in events:
        assert e["ph"] in ("X", "M")
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
    for e in slices:
        assert (e["pid"], e["tid"]) in names, "every track is named"
        assert e["dur"] > 0 and e["ts"] >= 0 and e["name"]
        assert {"kind", "predicted_us"} <= set(e["args"])
    collectives = [e for e in slices if e["cat"] == "all-gather"]
    assert {e["args"]["bytes"] for e in collectives} == {4096 * 1024 * 4, 8192 * 1024 * 4}
    k2 = next(pid for pid, name in processes.items() if "K=2" in name)
    lanes = {names[(e["pid"], e["tid"])] for e in slices if e["pid"] == k2}
    assert lanes == {"compute", "collective stream 0", "collective stream 1"}
    assert names[(k2, lane_tid(COMPUTE_LANE))] == "compute"
    # Slices on one track never overlap (they would nest in the viewers).
    by_track: dict = {}
    for e in slices:
        by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_track.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end - 1e-6


# -- the HTML report -----------------------------------------------------------------------------


def test_html_is_self_contained() -> None:
    what, timelines = _timelines(SHARED)
    page = render_html(what, timelines)
    assert page.startswith("<!DOCTYPE html>")
    for forbidden in ("<script src", "<link", "@import", "url(http", " src=", "https://", "fetch("):
        assert forbidden not in page
    # The only URL is the SVG namespace; the one script is inline.
    assert set(re.findall(r"https?://[^\s\"']+", page)) == {"http://www.w3.org/2000/svg"}
    assert page.count("<script>") == 1
    assert page.count("<svg") == page.count("<details") == 4
    assert page.count("<details open>") == 2  # K=1 and the best (K=2)
    assert page.count('<g class="lane"') == 2 + 3 + 3 + 3  # compute + streams, per timeline
    assert "What if" in page and "Stream assignment" in page and "%ag.a" in page
    assert LOWER_BOUND_LABEL in page and RULE_BOUND_LABEL in page
    assert "XLA runs it on" in page and "the collective stream assigned" in page
    # Without a trace to link to, the page says how to get one.
    assert "--trace" in page
    assert 'href="t.json"' in render_html(what, timelines, trace_href="t.json")


def test_html_names_the_pairs_that_make_a_larger_k_slower() -> None:
    what, timelines = _timelines(FIRST_NEEDED)
    page = render_html(what, timelines)
    # Both policies give K=2 the same streams: one section, both explanations in it
    # (and in the notes).
    assert set(what.explanations) == {(2, "interval"), (2, "round-robin")}
    section = page[page.index("<summary>K=2 interval = K=2 round-robin") :]
    section = section[: section.index("</details>")]
    for why in what.non_monotone():
        assert f'<p class="why">{html.escape(why)}</p>' in section
        assert "%ag.a" in why and "%ag.b" in why


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _chromium_args(binary: str, tmp: Path) -> list[str]:
    return [
        binary, "--headless", "--no-sandbox", "--disable-gpu",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--no-first-run", f"--user-data-dir={tmp / 'profile'}", "--hide-scrollbars",
    ]  # fmt: skip


def _decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB rows of an 8-bit RGB/RGBA non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    width = height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0 and color in (2, 6)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw = zlib.decompress(idat)
    stride = width * channels
    prev = bytearray(stride)
    rows = []
    for y in range(height):
        start = y * (stride + 1)
        kind, cur = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        if kind == 1:
            for i in range(channels, stride):
                cur[i] = (cur[i] + cur[i - channels]) & 0xFF
        elif kind == 2:
            cur = bytearray((a + b) & 0xFF for a, b in zip(cur, prev, strict=True))
        elif kind == 3:
            for i in range(stride):
                left = cur[i - channels] if i >= channels else 0
                cur[i] = (cur[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif kind == 4:
            for i in range(stride):
                a = cur[i - channels] if i >= channels else 0
                b = prev[i]
                c = prev[i - channels] if i >= channels else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                predictor = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                cur[i] = (cur[i] + predictor) & 0xFF
        prev = cur
        rgb = bytes(cur) if channels == 3 else bytes(b for i, b in enumerate(cur) if i % 4 != 3)
        rows.append(rgb)
    return width, height, rows


def _rgb(color: str) -> bytes:
    return bytes.fromhex(color.lstrip("#"))


# Dispatched after the report's own script: a wheel turn over the middle of the first
# timeline, then what the zoom did, written where --dump-dom shows it.
_ZOOM_PROBE = """<script>
var svg = document.querySelector("svg.timeline"), box = svg.getBoundingClientRect();
var before = svg.querySelector("g.axis").textContent;
svg.dispatchEvent(new WheelEvent("wheel", {clientX: box.left + box.width * 0.6,
  clientY: box.top + box.height / 2, deltaY: -500, bubbles: true, cancelable: true}));
document.body.setAttribute("data-zoomed", svg.querySelector("g.slices").getAttribute("transform"));
document.body.setAttribute("data-axis-changed", String(before !== svg.querySelector("g.axis").textContent));
</script></body>"""


@pytest.mark.slow
def test_html_renders_with_lanes_in_headless_chromium(tmp_path: Path) -> None:
    binary = _chromium()
    assert binary is not None, "needs headless Chromium: `make test` installs Debian's chromium"
    what, timelines = _timelines(SHARED)
    page = tmp_path / "report.html"
    text = render_html(what, timelines)
    page.write_text(text, encoding="utf-8")
    url = page.as_uri()
    args = _chromium_args(binary, tmp_path)
    dom = subprocess.run(
        [*args, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert dom.count('class="lane"') == 11 and dom.count("<svg") == 4
    # The zoom script ran on every timeline.
    assert dom.count('data-zoom="ready"') == 4
    # A wheel turn zooms in around the pointer and redraws the time axis.
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("</body>", _ZOOM_PROBE), encoding="utf-8")
    dom = subprocess.run(
        [*args, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120,
        check=True,
    ).stdout  # fmt: skip
    zoomed = re.search(r'data-zoomed="translate\(170,0\) scale\(([0-9.e-]+),1\)', dom)
    assert zoomed is not None and float(zoomed.group(1)) > 1.0 / OVERSAMPLE * 2
    assert 'data-axis-changed="true"' in dom
    shot = tmp_path / "shot.png"
    subprocess.run(
        [*args, f"--screenshot={shot}", "--window-size=1280,1100", url],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    width, height, rows = _decode_png(shot.read_bytes())
    assert (width, height) == (1280, 1100)
    pixels = Counter()
    lane_rows = 0
    lane_colors = [_rgb(c) for c in LANE_BACKGROUNDS]
    for row in rows:
        colors = Counter(row[i : i + 3] for i in range(0, len(row), 3))
        pixels.update(colors)
        if sum(colors[c] for c in lane_colors) > 50:
            lane_rows += 1
    total = width * height
    white = pixels[b"\xff\xff\xff"]
    assert white < 0.97 * total, "the page is blank"
    assert len(pixels) > 50, "the page has hardly any colours"
    # Lanes are drawn (pale bands where slices leave them free) and carry collectives;
    # the bounds' sections are closed.
    assert lane_rows > 30
    assert pixels[_rgb(KIND_COLORS["all-gather"])] > 2000
    assert pixels[_rgb(KIND_COLORS["wait"])] > 500


# -- the command, the plugin hook ----------------------------------------------------------------


def test_simulate_command_writes_trace_and_html(tmp_path: Path) -> None:
    hlo = tmp_path / "shared.hlo"
    hlo.write_text(SHARED)
    out, err = io.StringIO(), io.StringIO()
    code = simulate_command(
        str(hlo), streams="1,2", policies="interval", trace=str(tmp_path / "t.json"),
        html=str(tmp_path / "r.html"), out=out, err=err,
    )  # fmt: skip
    assert code == 0, err.getvalue()
    table = out.getvalue()
    assert re.search(r"^  1  ", table, re.M) and re.search(r"^  2  ", table, re.M)
    assert LOWER_BOUND_LABEL in table and RULE_BOUND_LABEL in table
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    page = (tmp_path / "r.html").read_text()
    assert "<svg" in page and 'href="t.json"' in page
    assert simulate_command(str(hlo), streams="0", err=io.StringIO()) == 2
    assert simulate_command(str(hlo), policies="fifo", err=io.StringIO()) == 2
    assert simulate_command(str(tmp_path / "missing.hlo"), err=io.StringIO()) == 2


def test_flag_values() -> None:
    assert parse_streams("8,1, 2,2") == (1, 2, 8)
    assert parse_streams(["4"]) == (4,)
    assert parse_policies("round-robin,interval") == ("round-robin", "interval")


def test_write_visual_report_for_a_compilation(tmp_path: Path) -> None:
    compilation = Compilation(parse_module(SHARED))
    PassManager.from_spec("find-async-pairs,assign-streams{streams=2},verify-streams").run(
        compilation
    )
    trace, page = write_visual_report(
        compilation.module, compilation.pairs, tmp_path / "reports", "module_0001"
    )
    assert trace == tmp_path / "reports" / "module_0001.trace.json"
    assert page == tmp_path / "reports" / "module_0001.html"
    assert json.loads(trace.read_text())["traceEvents"]
    text = page.read_text()
    assert "K=2 interval" in text and 'href="module_0001.trace.json"' in text


@pytest.mark.slow
def test_cli_simulate(tmp_path: Path) -> None:
    hlo = tmp_path / "shared.hlo"
    hlo.write_text(SHARED)
    trace, page = tmp_path / "t.json", tmp_path / "r.html"
    # Without interference the compute time is the kernels' alone: 3x under the calibration.
    calm = tmp_path / "calm.json"
    calm.write_text('{"interference": false}')
    result = subprocess.run(
        [sys.executable, "-m", "xla_streams", "simulate", str(hlo), "--streams=1,2",
         "--policy=interval,round-robin", f"--trace={trace}", f"--html={page}", "--target=h200",
         f"--target-file={calm}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "on h200" in result.stdout and "round-robin" in result.stdout
    assert trace.exists() and page.exists()
    calibration = tmp_path / "c.json"
    calibration.write_text(Calibration({"h200": {"memory": 3.0}}, PROVENANCE).to_json())
    calibrated = subprocess.run(
        [sys.executable, "-m", "xla_streams", "simulate", str(hlo), "--streams=1",
         "--target=h200", f"--target-file={calm}", f"--calibration={calibration}",
         "--overlap-limit=4", "--sync-on-compute"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert calibrated.returncode == 0, calibrated.stderr
    compute = re.search(r"compute only: ([0-9.]+) ms", calibrated.stdout)
    plain = re.search(r"compute only: ([0-9.]+) ms", result.stdout)
    assert (
        compute
        and plain
        and float(compute.group(1)) == pytest.approx(3 * float(plain.group(1)), rel=1e-2)
    )
    bad = subprocess.run(
        [sys.executable, "-m", "xla_streams", "simulate", str(hlo), "--streams=1,99"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "99" in bad.stderr


# -- every fixture ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("path", FIXTURES, ids=[p.name for p in FIXTURES])
def test_fixture_predictions(path: Path) -> None:
    module = parse_module(path.read_text(encoding="utf-8"), str(path))
    sim = Simulator(module, H100)
    what = what_if(module, H100, (1, 2, 4, 8), ("interval", "round-robin"), simulator=sim)
    lower, rule = what.lower_bound.step_time, what.rule_bound.step_time
    assert math.isfinite(lower) and lower > 0
    assert what.baseline.compute_time <= lower * (1 + REL)
    assert lower <= rule * (1 + REL)
    unexplained = 0
    for policy in what.policies:
        times = [what.result(k, policy).step_time for k in what.streams]
        for k, t in zip(what.streams, times, strict=True):
            r = what.result(k, policy)
            assert math.isfinite(t) and t >= rule * (1 - REL), (k, policy)
            assert 0 <= r.exposed_communication <= t * (1 + REL)
            assert r.compute_time == pytest.approx(what.baseline.compute_time, rel=REL)
            assert t <= what.serial * (1 + REL)
        unexplained += sum(1 for a, b in itertools.pairwise(times) if b > a * (1 + REL))
    # Monotone in K, except where the simulator explains why not.
    assert len(what.non_monotone()) == unexplained
    for why in what.non_monotone():
        assert "share link bandwidth" in why or "queues collectives behind" in why
        assert "is waited for" in why, "the pairs that cause it are named"


def _whatif_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "whatif_table", REPO / "tools" / "whatif_table.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_readme_table_generator_runs(capsys: pytest.CaptureFixture[str]) -> None:
    script = _whatif_script()
    assert script.main([]) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert table[0] == "| module | K=1 | K=2 | K=4 | K=8 | rule bound | lower bound | policy |"
    for line in table[2:]:
        k1, *_, rule, lower, _ = (cell.split(" (")[0] for cell in line.split("|")[2:-1])
        assert float(lower) <= float(rule) * (1 + 1e-9) <= float(k1) * (1 + 1e-9), line
    names = {line.split("|")[1].strip() for line in table[2:]}
    assert names == {p.name.removesuffix(".hlo") for p in FIXTURES}


def test_the_description_follows_an_overridden_host_size() -> None:
    from xla_streams.simulate.targets import get_target, target_with_overrides

    h100 = get_target("h100")
    assert h100.description == "NVIDIA H100 SXM5 80GB, 8 GPUs per host"
    assert "4 GPUs per host" in target_with_overrides(h100, {"devices_per_host": 4}).description


def test_every_module_of_this_file_is_one_xla_reads() -> None:
    """The modules above are hand-written: XLA's own parser holds them to what XLA could
    hand the simulator (a signature that does not match its root once slipped by ours)."""
    modules = {
        name: text
        for name, text in globals().items()
        if isinstance(text, str) and text.startswith("HloModule") and "TRIP" not in text
    }
    modules["LOOP"] = _loop('backend_config={"known_trip_count":{"n":"5"}}')
    modules["OUTER"] = OUTER.replace("TRIP", "3")
    assert len(modules) >= 12
    for text in modules.values():
        hlo_bindings().hlo_module_from_text(text)
