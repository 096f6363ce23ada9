"""Native mode, proven without a GPU: XLA runs each collective on the stream we assign.

Runs ``tools/prove_native_streams.py`` (deviceless compiles for 8 H100s through
the real plugin hook; see its docstring for the method) on three embedded
programs, which together put all five async kinds on streams other than 0, and
the demo. They need the ``gpu-aot`` extra, which ``make test`` installs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from xla_streams import jax_compat

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "prove_native_streams.py"
assert jax_compat.cuda_plugin_module() is not None, (
    "install the gpu-aot extra: pip install -e '.[test,gpu-aot]'"
)


def _env() -> dict[str, str]:
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("XLA_STREAMS_", "XLA_FLAGS"))
    }
    environ["JAX_PLATFORMS"] = "cpu"
    return environ


def _prove(tmp_path: Path, program: str, policy: str, *extra: str) -> dict[str, object]:
    out = tmp_path / f"{program}.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--program", program, "--policy", policy,
         "--out", str(tmp_path / program), "--json", str(out), *extra],
        env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    proof: dict[str, object] = json.loads(out.read_text())
    return proof


def test_xla_runs_every_async_kind_on_the_assigned_stream(tmp_path: Path) -> None:
    off_stream_0: set[str] = set()
    for program, policy in (
        ("transformer_step", "interval"),
        ("moe_all_to_all", "round-robin"),  # round-robin: consecutive units on other streams
        ("ppermute_pipeline", "round-robin"),
    ):
        proof = _prove(tmp_path, program, policy)
        assert proof["ok"], proof["checks"]
        rows = proof["rows"]
        assert isinstance(rows, list)
        on_streams = [r for r in rows if r["stream"] is not None]
        assert on_streams and all(r["thunk"] == r["stream"] for r in on_streams)
        assert all(r["plain"] == 0 for r in on_streams)  # XLA alone: one stream
        # What the report puts on the compute stream has no async thunk.
        assert all(r["thunk"] is None for r in rows if r["stream"] is None)
        report = json.loads(Path(str(proof["report"])).read_text())
        assert {r["start"]: r["stream"] for r in rows} == {
            c["start"]: c["stream"] for c in report["collectives"]
        }
        off_stream_0 |= {r["kind"] for r in on_streams if r["stream"] != 0}
    assert off_stream_0 == {
        "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
    }  # fmt: skip


def test_our_annotations_win_over_xlas_own_multi_streaming(tmp_path: Path) -> None:
    """With xla_gpu_experimental_enable_collective_multi_streaming, XLA alone alternates
    streams 0 and 1; with the plugin every collective runs where our report says."""
    proof = _prove(tmp_path, "transformer_step", "interval", "--multi-streaming")
    assert proof["ok"], proof["checks"]
    rows = proof["rows"]
    assert isinstance(rows, list)
    assert {r["plain"] for r in rows if r["stream"] is not None} == {0, 1}
    assert all(r["thunk"] == r["stream"] for r in rows if r["stream"] is not None)


@pytest.mark.parametrize("streams", [4])
def test_demo_without_a_gpu(tmp_path: Path, streams: int) -> None:
    reports = tmp_path / "reports"
    result = subprocess.run(
        [sys.executable, "-m", "xla_streams", "demo", f"--streams={streams}",
         f"--report-dir={reports}"],
        env={k: v for k, v in _env().items() if k != "JAX_PLATFORMS"},
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    out = result.stdout
    assert "compiled for 8 x H100 without a GPU" in out
    assert "module jit_step: 48 async pairs" in out
    (json_path,) = reports.glob("jit_step.*.json")
    assert f"report (JSON, schema xla_streams.assignment.v2): {json_path}" in out
    report = json.loads(json_path.read_text())
    assert report["streams"] == streams and report["summary"]["streams_used"] >= 2
    assert json_path.with_suffix(".txt").read_text() in out
    assert not list(tmp_path.glob("xla_streams_*"))  # nothing left in the working directory
    # The story's end: the predictions against XLA's defaults and tune's pick (found by
    # tune over the levers that create overlap here), the effect of the demo's streams last.
    assert "searching overlap-limit, start-early (the levers that create overlap" in out
    rows = re.findall(r"^  (.+?) +(\d+\.\d{3}) ms  (\d\.\d{3})x$", out, re.M)
    labels = [label for label, _, _ in rows]
    assert labels[:3] == [
        "XLA's defaults: overlap limit 1, 1 stream",
        f"the demo's compile (overlap limit {streams}), 1 stream",
        f"what the demo turned on: overlap limit {streams}, {streams} collective streams, interval",
    ]
    assert labels[3].startswith("tune's pick: ") and float(rows[3][2]) >= 1.0
    assert f"why {streams} streams: " in out and "to run tune's pick: " in out
    turned_on, ratio = rows[2][1], rows[2][2]
    assert out.splitlines()[-1] == (
        f"Predicted effect of what the demo turned on (overlap limit {streams}, {streams} "
        f"collective streams): {ratio}x of XLA's defaults on this program ({turned_on} ms a "
        f"step against {rows[0][1]} ms)."
    )
