"""Embedded JAX programs whose GPU compiles are full of async collectives: the small
ones (``embedded.py``) and MaxText's published training steps (``maxtext.py``), named
in ``PROGRAMS``.

Each builder takes the devices of a (compile-only) topology and returns
`(jitted_fn, args)`, where `args` are `jax.ShapeDtypeStruct`s carrying their
shardings, ready for `xla_streams.aot.compile_for_gpu`. jax is imported inside
the builders so that importing this package stays cheap and jax-free.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from xla_streams.programs.builders import Built
from xla_streams.programs.embedded import (
    compute_bound_fsdp,
    fsdp_chain,
    fsdp_scan,
    fsdp_tp_mlp_scan,
    fsdp_tp_remat_scan,
    fsdp_tp_remat_unrolled,
    fsdp_tp_scan,
    fsdp_unrolled,
    gspmd_step,
    large_transformer,
    moe_all_to_all,
    multihost_32,
    ppermute_pipeline,
    ppermute_scan,
    psum_scatter,
    tp_dp_2d,
    transformer_step,
)
from xla_streams.programs.maxtext import llama2_7b_fsdp


@dataclass(frozen=True)
class Program:
    """A named program builder and the topology it needs."""

    name: str
    build: Callable[[Sequence[Any]], Built]
    num_devices: int = 8
    devices_per_host: int = 8
    description: str = ""


def _program(build: Callable[[Sequence[Any]], Built], num_devices: int = 8) -> Program:
    """The Program of a builder: named after it, described by its docstring."""
    return Program(build.__name__, build, num_devices=num_devices, description=build.__doc__ or "")


PROGRAMS: dict[str, Program] = {
    p.name: p
    for p in (
        _program(transformer_step),
        _program(fsdp_unrolled),
        _program(fsdp_scan),
        _program(tp_dp_2d),
        _program(ppermute_pipeline),
        _program(ppermute_scan),
        _program(moe_all_to_all),
        _program(psum_scatter),
        _program(gspmd_step),
        _program(multihost_32, num_devices=32),
        _program(large_transformer),
        _program(fsdp_tp_scan, num_devices=32),
        _program(fsdp_tp_remat_scan, num_devices=32),
        _program(fsdp_tp_remat_unrolled, num_devices=32),
        _program(fsdp_tp_mlp_scan, num_devices=16),
        _program(fsdp_chain),
        _program(compute_bound_fsdp),
        _program(llama2_7b_fsdp),
    )
}
DEFAULT_PROGRAM = "transformer_step"
