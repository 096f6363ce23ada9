"""How long xla-streams takes on modules built to make the deadlock rule slow.

Each case is a small module text (built here) whose collectives defeat a pair-by-pair
rule: huge groups, many pairs in flight at once, many distinct groupings. Every case
runs the whole ``xla-streams assign`` command in this process (parse, find-async-pairs,
assign-streams, verify-streams, the report; outputs into a temporary folder) and prints
its wall time, the median of ``--repeat`` runs::

    python tools/bench.py hostile              # every case, 3 runs each
    python tools/bench.py hostile --repeat 5 --only rings

The targets are the ones the project promises: two overlapping collectives over
65,536 devices in under 1 s, 2,000 pairs in flight in under 2 s (``--check`` makes the
exit status 1 when one is missed). The last case is a module made to need more work
than the rule's budget (``MAX_RULE_WORK``): it must be refused, quickly, with an error
that names the file, line and column.
"""

from __future__ import annotations

import io
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.runner import machine, suite_parser, verdict
from xla_streams.cli import main as xla_streams_main
from xla_streams.streams.rule import MAX_RULE_WORK

HEAD = """\
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}
"""


def module(name: str, header: str, starts: list[str], dones: list[str]) -> str:
    """ENTRY: every start, one instruction of work, every done (all in flight at once)."""
    body = "\n".join(f"  {line}" for line in [*starts, "%w = f32[8]{0} exponential(%p)", *dones])
    last = dones[-1].split(" =", 1)[0]
    return (
        f"HloModule {name}, is_scheduled=true, {header}\n\n{HEAD}\n"
        f"ENTRY %main (p: f32[8]) -> f32[8] {{\n  %p = f32[8]{{0}} parameter(0)\n{body}\n"
        f"  ROOT %r = f32[8]{{0}} add({last}, %w)\n}}\n"
    )


def all_reduces(groups: list[str], channel: bool = True) -> tuple[list[str], list[str]]:
    starts, dones = [], []
    for i, g in enumerate(groups):
        ids = f"channel_id={i + 1}, use_global_device_ids=true, " if channel else ""
        starts.append(
            f"%s{i} = f32[8]{{0}} all-reduce-start(%p), {ids}replica_groups={g}, to_apply=%add"
        )
        dones.append(f"%d{i} = f32[8]{{0}} all-reduce-done(%s{i})")
    return starts, dones


def singletons_65536() -> str:
    """Two replica-mode all-reduces with num_partitions=65536: 65,536 groups of one each."""
    starts, dones = all_reduces(["{}", "{}"], channel=False)
    return module("singletons", "num_partitions=65536", starts, dones)


def pairs_65536() -> str:
    """Two all-reduces over 65,536 devices in 32,768 groups of two, laid out so that no
    group of one shares two devices with a group of the other (a full scan)."""
    starts, dones = all_reduces(["[32768,2]<=[65536]", "[32768,2]<=[2,32768]T(1,0)"])
    return module("pairs", "num_partitions=65536", starts, dones)


def rings_16384() -> str:
    """Two collective-permute rings over 16,384 devices, i -> i+1 and i -> i+2."""
    n = 16384
    starts, dones = [], []
    for k, step in enumerate((1, 2)):
        pairs = ",".join(f"{{{i},{(i + step) % n}}}" for i in range(n))
        starts.append(
            f"%s{k} = (f32[8]{{0}}, f32[8]{{0}}) collective-permute-start(%p), "
            f"channel_id={k + 1}, source_target_pairs={{{pairs}}}"
        )
        dones.append(f"%d{k} = f32[8]{{0}} collective-permute-done(%s{k})")
    return module("rings", f"num_partitions={n}", starts, dones)


def in_flight_same(n: int) -> Callable[[], str]:
    """``n`` all-reduces over the same 8 devices in pairs {0,1},{2,3},..., all in flight."""

    def build() -> str:
        groups = ["{{0,1},{2,3},{4,5},{6,7}}"] * n
        return module(f"same{n}", "num_partitions=8", *all_reduces(groups))

    return build


def in_flight_distinct(n: int) -> Callable[[], str]:
    """``n`` all-reduces, each over its own two devices of 2n, all in flight: n distinct
    groupings (the rule's index, not a comparison of every two)."""

    def build() -> str:
        groups = [f"{{{{{2 * i},{2 * i + 1}}}}}" for i in range(n)]
        return module(f"distinct{n}", f"num_partitions={2 * n}", *all_reduces(groups))

    return build


def hub(n: int, width: int = 7) -> Callable[[], str]:
    """``n`` all-reduces in flight, each grouping device 0 (the hub) with ``width``
    devices of its own: every new one meets every one in flight at the hub, about n^2/2
    steps, more than the rule's budget allows for n = 8,000: refused."""

    def build() -> str:
        groups = []
        for i in range(n):
            devices = ",".join(str(1 + i * width + k) for k in range(width))
            groups.append(f"{{{{0,{devices}}}}}")
        return module(f"hub{n}", "num_partitions=65536", *all_reduces(groups))

    return build


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], str]
    target_s: float | None  # the promise, if any
    refused: bool = False  # the module must be refused (exit 2, located error)


CASES = [
    Case("singletons-65536", singletons_65536, 1.0),
    Case("pairs-65536", pairs_65536, 1.0),
    Case("rings-16384", rings_16384, None),
    Case("in-flight-1000", in_flight_same(1000), None),
    Case("in-flight-2000", in_flight_same(2000), 2.0),
    Case("in-flight-2000-distinct", in_flight_distinct(2000), 2.0),
    Case("hub-3000", hub(3000), None),
    Case("hub-8000-over-budget", hub(8000), None, refused=True),
]


def run_once(path: Path, out: Path) -> tuple[float, int, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    argv = ["assign", str(path), "--streams=4", f"--output={out / 'out.hlo'}"]
    argv.append(f"--json={out / 'out.json'}")
    start = time.perf_counter()
    code = xla_streams_main(argv, stdout=stdout, stderr=stderr)
    return time.perf_counter() - start, code, stderr.getvalue()


def main(argv: list[str]) -> int:
    parser = suite_parser("hostile", __doc__, check="a case misses its target")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per case (median)")
    parser.add_argument("--only", action="append", help="run only cases whose name has this")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.only or any(o in c.name for o in args.only)]
    missed = []
    print(f"{machine()}; rule budget MAX_RULE_WORK={MAX_RULE_WORK:,}")
    print(f"{'case':26s} {'KB':>7s} {'median s':>9s} {'target':>7s}  result")
    with tempfile.TemporaryDirectory(prefix="xla_streams_hostile.") as tmp:
        folder = Path(tmp)
        for case in cases:
            path = folder / f"{case.name}.hlo"
            path.write_text(case.build())
            runs = [run_once(path, folder) for _ in range(args.repeat)]
            median = statistics.median(seconds for seconds, _, _ in runs)
            _, code, message = runs[-1]
            if case.refused:
                head = message.split("\n", 1)[0]
                ok = code == 2 and head.startswith(f"{path}:") and "deadlock rule" in head
                result = f"refused (exit {code}): {head[len(str(path)) :][:70]}"
            else:
                ok = code == 0
                result = f"exit {code}" + (f": {message.strip()[:70]}" if code else "")
            target = f"{case.target_s:.1f}" if case.target_s else "-"
            if not ok or (case.target_s is not None and median >= case.target_s):
                missed.append(case.name)
            size = path.stat().st_size // 1024
            print(f"{case.name:26s} {size:7d} {median:9.3f} {target:>7s}  {result}")
    return verdict(missed, args.check)
