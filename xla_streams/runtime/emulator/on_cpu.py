"""XLA:CPU drives the CUDA backend on the emulated devices: real JAX programs in
ffi mode, their collectives run by ``libxla_streams_cuda`` as it was built.

::

    from xla_streams.runtime.emulator import on_cpu
    checks = on_cpu.start()   # before anything imports JAX; JAX_PLATFORMS=cpu
    ...                       # compile with lower-to-ffi{backend=cuda}: in the hook, after
    on_cpu.follow_schedule(lowered_text)  # lowering, then run and compare
    checks.reports()          # races, deadlocks, misuse the emulator saw

The CUDA handlers need a GPU stream, which XLA:CPU does not have, so the targets
are registered for ``cpu`` with the forwarding handlers of ``csrc/forward.cc``,
which hand the backend an emulated compute stream per device and, after a done,
wait for it as XLA:CPU's synchronous compute must (an error the backend records
meanwhile fails the step). XLA:CPU runs a device's independent calls in any order,
XLA:GPU in schedule order: :func:`follow_schedule` tells the handlers each lowered
module's order of starts, which they keep on every device. A job of several
processes (``jax.distributed``, then :func:`join_job`) gets its device ids and NCCL
ids through JAX's key-value store, as on GPUs.
"""

from __future__ import annotations

import ctypes
import sys
import types

from xla_streams import runtime
from xla_streams.hlo import parse_module
from xla_streams.runtime import abi
from xla_streams.runtime.emulator import Checks, build, load

# JAX's CUDA plugins load the real libcudart and libnccl when JAX starts, GPU or
# not; in this process the stand-ins take their place, so the plugins stay out.
CUDA_PLUGINS = ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")


def start() -> Checks:
    """Loads the stand-ins and the backend, and registers the forwarding handlers
    for ``cpu``. Call before anything imports JAX: importing it loads JAX's CUDA
    kernels, and with them the real CUDA runtime, in any process that has them."""
    for name in CUDA_PLUGINS:
        stub = types.ModuleType(name, "JAX's CUDA plugin, kept out by the CUDA emulator")
        stub.initialize = lambda: None  # type: ignore[attr-defined]
        sys.modules[name] = stub
    global _forward
    built = build()
    checks = load(built)
    backend = runtime.load("cuda")  # binds to the stand-ins: their sonames are loaded
    forward = _forward = ctypes.CDLL(str(built.forward))
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


_forward: ctypes.CDLL | None = None


def join_job() -> None:
    """After ``jax.distributed.initialize``: each of this process's CPU devices is an
    emulated device, by its local index, and the backend learns their global ids and
    JAX's key-value store."""
    import jax

    assert _forward is not None, "on_cpu.start() first"
    for local, device in enumerate(jax.local_devices(backend="cpu")):
        _forward.xsim_forward_set_ordinal(int(device.id), local)
    runtime.configure_cuda(runtime.load("cuda"), platform="cpu")


def follow_schedule(lowered: str) -> None:
    """Keeps the order of the starts of ``lowered`` (a module lowered for the CUDA
    runtime) within each computation, on every device, as XLA:GPU issues them."""
    assert _forward is not None, "on_cpu.start() first"
    order = _forward.xsim_forward_order
    order.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64]
    for computation in parse_module(lowered).computations:
        before = None
        for inst in computation.instructions:
            if inst.attribute("custom_call_target") != f'"{abi.START_TARGET}"':
                continue
            call = abi.CollectiveCall.parse(inst.attribute("backend_config") or "{}")
            if before is not None:
                order(call.name.encode(), call.op_id, before.name.encode(), before.op_id)
            before = call


__all__ = ["CUDA_PLUGINS", "follow_schedule", "join_job", "start"]
