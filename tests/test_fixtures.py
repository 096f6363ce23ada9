"""Checks over hlo_fixtures/: regenerate byte for byte, and cheap structural facts.

The structural checks use plain string/regex scans on purpose: they vouch for
the fixtures independently of the project's own HLO parser.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from xla_streams import jax_compat

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "hlo_fixtures"
SCRIPT = REPO / "tools" / "make_fixtures.py"

# `%name = <shape> opcode(%operand, ...` ; shapes may hold spaces only inside
# tuples, which never contain '(' followed by a lowercase opcode and '(%'.
INSTR = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = .*? ([a-z][a-z0-9\-]*)\((%[\w.\-]+)?")
COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) .*\{$")
WHILE_BODY = re.compile(r" while\(.*\bbody=%([\w.\-]+)")


@cache
def manifest() -> dict:
    return json.loads((FIXTURES / "MANIFEST.json").read_text())


@cache
def text(name: str) -> str:
    return (FIXTURES / name).read_text()


def entries(**where: str) -> list[dict]:
    return [e for e in manifest()["files"] if all(e[k] == v for k, v in where.items())]


def computations(hlo: str) -> dict[str, list[str]]:
    """Instruction lines of each computation, by name."""
    comps: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in hlo.splitlines():
        m = COMPUTATION.match(line)
        if m:
            current = comps.setdefault(m.group(1), [])
        elif line.startswith("}"):
            current = None
        elif current is not None:
            current.append(line)
    return comps


def is_start(op: str) -> bool:
    # `*-start` covers async-start and the sugared spellings; send/recv pair
    # with send-done/recv-done. jax 0.12 also runs some fusions asynchronously
    # (fusion-start/-done, on side compute streams): not collectives.
    return (op.endswith("-start") and op != "fusion-start") or op in ("send", "recv")


def is_done(op: str) -> bool:
    return op.endswith("-done") and op != "fusion-done"


def max_in_flight(hlo: str) -> int:
    """Most async pairs open at once at any point of any computation's sequence."""
    best = 0
    for lines in computations(hlo).values():
        open_: set[str] = set()
        for line in lines:
            m = INSTR.match(line)
            if not m:
                continue
            name, op, operand = m.groups()
            if is_start(op):
                open_.add(name)
            elif is_done(op) and operand:
                open_.discard(operand[1:])
            best = max(best, len(open_))
    return best


@pytest.mark.slow
def test_regenerates_byte_for_byte() -> None:
    assert jax_compat.cuda_plugin_module() is not None, (
        "install the gpu-aot extra (jax[cuda12]): pip install -e '.[test,gpu-aot]'"
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--check", "--out", str(FIXTURES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]


def test_manifest_matches_directory() -> None:
    m = manifest()
    listed = {e["file"] for e in m["files"]}
    # Other tools keep files here too (expected outputs, README); ours are named
    # <program>.<options>.<form>.hlo.
    ours = re.compile(r"^[a-z0-9_]+\.[a-z0-9_]+\.(text|dump|hook)\.hlo$")
    present = {p.name for p in FIXTURES.glob("*.hlo") if ours.match(p.name)}
    assert listed == present
    assert m["jax"] and m["jaxlib"]
    for e in m["files"]:
        data = (FIXTURES / e["file"]).read_bytes()
        assert data.count(b"\n") == e["lines"], e["file"]
        assert hashlib.sha256(data).hexdigest() == e["sha256"], e["file"]
        assert e["file"] == f"{e['program']}.{e['options']}.{e['form']}.hlo"


def test_every_fixture_is_a_scheduled_module() -> None:
    for e in manifest()["files"]:
        first = text(e["file"]).split("\n", 1)[0]
        assert first.startswith("HloModule "), e["file"]
        assert "is_scheduled=true" in first, e["file"]


def test_large_module_is_large() -> None:
    (large,) = entries(program="large_transformer")
    assert large["lines"] >= 20_000


def test_multihost_has_32_partitions() -> None:
    for e in entries(program="multihost_32"):
        assert "num_partitions=32" in text(e["file"]).split("\n", 1)[0]


def test_dump_form_wraps_collectives_in_async_start() -> None:
    sugared = re.compile(r" (reduce-scatter|all-to-all)-start\(")
    wrapped = re.compile(r" async-start\(.*\bcalls=%")
    dumps = entries(form="dump")
    assert dumps
    for e in dumps:
        dump = text(e["file"])
        assert not sugared.search(dump), e["file"]
        twin = text(e["file"].replace(".dump.hlo", ".text.hlo"))
        if sugared.search(twin):
            assert wrapped.search(dump), e["file"]
    assert any(wrapped.search(text(e["file"])) for e in dumps)


def test_text_form_prints_sugared_async_spellings() -> None:
    expect = {
        "fsdp_unrolled": ["all-gather-start(", "reduce-scatter-start("],
        "fsdp_scan": ["all-gather-start(", "reduce-scatter-start("],
        "transformer_step": ["all-gather-start(", "reduce-scatter-start(", "all-reduce-start("],
        "psum_scatter": ["reduce-scatter-start("],
        "moe_all_to_all": ["all-to-all-start("],
        "ppermute_pipeline": ["collective-permute-start("],
        "tp_dp_2d": ["all-reduce-start("],
        "gspmd_step": ["all-reduce-start("],
    }
    for program, spellings in expect.items():
        for e in entries(program=program, form="text"):
            hlo = text(e["file"])
            for s in spellings:
                assert s in hlo, (e["file"], s)
            assert " async-start(" not in hlo, e["file"]


def test_scan_fixtures_have_collectives_in_while_bodies() -> None:
    for e in entries(program="fsdp_scan") + entries(program="ppermute_scan"):
        hlo = text(e["file"])
        comps = computations(hlo)
        bodies = {m.group(1) for m in WHILE_BODY.finditer(hlo)}
        assert bodies, e["file"]
        in_body = [
            line
            for body in bodies
            for line in comps.get(body, [])
            if (m := INSTR.match(line)) and is_start(m.group(2))
        ]
        assert in_body, e["file"]


@pytest.mark.slow
def test_limit4_fixtures_overlap_collectives() -> None:
    # Under the pipeline-parallelism opt level XLA keeps its p2p pairs (on the
    # "p2p" stream) back to back, so that fixture has nothing overlapping.
    limit4 = [
        e
        for e in manifest()["files"]
        if e["options"].startswith("limit4") and e["options"] != "limit4_pp_enable"
    ]
    assert len(limit4) >= 10
    for e in limit4:
        assert max_in_flight(text(e["file"])) >= 2, e["file"]


def test_default_options_keep_one_collective_in_flight() -> None:
    for e in entries(options="default"):
        assert max_in_flight(text(e["file"])) <= 1, e["file"]


def test_pipelined_fixtures() -> None:
    (p2p,) = entries(program="ppermute_scan", options="limit4_pp_enable", form="text")
    hlo = text(p2p["file"])
    assert "_xla_send_recv_pipeline" in hlo
    assert re.search(r" send\(", hlo) and re.search(r" recv-done\(", hlo)
    (old,) = entries(program="ppermute_scan", options="limit4_pipelined_p2p", form="text")
    assert "_xla_send_recv_pipeline" in text(old["file"])
    (pipelined,) = entries(program="fsdp_scan", options="limit4_pipelined", form="text")
    assert '"is_pipelined":true' in text(pipelined["file"])


def test_replica_group_forms_are_covered() -> None:
    # jax 0.12 prints no explicit {{0,1},...} groups any more (tests/test_hlo_parse.py
    # covers that form, which users' older dumps have).
    everything = "".join(text(e["file"]) for e in entries(form="text"))
    assert re.search(r"replica_groups=\[\d+,\d+\]<=\[\d+\][,}]", everything)  # iota
    assert re.search(r"replica_groups=\[[\d,]+\]<=\[[\d,]+\]T\(", everything)  # transposed iota
    assert re.search(r"replica_groups=mesh\['", everything)  # mesh axes
    assert "source_target_pairs={{" in everything
