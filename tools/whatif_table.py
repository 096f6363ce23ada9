#!/usr/bin/env python3
"""Print the what-if table of docs/predictions.md: predicted step time of every fixture for
K = 1, 2, 4, 8 collective streams and the two bounds, per policy.

The fixtures come from jax 0.12, whose sync collectives run on the compute
stream: the stream model says so (``sync_on_compute``). The lower bound gives
every collective a stream of its own and ignores the deadlock rule; the rule
bound keeps what the rule ties together on one stream.

    python tools/whatif_table.py                     # every hlo_fixtures/*.hlo, H100
    python tools/whatif_table.py --target a100 some.hlo other.hlo

A row covers both policies when they predict the same times; otherwise each
policy has its own row. Cells are milliseconds, with the speedup over K=1 in
parentheses.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Use this checkout's xla_streams even if another copy is installed.
sys.path.insert(0, str(REPO))

from xla_streams.collectives import POLICIES, StreamModel  # noqa: E402
from xla_streams.hlo import parse_module  # noqa: E402
from xla_streams.simulate import TARGETS, get_target, what_if  # noqa: E402
from xla_streams.simulate.whatif import WhatIf  # noqa: E402

FIXTURES = REPO / "hlo_fixtures"
STREAMS = (1, 2, 4, 8)


def fixtures() -> list[Path]:
    return sorted(FIXTURES.glob("*.hlo"))


def predict(path: Path, target: str = "h100") -> WhatIf:
    module = parse_module(path.read_text(encoding="utf-8"), str(path))
    model = StreamModel(sync_on_compute=True)
    return what_if(module, get_target(target), STREAMS, POLICIES, model=model)


def rows(name: str, what: WhatIf) -> list[list[str]]:
    base = what.results[(STREAMS[0], what.policies[0])].step_time

    def cell(seconds: float, speedup: bool) -> str:
        text = f"{seconds * 1e3:.3f}"
        return f"{text} ({base / seconds:.2f}x)" if speedup and seconds > 0 else text

    bounds = [cell(what.rule_bound.step_time, True), cell(what.lower_bound.step_time, True)]
    by_policy = {
        p: [cell(what.results[(k, p)].step_time, k != STREAMS[0]) for k in STREAMS]
        for p in what.policies
    }
    if all(v == by_policy[what.policies[0]] for v in by_policy.values()):
        return [[name, *by_policy[what.policies[0]], *bounds, " = ".join(what.policies)]]
    return [[name, *cells, *bounds, p] for p, cells in by_policy.items()]


def table(paths: Sequence[Path], target: str = "h100") -> str:
    header = ["module", *(f"K={k}" for k in STREAMS), "rule bound", "lower bound", "policy"]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(STREAMS) + 2) + ["---"]) + "|",
    ]
    for path in paths:
        name = path.name.removesuffix(".hlo")
        for row in rows(name, predict(path, target)):
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, help="modules (default: hlo_fixtures/*.hlo)")
    parser.add_argument("--target", default="h100", choices=sorted(TARGETS))
    args = parser.parse_args(argv)
    paths = args.paths or fixtures()
    if not paths:
        print("no HLO modules given and none in hlo_fixtures/", file=sys.stderr)
        return 1
    sys.stdout.write(
        f"Predicted step time in ms on {get_target(args.target).description} "
        "(speedup over K=1), by number of collective streams K:\n\n"
    )
    sys.stdout.write(table(paths, args.target))
    return 0


if __name__ == "__main__":
    sys.exit(main())
