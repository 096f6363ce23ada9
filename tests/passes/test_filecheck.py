"""Golden IR-in/IR-out tests: each file in hlo_fixtures/filecheck/ holds its own
`// RUN:` lines (as in LLVM's lit) and FileCheck directives, and checks one behaviour.

`xla-streams opt` prints the module back as it came, its leading comments too: those
echoed lines (the file's own RUN and CHECK lines) are dropped from what FileCheck
reads, so that no directive can match its own text."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from xla_streams.jax_compat import hlo_bindings

FILECHECK_DIR = Path(__file__).resolve().parents[2] / "hlo_fixtures" / "filecheck"
CASES = [
    (path, run)
    for path in sorted(FILECHECK_DIR.glob("*.hlo"))
    for run in [
        line.removeprefix("// RUN:").strip()
        for line in path.read_text().splitlines()
        if line.startswith("// RUN:")
    ]
]


def test_every_golden_file_has_a_run_line() -> None:
    files = sorted(FILECHECK_DIR.glob("*.hlo"))
    assert files
    assert {path for path, _ in CASES} == set(files)


# The modules written to be refused (errors_*) aside, whose RUN lines say what of.
READABLE = [p for p in sorted(FILECHECK_DIR.glob("*.hlo")) if not p.stem.startswith("errors_")]


@pytest.mark.parametrize("path", READABLE, ids=lambda p: p.stem)
def test_every_module_is_one_xla_reads(path: Path) -> None:
    """The hand-written modules are real HLO: XLA's own parser reads each."""
    text = "".join(line for line in path.read_text().splitlines(True) if not line.startswith("//"))
    hlo_bindings().hlo_module_from_text(text)


@pytest.mark.parametrize(
    ("path", "command"), CASES, ids=[f"{p.stem}:{i}" for i, (p, _) in enumerate(CASES)]
)
def test_golden(path: Path, command: str) -> None:
    # `[not] PRODUCER | filecheck ...`, as in lit: `not` means PRODUCER must fail.
    producer, _, consumer = command.replace("%s", shlex.quote(str(path))).partition(" | ")
    must_fail = producer.startswith("not ")
    produced = _bash(producer.removeprefix("not "))
    assert (produced.returncode != 0) == must_fail, f"{producer}\n{produced.stderr}"
    output = "".join(
        line for line in produced.stdout.splitlines(keepends=True) if not line.startswith("//")
    )
    checked = _bash(consumer, stdin=output)
    assert checked.returncode == 0, f"{command}\n{checked.stdout}\n{checked.stderr}"


def _bash(command: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    bin_dir = str(Path(sys.executable).parent)
    return subprocess.run(
        ["bash", "-c", command],
        input=stdin,
        env={**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=120,
    )
