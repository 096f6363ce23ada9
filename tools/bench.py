#!/usr/bin/env python3
"""Benchmarks of xla_streams, as ratios against a reference timed in the same run.

    python tools/bench.py [SUITE] [its options]    # --help: the suites; SUITE --help

The suites are the modules of ``tools/bench/`` (``text``, the default: against XLA's
own HLO text tools; ``simulate``, ``plugin``, ``ffi``, ``hostile``, ``tune``), run by
one runner (``tools/bench/runner.py``).
"""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tools")]  # the package, and the suites' folder

from bench import runner  # noqa: E402

if __name__ == "__main__":
    sys.exit(runner.main(sys.argv[1:]))
