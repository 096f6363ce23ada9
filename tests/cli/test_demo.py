"""The end of ``xla-streams demo``'s story, from the predictions (the whole demo, compiled
without a GPU, runs in tests/plugin/test_native_streams.py): the rows against XLA's
defaults, why K streams buy what they buy, and the predicted effect of what the demo
turned on as the last line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from xla_streams.cli.demo import MODEL, story
from xla_streams.hlo import parse_module
from xla_streams.simulate import WhatIf, get_target, what_if
from xla_streams.tuning.result import load_tune_result

REPO = Path(__file__).resolve().parents[2]
TUNED = load_tune_result(REPO / "tests" / "data" / "tune_fsdp_tp_mlp_scan.json")


def _predicted(fixture: str, streams: int) -> WhatIf:
    path = REPO / "hlo_fixtures" / f"{fixture}.limit4.text.hlo"
    module = parse_module(path.read_text(), str(path))
    return what_if(module, get_target("h100"), sorted({1, streams}), ["interval"], model=MODEL)


def _rows(text: str) -> dict[str, tuple[float, float]]:
    """Row label -> (ms, ratio against the first row)."""
    found = re.findall(r"^  (.+?) +(\d+\.\d{3}) ms  (\d\.\d{3})x$", text, re.M)
    return {label: (float(ms), float(ratio)) for label, ms, ratio in found}


def test_the_last_line_is_the_predicted_effect_of_what_the_demo_turned_on() -> None:
    what = _predicted("transformer_step", 4)
    text = story(what, 4, "interval", 4, TUNED, "transformer_step")
    rows = _rows(text)
    labels = list(rows)
    assert labels[0] == "XLA's defaults: overlap limit 1, 1 stream"
    assert labels[1:3] == [
        "the demo's compile (overlap limit 4), 1 stream",
        "what the demo turned on: overlap limit 4, 4 collective streams, interval",
    ]
    assert labels[3].startswith(f"tune's pick: {TUNED.best.settings}, 2 collective streams")
    base = TUNED.baseline.predicted_step_ms
    turned_on = what.result(4, "interval").step_time * 1e3
    assert rows[labels[2]] == (round(turned_on, 3), round(base / turned_on, 3))
    last = text.splitlines()[-1]
    assert last == (
        "Predicted effect of what the demo turned on (overlap limit 4, 4 collective streams): "
        f"{base / turned_on:.3f}x of XLA's defaults on this program ({turned_on:.3f} ms a "
        f"step against {base:.3f} ms)."
    )
    assert f"to run tune's pick: {TUNED.command}" in text


@pytest.mark.parametrize(
    ("fixture", "why"),
    [
        # Slower on 4 streams: the simulator's own explanation, naming the pairs.
        ("transformer_step", "ms): collectives that now run at the same time share link "
                             "bandwidth"),
        ("tp_dp_2d", "ms of the communication one stream leaves exposed"),
        ("fsdp_unrolled", "every collective stays on one stream: those in flight together "
                          "share two or more devices, and the deadlock rule keeps them"),
    ],
)  # fmt: skip
def test_why_k_streams_buy_what_they_buy(fixture: str, why: str) -> None:
    text = story(_predicted(fixture, 4), 4, "interval", 4, "not here", fixture)
    (line,) = [line for line in text.splitlines() if line.startswith("why 4 streams: ")]
    assert why in line


def test_without_tune_the_effect_is_against_one_stream() -> None:
    what = _predicted("tp_dp_2d", 2)
    text = story(what, 2, "interval", 2, "tune compiles without a GPU", "tp_dp_2d")
    assert list(_rows(text)) == [
        "the demo's compile (overlap limit 2), 1 stream",
        "what the demo turned on: overlap limit 2, 2 collective streams, interval",
    ]
    assert "tune could not run here: tune compiles without a GPU" in text
    one, two = (what.result(k, "interval").step_time * 1e3 for k in (1, 2))
    assert text.splitlines()[-1].endswith(
        f"{one / two:.3f}x of the demo's compile on one stream on this program "
        f"({two:.3f} ms a step against {one:.3f} ms)."
    )
