"""XLA:CPU drives the CUDA backend on the emulated devices: real JAX programs in
ffi mode, their collectives run by ``libxla_streams_cuda`` as it was built.

::

    from xla_streams.runtime.emulator import on_cpu
    checks = on_cpu.start()   # before JAX starts its backends; JAX_PLATFORMS=cpu
    ...                       # compile with lower-to-ffi{backend=cuda}, run, compare
    checks.reports()          # races, deadlocks, misuse the emulator saw

The CUDA handlers need a GPU stream, which XLA:CPU does not have, so the targets
are registered for ``cpu`` with the forwarding handlers of ``csrc/forward.cc``,
which hand the backend an emulated compute stream per device and, after a done,
wait for it as XLA:CPU's synchronous compute must (an error the backend records
meanwhile fails the step). A job of several processes (``jax.distributed``) gets
its device ids and NCCL ids through JAX's key-value store, as on GPUs.
"""

from __future__ import annotations

import ctypes
import sys
import types

from xla_streams import runtime
from xla_streams.runtime import abi
from xla_streams.runtime.emulator import Checks, build, load

# JAX's CUDA plugins load the real libcudart and libnccl when JAX starts, GPU or
# not; in this process the stand-ins take their place, so the plugins stay out.
CUDA_PLUGINS = ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")


def start() -> Checks:
    """Loads the stand-ins and the backend, and registers the forwarding handlers
    for ``cpu``. Call before JAX starts its backends (the first ``jax.devices()``)."""
    for name in CUDA_PLUGINS:
        stub = types.ModuleType(name, "JAX's CUDA plugin, kept out by the CUDA emulator")
        stub.initialize = lambda: None  # type: ignore[attr-defined]
        sys.modules[name] = stub
    built = build()
    checks = load(built)
    backend = runtime.load("cuda")  # binds to the stand-ins: their sonames are loaded
    forward = ctypes.CDLL(str(built.forward))
    forward.xsim_forward_set_backend.argtypes = [ctypes.c_void_p] * 3
    address = ctypes.cast
    forward.xsim_forward_set_backend(
        address(backend.xla_streams_cuda_start, ctypes.c_void_p),
        address(backend.xla_streams_cuda_done, ctypes.c_void_p),
        address(backend.xs_cuda_device_error, ctypes.c_void_p),
    )
    import jax.ffi

    for target, symbol in (
        (abi.START_TARGET, forward.xsim_forward_start),
        (abi.DONE_TARGET, forward.xsim_forward_done),
    ):
        capsule = jax.ffi.pycapsule(symbol)  # type: ignore[no-untyped-call]
        jax.ffi.register_ffi_target(target, capsule, platform="cpu")
    runtime.configure_cuda(backend, platform="cpu")
    return checks


__all__ = ["CUDA_PLUGINS", "start"]
