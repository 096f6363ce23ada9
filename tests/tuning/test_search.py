"""The search as a set: coordinate descent with joint moves, then the check of every one-
and two-lever neighbour, against the exhaustive grid of the embedded FSDP x TP scan
program (tests/tuning/data/grid_fsdp_tp_mlp_scan.json, written by tools/tune_grid.py:
48 deviceless compiles, every K and policy simulated).

The search runs here on that table of recorded predictions instead of compiling: it
takes its compiles through an evaluator (``search.Evaluator``), and this one looks
each option set up in the table and counts it as a compile.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from xla_streams import xla_options as xo
from xla_streams.tuning.levers import CollectiveCensus, Lever, canonical, flags_of, levers
from xla_streams.tuning.search import MIN_GAIN, SearchOutcome, neighbours, search
from xla_streams.tuning.session import BudgetSpent

DATA = Path(__file__).resolve().parent / "data"
GRID = json.loads((DATA / "grid_fsdp_tp_mlp_scan.json").read_text())
SCAN_CENSUS = CollectiveCensus(
    async_pairs=8,
    collectives=8,
    loop_kinds=frozenset({"all-gather", "reduce-scatter", "all-reduce"}),
    combined_kinds=frozenset(),
    within_host=True,
    sync_collectives=0,
)


def _key(flags: dict[str, object]) -> str:
    return json.dumps(canonical(flags), sort_keys=True)


@dataclass(frozen=True)
class Recorded:
    """One option set as the grid recorded it: the best step over K and policy."""

    flags: dict[str, object]
    step: float  # seconds
    fits: bool


class RecordedPredictions:
    """An evaluator over the grid's table: each option set asked for is one compile."""

    def __init__(self, grid: dict[str, Any], budget: int | None = None) -> None:
        self.table = {
            _key(row["xla_flags"]): Recorded(row["xla_flags"], row["step_ms"] / 1e3, row["fits"])
            for row in grid["grid"]
        }
        self.compiled: list[str] = [_key({})]  # the baseline
        self.budget = budget
        self.baseline = self.table[_key({})]

    def evaluate_many(self, requests: list[tuple[dict[str, object], str]]) -> list[Recorded]:
        out = []
        for flags, label in requests:
            key = _key(flags)
            assert key not in self.compiled, f"compiled twice: {label}"
            if self.budget is not None and len(self.compiled) >= self.budget:
                raise BudgetSpent(label)
            self.compiled.append(key)
            out.append(self.table[key])
        return out


def grid_levers(order: list[str] | None = None) -> list[Lever]:
    every = {lv.name: lv for lv in levers(SCAN_CENSUS)}
    return [every[name] for name in order or GRID["levers"]]


def grid_best() -> Recorded:
    return min(
        (r for r in RecordedPredictions(GRID).table.values() if r.fits), key=lambda r: r.step
    )


def test_the_table_is_the_whole_grid_of_these_levers() -> None:
    chosen = grid_levers()
    points = list(itertools.product(*(range(len(lv.settings)) for lv in chosen)))
    assert len(points) == len(GRID["grid"]) == 48  # 3 limits x 2^4
    table = RecordedPredictions(GRID).table
    assert {_key(flags_of(chosen, p)) for p in points} == set(table)
    # Recorded with the JAX that runs here: else run tools/tune_grid.py again.
    assert GRID["versions"]["jax"] == importlib.metadata.version("jax")
    assert GRID["topology"] == "2x1x8"  # 2 hosts, each its own NVLink domain


def test_the_search_finds_the_best_of_the_grid_compiling_at_most_half_of_it() -> None:
    recorded = RecordedPredictions(GRID)
    chosen = grid_levers()
    outcome = search(recorded, chosen)
    best = grid_best()
    assert outcome.best.step <= best.step * 1.01, (outcome.best.flags, best.flags)
    assert len(recorded.compiled) <= len(GRID["grid"]) // 2, len(recorded.compiled)
    # What it states, it proved on the table: no neighbour is faster by MIN_GAIN.
    assert outcome.certified and "all 20 such neighbours checked" in outcome.guarantee
    for point in neighbours(chosen, outcome.point):
        other = recorded.table[_key(flags_of(chosen, point))]
        assert not (other.fits and other.step < outcome.best.step * (1 - MIN_GAIN))
    # The best is a set: four levers moved together from XLA's defaults, and the
    # baseline is far behind it.
    assert len(outcome.best.flags) >= 3
    assert recorded.baseline.step > 1.3 * outcome.best.step


def test_any_lever_order_finds_it_too() -> None:
    best = grid_best()
    counts = []
    for order in itertools.permutations(GRID["levers"]):
        recorded = RecordedPredictions(GRID)
        outcome = search(recorded, grid_levers(list(order)))
        assert outcome.best.step <= best.step * 1.01, order
        counts.append(len(recorded.compiled))
    # Never more than 60% of the grid, whatever the order; half of it on average.
    assert max(counts) <= 0.6 * len(GRID["grid"]), max(counts)
    assert sum(counts) / len(counts) <= 0.55 * len(GRID["grid"])


def test_the_budget_stops_the_search_and_it_claims_nothing() -> None:
    recorded = RecordedPredictions(GRID, budget=6)
    outcome: SearchOutcome = search(recorded, grid_levers())
    assert not outcome.certified and outcome.guarantee.startswith("none")
    assert any("budget" in note for note in outcome.notes)
    assert len(recorded.compiled) == 6


def test_a_budget_spent_in_the_check_says_how_far_it_got() -> None:
    recorded = RecordedPredictions(GRID, budget=20)
    outcome = search(recorded, grid_levers())
    assert not outcome.certified and outcome.stopped_by == "budget_compiles"
    assert outcome.guarantee.startswith("partial: the compile budget stopped the check after ")
    assert "of the 20 one- and two-lever neighbours" in outcome.guarantee
    # A compile budget, not the clock, stopped it: the same inputs stop it in the same place.
    assert "; repeatable: " in outcome.guarantee
    again = RecordedPredictions(GRID, budget=20)
    assert search(again, grid_levers()).point == outcome.point
    assert again.compiled == recorded.compiled


def test_the_levers_that_pay_together_are_tried_first() -> None:
    """Their joint move (the overlap limit at 2, the pipeliners on, double buffering,
    start-early) is the first candidate: on this grid it is the best, so the smallest
    budget that compiles anything finds it."""
    recorded = RecordedPredictions(GRID, budget=2)
    outcome = search(recorded, grid_levers())
    best = grid_best()
    assert recorded.compiled[1] == _key(best.flags)
    assert outcome.best.step == best.step and outcome.stopped_by == "budget_compiles"
    # XLA's reduce-scatter pipeliner is on by default: the joint move leaves it there.
    reduce_scatter = xo.PIPELINE["reduce-scatter"]
    assert reduce_scatter not in best.flags


def test_the_check_reaches_the_levers_that_pay_together_first() -> None:
    every = {lv.name: lv for lv in levers(SCAN_CENSUS)}
    names = ["overlap-limit", "xla-multi-streaming", "pipeline-all-gather", "double-buffering",
             "windowed-einsum", "start-early"]  # fmt: skip
    chosen = [every[name] for name in names]
    around = neighbours(chosen, tuple(0 for _ in chosen))
    moved = [{names[i] for i, v in enumerate(p) if v} for p in around]
    together = {"overlap-limit", "pipeline-all-gather", "double-buffering", "start-early"}
    first = [m for m in moved if m <= together]
    # Every change of those levers alone (singles and pairs), then the other levers'.
    assert moved[: len(first)] == first and len(first) == 2 + 1 + 1 + 1 + (2 + 2 + 2 + 1 + 1 + 1)
    rest = moved[len(first) :]
    assert [m for m in rest if len(m) == 1] == rest[:2]  # the other singles, then pairs
    assert all(m - together for m in rest)


@pytest.mark.parametrize(
    ("names", "count"),
    [
        (["overlap-limit"], 2),
        (["overlap-limit", "start-early"], 2 + 1 + 2),
        # 3-valued limit x four toggles: 6 single changes, 8 + 6 pairs.
        (
            [
                "overlap-limit",
                "pipeline-all-gather",
                "pipeline-reduce-scatter",
                "double-buffering",
                "start-early",
            ],
            6 + 8 + 6,
        ),
    ],
)
def test_neighbours_are_every_one_and_two_lever_change(names: list[str], count: int) -> None:
    chosen = grid_levers(names)
    start = tuple(0 for _ in chosen)
    around = neighbours(chosen, start)
    assert len(around) == len(set(around)) == count
    assert all(1 <= sum(a != b for a, b in zip(p, start, strict=True)) <= 2 for p in around)


def test_size_levers_are_checked_one_at_a_time() -> None:
    census = CollectiveCensus(8, 8, frozenset({"all-reduce"}), frozenset(), True, 0,
                  kind_bytes=(("all-reduce", 1 << 30),))  # fmt: skip
    every = {lv.name: lv for lv in levers(census)}
    sweep = every["all-reduce-combine"]
    # 16 MiB doubling up to the 1 GiB all-reduced (XLA's 30 MiB default aside).
    assert sweep.labels[1:] == ("16 MiB", "32 MiB", "64 MiB", "128 MiB", "256 MiB",
                                "512 MiB", "1.00 GiB")  # fmt: skip
    chosen = [every["overlap-limit"], every["start-early"], sweep]
    around = neighbours(chosen, (0, 0, 0))
    # Single changes of all three; pairs only of the two scheduling levers.
    assert len(around) == 2 + 1 + 7 + 2 * 1
