"""How long `xla-streams tune` takes, and what it finds, on the embedded programs.

    JAX_PLATFORMS=cpu python tools/bench_tune.py                     # fsdp_tp_scan, fsdp_chain
    JAX_PLATFORMS=cpu python tools/bench_tune.py fsdp_tp_scan --budget-s 300 --check

For each program: the number of compiles, the time against the budget, the predicted
speedup of the recommendation and its memory against the baseline's. ``--check``
exits 1 when a run overshoots its budget, when fsdp_tp_scan's recommendation is
under 1.1x, or when fsdp_chain's is not XLA's defaults (the tuner must never
recommend anything for a dependency chain).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from xla_streams import programs  # noqa: E402
from xla_streams.tuning import DEFAULT_BUDGET_S, tune  # noqa: E402

EXPECTED_SPEEDUP = {"fsdp_tp_scan": 1.1}
NO_GAIN = ("fsdp_chain",)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("programs", nargs="*", default=["fsdp_tp_scan", "fsdp_chain"])
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S)
    parser.add_argument("--target", default="h100")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    failures = []
    for name in args.programs:
        spec = programs.PROGRAMS[name]
        begin = time.perf_counter()
        result = tune(
            spec.build,
            devices=spec.num_devices,
            devices_per_host=spec.devices_per_host,
            target=args.target,
            budget_s=args.budget_s,
            program=name,
            progress=None if args.quiet else sys.stderr,
        )
        wall = time.perf_counter() - begin
        delta = result.best.peak_memory_bytes - result.baseline.peak_memory_bytes
        print(
            f"{name}: {result.compiles} compiles in {wall:.0f} s (budget {args.budget_s:.0f} s); "
            f"{result.speedup:.3f}x predicted ({result.baseline.predicted_step_ms:.3f} -> "
            f"{result.best.predicted_step_ms:.3f} ms), K={result.best.streams}, memory "
            f"{delta / 2**20:+.1f} MiB; {result.best.settings}"
        )
        if wall > args.budget_s:
            failures.append(f"{name}: {wall:.0f} s over the {args.budget_s:.0f} s budget")
        if result.speedup < EXPECTED_SPEEDUP.get(name, 0.0):
            failures.append(f"{name}: {result.speedup:.3f}x < {EXPECTED_SPEEDUP[name]}x")
        if name in NO_GAIN and result.best != result.baseline:
            failures.append(f"{name}: recommends {result.best.settings}, not the defaults")
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if args.check and failures else 0


if __name__ == "__main__":
    sys.exit(main())
