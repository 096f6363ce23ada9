"""How long the simulator takes next to the assign pipeline, as a ratio.

    python tools/bench.py simulate                  # the largest hlo_fixtures/*.hlo
    python tools/bench.py simulate IN.hlo --repeat 9 --check

Both sides start from the module text, in-process, with the caches of decoded text
cleared before every run, and run interleaved after one warm-up each:

  assign    parse + find-async-pairs,assign-streams{streams=4},verify-streams,
            annotate-streams + print (what `xla-streams assign` and the plugin do)
  simulate  parse + find-async-pairs + the cost model + replays for K = 1, 2, 4, 8
            under every policy + the lower bound (the what-if table of
            `xla-streams simulate`, without pictures; with the two bounds and the
            explanations of any K predicted slower than a smaller one)

The target is simulate <= 2 x assign. ``--check`` exits 1 when the median ratio
misses it. ``--pictures`` also times recording the timelines and rendering the
trace and HTML (reported, not part of the target).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from bench.runner import REPO, interleaved, measure, suite_parser, verdict
from xla_streams.collectives import POLICIES
from xla_streams.hlo import parse_module, parse_shape
from xla_streams.hlo.attributes import parse_replica_groups
from xla_streams.passes.base import Compilation
from xla_streams.pipeline import PassManager
from xla_streams.simulate import Simulator, get_target, what_if
from xla_streams.simulate.visual import pictures
from xla_streams.streams import pairs

ASSIGN = "find-async-pairs,assign-streams{streams=4},verify-streams,annotate-streams"
STREAMS = (1, 2, 4, 8)
TARGET_RATIO = 2.0


def _clear_caches() -> None:
    """The caches of decoded text (shapes, replica groups, backend configs), so that
    every run decodes from scratch, as one process does."""
    parse_shape.cache_clear()
    parse_replica_groups.cache_clear()
    pairs._says_sync.cache_clear()


def assign(text: str, path: str) -> Callable[[], None]:
    def run() -> None:
        _clear_caches()
        compilation = Compilation(parse_module(text, path))
        PassManager.from_spec(ASSIGN).run(compilation)
        compilation.module.print()

    return run


def simulate(text: str, path: str, with_pictures: bool) -> Callable[[], None]:
    target = get_target("h100")

    def run() -> None:
        _clear_caches()
        module = parse_module(text, path)
        compilation = PassManager.from_spec("find-async-pairs").run(Compilation(module))
        sim = Simulator(module, target, compilation.pairs)
        what = what_if(module, target, STREAMS, POLICIES, simulator=sim)
        if with_pictures:
            pictures(sim, what)

    return run


def main(argv: list[str]) -> int:
    parser = suite_parser("simulate", __doc__, check="the ratio is above its target")
    parser.add_argument("path", nargs="?", type=Path, help="default: the largest fixture")
    parser.add_argument("--repeat", type=int, default=7, help="timed runs of each (>= 5)")
    parser.add_argument("--pictures", action="store_true", help="also time trace + HTML")
    args = parser.parse_args(argv)
    if args.repeat < 5:
        parser.error("--repeat must be at least 5")
    path = args.path
    if path is None:
        candidates = sorted((REPO / "hlo_fixtures").glob("*.hlo"), key=lambda p: p.stat().st_size)
        if not candidates:
            parser.error("no hlo_fixtures/*.hlo; give a module")
        path = candidates[-1]
    text = path.read_text(encoding="utf-8")
    sides = {"assign": assign(text, str(path)), "simulate": simulate(text, str(path), False)}
    if args.pictures:
        sides["simulate+pictures"] = simulate(text, str(path), True)
    times = interleaved({n: lambda fn=fn: measure(fn) for n, fn in sides.items()}, args.repeat)
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"module: {path.relative_to(REPO) if path.is_relative_to(REPO) else path} "
          f"({len(text) >> 10} KiB), median of {args.repeat} runs")  # fmt: skip
    for name, median in medians.items():
        spread = f"min {min(times[name]) * 1e3:.1f} max {max(times[name]) * 1e3:.1f}"
        print(f"  {name:<18} {median * 1e3:9.1f} ms   ({spread} ms)")
    ratio = medians["simulate"] / medians["assign"]
    print(f"simulate / assign = {ratio:.2f}  (target <= {TARGET_RATIO:.1f})")
    if args.pictures:
        print(
            f"simulate+pictures / assign = {medians['simulate+pictures'] / medians['assign']:.2f}"
        )
    missed = [f"simulate / assign = {ratio:.2f}"] if ratio > TARGET_RATIO else []
    return verdict(missed, args.check)
