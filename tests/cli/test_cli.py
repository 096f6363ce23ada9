"""The xla-streams command line, run as users run it: in a subprocess.

Exit codes (0 success, 1 verification failure, 2 bad input or usage), nothing
written on error, '-' for stdin/stdout, help texts, byte-for-byte round trips,
XLA's own parser accepting what `assign` writes, and no JAX import.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
from conftest import hlo_module, xla_parsable

from xla_streams import cli
from xla_streams.report import AssignmentReport

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "hlo_fixtures"
# Tensor- and data-parallel all-reduces in flight together: two streams are used.
TP_DP = FIXTURES / "tp_dp_2d.limit4.text.hlo"
# An XLA dump (`.dump.hlo`) and a `compiled.as_text()` file with a while loop.
DUMP = FIXTURES / "fsdp_scan.limit4.dump.hlo"
TEXT = FIXTURES / "fsdp_scan.limit4.text.hlo"
PIPELINE = "find-async-pairs,assign-streams{streams=4},verify-streams,annotate-streams"

# Two all-reduces over the same devices in flight together: the deadlock rule
# ties them to one stream.
TIED = hlo_module(
    "HloModule tied, is_scheduled=true, num_partitions=4",
    """\
ENTRY %main (p: f32[256]) -> f32[256] {
  %p = f32[256]{0} parameter(0)
  %a = f32[256]{0} all-reduce-start(%p), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
  %b = f32[256]{0} all-reduce-start(%p), channel_id=2, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
  %e = f32[256]{0} exponential(%p)
  %a.done = f32[256]{0} all-reduce-done(%a)
  %b.done = f32[256]{0} all-reduce-done(%b)
  ROOT %s = f32[256]{0} add(%a.done, %b.done)
}
""",
)


def xla_streams(
    *args: str | Path, stdin: bytes | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "xla_streams", *map(str, args)],
        input=stdin, capture_output=True, cwd=cwd, timeout=60,
    )  # fmt: skip


def err(result: subprocess.CompletedProcess[bytes]) -> str:
    return result.stderr.decode()


def assert_user_error(result: subprocess.CompletedProcess[bytes], *phrases: str) -> None:
    """Exit 2, a message, no traceback."""
    message = err(result)
    assert result.returncode == 2, message
    assert "Traceback" not in message
    for phrase in phrases:
        assert phrase in message, message


# -- help ------------------------------------------------------------------------------


def test_main_help_lists_every_command_with_a_description() -> None:
    result = xla_streams("--help")
    assert result.returncode == 0
    out = result.stdout.decode()
    assert out.startswith("usage: xla-streams COMMAND")
    listed = dict(re.findall(r"^  (\w+) +(\S.{20,})$", out, re.M))
    assert {"opt", "assign", "report", "demo"} <= set(listed) == set(cli.COMMANDS)
    assert "exit codes" in out.lower()


def test_no_command_is_a_usage_error() -> None:
    result = xla_streams()
    assert result.returncode == 2 and "usage: xla-streams COMMAND" in err(result)
    assert_user_error(xla_streams("frobnicate"), "unknown command 'frobnicate'")


@pytest.mark.parametrize(
    ("command", "present", "absent"),
    [
        (
            "opt",
            ["-p, --pipeline", "-o, --output", "--[no]time-passes", "--[no]print-after-all"],
            ["--streams", "--policy", "--json", "--quiet"],
        ),
        (
            "assign",
            ["--streams=K", "--policy=interval|round-robin", "--json=", "--output=", "quiet"],
            ["--pipeline", "time-passes"],
        ),
        ("report", ["--streams=K", "--policy=", "--json="], ["--output", "--pipeline", "quiet"]),
    ],
)
def test_command_help_lists_only_its_own_flags(
    command: str, present: list[str], absent: list[str]
) -> None:
    result = xla_streams(command, "--help")
    assert result.returncode == 0, err(result)
    out = result.stdout.decode()
    assert out.startswith(f"usage: xla-streams {command} ")
    for text in present:
        assert text in out
    for text in [*absent, "--flagfile", "--undefok"]:
        assert text not in out


def test_opt_help_lists_the_passes() -> None:
    out = xla_streams("opt", "-h").stdout.decode()
    for name in ("find-async-pairs{overlap_limit=0,sync_on_compute=false,ffi=false}",
                 "assign-streams{streams=4,policy=interval}", "verify-streams",
                 "annotate-streams"):  # fmt: skip
        assert f"\n  {name}\n" in out


# -- opt -------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", [DUMP, TEXT], ids=lambda p: p.name)
def test_opt_empty_pipeline_round_trips_byte_for_byte(fixture: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.hlo"
    result = xla_streams("opt", fixture, "-p", "", "-o", out)
    assert result.returncode == 0, err(result)
    assert out.read_bytes() == fixture.read_bytes()
    # Long flag names, stdin and stdout.
    result = xla_streams("opt", "-", "--pipeline=", "--output=-", stdin=fixture.read_bytes())
    assert result.returncode == 0, err(result)
    assert result.stdout == fixture.read_bytes()


def test_opt_runs_the_pipeline(tmp_path: Path) -> None:
    out = tmp_path / "out.hlo"
    result = xla_streams("opt", TP_DP, "-p", PIPELINE, "-o", out, "--time-passes")
    assert result.returncode == 0, err(result)
    text = out.read_text()
    assert text.count("_xla_stream_annotation=") > 0
    assert result.stdout == b""
    timings = err(result)
    for name in ("find-async-pairs", "assign-streams", "verify-streams", "annotate-streams"):
        assert re.search(rf"^  {name} +[0-9.]+ ms$", timings, re.M), timings
    # Only the annotated instructions changed.
    before, after = TP_DP.read_text().split("\n"), text.split("\n")
    assert len(before) == len(after)
    changed = [b for a, b in zip(before, after, strict=True) if a != b]
    assert changed and all("_xla_stream_annotation" in line for line in changed)


def test_opt_print_after_all(tmp_path: Path) -> None:
    result = xla_streams(
        "opt", "-", "-p", "find-async-pairs,assign-streams", "--print-after-all",
        stdin=TIED.encode(),
    )  # fmt: skip
    assert result.returncode == 0, err(result)
    dumps = err(result).count("HloModule tied")
    assert dumps == 2
    assert "find-async-pairs" in err(result) and "assign-streams{" in err(result)
    assert result.stdout.decode() == TIED


# -- exit code 2: bad input or usage; nothing written ---------------------------------


BAD_HLO = TIED.replace(
    "%b.done = f32[256]{0} all-reduce-done(%b)", "%b.done = f32[256 all-reduce-done(%b)"
)


def test_bad_hlo_reports_file_line_column_and_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.hlo"
    bad.write_text(BAD_HLO)
    out, report = tmp_path / "out.hlo", tmp_path / "out.json"
    result = xla_streams("assign", bad, "-o", out, "--json", report)
    assert_user_error(result)
    assert not out.exists() and not report.exists()
    first, shown, caret = err(result).splitlines()[:3]
    m = re.match(rf"{re.escape(str(bad))}:(\d+):(\d+): error: \S", first)
    assert m, first
    line, column = int(m.group(1)), int(m.group(2))
    source = BAD_HLO.split("\n")[line - 1]
    assert "f32[256 all-reduce-done" in source
    # The caret points at the reported column of the shown source line.
    position = caret.index("^")
    assert shown[position] == source[column - 1]
    assert shown.strip().strip(".") in source


def test_error_keeps_an_existing_output_unchanged(tmp_path: Path) -> None:
    bad = tmp_path / "bad.hlo"
    bad.write_text(BAD_HLO)
    out = tmp_path / "out.hlo"
    out.write_text("previous contents\n")
    assert_user_error(xla_streams("opt", bad, "-p", "", "-o", out))
    assert out.read_text() == "previous contents\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.hlo", "out.hlo"]


@pytest.mark.parametrize(
    ("args", "phrases"),
    [
        (["opt", "IN", "-p", "no-such-pass"], ["unknown pass 'no-such-pass'", "find-async-pairs"]),
        (["opt", "IN", "-p", "assign-streams"], ["requires", "find-async-pairs"]),
        (["opt", "IN", "-p", "find-async-pairs,assign-streams{streams=x}"], ["streams"]),
        (["opt", "IN", "-p", "find-async-pairs,assign-streams{colour=red}"], ["colour"]),
        (["opt", "IN"], ["--pipeline"]),
        (["opt", "IN", "IN", "-p", ""], ["one input file"]),
        (["opt", "-p", ""], ["one input file"]),
        (["opt", "missing.hlo", "-p", ""], ["missing.hlo", "No such file"]),
        (["opt", "IN", "-p", "", "--no-such-flag"], ["no-such-flag"]),
        (["assign", "IN", "--streams=0"], ["1 to 64"]),
        (["assign", "IN", "--streams=65"], ["1 to 64"]),
        (["assign", "IN", "--streams=four"], ["1 to 64"]),
        (["assign", "IN", "--streams=2.5"], ["1 to 64"]),
        (["report", "IN", "--streams", "-1"], ["1 to 64"]),
        (["assign", "IN", "--policy=random"], ["interval", "round-robin"]),
        (["assign", "IN", "--json=-", "-o", "-"], ["standard output"]),
        (["assign", "IN", "--json=same", "-o", "same"], ["two outputs", "same"]),
    ],
)
def test_usage_and_input_errors_exit_2_and_write_nothing(
    args: list[str], phrases: list[str], tmp_path: Path
) -> None:
    source = tied_file(tmp_path)
    argv = [str(source) if a == "IN" else a for a in args]
    # Every output the command has goes to a file that must not appear.
    if not any(a.startswith(("-o", "--json", "--output")) for a in argv):
        argv += {"opt": ["-o", "o.hlo"], "assign": ["-o", "o.hlo", "--json=o.json"],
                 "report": ["--json=o.json"]}[argv[0]]  # fmt: skip
    assert_user_error(xla_streams(*argv, cwd=tmp_path), *phrases)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tied.hlo"]


def test_unwritable_output_writes_no_other_output(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    result = xla_streams("assign", tied_file(tmp_path), "--json", report, "-o",
                         tmp_path / "no" / "such" / "dir" / "x.hlo")  # fmt: skip
    assert_user_error(result, "cannot write", "x.hlo")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tied.hlo"]


def tied_file(tmp_path: Path) -> Path:
    path = tmp_path / "tied.hlo"
    path.write_text(TIED)
    return path


# -- exit code 1: the assignment fails verification ------------------------------------

# A pass that moves the second of two rule-tied pairs to another stream, as a buggy
# assignment would; registered only inside the child process.
BREAK_STREAMS = textwrap.dedent(
    """
    import dataclasses, sys
    from xla_streams import cli
    from xla_streams.passes.base import Fact, ModulePass
    from xla_streams.pipeline import register
    from xla_streams.streams import must_share_stream

    @register
    @dataclasses.dataclass(frozen=True)
    class BreakStreams(ModulePass):
        name = "test-break-streams"
        requires = frozenset({Fact.STREAMS_ASSIGNED})

        def run(self, compilation):
            a = compilation.assignment
            pairs = [p for p in compilation.pairs if p.needs_stream]
            tied = next((p, q) for i, p in enumerate(pairs) for q in pairs[i + 1:]
                        if must_share_stream(p, q))
            stream_of = dict(a.stream_of)
            stream_of[tied[1].start] = (stream_of[tied[0].start] + 1) % a.streams
            compilation.assignment = dataclasses.replace(a, stream_of=stream_of)

    sys.argv = ["xla-streams", *sys.argv[1:]]
    cli.run()
    """
)


def test_verification_failure_exits_1_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out.hlo"
    spec = "find-async-pairs,assign-streams{streams=2},test-break-streams,verify-streams"
    result = subprocess.run(
        [sys.executable, "-c", BREAK_STREAMS, "opt", str(tied_file(tmp_path)), "-p", spec,
         "-o", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "verification failed" in result.stderr and "deadlock rule" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()
    # Without the breaking pass the same pipeline verifies.
    ok = xla_streams("opt", tied_file(tmp_path), "-p", spec.replace("test-break-streams,", ""))
    assert ok.returncode == 0, err(ok)


def test_assign_exits_1_when_its_assignment_is_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`assign` runs verify-streams: a wrong assignment stops it before anything is written."""
    from xla_streams.passes import assign_streams as module
    from xla_streams.streams import StreamAssignment

    def everything_apart(pairs, streams, policy):  # type: ignore[no-untyped-def]
        return StreamAssignment(streams, policy, {p.start: i for i, p in enumerate(pairs)})

    monkeypatch.setattr(module, "assign_streams", everything_apart)
    out, report = tmp_path / "o.hlo", tmp_path / "o.json"
    stdout, stderr = io.StringIO(), io.StringIO()
    code = cli.main(
        ["assign", str(tied_file(tmp_path)), "-o", str(out), "--json", str(report)],
        stdout=stdout, stderr=stderr,
    )  # fmt: skip
    assert code == 1, stderr.getvalue()
    assert "deadlock rule" in stderr.getvalue()
    assert stdout.getvalue() == ""
    assert not out.exists() and not report.exists()


# -- assign and report -----------------------------------------------------------------


def test_assign_output_is_accepted_by_xla_with_the_reported_streams(tmp_path: Path) -> None:
    out, report_path = tmp_path / "out.hlo", tmp_path / "out.json"
    result = xla_streams("assign", TP_DP, "--streams=4", "--policy=interval",
                         f"--json={report_path}", f"--output={out}")  # fmt: skip
    assert result.returncode == 0, err(result)
    AssignmentReport.from_json(report_path.read_text(), report_path.name)  # follows the schema
    report = json.loads(report_path.read_text())
    assert len({c["stream"] for c in report["collectives"]} - {None}) >= 2
    # The table went to stdout: one row per collective.
    table = result.stdout.decode()
    for c in report["collectives"]:
        assert re.search(rf"^{c['kind']} +{re.escape(c['start'])} ", table, re.M)

    from jaxlib import _hlo

    printed = _hlo.hlo_module_from_text(xla_parsable(out.read_text())).to_string()
    annotation = {}
    for line in printed.splitlines():
        m = re.match(r"\s*(?:ROOT )?%(\S+) = ", line)
        if m:
            found = re.search(r'_xla_stream_annotation="(\d+)"', line)
            annotation[m.group(1)] = int(found.group(1)) if found else None
    for c in report["collectives"]:
        assert annotation[c["start"]] == c["stream"], c["start"]
        assert annotation[c["done"]] == c["stream"], c["done"]
    marked = {name for name, stream in annotation.items() if stream is not None}
    expected = {
        c[k] for c in report["collectives"] if c["stream"] is not None for k in ("start", "done")
    }
    assert marked == expected


@pytest.mark.slow
def test_assign_stdin_stdout_and_quiet() -> None:
    source = TP_DP.read_bytes()
    # Module to stdout: the table moves to stderr.
    result = xla_streams("assign", "-", "-o", "-", stdin=source)
    assert result.returncode == 0, err(result)
    assert result.stdout.startswith(b"HloModule ") and b"_xla_stream_annotation" in result.stdout
    assert "async pairs" in err(result)
    # JSON to stdout, no table.
    result = xla_streams("assign", "-", "--json=-", "--quiet", stdin=source)
    assert result.returncode == 0, err(result)
    AssignmentReport.from_json(result.stdout.decode(), "stdout")  # follows the schema
    assert result.stderr == b""
    # --quiet and no outputs: nothing at all.
    result = xla_streams("assign", TP_DP, "-q")
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")


@pytest.mark.slow
def test_report_prints_the_table_and_leaves_the_module_alone(tmp_path: Path) -> None:
    copy = tmp_path / "in.hlo"
    shutil.copy(TP_DP, copy)
    result = xla_streams("report", copy, "--streams=1", "--policy=round-robin", cwd=tmp_path)
    assert result.returncode == 0, err(result)
    table = result.stdout.decode()
    assert "HloModule" not in table and "policy round-robin" in table and "of 1 streams" in table
    assert copy.read_bytes() == TP_DP.read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["in.hlo"]
    with_json = xla_streams("report", copy, "--streams=1", "--policy=round-robin", "--json", "-")
    report = json.loads(with_json.stdout)
    assert (report["streams"], report["policy"]) == (1, "round-robin")
    assert err(with_json) == table  # the table moved to stderr, unchanged


@pytest.mark.slow
def test_report_and_assign_agree(tmp_path: Path) -> None:
    a, r = tmp_path / "a.json", tmp_path / "r.json"
    assert xla_streams("assign", TEXT, "--json", a, "-q").returncode == 0
    assert xla_streams("report", TEXT, "--json", r).returncode == 0
    assert a.read_bytes() == r.read_bytes()


def test_installed_console_script(tmp_path: Path) -> None:
    script = shutil.which("xla-streams", path=str(Path(sys.executable).parent))
    assert script, "the xla-streams console script is not installed beside this Python"
    out = tmp_path / "r.json"
    result = subprocess.run([script, "report", str(TP_DP), "--json", str(out)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    AssignmentReport.from_json(out.read_text(), out.name)  # follows the schema
    assert subprocess.run([script, "opt", "-p", ""], capture_output=True).returncode == 2


# -- no JAX, no absl: the offline commands start in milliseconds ------------------------

# What an offline command must not import: JAX (seconds), absl.flags (20-30 ms, more
# than the rest of the start-up; tools/bench.py's opt-net and assign-net measure it).
HEAVY = ("jax", "jaxlib", "absl")
NO_JAX = textwrap.dedent(
    f"""
    import sys
    from xla_streams import cli
    code = cli.main(sys.argv[1:])
    assert code == 0, code
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
    assert not loaded, loaded
    """
)


@pytest.mark.parametrize(
    "args",
    [["opt", str(TEXT), "-p", PIPELINE, "-o", "{out}"],
     ["assign", str(TEXT), "--json", "{out}", "-o", "{out}.hlo"],
     ["report", str(TEXT)],
     ["--help"]],
    ids=["opt", "assign", "report", "help"],
)  # fmt: skip
def test_offline_commands_do_not_import_jax(args: list[str], tmp_path: Path) -> None:
    argv = [a.replace("{out}", str(tmp_path / "out")) for a in args]
    result = subprocess.run([sys.executable, "-c", NO_JAX, *argv], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_import_time_has_no_jax() -> None:
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "xla_streams", "--help"],
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0
    modules = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()]
    assert "xla_streams.pipeline" in modules
    assert not [m for m in modules if m.split(".")[0] in HEAVY]


# What `opt` with no pass (parse, check, print) must not import either: each of these is
# a share of its run on a large module (tools/bench.py's opt-net). dataclasses loads
# inspect (ast, dis, tokenize); the analyses load dataclasses; textwrap is for help.
NOT_FOR_PARSE_AND_PRINT = ("dataclasses", "inspect", "textwrap", "math", "xla_streams.streams")
PARSE_AND_PRINT = textwrap.dedent(
    f"""
    import sys
    from xla_streams import cli
    code = cli.main(sys.argv[1:])
    assert code == 0, code
    loaded = sorted(m for m in {NOT_FOR_PARSE_AND_PRINT!r} if m in sys.modules)
    assert not loaded, loaded
    """
)


def test_opt_without_passes_loads_no_dataclasses_and_no_analysis(tmp_path: Path) -> None:
    argv = ["opt", str(TEXT), "-p", "", "-o", str(tmp_path / "out.hlo")]
    result = subprocess.run([sys.executable, "-c", PARSE_AND_PRINT, *argv],
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out.hlo").read_text() == TEXT.read_text()


GC_AFTER_RUN = textwrap.dedent(
    """
    import gc, sys
    sys.argv = ["xla-streams", *sys.argv[1:]]
    from xla_streams.__main__ import main
    try:
        main()
    except SystemExit:
        pass
    sys.stderr.write(f"collector on: {gc.isenabled()}\\n")
    """
)


@pytest.mark.parametrize(
    ("args", "collecting"),
    [(["opt", "--help"], False), (["tune", "--help"], True), (["demo", "--help"], True)],
    ids=["text-command", "tune", "demo"],
)  # fmt: skip
def test_the_console_script_collects_garbage_only_for_commands_that_import_jax(
    args: list[str], collecting: bool
) -> None:
    # The script imports the command line with the collector off (__main__.py); a
    # command that loads JAX and compiles must get it back, a text command runs without.
    result = subprocess.run([sys.executable, "-c", GC_AFTER_RUN, *args],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert f"collector on: {collecting}" in result.stderr, result.stderr


# -- demo dispatch ---------------------------------------------------------------------


def test_demo_takes_its_flags_like_every_command(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[object, ...]] = []
    fake = ModuleType("xla_streams.cli.demo")
    fake.Unavailable = RuntimeError  # type: ignore[attr-defined]
    fake.run = lambda *args, **kwargs: calls.append((*args, kwargs["mode"]))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "xla_streams.cli.demo", fake)
    monkeypatch.setattr(cli, "demo", fake, raising=False)  # where an import left the real one
    assert cli.main(["demo", "--streams=2", "--mode=aot"], stdout=io.StringIO()) == 0
    assert calls == [("transformer_step", 2, "interval", "aot")]
    stderr = io.StringIO()
    assert cli.main(["demo", "--streams=99"], stderr=stderr) == 2
    assert "integer from 1 to 64" in stderr.getvalue()


def test_demo_listed_and_explained_without_importing_its_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The demo's module imports JAX: only running the command may import it."""
    monkeypatch.setitem(sys.modules, "xla_streams.cli.demo", None)  # importing it fails
    monkeypatch.delattr(cli, "demo", raising=False)  # and nothing imported it before
    listing, help_text = io.StringIO(), io.StringIO()
    assert cli.main(["--help"], stdout=listing) == 0
    assert re.search(r"^  demo +Compile the demo transformer step", listing.getvalue(), re.M)
    assert cli.main(["demo", "--help"], stdout=help_text) == 0
    assert help_text.getvalue().startswith("usage: xla-streams demo [--program=")
    assert "--mode=auto|gpu|aot" in help_text.getvalue()


# -- the wrong input, named --------------------------------------------------------------

WRONG_INPUTS = [
    # f.lower(...).as_text(dialect="hlo"): XLA's parser reads it, but nothing is scheduled.
    ("unoptimized.hlo", TIED.replace(", is_scheduled=true", ""),
     "1:1: error: this module is not scheduled", "compile().as_text()"),
    # f.lower(...).as_text(): StableHLO.
    ("stablehlo.mlir", 'module @jit_f attributes {mhlo.num_partitions = 1 : i32} {\n}\n',
     "1:1: error: expected 'HloModule <name>': this is StableHLO", "compile().as_text()"),
    # A misspelled group attribute would silently turn the groups into replica groups.
    ("typo.hlo", TIED.replace("channel_id=1,", "chanel_id=1,"),
     "11:",  "unknown attribute 'chanel_id': did you mean 'channel_id'?"),
]  # fmt: skip


@pytest.mark.parametrize("command", ["report", "simulate"])
@pytest.mark.parametrize(("name", "text", "where", "what"), WRONG_INPUTS, ids=lambda v: str(v)[:12])
def test_the_wrong_input_is_named_with_what_to_give_instead(
    tmp_path: Path, command: str, name: str, text: str, where: str, what: str
) -> None:
    """simulate too: an unscheduled module has no overlap to predict."""
    path = tmp_path / name
    path.write_text(text)
    assert_user_error(xla_streams(command, path), f"{path}:{where}", what)


def test_binary_input_is_named(tmp_path: Path) -> None:
    gz = tmp_path / "step.hlo.gz"
    gz.write_bytes(gzip.compress(TIED.encode()))
    assert_user_error(xla_streams("report", gz), "is not HLO text (gzip-compressed data", "gunzip")


@pytest.mark.slow
def test_negations_are_accepted_as_people_type_them() -> None:
    result = xla_streams("simulate", TP_DP, "--streams=1,2", "--no-progress")
    assert result.returncode == 0, err(result)
    assert_user_error(xla_streams("simulate", TP_DP, "--no-such-flag"), "no-such-flag")


def test_version() -> None:
    for argv in (["--version"], ["version"]):
        result = xla_streams(*argv)
        assert result.returncode == 0 and result.stdout.decode().startswith("xla-streams 0.")


# -- inputs: located byte errors, a size cap, no traceback ------------------------------


def test_a_byte_that_is_not_utf8_is_located(tmp_path: Path) -> None:
    bad = tmp_path / "bad.hlo"
    text = TIED.encode().replace(b"exponential", b"expon\xb2ntial")
    bad.write_bytes(text)
    result = xla_streams("assign", bad)
    assert_user_error(result, f"{bad}:13:25: error: ", "is not HLO text", "byte 0xb2 is not UTF-8")
    assert "expon" in err(result).split("\n")[1]  # the line is shown, with a caret under it


def test_a_byte_that_is_not_utf8_on_stdin_is_located() -> None:
    data = TIED.encode().replace(b"HloModule tied", b"HloModule t\xffed")
    assert_user_error(xla_streams("report", "-", stdin=data), "<stdin>:1:12: error: ", "0xff")


def test_a_nul_byte_is_located(tmp_path: Path) -> None:
    bad = tmp_path / "nul.hlo"
    bad.write_bytes(TIED.encode().replace(b"%b = ", b"%b\0 = "))
    assert_user_error(xla_streams("assign", bad), f"{bad}:12:5: error: ", "NUL")


def test_dev_zero_as_input_is_refused_at_once() -> None:
    """Read in chunks and stopped at the first NUL: no MemoryError, no traceback."""
    import resource

    def limit_memory() -> None:  # a run-away read fails fast instead of eating the machine
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    result = subprocess.run(
        [sys.executable, "-m", "xla_streams", "assign", "/dev/zero"],
        capture_output=True, timeout=60, preexec_fn=limit_memory,
    )  # fmt: skip
    assert_user_error(result, "/dev/zero:1:1: error: ", "is not HLO text")


def test_a_file_larger_than_the_cap_is_refused_from_its_size(tmp_path: Path) -> None:
    huge = tmp_path / "huge.hlo"
    with huge.open("wb") as f:  # sparse: 2 GiB that take no disk
        f.truncate(cli.inputs.MAX_INPUT_BYTES + 1)
    start = __import__("time").perf_counter()
    result = xla_streams("assign", huge)
    assert __import__("time").perf_counter() - start < 30
    assert_user_error(
        result, f"'{huge}' is {cli.inputs.MAX_INPUT_BYTES + 1} bytes", "MAX_INPUT_BYTES"
    )


def test_standard_input_larger_than_the_cap_is_refused_while_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cli.inputs, "MAX_INPUT_BYTES", 1000)
    monkeypatch.setattr(cli.inputs, "_READ_CHUNK", 64)
    for stdin in (
        io.TextIOWrapper(io.BytesIO(b"x" * 5000)),  # bytes underneath, as sys.stdin
        io.StringIO("x" * 5000),  # already text
    ):
        stderr = io.StringIO()
        code = cli.main(["assign", "-"], stdin=stdin, stdout=io.StringIO(), stderr=stderr)
        assert code == 2
        assert "standard input holds more than the 1000 bytes" in stderr.getvalue()
    stderr = io.StringIO()
    small = io.TextIOWrapper(io.BytesIO(TIED.encode()))
    monkeypatch.setattr(cli.inputs, "MAX_INPUT_BYTES", len(TIED))
    assert cli.main(["assign", "-"], stdin=small, stdout=io.StringIO(), stderr=stderr) == 0


# -- hostile values and modules, through the command line ------------------------------


@pytest.mark.parametrize("value", ["\u00b2", "\u0661"])
def test_a_stream_annotation_in_other_digits_is_a_located_error(tmp_path: Path, value: str) -> None:
    source = tmp_path / "pin.hlo"
    text = TIED.replace(
        "to_apply=%add\n  %b",
        f'to_apply=%add, frontend_attributes={{_xla_stream_annotation="{value}"}}\n  %b',
    )
    source.write_text(text)
    result = xla_streams("assign", source)
    assert_user_error(result, f"{source}:11:", "is not a stream number")
    assert "failed" not in err(result) and "ValueError" not in err(result)


def test_a_module_xla_would_reject_is_rejected_with_its_place(tmp_path: Path) -> None:
    source = tmp_path / "cycle.hlo"
    source.write_text(TIED.replace("exponential(%p)", "exponential(%e)"))
    result = xla_streams("assign", source, "--json", tmp_path / "out.json")
    assert_user_error(result, f"{source}:13:32: error: operand '%e' uses itself")
    assert not (tmp_path / "out.json").exists()


@pytest.mark.slow
def test_two_collectives_over_65536_devices_are_answered_in_a_second_or_so(tmp_path: Path) -> None:
    source = tmp_path / "wide.hlo"
    source.write_text(
        TIED.replace("num_partitions=4", "num_partitions=65536")
        .replace("replica_groups={{0,1,2,3}}", "replica_groups=[32768,2]<=[65536]", 1)
        .replace("replica_groups={{0,1,2,3}}", "replica_groups=[32768,2]<=[2,32768]T(1,0)")
    )
    start = __import__("time").perf_counter()
    result = xla_streams("assign", source, "--json", tmp_path / "out.json")
    elapsed = __import__("time").perf_counter() - start
    assert result.returncode == 0, err(result)
    assert elapsed < 10, f"{elapsed:.1f} s (a process, start-up included)"
    report = json.loads((tmp_path / "out.json").read_text())
    streams = {p["start"]: p["stream"] for p in report["collectives"]}
    assert streams["a"] != streams["b"]  # 32,768 groups of two each: no two devices shared
