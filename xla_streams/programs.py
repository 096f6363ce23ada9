"""Small embedded JAX programs whose GPU compiles are full of async collectives.

Each builder takes the devices of a (compile-only) topology and returns
`(jitted_fn, args)`, where `args` are `jax.ShapeDtypeStruct`s carrying their
shardings, ready for `xla_streams.aot.compile_for_gpu`. jax is imported inside
the builders so that importing this module stays cheap and jax-free.

Sizes are chosen so every collective moves a few MB: XLA then has compute to
hide it behind and keeps it async (a pair with nothing scheduled between
start and done is turned synchronous), while each compile stays a few seconds.
"""

# jax's public API is only partly annotated; its calls are checked at runtime here.
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Built = tuple[Callable[..., Any], tuple[Any, ...]]


@dataclass(frozen=True)
class Program:
    """A named program builder and the topology it needs."""

    name: str
    build: Callable[[Sequence[Any]], Built]
    num_devices: int = 8
    devices_per_host: int = 8
    description: str = ""


def _mesh(devices: Sequence[Any], shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
    import numpy as np
    from jax.sharding import Mesh

    count = 1
    for n in shape:
        count *= n
    if len(devices) < count:
        raise ValueError(f"mesh {shape} needs {count} devices, got {len(devices)}")
    return Mesh(np.array(list(devices)[:count]).reshape(shape), names)


def _abstract(mesh: Any, tree: Any, specs: Any) -> Any:
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


def _sgd_step(loss_fn: Callable[..., Any], lr: float = 1e-2) -> Callable[..., Any]:
    import jax

    def step(params: Any, *batch: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
        return loss, jax.tree.map(lambda p, g: p - lr * g, params, grads)

    return step


# --------------------------------------------------------------------------
# Transformer: FSDP over "data" + Megatron tensor parallel over "model".


def _transformer(
    devices: Sequence[Any],
    *,
    mesh_shape: tuple[int, int] = (2, 4),
    layers: int = 4,
    d_model: int = 4096,
    heads: int = 32,
    d_ff: int = 16384,
    batch: int = 16,
    seq: int = 256,
    scan: bool = False,
    stacked: bool | None = None,
    remat: bool = False,
) -> Built:
    """A transformer training step, FSDP over "data" x TP over "model". With ``stacked``
    (by default, with ``scan``) the layers' weights are stacked along a leading axis,
    and the layers run under ``lax.scan`` or, unrolled, in a loop that indexes the
    stacks; with ``remat`` each layer is under ``jax.checkpoint``."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    mesh = _mesh(devices, mesh_shape, ("data", "model"))
    d_head = d_model // heads
    f32 = jnp.float32
    layer_shapes = {
        "wqkv": ((d_model, 3, heads, d_head), f32),
        "wo": ((heads, d_head, d_model), f32),
        "w1": ((d_model, d_ff), f32),
        "w2": ((d_ff, d_model), f32),
    }
    # FSDP shards the d_model dimension over "data"; heads / d_ff go over "model".
    layer_specs = {
        "wqkv": P("data", None, "model", None),
        "wo": P("model", None, "data"),
        "w1": P("data", "model"),
        "w2": P("model", "data"),
    }
    gather_axis = {"wqkv": 0, "wo": 2, "w1": 0, "w2": 1}
    x_spec = P("data", None, None)

    def rms_norm(x: Any) -> Any:
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)

    def block(p: Any, x: Any) -> Any:
        # FSDP: gather this layer's weight shards just before use.
        w = {
            k: jax.lax.all_gather(v, "data", axis=gather_axis[k], tiled=True) for k, v in p.items()
        }
        h = rms_norm(x)
        qkv = jnp.einsum("bsd,dthe->tbhse", h, w["wqkv"])
        q, k, v = qkv[0], qkv[1], qkv[2]
        logits = jnp.einsum("bhqe,bhke->bhqk", q, k) / jnp.sqrt(f32(d_head))
        causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
        probs = jax.nn.softmax(jnp.where(causal, logits, -1e9), axis=-1)
        attn = jnp.einsum("bhqk,bhke->bhqe", probs, v)
        # Tensor parallel: each "model" shard holds some heads; sum the partial outputs.
        x = x + jax.lax.psum(jnp.einsum("bhse,hed->bsd", attn, w["wo"]), "model")
        h = jax.nn.gelu(rms_norm(x) @ w["w1"])
        return x + jax.lax.psum(h @ w["w2"], "model")

    stacked = scan if stacked is None else stacked
    layer = jax.checkpoint(block) if remat else block

    def local_loss(params: Any, x: Any) -> Any:
        if scan:
            x, _ = jax.lax.scan(lambda x, p: (layer(p, x), None), x, params)
        else:
            for i in range(layers):
                x = layer({k: v[i] for k, v in params.items()} if stacked else params[i], x)
        return jax.lax.psum(jnp.mean(x * x), "data") / mesh_shape[0]

    if stacked:  # one array per weight, its layers stacked along a new leading axis
        shapes: Any = {k: ((layers, *shape), t) for k, (shape, t) in layer_shapes.items()}
        specs: Any = {k: P(None, *spec) for k, spec in layer_specs.items()}
    else:
        shapes, specs = [layer_shapes] * layers, [layer_specs] * layers
    loss = jax.shard_map(local_loss, mesh=mesh, in_specs=(specs, x_spec), out_specs=P())
    fn = jax.jit(_sgd_step(loss), donate_argnums=0)
    params = _abstract(mesh, shapes, specs)
    x = _abstract(mesh, ((batch, seq, d_model), f32), x_spec)
    return fn, (params, x)


def transformer_step(devices: Sequence[Any]) -> Built:
    """The demo program: 4-layer transformer training step, FSDP x TP on a 2x4 mesh."""
    return _transformer(devices)


def multihost_32(devices: Sequence[Any]) -> Built:
    """The transformer step on 32 GPUs, 4 hosts of 8: TP inside a host, FSDP across."""
    return _transformer(devices, mesh_shape=(4, 8), batch=32)


def large_transformer(devices: Sequence[Any]) -> Built:
    """A 40-layer unrolled transformer step: a large module (>20k lines of HLO)."""
    return _transformer(devices, layers=40)


# --------------------------------------------------------------------------
# FSDP MLPs on a 1-D mesh.


def _fsdp(devices: Sequence[Any], *, scan: bool, layers: int, dim: int = 2048) -> Built:
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    n = len(devices)
    mesh = _mesh(devices, (n,), ("fsdp",))
    batch, ff = 128 * n, 2 * dim
    f32 = jnp.float32

    def gather(w: Any) -> Any:
        return jax.lax.all_gather(w, "fsdp", axis=0, tiled=True)

    def layer(x: Any, w: Any) -> Any:
        # Two weights per layer: two gathers (and two reduce-scatters) that can
        # be in flight together, also inside a while body.
        return x + jnp.tanh(x @ gather(w["w1"])) @ gather(w["w2"])

    def local_loss(ws: Any, x: Any) -> Any:
        if scan:
            x, _ = jax.lax.scan(lambda c, w: (layer(c, w), None), x, ws)
        else:
            for w in ws:
                x = layer(x, w)
        return jax.lax.psum(jnp.mean(x * x), "fsdp") / n

    if scan:
        w_tree: Any = {"w1": ((layers, dim, ff), f32), "w2": ((layers, ff, dim), f32)}
        w_spec: Any = {"w1": P(None, "fsdp", None), "w2": P(None, "fsdp", None)}
    else:
        w_tree = [{"w1": ((dim, ff), f32), "w2": ((ff, dim), f32)}] * layers
        w_spec = [{"w1": P("fsdp", None), "w2": P("fsdp", None)}] * layers
    x_spec = P("fsdp", None)
    loss = jax.shard_map(local_loss, mesh=mesh, in_specs=(w_spec, x_spec), out_specs=P())
    fn = jax.jit(_sgd_step(loss), donate_argnums=0)
    return fn, (_abstract(mesh, w_tree, w_spec), _abstract(mesh, ((batch, dim), f32), x_spec))


def fsdp_unrolled(devices: Sequence[Any]) -> Built:
    """Four FSDP MLP layers in a Python loop: all-gather forward, reduce-scatter backward."""
    return _fsdp(devices, scan=False, layers=4)


def fsdp_scan(devices: Sequence[Any]) -> Built:
    """Eight FSDP MLP layers under lax.scan: the collectives sit in while bodies."""
    return _fsdp(devices, scan=True, layers=8)


# --------------------------------------------------------------------------


def tp_dp_2d(devices: Sequence[Any]) -> Built:
    """Megatron MLP under plain jit: tensor parallel over "model", data parallel over "data".

    The partitioner prints its groups in iota form: over the second mesh axis
    `[2,4]<=[8]`, over the first `[4,2]<=[2,4]T(1,0)`.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    mesh = _mesh(devices, (2, 4), ("data", "model"))
    layers, dim, ff, batch = 4, 2048, 8192, 2048
    f32 = jnp.float32
    specs = [{"w1": P(None, "model"), "w2": P("model", None)}] * layers
    shapes = [{"w1": ((dim, ff), f32), "w2": ((ff, dim), f32)}] * layers
    x_spec = P("data", None)

    def loss(params: Any, x: Any) -> Any:
        for p in params:
            x = x + jax.nn.gelu(x @ p["w1"]) @ p["w2"]
        return jnp.mean(x * x)

    fn = jax.jit(_sgd_step(loss), donate_argnums=0)
    return fn, (_abstract(mesh, shapes, specs), _abstract(mesh, ((batch, dim), f32), x_spec))


def psum_scatter(devices: Sequence[Any]) -> Built:
    """Sequence-parallel Megatron MLP: all-gather the sequence in, reduce-scatter it out."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    mesh = _mesh(devices, (2, 4), ("data", "model"))
    layers, dim, ff, batch, seq = 4, 1024, 4096, 8, 512
    f32 = jnp.float32
    specs = [{"w1": P(None, "model"), "w2": P("model", None)}] * layers
    shapes = [{"w1": ((dim, ff), f32), "w2": ((ff, dim), f32)}] * layers
    x_spec = P("data", "model", None)

    def local_loss(params: Any, x: Any) -> Any:
        for p in params:
            full = jax.lax.all_gather(x, "model", axis=1, tiled=True)
            y = jax.nn.gelu(full @ p["w1"]) @ p["w2"]
            x = x + jax.lax.psum_scatter(y, "model", scatter_dimension=1, tiled=True)
        return jax.lax.pmean(jnp.mean(x * x), ("data", "model"))

    loss = jax.shard_map(local_loss, mesh=mesh, in_specs=(specs, x_spec), out_specs=P())
    fn = jax.jit(_sgd_step(loss), donate_argnums=0)
    x = _abstract(mesh, ((batch, seq, dim), f32), x_spec)
    return fn, (_abstract(mesh, shapes, specs), x)


def moe_all_to_all(devices: Sequence[Any]) -> Built:
    """Top-1 mixture of experts, one expert per device: all-to-all dispatch and combine."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    n = len(devices)
    mesh = _mesh(devices, (n,), ("expert",))
    layers, dim, ff, tokens, capacity = 2, 1024, 2048, 1024, 256
    f32 = jnp.float32
    specs = [{"gate": P(), "w1": P("expert"), "w2": P("expert")}] * layers
    shapes = [
        {"gate": ((dim, n), f32), "w1": ((n, dim, ff), f32), "w2": ((n, ff, dim), f32)}
    ] * layers
    x_spec = P("expert", None)

    def moe(p: Any, x: Any) -> Any:
        probs = jax.nn.softmax(x @ p["gate"], axis=-1)
        expert = jnp.argmax(probs, axis=-1)
        onehot = jax.nn.one_hot(expert, n, dtype=f32)
        slot = (jnp.cumsum(onehot, axis=0) - 1.0) * onehot
        dispatch = onehot[:, :, None] * jax.nn.one_hot(slot, capacity, dtype=f32)  # [t, e, c]
        weight = jnp.sum(probs * onehot, axis=-1)
        sent = jnp.einsum("tec,td->ecd", dispatch, x)
        # [experts, capacity, d] -> [sources, capacity, d] for this device's expert.
        got = jax.lax.all_to_all(sent, "expert", split_axis=0, concat_axis=0, tiled=True)
        out = jax.nn.gelu(got @ p["w1"][0]) @ p["w2"][0]
        back = jax.lax.all_to_all(out, "expert", split_axis=0, concat_axis=0, tiled=True)
        return x + weight[:, None] * jnp.einsum("tec,ecd->td", dispatch, back)

    def local_loss(params: Any, x: Any) -> Any:
        for p in params:
            x = moe(p, x)
        return jax.lax.pmean(jnp.mean(x * x), "expert")

    loss = jax.shard_map(local_loss, mesh=mesh, in_specs=(specs, x_spec), out_specs=P())
    fn = jax.jit(_sgd_step(loss), donate_argnums=0)
    x = _abstract(mesh, ((tokens * n, dim), f32), x_spec)
    return fn, (_abstract(mesh, shapes, specs), x)


def _pipeline(devices: Sequence[Any], *, scan: bool) -> Built:
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    n = len(devices)
    mesh = _mesh(devices, (n,), ("stage",))
    micro, mb, dim = 4, 512, 1024
    f32 = jnp.float32
    # Two microbatch streams flow in opposite directions (a bidirectional
    # pipeline), so two permutes with different pairs can be in flight at
    # once. No wrap-around edge: XLA only turns acyclic permutes into send/recv.
    up = [(i, i + 1) for i in range(n - 1)]
    down = [(i + 1, i) for i in range(n - 1)]

    def local_loss(w: Any, xs: Any) -> Any:
        # GPipe schedule: at tick t stage s works on microbatch t - s (t - (n-1-s)
        # going down); permuting the previous tick's output (a loop-carried
        # value, which XLA's p2p pipeliner looks for) brings the neighbour's result.
        stage = jax.lax.axis_index("stage")
        w = w[0]
        xs = xs[0]  # [2, micro, mb, dim]; stream 0 enters at stage 0, stream 1 at n-1

        def tick(carry: Any, t: Any) -> Any:
            prev_up, prev_down, acc = carry
            got_up = jax.lax.ppermute(prev_up, "stage", up)
            got_down = jax.lax.ppermute(prev_down, "stage", down)
            mb_index = jnp.minimum(t, micro - 1)
            out_up = jnp.tanh(jnp.where(stage == 0, xs[0, mb_index], got_up) @ w)
            out_down = jnp.tanh(jnp.where(stage == n - 1, xs[1, mb_index], got_down) @ w.T)
            acc = acc + jnp.where(stage == n - 1, jnp.mean(out_up * out_up), 0.0)
            acc = acc + jnp.where(stage == 0, jnp.mean(out_down * out_down), 0.0)
            return (out_up, out_down, acc), None

        # The carry is per-stage data ("varying" over the mesh axis) from the start.
        zeros = jnp.zeros((mb, dim), f32)
        carry = jax.lax.pcast((zeros, zeros, jnp.zeros((), f32)), "stage", to="varying")
        ticks = micro + n - 1
        if scan:
            carry, _ = jax.lax.scan(tick, carry, jnp.arange(ticks))
        else:
            for t in range(ticks):
                carry, _ = tick(carry, t)
        return jax.lax.psum(carry[2], "stage") / (2 * micro)

    spec = P("stage")
    loss = jax.shard_map(local_loss, mesh=mesh, in_specs=(spec, spec), out_specs=P())
    fn = jax.jit(_sgd_step(loss), donate_argnums=0)
    w = _abstract(mesh, ((n, dim, dim), f32), spec)
    xs = _abstract(mesh, ((n, 2, micro, mb, dim), f32), spec)
    return fn, (w, xs)


def ppermute_pipeline(devices: Sequence[Any]) -> Built:
    """An 8-stage bidirectional GPipe pipeline, ticks unrolled: many collective-permutes."""
    return _pipeline(devices, scan=False)


def ppermute_scan(devices: Sequence[Any]) -> Built:
    """The same pipeline with ticks under lax.scan: collective-permutes in while bodies."""
    return _pipeline(devices, scan=True)


def gspmd_step(devices: Sequence[Any]) -> Built:
    """A plain-jit FSDP x TP MLP step: no shard_map, the partitioner inserts collectives."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = _mesh(devices, (2, 4), ("data", "model"))
    layers, dim, ff, batch = 4, 1024, 4096, 2048
    f32 = jnp.float32
    specs = [{"w1": P("data", "model"), "w2": P("model", "data")}] * layers
    shapes = [{"w1": ((dim, ff), f32), "w2": ((ff, dim), f32)}] * layers
    x_spec = P("data", None)

    def constrain(x: Any, spec: Any) -> Any:
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

    def loss(params: Any, x: Any) -> Any:
        for p in params:
            h = constrain(jax.nn.gelu(x @ p["w1"]), P("data", "model"))
            x = constrain(x + h @ p["w2"], x_spec)
        return jnp.mean(x * x)

    fn = jax.jit(_sgd_step(loss), donate_argnums=0)
    return fn, (_abstract(mesh, shapes, specs), _abstract(mesh, ((batch, dim), f32), x_spec))


# --------------------------------------------------------------------------
# Programs for `xla-streams tune` (xla_streams/tuning/): one where XLA's overlap
# levers pay, one where nothing can overlap.


def _hosts_by_gpus(devices: Sequence[Any]) -> tuple[int, int]:
    """FSDP across hosts of 8 GPUs x tensor parallel inside one (2 x half below 16 GPUs)."""
    return (len(devices) // 8, 8) if len(devices) >= 16 else (2, len(devices) // 2)


def fsdp_tp_scan(devices: Sequence[Any]) -> Built:
    """An 8-layer transformer step under lax.scan on 32 GPUs (4 hosts of 8): FSDP across
    hosts, tensor parallel inside a host. Per layer, the weight all-gathers cross hosts
    (network) while the TP all-reduces stay on NVLink."""
    return _transformer(devices, mesh_shape=_hosts_by_gpus(devices), layers=8, scan=True)


def fsdp_tp_mlp_scan(devices: Sequence[Any]) -> Built:
    """A 6-layer FSDP x TP MLP under lax.scan on 16 GPUs (2 hosts of 8): the shape of
    fsdp_tp_scan, small enough to compile in seconds (the tuner's tests use it)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    n = len(devices)
    hosts = max(n // 8, 1)
    mesh = _mesh(devices, (hosts, n // hosts), ("data", "model"))
    layers, dim, ff, batch, seq = 6, 2048, 8192, 16, 256
    f32 = jnp.float32
    shapes = {"w1": ((layers, dim, ff), f32), "w2": ((layers, ff, dim), f32)}
    specs = {"w1": P(None, "data", "model"), "w2": P(None, "model", "data")}
    x_spec = P("data", None, None)

    def block(x: Any, p: Any) -> Any:
        w1 = jax.lax.all_gather(p["w1"], "data", axis=0, tiled=True)
        w2 = jax.lax.all_gather(p["w2"], "data", axis=1, tiled=True)
        return x + jax.lax.psum(jax.nn.gelu(x @ w1) @ w2, "model"), None

    def local_loss(params: Any, x: Any) -> Any:
        x, _ = jax.lax.scan(block, x, params)
        return jax.lax.psum(jnp.mean(x * x), "data") / hosts

    loss = jax.shard_map(local_loss, mesh=mesh, in_specs=(specs, x_spec), out_specs=P())
    fn = jax.jit(_sgd_step(loss), donate_argnums=0)
    x = _abstract(mesh, ((batch, seq, dim), f32), x_spec)
    return fn, (_abstract(mesh, shapes, specs), x)


def fsdp_chain(devices: Sequence[Any]) -> Built:
    """A dependency chain: one combined FSDP all-gather of every layer's weight feeds
    layer 0, and the one reduce-scatter of the gradient needs the last backward layer.
    No collective has independent work to hide behind."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    n = len(devices)
    mesh = _mesh(devices, (n,), ("fsdp",))
    layers, dim, batch = 4, 2048, 256 * n
    f32 = jnp.float32

    def local_loss(w: Any, x: Any) -> Any:
        full = jax.lax.all_gather(w, "fsdp", axis=1, tiled=True)  # [layers, dim, dim]
        for i in range(layers):
            x = jnp.tanh(x @ full[i])
        return jax.lax.psum(jnp.mean(x * x), "fsdp") / n

    w_spec, x_spec = P(None, "fsdp", None), P("fsdp", None)
    loss = jax.shard_map(local_loss, mesh=mesh, in_specs=(w_spec, x_spec), out_specs=P())
    fn = jax.jit(_sgd_step(loss), donate_argnums=0)
    w = _abstract(mesh, ((layers, dim, dim), f32), w_spec)
    return fn, (w, _abstract(mesh, ((batch, dim), f32), x_spec))


def fsdp_tp_remat_scan(devices: Sequence[Any]) -> Built:
    """fsdp_tp_scan's 8-layer transformer with each layer under jax.checkpoint (recomputed
    in the backward pass), as scanned models usually run; 32 GPUs, 4 hosts of 8."""
    return _transformer(
        devices, mesh_shape=_hosts_by_gpus(devices), layers=8, scan=True, remat=True
    )


def fsdp_tp_remat_unrolled(devices: Sequence[Any]) -> Built:
    """fsdp_tp_remat_scan's unrolled twin: the same model, mesh and stacked weights under
    jax.checkpoint, its 8 layers in a Python loop that indexes the stacks."""
    return _transformer(
        devices, mesh_shape=_hosts_by_gpus(devices), layers=8, stacked=True, remat=True
    )


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
    )
}
DEFAULT_PROGRAM = "transformer_step"


# --------------------------------------------------------------------------
# Published models: MaxText's Llama-2/3 and Mixtral training steps as their published
# runs were configured (tools/predict_published.py compares the simulator with their
# step times). Appended after PROGRAMS so that the source lines the fixtures record
# stay put.


@dataclass(frozen=True)
class Parallelism:
    """How many ways a mesh axis splits, as MaxText's ``ici_*``/``dcn_*_parallelism``
    say it: inside a host (ici) or across hosts (dcn)."""

    data: int = 1
    fsdp: int = 1
    expert: int = 1

    @property
    def devices(self) -> int:
        return self.data * self.fsdp * self.expert


# MaxText's remat policies (MaxText/layers/models.py): the activations each saves for
# the backward pass; everything else is recomputed. "custom" saves LlamaConfig.saved.
REMAT_POLICIES = ("full", "minimal_flash", "save_dot_with_context_except_mlp", "custom")


@dataclass(frozen=True)
class LlamaConfig:
    """A MaxText decoder training step (its ``llama2``/``mistral`` decoder blocks); the
    defaults are the JAX-Toolbox Llama-2 7B run (docs/frameworks/maxtext/README.md: 7B,
    BF16, seq 4096, 2 sequences per GPU, FSDP over the 8 GPUs of a host, Flash attention,
    remat minimal_flash, scan off; dims from MaxText configs/models/llama2-7b.yml)."""

    layers: int = 32
    d_model: int = 4096
    heads: int = 32  # query heads
    kv_heads: int = 32  # fewer than heads: grouped-query attention (Llama-3, Mixtral)
    head_dim: int = 128
    d_ff: int = 11008  # SwiGLU: silu(x W0) * (x W1), then W_out; per expert with experts
    vocab: int = 32000
    experts: int = 0  # 0: a dense MLP; else a top-k mixture of this many SwiGLU MLPs
    experts_per_token: int = 2
    capacity_factor: float = 1.0  # tokens an expert takes per sequence, over an even share
    seq: int = 4096
    batch_per_device: int = 2
    ici: Parallelism = Parallelism(fsdp=8)  # inside a host
    dcn: Parallelism = Parallelism()  # across hosts
    scan_layers: bool = False
    remat_policy: str = "minimal_flash"  # one of REMAT_POLICIES
    saved: tuple[str, ...] = ()  # what remat_policy "custom" keeps on the device
    fp8: bool = False  # MaxText quantization=fp8: the projections' GEMMs in FP8
    weight_dtype: str = "float32"

    @property
    def devices(self) -> int:
        return self.ici.devices * self.dcn.devices

    @property
    def parameters(self) -> int:
        """Every weight of the model (embedding and output layer included), as MaxText
        counts them for its TFLOP/s figure."""
        e, f = self.d_model, self.d_ff
        attention = e * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * e * f * max(self.experts, 1) + (e * self.experts)  # + the router
        return self.layers * (attention + mlp + 2 * e) + 2 * self.vocab * e + e


def llama_train_step(devices: Sequence[Any], config: LlamaConfig | None = None) -> Built:
    """A MaxText-style decoder training step on ``devices`` (``config.devices`` of them,
    host-major): f32 (or ``weight_dtype``) weights sharded on their embedding dimension
    over "fsdp" (and "expert") and cast to bf16 for use, activations sharded on the
    batch over every mesh axis, the mesh built as MaxText's hybrid mesh (each axis the
    hosts' share outside the host's); the embedding as a one-hot matmul
    (``use_iota_embed``), RMSNorm, RoPE, cuDNN flash attention (causal,
    grouped-query when ``kv_heads`` < ``heads``), a SwiGLU MLP or MaxText's capacity-
    bound mixture of experts (its ``dense_matmul``: dispatch and combine einsums over a
    [batch, seq, experts, capacity] mask, the experts sharded over "expert"), untied
    output layer, cross-entropy; each layer under jax.checkpoint with the MaxText remat
    policy; FP8 projections as Flax's ``Fp8DotGeneralOp`` quantizes them (e4m3 inputs,
    e5m2 gradients) with ``fp8``; AdamW (0.9, 0.95, weight decay 0.1) after clipping
    the gradient norm at 1; layers unrolled or under lax.scan (``scan_layers``)."""
    import math

    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    c = config or LlamaConfig()
    if c.remat_policy not in REMAT_POLICIES:
        raise ValueError(f"remat_policy {c.remat_policy!r} is not one of {REMAT_POLICIES}")
    if len(devices) < c.devices:
        raise ValueError(f"the configuration needs {c.devices} devices, got {len(devices)}")
    mesh = _hybrid_mesh(devices, c.ici, c.dcn)
    batch = c.batch_per_device * c.devices
    f32, bf16, wdt = jnp.float32, jnp.bfloat16, jnp.dtype(c.weight_dtype)
    e, h, kv, d, f = c.d_model, c.heads, c.kv_heads, c.head_dim, c.d_ff
    x_ = c.experts
    # MaxText's logical axis rules: "embed" over fsdp and expert, "exp" over expert,
    # "embed_no_exp" over fsdp; heads, mlp and vocab over tensor (1 here).
    embed = ("fsdp", "expert")
    batch_axes = ("data", "fsdp", "expert")
    layer_shapes: dict[str, Any] = {
        "attn_norm": ((e,), wdt),
        "wq": ((e, h, d), wdt),
        "wk": ((e, kv, d), wdt),
        "wv": ((e, kv, d), wdt),
        "wo": ((h, d, e), wdt),
        "mlp_norm": ((e,), wdt),
    }
    layer_specs: dict[str, Any] = {
        "attn_norm": P(None),
        "wq": P(embed, None, None),
        "wk": P(embed, None, None),
        "wv": P(embed, None, None),
        "wo": P(None, None, embed),
        "mlp_norm": P(None),
    }
    if x_:
        layer_shapes |= {
            "gate": ((e, x_), wdt),
            "wi_0": ((x_, e, f), wdt),
            "wi_1": ((x_, e, f), wdt),
            "wo_mlp": ((x_, f, e), wdt),
        }
        layer_specs |= {
            "gate": P(embed, None),
            "wi_0": P("expert", "fsdp", None),
            "wi_1": P("expert", "fsdp", None),
            "wo_mlp": P("expert", None, "fsdp"),
        }
    else:
        layer_shapes |= {"wi_0": ((e, f), wdt), "wi_1": ((e, f), wdt), "wo_mlp": ((f, e), wdt)}
        layer_specs |= {"wi_0": P(embed, None), "wi_1": P(embed, None), "wo_mlp": P(None, embed)}
    if c.scan_layers:  # one array per weight, its layers stacked on a new leading axis
        layers: Any = {k: ((c.layers, *s), t) for k, (s, t) in layer_shapes.items()}
        layer_tree: Any = {k: P(None, *spec) for k, spec in layer_specs.items()}
    else:
        layers, layer_tree = [layer_shapes] * c.layers, [layer_specs] * c.layers
    shapes: Any = {
        "embed": ((c.vocab, e), wdt),
        "layers": layers,
        "final_norm": ((e,), wdt),
        "logits": ((e, c.vocab), wdt),
    }
    specs: Any = {
        "embed": P(None, embed),
        "layers": layer_tree,
        "final_norm": P(None),
        "logits": P(embed, None),
    }
    act = NamedSharding(mesh, P(batch_axes, None, None))
    saved = {
        "full": (),
        "minimal_flash": ("context",),
        "save_dot_with_context_except_mlp": (
            "query_proj", "value_proj", "key_proj", "qkv_proj", "context", "out_proj",
        ),
        "custom": c.saved,
    }[c.remat_policy]  # fmt: skip
    policy = jax.checkpoint_policies.save_only_these_names(*saved)
    if c.remat_policy == "minimal_flash":
        policy = jax.checkpoint_policies.save_from_both_policies(
            jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims, policy
        )

    dense = _fp8_einsum if c.fp8 else _bf16_einsum

    def rms_norm(x: Any, scale: Any) -> Any:
        xf = x.astype(f32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + 1e-5)
        return (y * scale.astype(f32)).astype(bf16)

    def rope(x: Any) -> Any:
        half = d // 2
        inverse = 1.0 / (10000.0 ** (jnp.arange(half, dtype=f32) / half))
        angle = jnp.arange(c.seq, dtype=f32)[None, :, None, None] * inverse
        sin, cos = jnp.sin(angle), jnp.cos(angle)
        x1, x2 = jnp.split(x.astype(f32), 2, axis=-1)
        return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(bf16)

    def mlp(p: Any, y: Any) -> Any:
        gate = checkpoint_name(dense("bse,ef->bsf", y, p["wi_0"]), "mlpwi_0")
        up = checkpoint_name(dense("bse,ef->bsf", y, p["wi_1"]), "mlpwi_1")
        return checkpoint_name(dense("bsf,fe->bse", jax.nn.silu(gate) * up, p["wo_mlp"]), "mlpwo")

    def mixture(p: Any, y: Any) -> Any:
        # MaxText MoeBlock.dense_matmul with capacity_factor > 0 (MaxText/layers/linears.py),
        # per device: each device routes its own tokens and an all-to-all over "expert"
        # brings every expert its tokens, the partition that einsum asks for (jax 0.12's
        # partitioner, left to MaxText's sharding constraints, gathers the global batch).
        def local(y: Any, router: Any, wi_0: Any, wi_1: Any, wo: Any) -> Any:
            b, s, k = y.shape[0], y.shape[1], c.experts_per_token
            capacity = int(max(math.ceil(s * k / x_) * c.capacity_factor, c.capacity_factor))
            logits = jnp.einsum("bse,ex->bsx", y, router.astype(bf16))
            probs = jax.nn.softmax(logits.astype(f32), axis=-1).astype(bf16)
            _, top = jax.lax.top_k(probs, k)
            mask = jax.nn.one_hot(top, x_, dtype=jnp.int32)  # [b, s, k, x]
            fused = mask.reshape(b, s * k, x_)
            count = jnp.cumsum(fused, axis=1)  # the token's place in its expert's queue
            kept = mask * (count.reshape(b, s, k, x_) <= capacity)
            routed = jnp.sum(kept, axis=2)  # [b, s, x]: 1 where the expert takes the token
            position = jnp.sum((fused * count).reshape(b, s, k, x_), axis=2) * routed
            slot = jax.nn.one_hot(position, capacity + 1, dtype=jnp.int32)[..., 1:]
            combine = (probs * routed)[..., None] * slot  # [b, s, x, capacity]
            dispatch = combine.astype(bool).astype(bf16)
            sent = jnp.einsum("bsm,bsxc->xbcm", y, dispatch)
            got = jax.lax.all_to_all(sent, "expert", 0, 1, tiled=True)  # [x / ep, b * ep, ...]
            w0, w1, w2 = (
                jax.lax.all_gather(w.astype(bf16), "fsdp", axis=axis, tiled=True)
                for w, axis in ((wi_0, 1), (wi_1, 1), (wo, 2))
            )
            gate = checkpoint_name(jnp.einsum("xbcm,xmh->xbch", got, w0), "mlpwi_0")
            up = checkpoint_name(jnp.einsum("xbcm,xmh->xbch", got, w1), "mlpwi_1")
            out = checkpoint_name(jnp.einsum("xbch,xhm->xbcm", jax.nn.silu(gate) * up, w2), "mlpwo")
            back = jax.lax.all_to_all(out, "expert", 1, 0, tiled=True)  # [x, b, capacity, m]
            return jnp.einsum("xbcm,bsxc->bsm", back, combine)

        tokens = P(batch_axes, None, None)
        experts_in, experts_out = P("expert", "fsdp", None), P("expert", None, "fsdp")
        return jax.shard_map(
            local,
            mesh=mesh,
            in_specs=(tokens, P(), experts_in, experts_in, experts_out),
            out_specs=tokens,
        )(y, p["gate"], p["wi_0"], p["wi_1"], p["wo_mlp"])

    def decoder_layer(p: Any, x: Any) -> Any:
        y = rms_norm(x, p["attn_norm"])
        q = checkpoint_name(dense("bse,ehd->bshd", y, p["wq"]), "query_proj")
        k = checkpoint_name(dense("bse,ehd->bshd", y, p["wk"]), "key_proj")
        v = checkpoint_name(dense("bse,ehd->bshd", y, p["wv"]), "value_proj")
        context = jax.nn.dot_product_attention(
            rope(q), rope(k), v, is_causal=True, implementation="cudnn"
        )
        context = checkpoint_name(context, "context")
        attention = checkpoint_name(dense("bshd,hde->bse", context, p["wo"]), "out_proj")
        x = jax.lax.with_sharding_constraint(x + attention, act)
        y = rms_norm(x, p["mlp_norm"])
        return jax.lax.with_sharding_constraint(x + (mixture if x_ else mlp)(p, y), act)

    layer = jax.checkpoint(decoder_layer, policy=policy, prevent_cse=not c.scan_layers)

    def loss_fn(params: Any, tokens: Any, targets: Any) -> Any:
        # MaxText's use_iota_embed=true (every published GPU run sets it): a one-hot matmul.
        one_hot = (tokens[..., None] == jax.lax.iota(jnp.int32, c.vocab)).astype(bf16)
        x = jax.lax.with_sharding_constraint(one_hot @ params["embed"].astype(bf16), act)
        if c.scan_layers:
            x, _ = jax.lax.scan(lambda x, p: (layer(p, x), None), x, params["layers"])
        else:
            for p in params["layers"]:
                x = layer(p, x)
        x = rms_norm(x, params["final_norm"])
        # MaxText does not quantize the output layer.
        logits = jnp.einsum("bse,ev->bsv", x, params["logits"].astype(bf16)).astype(f32)
        one_hot = jax.nn.one_hot(targets, c.vocab, dtype=f32)
        return -jnp.mean(jnp.sum(one_hot * jax.nn.log_softmax(logits, axis=-1), axis=-1))

    b1, b2, eps, weight_decay, lr = 0.9, 0.95, 1e-8, 0.1, 3e-5

    def train_step(params: Any, opt: Any, tokens: Any, targets: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
        norm = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(f32))) for g in jax.tree.leaves(grads)))
        clip = jnp.minimum(1.0, 1.0 / (norm + 1e-6))
        count = opt["count"] + 1
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * clip * g, opt["mu"], grads)
        nu = jax.tree.map(lambda n, g: b2 * n + (1 - b2) * jnp.square(clip * g), opt["nu"], grads)
        c1 = 1 - b1 ** count.astype(f32)
        c2 = 1 - b2 ** count.astype(f32)
        new = jax.tree.map(
            lambda w, m, n: (
                w - lr * (m / c1 / (jnp.sqrt(n / c2) + eps) + weight_decay * w)
            ).astype(w.dtype),
            params,
            mu,
            nu,
        )
        return loss, new, {"mu": mu, "nu": nu, "count": count}

    params = _abstract(mesh, shapes, specs)
    replicated = NamedSharding(mesh, P())
    opt = {
        "mu": params,
        "nu": params,
        "count": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
    }
    kept = jax.tree.map(lambda a: a.sharding, (params, opt))
    fn = jax.jit(train_step, out_shardings=(replicated, *kept), donate_argnums=(0, 1))
    tokens = _abstract(mesh, ((batch, c.seq), jnp.int32), P(batch_axes, None))
    return fn, (params, opt, tokens, tokens)


def _hybrid_mesh(devices: Sequence[Any], ici: Parallelism, dcn: Parallelism) -> Any:
    """MaxText's hybrid mesh over host-major ``devices`` (mesh_utils.
    create_hybrid_device_mesh): axes data, fsdp, expert, each the hosts' share (dcn)
    outside the host's (ici)."""
    import numpy as np
    from jax.sharding import Mesh

    names = ("data", "fsdp", "expert")
    outer = [getattr(dcn, n) for n in names]
    inner = [getattr(ici, n) for n in names]
    count = ici.devices * dcn.devices
    grid = np.array(list(devices)[:count]).reshape(*outer, *inner)
    grid = grid.transpose(0, 3, 1, 4, 2, 5).reshape(
        [o * i for o, i in zip(outer, inner, strict=True)]
    )
    return Mesh(grid, names)


def _bf16_einsum(subscripts: str, x: Any, w: Any) -> Any:
    import jax.numpy as jnp

    return jnp.einsum(subscripts, x, w.astype(jnp.bfloat16))


def _fp8_einsum(subscripts: str, x: Any, w: Any) -> Any:
    """``x`` and ``w`` through an e4m3 quantize-dequantize and the gradient of the result
    through an e5m2 one, as Flax's Fp8DotGeneralOp does (its delayed scaling takes the
    scale from an amax history; here the tensor's own amax, the same reduction): XLA
    rewrites the pattern into FP8 cuBLASLt GEMMs, forward and backward."""
    import jax
    import jax.numpy as jnp

    e4m3, e5m2 = jnp.float8_e4m3fn, jnp.float8_e5m2

    @jax.custom_vjp
    def quantized(t: Any) -> Any:  # the gradient passes straight through
        return _quantize(t, e4m3)

    quantized.defvjp(lambda t: (_quantize(t, e4m3), None), lambda _, g: (g,))

    @jax.custom_vjp
    def gradient_quantized(y: Any) -> Any:
        return y

    gradient_quantized.defvjp(lambda y: (y, None), lambda _, g: (_quantize(g, e5m2),))
    bf16 = jnp.bfloat16
    return gradient_quantized(
        jnp.einsum(subscripts, quantized(x.astype(bf16)), quantized(w.astype(bf16)))
    )


def _quantize(x: Any, dtype: Any) -> Any:
    """``x`` (bf16) rounded to ``dtype`` under a per-tensor scale, back in bf16."""
    import jax
    import jax.numpy as jnp

    f32, top = jnp.float32, float(jnp.finfo(dtype).max)
    scale = jax.lax.stop_gradient(jnp.maximum(jnp.max(jnp.abs(x)).astype(f32) / top, 1e-12))
    q = jnp.clip(x.astype(f32) / scale, -top, top).astype(dtype)
    return q.astype(jnp.bfloat16) * scale.astype(jnp.bfloat16)


def llama2_7b_fsdp(devices: Sequence[Any]) -> Built:
    """MaxText's Llama-2 7B training step as published on 8 H100s: 32 layers, BF16,
    seq 4096, 2 sequences per GPU, FSDP 8, cuDNN flash attention, minimal_flash remat."""
    return llama_train_step(devices)


PROGRAMS["llama2_7b_fsdp"] = _program(llama2_7b_fsdp)
