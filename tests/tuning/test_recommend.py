"""What the tuner predicts and when it recommends: each candidate's range, the rule that
a recommendation's gain over XLA's defaults clears the margin at both ends of it, XLA's own multi-streaming on
the streams XLA gives it, a performance table and a PGLE profile, and what it says about
XLA_FLAGS. On the repository's fixture modules with a stand-in compiler (no JAX compile).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest
from conftest import CompiledStandIn

from xla_streams import xla_options as xo
from xla_streams.collectives import StreamModel
from xla_streams.hlo import parse_module
from xla_streams.simulate import Simulator, get_target, xla_stream_assignment
from xla_streams.simulate.measured import DEFAULT_TABLE_PATH
from xla_streams.streams import assign_streams, find_async_pairs
from xla_streams.tuning import evaluation, recommendation
from xla_streams.tuning.driver import tune_lowered
from xla_streams.tuning.result import Configuration, TuneError, TuneResult

FIXTURES = Path(__file__).resolve().parents[2] / "hlo_fixtures"
LIMIT = xo.OVERLAP_LIMIT


class _Fixtures:
    """fsdp_scan on 8 H100s: the fixture of the overlap limit asked for."""

    def compile(self, compiler_options: dict[str, object]) -> CompiledStandIn:
        limit = compiler_options[LIMIT]
        name = "default" if limit == 1 else f"limit{limit}"
        return CompiledStandIn((FIXTURES / f"fsdp_scan.{name}.text.hlo").read_text(), temp=1 << 30)


def _tune(**kwargs: Any) -> TuneResult:
    kwargs.setdefault("levers", ["overlap-limit"])
    return tune_lowered(_Fixtures(), program="fsdp_scan", devices=8, **kwargs)


def test_every_candidate_carries_its_range_in_the_table_and_the_file() -> None:
    result = _tune()
    for c in (result.baseline, *result.candidates):
        assert c.step_low_ms is not None and c.step_high_ms is not None
        assert c.step_low_ms < c.predicted_step_ms < c.step_high_ms
    data = json.loads(result.json_text())
    for c in data["candidates"]:
        spread = c["predicted_step_range_ms"]
        assert spread["low"] < spread["expected"] == c["predicted_step_ms"] < spread["high"]
    table = result.table()
    assert "range ms" in table
    base = result.baseline
    assert f"{base.step_low_ms:.3f}-{base.step_high_ms:.3f}" in table


def test_the_pick_and_the_defaults_are_also_predicted_without_interference() -> None:
    """For the share of the pick's gain that interference takes back: both re-simulated
    on the streams they were predicted on, the simulator's interference term off."""
    result = _tune()
    assert result.pick is not None
    quiet = dataclasses.replace(get_target("h100"), interference=False)
    for c in (result.baseline, result.pick):
        limit = int(str(c.xla_flags.get(LIMIT, 1)))
        text = _Fixtures().compile({LIMIT: limit}).as_text()
        module = parse_module(text)
        pairs = tuple(find_async_pairs(module, StreamModel(limit, True)))
        step = Simulator(module, quiet, pairs).run(assign_streams(pairs, c.streams, c.policy))
        assert c.step_without_interference_ms == pytest.approx(step.step_time * 1e3)
    assert all(c.step_without_interference_ms is None for c in result.candidates)


def _configuration(step: float, low: float, high: float, flags: dict[str, object]) -> Configuration:
    return Configuration(flags, 1, "interval", step, 1 << 30, step_low_ms=low, step_high_ms=high)


@pytest.mark.parametrize(
    ("candidate", "why"),
    [
        # Faster by 1% or more as modelled and at both ends: a reliable gain.
        ((9.0, 8.0, 11.0), None),
        # Faster as modelled, but slower than the defaults on the pessimistic machine
        # (more overlap, more interference): no reliable gain.
        ((9.0, 8.0, 12.5), "0.960x at the pessimistic end of the range"),
        ((9.0, 9.5, 11.0), "0.947x at the optimistic end of the range"),
        # Faster at both ends, but by less than the 1% margin at one: its gain lies
        # inside the model's uncertainty.
        ((9.0, 8.0, 11.95), "1.004x at the pessimistic end of the range"),
        ((9.0, 8.95, 11.0), "1.006x at the optimistic end of the range"),
        # Within the 1% margin as modelled: no reliable gain, whatever the ends say.
        ((9.95, 8.0, 11.0), "below the 1% margin"),
    ],
)
def test_a_gain_is_reliable_only_beyond_the_margin_at_every_end_of_the_range(
    candidate: tuple[float, float, float], why: str | None
) -> None:
    base = _configuration(10.0, 9.0, 12.0, {})
    pick = _configuration(*candidate, {LIMIT: 2})
    reason = recommendation._unreliable(pick, base)
    if why is None:
        assert reason is None
    else:
        assert reason is not None and why in reason and "overlap-limit=2" in reason, reason


def test_a_lever_the_model_prices_as_no_gain_is_left_out_of_the_pick() -> None:
    """The search keeps a lever that gains less than its 0.5% step; the pick leaves out
    every lever whose return to XLA's default is predicted no slower."""
    early = xo.START_AS_EARLY_AS_POSSIBLE

    def evaluation(index: int, flags: dict[str, object], step_s: float, module: str) -> Any:
        return SimpleNamespace(index=index, flags=flags, step=step_s, fits=True, fingerprint=module)

    base = evaluation(0, {}, 10e-3, "a")
    found = evaluation(1, {LIMIT: 2, early: True}, 9e-3, "b")
    alone = evaluation(2, {LIMIT: 2}, 8.99e-3, "c")  # start-early priced as a loss
    slower = evaluation(3, {early: True}, 9.5e-3, "d")
    evaluations = [base, found, alone, slower]
    assert recommendation._leanest(found, evaluations) is alone
    assert recommendation._left_out(found, alone) == (
        "left out start-early=on: the model prices it as no gain (the search's result is "
        "9.000 ms with it, 8.990 ms without)"
    )
    # Priced a gain, however small: kept.
    alone.step = 9.01e-3
    assert recommendation._leanest(found, evaluations) is found
    # One that does not fit is never the pick.
    alone.step, alone.fits = 8.99e-3, False
    assert recommendation._leanest(found, evaluations) is found


def test_xla_multi_streaming_is_predicted_on_the_streams_xla_gives() -> None:
    text = (FIXTURES / "fsdp_scan.limit2.text.hlo").read_text()
    target = get_target("h100")
    flags = {LIMIT: 2, xo.MULTI_STREAMING: True}
    predicted = evaluation.predict(text, flags, target)
    module = parse_module(text)
    pairs = tuple(find_async_pairs(module, StreamModel(2, True)))
    assignment = xla_stream_assignment(module, pairs, multi_streaming=True)
    expected = Simulator(module, target, pairs).run(assignment)
    assert predicted.results == {
        (1, "interval"): (expected.step_time, expected.exposed_communication)
    }
    assert predicted.what is None and set(predicted.ranges) == {(1, "interval")}
    assert sorted(set(assignment.stream_of.values()) - {None}) == [0, 1]


@pytest.mark.slow
def test_a_pgle_profile_gives_its_instructions_their_measured_time(tmp_path: Path) -> None:
    plain = _tune()
    profile = tmp_path / "profile.pbtxt"
    profile.write_text('costs { name: "loop_broadcast_fusion" cost_us: 10000 }\n')
    measured = _tune(profile=profile)
    # One kernel measured at 10 ms: the step on the compute stream grows by about that.
    grew = measured.baseline.predicted_step_ms - plain.baseline.predicted_step_ms
    assert 9.0 < grew <= 10.0
    profile.write_text("costs { name: ")
    with pytest.raises(TuneError, match="^profile: "):
        _tune(profile=profile)


@pytest.mark.slow
def test_a_perf_table_prices_the_collectives_it_measured(tmp_path: Path) -> None:
    # XLA's own table (the one vendored as the default): the same predictions.
    same = _tune(perf_table=DEFAULT_TABLE_PATH)
    assert same.baseline.predicted_step_ms == pytest.approx(_tune().baseline.predicted_step_ms)
    bad = tmp_path / "table.pbtxt"
    bad.write_text("entries { key: 1 }")
    with pytest.raises(TuneError, match="^perf table: "):
        _tune(perf_table=bad)


@pytest.mark.slow
def test_inherited_xla_flags_are_shown_in_full_and_dump_flags_warned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    flags = "--xla_gpu_enable_latency_hiding_scheduler=true --xla_dump_to=/tmp/dump"
    monkeypatch.setenv("XLA_FLAGS", flags)
    notes = "\n".join(_tune().notes)
    assert f"XLA_FLAGS is set in this process: {flags!r}" in notes
    assert "--xla_dump_to: every candidate's compile writes its dump" in notes
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_latency_hiding_scheduler=true")
    assert "writes its dump" not in "\n".join(_tune().notes)
    monkeypatch.delenv("XLA_FLAGS")
    assert not any("XLA_FLAGS" in n for n in _tune().notes)
