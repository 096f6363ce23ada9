"""The Bazel-built host runtime (argv[1]) runs an all-reduce over two CPU devices.

Loaded as is, not through ``runtime.load``, which would compile its own copy.
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import ctypes

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from xla_streams.runtime import abi, calls


def main(path: str) -> None:
    library = ctypes.CDLL(path)
    assert library.xs_abi_version() == abi.ABI_VERSION
    for target, symbol in abi.HANDLERS["host"].items():
        capsule = jax.ffi.pycapsule(getattr(library, symbol))
        jax.ffi.register_ffi_target(target, capsule, platform=abi.PLATFORMS["host"])

    call = abi.CollectiveCall(
        op_id=0,
        name="bazel.all-reduce",
        kind="all-reduce",
        stream=0,
        reduction="add",
        groups=(0, 1),
        group_sizes=(2,),
        num_partitions=2,
    )

    def all_reduce(x: jax.Array) -> jax.Array:
        ids = jax.lax.axis_index("x").astype(jnp.uint32)
        zero = jnp.zeros((), jnp.uint32)
        (out,) = calls.collective(call, [x], ids=(zero, ids))
        return out

    mesh = Mesh(np.array(jax.devices()), ("x",))
    fn = jax.jit(jax.shard_map(all_reduce, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    x = np.arange(8, dtype=np.float32)
    got = np.asarray(fn(x))
    halves = x.reshape(2, 4)
    np.testing.assert_array_equal(got, np.concatenate([halves.sum(0)] * 2))


if __name__ == "__main__":
    main(sys.argv[1])
