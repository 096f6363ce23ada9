"""The custom calls of ffi mode, defined once: what ``lower-to-ffi`` writes, the C++
runtime (``xla_streams/runtime/csrc/``) reads and the tests and tools call.

A collective becomes two typed-FFI custom calls (``api_version=API_VERSION_TYPED_FFI``,
``custom_call_has_side_effect=true``) whose attributes are an MLIR dictionary in
``backend_config``::

    %ar-start = f32[64]{0} custom-call(%p, %rid, %pid), custom_call_target="xla_streams_start",
        ..., backend_config={op_id = 0 : i64, name = "ar-start", kind = "all-reduce", ...}
    %ar = f32[64]{0} custom-call(%ar-start, %p), custom_call_target="xla_streams_done",
        output_to_operand_aliasing={{}: (0, {})}, ..., backend_config={op_id = 0 : i64, ...}

- :data:`START_TARGET` takes the collective's operands (on the host backend then the
  device's ``replica-id()`` and ``partition-id()``, ``u32[]``) and every attribute of
  :class:`CollectiveCall` (:meth:`CollectiveCall.start_config`);
- :data:`DONE_TARGET` takes the start's result, then the start's operands (which keeps
  them alive and unwritten until the collective is done), aliases its result to the
  start's, and carries :data:`DONE_ATTRIBUTES` (:meth:`CollectiveCall.done_config`);
- :data:`COMPUTE_TARGET` (host only, tests) copies its operand to its result and spins
  for ``spin_us`` microseconds, traced under ``label`` (:data:`COMPUTE_ATTRIBUTES`).

Who reads what, in ``xla_streams/runtime/csrc/``:

- every attribute of a start, and of a done those of :data:`DONE_ATTRIBUTES`:
  ``DecodeAttrs`` in ``common.h`` (``full`` false for a done), called by
  ``HostStartImpl``/``HostDoneImpl`` in ``host_backend.cc`` and
  ``CudaStartImpl``/``CudaDoneImpl`` in ``cuda_backend.cc``;
- the compute probe's attributes: the binding of ``xla_streams_host_compute``
  (``XLA_FFI_DEFINE_HANDLER_SYMBOL``) in ``host_backend.cc``, for ``HostCompute``;
- the handler symbols (:data:`HANDLERS`): ``XLA_FFI_DEFINE_HANDLER_SYMBOL`` in
  ``host_backend.cc`` and ``cuda_backend.cc``; :data:`ABI_VERSION`:
  ``xs_abi_version`` in ``common_api.cc``;
- the timeout's default and range: ``Config::timeout_ms``, ``kMinTimeoutMs`` and
  ``kMaxTimeoutMs`` in ``common.h`` (the Python side checks it, the C++ side clamps);
- the values of ``kind`` and ``reduction``: ``ParseKind`` and ``ParseReduction`` in
  ``common.h``; the element types (:data:`ELEMENT_TYPES`): ``Reduce`` in
  ``host_backend.cc``, ``NcclType`` in ``cuda_backend.cc``.

``tests/runtime/test_abi.py`` reads those sources and fails where they and this module
disagree. Imports only the standard library and :mod:`xla_streams.collectives`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import ClassVar, Literal

from xla_streams.collectives import KINDS
from xla_streams.environment import DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S, MIN_TIMEOUT_S

# -- targets and where they run ---------------------------------------------------------

START_TARGET = "xla_streams_start"
DONE_TARGET = "xla_streams_done"
COMPUTE_TARGET = "xla_streams_compute"  # the host's compute probe, for tests
TARGETS = (START_TARGET, DONE_TARGET, COMPUTE_TARGET)

Backend = Literal["host", "cuda"]
BACKENDS: tuple[Backend, ...] = ("host", "cuda")
# The platform each backend's targets are registered for (jax.ffi.register_ffi_target).
PLATFORMS: dict[Backend, str] = {"host": "cpu", "cuda": "CUDA"}
# Target -> the symbol of its handler in the backend's library.
HANDLERS: dict[Backend, dict[str, str]] = {
    "host": {
        START_TARGET: "xla_streams_host_start",
        DONE_TARGET: "xla_streams_host_done",
        COMPUTE_TARGET: "xla_streams_host_compute",
    },
    "cuda": {
        START_TARGET: "xla_streams_cuda_start",
        DONE_TARGET: "xla_streams_cuda_done",
    },
}
ABI_VERSION = 1  # what the libraries' xs_abi_version() returns

# -- attribute values -----------------------------------------------------------------

# The kinds the runtime runs (``kind``), and the reductions it knows (``reduction``).
FFI_KINDS: tuple[str, ...] = tuple(k.name for k in KINDS.values() if k.ffi)
REDUCTIONS: tuple[str, ...] = ("add", "multiply", "min", "max", "and", "or")
# The element types each backend runs (every operand and result of one call has one).
ELEMENT_TYPES: dict[Backend, tuple[str, ...]] = {
    "host": ("f32", "bf16", "f16", "f64", "s32", "s8", "pred", "s16", "s64", "u8", "u32"),
    "cuda": ("f32", "bf16", "f16", "f64", "s32", "s8", "pred", "s64", "u8", "u32", "u64"),
}

# -- the attributes ---------------------------------------------------------------------

AttributeValue = int | str | tuple[int, ...]
# The MLIR types of the attributes, by the Python type of the field that holds them.
ATTRIBUTE_TYPES = {"int": "i64", "str": "string", "tuple[int, ...]": "array<i64>"}


@dataclass(frozen=True)
class CollectiveCall:
    """The attributes of one start/done pair: names, types and meanings, in the order
    lower-to-ffi writes them. A field is an attribute of the same name (``int``: ``i64``,
    ``str``: a string, ``tuple[int, ...]``: ``array<i64>``)."""

    op_id: int  # unique per start in the module; a done has its start's
    name: str  # the start's instruction name (for messages and the trace)
    kind: str  # one of FFI_KINDS
    stream: int  # the collective stream, 0..K-1 (the runtime takes 0..63)
    reduction: str = ""  # one of REDUCTIONS for all-reduce and reduce-scatter, else ""
    # Device groups, flattened, as logical ids (replica * num_partitions + partition);
    # for collective-permute the (source, target) pairs.
    groups: tuple[int, ...] = ()
    group_sizes: tuple[int, ...] = ()  # the length of each group in `groups`
    dimension: int = -1  # the gather/scatter/split dimension, -1 if none
    # Per operand array: the blocks in memory before `dimension` (the product of the
    # more major physical dimensions), so that the runtime needs no layouts.
    outer: tuple[int, ...] = ()
    channel: int = 0  # channel_id, 0 if none
    num_partitions: int = 1
    # (CUDA) the device id of each logical id; written only when set (empty: identity).
    device_ids: tuple[int, ...] = ()

    WRITTEN_WHEN_SET: ClassVar[frozenset[str]] = frozenset({"device_ids"})

    def start_attributes(self) -> dict[str, AttributeValue]:
        """The start's attributes, in order."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in self.WRITTEN_WHEN_SET or getattr(self, f.name)
        }

    def done_attributes(self) -> dict[str, AttributeValue]:
        """The done's attributes: what it needs to find its start and name it."""
        return {name: getattr(self, name) for name in DONE_ATTRIBUTES}

    def start_config(self) -> str:
        """The start's ``backend_config``: ``{op_id = 0 : i64, name = "ar-start", ...}``."""
        return render_attributes(self.start_attributes())

    def done_config(self) -> str:
        """The done's ``backend_config``."""
        return render_attributes(self.done_attributes())

    @classmethod
    def parse(cls, config: str) -> CollectiveCall:
        """The call a start's (or a done's) ``backend_config`` describes; ValueError for
        an unknown attribute, one of the wrong type, or a missing one of the done's."""
        values = parse_attributes(config)
        unknown = sorted(set(values) - set(START_ATTRIBUTES))
        if unknown:
            raise ValueError(f"unknown attribute {unknown[0]!r} in {config!r}")
        missing = [name for name in DONE_ATTRIBUTES if name not in values]
        if missing:
            raise ValueError(f"attribute {missing[0]!r} missing from {config!r}")
        for name, value in values.items():
            if _type_of(value) != START_ATTRIBUTES[name]:
                raise ValueError(f"attribute {name!r} is not of type {START_ATTRIBUTES[name]}")
        return cls(**values)  # type: ignore[arg-type]  # types checked above


# Name -> MLIR type of every attribute of a start, and the names a done carries.
START_ATTRIBUTES: dict[str, str] = {
    f.name: ATTRIBUTE_TYPES[str(f.type)] for f in fields(CollectiveCall)
}
DONE_ATTRIBUTES: tuple[str, ...] = ("op_id", "name", "kind", "stream")
# The compute probe's attributes: how long it spins, and its name in the trace.
COMPUTE_ATTRIBUTES: dict[str, str] = {"spin_us": "i64", "label": "string"}


def render_attributes(items: Mapping[str, AttributeValue]) -> str:
    """An MLIR dictionary attribute, the form XLA's typed FFI reads from backend_config."""
    parts = []
    for key, value in items.items():
        if isinstance(value, bool):
            raise TypeError(f"{key}: booleans are not used")
        if isinstance(value, int):
            parts.append(f"{key} = {value} : i64")
        elif isinstance(value, str):
            parts.append(f'{key} = "{value}"')
        else:
            parts.append(
                f"{key} = array<i64: {', '.join(map(str, value))}>"
                if value
                else f"{key} = array<i64>"
            )
    return "{" + ", ".join(parts) + "}"


_ITEM = re.compile(
    r'\s*(\w+) = (?:(-?\d+) : i64|"([^"]*)"|array<i64(?:: (-?\d+(?:, -?\d+)*))?>)\s*(,|\})'
)


def parse_attributes(text: str) -> dict[str, AttributeValue]:
    """The dictionary :func:`render_attributes` writes, read back; ValueError otherwise."""
    text = text.strip()
    if not text.startswith("{"):
        raise ValueError(f"not an attribute dictionary: {text!r}")
    items: dict[str, AttributeValue] = {}
    at = 1
    if text == "{}":
        return items
    while True:
        m = _ITEM.match(text, at)
        if m is None:
            raise ValueError(f"cannot read attribute at {at} of {text!r}")
        key, number, string, array, end = m.groups()
        if key in items:
            raise ValueError(f"attribute {key!r} given twice in {text!r}")
        if number is not None:
            items[key] = int(number)
        elif string is not None:
            items[key] = string
        else:
            items[key] = tuple(int(v) for v in array.split(", ")) if array else ()
        at = m.end()
        if end == "}":
            if at != len(text):
                raise ValueError(f"text after the dictionary in {text!r}")
            return items


def _type_of(value: AttributeValue) -> str:
    return ATTRIBUTE_TYPES[
        "str" if isinstance(value, str) else "int" if isinstance(value, int) else "tuple[int, ...]"
    ]


# -- the timeout ------------------------------------------------------------------------

# The variable, its default and bounds are declared with every other variable
# (environment.py); the native runtime holds the same bounds (common.h), which
# tests/runtime/test_abi.py checks against these.
TIMEOUT_ENV = "XLA_STREAMS_TIMEOUT_S"


__all__ = [
    "ABI_VERSION",
    "BACKENDS",
    "COMPUTE_ATTRIBUTES",
    "COMPUTE_TARGET",
    "DEFAULT_TIMEOUT_S",
    "DONE_ATTRIBUTES",
    "DONE_TARGET",
    "ELEMENT_TYPES",
    "FFI_KINDS",
    "HANDLERS",
    "MAX_TIMEOUT_S",
    "MIN_TIMEOUT_S",
    "PLATFORMS",
    "REDUCTIONS",
    "START_ATTRIBUTES",
    "START_TARGET",
    "TARGETS",
    "TIMEOUT_ENV",
    "Backend",
    "CollectiveCall",
    "parse_attributes",
    "render_attributes",
]
