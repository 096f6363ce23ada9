#!/usr/bin/env python3
"""Predict a published step time without a GPU, and print predicted / published.

The published run: MaxText's Llama-2 7B trained on one host of 8 H100 80GB SXM
(NVIDIA JAX-Toolbox, docs/frameworks/maxtext/README.md, results table: "7B | H100
80G SXM | BF16 | 4096 | 8 | 2 | DP 1 | FSDP 8 | TP 1 | GBS 16 | Flash |
minimal_flash | Scan Off | Step Time 0.721 s"), with the XLA flags that README
gives. The script builds that step as the embedded program
``xla_streams.programs.llama2_fsdp`` (32 layers, d_model 4096, 32 heads of 128,
SwiGLU 11008, vocab 32000, seq 4096, 2 sequences per GPU, BF16 compute on f32
weights, FSDP 8, cuDNN flash attention, remat minimal_flash, AdamW), compiles it
deviceless for 8 H100s with those flags, simulates the scheduled module and
prints the prediction, its range, the published time and their ratio::

    python tools/predict_published.py                  # the full 32-layer model
    python tools/predict_published.py --layers 2,4     # two small compiles, a linear fit
    python tools/predict_published.py --json out.json

``--layers N`` compiles N layers only (a prediction for that model, not the
published one); ``--layers A,B`` compiles two and extrapolates the step time
linearly in the layer count to 32. That is sound here because every layer is
the same code, its weights are gathered and its gradients scattered per layer,
and the rest of the step (embedding, output layer, loss, optimizer) does not
depend on the count: on jax 0.12 a 2,4 fit gives 601 ms against 605 ms for the
32-layer compile (-0.7%). A 1-layer point is not sound (its single layer's
all-gathers have nothing to hide behind: the 1,2 fit is +9%), so both counts
must be at least 2.

Deviceless compile needs JAX's CUDA plugin (``jax[cuda12]``) and runs with
``JAX_PLATFORMS=cpu``, which this script sets. The full model compiles in about
half a minute on two CPU cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# Use this checkout's xla_streams even if another copy is installed.
sys.path.insert(0, str(REPO))

from xla_streams.aot import compile_for_gpu, gpu_topology  # noqa: E402
from xla_streams.collectives import StreamModel  # noqa: E402
from xla_streams.hlo import Module, parse_module  # noqa: E402
from xla_streams.programs import Llama2Config, llama2_fsdp  # noqa: E402
from xla_streams.simulate import (  # noqa: E402
    PredictionRange,
    SimResult,
    Simulator,
    get_target,
    predict_range,
)
from xla_streams.streams import assign_streams  # noqa: E402
from xla_streams.xla_options import XLA_DEFAULT_OVERLAP_LIMIT  # noqa: E402

SCHEMA = "xla_streams.published.v1"
MIN_FIT_LAYERS = 2


@dataclasses.dataclass(frozen=True)
class Published:
    """A published step time and how it was run."""

    name: str
    hardware: str
    devices: int
    step_s: float
    source: str
    config: Llama2Config
    xla_flags: tuple[str, ...]
    notes: str = ""


MAXTEXT_LLAMA2_7B = Published(
    name="MaxText Llama-2 7B",
    hardware="8x H100 80GB SXM, one host (NVIDIA JAX-Toolbox)",
    devices=8,
    step_s=0.721,
    source="https://github.com/NVIDIA/JAX-Toolbox/blob/main/docs/frameworks/maxtext/README.md",
    config=Llama2Config(),
    # The README's "XLA Flags" section, verbatim. It also advises
    # --xla_gpu_enable_custom_fusions=false and
    # --xla_gpu_enable_address_computation_fusion=false, which jax 0.12's XLA no longer
    # has (its flag parser would abort on them); both fusions are off by default there.
    xla_flags=(
        "--xla_gpu_enable_latency_hiding_scheduler=true",
        "--xla_gpu_enable_command_buffer=",
        "--xla_gpu_all_reduce_combine_threshold_bytes=1073741824",
        "--xla_gpu_all_gather_combine_threshold_bytes=1073741824",
        "--xla_gpu_reduce_scatter_combine_threshold_bytes=134217728",
        "--xla_gpu_enable_pipelined_all_gather=true",
        "--xla_gpu_enable_pipelined_reduce_scatter=true",
        "--xla_gpu_enable_pipelined_all_reduce=true",
        "--xla_gpu_enable_while_loop_double_buffering=true",
        "--xla_gpu_enable_all_gather_combine_by_dim=false",
        "--xla_gpu_enable_reduce_scatter_combine_by_dim=false",
        "--xla_disable_hlo_passes=rematerialization",
    ),
    notes="DP 1, FSDP 8, TP 1, global batch 16, seq 4096, BF16, attention cudnn_flash_te, "
    "remat minimal_flash, scan_layers false",
)


@dataclasses.dataclass
class Prediction:
    """One compile and its simulation."""

    layers: int
    module: Module
    result: SimResult
    span: PredictionRange
    compile_s: float
    simulate_s: float
    pairs: int  # async collective pairs
    attention: tuple[int, float]  # cuDNN flash-attention calls and their modelled seconds


def use_published_flags(published: Published) -> None:
    """Put the published XLA flags in XLA_FLAGS (before the user's own, which win), and
    ask for the CPU platform that deviceless compiles need. Must run before JAX starts."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    own = os.environ.get("XLA_FLAGS", "").strip()
    os.environ["XLA_FLAGS"] = " ".join([*published.xla_flags, *([own] if own else [])])


def predict(published: Published, layers: int) -> Prediction:
    """Compile the published model with ``layers`` layers for its GPUs, deviceless, and
    simulate it on H100 as XLA runs it on jax 0.12 (one collective stream, the default
    overlap limit, sync collectives on the compute stream)."""
    begin = time.perf_counter()
    topology = gpu_topology("h100", published.devices, 8)
    config = dataclasses.replace(published.config, layers=layers)
    fn, args = llama2_fsdp(topology.devices, config)
    compiled = compile_for_gpu(fn, args, dump=False)
    compile_s = time.perf_counter() - begin
    begin = time.perf_counter()
    module = parse_module(compiled.as_text, f"<{published.name}, {layers} layers>")
    model = StreamModel(overlap_limit=XLA_DEFAULT_OVERLAP_LIMIT, sync_on_compute=True)
    sim = Simulator(module, get_target("h100"), model=model)
    one_stream = assign_streams(sim.pairs, 1, "interval")  # what XLA does
    result = sim.run(one_stream)
    span = predict_range(sim, one_stream)
    simulate_s = time.perf_counter() - begin
    return Prediction(
        layers,
        module,
        result,
        span,
        compile_s,
        simulate_s,
        len(sim.pairs),
        _attention(module, sim),
    )


def _attention(module: Module, sim: Simulator) -> tuple[int, float]:
    """The cuDNN fused-attention calls and the time the model gives them."""
    kernels = sim.kernels()
    names = [
        inst.name
        for comp in module.computations
        for inst in comp.instructions
        if inst.opcode == "custom-call" and "fmha" in (inst.attribute("custom_call_target") or "")
    ]
    return len(names), sum(kernels[n][1] for n in names if n in kernels)


def extrapolate(points: dict[int, float], layers: int) -> float:
    """The step time at ``layers`` on the line through two (layer count, step time)
    points; ValueError unless there are two distinct counts, each at least
    :data:`MIN_FIT_LAYERS`."""
    if len(points) != 2:
        raise ValueError(f"a linear fit needs two layer counts, got {sorted(points)}")
    (a, ta), (b, tb) = sorted(points.items())
    if a < MIN_FIT_LAYERS:
        raise ValueError(
            f"a fit from {a} layer(s) is not sound: give counts of at least {MIN_FIT_LAYERS}"
        )
    per_layer = (tb - ta) / (b - a)
    return ta + (layers - a) * per_layer


def parse_layers(text: str) -> tuple[int, ...]:
    """``"32"`` or ``"2,4"``: one count (a plain prediction) or two (a linear fit)."""
    try:
        counts = tuple(sorted({int(t) for t in text.split(",") if t.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not 1 or 2 integers") from None
    if not 1 <= len(counts) <= 2 or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"give one count, or two to fit: '{text}'")
    if len(counts) == 2 and counts[0] < MIN_FIT_LAYERS:
        raise argparse.ArgumentTypeError(
            f"a fit needs counts of at least {MIN_FIT_LAYERS} (see --help)"
        )
    return counts


@dataclasses.dataclass(frozen=True)
class Span:
    """A step time's range (seconds)."""

    low: float
    high: float


@dataclasses.dataclass(frozen=True)
class CompiledPoint:
    """One compile of the model and its prediction (``compiles[i]``)."""

    layers: int
    step_s: float
    range_s: Span
    compute_only_s: float
    exposed_communication_s: float
    async_collective_pairs: int
    flash_attention_calls: int
    flash_attention_modelled_s: float
    compile_s: float
    simulate_s: float


@dataclasses.dataclass(frozen=True)
class PublishedReport:
    """What the script found: schema ``xla_streams.published.v1`` (``--json``). Read by
    people and its test: nothing reads it back, so it has no ``from_json``."""

    model: str
    hardware: str
    source: str
    configuration: dict[str, Any]  # the program's Llama2Config, and the run's notes
    xla_flags: tuple[str, ...]
    published_step_s: float
    predicted_step_s: float | None  # None: the compiles do not predict the full model
    predicted_range_s: Span | None
    ratio: float | None  # predicted / published
    how: str
    compiles: tuple[CompiledPoint, ...]

    def to_json(self) -> str:
        data = {"schema": SCHEMA, **dataclasses.asdict(self)}
        return json.dumps(data, indent=2) + "\n"


def report(published: Published, predictions: Sequence[Prediction]) -> PublishedReport:
    """What the script found."""
    full = published.config.layers
    exact = next((p for p in predictions if p.layers == full), None)
    predicted: float | None
    low: float | None
    high: float | None
    if exact is not None:
        predicted, how = exact.result.step_time, f"compiled with all {full} layers"
        low, high = exact.span.low, exact.span.high
    elif len(predictions) == 2:
        points = {p.layers: p.result.step_time for p in predictions}
        predicted = extrapolate(points, full)
        low = extrapolate({p.layers: p.span.low for p in predictions}, full)
        high = extrapolate({p.layers: p.span.high for p in predictions}, full)
        how = f"extrapolated to {full} layers from {' and '.join(map(str, sorted(points)))}"
    else:
        predicted = low = high = None
        how = f"{predictions[0].layers} layers only: no prediction of the published model"
    return PublishedReport(
        model=published.name,
        hardware=published.hardware,
        source=published.source,
        configuration={**dataclasses.asdict(published.config), "notes": published.notes},
        xla_flags=published.xla_flags,
        published_step_s=published.step_s,
        predicted_step_s=predicted,
        predicted_range_s=None if low is None or high is None else Span(low, high),
        ratio=None if predicted is None else predicted / published.step_s,
        how=how,
        compiles=tuple(
            CompiledPoint(
                layers=p.layers,
                step_s=p.result.step_time,
                range_s=Span(p.span.low, p.span.high),
                compute_only_s=p.result.compute_time,
                exposed_communication_s=p.result.exposed_communication,
                async_collective_pairs=p.pairs,
                flash_attention_calls=p.attention[0],
                flash_attention_modelled_s=p.attention[1],
                compile_s=p.compile_s,
                simulate_s=p.simulate_s,
            )
            for p in predictions
        ),
    )


def format_report(r: PublishedReport) -> str:
    config = r.configuration
    lines = [
        f"{r.model} on {r.hardware}",
        f"  {config['layers']} layers, d_model {config['d_model']}, {config['heads']} heads of "
        f"{config['head_dim']}, ffn {config['d_ff']}, vocab {config['vocab']}, seq "
        f"{config['seq']}, {config['batch_per_device']} sequences per GPU; {config['notes']}",
        f"  source: {r.source}",
    ]
    for c in r.compiles:
        lines.append(
            f"  {c.layers} layers: predicted {c.step_s:.4f} s (range {c.range_s.low:.4f}"
            f" .. {c.range_s.high:.4f}; compute only {c.compute_only_s:.4f} s, exposed "
            f"communication {c.exposed_communication_s:.4f} s; {c.flash_attention_calls} "
            f"cuDNN flash-attention calls modelled at {c.flash_attention_modelled_s:.4f} s); "
            f"compiled in {c.compile_s:.1f} s, simulated in {c.simulate_s:.1f} s"
        )
    if r.predicted_step_s is None or r.predicted_range_s is None:
        lines.append(f"  {r.how}")
        return "\n".join(lines) + "\n"
    total = r.predicted_range_s
    lines += [
        f"predicted step time: {r.predicted_step_s:.3f} s ({r.how}; range "
        f"{total.low:.3f} .. {total.high:.3f} s)",
        f"published step time: {r.published_step_s:.3f} s",
        f"predicted / published: {r.ratio:.2f}",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--layers",
        type=parse_layers,
        default=(MAXTEXT_LLAMA2_7B.config.layers,),
        help="layer count to compile (default: the published 32), or two counts to fit "
        f"and extrapolate from (each at least {MIN_FIT_LAYERS})",
    )
    parser.add_argument("--json", help="also write the result as JSON to this file")
    args = parser.parse_args(argv)
    published = MAXTEXT_LLAMA2_7B
    use_published_flags(published)
    predictions = [predict(published, n) for n in args.layers]
    result = report(published, predictions)
    sys.stdout.write(format_report(result))
    if args.json:
        Path(args.json).write_text(result.to_json())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
