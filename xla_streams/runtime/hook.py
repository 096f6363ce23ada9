"""Run the ffi-mode pipeline inside XLA's compile (the compile-hook glue).

    from xla_streams.runtime import hook
    hook.install(streams=4)            # CPU: asyncify ... lower-to-ffi{backend=host}
    jax.jit(f)(...)                    # collectives now run on the host runtime

:func:`transform_module` is the hook itself and usable from any registration
(the plugin's ffi mode): serialized ``HloModuleProto`` in, changed proto or
None out (:mod:`xla_streams.xla_module` turns the proto into text we can read;
its device assignment also gives the device of each logical id, which
lower-to-ffi{backend=cuda} passes to the CUDA runtime).
"""

from __future__ import annotations

import re

from xla_streams.runtime import Backend, register
from xla_streams.xla_module import device_assignment, module_text, to_proto

HOOK_NAME = "xla_streams_ffi"


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


def transform_text(text: str, spec: str, devices: tuple[int, ...] = ()) -> str | None:
    """Run pipeline ``spec`` on a module's text; the new text, or None if nothing was lowered.

    ``{devices}`` in ``spec`` becomes the module's device ids (``:``-separated).
    """
    from xla_streams.hlo import parse_module
    from xla_streams.pipeline import Compilation, PassManager

    if not _COLLECTIVE.search(text):
        return None
    spec = spec.replace("{devices}", ":".join(map(str, devices)))
    parsed = parse_module(text)
    PassManager.from_spec(spec).run(Compilation(parsed))
    out = parsed.print()
    return out if "xla_streams_start" in out else None


def transform_module(serialized: bytes, spec: str) -> bytes | None:
    """The compile hook: run ``spec`` on a serialized module; the result, or None if unchanged."""
    _, text = module_text(serialized)
    assignment = device_assignment(serialized)
    out = transform_text(text, spec, assignment.device_ids if assignment else ())
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
