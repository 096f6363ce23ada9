"""Compile every configuration of a grid of XLA levers for an embedded program, and keep
each one's prediction: the table the tuner's search is tested against.

    JAX_PLATFORMS=cpu python tools/tune_grid.py [--program fsdp_tp_mlp_scan]
        [--out tests/tuning/data/grid_fsdp_tp_mlp_scan.json] [--jobs 2]

The grid is the overlap limit 1/2/4 x all-gather pipelining x reduce-scatter
pipelining x while-loop double buffering x start-early (48 configurations on jax
0.12), each compiled deviceless for the program's topology (each host its own NVLink
domain) and simulated for every stream count and policy: ``xla_streams.tune`` with
``exhaustive=True``. The table holds, per configuration (its options, canonical), the
best predicted step and its range, K and policy, the memory and whether it fits;
and the program, topology, versions and the best of the grid. Run it again when the
simulator or JAX changes (the test then says so: its table's versions differ).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import xla_streams  # noqa: E402
from xla_streams import programs  # noqa: E402
from xla_streams.tuning.result import TuneError  # noqa: E402

GRID_LEVERS = (
    "overlap-limit",
    "pipeline-all-gather",
    "pipeline-reduce-scatter",
    "double-buffering",
    "start-early",
)
SCHEMA = "xla_streams.tune_grid.v1"


@dataclasses.dataclass(frozen=True)
class GridPoint:
    """One configuration of the grid and the best the tuner predicts for it (``grid[i]``)."""

    xla_flags: dict[str, Any]  # canonical: sorted by flag
    settings: str
    step_ms: float
    step_low_ms: float | None  # the range: every candidate of a grid has one
    step_high_ms: float | None
    streams: int
    policy: str
    peak_memory_bytes: int
    fits: bool


@dataclasses.dataclass(frozen=True)
class TuneGrid:
    """The grid's table: schema ``xla_streams.tune_grid.v1``. Its reader is the search's
    test (tests/tuning/test_search.py); nothing in the package reads it back."""

    program: str
    target: str
    devices: int
    devices_per_host: int
    topology: str
    levers: tuple[str, ...]
    versions: dict[str, str]
    compiles: int
    wall_s: float
    baseline_ms: float
    best: GridPoint  # the fastest that fits
    grid: tuple[GridPoint, ...]  # sorted by xla_flags

    def to_json(self) -> str:
        return json.dumps({"schema": SCHEMA, **dataclasses.asdict(self)}, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--program", default="fsdp_tp_mlp_scan")
    parser.add_argument("--out", default=None)
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--target", default="h100")
    args = parser.parse_args(argv)
    spec = programs.PROGRAMS[args.program]
    out = Path(args.out or REPO / "tests" / "tuning" / "data" / f"grid_{args.program}.json")
    begin = time.perf_counter()
    result = xla_streams.tune(
        spec.build,
        devices=spec.num_devices,
        devices_per_host=spec.devices_per_host,
        target=args.target,
        program=args.program,
        levers=GRID_LEVERS,
        budget_s=3600,
        jobs=args.jobs,
        cache_dir=False,
        exhaustive=True,
        progress=sys.stderr,
    )
    wall = time.perf_counter() - begin
    rows = [
        GridPoint(
            xla_flags=dict(sorted(c.xla_flags.items())),
            settings=c.settings,
            step_ms=c.predicted_step_ms,
            step_low_ms=c.step_low_ms,
            step_high_ms=c.step_high_ms,
            streams=c.streams,
            policy=c.policy,
            peak_memory_bytes=c.peak_memory_bytes,
            fits=c.fits,
        )
        for c in result.candidates
    ]
    rows.sort(key=lambda r: json.dumps(r.xla_flags, sort_keys=True))
    best = min((r for r in rows if r.fits), key=lambda r: r.step_ms)
    table = TuneGrid(
        program=args.program,
        target=args.target,
        devices=spec.num_devices,
        devices_per_host=spec.devices_per_host,
        topology=result.topology,
        levers=GRID_LEVERS,
        versions={
            name: importlib.metadata.version(name)
            for name in ("jax", "jaxlib", "jax-cuda12-plugin")
        },
        compiles=result.compiles,
        wall_s=round(wall, 1),
        baseline_ms=result.baseline.predicted_step_ms,
        best=best,
        grid=tuple(rows),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table.to_json())
    distinct = len({round(r.step_ms, 9) for r in rows})
    print(
        f"{args.program} on {result.topology}: {len(rows)} configurations ({distinct} distinct "
        f"steps), {result.compiles} compiles in {wall:.0f} s; baseline "
        f"{result.baseline.predicted_step_ms:.3f} ms, best {best.step_ms:.3f} ms "
        f"({best.settings}, K={best.streams}); wrote {out}"
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except TuneError as e:  # no GPU compiler here, or the program failed: say which
        sys.exit(f"{Path(__file__).name}: {e}")
