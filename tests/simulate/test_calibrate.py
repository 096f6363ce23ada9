"""A calibration from a profiler trace of a real run: the trace's GPU kernels per HLO
instruction (leaving out the lines that repeat them), the ratios per kernel class
recovered from measurements made to differ from the model by known factors, and
``xla-streams calibrate``, which writes the file ``simulate --calibration`` reads."""

from __future__ import annotations

import copy
import gzip
import io
import json
from pathlib import Path

import pytest
from conftest import profiler_trace

from xla_streams import cli
from xla_streams.hlo import parse_module
from xla_streams.simulate import Simulator, get_target
from xla_streams.simulate.calibration import calibrate, load_calibration
from xla_streams.simulate.profiler_trace import (
    find_trace,
    gpu_kernels,
    load_trace,
    seconds_by_instruction,
)

REPO = Path(__file__).resolve().parents[2]
MODULE = REPO / "hlo_fixtures" / "fsdp_unrolled.limit4.text.hlo"
RATIOS = {"matmul": 2.0, "memory": 0.5}  # measured / predicted, made up


def test_kernels_per_instruction_only_from_the_gpus_cuda_streams() -> None:
    trace = profiler_trace(
        [(7, "fusion.1", 0, 100), (7, "custom-call.2", 100, 300), (13, "all-gather-start", 50, 200)]
    )
    kernels, found = gpu_kernels(trace)
    assert found["gpu_processes"] == ["/device:GPU:0"]
    assert found["stream_lines"] == ["Stream #13", "Stream #14", "Stream #7(Compute)"]
    # Not the derived line's copies, not the host's launches.
    assert sorted(k.hlo_op for k in kernels) == ["all-gather-start", "custom-call.2", "fusion.1"]
    assert seconds_by_instruction(kernels, steps=2)["custom-call.2"] == pytest.approx(150e-6)


def test_trace_files_are_found_where_jax_writes_them(tmp_path: Path) -> None:
    run = tmp_path / "plugins" / "profile" / "2026_08_30_12_00_00"
    run.mkdir(parents=True)
    with pytest.raises(FileNotFoundError):
        find_trace(tmp_path)
    with gzip.open(run / "host.trace.json.gz", "wt") as f:
        json.dump(profiler_trace([]), f)
    assert find_trace(tmp_path) == run / "host.trace.json.gz"
    assert load_trace(find_trace(tmp_path))["traceEvents"]
    (tmp_path / "other.json").write_text('{"displayTimeUnit": "ns"}')
    with pytest.raises(ValueError, match="no list of traceEvents"):
        load_trace(tmp_path / "other.json")


def _measured(steps: int) -> list[tuple[int, str, float, float]]:
    """Every compute kernel of MODULE but the first, at RATIOS times the model, ``steps``
    times over, as kernels on the compute stream (tid, op, start, duration in us)."""
    kernels = Simulator(parse_module(MODULE.read_text()), get_target("h200")).kernels()
    chosen = [
        (name, seconds * RATIOS[kind])
        for name, (kind, seconds) in sorted(kernels.items())[1:]
        if kind in RATIOS
    ]
    return [
        (7, name, float(step), seconds * 1e6) for step in range(steps) for name, seconds in chosen
    ]


def test_calibrate_recovers_the_ratios_measured() -> None:
    kernels, _ = gpu_kernels(profiler_trace(_measured(1)))
    measured = seconds_by_instruction(kernels, 1)
    calibration, figures = calibrate(MODULE.read_text(), measured, 1e-3, {"gpu": "test"}, "h200")
    assert calibration.ratios == {"h200": RATIOS}
    assert calibration.provenance == {"gpu": "test"}
    step = figures["step"]
    assert step["measured_ms"] == 1.0
    assert step["calibrated_compute_ms"] != step["predicted_compute_ms"]
    assert figures["instructions_measured"] == len(measured)


def _calibrate(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["calibrate", *argv], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_the_command_writes_the_file_simulate_reads(tmp_path: Path) -> None:
    run = tmp_path / "profile" / "plugins" / "profile" / "run1"
    run.mkdir(parents=True)
    with gzip.open(run / "perfetto_trace.json.gz", "wt") as f:
        json.dump(profiler_trace(_measured(3)), f)
    written = tmp_path / "calibration.json"
    code, out, err = _calibrate(
        str(MODULE), f"--trace={tmp_path / 'profile'}", "--steps=3", "--target=h200",
        "--gpu=NVIDIA H200", f"--json={written}",
    )  # fmt: skip
    assert code == 0, err
    assert "on h200:" in out and "compute of a step:" in out
    assert "matmul" in out and "2.0000" in out and "0.5000" in out
    calibration = load_calibration(written)
    assert calibration.ratios == {"h200": RATIOS}
    assert calibration.provenance["gpu"] == "NVIDIA H200"
    assert calibration.provenance["tool"] == "xla-streams calibrate"
    simulated = io.StringIO()
    assert cli.main(
        ["simulate", str(MODULE), "--target=h200", f"--calibration={written}", "--streams=1"],
        stdout=simulated,
    ) == 0  # fmt: skip


def test_a_trace_of_something_else_is_refused_with_what_it_holds(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(profiler_trace([(7, "fusion.999", 0, 10)])))
    code, out, err = _calibrate(str(MODULE), f"--trace={trace}", f"--json={tmp_path / 'c.json'}")
    assert code == 2 and out == ""
    assert "measured no instruction of module jit_step" in err
    assert "1 kernel(s) with an hlo_op" in err and "/device:GPU:0" in err
    assert not (tmp_path / "c.json").exists()
    (tmp_path / "broken.json").write_text("{")
    code, _, err = _calibrate(str(MODULE), f"--trace={tmp_path / 'broken.json'}")
    assert code == 2 and "--trace: cannot read" in err
    code, _, err = _calibrate(str(MODULE))
    assert code == 2 and "missing --trace" in err


def test_events_the_reader_cannot_use_are_passed_over_and_a_bad_kernel_is_named() -> None:
    trace = profiler_trace([(7, "fusion.1", 0.0, 10.0), (13, "fusion.2", 5.0, 20.0)])
    events = trace["traceEvents"]
    # Metadata and other events of shapes JAX never writes: not a GPU, not a stream.
    events += [
        7, None, [], {"name": "process_name", "pid": [1], "args": {"name": "/device:GPU:1"}},
        {"name": "thread_name", "pid": 1, "tid": {"x": 1}, "args": {"name": "Stream #9"}},
        {"name": "process_name", "pid": 2, "args": ["/device:GPU:2"]},
        {"ph": "X", "pid": 1, "tid": 7, "args": "hlo_op"},
        {"ph": "X", "pid": [1], "tid": 7, "args": {"hlo_op": "fusion.3"}},
    ]  # fmt: skip
    kernels, found = gpu_kernels(trace)
    assert sorted((k.hlo_op, k.duration) for k in kernels) == [
        ("fusion.1", 10.0),
        ("fusion.2", 20.0),
    ]
    assert found["gpu_processes"] == ["/device:GPU:0"]
    # A kernel the calibration would read, with a time that is no number, is named.
    for ts, dur in ((0.0, "10"), (float("nan"), 1.0), (0.0, -1.0), (True, 1.0), (10**400, 1.0)):
        broken = copy.deepcopy(trace)
        broken["traceEvents"].append(
            {"ph": "X", "pid": 1, "tid": 7, "ts": ts, "dur": dur, "args": {"hlo_op": "f"}}
        )
        index = len(broken["traceEvents"]) - 1
        with pytest.raises(ValueError, match=rf"traceEvents\[{index}\]: a kernel needs"):
            gpu_kernels(broken)


def test_a_cut_gzip_or_a_deep_json_is_refused(tmp_path: Path) -> None:
    whole = gzip.compress(json.dumps(profiler_trace([(7, "fusion.1", 0, 10)])).encode())
    cut = tmp_path / "perfetto_trace.json.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    code, _, err = _calibrate(str(MODULE), f"--trace={cut}")
    assert code == 2 and "it ends early" in err
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    with pytest.raises(ValueError, match="nested too deeply"):
        load_trace(deep)
