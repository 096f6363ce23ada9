"""Run the ffi-mode pipeline inside XLA's compile (the compile-hook glue).

    from xla_streams.runtime import hook
    hook.install(streams=4)            # CPU: asyncify ... lower-to-ffi{backend=host}
    jax.jit(f)(...)                    # collectives now run on the host runtime

:func:`transform_module` is the hook itself and usable from any registration
(the plugin's ffi mode): serialized ``HloModuleProto`` in, changed proto or
None out. Two things the printed module lacks are recovered from the proto's
``device_assignment`` (field 15): ``replica_count``/``num_partitions``, which
find-async-pairs needs to turn replica groups into devices (XLA's printer
leaves them out of the header), and the device of each logical id, which
lower-to-ffi{backend=cuda} passes to the CUDA runtime.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any

from xla_streams.runtime import Backend, register

HOOK_NAME = "xla_streams_ffi"


@dataclass(frozen=True)
class ModuleConfig:
    """What the module's device assignment says."""

    replica_count: int
    num_partitions: int
    device_ids: tuple[int, ...]  # device of logical id replica * num_partitions + partition


def pipeline_spec(
    backend: Backend = "host", streams: int = 4, policy: str = "interval", devices: str = ""
) -> str:
    """The ffi-mode pipeline: CPU modules need their collectives split first."""
    assign = f"assign-streams{{streams={streams},policy={policy}}}"
    if backend == "host":
        return f"asyncify,find-async-pairs,{assign},verify-streams,lower-to-ffi{{backend=host}}"
    lower = (
        f"lower-to-ffi{{backend=cuda,devices={devices}}}"
        if devices
        else "lower-to-ffi{backend=cuda}"
    )
    return f"find-async-pairs,{assign},verify-streams,{lower}"


def module_config(serialized: bytes) -> ModuleConfig | None:
    """The device assignment of a serialized HloModuleProto, if it has one."""
    for field, value in _fields(serialized):
        if field == 15 and isinstance(value, bytes):
            replicas, partitions, devices = 1, 1, []
            for f, v in _fields(value):
                if f == 1 and isinstance(v, int):
                    replicas = v
                elif f == 2 and isinstance(v, int):
                    partitions = v
                elif f == 3 and isinstance(v, bytes):
                    devices.append(_int64s(v))
            ids = tuple(
                devices[p][r]
                for r in range(replicas)
                for p in range(partitions)
                if p < len(devices) and r < len(devices[p])
            )
            if len(ids) != replicas * partitions:
                ids = ()
            return ModuleConfig(replicas, partitions, ids)
    return None


def with_config(text: str, config: ModuleConfig | None) -> str:
    """The module text with ``replica_count``/``num_partitions`` in its header."""
    if config is None:
        return text
    head, sep, rest = text.partition("\n")
    extra = ""
    if not re.search(r"[ ,]replica_count=", head) and config.replica_count != 1:
        extra += f", replica_count={config.replica_count}"
    if not re.search(r"[ ,]num_partitions=", head) and config.num_partitions != 1:
        extra += f", num_partitions={config.num_partitions}"
    if not extra:
        return text
    name_end = head.find(",")
    head = head + extra if name_end < 0 else head[:name_end] + extra + head[name_end:]
    return head + sep + rest


def transform_text(text: str, spec: str, config: ModuleConfig | None = None) -> str | None:
    """Run pipeline ``spec`` on a module's text; the new text, or None if nothing was lowered.

    ``{devices}`` in ``spec`` becomes the module's device ids (``:``-separated).
    """
    from xla_streams.hlo import parse_module
    from xla_streams.pipeline import Compilation, PassManager

    if not _COLLECTIVE.search(text):
        return None
    if "{devices}" in spec:
        devices = ":".join(map(str, config.device_ids)) if config else ""
        spec = spec.replace("{devices}", devices)
    parsed = parse_module(with_config(text, config))
    PassManager.from_spec(spec).run(Compilation(parsed))
    out = parsed.print()
    return out if "xla_streams_start" in out else None


def module_text(serialized: bytes) -> str:
    """A serialized module as text XLA reads back exactly (large constants in full)."""
    hlo = _hlo()
    options = hlo.HloPrintOptions()
    options.print_large_constants = True
    return str(hlo.HloModule.from_serialized_hlo_module_proto(serialized).to_string(options))


def to_proto(text: str) -> bytes:
    return bytes(_hlo().hlo_module_from_text(text).as_serialized_hlo_module_proto())


def transform_module(serialized: bytes, spec: str) -> bytes | None:
    """The compile hook: run ``spec`` on a serialized module; the result, or None if unchanged."""
    out = transform_text(module_text(serialized), spec, module_config(serialized))
    return None if out is None else to_proto(out)


def install(
    streams: int = 4,
    policy: str = "interval",
    *,
    backend: Backend = "host",
    spec: str | None = None,
) -> str:
    """Register the runtime and a POST_SCHEDULER hook running the ffi pipeline; returns the spec.

    ``backend=host`` hooks XLA:CPU, ``backend=cuda`` XLA:GPU (whose device
    assignment is filled in per module). Errors in the hook fail the compile.
    """
    from jax.extend.xla import PipelineStage, register_hlo_module_transformation

    register(backend)
    if spec is None:
        spec = pipeline_spec(backend, streams, policy, "{devices}" if backend == "cuda" else "")
    chosen = spec

    def callback(serialized: bytes) -> bytes | None:
        return transform_module(serialized, chosen)

    platform = "cpu" if backend == "host" else "cuda"
    register_hlo_module_transformation(
        callback, name=HOOK_NAME, stage=PipelineStage.POST_SCHEDULER, platforms=[platform]
    )
    return chosen


_COLLECTIVE = re.compile(
    r" (?:all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\("
    r"|async-start\("
)


def _hlo() -> Any:
    return importlib.import_module("jaxlib._hlo")


def _varint(data: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, i


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """Top-level (field number, value) of a protobuf message; varints and bytes only."""
    fields: list[tuple[int, int | bytes]] = []
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
            fields.append((field, value))
        elif wire == 2:
            length, i = _varint(data, i)
            fields.append((field, data[i : i + length]))
            i += length
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:  # groups are not used by HloModuleProto
            break
    return fields


def _int64s(message: bytes) -> list[int]:
    """The repeated int64 field 1 of a message, packed or not."""
    values = []
    for field, value in _fields(message):
        if field != 1:
            continue
        if isinstance(value, int):
            values.append(value)
        else:
            i = 0
            while i < len(value):
                v, i = _varint(value, i)
                values.append(v)
    return values
