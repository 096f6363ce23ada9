"""The ffi-mode runtime: native custom calls that run collectives on K streams.

``lower-to-ffi`` turns each async collective into two typed-FFI custom calls,
``xla_streams_start`` and ``xla_streams_done`` (defined, with their attributes and
the timeout's range, in :mod:`xla_streams.runtime.abi`); this package builds (see
:mod:`xla_streams.runtime.build`), loads and registers their implementations:

- ``host``: XLA:CPU devices of one process; per device one worker thread per
  stream and an in-process rendezvous (``csrc/host_backend.cc``);
- ``cuda``: K CUDA streams per device and NCCL (``csrc/cuda_backend.cc``).

::

    from xla_streams import runtime
    runtime.register("host")        # before compiling; builds on first use
    runtime.set_timeout(30.0)       # a rendezvous/collective stuck this long fails
    runtime.enable_trace()          # per device and stream: op, start and end times
    ...
    events = runtime.trace_events()

Failures reach Python as the exception of the call that ran the program (the
done's error names the op, and for a timeout the devices that never arrived).
Importing this package does not import JAX or build anything.
"""

from __future__ import annotations

import ctypes
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from xla_streams import environment, jax_compat
from xla_streams.runtime.abi import (
    BACKENDS,
    HANDLERS,
    PLATFORMS,
    AttributeValue,
    Backend,
)
from xla_streams.runtime.errors import BuildError

_lock = threading.RLock()
_libraries: dict[str, ctypes.CDLL] = {}
_registered: set[str] = set()
_timeout_s: float | None = None
_trace_on: bool | None = None

__all__ = [
    "BuildError",
    "TraceEvent",
    "clear_trace",
    "configure_cuda",
    "cuda_available",
    "enable_trace",
    "ffi_attributes",
    "load",
    "register",
    "set_stream_priority",
    "set_timeout",
    "timeout",
    "trace_events",
]


@dataclass(frozen=True)
class TraceEvent:
    """One record of the runtime trace.

    ``what`` is ``start``/``done`` (the custom call on the device's compute
    thread or stream; a done ends when the collective completed), ``collective``
    (the work on collective stream ``stream``) or ``compute`` (the host's
    traced compute probe). Times are ``CLOCK_MONOTONIC`` nanoseconds
    (``time.monotonic_ns()``); CUDA events also carry ``begin_ms``/``end_ms``
    from CUDA event timings, relative to a per-device base event.
    """

    what: str
    device: int
    logical: int
    stream: int
    op_id: int
    name: str
    kind: str
    begin_ns: int
    end_ns: int
    backend: str = "host"
    begin_ms: float | None = None
    end_ms: float | None = None


def load(backend: Backend = "host") -> ctypes.CDLL:
    """The backend's library, built on first use (raises BuildError with the reason,
    ValueError for a bad ``XLA_STREAMS_TIMEOUT_S``)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown runtime backend {backend!r}; expected one of {BACKENDS}")
    with _lock:
        lib = _libraries.get(backend)
        if lib is not None:
            return lib
        milliseconds = _milliseconds(timeout())  # a bad XLA_STREAMS_TIMEOUT_S fails before a build
        from xla_streams.runtime.build import build

        path = build(backend)
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise BuildError(f"xla_streams: cannot load {path}: {e}") from e
        lib.xs_abi_version.restype = ctypes.c_int
        lib.xs_set_timeout_ms.argtypes = [ctypes.c_int64]
        lib.xs_get_timeout_ms.restype = ctypes.c_int64
        lib.xs_trace_enable.argtypes = [ctypes.c_int]
        lib.xs_trace_json.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.xs_trace_json.restype = ctypes.c_size_t
        lib.xs_set_timeout_ms(milliseconds)
        if _trace_on is not None:
            lib.xs_trace_enable(int(_trace_on))
        _libraries[backend] = lib
        return lib


def register(backend: Backend = "host") -> None:
    """Register the backend's custom-call targets with JAX (once; before compiling)."""
    with _lock:
        if backend in _registered:
            return
        import jax.ffi

        lib = load(backend)
        if backend == "cuda":
            configure_cuda(lib)
        for target, symbol in HANDLERS[backend].items():
            capsule = jax.ffi.pycapsule(getattr(lib, symbol))  # type: ignore[no-untyped-call]
            jax.ffi.register_ffi_target(target, capsule, platform=PLATFORMS[backend])
        _registered.add(backend)


# ctypes callbacks into JAX's distributed key-value store (kept alive here).
_KV_SET = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
)
_KV_GET = ctypes.CFUNCTYPE(
    ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t
)
_kv_callbacks: list[object] = []


def configure_cuda(lib: ctypes.CDLL, platform: str = "gpu") -> None:
    """Stream priority, local device ids and (multi-process) the key-value store of
    the CUDA backend, whose devices are JAX's ``platform`` devices (``cpu`` under
    the CUDA emulator)."""
    import jax

    lib.xs_cuda_set_stream_priority.argtypes = [ctypes.c_char_p]
    lib.xs_cuda_set_global_id.argtypes = [ctypes.c_int, ctypes.c_int64]
    set_stream_priority(environment.CUDA_STREAM_PRIORITY.from_env(), lib)
    client = jax_compat.distributed_client()
    if client is None:
        return  # one process: device ids are ordinals, NCCL ids are shared in-process
    for ordinal, device in enumerate(jax.local_devices(backend=platform)):
        hardware = getattr(device, "local_hardware_id", None)
        lib.xs_cuda_set_global_id(ordinal if hardware is None else int(hardware), int(device.id))

    def kv_set(key: bytes, value: int, size: int, overwrite: int) -> int:
        try:
            client.key_value_set_bytes(
                key.decode(), ctypes.string_at(value, size), allow_overwrite=bool(overwrite)
            )
            return 0
        except Exception:
            return -1

    def kv_get(key: bytes, timeout_ms: int, buffer: int, capacity: int) -> int:
        try:
            value = client.blocking_key_value_get_bytes(key.decode(), int(timeout_ms))
        except Exception:
            return -1
        if len(value) > capacity:
            return -1
        ctypes.memmove(buffer, value, len(value))
        return len(value)

    callbacks = (_KV_SET(kv_set), _KV_GET(kv_get))
    _kv_callbacks.extend(callbacks)
    lib.xs_cuda_set_kv(*callbacks)


def set_stream_priority(spec: str, lib: ctypes.CDLL | None = None) -> None:
    """Priority of the CUDA collective streams created from now on: ``high`` (the
    device's greatest, the default), ``low``/``default`` (0) or an integer
    (also ``XLA_STREAMS_CUDA_STREAM_PRIORITY``)."""
    target = lib if lib is not None else load("cuda")
    target.xs_cuda_set_stream_priority.argtypes = [ctypes.c_char_p]
    if target.xs_cuda_set_stream_priority(spec.encode()) != 0:
        raise ValueError(f"stream priority must be high, low, default or an integer, not {spec!r}")


def ffi_attributes(items: Mapping[str, AttributeValue]) -> dict[str, Any]:
    """Attributes (``CollectiveCall.start_attributes()`` and the like) as the keywords of
    ``jax.ffi.ffi_call``: integers and integer arrays as numpy int64 (i64, array<i64>)."""
    import numpy as np

    def value_of(value: AttributeValue) -> Any:
        if isinstance(value, str):
            return value
        if isinstance(value, int):
            return np.int64(value)
        return np.array(value, dtype=np.int64)

    return {key: value_of(value) for key, value in items.items()}


def cuda_available() -> bool:
    """Whether the CUDA runtime and NCCL headers and libraries are installed (GPU or not)."""
    from xla_streams.runtime.build import find_cuda

    return find_cuda() is not None


def _milliseconds(seconds: float) -> int:
    return round(seconds * 1000)


def set_timeout(seconds: float) -> None:
    """How long a rendezvous or collective may take before it fails (default 300 s;
    ``abi.MIN_TIMEOUT_S`` to ``abi.MAX_TIMEOUT_S``, else ValueError).

    Also read from ``XLA_STREAMS_TIMEOUT_S`` when a library loads.
    """
    global _timeout_s
    checked = environment.TIMEOUT_S.check(seconds)
    with _lock:
        _timeout_s = checked
        for lib in _libraries.values():
            lib.xs_set_timeout_ms(_milliseconds(checked))


def timeout() -> float:
    """The timeout in seconds in effect (ValueError if ``XLA_STREAMS_TIMEOUT_S`` is
    set, not empty, and not a valid timeout)."""
    with _lock:
        if _timeout_s is not None:
            return _timeout_s
        for lib in _libraries.values():
            return float(lib.xs_get_timeout_ms()) / 1000
    return float(environment.TIMEOUT_S.from_env())


def enable_trace(on: bool = True) -> None:
    """Record start, done, collective and compute events (also ``XLA_STREAMS_TRACE=1``)."""
    global _trace_on
    with _lock:
        _trace_on = on
        for lib in _libraries.values():
            lib.xs_trace_enable(int(on))


def clear_trace() -> None:
    with _lock:
        for lib in _libraries.values():
            lib.xs_trace_clear()


def trace_events() -> list[TraceEvent]:
    """The events recorded so far by every loaded backend, in begin order."""
    events: list[TraceEvent] = []
    with _lock:
        libraries = dict(_libraries)
    for backend, lib in libraries.items():
        if backend == "cuda":
            lib.xs_cuda_trace_collect()
        size = lib.xs_trace_json(None, 0)
        buffer = ctypes.create_string_buffer(size + 1)
        lib.xs_trace_json(buffer, size + 1)
        for item in json.loads(buffer.value.decode()):
            events.append(TraceEvent(backend=backend, **item))
    events.sort(key=lambda e: (e.begin_ns, e.device))
    return events
