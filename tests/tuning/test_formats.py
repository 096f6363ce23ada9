"""The tuner's two JSON formats round-trip: a tune result (``xla_streams.tune.v1``) and a
compile cache entry (``xla_streams.tune_cache.v2``) read back as what was written, and an
entry that is not one is a miss. No compile.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import pytest

from xla_streams import _json
from xla_streams import xla_options as xo
from xla_streams.tuning.cache import CACHE_SCHEMA, CompileCache, Compiled, Refused
from xla_streams.tuning.compiling import CachedCompiler
from xla_streams.tuning.result import (
    Configuration,
    Dropped,
    TuneError,
    TuneResult,
    XlaOpinion,
    load_tune_result,
)

LIMIT, PAG = xo.OVERLAP_LIMIT, xo.PIPELINE["all-gather"]


def _result() -> TuneResult:
    """A result with every field the file holds set, to values the file keeps exactly."""
    xla = XlaOpinion(9.5, 9.25, 1.5, placeholders=("fusion-start.1",), unpriced=("ag-start",))
    base = Configuration({}, 1, "interval", 10.0, 1000, 2.0, step_low_ms=9.0, step_high_ms=12.5,
                         xla=xla, step_without_interference_ms=9.5)  # fmt: skip
    best = Configuration({LIMIT: 2, PAG: xo.PIPELINING_ON}, 2, "round-robin", 8.0, 1100, 0.5,
                         step_low_ms=7.25, step_high_ms=11.0,
                         xla=XlaOpinion(8.5, 8.25, 0.75),
                         step_without_interference_ms=7.0)  # fmt: skip
    candidates = (
        Configuration(dict(best.xla_flags), 2, "round-robin", 8.0, 1100, 0.5, compile_s=1.5,
                      by_streams={1: 9.0, 2: 8.0}, step_low_ms=7.25, step_high_ms=11.0),
        Configuration({}, 1, "interval", 10.0, 1000, 2.0, compile_s=1.25, by_streams={1: 10.0}),
        Configuration({LIMIT: 4}, 4, "interval", 7.5, 90 << 30, 0.25, compile_s=2.0,
                      fits=False),
    )  # fmt: skip
    return TuneResult(
        "train.py:build", "h100", 16, 8, base, best, candidates, "XLA_FLAGS=... python train.py",
        hbm_bytes=80 << 30, headroom=0.2, verdict="found", reasons=("r",), skipped=("s: why",),
        notes=("n1", "n2"), elapsed_s=12.5, budget_s=60.0, compiles=3, cache_hits=1,
        evaluated=4, guarantee="no change of one lever", topology="2x1x8",
        dropped=(Dropped({LIMIT: 4, PAG: xo.PIPELINING_ON}, "read", "HloError: <tune>:3:1: x"),),
        budget_compiles=40, stopped_by="budget_s", second_opinion="agrees: 1.121x by XLA",
        decision="recommended", pick=best,
    )  # fmt: skip


def test_a_tune_result_reads_back_as_written(tmp_path: Path) -> None:
    result = _result()
    doc = _json.Value(result.to_json(), "tune.json", "", TuneError)
    assert TuneResult.from_json(doc) == result
    path = tmp_path / "tune.json"
    path.write_text(result.json_text())
    assert load_tune_result(path) == result
    # The file is a fixed point: what is read back writes the same bytes.
    assert load_tune_result(path).json_text() == result.json_text()


def test_the_share_of_the_gain_interference_takes_back() -> None:
    result = _result()
    # 2.5 ms a step saved without interference (9.5 - 7.0), 2 ms with it: it takes 20%.
    assert result.interference_share == pytest.approx(0.2)
    assert result.to_json()["interference_share"] == 0.2
    assert "interference: takes back 20.0% of the pick's predicted gain" in result.table()
    no_gain = dataclasses.replace(
        result, pick=dataclasses.replace(result.best, step_without_interference_ms=9.5)
    )
    assert no_gain.interference_share is None  # nothing to take back without it
    assert "interference:" not in no_gain.table()


def test_a_tune_result_written_before_the_decision_reads_with_its_defaults() -> None:
    """Files of the same schema written before tune recorded its decision, its pick and
    the steps without interference (tests/data/tune_*.json once were) still read."""
    data = _result().to_json()
    for key in ("decision", "pick", "interference_share"):
        del data[key]
    for c in (data["baseline"], data["best"]):
        del c["predicted_step_ms_without_interference"]
    old = TuneResult.from_json(_json.Value(data, "tune.json", "", TuneError))
    assert (old.decision, old.pick, old.interference_share) == ("", None, None)
    assert old.best.step_without_interference_ms is None
    assert old.best.xla_flags == _result().best.xla_flags


def test_a_tune_result_field_of_the_wrong_type_is_named() -> None:
    data = _result().to_json()
    data["candidates"][0]["step_ms_by_streams"] = {"two": 8.0}
    doc = _json.Value(data, "tune.json", "", TuneError)
    with pytest.raises(TuneError, match=r"^tune.json: candidates\[0\].step_ms_by_streams.two: "):
        TuneResult.from_json(doc)
    data = _result().to_json()
    data["notes"] = ["n", 3]
    with pytest.raises(TuneError, match=r"^tune.json: notes\[1\]: expected a string"):
        TuneResult.from_json(_json.Value(data, "tune.json", "", TuneError))
    data = _result().to_json()
    data["decision"] = "maybe"
    with pytest.raises(TuneError, match=r"^tune.json: decision: expected one of"):
        TuneResult.from_json(_json.Value(data, "tune.json", "", TuneError))
    # JSON reads an integer of any length; one beyond any float is no number.
    data = _result().to_json()
    data["baseline"]["predicted_step_ms"] = 10**400
    with pytest.raises(TuneError, match=r"^tune.json: baseline.predicted_step_ms: expected a "):
        TuneResult.from_json(_json.Value(data, "tune.json", "", TuneError))


def _doc(data: object) -> _json.Value:
    return _json.Value(data, "entry.json.gz", "", ValueError)


def test_a_cache_entry_reads_back_as_written(tmp_path: Path) -> None:
    xla = XlaOpinion(9.5, 9.25, 1.5, ("fusion-start.1",), spans=(("all-gather-start", 128.5, 8),))
    compiled = Compiled("HloModule m\n", (1, 2, 0, 4, 3), 1.5, xla)
    again = Compiled.from_json(_doc(compiled.to_json()))
    assert again == compiled and again.xla is not None and again.xla.spans == xla.spans
    missing = Compiled("m", (1, 2, 0, 4, 3), 1.5, xla_missing="ScheduleError: bad number")
    assert Compiled.from_json(_doc(missing.to_json())) == missing
    refused = Refused("INVALID_ARGUMENT: no")
    assert str(Refused.from_json(_doc(refused.to_json()))) == str(refused)
    cache = CompileCache(tmp_path)
    cache.store("ab" * 32, compiled)
    cache.store("cd" * 32, refused)
    assert cache.stores == 2
    # What the cache gives back came from it.
    assert cache.load("ab" * 32) == Compiled(
        "HloModule m\n", (1, 2, 0, 4, 3), 1.5, xla, cached=True
    )
    again = cache.load("cd" * 32)
    assert isinstance(again, Refused) and str(again) == str(refused)
    assert cache.load("ef" * 32) is None


@pytest.mark.parametrize(
    "data",
    [
        {
            "schema": "xla_streams.tune_cache.v1",
            "text": "m",
            "memory": [1, 2, 3, 4, 5],
            "compile_s": 1.0,
        },  # an entry from before XLA's estimate: compiled again
        {
            "schema": CACHE_SCHEMA,
            "text": "m",
            "memory": [1, 2, 3, 4],
            "compile_s": 1.0,
            "xla_estimate": None,
            "xla_missing": "",
        },
        {
            "schema": CACHE_SCHEMA,
            "text": "m",
            "memory": [1, 2, 3, 4, True],
            "compile_s": 1.0,
            "xla_estimate": None,
            "xla_missing": "",
        },
        {
            "schema": CACHE_SCHEMA,
            "text": 5,
            "memory": [1, 2, 3, 4, 5],
            "compile_s": 1.0,
            "xla_estimate": None,
            "xla_missing": "",
        },
        {
            "schema": CACHE_SCHEMA,
            "text": "m",
            "memory": [1, 2, 3, 4, 5],
            "compile_s": 1.0,
            "xla_estimate": {
                "step_ms": 1.0,
                "priced_step_ms": 1.0,
                "exposed_communication_ms": 0.0,
                "placeholders": [],
                "unpriced": [],
                "spans": [["all-gather-start", 1.0]],
            },
            "xla_missing": "",
        },
        {"schema": CACHE_SCHEMA, "refused": 5},
        [],
    ],
)
def test_a_cache_entry_that_is_not_one_is_a_miss(tmp_path: Path, data: object) -> None:
    cache = CompileCache(tmp_path)
    key = "ab" * 32
    path = tmp_path / key[:2] / f"{key}.json.gz"
    path.parent.mkdir()
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    assert cache.load(key) is None
    with pytest.raises(ValueError, match=r"^entry.json.gz: "):
        (Refused if isinstance(data, dict) and "refused" in data else Compiled).from_json(
            _doc(data)
        )


class _Unread:
    """A compiler whose compiles carry a schedule this package could not read."""

    workers = 1

    def compile_many(self, options: list[dict[str, object]]) -> list[Compiled]:
        return [Compiled("m", (1, 2, 0, 4, 3), 1.0, None, "ScheduleError: x: -inf", False)]

    def will_compile(self, options: dict[str, object]) -> bool:
        return True

    def close(self) -> None:
        pass


def test_a_compile_whose_schedule_could_not_be_read_is_not_kept(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path)
    compiler = CachedCompiler(_Unread(), cache, {"module": "m"})
    (found,) = compiler.compile_many([{}])
    assert isinstance(found, Compiled) and found.xla_missing.endswith("-inf")
    # A later version of the reader may read it: the next tune compiles it again.
    assert cache.stores == 0 and compiler.will_compile({})
