"""Report goldens: hlo_fixtures/reports/<fixture>.json, one per hlo_fixtures/*.hlo.

Each is recomputed with `xla-streams assign FIXTURE --streams=4 --policy=interval
--json=...` and compared byte for byte; every golden is checked against the
schema and, with plain text scans, against the fixture it describes.
Regenerate with `python tools/update_goldens.py` (see hlo_fixtures/README.md).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from xla_streams import cli
from xla_streams.report import AssignmentReport

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "hlo_fixtures"
REPORTS = FIXTURES / "reports"
ALL_FIXTURES = sorted(FIXTURES.glob("*.hlo"))


def golden_of(fixture: Path) -> Path:
    return REPORTS / (fixture.name.removesuffix(".hlo") + ".json")


def assign_json(fixture: Path, tmp_path: Path) -> tuple[int, str, str]:
    out = tmp_path / "report.json"
    stderr = io.StringIO()
    code = cli.main(
        ["assign", str(fixture), "--streams=4", "--policy=interval", f"--json={out}", "--quiet"],
        stdout=io.StringIO(),
        stderr=stderr,
    )
    return code, out.read_text() if out.exists() else "", stderr.getvalue()


@cache
def golden(fixture: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(golden_of(fixture).read_text())
    return data


def test_fixtures_are_there() -> None:
    assert len(ALL_FIXTURES) >= 10, "hlo_fixtures/*.hlo are missing"


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ALL_FIXTURES, ids=lambda p: p.name)
def test_golden_matches(fixture: Path, tmp_path: Path) -> None:
    assert golden_of(fixture).exists(), (
        f"no golden for {fixture.name}: run python tools/update_goldens.py"
    )
    code, text, errors = assign_json(fixture, tmp_path)
    assert code == 0, errors
    assert text == golden_of(fixture).read_text(), (
        f"the report of {fixture.name} changed; if that is intended, run "
        f"python tools/update_goldens.py {fixture.name} and review the diff"
    )


def test_every_golden_has_its_fixture() -> None:
    stale = {p.name for p in REPORTS.glob("*.json")} - {golden_of(f).name for f in ALL_FIXTURES}
    assert not stale, f"goldens without a fixture (run python tools/update_goldens.py): {stale}"


# -- what the goldens say, checked against the fixtures' text ------------------------

_COLLECTIVES = {
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all",
    "collective-permute", "collective-broadcast",
}  # fmt: skip
_INSTRUCTION = re.compile(r"^  (?:ROOT )?%?([^\s=]+) = .*? ([a-z][a-z0-9-]*)\(")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([^\s(]+) \(.*\{$")


@cache
def schedule(fixture: Path) -> dict[str, list[tuple[str, str, str]]]:
    """Per computation, its instructions in printed (schedule) order: (name, opcode, line)."""
    result: dict[str, list[tuple[str, str, str]]] = {}
    current: list[tuple[str, str, str]] | None = None
    for line in fixture.read_text().splitlines():
        if current is None:
            m = _COMPUTATION.match(line)
            if m:
                current = result.setdefault(m.group(1), [])
        elif line == "}":
            current = None
        else:
            m = _INSTRUCTION.match(line)
            assert m, line[:120]
            current.append((m.group(1), m.group(2), line))
    return result


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ALL_FIXTURES, ids=lambda p: p.name)
def test_golden_follows_schema_and_fixture(fixture: Path) -> None:
    report = golden(fixture)
    AssignmentReport.from_json(golden_of(fixture).read_text(), golden_of(fixture).name)
    assert (report["streams"], report["policy"]) == (4, "interval")
    header = fixture.read_text().split("\n", 1)[0]
    assert header.startswith(f"HloModule {report['module']},")
    comps = schedule(fixture)
    # Every dedicated collective start of the fixture is reported (wrapped ones and
    # send/recv need more than a text scan to tell apart).
    starts = {
        (comp, name)
        for comp, insts in comps.items()
        for name, opcode, _ in insts
        if opcode.removesuffix("-start") in _COLLECTIVES and opcode.endswith("-start")
    }
    reported = [(c["computation"], c["start"]) for c in report["collectives"]]
    assert len(reported) == len(set(reported))
    assert set(reported) <= {(c, n) for c, insts in comps.items() for n, _, _ in insts}
    assert starts <= set(reported)
    for c in report["collectives"]:
        insts = comps[c["computation"]]
        start_name, start_opcode, start_line = insts[c["start_index"]]
        done_name, done_opcode, _ = insts[c["done_index"]]
        assert (start_name, done_name) == (c["start"], c["done"]), "indices are 0-based positions"
        assert start_opcode in (f"{c['kind']}-start", "async-start", c["kind"])
        assert done_opcode.endswith("-done")
        if '"is_sync":true' in start_line:
            assert c["sync"] and c["stream"] is None
        devices = {d for g in c["groups"] for d in g}
        partitions = re.search(r"num_partitions=(\d+)", header)
        replicas = re.search(r"replica_count=(\d+)", header)
        total = int(partitions.group(1) if partitions else 1) * int(
            replicas.group(1) if replicas else 1
        )
        assert devices <= set(range(total))
    summary = report["summary"]
    assert summary["async_pairs"] == len(report["collectives"])
    assert sum(summary["pairs_by_kind"].values()) == summary["async_pairs"]
    flagged = [c for c in report["collectives"] if c["serialized_by"]]
    assert len(flagged) == summary["serialized"]
    assert summary["serialized"] == summary["serialized_by_bound"] + summary["serialized_by_rule"]
    assert summary["max_in_flight"] >= max(
        summary["max_in_flight_by_computation"].values(), default=0
    )


@pytest.mark.slow
def test_goldens_are_the_same_in_a_fresh_process(tmp_path: Path) -> None:
    """Byte for byte across processes (hash seeds differ), through the installed CLI."""
    fixture = max(ALL_FIXTURES, key=lambda p: len(golden(p)["collectives"]))
    out = tmp_path / "r.json"
    env = {**os.environ, "PYTHONHASHSEED": "4242"}
    subprocess.run(
        [sys.executable, "-m", "xla_streams", "assign", str(fixture), "--streams=4",
         "--policy=interval", "--json", str(out), "--quiet"],
        check=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert out.read_bytes() == golden_of(fixture).read_bytes()


# -- tools/update_goldens.py ---------------------------------------------------------


@cache
def update_goldens() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "update_goldens", REPO / "tools" / "update_goldens.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_update_script_writes_and_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = update_goldens()
    monkeypatch.setattr(script, "REPORTS", tmp_path)
    fixture = ALL_FIXTURES[0]
    mine = tmp_path / golden_of(fixture).name
    assert script.main(["--check", fixture.name]) == 1  # missing: differs
    assert not mine.exists()
    assert script.main([fixture.name]) == 0
    assert mine.read_bytes() == golden_of(fixture).read_bytes()
    assert script.main(["--check", fixture.name]) == 0
    mine.write_text("{}\n")
    assert script.main(["--check", fixture.name]) == 1
    assert mine.read_text() == "{}\n"  # --check writes nothing
