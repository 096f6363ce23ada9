"""A collective of the ffi runtime called from a JAX program by hand: the start and
done custom calls of one :class:`~xla_streams.runtime.abi.CollectiveCall`, with the
operands, results and aliasing lower-to-ffi writes into HLO (:mod:`.abi` says what
each one is). For programs that call the runtime without the plugin's lowering:
``tools/gpu_check.py``, the tests and the emulator's harnesses.

::

    from xla_streams.runtime import calls
    call = abi.CollectiveCall(op_id=0, name="sum", kind="all-reduce", stream=0, ...)
    (out,) = calls.collective(call, [x])                       # the CUDA backend
    (out,) = calls.collective(call, [x], ids=(replica, partition))  # the host backend

Importing it does not import JAX (a tool imports it at its top and may never call it).
"""

# jax's public API is only partly annotated; its calls are checked when they run.
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from xla_streams.runtime import ffi_attributes
from xla_streams.runtime.abi import DONE_TARGET, START_TARGET, CollectiveCall


def start(
    call: CollectiveCall,
    operands: Sequence[Any],
    results: Sequence[Any],
    *,
    ids: Sequence[Any] = (),
    alias_operands: bool = False,
) -> list[Any]:
    """The start of ``call`` on ``operands``, giving arrays of the shapes and types of
    ``results`` (``jax.ShapeDtypeStruct``). ``ids``: on the host backend, the device's
    replica and partition ids (``u32[]``), which the CUDA backend does not take.
    ``alias_operands``: result i shares operand i's buffer, as XLA may make it (the
    lowering never asks for it)."""
    import jax

    aliases = {i: i for i in range(len(results))} if alias_operands else None
    started = jax.ffi.ffi_call(
        START_TARGET, list(results), has_side_effect=True, input_output_aliases=aliases
    )
    return list(started(*operands, *ids, **ffi_attributes(call.start_attributes())))


def done(
    call: CollectiveCall, started: Sequence[Any], operands: Sequence[Any], *after: Any
) -> list[Any]:
    """The done of ``call``: the results of its start ``started`` (each aliased to the
    done's result of the same place), once the collective on ``operands`` is done.
    ``after``: values the done must wait for (more operands, which it does not read)."""
    import jax

    results = [jax.ShapeDtypeStruct(s.shape, s.dtype) for s in started]
    finish = jax.ffi.ffi_call(
        DONE_TARGET,
        results,
        has_side_effect=True,
        input_output_aliases={i: i for i in range(len(results))},
    )
    return list(finish(*started, *operands, *after, **ffi_attributes(call.done_attributes())))


def collective(
    call: CollectiveCall,
    operands: Sequence[Any],
    results: Sequence[Any] | None = None,
    *,
    ids: Sequence[Any] = (),
    alias_operands: bool = False,
) -> list[Any]:
    """The start of ``call`` and its done at once; ``results`` default to the operands'
    shapes and types (an all-reduce, a permute)."""
    import jax

    if results is None:
        results = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in operands]
    started = start(call, operands, results, ids=ids, alias_operands=alias_operands)
    return done(call, started, operands)


__all__ = ["collective", "done", "start"]
