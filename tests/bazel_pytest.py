"""Entry point of the Bazel py_test targets: run pytest on the file given."""

import sys

import pytest

if __name__ == "__main__":
    sys.exit(pytest.main(["-q", *sys.argv[1:]]))
