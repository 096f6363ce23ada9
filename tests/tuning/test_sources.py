"""Tuning a program without its Python: from JAX's own dump (``JAX_DUMP_IR_TO``), from
``lowered.as_text()`` saved to a file, and from a builder that returns a
``jax.stages.Lowered``. The model of the dump test is written with Flax NNX (a real
model library this project does not own): a small Llama-style decoder, FSDP x TP on
8 CPU devices, dumped in a subprocess, then tuned from the folder for 2 hosts of 4
H100s.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before anything imports JAX

import pytest
from conftest import busy_cores

import xla_streams
from xla_streams import aot, cli, xla_options
from xla_streams.hlo import parse_module
from xla_streams.tuning.driver import tune_lowered
from xla_streams.tuning.result import TuneError, load_tune_result
from xla_streams.tuning.sources import read_program

WINDOWED = xla_options.WINDOWED_EINSUM_THRESHOLD_MIB

# A data-parallel step over 8 devices: small enough to compile in a second.
PROGRAM = textwrap.dedent(
    """\
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    def build(devices):
        mesh = Mesh(np.array(devices), ("d",))
        s = NamedSharding(mesh, P("d"))
        f = jax.jit(lambda w, x: jnp.tanh(x @ w).sum(), in_shardings=(None, s))
        w = jax.ShapeDtypeStruct((512, 512), jnp.float32)
        x = jax.ShapeDtypeStruct((64 * len(devices), 512), jnp.float32, sharding=s)
        return f.lower(w, x)  # a jax.stages.Lowered
    """
)


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["tune", *argv], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _schedule(hlo: str) -> str:
    """The scheduled module without what says where the Python ran: metadata, stack frames."""
    hlo = hlo.split("\nFileNames", 1)[0]
    return re.sub(r", metadata=\{[^}]*\}|, stack_frame_id=\d+", "", hlo)


def _load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"_prog_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_a_builder_may_return_a_lowered_and_its_text_tunes_the_same(tmp_path: Path) -> None:
    program = tmp_path / "step.py"
    program.write_text(PROGRAM)
    common = {"levers": ["overlap-limit"], "budget_compiles": 10, "jobs": 0, "cache_dir": False}
    direct = xla_streams.tune(_load(program).build, devices=8, program="step", **common)
    # The same program as text, compiled without the program: as_text(debug_info=True)
    # keeps the names, so the schedule is the same (only the metadata differs: where
    # the Python that lowered it ran).
    devices = aot.gpu_topology("h100", 8, 8, 1).devices
    lowered = _load(program).build(devices)
    saved = tmp_path / "step.mlir"
    saved.write_text(lowered.as_text(debug_info=True))
    code, out, err = _cli(str(saved), "--levers=overlap-limit", "--jobs=0", "--cache-dir=none",
                          f"--json={tmp_path / 'tune.json'}")  # fmt: skip
    assert code == 0, err
    from_text = load_tune_result(tmp_path / "tune.json")
    assert from_text.devices == 8 and from_text.program == "step.mlir"
    assert from_text.baseline.predicted_step_ms == pytest.approx(
        direct.baseline.predicted_step_ms,
        abs=1e-6,  # the file keeps 6 decimals of a ms
    )
    via_lowered = tune_lowered(lowered, program="step", devices=8, **common)
    assert _schedule(via_lowered.best_hlo) == _schedule(direct.best_hlo)
    # Plain as_text() (no locations): the same schedule under other instruction names.
    plain = tmp_path / "plain.mlir"
    plain.write_text(lowered.as_text())
    code, out, err = _cli(str(plain), "--levers=overlap-limit", "--jobs=0", "--cache-dir=none")
    assert code == 0, err
    assert f"{direct.baseline.predicted_step_ms:.3f}" in out
    # The module says its device count: another --devices is refused before compiling.
    code, out, err = _cli(str(plain), "--devices=16", "--cache-dir=none")
    assert code == 2 and "runs on 8 devices" in err, err


def test_xla_dumps_and_hlo_text_say_what_to_dump_instead(tmp_path: Path) -> None:
    xla_dump = tmp_path / "xladump"
    xla_dump.mkdir()
    (xla_dump / "module_0011.jit_train_step.before_optimizations.txt").write_text("HloModule m\n")
    (xla_dump / "module_0011.jit_train_step.cpu_after_optimizations.txt").write_text("")
    with pytest.raises(TuneError) as e:
        read_program(xla_dump)
    message = str(e.value)
    assert "XLA's own dump (--xla_dump_to)" in message and "loses num_partitions" in message
    assert "JAX_DUMP_IR_TO=DIR python train.py" in message and "as_text(debug_info=True)" in message
    hlo = tmp_path / "after.txt"
    hlo.write_text("HloModule jit_f, is_scheduled=true\n")
    with pytest.raises(TuneError, match="HLO text, not StableHLO: .*JAX_DUMP_IR_TO"):
        read_program(hlo)
    code, _, err = _cli(str(xla_dump), "--cache-dir=none")
    assert code == 2 and "JAX_DUMP_IR_TO=DIR" in err and "Traceback" not in err


def test_the_step_is_the_largest_module_with_a_matrix_multiply(tmp_path: Path) -> None:
    head = "module @{name} attributes {{mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32}} {{\n"
    helper = (
        head.format(name="jit__normal")
        + "  func.func public @main() {\n"
        + "  %0 = stablehlo.add\n" * 300
        + "}}\n"
    )
    step = (
        head.format(name="jit_train_step")
        + "  func.func public @main() {\n  %0 = stablehlo.dot_general\n}}\n"
    )
    (tmp_path / "jax_ir0001_jit__normal_compile.mlir").write_text(helper)
    (tmp_path / "jax_ir0002_jit_train_step_compile.mlir").write_text(step)
    (tmp_path / "notes.mlir").write_text("not StableHLO")
    found, others = read_program(tmp_path)
    # Not the largest file, nor the one with the most partitions: the one that multiplies.
    assert found.name == "jit_train_step" and found.partitions == 8 and found.dots == 1
    assert [m.name for m in others] == ["jit__normal"]


LLAMA = textwrap.dedent(
    """\
    import numpy as np
    import jax, jax.numpy as jnp, optax
    from flax import nnx
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

    # An MLP wide enough that XLA does not split its GEMMs (its split-K rewriter drops
    # the stream a collective matmul gives each partial GEMM).
    VOCAB, D, HEADS, FFN, LAYERS, SEQ, BATCH = 512, 128, 4, 4096, 2, 64, 8
    HD = D // HEADS
    init = nnx.initializers.normal(0.02)


    def dense(din, dout, spec, rngs):
        return nnx.Linear(din, dout, use_bias=False, rngs=rngs,
                          kernel_init=nnx.with_partitioning(init, spec))


    def norm(rngs):
        return nnx.RMSNorm(D, rngs=rngs,
                           scale_init=nnx.with_partitioning(nnx.initializers.ones, (None,)))


    def rope(x):
        pos = jnp.arange(x.shape[1])[:, None]
        ang = pos * (1.0 / (10000 ** (jnp.arange(0, HD, 2) / HD)))[None, :]
        sin, cos = jnp.sin(ang)[None, :, None, :], jnp.cos(ang)[None, :, None, :]
        x1, x2 = x[..., ::2], x[..., 1::2]
        return jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).reshape(x.shape)


    class Block(nnx.Module):
        def __init__(self, rngs):
            self.attn_norm, self.mlp_norm = norm(rngs), norm(rngs)
            self.wq = dense(D, D, ("data", "model"), rngs)
            self.wk = dense(D, D, ("data", "model"), rngs)
            self.wv = dense(D, D, ("data", "model"), rngs)
            self.wo = dense(D, D, ("model", "data"), rngs)
            self.gate = dense(D, FFN, ("data", "model"), rngs)
            self.up = dense(D, FFN, ("data", "model"), rngs)
            self.down = dense(FFN, D, ("model", "data"), rngs)

        def __call__(self, x):
            b, s, _ = x.shape
            h = self.attn_norm(x)
            q = rope(self.wq(h).reshape(b, s, HEADS, HD))
            k = rope(self.wk(h).reshape(b, s, HEADS, HD))
            v = self.wv(h).reshape(b, s, HEADS, HD)
            logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(HD)
            probs = jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((s, s), bool)), logits, -1e9))
            x = x + self.wo(jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, D))
            h = self.mlp_norm(x)
            return x + self.down(nnx.silu(self.gate(h)) * self.up(h))


    class Llama(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Embed(VOCAB, D, rngs=rngs,
                                   embedding_init=nnx.with_partitioning(init, ("model", "data")))
            self.layers = nnx.List([Block(rngs) for _ in range(LAYERS)])
            self.norm = norm(rngs)
            self.head = dense(D, VOCAB, ("data", "model"), rngs)

        def __call__(self, tokens):
            x = jax.lax.with_sharding_constraint(self.embed(tokens), P("data", None, None))
            for layer in self.layers:
                x = layer(x)
            return self.head(self.norm(x))


    def loss_fn(model, tokens):
        logits = model(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


    @nnx.jit
    def train_step(model, optimizer, tokens):
        loss, grads = nnx.value_and_grad(loss_fn)(model, tokens)
        optimizer.update(model, grads)
        return loss


    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"),
                axis_types=(AxisType.Auto, AxisType.Auto))
    with jax.set_mesh(mesh):
        model = Llama(nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
        tokens = jax.device_put(
            jnp.asarray(np.random.RandomState(0).randint(0, VOCAB, (BATCH, SEQ + 1))),
            NamedSharding(mesh, P("data", None)))
        print("loss", float(train_step(model, optimizer, tokens)))
    """
)


@pytest.fixture(scope="module")
def flax_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder JAX_DUMP_IR_TO fills when the Flax model above trains one step."""
    assert importlib.util.find_spec("flax") is not None, (
        "install the test extra: pip install -e '.[test]'"
    )
    tmp_path = tmp_path_factory.mktemp("flax")
    script, dump = tmp_path / "llama.py", tmp_path / "dump"
    script.write_text(LLAMA)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_"))}
    env.update(
        JAX_PLATFORMS="cpu",
        JAX_DUMP_IR_TO=str(dump),
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
    )
    run = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "loss" in run.stdout
    return dump


@pytest.mark.slow
def test_a_flax_model_tunes_from_jax_s_own_dump(flax_dump: Path, tmp_path: Path) -> None:
    out_json = tmp_path / "tune.json"
    code, _, err = _cli(
        str(flax_dump), "--devices-per-host=4", "--levers=overlap-limit", "--budget-compiles=10",
        f"--json={out_json}", "--cache-dir=none",
    )  # fmt: skip
    assert code == 0, err
    result = load_tune_result(out_json)
    # The step, not one of the helper jits Flax compiled beside it (all on 8 devices).
    assert result.program == "dump:jit_train_step" and result.devices == 8
    assert result.topology == "2x1x4"  # FSDP across the 2 hosts, TP inside each
    assert result.baseline.predicted_step_ms > 0 and result.evaluated >= 3
    notes = " ".join(result.notes)
    assert "jax_ir" in notes and "jit_" in notes  # the other modules, by file and name
    assert json.loads(out_json.read_text())["guarantee"].startswith("no change of one lever")


@pytest.mark.slow
def test_the_flax_dump_gets_the_same_answer_on_a_busy_machine(
    flax_dump: Path, tmp_path: Path
) -> None:
    """Every lever, stopped by the compile budget inside the search (as in
    test_repeatable.py): the answer, to its last figure, does not depend on how busy
    the machine is."""
    answers, spun = [], []
    for run, busy in (("quiet", False), ("busy", True)):
        out_json = tmp_path / f"{run}.json"
        with busy_cores() if busy else contextlib.nullcontext([]) as spinners:
            code, _, err = _cli(
                str(flax_dump), "--devices-per-host=4", "--budget-compiles=6",
                f"--json={out_json}", f"--cache-dir={tmp_path / run}",
            )  # fmt: skip
        spun += spinners
        assert code == 0, err
        result = json.loads(out_json.read_text())
        assert result["stopped_by"] == "budget_compiles" and result["compiles"] == 6
        for candidate in result["candidates"]:
            candidate.pop("compile_s")
        answers.append({k: result[k] for k in ("best", "candidates", "guarantee", "evaluated")})
    assert answers[0] == answers[1]
    assert "; repeatable: " in answers[0]["guarantee"]
    assert spun and min(spun) > 1.0, spun


@pytest.mark.slow
def test_a_collective_matmul_on_another_execution_thread_tunes_to_the_end(
    flax_dump: Path, tmp_path: Path
) -> None:
    """The collective-matmul candidate (windowed einsum) of this FSDP x TP model is the
    module a real framework's Llama printed when tune first stopped on it: XLA runs
    each partial GEMM of the all-gather loops on its own stream, as an async fusion
    on the ``parallel`` execution thread whose computation prints
    ``execution_thread="parallel"``. The search compiles, reads, simulates and checks
    it like any other candidate, and runs to its end."""
    out_json, cache = tmp_path / "tune.json", tmp_path / "cache"
    code, _, err = _cli(
        str(flax_dump), "--devices-per-host=4", "--levers=windowed-einsum",
        f"--json={out_json}", f"--cache-dir={cache}",
    )  # fmt: skip
    assert code == 0, err
    result = load_tune_result(out_json)
    assert result.stopped_by == "" and not result.dropped, (result.stopped_by, result.dropped)
    assert result.guarantee.startswith("no change of one lever")
    windowed = [c for c in result.candidates if c.xla_flags.get(WINDOWED) == 0]
    assert windowed and all(c.predicted_step_ms > 0 for c in windowed)
    # What XLA compiled for it, as the cache keeps it: other-thread computations.
    texts = [json.loads(gzip.decompress(p.read_bytes()))["text"] for p in cache.rglob("*.gz")]
    threaded = [t for t in texts if '}, execution_thread="parallel"' in t]
    assert len(threaded) == len(windowed) and len(texts) == result.compiles
    module = parse_module(threaded[0])
    assert {c.execution_thread for c in module.computations} == {"main", "parallel"}
