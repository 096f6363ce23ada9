"""Regenerate the report goldens: hlo_fixtures/reports/<fixture>.json.

Each golden is what ``xla-streams assign FIXTURE --streams=4 --policy=interval
--json=GOLDEN`` writes for the fixture ``hlo_fixtures/<fixture>.hlo``; the test
tests/test_report_goldens.py recomputes them and compares byte for byte.

    python tools/update_goldens.py            # rewrite every golden
    python tools/update_goldens.py --check    # only compare; exit 1 on a difference
    python tools/update_goldens.py NAME.hlo   # only these fixtures

Goldens whose fixture is gone are deleted (reported with --check). A fixture
the CLI rejects is reported with the CLI's message and leaves its golden as it
was; the script then exits 1.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Use this checkout's xla_streams even if another copy is installed.
sys.path.insert(0, str(REPO))

from xla_streams import cli  # noqa: E402

FIXTURES = REPO / "hlo_fixtures"
REPORTS = FIXTURES / "reports"
# The options the goldens are made with; the test imports them from here.
ASSIGN_ARGS = ("--streams=4", "--policy=interval")


def golden_path(fixture: Path) -> Path:
    return REPORTS / (fixture.name.removesuffix(".hlo") + ".json")


def fixtures() -> list[Path]:
    return sorted(FIXTURES.glob("*.hlo"))


def compute(fixture: Path) -> tuple[int, str, str]:
    """Run the CLI's assign on ``fixture``: (exit code, JSON text, error text)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        stdout, stderr = io.StringIO(), io.StringIO()
        argv = ["assign", str(fixture), *ASSIGN_ARGS, f"--json={out}", "--quiet"]
        code = cli.main(argv, stdout=stdout, stderr=stderr)
        text = out.read_text(encoding="utf-8") if out.exists() else ""
    return code, text, stderr.getvalue()


def _replace(path: Path, text: str) -> None:
    """Write ``text`` beside ``path`` and move it over: a reader never sees half a golden."""
    staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        staged.write_bytes(text.encode("utf-8"))
        os.replace(staged, path)
    finally:
        staged.unlink(missing_ok=True)


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare only, write nothing")
    parser.add_argument("names", nargs="*", help="fixture file names (default: all)")
    args = parser.parse_args(argv)
    chosen = fixtures()
    if args.names:
        by_name = {f.name: f for f in chosen}
        unknown = [n for n in args.names if n not in by_name]
        if unknown:
            parser.error(f"no such fixture in {FIXTURES}: {', '.join(unknown)}")
        chosen = [by_name[n] for n in args.names]
    failed = changed = 0
    for fixture in chosen:
        code, text, errors = compute(fixture)
        golden = golden_path(fixture)
        if code != 0:
            failed += 1
            print(f"FAILED  {fixture.name} (exit {code}):\n{errors}", file=sys.stderr)
            continue
        old = golden.read_text(encoding="utf-8") if golden.exists() else None
        if old == text:
            continue
        changed += 1
        print(f"{'differs' if args.check else 'wrote  '}  {_shown(golden)}")
        if not args.check:
            REPORTS.mkdir(exist_ok=True)
            _replace(golden, text)
    if not args.names:
        wanted = {golden_path(f) for f in chosen}
        for stale in sorted(REPORTS.glob("*.json")):
            if stale not in wanted:
                changed += 1
                print(f"{'stale  ' if args.check else 'deleted'}  {_shown(stale)}")
                if not args.check:
                    stale.unlink()
    print(
        f"{len(chosen)} fixtures, {changed} goldens {'differ' if args.check else 'updated'}"
        + (f", {failed} failed" if failed else "")
    )
    return 1 if failed or (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
