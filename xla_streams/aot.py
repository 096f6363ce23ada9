"""Compile JAX programs for NVIDIA GPUs on a machine without one (deviceless AOT).

XLA's GPU compiler runs against a compile-only topology built from a
GpuTargetConfigProto, so `compiled.as_text()` is the real scheduled GPU HLO.
jax is imported inside the functions: the offline CLI imports this package
on machines where jax (or its CUDA plugin) is absent.
"""

from __future__ import annotations

import glob
import importlib.resources
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from xla_streams import jax_compat

# GpuTargetConfigProto text of each GPU we compile for without one (xla_streams/targets/).
GPU_CONFIGS: dict[str, str] = {
    "h100": "h100_sxm.txtpb",
    "h200": "h200_sxm.txtpb",
    "a100": "a100_sxm_40.txtpb",
    "b200": "b200.txtpb",
}

# Compiler options that make XLA write the optimized module as text. Pass
# regex is empty so only the final after-optimizations module is written
# (plus the compiler's own side files, which are ignored).
_DUMP_OPTIONS: dict[str, Any] = {
    "xla_dump_hlo_as_text": True,
    "xla_dump_hlo_as_proto": False,
    "xla_dump_hlo_pass_re": "",
}


class GpuAotUnavailable(RuntimeError):
    """The deviceless GPU compiler (the `gpu-aot` extra) is not usable here."""


@dataclass(frozen=True)
class CompiledModule:
    """The scheduled GPU module in the two text forms XLA prints, and XLA's own
    schedule dump (its estimate of every instruction's time) when asked for."""

    as_text: str
    dump_text: str
    schedule_text: str = ""  # <module>.schedule.txt: read by simulate/xla_estimate.py


def target_config(target: str = "h100") -> str:
    """The GpuTargetConfigProto text for `target` (a key of GPU_CONFIGS)."""
    try:
        name = GPU_CONFIGS[target]
    except KeyError:
        raise ValueError(f"unknown GPU target {target!r}; known: {sorted(GPU_CONFIGS)}") from None
    return (importlib.resources.files("xla_streams") / "targets" / name).read_text()


def _require_gpu_aot() -> None:
    if jax_compat.cuda_plugin_module() is None:
        raise GpuAotUnavailable(
            "deviceless GPU compile needs JAX's CUDA plugin: "
            'pip install "xla-streams[gpu-aot]" (jax[cuda12]), or jax[cuda13]'
        )
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms != "cpu":
        # With CUDA in JAX_PLATFORMS jax would try to open real GPUs and fail
        # (or silently use them); the compile-only client needs none.
        raise GpuAotUnavailable(
            f"deviceless GPU compile needs JAX_PLATFORMS=cpu (got {platforms!r})"
        )


def topology_shape(
    num_devices: int, devices_per_host: int = 8, hosts_per_domain: int | None = None
) -> str:
    """The PJRT topology string ``<partitions>x<hosts per partition>x<devices per host>``
    of ``num_devices`` GPUs, ``devices_per_host`` per host, ``hosts_per_domain`` hosts per
    scale-up (NVLink) domain.

    XLA takes a partition for one NVLink domain (its collective domain assignment and
    scale-up overlap limit), and a real job has one partition per NVLink fabric, else
    one per host: an H100/H200 (HGX) cluster is ``hosts_per_domain=1`` (``Hx1x8``), a
    GB200 NVL72 rack 18 hosts of 4 GPUs. None puts every host in one domain
    (``1xHxD``), the shape this module always built: the recorded fixtures are compiled
    on it. Raises ValueError for counts that do not divide."""
    if num_devices <= 0 or devices_per_host <= 0 or num_devices % devices_per_host:
        raise ValueError(
            f"num_devices={num_devices} is not a positive multiple of "
            f"devices_per_host={devices_per_host}"
        )
    hosts = num_devices // devices_per_host
    per_domain = hosts if hosts_per_domain is None else hosts_per_domain
    if per_domain <= 0 or hosts % per_domain:
        raise ValueError(
            f"{hosts} host(s) do not split into NVLink domains of {per_domain} host(s)"
        )
    return f"{hosts // per_domain}x{per_domain}x{devices_per_host}"


def gpu_topology(
    target: str = "h100",
    num_devices: int = 8,
    devices_per_host: int = 8,
    hosts_per_domain: int | None = None,
) -> Any:
    """A compile-only CUDA topology of `num_devices` GPUs, `devices_per_host` per process,
    `hosts_per_domain` hosts per NVLink domain (:func:`topology_shape`; None: all in one).

    Device ids and process indices are host-major in every shape: device d is on
    host d // devices_per_host.
    """
    _require_gpu_aot()
    shape = topology_shape(num_devices, devices_per_host, hosts_per_domain)
    from jax.experimental import topologies

    return topologies.get_topology_desc(
        platform="cuda",
        topology_name="",
        target_config=target_config(target),
        topology=shape,
    )


@contextmanager
def without_source_locations() -> Iterator[None]:
    """Compile with no source locations in the HLO metadata (no ``stack_frame_id``, no
    stack frame tables): the modules then depend on what the programs compute, not on
    where their code lives nor on its line numbers (``jax_traceback_in_locations_limit``
    0: no frame of the traceback is kept)."""
    # jax.config's options are dynamic attributes: typed as Any for strict mypy.
    config: Any = importlib.import_module("jax").config
    previous = config.jax_traceback_in_locations_limit
    config.update("jax_traceback_in_locations_limit", 0)
    try:
        yield
    finally:
        config.update("jax_traceback_in_locations_limit", previous)


def _read_dump(dump_dir: str, pattern: str) -> str:
    found = sorted(glob.glob(os.path.join(dump_dir, pattern)))
    if len(found) != 1:
        raise RuntimeError(f"expected one {pattern} in the XLA dump, found {len(found)}")
    with open(found[0], encoding="utf-8") as f:
        return f.read()


def compile_for_gpu(
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    compiler_options: Mapping[str, Any] | None = None,
    dump: bool = True,
    schedule: bool = False,
) -> CompiledModule:
    """Lower and compile `fn(*args)` with XLA's GPU compiler, deviceless.

    `fn` is usually `jax.jit`-wrapped; `args` are abstract values
    (`jax.ShapeDtypeStruct` with shardings over devices of `gpu_topology()`),
    which select the compile-only client. `compiler_options` are XLA
    DebugOptions fields. With `dump`, the after-optimizations module XLA
    writes to its dump directory is returned as `dump_text` (this form prints
    wrapped collectives as `async-start(...), calls=`); otherwise it is "".
    With `schedule`, the latency-hiding scheduler's dump is `schedule_text`.
    """
    _require_gpu_aot()
    import jax

    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    lowered = jitted.lower(*args)
    options = dict(compiler_options or {})
    if not (dump or schedule):
        return CompiledModule(as_text=lowered.compile(options).as_text(), dump_text="")
    with tempfile.TemporaryDirectory(prefix="xla_streams_dump_") as dump_dir:
        options.update(_DUMP_OPTIONS)
        options["xla_dump_to"] = dump_dir
        options["xla_dump_latency_hiding_schedule"] = schedule
        compiled = lowered.compile(options)
        return CompiledModule(
            as_text=compiled.as_text(),
            dump_text=_read_dump(dump_dir, "*after_optimizations.txt") if dump else "",
            schedule_text=_read_dump(dump_dir, "*.schedule.txt") if schedule else "",
        )
