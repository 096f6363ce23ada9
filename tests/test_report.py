"""Reports of a stream assignment: the JSON (schema v2) and its index, read back with
located errors; the table, the short forms, and atomic_write.

The expectations come from reading the small modules below (which pairs overlap,
which share devices), not from running the code that makes the report.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import hlo_module

from xla_streams._io import atomic_write, atomic_write_many
from xla_streams.collectives import StreamModel, format_groups
from xla_streams.hlo import parse_module
from xla_streams.passes.base import Compilation
from xla_streams.pipeline import PassManager, build_pipeline
from xla_streams.report import (
    SCHEMA,
    AssignmentReport,
    IndexEntry,
    ReportedCollective,
    ReportError,
    ReportIndex,
    build_report,
    format_report,
    format_table,
    human_bytes,
    write_reports,
)

# Eight devices as a 2x4 mesh: %tp and %tp2 reduce over the rows {0..3},{4..7},
# %dp over the columns {0,4},{1,5},... . All three are in flight together
# (positions 1..5, 2..6, 3..7, with work at 4). %tp and %tp2 share four devices, so
# the deadlock rule ties them to one stream; %dp shares at most one device with
# either and may run beside them. %sync is synchronous: on jax >= 0.11 (the model
# these tests use) on the compute stream, no collective stream. %cp is a permute in
# a while body, alone in flight there but inside the span of nothing else.
JAX_11 = StreamModel(overlap_limit=4, sync_on_compute=True)
MODULE = hlo_module(
    "HloModule mesh, is_scheduled=true, num_partitions=8",
    """\
%cond (c: (s32[], f32[1024])) -> pred[] {
  %c = (s32[], f32[1024]{0}) parameter(0)
  %ci = s32[] get-tuple-element(%c), index=0
  %limit = s32[] constant(4)
  ROOT %lt = pred[] compare(%ci, %limit), direction=LT
}

%body (b: (s32[], f32[1024])) -> (s32[], f32[1024]) {
  %b = (s32[], f32[1024]{0}) parameter(0)
  %bi = s32[] get-tuple-element(%b), index=0
  %bv = f32[1024]{0} get-tuple-element(%b), index=1
  %cp = (f32[1024]{0}, f32[1024]{0}) collective-permute-start(%bv), channel_id=5, source_target_pairs={{0,1},{1,2},{2,3},{3,4},{4,5},{5,6},{6,7},{7,0}}
  %bw = f32[1024]{0} exponential(%bv)
  %cp.done = f32[1024]{0} collective-permute-done(%cp)
  %one = s32[] constant(1)
  %next = s32[] add(%bi, %one)
  ROOT %t = (s32[], f32[1024]{0}) tuple(%next, %cp.done)
}

ENTRY %main (p: f32[1024]) -> f32[1024] {
  %p = f32[1024]{0} parameter(0)
  %tp = f32[1024]{0} all-reduce-start(%p), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  %dp = f32[1024]{0} all-reduce-start(%p), channel_id=2, replica_groups=[4,2]<=[2,4]T(1,0), use_global_device_ids=true, to_apply=%add
  %tp2 = f32[1024]{0} all-reduce-start(%p), channel_id=3, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  %work = f32[1024]{0} exponential(%p)
  %tp.done = f32[1024]{0} all-reduce-done(%tp)
  %dp.done = f32[1024]{0} all-reduce-done(%dp)
  %tp2.done = f32[1024]{0} all-reduce-done(%tp2)
  %sync = f32[1024]{0} all-reduce-start(%p), channel_id=4, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add, backend_config={"collective_backend_config":{"is_sync":true}}
  %sync.done = f32[1024]{0} all-reduce-done(%sync)
  %sum1 = f32[1024]{0} add(%tp.done, %dp.done)
  %sum2 = f32[1024]{0} add(%sum1, %tp2.done)
  %sum3 = f32[1024]{0} add(%sum2, %sync.done)
  %zero = s32[] constant(0)
  %init = (s32[], f32[1024]{0}) tuple(%zero, %sum3)
  %loop = (s32[], f32[1024]{0}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[1024]{0} get-tuple-element(%loop), index=1
}
""",
)


def compile_(
    streams: int = 4, policy: str = "interval", text: str = MODULE, model: StreamModel = JAX_11
) -> Compilation:
    passes = build_pipeline(streams, policy, runtime=None, model=model)  # type: ignore[arg-type]
    return PassManager(passes).run(Compilation(parse_module(text, "mesh.hlo")))


def by_start(report: AssignmentReport) -> dict[str, ReportedCollective]:
    return {c.start: c for c in report.collectives}


def round_trip(report: AssignmentReport) -> AssignmentReport:
    return AssignmentReport.from_json(report.to_json(), "report.json")


def test_json_fields_follow_the_schema_and_the_module() -> None:
    report = build_report(compile_())
    data = json.loads(report.to_json())
    assert list(data) == ["schema", "module", "streams", "policy", "collectives", "summary"]
    assert data["schema"] == SCHEMA == "xla_streams.assignment.v2"
    assert (report.module, report.streams, report.policy) == ("mesh", 4, "interval")
    c = by_start(report)
    assert set(c) == {"tp", "dp", "tp2", "sync", "cp"}
    assert c["tp"] == ReportedCollective(
        computation="main",
        start="tp",
        done="tp.done",
        kind="all-reduce",
        start_index=1,
        done_index=5,
        sync=False,
        pipelined=False,
        runs_on="communication",
        stream=c["tp"].stream,
        calls=1,
        groups=((0, 1, 2, 3), (4, 5, 6, 7)),
        bytes=4096,
        serialized_by=None,
        reassigned=None,
    )
    assert data["collectives"][0] == {
        "computation": "main", "start": "tp", "done": "tp.done", "kind": "all-reduce",
        "start_index": 1, "done_index": 5, "sync": False, "pipelined": False,
        "runs_on": "communication", "stream": c["tp"].stream, "calls": 1,
        "groups": [[0, 1, 2, 3], [4, 5, 6, 7]], "bytes": 4096, "serialized_by": None,
        "reassigned": None,
    }  # fmt: skip
    assert c["dp"].groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert (c["cp"].computation, c["cp"].start_index, c["cp"].done_index) == ("body", 3, 5)
    assert c["cp"].groups == tuple((i, (i + 1) % 8) for i in range(8))
    # The rule ties tp2 to tp; dp runs beside them; sync gets none.
    assert c["tp2"].stream == c["tp"].stream != c["dp"].stream
    assert c["tp2"].serialized_by == "rule"
    assert c["sync"].sync is True and c["sync"].stream is None
    assert c["sync"].runs_on == "compute"
    assert round_trip(report) == report
    # Compiled with settings unknown, the sync one may be XLA 0.10's async thunk on
    # stream 0: it is assumed so, and takes part in the rule.
    unknown = build_report(compile_(model=StreamModel()))
    assert (by_start(unknown)["sync"].runs_on, by_start(unknown)["sync"].stream) == (
        "communication",
        0,
    )
    assert round_trip(unknown) == unknown


def test_summary_counts() -> None:
    summary = build_report(compile_()).summary
    assert summary.async_pairs == 5
    assert summary.assigned == 4  # all but %sync
    assert summary.streams_used == 2  # {tp, tp2} and dp; cp reuses a free one
    assert summary.max_in_flight == 3  # tp, dp, tp2
    assert summary.serialized == summary.serialized_by_rule == 1
    assert summary.serialized_by_bound == 0
    assert summary.sync == 1 and summary.pipelined == 0
    assert summary.pairs_by_kind == {"all-reduce": 4, "collective-permute": 1}
    assert summary.max_in_flight_by_computation == {"body": 1, "main": 3}


def test_one_stream_serializes_by_the_bound_and_by_the_rule() -> None:
    report = build_report(compile_(streams=1))
    c = by_start(report)
    assert {c[n].stream for n in ("tp", "dp", "tp2", "cp")} == {0}
    assert c["dp"].serialized_by == "bound"  # could have run beside tp with a second stream
    assert c["tp2"].serialized_by == "rule"  # shares devices with tp: never beside it
    assert c["tp"].serialized_by is None  # first on its stream
    s = report.summary
    assert (s.serialized, s.serialized_by_bound, s.serialized_by_rule) == (2, 1, 1)
    assert s.streams_used == 1
    assert round_trip(report) == report


def test_round_robin_policy_is_reported() -> None:
    report = build_report(compile_(policy="round-robin"))
    assert report.policy == "round-robin"
    assert round_trip(report) == report


def test_report_needs_an_assignment() -> None:
    compilation = PassManager.from_spec("find-async-pairs").run(
        Compilation(parse_module(MODULE, "mesh.hlo"))
    )
    with pytest.raises(ValueError, match="assign-streams"):
        build_report(compilation)


def test_json_text_is_valid_stable_and_one_collective_per_line() -> None:
    text = build_report(compile_()).to_json()
    assert text.endswith("}\n")
    assert AssignmentReport.from_json(text) == build_report(compile_())
    assert build_report(compile_()).to_json() == text
    rows = [line for line in text.splitlines() if line.lstrip().startswith('{"computation"')]
    assert len(rows) == 5
    # Collectives in the order they start in the execution: main's three, sync, then cp.
    assert [json.loads(r.rstrip(","))["start"] for r in rows] == ["tp", "dp", "tp2", "sync", "cp"]


@pytest.mark.slow
def test_json_is_identical_across_processes() -> None:
    """The assignment must be the same in every process of a multi-host job."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from test_report import compile_; from xla_streams.report import build_report; "
        "sys.stdout.write(build_report(compile_()).to_json())"
    )
    outputs = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code, str(Path(__file__).parent)],
            capture_output=True, text=True, env=env, check=True,
        )  # fmt: skip
        outputs.add(out.stdout)
    assert outputs == {build_report(compile_()).to_json()}


@pytest.mark.parametrize(
    ("mutate", "complaint"),
    [
        (lambda r: r.pop("schema"), "schema: expected 'xla_streams.assignment.v2', got None"),
        (lambda r: r.__setitem__("schema", "xla_streams.assignment.v1"), "schema: expected"),
        (lambda r: r["collectives"][0].__setitem__("runs_on", "gpu"),
         "collectives[0].runs_on: expected one of communication, compute, p2p, got 'gpu'"),
        (lambda r: r["collectives"][0].pop("start"), "collectives[0].start: missing"),
        (lambda r: r["collectives"][0].__setitem__("start_index", "1"),
         "collectives[0].start_index: expected an integer, got a string ('1')"),
        (lambda r: r["collectives"][0].__setitem__("done_index", 1),
         "collectives[0].done_index: expected more than start_index (1), got 1"),
        (lambda r: r["collectives"][0].__setitem__("stream", None),
         "collectives[0].stream: expected a stream: the pair runs on the collective streams"),
        (lambda r: r["collectives"][3].__setitem__("stream", 0),
         "collectives[3].stream: expected null: the pair runs on the compute stream, got 0"),
        (lambda r: r["collectives"][0].__setitem__("stream", 4),
         "collectives[0].stream: expected an integer in 0..3, got 4"),
        (lambda r: r["collectives"][0].__setitem__("start", "%tp"),
         "collectives[0].start: expected a name without '%'"),
        (lambda r: r["collectives"][0].__setitem__("sync", 0),
         "collectives[0].sync: expected true or false, got a number (0)"),
        (lambda r: r["collectives"][0].__setitem__("groups", [[0, "1"]]),
         "collectives[0].groups[0][1]: expected an integer"),
        (lambda r: r["collectives"][0].__setitem__("serialized_by", "luck"),
         "collectives[0].serialized_by: expected one of bound, rule, got 'luck'"),
        (lambda r: r["summary"].__setitem__("assigned", 5),
         "summary.assigned: 5, but the collectives say 4"),
        (lambda r: r["summary"].__setitem__("pairs_by_kind", {"all-reduce": 5}),
         "summary.pairs_by_kind: {\"all-reduce\": 5}, but the collectives say"),
        (lambda r: r["summary"].pop("max_in_flight"), "summary.max_in_flight: missing"),
        (lambda r: r.__setitem__("policy", "greedy"), "policy: expected one of interval"),
        (lambda r: r.__setitem__("streams", 0), "streams: expected an integer in 1..64, got 0"),
        (lambda r: r.__setitem__("collectives", {}),
         "collectives: expected a JSON array, got a JSON object"),
        (lambda r: r.__setitem__("lowered", 8), "lowered: expected a string, got a number (8)"),
    ],
)  # fmt: skip
def test_from_json_refuses_broken_reports_naming_file_and_field(
    mutate: object, complaint: str
) -> None:
    report = json.loads(build_report(compile_()).to_json())
    assert report["collectives"][3]["start"] == "sync"
    mutate(report)  # type: ignore[operator]
    with pytest.raises(ReportError) as refused:
        AssignmentReport.from_json(json.dumps(report), "r.json")
    assert str(refused.value).startswith(f"r.json: {complaint}"), str(refused.value)


def test_from_json_refuses_what_is_not_json_or_not_a_report() -> None:
    with pytest.raises(ReportError, match=r"^r\.json: not JSON: "):
        AssignmentReport.from_json('{"schema": ', "r.json")
    with pytest.raises(ReportError, match='^r.json: expected a JSON object with "schema"'):
        AssignmentReport.from_json("[]", "r.json")


def test_from_json_reads_what_v2_may_add_or_did_not_have_yet() -> None:
    """Fields added to v2 are ignored by this reader; ``synchronous_collectives``,
    added after v2's first files, reads as 0 where they lack it."""
    report = build_report(compile_())
    data = json.loads(report.to_json())
    data["collectives"][0]["added_later"] = 1
    data["added_later"] = {"x": 1}
    assert AssignmentReport.from_json(json.dumps(data)) == report
    del data["summary"]["synchronous_collectives"]
    assert AssignmentReport.from_json(json.dumps(data)).summary.synchronous_collectives == 0


def test_table_rows_and_summary() -> None:
    compilation = compile_(streams=1)
    table = format_table(compilation)
    lines = table.splitlines()
    assert lines[0].split() == [
        "kind", "start", "computation", "positions", "stream", "groups", "bytes", "note",
    ]  # fmt: skip
    rows = {line.split()[1]: line for line in lines[2:7]}
    assert set(rows) == {"tp", "dp", "tp2", "sync", "cp"}
    assert rows["tp"].split()[:6] == ["all-reduce", "tp", "main", "1..5", "0", "2x{0..3}"]
    assert "4.0 KiB" in rows["tp"]
    assert rows["dp"].split()[5] == "4x{0,4}"
    assert "8 pairs 0->1..7->0" in rows["cp"]
    assert "bound" in rows["dp"] or "busy" in rows["dp"]
    assert "rule" in rows["tp2"]
    assert rows["sync"].split()[4] == "-" and "sync" in rows["sync"].split("  ")[-1]
    summary = "\n".join(lines[7:])
    assert "5 async pairs" in summary
    assert "all-reduce 4" in summary and "collective-permute 1" in summary
    assert "1 of 1 streams" in summary
    assert "max in flight: 3" in summary and "main 3" in summary
    assert "serialized: 2" in summary


def test_table_without_collectives() -> None:
    text = "HloModule none, is_scheduled=true\n\nENTRY %main (p: f32[]) -> f32[] {\n  ROOT %p = f32[] parameter(0)\n}\n"
    table = format_table(compile_(text=text))
    assert "no async collectives" in table
    assert "0 async pairs" in table


# A recv from the host and a send back: no device collectives (no pairs, no stream).
HOST_TRANSFERS = """\
HloModule host, is_scheduled=true

ENTRY %main (p: f32[8]) -> f32[8] {
  %tok = token[] after-all()
  %in = (f32[8]{0}, u32[], token[]) recv(%tok), channel_id=1, is_host_transfer=true
  %in.done = (f32[8]{0}, token[]) recv-done(%in), channel_id=1, is_host_transfer=true
  %value = f32[8]{0} get-tuple-element(%in.done), index=0
  %out = (f32[8]{0}, u32[], token[]) send(%value, %tok), channel_id=2, is_host_transfer=true
  %out.done = token[] send-done(%out), channel_id=2, is_host_transfer=true
  ROOT %result = f32[8]{0} copy(%value)
}
"""


def test_host_transfers_are_named_in_the_table_and_the_json() -> None:
    report = build_report(compile_(text=HOST_TRANSFERS))
    assert report.collectives == () and report.summary.host_transfers == 2
    assert "\nhost transfers: 2 (send/recv to or from the host: not device collectives, no " in (
        format_report(report)
    )
    assert json.loads(report.to_json())["summary"]["host_transfers"] == 2
    assert round_trip(report) == report


def test_a_report_without_host_transfers_has_no_such_member() -> None:
    """``summary.host_transfers`` came to v2 after its first files: written only where
    there are some, so every other report reads and prints as before, and it reads as 0
    where it is absent."""
    report = build_report(compile_())
    assert report.summary.host_transfers == 0
    assert "host_transfers" not in json.loads(report.to_json())["summary"]
    assert "host transfers" not in format_report(report)
    assert round_trip(report) == report


def test_summary_tells_sync_pairs_from_synchronous_collectives(tmp_path: Path) -> None:
    """Two different counts: async pairs XLA runs synchronously (``summary.sync``) and
    collectives that were never async (``synchronous_collectives``). The text names
    both, where it once said "sync N" for the first only."""
    table = format_table(compile_(streams=1))
    assert (
        "synchronous: 1 sync pair (async start and done with nothing between, which XLA "
        "runs synchronously), 0 synchronous collectives (never async)"
    ) in table
    assert "; pipelined 0\n" in table and "sync 1" not in table
    dump = Path(__file__).resolve().parent / "data" / "jax0_12_fsdp_scan.dump.hlo"
    compilation = compile_(streams=2, text=dump.read_text())
    report = build_report(compilation)
    assert (report.summary.sync, report.summary.synchronous_collectives) == (0, 3)
    assert "synchronous: 0 sync pairs (" in format_table(compilation)
    assert "3 synchronous collectives (never async)" in format_table(compilation)
    # The index's column counts synchronous collectives, and says so.
    write_reports(compilation, str(tmp_path), "digest")
    header = (tmp_path / "index.txt").read_text().splitlines()[0]
    assert "synchronous collectives" in header and " sync " not in f" {header} "


def test_the_index_keeps_one_entry_per_report_file(tmp_path: Path) -> None:
    first, _ = write_reports(compile_(), str(tmp_path), "aaaa")
    second, _ = write_reports(compile_(streams=1), str(tmp_path), "bbbb")
    write_reports(compile_(), str(tmp_path), "aaaa")  # the same file again: one entry
    index = ReportIndex.load(str(tmp_path / "index.json"))
    assert index.modules == (
        IndexEntry("mesh", Path(first).name, 5, 4, 2, 1, 0),
        IndexEntry("mesh", Path(second).name, 5, 4, 1, 1, 0),
    )
    text = (tmp_path / "index.json").read_text()
    assert ReportIndex.from_json(text).to_json() == text
    assert json.loads(text)["schema"] == "xla_streams.index.v1"
    # An index that is not one is started afresh, not trusted.
    (tmp_path / "index.json").write_text('{"schema": "xla_streams.index.v1", "modules": [{}]}')
    with pytest.raises(ReportError, match=r"index\.json: modules\[0\]\.module: missing"):
        ReportIndex.load(str(tmp_path / "index.json"))
    write_reports(compile_(), str(tmp_path), "aaaa")
    assert [e.report for e in ReportIndex.load(str(tmp_path / "index.json")).modules] == [
        Path(first).name
    ]
    with pytest.raises(ReportError, match=r"missing\.json: cannot read the report index"):
        ReportIndex.load(str(tmp_path / "missing.json"))


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (4 << 20, "4.0 MiB"), (1536 << 20, "1.5 GiB"),
     (3 << 40, "3.0 TiB"), (5 << 50, "5120.0 TiB")],
)  # fmt: skip
def test_human_bytes(n: int, text: str) -> None:
    assert human_bytes(n) == text


@pytest.mark.parametrize(
    ("groups", "kind", "text"),
    [
        ([list(range(8))], "all-gather", "{0..7}"),
        ([[0, 4]], "all-reduce", "{0,4}"),
        ([[0, 1, 2, 3, 8, 10]], "all-reduce", "{0..3,8,10}"),
        ([[0, 2, 4], [1, 3, 5]], "all-reduce", "2x{0,2,4}"),
        ([[0, 8, 16, 24, 25, 26]], "all-reduce", "{0,8,...,24,25,26}"),
        ([[0, 4], [1, 5], [2, 6], [3, 7]], "all-reduce", "4x{0,4}"),
        ([[0, 1, 2, 3], [4, 5, 6, 7]], "all-reduce", "2x{0..3}"),
        ([[0, 2], [4, 6]], "all-reduce", "2x{0,2} step 4"),  # does not tile 0..7
        ([[i, (i + 1) % 8] for i in range(8)], "collective-permute", "8 pairs 0->1..7->0"),
        ([[i + 1, i] for i in range(7)], "collective-permute", "7 pairs 1->0..7->6"),
        (
            [[0, 1], [1, 2], [2, 3], [3, 0], [4, 5], [5, 6], [6, 7], [7, 4]],
            "collective-permute",
            "2x(4 pairs 0->1..3->0)",
        ),
        ([[0, 1]], "send", "0->1"),
        ([[0, 1], [1, 0]], "collective-permute", "0->1,1->0"),
        ([[5, 1], [3, 2], [7, 0], [1, 1], [2, 2]], "collective-permute", "5->1,3->2,7->0,...,2->2 (5 pairs)"),
        ([[0, 3], [1, 7], [2, 5], [4, 6], [8, 9]], "all-reduce", "{0,3},{1,7},{2,5},...,{8,9} (5 groups)"),
        ([], "all-reduce", "{}"),
    ],
)  # fmt: skip
def test_group_short_forms(groups: list[list[int]], kind: str, text: str) -> None:
    assert format_groups(groups, kind) == text


def test_group_short_forms_are_short_for_large_meshes() -> None:
    groups = [[r * 64 + c for c in range(64)] for r in range(16)]  # 16 rows of 64 devices
    assert format_groups(groups, "all-reduce") == "16x{0..63}"
    columns = [[r * 64 + c for r in range(16)] for c in range(64)]
    assert format_groups(columns, "all-reduce") == "64x{0,64,...,960}"


# -- atomic_write ----------------------------------------------------------------------


def test_atomic_write_creates_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    atomic_write(target, "first\n")
    assert target.read_text() == "first\n"
    target.chmod(0o640)
    atomic_write(str(target), b"second\n")
    assert target.read_bytes() == b"second\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # permissions kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]  # no temporaries left


def test_atomic_write_new_file_follows_umask(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        atomic_write(tmp_path / "f", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == 0o640


def test_atomic_write_many_writes_nothing_when_one_fails(tmp_path: Path) -> None:
    good = tmp_path / "good.txt"
    good.write_text("old")
    with pytest.raises(FileNotFoundError) as info:
        atomic_write_many([(good, "new"), (tmp_path / "missing" / "bad.txt", "x")])
    assert info.value.filename == str(tmp_path / "missing" / "bad.txt")
    assert good.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.txt"]


def test_atomic_write_refuses_a_directory(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        atomic_write(tmp_path, "x")
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_never_shows_a_partial_file(tmp_path: Path) -> None:
    """A reader polling the file sees the old or the new content, nothing between."""
    target = tmp_path / "big.txt"
    old, new = "a" * 2_000_000, "b" * 2_000_000
    atomic_write(target, old)
    reader = subprocess.Popen(
        [sys.executable, "-c", _POLL, str(target), str(len(old))],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    for i in range(20):
        atomic_write(target, new if i % 2 == 0 else old)
    reader.terminate()
    out, _ = reader.communicate()
    assert "partial" not in out


_POLL = """
import sys, time
path, size = sys.argv[1], int(sys.argv[2])
end = time.time() + 10
while time.time() < end:
    data = open(path).read()
    if len(data) != size or len(set(data)) != 1:
        print("partial", len(data), flush=True)
        break
"""
