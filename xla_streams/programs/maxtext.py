"""MaxText's Llama-2/3 and Mixtral training steps, as their published runs were
configured (tools/predict_published.py compares the simulator with their step times)."""

# jax's public API is only partly annotated; its calls are checked at runtime here.
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xla_streams.programs.builders import Built, sharded_structs


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

    params = sharded_structs(mesh, shapes, specs)
    replicated = NamedSharding(mesh, P())
    opt = {
        "mu": params,
        "nu": params,
        "count": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
    }
    kept = jax.tree.map(lambda a: a.sharding, (params, opt))
    fn = jax.jit(train_step, out_shardings=(replicated, *kept), donate_argnums=(0, 1))
    tokens = sharded_structs(mesh, ((batch, c.seq), jnp.int32), P(batch_axes, None))
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
