"""What every benchmark suite shares: the command line that picks the suite, timing,
sides run interleaved, the machine's line, and the exit status of ``--check``.

    python tools/bench.py [SUITE] [the suite's options]    # SUITE --help: its options

A suite is a module of this folder with ``main(argv) -> int`` (its parser from
:func:`suite_parser`). Speed is a ratio against a reference timed in the same run,
the sides interleaved (:func:`interleaved`), so that a busy machine slows both.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.metadata
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Suite -> what it measures. The first is what `python tools/bench.py` runs.
SUITES = {
    "text": "xla-streams' parse, print, opt and assign against XLA's HLO text tools",
    "simulate": "the simulator's what-if table against the assign pipeline",
    "plugin": "a jit compile with the plugin against one without",
    "ffi": "an ffi-mode start/done pair against XLA's own collective (host backend)",
    "hostile": "xla-streams assign on modules built to make the deadlock rule slow",
    "tune": "xla-streams tune's wall time against its budget, and what it finds",
}


def main(argv: Sequence[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[1] if __doc__ else "")
        for name, what in SUITES.items():
            print(f"  {name:9s} {what}")
        return 0
    name = argv[0] if argv and argv[0] in SUITES else next(iter(SUITES))
    rest = list(argv[1:] if argv and argv[0] in SUITES else argv)
    suite = importlib.import_module(f"bench.{name}")
    code: int = suite.main(rest)
    return code


def suite_parser(
    name: str, doc: str | None, *, check: str | None = None
) -> argparse.ArgumentParser:
    """The parser of suite ``name`` (its docstring's first paragraph as description);
    with ``check`` (what a miss is), the ``--check`` flag."""
    parser = argparse.ArgumentParser(
        prog=f"tools/bench.py {name}", description=(doc or "").split("\n\n")[0]
    )
    if check is not None:
        parser.add_argument("--check", action="store_true", help=f"exit 1 when {check}")
    return parser


def measure(fn: Callable[[], object]) -> float:
    """Seconds ``fn()`` takes, after a collection (none of it charged to the run)."""
    gc.collect()
    begin = time.perf_counter()
    fn()
    return time.perf_counter() - begin


def interleaved[T](
    sides: Mapping[str, Callable[[], T]], repeat: int, *, warmups: int = 1
) -> dict[str, list[T]]:
    """What each side returned in ``repeat`` rounds, after ``warmups`` runs of each
    (imports, page cache, first calls). Each round runs every side once, in the order
    given and reversed every other round (A B, B A, A B, ...): load that drifts hits
    every side alike, and none is always second."""
    for _ in range(warmups):
        for fn in sides.values():
            fn()
    results: dict[str, list[T]] = {name: [] for name in sides}
    order = list(sides)
    for i in range(repeat):
        for name in order if i % 2 == 0 else reversed(order):
            results[name].append(sides[name]())
    return results


def machine() -> str:
    """The interpreter, the machine and jax's version (read without importing jax)."""
    try:
        jax = f"jax {importlib.metadata.version('jax')}"
    except importlib.metadata.PackageNotFoundError:
        jax = "no jax"
    return (
        f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, {jax}"
    )


def verdict(missed: Sequence[str], check: bool) -> int:
    """Says what missed its target; the exit status (1 for a miss under ``--check``)."""
    for miss in missed:
        print(f"MISSED {miss}")
    return 1 if missed and check else 0
