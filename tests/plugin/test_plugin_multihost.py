"""Multi-host: every process of a job computes the same assignment, byte for byte.

Two processes join one job with ``jax.distributed.initialize`` (CPU, loopback
coordinator, 4 host devices each: 8 devices in all), both with the plugin on
from the environment, and compile the same sharded program over all 8 devices.
XLA:CPU keeps collectives synchronous (no start/done pairs), so each process
also hands a real scheduled 8-GPU module (a fixture, many async pairs) to the
plugin's registered hook (``plugin.run_hook``), exactly as XLA would. The report
folders of the two processes must hold the same files with the same bytes, and both
get the same, correct, results.

In ffi mode the host runtime meets a collective's devices inside one process only, so
on XLA:CPU a collective over devices of both processes would wait for the other
process's devices until its timeout: the plugin leaves such modules to XLA, says so
once, and the job runs at once with the same results.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import hlo_module

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "hlo_fixtures" / "transformer_step.limit4.hook.hlo"

WORKER = """
import sys
from pathlib import Path

import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

process_id, port, fixture, tests = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
sys.path.insert(0, tests)
from conftest import xla_parsable
{RUN_AND_CHECK}
jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
    initialization_timeout=60,
)
assert jax.device_count() == 8 and jax.local_device_count() == 4, jax.devices()
mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))

def sharded(x):
    y = jax.lax.psum(x, "model")
    z = jax.lax.all_gather(y, "data", tiled=True)
    return jax.lax.psum_scatter(z * 3, "data", tiled=True)

f = jax.jit(jax.shard_map(sharded, mesh=mesh, in_specs=P("data", "model"), out_specs=P("data", "model")))
x = jax.ShapeDtypeStruct((64, 128), jnp.float32, sharding=NamedSharding(mesh, P("data", "model")))
f.lower(x).compile()
print("result", run_and_check(f, mesh))

from jaxlib import _hlo
from xla_streams.plugin import hook, xla_module
from xla_streams import plugin

# A module from text has no static device assignment; XLA's own compile gives the
# hook one (HloModuleProto.device_assignment): 1 replica x 8 partitions here.
assignment = xla_module.device_assignment_field(xla_module.DeviceAssignment(1, 8, tuple(range(8))))
text = xla_parsable(Path(fixture).read_text())
proto = _hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()
changed = plugin.run_hook(proto + assignment)
print("fixture annotated:", changed is not None, "failed:", hook.stats().failed)
jax.distributed.shutdown()
"""


# Runs the job's program on real data and checks it on every process: x is
# 64 x 128, 2 x 4 blocks of 32 x 32 (rows over "data", columns over "model"); each block
# of the result is 6 x the sum of its block row. Returns a digest of the whole result,
# which every process must print alike.
RUN_AND_CHECK = """
import hashlib
from jax.experimental import multihost_utils

def run_and_check(f, mesh):
    data = np.arange(64 * 128, dtype=np.float32).reshape(64, 128) % 97
    sharding = NamedSharding(mesh, P("data", "model"))
    x = jax.make_array_from_callback(data.shape, sharding, lambda index: data[index])
    out = multihost_utils.process_allgather(f(x), tiled=True)
    blocks = data.reshape(2, 32, 4, 32)
    expected = np.broadcast_to(6 * blocks.sum(2, keepdims=True), blocks.shape).reshape(64, 128)
    assert np.array_equal(out, expected), float(np.abs(out - expected).max())
    return hashlib.sha256(np.ascontiguousarray(out).tobytes()).hexdigest()[:16]
"""
WORKER = WORKER.replace("{RUN_AND_CHECK}", RUN_AND_CHECK)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_job(
    tmp_path: Path, source: str, settings: dict[str, str], timeout: float = 120
) -> list[tuple[int, str, str]]:
    """``source`` as both processes of a job, with ``settings`` (a report folder of
    its own each): (exit code, stdout, stderr) per process."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    worker = tmp_path / "worker.py"
    worker.write_text(source)
    port = _free_port()
    procs = []
    for i in range(2):
        environ = {
            k: v for k, v in os.environ.items() if not k.startswith(("XLA_STREAMS_", "XLA_FLAGS"))
        }
        environ.update(
            JAX_PLATFORMS="cpu",
            XLA_FLAGS="--xla_force_host_platform_device_count=4",
            XLA_STREAMS_REPORT_DIR=str(tmp_path / f"reports_{i}"),
        )
        environ.update(settings)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(worker), str(i), str(port), str(FIXTURE), str(REPO / "tests")],
                env=environ,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outputs.append((p.returncode, out, err))
    return outputs


def results(outputs: list[tuple[int, str, str]]) -> list[str]:
    """The digest of the job's result each process printed (it checked the values)."""
    found = []
    for code, out, err in outputs:
        assert code == 0, err
        (line,) = [line for line in out.splitlines() if line.startswith("result ")]
        found.append(line)
    return found


@pytest.mark.slow
def test_two_processes_write_identical_reports(tmp_path: Path) -> None:
    outputs = run_job(tmp_path, WORKER, {"XLA_STREAMS_COLLECTIVE_STREAMS": "4"})
    for code, out, err in outputs:
        assert code == 0, err
        assert "fixture annotated: True failed: 0" in out, out + err
    first_result, second_result = results(outputs)
    assert first_result == second_result

    first, second = tmp_path / "reports_0", tmp_path / "reports_1"

    def listed(folder: Path) -> list[str]:
        return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))

    names = listed(first)
    assert names == listed(second)
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    # Both kinds of module are there: the job's own (CPU: no async pairs) and the
    # 8-GPU one, whose assignment really spreads pairs over streams.
    reports = {p.name.split(".")[0]: json.loads(p.read_text()) for p in first.glob("*.json")}
    assert reports["jit_sharded"]["summary"]["async_pairs"] == 0
    assert reports["jit_sharded"]["summary"]["synchronous_collectives"] == 3
    assert reports["jit_step"]["summary"]["async_pairs"] > 0
    assert reports["jit_step"]["summary"]["streams_used"] >= 2


CROSS_PROCESS = "ffi mode on XLA:CPU runs a collective inside one process only"


@pytest.mark.slow
def test_ffi_mode_leaves_collectives_across_processes_to_xla(tmp_path: Path) -> None:
    """Before: every process waited XLA_STREAMS_TIMEOUT_S for the other's devices,
    then failed. Now the module is XLA's: the same results at once, and one warning."""
    worker = WORKER[: WORKER.index("from jaxlib import _hlo")] + "jax.distributed.shutdown()\n"
    settings = {
        "XLA_STREAMS_COLLECTIVE_STREAMS": "2",
        "XLA_STREAMS_MODE": "ffi",
        "XLA_STREAMS_TIMEOUT_S": "60",  # far beyond the run, if a collective waited
    }
    begin = time.monotonic()
    ffi = run_job(tmp_path / "ffi", worker, settings, timeout=300)
    seconds = time.monotonic() - begin
    ffi_results = results(ffi)
    assert seconds < 45, seconds  # no collective waited for its timeout
    for _, _, err in ffi:
        warnings = [line for line in err.splitlines() if CROSS_PROCESS in line]
        assert len(warnings) == 1, err  # said once, however many modules
        assert "module jit_sharded" in warnings[0] and "processes 0, 1" in warnings[0]
        assert "left to XLA" in warnings[0]
    native = run_job(tmp_path / "native", worker, {"XLA_STREAMS_COLLECTIVE_STREAMS": "2"})
    assert results(native) == ffi_results  # and both processes agree
    assert ffi_results[0] == ffi_results[1]
    for _, _, err in native:
        assert CROSS_PROCESS not in err


MODULE = hlo_module(
    "HloModule m, num_partitions=4",
    """\
ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %ar = f32[8]{0} all-reduce(%p), channel_id=1, replica_groups=GROUPS, use_global_device_ids=true, to_apply=%add
}
""",
)


def test_which_modules_ffi_mode_leaves_to_xla(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a collective whose devices belong to several processes (here logical 0..3 on
    devices 0, 1 of process 0 and 2048, 2049 of process 1) is refused."""
    from xla_streams import jax_compat
    from xla_streams.hlo import parse_module
    from xla_streams.plugin import hook, xla_module

    job = {0: 0, 1: 0, 2048: 1, 2049: 1}
    assignment = xla_module.DeviceAssignment(1, 4, (0, 1, 2048, 2049))
    monkeypatch.setattr(jax_compat, "device_processes", lambda platform: job)
    local = parse_module(MODULE.replace("GROUPS", "{{0,1},{2,3}}"))
    across = parse_module(MODULE.replace("GROUPS", "{{0,2},{1,3}}"))
    assert hook._cross_process_collective(local, assignment) is None
    reason = hook._cross_process_collective(across, assignment)
    assert reason == "all-reduce 'ar' has devices of processes 0, 1"
    assert hook._cross_process_collective(local, None) is not None  # devices unknown
    # One process: nothing to refuse.
    monkeypatch.setattr(jax_compat, "device_processes", lambda platform: dict.fromkeys(job, 0))
    assert hook._cross_process_collective(across, assignment) is None
