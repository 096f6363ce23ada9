"""Compiling the candidates on a Ray cluster (``xla-streams tune --ray=auto``): a local
one this test starts, with usage statistics off and no dashboard.

Ray binds to the machine's network address, so the cluster is started only inside a
private network namespace whose one interface is loopback, where it reaches nothing but
127.0.0.1: ``make ray-test`` runs this file in one (``unshare -n``, as root; ``make test``
runs it). Elsewhere, or without the ray extra (``pip install -e '.[ray]'``), this file is
skipped, with the reason, in pytest's summary.
"""

from __future__ import annotations

import io
import os
import socket
import textwrap
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # before Ray is imported: it phones home

import pytest

pytestmark = pytest.mark.slow  # starts a Ray cluster; `make ray-test` runs it

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install -e '.[ray]'")
INTERFACES = sorted(name for _, name in socket.if_nameindex())
if INTERFACES != ["lo"]:
    pytest.skip(
        f"Ray starts here only inside a private network namespace with loopback only "
        f"(`make ray-test`); this process sees the interfaces {', '.join(INTERFACES)}",
        allow_module_level=True,
    )

import xla_streams  # noqa: E402

SMALL = textwrap.dedent(
    """\
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    def build(devices):
        mesh = Mesh(np.array(devices), ("d",))

        def loss(w, x):
            return jnp.tanh(jnp.tanh(x @ w[0]) @ w[1]).sum()

        @jax.jit
        def step(w, x):
            return w - 0.1 * jax.grad(loss)(w, x)

        w = jax.ShapeDtypeStruct((2, 1024, 1024), jnp.float32, sharding=NamedSharding(mesh, P(None, "d")))
        x = jax.ShapeDtypeStruct((64 * len(devices), 1024), jnp.float32, sharding=NamedSharding(mesh, P("d")))
        return step, (w, x)
    """
)


def small_build() -> Any:
    namespace: dict[str, Any] = {}
    exec(compile(SMALL, "small_program.py", "exec"), namespace)
    return namespace["build"]


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_candidates_compile_on_a_ray_cluster(local_cluster: None) -> None:
    common: dict[str, Any] = {"levers": ["overlap-limit"], "budget_s": 180, "cache_dir": False}
    here = xla_streams.tune(small_build(), devices=8, jobs=0, **common)
    err = io.StringIO()
    on_ray = xla_streams.tune(small_build(), devices=8, ray="auto", progress=err, **common)
    assert "compiling on the Ray cluster auto (2 worker(s))" in err.getvalue()
    assert on_ray.compiles == here.compiles >= 3
    assert [c.predicted_step_ms for c in on_ray.candidates] == [
        c.predicted_step_ms for c in here.candidates
    ]
    assert ray.is_initialized()  # the tuner used this cluster and left it running
