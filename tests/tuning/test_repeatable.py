"""A search budgeted in compiles gives the same answer on a busy machine as on a quiet
one, and from the disk cache as from XLA: the embedded fsdp_scan (8 GPUs, a scan: the
levers that pay together act on it), stopped by its compile budget halfway through, is
tuned on a quiet machine, then with a process spinning on every core beside it (its
compiles take longer), then again from the first run's cache (no compile at all).
Deviceless compiles (the gpu-aot extra).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before anything imports JAX

import xla_streams
from xla_streams import programs
from xla_streams.tuning.result import TuneResult

LEVERS = ["overlap-limit", "pipeline-all-gather", "double-buffering", "start-early"]
BUDGET = 6  # the baseline, the joint move, then the descent: it stops inside the descent


@contextlib.contextmanager
def busy_cores() -> Iterator[list[subprocess.Popen[bytes]]]:
    """A process spinning on each core, for as long as the block runs."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        yield spinners
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def _tune(cache: Path) -> TuneResult:
    return xla_streams.tune(
        programs.fsdp_scan, devices=8, levers=LEVERS, budget_compiles=BUDGET, jobs=1,
        cache_dir=cache,
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


def test_the_same_answer_on_a_busy_machine_as_on_a_quiet_one(tmp_path: Path) -> None:
    runs: dict[str, TuneResult] = {}
    spun: list[float] = []
    # One call site for the three: the program's StableHLO holds the source locations
    # of its lowering (its callers' too), and the cache keys on that text.
    for name, cache, busy in (("quiet", "quiet", False), ("busy", "busy", True),
                              ("cached", "quiet", False)):  # fmt: skip
        with busy_cores() if busy else contextlib.nullcontext([]) as spinners:
            runs[name] = _tune(tmp_path / cache)
            spun += [_cpu_seconds(s.pid) for s in spinners]
    quiet, busy_run, cached = runs["quiet"], runs["busy"], runs["cached"]
    assert quiet.stopped_by == "budget_compiles" and quiet.evaluated == BUDGET
    assert quiet.compiles == BUDGET and "; repeatable: " in quiet.guarantee
    assert busy_run.compiles == BUDGET  # compiled again, beside the spinners
    assert cached.compiles == 0 and cached.cache_hits == BUDGET  # free for any time limit
    assert _answer(busy_run) == _answer(quiet) == _answer(cached)
    # The machine really was busy: every spinner ran for seconds of CPU.
    assert spun and min(spun) > 1.0, spun


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of a running process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
