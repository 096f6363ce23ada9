"""Measured costs of the program itself (a PGLE ``ProfiledInstructionsProto``), and the
range every prediction carries (``ranges.predict_range`` under ``errors.py``)."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import pytest

from xla_streams._wire import encode_varint
from xla_streams.hlo import parse_module
from xla_streams.simulate import (
    MODEL_ERRORS,
    ErrorScale,
    ProfileError,
    Simulator,
    get_target,
    load_profile,
    predict_range,
)
from xla_streams.simulate.errors import NOT_TIME_FACTORS
from xla_streams.simulate.profile import module_fingerprint, parse_profile
from xla_streams.streams import assign_streams

# The overlap as the model runs it without interference (test_interference.py prices it).
H100 = dataclasses.replace(get_target("h100"), perf_table_key=None, interference=False)
US = 1e-6
REL = 1e-9

MODULE = """HloModule m, is_scheduled=true, num_partitions=8, frontend_attributes={fingerprint_before_lhs="abc123"}

ENTRY %main (p: f32[1024,1024]) -> (f32[8192,1024], f32[1024,1024]) {
  %p = f32[1024,1024]{1,0} parameter(0)
  %ag = (f32[1024,1024]{1,0}, f32[8192,1024]{1,0}) all-gather-start(%p), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, use_global_device_ids=true
  %n = f32[1024,1024]{1,0} negate(%p)
  %ag.done = f32[8192,1024]{1,0} all-gather-done(%ag)
  %m = f32[1024,1024]{1,0} multiply(%n, %n)
  ROOT %t = (f32[8192,1024]{1,0}, f32[1024,1024]{1,0}) tuple(%ag.done, %m)
}
"""

PROFILE = """\
# XLA's PGLE format; times in microseconds
costs { name: "abc123::n" cost_us: 100 }
costs { name: "other::m" cost_us: 999 }
costs { name: "m.remat2" cost_us: 10 }
costs { name: "m" cost_us: 30.0 }
costs { name: "ag" cost_us: 200 }
costs { name: "gone" cost_us: 1 }
latencies { source: "ag" target: "ag.done" latency_us: 5 }
"""


def run(sim: Simulator):  # type: ignore[no-untyped-def]
    return sim.run(assign_streams(sim.pairs, 1, "interval"))


def test_measured_costs_replace_modelled_ones_by_name(tmp_path: Path) -> None:
    module = parse_module(MODULE)
    assert module_fingerprint(module) == "abc123"
    path = tmp_path / "profile.pbtxt"
    path.write_text(PROFILE)
    profile = load_profile(path)
    assert profile.latencies == 1  # read, and ignored as XLA:GPU ignores them
    measured = profile.for_module(module)
    # "abc123::n" is this module's; "other::m" another's; m's remat clone is averaged in.
    assert measured.seconds == {
        "n": pytest.approx(100 * US),
        "m": pytest.approx(20 * US),
        "ag": pytest.approx(200 * US),
        "gone": pytest.approx(1 * US),
    }
    assert measured.skipped == 1
    sim = Simulator(module, H100, measured=measured)
    result = run(sim)
    # The gather (measured start to done: 200 us) overlaps the negate (100 us); the
    # compute stream waits for it, then runs the multiply (20 us).
    assert result.step_time == pytest.approx(220 * US, rel=REL)
    assert result.exposed_communication == pytest.approx(100 * US, rel=REL)
    assert result.compute_time == pytest.approx(120 * US, rel=REL)
    assert (result.profiled_time, result.modeled_time) == (pytest.approx(320 * US), 0.0)
    assert result.profiled_fraction == 1.0
    assert any("1 name(s) not in this module (gone)" in note for note in sim.notes)


def test_a_partial_profile_says_how_much_was_measured() -> None:
    module = parse_module(MODULE)
    measured = parse_profile('costs { name: "n" cost_us: 100 }').for_module(module)
    sim = Simulator(module, H100, measured=measured)
    plain = Simulator(module, H100)
    result, model = run(sim), run(plain)
    assert result.profiled_time == pytest.approx(100 * US)
    kernels = plain.kernels()
    modelled = kernels["m"][1] + plain.specs[0].cost.seconds
    assert result.modeled_time == pytest.approx(modelled, rel=REL)
    assert 0 < result.profiled_fraction < 1
    assert model.profiled_time == 0 and model.modeled_time > 0


def _cost(name: str, cost_us: float) -> bytes:
    body = b"\x0a" + encode_varint(len(name)) + name.encode() + b"\x11" + struct.pack("<d", cost_us)
    return b"\x0a" + encode_varint(len(body)) + body


def test_a_binary_profile_reads_like_the_text(tmp_path: Path) -> None:
    path = tmp_path / "profile.pb"
    path.write_bytes(_cost("abc123::n", 100.0) + _cost("m", 20.0) + _cost("ag", 200.0))
    measured = load_profile(path).for_module(parse_module(MODULE))
    assert measured.seconds == {
        "n": pytest.approx(100 * US),
        "m": pytest.approx(20 * US),
        "ag": pytest.approx(200 * US),
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('costs { name: "n" cost_us: 1 }\ncosts { name: "m" cost_us: -3 }\n',
         r"p.pbtxt:2: cost_us of 'm' must be a non-negative number"),
        ('costs { name: "n" cost_us: 1 }\nbogus: 3\n', r"p.pbtxt:2: unknown field 'bogus'"),
        ('costs { cost_us: 1 }\n', r"p.pbtxt:1: a cost without a name"),
        ('costs { name: "n" cost_us: 1 \n', r"p.pbtxt:1: '\{' opened here is never closed"),
    ],
)  # fmt: skip
def test_a_bad_profile_says_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "p.pbtxt"
    path.write_text(text)
    with pytest.raises(ProfileError, match=message):
        load_profile(path)


def test_a_truncated_binary_profile_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "p.pb"
    path.write_bytes(_cost("n", 1.0)[:-3])
    with pytest.raises(ProfileError, match="p.pb: .*(truncated|past the end)"):
        load_profile(path)


# -- ranges ---------------------------------------------------------------------------


def test_every_prediction_has_a_range_under_the_stated_errors() -> None:
    module = parse_module(MODULE)
    sim = Simulator(module, get_target("h100"))
    r = predict_range(sim)
    expected = run(sim)
    assert r.expected == expected.step_time
    assert r.low < r.expected < r.high
    assert r.exposed_low <= r.exposed_expected <= r.exposed_high
    names = {b.name for b in r.bounds}
    assert names == {
        "matmul", "matmul_table", "attention", "sustained", "memory", "nvlink", "network",
        "latency",
        "table_small", "table_large", "profiled", "clock_recovery", "collective_hbm",
    }  # fmt: skip
    assert all(b.source for b in MODEL_ERRORS)
    assert all(b.low <= 1 <= b.high for b in MODEL_ERRORS if b.name not in NOT_TIME_FACTORS)
    data = r.to_json()
    assert data["step_ms"] == {  # type: ignore[comparison-overlap]
        "low": pytest.approx(r.low * 1e3),
        "expected": pytest.approx(r.expected * 1e3),
        "high": pytest.approx(r.high * 1e3),
    }
    # Measured times move only by their own, small, bound.
    measured = parse_profile(PROFILE).for_module(module)
    profiled = predict_range(Simulator(module, H100, measured=measured))
    assert profiled.high / profiled.expected == pytest.approx(1.05)
    assert profiled.low / profiled.expected == pytest.approx(0.95)


def test_the_held_clock_bounds_only_what_was_measured_in_bursts() -> None:
    # XLA's matmul table and cuDNN's published attention rates were measured at the boost
    # clock; the roofline and memory-bound kernels carry their own bounds alone.
    errors = ErrorScale(sustained=1.05, matmul_table=1.1, attention=1.2, matmul=1.3, memory=1.4)
    assert errors.compute("matmul_table") == pytest.approx(1.1 * 1.05)
    assert errors.compute("attention") == pytest.approx(1.2 * 1.05)
    assert (errors.compute("matmul"), errors.compute("memory")) == (1.3, 1.4)
    assert errors.compute("profiled") == 1.0


@pytest.mark.parametrize("end", ["low", "high"])
def test_a_range_end_prices_once_and_answers_as_a_compile_of_its_own(end: str) -> None:
    # The range's ends reuse the expected compile's prices (their errors scale the costs
    # in the compile, never in the cost model), on a module with a GEMM, a fusion, an
    # async collective and a sync one, and a profile for some of it.
    module = parse_module(FSDP_STEP)
    measured = parse_profile(PROFILE).for_module(module)
    sim = Simulator(module, get_target("h100"), measured=measured)
    errors = ErrorScale.at(end, MODEL_ERRORS)
    shared = sim.with_errors(errors)
    assert shared is sim.with_errors(errors)
    assert shared.cost is sim.cost
    alone = Simulator(module, get_target("h100"), measured=measured, errors=errors)
    assert alone.cost is not sim.cost
    assignment = assign_streams(sim.pairs, 1, "interval")
    assert shared.kernels() == alone.kernels()
    assert [s.cost for s in shared.specs] == [s.cost for s in alone.specs]
    assert shared.run(assignment) == alone.run(assignment)
    assert shared.run(assignment).step_time != sim.run(assignment).step_time


def test_a_cost_model_is_shared_only_by_compiles_of_its_module_and_target() -> None:
    module = parse_module(FSDP_STEP)
    sim = Simulator(module, get_target("h100"))
    with pytest.raises(ValueError, match="its module and target"):
        Simulator(parse_module(FSDP_STEP), get_target("h100"), cost=sim.cost)
    with pytest.raises(ValueError, match="its module and target"):
        Simulator(module, get_target("h200"), cost=sim.cost)


FSDP_STEP = """HloModule m, is_scheduled=true, num_partitions=8, frontend_attributes={fingerprint_before_lhs="abc123"}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%fused (a: f32[1024,1024], b: f32[1024,1024]) -> f32[1024,1024] {
  %a = f32[1024,1024]{1,0} parameter(0)
  %b = f32[1024,1024]{1,0} parameter(1)
  ROOT %d = f32[1024,1024]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (p: f32[1024,1024]) -> (f32[8192,1024], f32[1024,1024]) {
  %p = f32[1024,1024]{1,0} parameter(0)
  %ag = (f32[1024,1024]{1,0}, f32[8192,1024]{1,0}) all-gather-start(%p), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, use_global_device_ids=true
  %n = f32[1024,1024]{1,0} negate(%p)
  %g = f32[1024,1024]{1,0} fusion(%n, %p), kind=kCustom, calls=%fused
  %ag.done = f32[8192,1024]{1,0} all-gather-done(%ag)
  %m = f32[1024,1024]{1,0} multiply(%g, %n)
  %ar = f32[1024,1024]{1,0} all-reduce(%m), channel_id=2, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  ROOT %t = (f32[8192,1024]{1,0}, f32[1024,1024]{1,0}) tuple(%ag.done, %ar)
}
"""
