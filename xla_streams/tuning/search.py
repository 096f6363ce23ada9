"""The search over the levers: their joint move, coordinate descent with joint moves,
then the check of every one- and two-lever neighbour of the result (``search``); or the
whole grid (``exhaustive``). The method and its guarantee: docs/tune.md, "The search"."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from xla_streams.tuning.levers import Flags, Lever, Point, describe_point, flags_of
from xla_streams.tuning.session import BudgetSpent

# A move is kept only when it makes the current best this much faster.
MIN_GAIN = 0.005
# The final check compiles this many neighbours at a time (and moves as soon as one
# batch holds a faster one).
CHECK_BATCH = 8


class Evaluator(Protocol):
    """What the search needs: the baseline, and a way to evaluate option sets (None: XLA
    refused one). :class:`Session` is one; a table of recorded predictions is another."""

    @property
    def baseline(self) -> Any: ...

    def evaluate_many(self, requests: Sequence[tuple[Flags, str]]) -> Sequence[Any]: ...


@dataclass
class SearchOutcome:
    """Where the search ended: the best candidate found and its point, whether the check
    of its neighbours completed (the guarantee holds), and notes."""

    best: Any
    point: Point
    certified: bool
    neighbours: int
    notes: list[str]
    guarantee: str
    stopped_by: str = ""  # the budget that stopped it (BudgetSpent.budget), "" for none


def _replace(point: Point, index: int, value: int) -> Point:
    return (*point[:index], value, *point[index + 1 :])


def neighbours(chosen: Sequence[Lever], point: Point) -> list[Point]:
    """Every configuration that differs from ``point`` in one lever, or in two levers
    that pair (:attr:`Lever.pairs`): first those that change only levers that pay
    together (:attr:`Lever.together`), then the other single changes, then the other
    pairs, each in lever order."""
    every = _neighbours(chosen, point)

    def group(other: Point) -> int:
        changed = [i for i, (a, b) in enumerate(zip(other, point, strict=True)) if a != b]
        if all(chosen[i].together is not None for i in changed):
            return 0
        return 1 if len(changed) == 1 else 2

    return sorted(every, key=group)  # stable: lever order within each group


def _neighbours(chosen: Sequence[Lever], point: Point) -> list[Point]:
    out: list[Point] = []
    n = len(chosen)
    for i in range(n):
        for v in range(len(chosen[i].settings)):
            if v != point[i]:
                out.append(_replace(point, i, v))
    for i in range(n):
        if not chosen[i].pairs:
            continue
        for j in range(i + 1, n):
            if not chosen[j].pairs:
                continue
            for v in range(len(chosen[i].settings)):
                if v == point[i]:
                    continue
                for w in range(len(chosen[j].settings)):
                    if w != point[j]:
                        out.append(_replace(_replace(point, i, v), j, w))
    return out


def search(session: Evaluator, chosen: Sequence[Lever]) -> SearchOutcome:
    """The joint move of the levers that pay together, coordinate descent with joint
    moves, then the check of every one- and two-lever neighbour of the result
    (docs/tune.md, "The search")."""
    base = session.baseline
    start: Point = tuple(0 for _ in chosen)
    known: dict[Point, Any] = {start: base}
    names = [lv.name for lv in chosen]
    db = names.index("double-buffering") if "double-buffering" in names else None

    def run(points: Sequence[Point], why: str) -> list[Any]:
        todo = [p for p in dict.fromkeys(points) if p not in known]
        if todo:
            requests = [(flags_of(chosen, p), f"{describe_point(chosen, p)} ({why})") for p in todo]
            for p, ev in zip(todo, session.evaluate_many(requests), strict=True):
                known[p] = ev
        return [known[p] for p in points]

    def best_of(points: Sequence[Point], why: str) -> tuple[Point, Any] | None:
        found = [(p, ev) for p, ev in zip(points, run(points, why), strict=True)]
        fitting = [(p, ev) for p, ev in found if ev is not None and ev.fits]
        return min(fitting, key=lambda pe: pe[1].step) if fitting else None

    def gains(ev: Any, than: Any) -> bool:
        return bool(ev.step < than.step * (1 - MIN_GAIN))

    current, cur_ev = start, base
    tried: dict[int, Point] = {}
    checked = total = 0
    notes: list[str] = []
    certified = False
    stopped: BudgetSpent | None = None
    try:
        joint: Point = tuple(lv.together or 0 for lv in chosen)
        if joint != start:
            best = best_of([joint], "the levers that pay together")
            if best is not None and gains(best[1], cur_ev):
                current, cur_ev = best
        while True:
            while True:  # coordinate descent
                changed = False
                for i, lever in enumerate(chosen):
                    if tried.get(i) == current:
                        continue
                    values = [v for v in range(len(lever.settings)) if v != current[i]]
                    moves = [_replace(current, i, v) for v in values]
                    if lever.with_double_buffering and db is not None and current[db] == 0:
                        moves += [_replace(_replace(current, i, v), db, 1) for v in values]
                    best = best_of(moves, f"moving {lever.name}")
                    if best is not None and gains(best[1], cur_ev):
                        current, cur_ev = best
                        changed = True
                    tried[i] = current
                if not changed:
                    break
            # The check, in batches: the first batch that holds a faster neighbour moves
            # the search there (and it descends again); the budget can stop it between.
            around = neighbours(chosen, current)
            total, checked = len(around), 0
            moved = False
            pending = [p for p in around if p not in known]
            batches = [[p for p in around if p in known]] + [
                pending[i : i + CHECK_BATCH] for i in range(0, len(pending), CHECK_BATCH)
            ]
            for batch in batches:
                best = best_of(batch, "checking the neighbours")
                checked += len(batch)
                if best is not None and gains(best[1], cur_ev):
                    current, cur_ev = best
                    moved = True
                    break
            if moved:
                continue
            certified = True
            break
    except BudgetSpent as stop:
        stopped = stop
        partial = (
            f"; {checked} of the {total} neighbours of the result checked, none faster"
            if total
            else ""
        )
        notes.append(
            f"{stop.words} stopped the search before {stop.label}: the result is the best "
            f"found so far{partial}"
        )
    paired = [lv.name for lv in chosen if lv.pairs]
    single = [lv.name for lv in chosen if not lv.pairs]
    if stopped is not None and total:
        guarantee = (
            f"partial: {stopped.words} stopped the check after {checked} of the {total} one- "
            f"and two-lever neighbours (none of those faster by {MIN_GAIN:.1%})"
        )
    elif certified:
        guarantee = (
            f"no change of one lever, nor of two of {', '.join(paired) or 'none'}, makes it "
            f"faster by {MIN_GAIN:.1%} or more (all {checked} such neighbours checked"
            + (f"; {', '.join(single)} checked one at a time" if single else "")
            + ")"
        )
        if len(chosen) <= 2 and not single:
            guarantee += ": that is every configuration of these levers, so it is their best"
    else:
        guarantee = "none: the search did not finish"
    stopped_by = stopped.budget if stopped is not None else ""
    return SearchOutcome(
        cur_ev, current, certified, checked, notes, guarantee + _repeatable(stopped_by), stopped_by
    )


def _repeatable(stopped_by: str) -> str:
    """What the result promises about running the search again."""
    if stopped_by == "budget_s":
        return (
            "; not repeatable: the time limit, not the compile budget, ended the search, so "
            "a faster or less busy machine goes further (raise --budget-s)"
        )
    return (
        "; repeatable: the same program, target, options and compile budget give this "
        "result on any machine, busy or quiet, from the cache or not"
    )


def exhaustive(session: Evaluator, chosen: Sequence[Lever]) -> SearchOutcome:
    """Every configuration of ``chosen`` (their product), compiled as one batch; the
    fastest that fits."""
    points = list(itertools.product(*(range(len(lv.settings)) for lv in chosen)))
    base = session.baseline
    notes: list[str] = []
    stopped_by = ""
    try:
        found = session.evaluate_many(
            [(flags_of(chosen, p), f"{describe_point(chosen, p)} (grid)") for p in points]
        )
        certified = True
    except BudgetSpent as stop:
        notes.append(f"{stop.words} stopped the grid before {stop.label}")
        found, certified, stopped_by = [], False, stop.budget
    best_point: Point = tuple(0 for _ in chosen)
    best = base
    for p, ev in zip(points, found, strict=False):
        if ev is not None and ev.fits and ev.step < best.step:
            best_point, best = p, ev
    guarantee = (
        f"exhaustive: the fastest of all {len(points)} configurations of "
        f"{', '.join(lv.name for lv in chosen) or 'no levers'}"
        if certified
        else "none: the grid did not finish"
    )
    return SearchOutcome(best, best_point, certified, len(points), notes, guarantee, stopped_by)
