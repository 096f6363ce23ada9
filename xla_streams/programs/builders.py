"""What the program builders share: what a builder returns (``Built``), a device mesh,
sharded abstract arguments, and a plain SGD training step."""

# jax's public API is only partly annotated; its calls are checked at runtime here.
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

# A builder's result: the jitted function and its abstract, sharded arguments.
Built = tuple[Callable[..., Any], tuple[Any, ...]]


def device_mesh(devices: Sequence[Any], shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
    import numpy as np
    from jax.sharding import Mesh

    count = 1
    for n in shape:
        count *= n
    if len(devices) < count:
        raise ValueError(f"mesh {shape} needs {count} devices, got {len(devices)}")
    return Mesh(np.array(list(devices)[:count]).reshape(shape), names)


def sharded_structs(mesh: Any, tree: Any, specs: Any) -> Any:
    """ShapeDtypeStructs for a pytree of (shape, dtype) leaves, sharded by `specs`."""
    import jax
    from jax.sharding import NamedSharding

    return jax.tree.map(
        lambda leaf, spec: jax.ShapeDtypeStruct(
            leaf[0], leaf[1], sharding=NamedSharding(mesh, spec)
        ),
        tree,
        specs,
        is_leaf=lambda x: isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], tuple),
    )


def sgd_step(loss_fn: Callable[..., Any], lr: float = 1e-2) -> Callable[..., Any]:
    import jax

    def step(params: Any, *batch: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
        return loss, jax.tree.map(lambda p, g: p - lr * g, params, grads)

    return step
