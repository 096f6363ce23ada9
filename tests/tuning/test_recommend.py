"""What the tuner predicts and when it recommends: each candidate's range, the rule that
a recommendation beats XLA's defaults at both ends of it, XLA's own multi-streaming on
the streams XLA gives it, a performance table and a PGLE profile, and what it says about
XLA_FLAGS. On the repository's fixture modules with a stand-in compiler (no JAX compile).
"""

from __future__ import annotations

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
from xla_streams.simulate import PredictionRange, Simulator, get_target, xla_stream_assignment
from xla_streams.simulate.measured import DEFAULT_TABLE_PATH
from xla_streams.streams import find_async_pairs
from xla_streams.tuning import evaluation, recommendation
from xla_streams.tuning.driver import tune_lowered
from xla_streams.tuning.result import TuneError, TuneResult

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


def _candidate(step: float, low: float, high: float, flags: dict[str, object]) -> Any:
    spread = PredictionRange(low, step, high, 0.0, 0.0, 0.0)
    return SimpleNamespace(step=step, flags=flags, range=lambda key=None: spread)


@pytest.mark.parametrize(
    ("candidate", "why"),
    [
        # Faster as modelled and at both ends: recommended.
        ((9.0, 8.0, 11.0), None),
        # Faster as modelled, but slower than the defaults on the pessimistic machine
        # (more overlap, more interference): not recommended.
        ((9.0, 8.0, 12.5), "not faster at the pessimistic end of the range"),
        ((9.0, 9.5, 11.0), "not faster at the optimistic end of the range"),
        # Within the 1% margin as modelled: not recommended, whatever the ends say.
        ((9.95, 8.0, 11.0), "below the 1% margin"),
    ],
)
def test_a_recommendation_beats_the_defaults_at_both_ends(
    candidate: tuple[float, float, float], why: str | None
) -> None:
    base = _candidate(10.0, 9.0, 12.0, {})
    found = _candidate(*candidate, {LIMIT: 2})
    reason = recommendation._beats(found, base)
    if why is None:
        assert reason is None
    else:
        assert reason is not None and why in reason and "overlap-limit=2" in reason


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
