"""Entry point of the Bazel py_test targets (BUILD): run pytest on the file given."""

import os
import sys
from pathlib import Path

import pytest

import xla_streams

if __name__ == "__main__":
    # The package under test is Bazel's, not the checkout .venv's editable install maps.
    package = Path(xla_streams.__file__)
    assert package.is_relative_to(os.environ["TEST_SRCDIR"]), f"{package} is not Bazel's"
    # Nothing is written outside the test's own directory (~/.cache holds built libraries).
    os.environ["XDG_CACHE_HOME"] = os.path.join(os.environ["TEST_TMPDIR"], "cache")
    sys.exit(pytest.main(["-q", *sys.argv[1:]]))
