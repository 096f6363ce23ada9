"""Native mode, proven without a GPU: XLA puts each collective on the stream we assign.

Runs ``scripts/prove_native_streams.py`` (deviceless 8 x H100 compiles of the
demo's transformer step; see its docstring for the method) and the demo. Both
need the ``gpu-aot`` extra (jax[cuda12]); without it they are skipped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "prove_native_streams.py"


def needs_gpu_aot(test: Any) -> Any:
    """Deviceless GPU compiles need the gpu-aot extra, which `make test` installs."""
    assert importlib.util.find_spec("jax_cuda12_plugin") is not None, (
        "install the gpu-aot extra: pip install -e '.[test,gpu-aot]'"
    )
    return test


def _load_script(path: Path = SCRIPT) -> Any:
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # gpu_check_native imports prove_native_streams
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _env() -> dict[str, str]:
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("XLA_STREAMS_", "XLA_FLAGS"))
    }
    environ["JAX_PLATFORMS"] = "cpu"
    return environ


def test_thunk_dump_reading() -> None:
    prove = _load_script()
    sequence = (
        "002: kAsyncStart   [source | next=005 (3) ] stream=communication_stream[0], async_id=2\n"
        "    001: kAllGather [source | sink] kAllGather\n"
        "007: kWhile        [prev=006 (1)  | next=035 (1) ]\n"
        "    013: kAsyncStart         [prev=010 (1) | next=022 (6)] "
        "stream=communication_stream[3], async_id=13\n"
        "    021: kAsyncDone          [source       | sink        ] async_id=13\n"
    )
    metadata = (
        'thunk_metadata {\n  thunk_info {\n    profile_annotation: "all-gather-start"\n'
        '    thunk_id: 2\n  }\n  thunk_kind: "kAsyncStart"\n}\n'
        'thunk_metadata {\n  thunk_info {\n    profile_annotation: "reduce-scatter-start.1"\n'
        '    thunk_id: 13\n  }\n  thunk_kind: "kAsyncStart"\n}\n'
    )
    streams = prove.thunk_streams(sequence, metadata)
    assert streams == {"all-gather-start": 0, "reduce-scatter-start.1": 3}
    text = '  %ar = f32[8]{0} all-reduce-start(%p), frontend_attributes={_xla_streams_id="3,4"}'
    assert prove.tags_of("HloModule m\n" + text) == {"ar": (3, 4)}


def test_gpu_check_reads_xlas_runtime_log() -> None:
    check = _load_script(REPO / "scripts" / "gpu_check_native.py")
    report = {
        "collectives": [
            {"start": "ag", "stream": 0},
            {"start": "ar", "stream": 1},
            {"start": "sync", "stream": None},
        ]
    }
    line = "I1129 12:00:00.1 77 async_thunk.cc:70] [{d}] Execute async for `{n}`: stream_id={k}, stream={p}"
    log = "\n".join(
        line.format(d=d, n=n, k=k, p=f"0x{d}{k}0")
        for d in (0, 1)
        for n, k in (("ag", 0), ("ar", 1), ("sync", 0))
    )
    ok, why = check.check_runtime_log(log, report)
    assert ok, why
    wrong = log.replace("`ar`: stream_id=1", "`ar`: stream_id=0")
    assert not check.check_runtime_log(wrong, report)[0]
    one_stream = log.replace("stream=0x010", "stream=0x000")
    assert not check.check_runtime_log(one_stream, report)[0]
    assert not check.check_runtime_log("nothing ran", report)[0]


@needs_gpu_aot
def test_xla_runs_each_collective_on_the_assigned_stream(tmp_path: Path) -> None:
    out = tmp_path / "proof.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "dumps"), "--json", str(out)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    proof = json.loads(out.read_text())
    assert proof["ok"] and proof["program"] == "transformer_step"
    assert set(proof["checks"].values()) == {"ok"}, proof["checks"]
    done, total = proof["coverage"]
    assert done == total > 0  # every pair the report puts on a stream was checked
    rows = proof["rows"]
    on_streams = [r for r in rows if r["stream"] is not None]
    assert {r["thunk"] for r in on_streams} == {r["stream"] for r in on_streams}
    assert len({r["stream"] for r in on_streams}) >= 2  # the collectives really are spread
    assert {r["baseline"] for r in rows} == {0}  # XLA alone: one stream
    assert all(r["thunk"] == r["stream"] for r in on_streams)
    report = json.loads(Path(proof["report"]).read_text())
    by_start = {c["start"]: c["stream"] for c in report["collectives"]}
    assert {r["start"]: r["stream"] for r in rows} == by_start
    assert "communication_stream[1]" in result.stdout
    # The GPU check's file checks pass on the annotated build and fail without annotations.
    check = _load_script(REPO / "scripts" / "gpu_check_native.py")
    dumps = tmp_path / "dumps"
    assert check.check_thunks(str(dumps / "annotated"), report)[0]
    assert not check.check_thunks(str(dumps / "tagged"), report)[0]
    assert check.check_debug_options(str(dumps / "annotated"), "jit_step", 4)[0]
    assert not check.check_debug_options(str(dumps / "annotated"), "jit_step", 8)[0]


@needs_gpu_aot
def test_demo_without_a_gpu(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    result = subprocess.run(
        [sys.executable, "-m", "xla_streams.cli", "demo", "--report-dir", str(reports)],
        env={k: v for k, v in _env().items() if k != "JAX_PLATFORMS"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    out = result.stdout
    assert "compiled for 8 x H100 without a GPU" in out
    assert "module jit_step: 48 async pairs" in out
    (json_path,) = reports.glob("jit_step.*.json")
    assert f"report (JSON, schema xla_streams.assignment.v1): {json_path}" in out
    report = json.loads(json_path.read_text())
    assert report["streams"] == 4 and report["summary"]["streams_used"] >= 2
    assert json_path.with_suffix(".txt").read_text() in out
