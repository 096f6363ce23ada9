"""Multi-host: every process of a job computes the same assignment, byte for byte.

Two processes join one job with ``jax.distributed.initialize`` (CPU, loopback
coordinator, 4 host devices each: 8 devices in all), both with the plugin on
from the environment, and compile the same sharded program over all 8 devices.
XLA:CPU keeps collectives synchronous (no start/done pairs), so each process
also hands a real scheduled 8-GPU module (a fixture, many async pairs) to the
plugin's registered hook (``plugin.run_hook``), exactly as XLA would. The report
folders of the two processes must hold the same files with the same bytes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_processes_write_identical_reports(tmp_path: Path) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    port = _free_port()
    procs = []
    for i in range(2):
        environ = {
            k: v for k, v in os.environ.items() if not k.startswith(("XLA_STREAMS_", "XLA_FLAGS"))
        }
        environ.update(
            JAX_PLATFORMS="cpu",
            XLA_FLAGS="--xla_force_host_platform_device_count=4",
            XLA_STREAMS_COLLECTIVE_STREAMS="4",
            XLA_STREAMS_REPORT_DIR=str(tmp_path / f"reports_{i}"),
        )
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
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outputs.append((p.returncode, out, err))
    for code, out, err in outputs:
        assert code == 0, err
        assert "fixture annotated: True failed: 0" in out, out + err

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
