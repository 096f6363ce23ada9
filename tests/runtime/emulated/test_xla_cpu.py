"""XLA:CPU end to end on the emulated CUDA runtime: real JAX programs in ffi mode,
their collectives run by the unchanged CUDA backend (tests/runtime/emulated/
xla_cpu_worker.py, in subprocesses: the stand-ins must be loaded before JAX)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

WORKER = Path(__file__).resolve().parent / "xla_cpu_worker.py"


def run(*args: str, timeout: float = 600) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_STREAMS_")}
    env["JAX_PLATFORMS"] = "cpu"
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def result(process: subprocess.Popen[str], timeout: float = 600) -> dict[str, Any]:
    out, err = process.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert process.returncode == 0 and lines, (
        f"exit {process.returncode}:\n{out[-2000:]}\n{err[-4000:]}"
    )
    parsed: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return parsed


def test_every_kind_and_element_type_gives_xla_s_results() -> None:
    outcome = result(run("equal"))
    assert outcome["reports"] == []  # no race, deadlock or misuse
    assert outcome["collectives_run"] > 0
    for check in outcome["checks"]:
        assert check["equal"], check
        # u64: XLA:CPU's own collectives run it, which lower-to-ffi leaves alone there.
        assert check["lowered"] > 0 or check["name"].endswith("u64") or "u64" in check["name"], (
            check
        )


def test_a_step_that_a_device_never_reaches_raises_naming_it() -> None:
    outcome = result(run("hang"))
    assert outcome["good"]
    assert outcome["error"] is not None, "the step returned although its collective hung"
    assert "all-reduce 'psum" in outcome["error"]
    assert "the devices that never started it: 4, 5, 6, 7" in outcome["error"]


def test_a_job_of_two_processes_through_jax_distributed() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    coordinator = f"127.0.0.1:{port}"
    processes = [run("job", str(p), coordinator) for p in (0, 1)]
    outcomes = [result(p) for p in processes]
    for process, outcome in enumerate(outcomes):
        assert outcome["process"] == process and outcome["lowered"] == 2
        assert outcome["sum"] and outcome["gather"], outcome
        assert outcome["reports"] == []
