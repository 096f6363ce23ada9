"""A tune survives a bad candidate: one XLA refuses, one whose compiled module cannot be
read or simulated, one XLA gives no usable memory figures for. Each is dropped with its
reason (the table, the file, a note) and the search goes on; only XLA's defaults failing
is an error. On the repository's fsdp_scan fixtures with a stand-in compiler: the
candidate with the overlap limit at 2 is the bad one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import CompiledStandIn

from xla_streams import _json
from xla_streams import xla_options as xo
from xla_streams.tuning.driver import tune_lowered
from xla_streams.tuning.result import TuneError, TuneResult

FIXTURES = Path(__file__).resolve().parents[2] / "hlo_fixtures"
LIMIT = xo.OVERLAP_LIMIT
GOOD = (FIXTURES / "fsdp_scan.limit2.text.hlo").read_text()
# Cut inside its first computation: the front end cannot read it.
CUT = GOOD[: GOOD.index("\n}\n")]
# Read, and its async pairs found, but no simulator can run a loop without its body.
NO_BODY = """HloModule cannot_run

ENTRY e {
  p = f32[8]{0} parameter(0)
  ROOT w = f32[8]{0} while(p)
}
"""


class _BadAtLimit2:
    """fsdp_scan on 8 H100s; the overlap limit 2 gets ``bad``: an exception to raise, or
    (text, temporaries, resident bytes) to compile to."""

    def __init__(self, bad: Exception | tuple[str, int, int], limit: int = 2) -> None:
        self.bad = bad
        self.limit = limit

    def compile(self, compiler_options: dict[str, object]) -> CompiledStandIn:
        limit = compiler_options[LIMIT]
        if limit == self.limit:
            if isinstance(self.bad, Exception):
                raise self.bad
            text, temp, resident = self.bad
            return CompiledStandIn(text, temp, resident)
        name = "default" if limit == 1 else f"limit{limit}"
        return CompiledStandIn((FIXTURES / f"fsdp_scan.{name}.text.hlo").read_text(), 1 << 30)


def _tune(compiler: Any) -> TuneResult:
    return tune_lowered(compiler, program="fsdp_scan", devices=8, levers=["overlap-limit"])


CASES = {
    "compile": (RuntimeError("INTERNAL: a crash in XLA"), "RuntimeError: INTERNAL: a crash"),
    "read": ((CUT, 1 << 30, 0), "HloError: <tune>:"),
    "simulate": ((NO_BODY, 1 << 30, 0), "while without body= or condition="),
    "memory": ((GOOD, 0, 0), "XLA gave no memory figures for it"),
}


@pytest.mark.slow
@pytest.mark.parametrize("stage", sorted(CASES))
def test_a_bad_candidate_is_dropped_with_its_reason_and_the_search_goes_on(stage: str) -> None:
    bad, reason = CASES[stage]
    result = _tune(_BadAtLimit2(bad))
    (dropped,) = result.dropped
    assert dropped.xla_flags == {LIMIT: 2} and dropped.stage == stage
    assert reason in dropped.reason and "\n" not in dropped.reason
    # The search went on: the limit 4 was compiled, and every neighbour checked.
    assert [c.xla_flags for c in result.candidates if c.xla_flags] == [{LIMIT: 4}]
    assert result.evaluated == 3 and "all 2 such neighbours checked" in result.guarantee
    # Said in the table, the note and the file.
    row = [line for line in result.table().splitlines() if "<- dropped" in line]
    assert len(row) == 1 and "overlap-limit=2  <- dropped: " in row[0] and reason in row[0]
    assert any(n.startswith("dropped 1 candidate(s), 1 because ") for n in result.notes)
    data = json.loads(result.json_text())
    assert data["dropped"][0]["stage"] == stage and reason in data["dropped"][0]["reason"]
    again = TuneResult.from_json(_json.loads(result.json_text(), "tune.json", TuneError))
    assert again.dropped == result.dropped


def test_memory_figures_that_do_not_add_up_are_dropped_too() -> None:
    result = _tune(_BadAtLimit2((GOOD, 1 << 20, -(4 << 20))))
    assert [d.stage for d in result.dropped] == ["memory"]
    assert "do not add up" in result.dropped[0].reason


@pytest.mark.parametrize("stage", sorted(CASES))
def test_xla_s_defaults_failing_is_an_error_naming_the_stage(stage: str) -> None:
    bad, reason = CASES[stage]
    with pytest.raises(TuneError) as e:
        _tune(_BadAtLimit2(bad, limit=1))
    assert reason in str(e.value) and "\n" not in str(e.value)
    prefix = "XLA could not compile the program" if stage == "compile" else "XLA's defaults: "
    assert str(e.value).startswith(prefix)
