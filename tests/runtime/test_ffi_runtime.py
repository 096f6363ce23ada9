"""The ffi runtime end to end on 8 CPU devices: build, results, trace, errors.

The runtime is compiled on first use, so these tests need a C++17 compiler (a
missing one fails them with BuildError's explanation). The programs run in
subprocesses (tests/runtime/ffi_worker.py) because the device count is fixed when JAX
starts. Each runs the ffi pipeline (asyncify, find-async-pairs, assign-streams,
verify-streams, lower-to-ffi) in XLA's POST_SCHEDULER hook and, for reference,
the same program with XLA's own collectives.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from xla_streams import runtime
from xla_streams.runtime import abi, build

pytestmark = pytest.mark.slow

HERE = os.path.dirname(__file__)
WORKER = os.path.join(HERE, "ffi_worker.py")


@functools.cache
def worker(scenario: str) -> dict[str, Any]:
    """Run one scenario of tests/runtime/ffi_worker.py; its RESULT line, parsed."""
    # Our own settings only: the JAX plugin stays off, the timeout is the default.
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_STREAMS_")}
    env["JAX_PLATFORMS"] = "cpu"
    result = subprocess.run(
        [sys.executable, WORKER, scenario],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=os.path.dirname(HERE),
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if result.returncode != 0 or not lines:
        raise AssertionError(
            f"ffi_worker.py {scenario} failed (exit {result.returncode}):\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
        )
    parsed: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return parsed


# -- build -----------------------------------------------------------------------------


def test_host_library_builds_once_and_is_cached() -> None:
    path = build.build("host")
    assert path.is_file() and path.parent == build.cache_dir()
    began = time.monotonic()
    assert build.build("host") == path
    assert time.monotonic() - began < 5  # a digest, no compile
    lib = runtime.load("host")
    assert lib.xs_abi_version() == abi.ABI_VERSION
    for symbol in abi.HANDLERS["host"].values():
        assert hasattr(lib, symbol)


def test_missing_compiler_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with pytest.raises(runtime.BuildError, match="CXX=/nonexistent/c\\+\\+ is not an executable"):
        build.build("host")
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(runtime.BuildError, match="needs a C\\+\\+17 compiler"):
        build.compiler()


def test_cuda_library_builds_without_a_gpu() -> None:
    """The nvidia-* wheels of the gpu-aot extra bring cuda_runtime_api.h, nccl.h and the
    libraries to link; no GPU or nvcc is needed."""
    assert runtime.cuda_available(), "install the gpu-aot extra: pip install -e '.[test,gpu-aot]'"
    path = build.build("cuda")
    lib = ctypes.CDLL(str(path))
    assert lib.xs_abi_version() == abi.ABI_VERSION
    assert lib.xs_cuda_nccl_version() >= 21400  # non-blocking communicators
    for symbol in (*abi.HANDLERS["cuda"].values(), "xs_cuda_set_kv"):
        assert hasattr(lib, symbol)
    assert lib.xs_cuda_set_stream_priority(b"high") == 0
    assert lib.xs_cuda_set_stream_priority(b"-1") == 0
    assert lib.xs_cuda_set_stream_priority(b"fast") == -1


# -- results -----------------------------------------------------------------------------

DTYPES = ("f32", "bf16", "f16", "f64", "s32", "s8", "pred", "u8", "u32")
EQUAL_CHECKS = (
    [f"kinds/{d}" for d in DTYPES]
    + [f"reductions/{d}/multiply" for d in DTYPES if d != "pred"]
    + [f"reductions/{d}/{op}" for d in ("s32", "s8") for op in ("and", "or")]
    + ["reductions/pred/or,and", "groups2d/f32", "groups2d/s32", "scan/f32", "combined/f32"]
    + ["large/f32", "large/bf16", "uneven/f32"]
)


@pytest.mark.parametrize("name", EQUAL_CHECKS)
def test_results_equal_xla_collectives(name: str) -> None:
    """Every kind (all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute)
    and dtype gives exactly XLA's result; reductions XLA:CPU lacks match numpy."""
    checks = {c["name"]: c for c in worker("equal")["checks"]}
    check = checks[name]
    assert check["lowered"] > 0, "nothing was lowered to the runtime"
    if name.startswith(("kinds/", "large/")):
        assert check["lowered"] == (8 if name == "kinds/pred" else 11)
    if name == "combined/f32":  # one two-operand all-reduce: a tuple-shaped start and done
        assert check["lowered"] == 1
    if check["equal"] is None:  # XLA:CPU has no integer and/or all-reduce
        assert name.endswith(("/and", "/or"))
    else:
        assert check["equal"] is True
    if "numpy" in check:
        assert check["numpy"] is True


def test_lowered_programs_read_operands_in_place() -> None:
    """Peers read a start's operands where they are, without a copy: in every program
    above (every kind and dtype, a while loop whose carried values go straight through
    collectives, combined operands) no result shared an operand's buffer, because the
    done takes the operands too, keeping them live, and so unwritten, until it. The
    results still equal XLA's (test_results_equal_xla_collectives)."""
    assert worker("equal")["staged"] == 0


def test_result_sharing_its_operand_buffer_is_copied_first() -> None:
    """A start whose result is its operand's buffer (input_output_aliases): peers would
    read values the collective already overwrote (the permute goes wrong without the
    copy); the runtime copies exactly those operands, once per member."""
    assert worker("aliased") == {"all-reduce": True, "collective-permute": True, "staged": 16}


def test_runtime_paths_xla_cpu_does_not_reach() -> None:
    """Gather dimensions with blocks before them in memory; two-operand collectives."""
    assert worker("direct") == {
        "all-gather/outer": True,
        "reduce-scatter/outer": True,
        "all-to-all/outer": True,
        "all-reduce/x": True,
        "all-reduce/y": True,
    }


# -- trace -------------------------------------------------------------------------------


def test_trace_shows_streams_overlapping_and_compute_between_start_and_done() -> None:
    result = worker("overlap")
    assert result["values_ok"]
    assert result["compiled_has_custom_calls"]
    assert result["streams_used"] == [0, 1]
    # Two collectives on streams 0 and 1 of one device ran at the same time...
    assert result["streams_overlap"], result
    _device, first, stream_a, second, stream_b = result["streams_overlap"][0]
    assert (stream_a, stream_b) == (0, 1) and first != second
    # ...and the compute probe ran after a start returned and before its done completed.
    assert result["compute_between"], result
    schedule = result["schedule"]  # custom-call targets in schedule order
    assert schedule.count(abi.START_TARGET) == schedule.count(abi.DONE_TARGET) == 2
    probe = schedule.index(abi.COMPUTE_TARGET)
    assert schedule.index(abi.START_TARGET) < probe
    assert probe < len(schedule) - 1 - schedule[::-1].index(abi.DONE_TARGET)


# -- errors ------------------------------------------------------------------------------


def test_rendezvous_timeout_names_op_and_missing_devices() -> None:
    result = worker("timeout")
    error = result["error"]
    assert error is not None, "the program should have failed"
    assert "all-reduce 'psum" in error and "timed out after 2 s" in error
    assert "logical devices [4, 5, 6, 7] never arrived" in error
    assert "XLA_STREAMS_TIMEOUT_S" in error
    assert result["seconds"] < 60


def test_shape_mismatch_is_an_error_at_the_call() -> None:
    result = worker("mismatch")
    across = result["across"]
    assert across is not None and "shape mismatch in all-reduce 'mismatched' (op 7" in across
    assert "(f32[4])" in across and "(f32[8])" in across
    local = result["local"]
    assert local is not None
    assert "all-gather 'mismatched' (op 8, stream 0): buffer shapes f32[8] -> f32[8]" in local
    assert "do not fit a group of 8" in local
