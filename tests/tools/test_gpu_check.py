"""tools/gpu_check.py without a GPU: its dry run, its refusal to run without one, and
the parts of it that read files (profiler traces, thunk dumps, XLA's log), so that the
GPU's few minutes go to measuring, not to debugging the script."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import profiler_trace

from xla_streams.report import AssignmentReport, ReportedCollective, ReportSummary
from xla_streams.runtime import abi
from xla_streams.simulate.calibration import load_calibration
from xla_streams.simulate.profiler_trace import gpu_kernels

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "gpu_check.py"


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


check = _script()


@pytest.mark.slow
def test_dry_run_plans_and_runs_what_needs_no_gpu(tmp_path: Path) -> None:
    begin = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "out"), "--dry-run"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert time.monotonic() - begin < 20
    for step in ("build", "native K=2 and K=4", "conformance", "ffi", "calibrate", "overhead"):
        assert f"--child {step}" in result.stdout
    assert "compute-sanitizer --tool {racecheck,synccheck,memcheck}" in result.stdout
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert report["schema"] == "xla_streams.gpu_check.v1" and report["dry_run"] is True
    assert report["emulated"] is False
    assert list(report) == ["schema"] + [f.name for f in dataclasses.fields(check.GpuCheckReport)]
    assert "python" in report["versions"] and "jax" in report["versions"]
    checks = {c["name"]: c for c in report["checks"]}
    assert list(checks) == [
        "build", "conformance", "native", "ffi",
        "sanitizer_racecheck", "sanitizer_synccheck", "sanitizer_memcheck",
        "calibration", "plugin_overhead",
    ]  # fmt: skip
    for record in checks.values():
        assert list(record) == [f.name for f in dataclasses.fields(check.Record)]
        assert record["proves"] and record["does_not_prove"]
    # The GPU checks did not run; the calibration path ran end to end on a fixture.
    assert {c["passed"] for n, c in checks.items() if n != "calibration"} == {None}
    calibration = checks["calibration"]
    assert calibration["passed"] is True, calibration
    assert calibration["figures"]["ratios"] == check.DRY_RUN_RATIOS
    written = load_calibration(tmp_path / "out" / "calibration.json")
    assert written.ratios == {"h200": check.DRY_RUN_RATIOS}
    assert written.provenance["tool"] == "tools/gpu_check.py --dry-run"


# The dry run in a process of its own: which of jax, jaxlib and numpy it imported.
DRY_RUN_IMPORTS = """
import runpy, sys
sys.argv = [{script!r}, {out!r}, "--dry-run"]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
print(sorted({{m.split(".")[0] for m in sys.modules}} & {{"jax", "jaxlib", "numpy"}}))
"""


@pytest.mark.slow
def test_dry_run_imports_neither_jax_nor_numpy(tmp_path: Path) -> None:
    """The package is imported at the top of the script; JAX and numpy only where a
    check that needs the GPU runs."""
    code = DRY_RUN_IMPORTS.format(script=str(SCRIPT), out=str(tmp_path / "out"))
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "[]"


def test_ffi_calls_are_the_abis() -> None:
    """The ffi check calls every kind and element type lower-to-ffi hands the CUDA
    runtime, with attributes that read back as written."""
    assert check.FFI_KINDS == abi.FFI_KINDS
    assert tuple(check.FFI_DTYPES) == abi.ELEMENT_TYPES["cuda"]
    gather = check.ffi_call_of(3, "all-gather", 1)
    assert abi.CollectiveCall.parse(gather.start_config()) == gather
    assert (gather.dimension, gather.outer, gather.groups, gather.group_sizes) == (
        0,
        (1,),
        (0,),
        (1,),
    )
    lonely = check.ffi_call_of(4, "collective-permute", 0, device_ids=(0, 0))
    assert lonely.groups == (0, 0) and lonely.start_attributes()["device_ids"] == (0, 0)


def test_sanitizer_options_this_compute_sanitizer_does_not_know_are_left_out(
    tmp_path: Path,
) -> None:
    tool, options, _ = check.SANITIZERS["sanitizer_memcheck"]
    known = "--tool\n--track-stream-ordered-races {all|use-before-alloc|...}\n--log-file"
    prefix, left_out = check.sanitizer_prefix("cs", tool, options, tmp_path, known)
    assert prefix[:3] == ("cs", "--tool", "memcheck")
    assert prefix[-2:] == ("--track-stream-ordered-races", "all") and left_out == []
    assert "--error-exitcode" in prefix and str(tmp_path / "sanitizer.%p.txt") in prefix
    prefix, left_out = check.sanitizer_prefix("cs", tool, options, tmp_path, "--tool")
    assert "--track-stream-ordered-races" not in prefix
    assert left_out == ["--track-stream-ordered-races"]


def test_a_sanitizer_report_fails_its_check(tmp_path: Path) -> None:
    """compute-sanitizer exits with --error-exitcode when its tool reported an error: the
    check fails with the report, even though the program under it ran to the end."""
    passed = {"kinds": {"passed": True, "cases": {}}}

    def judged(exit_status: int, report: str) -> Any:
        folder = tmp_path / f"exit{exit_status}"
        folder.mkdir()
        (folder / "result.json").write_text(json.dumps(passed))
        (folder / "log.txt").write_text("")
        (folder / "sanitizer.123.txt").write_text(report)
        process = subprocess.Popen(["sh", "-c", f"exit {exit_status}"])
        process.wait()
        child = check.Child("sanitizer", process, folder / "log.txt", folder / "result.json", 0)
        record = check.new_record("sanitizer_racecheck")
        check.check_sanitizer(record, child)
        return record

    clean = judged(0, "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n")
    assert clean.passed is True and clean.error is None
    assert clean.figures["summary"] == [
        "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"
    ]
    hazard = "========= Error: Race reported between Write access at foo\n"
    found = judged(check.SANITIZER_FOUND, hazard + "========= RACECHECK SUMMARY: 1 hazard\n")
    assert found.passed is False and "Race reported between Write access" in found.error


def test_without_a_gpu_nothing_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(check, "gpu_present", lambda: False)
    assert check.main([str(tmp_path / "out")]) == 2
    assert "no NVIDIA GPU here" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit) as usage:
        check.main([str(tmp_path / "out"), "--budget", "10"])
    assert usage.value.code == 2


def test_a_check_that_raises_is_recorded_not_fatal(tmp_path: Path) -> None:
    def broken(record: Any) -> None:
        record.figures["before"] = 1
        raise RuntimeError("the child died")

    record = check.run_check(check.new_record("ffi"), broken, tmp_path)
    assert record.passed is False and "the child died" in record.error
    assert record.figures == {"before": 1}
    assert "the child died" in (tmp_path / "logs" / "ffi.txt").read_text()


def test_budget_keeps_time_for_later_checks() -> None:
    budget = check.Budget(100)
    assert budget.grant(30, 50) == 30
    assert 49 < budget.grant(80, 50) <= 50
    assert budget.grant(30, 200) == 0


def _trace(on_streams: dict[str, int]) -> dict[str, Any]:
    """Two kernels on the compute stream, and ``on_streams``: instruction -> its stream."""
    on = [(tid, op, 50.0 + 10 * i, 200.0) for i, (op, tid) in enumerate(on_streams.items())]
    return profiler_trace([(7, "fusion.1", 0.0, 100.0), (7, "custom-call.2", 100.0, 300.0), *on])


def _collective(start: str, done: str, stream: int | None) -> ReportedCollective:
    """A pair of the report the plugin writes; only names and stream matter here."""
    return ReportedCollective(
        computation="main", start=start, done=done, kind="all-reduce", start_index=0,
        done_index=1, sync=stream is None, pipelined=False,
        runs_on="communication" if stream is not None else "compute", stream=stream, calls=1,
        groups=((0, 1),), bytes=4096, serialized_by=None, reassigned=None,
    )  # fmt: skip


REPORT = AssignmentReport(
    module="jit_step",
    streams=2,
    policy="interval",
    collectives=(
        _collective("all-gather-start", "all-gather-done", 0),
        _collective("all-reduce-start", "all-reduce-done", 1),
        _collective("sync", "sync.done", None),
    ),
    summary=ReportSummary(3, 2, 2, 2, 0, 0, 0, 1, 0, 0, 0, {"all-reduce": 3}, {"main": 2}),
)


def test_the_report_is_read_as_the_plugin_writes_it(tmp_path: Path) -> None:
    (tmp_path / "jit_step.0123.json").write_text(REPORT.to_json())
    assert check.load_report(tmp_path, "jit_step") == REPORT
    with pytest.raises(FileNotFoundError):
        check.load_report(tmp_path, "other")


def test_profile_placement() -> None:
    def placement(streams: dict[str, int]) -> dict[str, Any]:
        return check.profile_placement(gpu_kernels(_trace(streams))[0], REPORT)

    good = placement({"all-gather-start": 13, "all-reduce-start": 14})
    assert good["readable"] and good["passed"], good
    assert good["cuda_streams_by_report_stream"] == {"0": ["1/13"], "1": ["1/14"]}
    assert good["overlapping_pairs_on_different_streams"] == 1
    assert not placement({"all-gather-start": 13, "all-reduce-start": 13})["passed"]
    assert not placement({"all-gather-start": 7, "all-reduce-start": 14})["passed"]  # on compute
    mocked = placement({})
    assert mocked["readable"] is False and "no kernel" in mocked["why"]


def test_thunk_dump_and_debug_options(tmp_path: Path) -> None:
    (tmp_path / "module_0003.jit_step.thunk_sequence.txt").write_text(
        "002: kAsyncStart   [source | next=005 (3) ] stream=communication_stream[0], async_id=2\n"
        "013: kAsyncStart   [prev=010 (1) | next=022 (6)] stream=communication_stream[1], "
        "async_id=13\n"
    )
    (tmp_path / "module_0003.jit_step.thunk_metadata.txt").write_text(
        'thunk_metadata {\n  thunk_info {\n    profile_annotation: "all-gather-start"\n'
        "    thunk_id: 2\n  }\n}\n"
        'thunk_metadata {\n  thunk_info {\n    profile_annotation: "all-reduce-start"\n'
        "    thunk_id: 13\n  }\n}\n"
    )
    ok, why = check.check_thunks(str(tmp_path), REPORT)
    assert ok and "communication_stream[0, 1]" in why
    first = dataclasses.replace(REPORT.collectives[0], stream=1)
    swapped = dataclasses.replace(REPORT, collectives=(first, *REPORT.collectives[1:]))
    assert not check.check_thunks(str(tmp_path), swapped)[0]
    assert not check.check_thunks(str(tmp_path / "missing"), REPORT)[0]
    (tmp_path / "module_0003.jit_step.debug_options").write_text(
        "xla_gpu_experimental_parallel_collective_overlap_limit: 2\n"
        "xla_gpu_executable_num_communication_streams: 2\n"
    )
    assert check.check_debug_options(str(tmp_path), "jit_step", 2)[0]
    assert not check.check_debug_options(str(tmp_path), "jit_step", 4)[0]


def test_xlas_runtime_log() -> None:
    line = (
        "I0830 12:00:00.1 77 async_thunk.cc:70] [{d}] Execute async for `{n}`: "
        "stream_id={k}, stream={p}"
    )
    log = "\n".join(
        line.format(d=d, n=n, k=k, p=f"0x{d}{k}0")
        for d in (0, 1)
        for n, k in (("all-gather-start", 0), ("all-reduce-start", 1), ("sync", 0))
    )
    ok, why = check.check_runtime_log(log, REPORT)
    assert ok, why
    wrong = log.replace("`all-reduce-start`: stream_id=1", "`all-reduce-start`: stream_id=0")
    assert not check.check_runtime_log(wrong, REPORT)[0]
    one_stream = log.replace("stream=0x010", "stream=0x000")
    assert not check.check_runtime_log(one_stream, REPORT)[0]
    assert not check.check_runtime_log("nothing ran", REPORT)[0]


def test_the_hook_reads_the_gpu_as_jax_lists_it() -> None:
    def judged(kinds: list[str], seen: str | None) -> bool:
        ok: bool = check.check_fit_on_gpu({"device_kinds": kinds, "hook": seen})[0]
        return ok

    assert judged(["NVIDIA H100 80GB HBM3"], "h100")
    assert not judged(["NVIDIA H100 80GB HBM3"], None)  # JAX's backends not read
    assert judged(["NVIDIA H100 PCIe"], None)  # no target: K used as given
    assert judged(["NVIDIA B200", "NVIDIA H200"], "h200")
    assert not judged(["NVIDIA B200", "NVIDIA H200"], "b200")
    assert not check.check_fit_on_gpu({})[0]  # the child recorded nothing
