"""The small embedded programs: transformer steps, FSDP MLPs, tensor and data
parallelism, pipelines, mixtures of experts, and the 32-GPU scan models.

Sizes are chosen so every collective moves a few MB: XLA then has compute to
hide it behind and keeps it async (a pair with nothing scheduled between
start and done is turned synchronous), while each compile stays a few seconds.
"""

# jax's public API is only partly annotated; its calls are checked at runtime here.
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from xla_streams.programs.builders import Built, device_mesh, sgd_step, sharded_structs

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
    dtype: str = "float32",
) -> Built:
    """A transformer training step, FSDP over "data" x TP over "model", its weights and
    activations of ``dtype``. With ``stacked`` (by default, with ``scan``) the layers'
    weights are stacked along a leading axis, and the layers run under ``lax.scan`` or,
    unrolled, in a loop that indexes the stacks; with ``remat`` each layer is under
    ``jax.checkpoint``."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    mesh = device_mesh(devices, mesh_shape, ("data", "model"))
    d_head = d_model // heads
    dt = getattr(jnp, dtype)
    layer_shapes = {
        "wqkv": ((d_model, 3, heads, d_head), dt),
        "wo": ((heads, d_head, d_model), dt),
        "w1": ((d_model, d_ff), dt),
        "w2": ((d_ff, d_model), dt),
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
        logits = jnp.einsum("bhqe,bhke->bhqk", q, k) / jnp.sqrt(dt(d_head))
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
    fn = jax.jit(sgd_step(loss), donate_argnums=0)
    params = sharded_structs(mesh, shapes, specs)
    x = sharded_structs(mesh, ((batch, seq, d_model), dt), x_spec)
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
    mesh = device_mesh(devices, (n,), ("fsdp",))
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
    fn = jax.jit(sgd_step(loss), donate_argnums=0)
    return fn, (
        sharded_structs(mesh, w_tree, w_spec),
        sharded_structs(mesh, ((batch, dim), f32), x_spec),
    )


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

    mesh = device_mesh(devices, (2, 4), ("data", "model"))
    layers, dim, ff, batch = 4, 2048, 8192, 2048
    f32 = jnp.float32
    specs = [{"w1": P(None, "model"), "w2": P("model", None)}] * layers
    shapes = [{"w1": ((dim, ff), f32), "w2": ((ff, dim), f32)}] * layers
    x_spec = P("data", None)

    def loss(params: Any, x: Any) -> Any:
        for p in params:
            x = x + jax.nn.gelu(x @ p["w1"]) @ p["w2"]
        return jnp.mean(x * x)

    fn = jax.jit(sgd_step(loss), donate_argnums=0)
    return fn, (
        sharded_structs(mesh, shapes, specs),
        sharded_structs(mesh, ((batch, dim), f32), x_spec),
    )


def psum_scatter(devices: Sequence[Any]) -> Built:
    """Sequence-parallel Megatron MLP: all-gather the sequence in, reduce-scatter it out."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    mesh = device_mesh(devices, (2, 4), ("data", "model"))
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
    fn = jax.jit(sgd_step(loss), donate_argnums=0)
    x = sharded_structs(mesh, ((batch, seq, dim), f32), x_spec)
    return fn, (sharded_structs(mesh, shapes, specs), x)


def moe_all_to_all(devices: Sequence[Any]) -> Built:
    """Top-1 mixture of experts, one expert per device: all-to-all dispatch and combine."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    n = len(devices)
    mesh = device_mesh(devices, (n,), ("expert",))
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
    fn = jax.jit(sgd_step(loss), donate_argnums=0)
    x = sharded_structs(mesh, ((tokens * n, dim), f32), x_spec)
    return fn, (sharded_structs(mesh, shapes, specs), x)


def _pipeline(devices: Sequence[Any], *, scan: bool) -> Built:
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    n = len(devices)
    mesh = device_mesh(devices, (n,), ("stage",))
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
    fn = jax.jit(sgd_step(loss), donate_argnums=0)
    w = sharded_structs(mesh, ((n, dim, dim), f32), spec)
    xs = sharded_structs(mesh, ((n, 2, micro, mb, dim), f32), spec)
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

    mesh = device_mesh(devices, (2, 4), ("data", "model"))
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

    fn = jax.jit(sgd_step(loss), donate_argnums=0)
    return fn, (
        sharded_structs(mesh, shapes, specs),
        sharded_structs(mesh, ((batch, dim), f32), x_spec),
    )


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
    mesh = device_mesh(devices, (hosts, n // hosts), ("data", "model"))
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
    fn = jax.jit(sgd_step(loss), donate_argnums=0)
    x = sharded_structs(mesh, ((batch, seq, dim), f32), x_spec)
    return fn, (sharded_structs(mesh, shapes, specs), x)


def compute_bound_fsdp(devices: Sequence[Any]) -> Built:
    """A compute-bound dense transformer step: four GPT-3 6.7B-sized layers (d_model
    4096, 32 heads, d_ff 16384, BF16) unrolled, FSDP over one host of 8 H100s, one
    sequence of 1536 tokens per GPU. On XLA's default compile (overlap limit 1, one
    stream) the simulator predicts 17.9 ms a step, 90% of it compute-busy (16.2 ms),
    with 80% of its 8.9 ms of collectives hidden behind compute: the shape of a public
    A/B sweep (an MoE on 64 GB200s, 90% compute-busy, 77% of its collectives hidden;
    marin-community/marin issues 8054 and 8077) where every overlap lever measured
    neutral or harmful."""
    return _transformer(
        devices, mesh_shape=(len(devices), 1), batch=len(devices), seq=1536, dtype="bfloat16"
    )


def fsdp_chain(devices: Sequence[Any]) -> Built:
    """A dependency chain: one combined FSDP all-gather of every layer's weight feeds
    layer 0, and the one reduce-scatter of the gradient needs the last backward layer.
    No collective has independent work to hide behind."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    n = len(devices)
    mesh = device_mesh(devices, (n,), ("fsdp",))
    layers, dim, batch = 4, 2048, 256 * n
    f32 = jnp.float32

    def local_loss(w: Any, x: Any) -> Any:
        full = jax.lax.all_gather(w, "fsdp", axis=1, tiled=True)  # [layers, dim, dim]
        for i in range(layers):
            x = jnp.tanh(x @ full[i])
        return jax.lax.psum(jnp.mean(x * x), "fsdp") / n

    w_spec, x_spec = P(None, "fsdp", None), P("fsdp", None)
    loss = jax.shard_map(local_loss, mesh=mesh, in_specs=(w_spec, x_spec), out_specs=P())
    fn = jax.jit(sgd_step(loss), donate_argnums=0)
    w = sharded_structs(mesh, ((layers, dim, dim), f32), w_spec)
    return fn, (w, sharded_structs(mesh, ((batch, dim), f32), x_spec))


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
