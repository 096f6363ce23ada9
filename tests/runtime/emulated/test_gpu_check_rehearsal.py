"""tools/gpu_check.py --emulated: the GPU check's children started as on a GPU, on the
emulated CUDA runtime. The conformance check runs xsim-conformance on the stand-ins;
the ffi check runs its correctness and error parts on XLA:CPU device 0, which drives
the unchanged CUDA backend through the forwarding handlers (on_cpu.start()): every
kind and element type equal to XLA's, both provoked errors naming their op, nothing
reported by the emulator. The timed parts (events, overhead) need a GPU and say so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from xla_streams.runtime import abi, emulator

REPO = Path(__file__).resolve().parents[3]


def test_the_gpu_checks_rehearsal_passes(built: emulator.Built, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gpu_check.py"), str(out), "--emulated"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["emulated"] is True and report["dry_run"] is False
    checks = {c["name"]: c for c in report["checks"]}
    assert {n for n, c in checks.items() if c["passed"] is not None} == {"conformance", "ffi"}
    for name, check in checks.items():
        if name not in ("conformance", "ffi"):
            assert check["figures"] == {"emulated": "not run: needs a GPU"}

    conformance = checks["conformance"]
    assert conformance["passed"] is True, conformance
    assert conformance["figures"]["devices"] == 8 and conformance["figures"]["skipped"] == []
    assert all(e["passed"] for e in conformance["figures"]["expectations"])

    ffi = checks["ffi"]
    assert ffi["passed"] is True, ffi
    cases = ffi["figures"]["kinds"]["cases"]
    assert len(cases) == len(abi.FFI_KINDS) * len(abi.ELEMENT_TYPES["cuda"])
    assert all(v.startswith("equal to") for v in cases.values()), cases
    errors = ffi["figures"]["errors"]
    assert "'gpu_check.bad_shape'" in errors["bad_shape"]
    assert "'gpu_check.lonely'" in errors["lonely"] and "timed out" in errors["lonely"]
    assert ffi["figures"]["emulator_reports"] == []
    assert "events" not in ffi["figures"] and "overhead" not in ffi["figures"]
    assert ffi["figures"]["not rehearsed"] == "events, overhead: timings, which need a GPU"
