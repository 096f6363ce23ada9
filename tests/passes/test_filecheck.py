"""Golden IR-in/IR-out tests: each file in hlo_fixtures/filecheck/ holds its own
`// RUN:` lines (as in LLVM's lit) and FileCheck directives, and checks one behaviour.

A RUN line is `[not] xla-streams ARGS [2>&1] | filecheck %s [ARGS]`, which a shell runs
as written; here both run in this process (`xla_streams.cli.main`, and the `filecheck`
package's own `main`), so that the goldens take a second, not a process start each.
`not`: the command must fail; `2>&1`: FileCheck reads its standard error after its
standard output. `xla-streams opt` prints the module back as it came, its leading
comments too: those echoed lines (the file's own RUN and CHECK lines) are dropped from
what FileCheck reads, so that no directive can match its own text."""

from __future__ import annotations

import contextlib
import io
import shlex
from pathlib import Path

import pytest
from filecheck.main import main as filecheck_main

from xla_streams import cli
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
def test_golden(path: Path, command: str, tmp_path: Path) -> None:
    producer, bar, consumer = command.replace("%s", shlex.quote(str(path))).partition(" | ")
    argv, checker = shlex.split(producer), shlex.split(consumer)
    must_fail = argv[0] == "not"
    argv = argv[1:] if must_fail else argv
    merged = argv[-1] == "2>&1"
    argv = argv[:-1] if merged else argv
    assert bar and argv[0] == "xla-streams" and checker[0] == "filecheck", (
        f"{path.name}: a RUN line is `[not] xla-streams ARGS [2>&1] | filecheck %s [ARGS]`"
    )
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(argv[1:], stdout=out, stderr=err)
    assert (code != 0) == must_fail, f"{producer}: exit {code}\n{err.getvalue()}"
    produced = out.getvalue() + (err.getvalue() if merged else "")
    checked = tmp_path / "input.txt"
    checked.write_text(
        "".join(line for line in produced.splitlines(keepends=True) if not line.startswith("//"))
    )
    verdict = io.StringIO()
    with contextlib.redirect_stdout(verdict), contextlib.redirect_stderr(verdict):
        try:
            filecheck_main([*checker, f"--input-file={checked}"])
            passed = True
        except SystemExit as e:
            passed = not e.code
    assert passed, f"{command}\n{verdict.getvalue()}"
