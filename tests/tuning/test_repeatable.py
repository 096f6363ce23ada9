"""A search budgeted in compiles gives the same answer on a busy machine as on a quiet
one, and from the disk cache as from XLA. Each program, stopped by its compile budget
partway through the search, is tuned on a quiet machine, then with a process spinning
on every core beside it (its compiles take longer), then again from the first run's
cache (no compile at all): the embedded fsdp_scan (8 GPUs, a scan: the levers that pay
together act on it) and fsdp_tp_scan (32 GPUs, FSDP across 4 hosts x TP inside each,
every lever). The Flax model tuned from JAX's own dump has the same check in
test_sources.py. Deviceless compiles (the gpu-aot extra).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before anything imports JAX

from conftest import busy_cores

import xla_streams
from xla_streams import programs
from xla_streams.tuning.result import TuneResult

pytestmark = pytest.mark.slow

BUDGET = 6  # the baseline, the joint move, then the descent: it stops inside the descent
CASES = {
    "fsdp_scan": ["overlap-limit", "pipeline-all-gather", "double-buffering", "start-early"],
    "fsdp_tp_scan": None,  # every lever, as `tune --program=fsdp_tp_scan` runs
}


def _tune(name: str, cache: Path) -> TuneResult:
    program = programs.PROGRAMS[name]
    return xla_streams.tune(
        program.build, devices=program.num_devices, levers=CASES[name], budget_compiles=BUDGET,
        jobs=1, cache_dir=cache,
    )  # fmt: skip


def _answer(result: TuneResult) -> tuple[object, ...]:
    """What must not depend on the machine: the recommendation, what was compiled, the
    predictions, what the search claims."""
    return (
        result.best.to_json(),
        [
            {k: v for k, v in c.to_json(candidate=True).items() if k != "compile_s"}
            for c in result.candidates
        ],
        result.guarantee,
        result.stopped_by,
        result.evaluated,
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_same_answer_on_a_busy_machine_as_on_a_quiet_one(name: str, tmp_path: Path) -> None:
    runs: dict[str, TuneResult] = {}
    spun: list[float] = []
    # One call site for the three: the program's StableHLO holds the source locations
    # of its lowering (its callers' too), and the cache keys on that text.
    for run, cache, busy in (("quiet", "quiet", False), ("busy", "busy", True),
                             ("cached", "quiet", False)):  # fmt: skip
        with busy_cores() if busy else contextlib.nullcontext([]) as spinners:
            runs[run] = _tune(name, tmp_path / cache)
        spun += spinners
    quiet, busy_run, cached = runs["quiet"], runs["busy"], runs["cached"]
    assert quiet.stopped_by == "budget_compiles" and quiet.evaluated == BUDGET
    assert quiet.compiles == BUDGET and "; repeatable: " in quiet.guarantee
    assert busy_run.compiles == BUDGET  # compiled again, beside the spinners
    assert cached.compiles == 0 and cached.cache_hits == BUDGET  # free for any time limit
    assert _answer(busy_run) == _answer(quiet) == _answer(cached)
    # The machine really was busy: every spinner ran for seconds of CPU.
    assert spun and min(spun) > 1.0, spun
