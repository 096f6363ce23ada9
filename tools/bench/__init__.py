"""The benchmarks: one suite a module, all run by ``python tools/bench.py [SUITE]`` through
one runner (``runner.py``)."""
