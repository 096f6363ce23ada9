"""How long `xla-streams tune` takes, and what it finds, on the embedded programs or on
JAX dumps.

    python tools/bench.py tune                     # fsdp_tp_scan, fsdp_chain
    python tools/bench.py tune fsdp_tp_mlp_scan --budget-s 900 --jobs 2
    python tools/bench.py tune --dump DIR --devices-per-host 4
    python tools/bench.py tune fsdp_tp_scan --budget-s 300 --check

For each program: the compiles (and how many the disk cache held), the wall time
against the budget, the topology, the predicted speedup of the recommendation with
its range and its memory against the baseline's, and what the search guarantees.
Compiles are not cached unless ``--cache-dir`` says where (a benchmark measures
them). ``--check`` exits 1 when a run overshoots its budget, when fsdp_tp_scan's
recommendation is under 1.1x, or when fsdp_chain's is 1.1x or more (a dependency
chain: only its loss's 4-byte all-reduce can hide behind the backward pass, which
the overlap limit and start-early together do, about 1.05x predicted).
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # deviceless compiles; before JAX starts

from bench.runner import machine, suite_parser, verdict
from xla_streams import programs
from xla_streams.tuning.driver import tune, tune_path
from xla_streams.tuning.result import DEFAULT_BUDGET_S, TuneError, TuneResult

EXPECTED_SPEEDUP = {"fsdp_tp_scan": 1.1}
# Programs where nothing large can overlap: the most their recommendation may gain.
AT_MOST = {"fsdp_chain": 1.1}


def _line(name: str, result: TuneResult, wall: float, budget_s: float) -> str:
    best, base = result.best, result.baseline
    delta = best.peak_memory_bytes - base.peak_memory_bytes
    spread = (
        f" [{best.step_low_ms:.3f}-{best.step_high_ms:.3f}]"
        if best.step_low_ms is not None and best.step_high_ms is not None
        else ""
    )
    return (
        f"{name} on {result.topology}: {result.compiles} compiles"
        f" (+{result.cache_hits} cached) in {wall:.0f} s (budget {budget_s:.0f} s); "
        f"{result.speedup:.3f}x predicted ({base.predicted_step_ms:.3f} -> "
        f"{best.predicted_step_ms:.3f} ms{spread}), K={best.streams}, memory "
        f"{delta / 2**20:+.1f} MiB; {best.settings}\n  search: {result.guarantee}"
    )


def main(argv: list[str]) -> int:
    parser = suite_parser("tune", __doc__, check="a run misses its budget or its expected gain")
    parser.add_argument("programs", nargs="*", default=None)
    parser.add_argument("--dump", action="append", default=[], help="a JAX_DUMP_IR_TO folder")
    parser.add_argument("--devices-per-host", type=int, default=8)
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S)
    parser.add_argument("--target", default="h100")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--levers", default=None, help="comma-separated lever names")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    names = args.programs if args.programs or args.dump else ["fsdp_tp_scan", "fsdp_chain"]
    common = {
        "target": args.target,
        "budget_s": args.budget_s,
        "progress": None if args.quiet else sys.stderr,
        "jobs": args.jobs,
        "cache_dir": args.cache_dir or False,
        "levers": args.levers.split(",") if args.levers else None,
    }
    failures = []
    runs: list[tuple[str, TuneResult, float]] = []
    try:
        for name in names:
            spec = programs.PROGRAMS[name]
            begin = time.perf_counter()
            result = tune(
                spec.build,
                devices=spec.num_devices,
                devices_per_host=spec.devices_per_host,
                program=name,
                **common,
            )
            runs.append((name, result, time.perf_counter() - begin))
        for folder in args.dump:
            begin = time.perf_counter()
            result = tune_path(folder, devices_per_host=args.devices_per_host, **common)
            runs.append((result.program, result, time.perf_counter() - begin))
    except TuneError as e:  # no GPU compiler here, or the program failed: say which
        print(f"bench tune: {e}", file=sys.stderr)
        return 2
    print(machine())
    for name, result, wall in runs:
        print(_line(name, result, wall, args.budget_s))
        if wall > args.budget_s:
            failures.append(f"{name}: {wall:.0f} s over the {args.budget_s:.0f} s budget")
        if result.speedup < EXPECTED_SPEEDUP.get(name, 0.0):
            failures.append(f"{name}: {result.speedup:.3f}x < {EXPECTED_SPEEDUP[name]}x")
        if result.speedup >= AT_MOST.get(name, float("inf")):
            failures.append(
                f"{name}: recommends {result.best.settings} at {result.speedup:.3f}x, "
                f"not under {AT_MOST[name]}x"
            )
    return verdict(failures, args.check)
