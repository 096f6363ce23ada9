#!/usr/bin/env python3
"""Predict published JAX-on-GPU step times without a GPU: ours and XLA's own estimate.

Every row of :data:`RUNS` is a training run whose step time was published with the
configuration to rebuild it: NVIDIA JAX-Toolbox's MaxText table, MaxText's own A3
table, and Google's AI-Hypercomputer GPU recipes (their logs), each with its source
(repository, file, commit, the row verbatim), the MaxText configuration, the XLA
flags it ran with and the cluster's network as a target file
(``xla_streams/targets/*.json``, read by ``load_target``). For each row the script
builds the step as the embedded program ``xla_streams.programs.maxtext.llama_train_step``,
compiles it deviceless for the run's GPUs (hosts of 8, one NVLink domain each) with
the published flags, simulates the scheduled module and reads XLA's own estimate of
it (its latency-hiding scheduler's schedule dump, told the cluster's NIC speed), then
prints predicted, range, published and XLA's estimate per row, and the median and
worst error of both::

    python tools/predict_published.py                   # every row (minutes)
    python tools/predict_published.py --rows jax-toolbox-llama2-7b,a3-ultra-mixtral-8x7b
    python tools/predict_published.py --layers 2,3      # every row at small depth, fitted
    python tools/predict_published.py --json out.json   # the table as JSON
    python tools/predict_published.py --markdown        # the table docs/predictions.md shows
    python tools/predict_published.py --list            # the rows, their sources

Depth. A row whose layers are unrolled compiles two small models by default
(:data:`FIT_LAYERS`) and extrapolates the step linearly in the layer count: every
layer is the same code, its weights are gathered and its gradients reduced per layer,
and the rest of the step (embedding, output layer, loss, optimizer) does not depend
on the count; on jax 0.12 the JAX-Toolbox row's 2,4 fit is within 1% of its 32-layer
compile. A 1-layer point is not sound (its single layer's all-gathers have nothing to
hide behind: a 1,2 fit is +9%), so fitted counts are at least 2. A row under
``lax.scan`` compiles all its layers at once (the compile does not grow with the trip
count). ``--layers N`` or ``--layers A,B`` applies one depth to every row.

XLA's estimate. XLA reads its estimator's options (``nic_speed_gbps``,
``gpus_per_node``, ``partition_size``) from ``XLA_FLAGS`` once per process, so each
row compiles in a process of its own whose ``XLA_FLAGS`` holds the published flags
and the row's cluster (:func:`estimator_options`). The estimate compared is XLA's
step without its placeholders (async pairs it cannot price and charges a flat 5 ms:
the scans' async fusions); a row says how many it had.

Deviceless compiles need JAX's CUDA plugin (``jax[cuda12]``) and ``JAX_PLATFORMS=cpu``,
which this script sets.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# Use this checkout's xla_streams even if another copy is installed.
sys.path.insert(0, str(REPO))

from xla_streams.aot import compile_for_gpu, gpu_topology  # noqa: E402
from xla_streams.collectives import StreamModel  # noqa: E402
from xla_streams.hlo import parse_module  # noqa: E402
from xla_streams.programs.maxtext import LlamaConfig, Parallelism, llama_train_step  # noqa: E402
from xla_streams.simulate import (  # noqa: E402
    Simulator,
    Target,
    get_target,
    load_target,
    predict_range,
)
from xla_streams.simulate.xla_estimate import (  # noqa: E402
    ESTIMATOR_OPTIONS_FLAG,
    estimator_options,
    parse_schedule,
)
from xla_streams.streams import assign_streams  # noqa: E402
from xla_streams.xla_options import XLA_DEFAULT_OVERLAP_LIMIT  # noqa: E402

SCHEMA = "xla_streams.published.v2"
FIT_LAYERS = (2, 4)
MIN_FIT_LAYERS = 2
# The JSON of the last full run, which docs/predictions.md's table is made from.
LAST_RUN = REPO / "tests" / "data" / "published_runs.json"

MAXTEXT = "https://github.com/AI-Hypercomputer/maxtext"
RECIPES = "https://github.com/AI-Hypercomputer/gpu-recipes"
JAX_TOOLBOX = "https://github.com/NVIDIA/JAX-Toolbox"


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a step time was published: the repository, the file at a commit, and the
    row (or log line) verbatim."""

    repo: str
    path: str
    commit: str
    quote: str

    @property
    def url(self) -> str:
        return f"{self.repo}/blob/{self.commit}/{self.path}"


@dataclasses.dataclass(frozen=True)
class PublishedRun:
    """A published step time, how the run was configured and on what cluster."""

    name: str
    title: str
    hardware: str  # the cluster, in words
    gpu: str  # the compile target (xla_streams.aot.GPU_CONFIGS)
    target: str  # a simulator target: a built-in name or a target file in this repository
    step_s: float
    source: Source
    config: LlamaConfig
    xla_flags: tuple[str, ...]  # as published (not in their order)
    setup: Source  # where the configuration and the flags were read
    assumptions: tuple[str, ...] = ()
    tflops_per_device: float | None = None  # published as TFLOP/s per GPU, not seconds

    @property
    def hosts(self) -> int:
        return self.config.dcn.devices


def maxtext_tflops_2024_04(config: LlamaConfig) -> float:
    """The TFLOPs MaxText counted per GPU and step when it reported TFLOP/s (MaxText/
    maxtext_utils.py calculate_tflops_training_per_device at commit efb6d9e4a, April
    2024): 6 x parameters x tokens per GPU, plus causal attention, 12 x heads x layers
    x head_dim x seq^2 x batch per GPU / 2."""
    tokens = config.seq * config.batch_per_device
    weights = 6 * config.parameters * tokens
    attention = (
        12 * config.heads * config.layers * config.head_dim * config.seq**2
        * config.batch_per_device / 2
    )  # fmt: skip
    return (weights + attention) / 1e12


# -- the published runs -------------------------------------------------------------------

# The flags of a published run that jax 0.12's XLA no longer has (its flag parser aborts
# on an unknown flag), and what became of each; and the ones spelled anew.
GONE_FLAGS = {
    "--xla_gpu_enable_async_all_gather": "collectives are async by default",
    "--xla_gpu_enable_async_reduce_scatter": "collectives are async by default",
    "--xla_gpu_enable_async_all_reduce": "collectives are async by default",
    "--xla_gpu_simplify_all_fp_conversions": "removed; the simplification is always on",
    "--xla_gpu_enable_triton_softmax_fusion": "removed from XLA",
    "--xla_dump_to": "a dump folder of the published run",
}
RESPELLED_FLAGS = {
    # --xla_gpu_graph_level=0 turned CUDA graphs off; JAX-Toolbox replaced it so (#1244).
    "--xla_gpu_graph_level=0": "--xla_gpu_enable_command_buffer=",
    # The shell scripts' quotes reach XLA_FLAGS as two characters; they meant "none".
    "--xla_gpu_enable_command_buffer=''": "--xla_gpu_enable_command_buffer=",
    '--xla_gpu_enable_command_buffer=""': "--xla_gpu_enable_command_buffer=",
}


def runnable_flags(published: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The published flags as jax 0.12's XLA takes them, and a note for each changed."""
    flags, notes = [], []
    for flag in published:
        name = flag.split("=", 1)[0]
        if name in GONE_FLAGS:
            notes.append(f"{flag} dropped: {GONE_FLAGS[name]}")
        elif flag in RESPELLED_FLAGS:
            flags.append(RESPELLED_FLAGS[flag])
            notes.append(f"{flag} given as {RESPELLED_FLAGS[flag]}")
        else:
            flags.append(flag)
    return tuple(flags), tuple(notes)


# What the MaxText GPU runs all give XLA, beside their combine thresholds and a few more.
_MAXTEXT_GPU_FLAGS = (
    "--xla_gpu_enable_latency_hiding_scheduler=true",
    "--xla_gpu_enable_pipelined_all_gather=true",
    "--xla_gpu_enable_pipelined_reduce_scatter=true",
    "--xla_gpu_enable_pipelined_all_reduce=true",
    "--xla_gpu_enable_while_loop_double_buffering=true",
    "--xla_gpu_enable_all_gather_combine_by_dim=false",
    "--xla_gpu_enable_reduce_scatter_combine_by_dim=false",
    "--xla_disable_hlo_passes=rematerialization",
)


def _maxtext_gpu_flags(
    *, all_reduce: int, all_gather: int, reduce_scatter: int, also: tuple[str, ...]
) -> tuple[str, ...]:
    """A MaxText GPU run's XLA_FLAGS as published (in another order): the flags they all
    give, their combine thresholds, and the run's own ``also``."""
    return (
        *_MAXTEXT_GPU_FLAGS,
        f"--xla_gpu_all_reduce_combine_threshold_bytes={all_reduce}",
        f"--xla_gpu_all_gather_combine_threshold_bytes={all_gather}",
        f"--xla_gpu_reduce_scatter_combine_threshold_bytes={reduce_scatter}",
        *also,
    )


def _a3_run(vms: int, tflops: float, all_reduce: int, reduce_scatter: int) -> PublishedRun:
    """A row of MaxText's A3 table: Llama-2 7B on ``vms`` A3 VMs (a3-highgpu-8g)."""
    config = LlamaConfig(batch_per_device=4, ici=Parallelism(fsdp=8), dcn=Parallelism(data=vms))
    cells = f"{vms}x A3 (h100-80gb-8)"
    return PublishedRun(
        name=f"maxtext-a3-llama2-7b-{vms}vm",
        title=f"MaxText Llama-2 7B, {vms} A3 VM{'s' if vms > 1 else ''}",
        hardware=f"{8 * vms} H100 80GB, {vms} Google Cloud A3 High host(s), GPUDirect-TCPX",
        gpu="h100",
        target="xla_streams/targets/gcp_a3_high.json",
        step_s=maxtext_tflops_2024_04(config) / tflops,
        tflops_per_device=tflops,
        source=Source(
            MAXTEXT,
            "MaxText/configs/a3/llama_2_7b/README.md",
            "efb6d9e4a2856198f8272dcbfb7d9c91eda0728e",
            f"| {cells:<22} | {tflops:<16g} |",
        ),
        setup=Source(
            MAXTEXT,
            f"MaxText/configs/a3/llama_2_7b/{vms}vm.sh",
            "efb6d9e4a2856198f8272dcbfb7d9c91eda0728e",
            f"dcn_data_parallelism={vms} ici_fsdp_parallelism=8 per_device_batch_size=4 "
            "max_target_length=4096 model_name=llama2-7b attention=cudnn_flash_te "
            "remat_policy=minimal_flash scan_layers=false",
        ),
        config=config,
        xla_flags=_maxtext_gpu_flags(
            all_reduce=all_reduce,
            all_gather=134217728,
            reduce_scatter=reduce_scatter,
            also=(
                "--xla_dump_to=$OUTPUT_PATH/$RUN_NAME/HLO_dumps/",
                "--xla_gpu_enable_async_all_gather=true",
                "--xla_gpu_enable_async_reduce_scatter=true",
                "--xla_gpu_enable_triton_gemm=false",
                "--xla_gpu_simplify_all_fp_conversions",
                "--xla_gpu_graph_level=0",
                "--xla_gpu_enable_async_all_reduce=true",
                "--xla_gpu_enable_highest_priority_async_stream=true",
                "--xla_gpu_enable_triton_softmax_fusion=false",
            ),
        ),
        assumptions=(
            "published as TFLOP/s per GPU: the step is MaxText's TFLOPs per GPU of that "
            f"commit ({maxtext_tflops_2024_04(config):.1f}) over it",
            "GPUDirect-TCPX beyond 2 VMs is not measured: a collective across VMs takes the "
            "share of line rate Google's 2-VM nccl-tests run reached with as many bytes per "
            "NIC (the target file's network_nccl_tests)",
        ),
    )


# The models' dimensions, from MaxText's configs/models/<name>.yml (llama3.1-70b.yml,
# llama3.1-405b.yml; Mixtral's from the recipe's own config): a run adds its batch,
# sequence, parallelism, remat policy and precision.
LLAMA3_1_70B = LlamaConfig(
    layers=80, d_model=8192, heads=64, kv_heads=8, d_ff=28672, vocab=128256, seq=8192
)
LLAMA3_1_405B = LlamaConfig(
    layers=126, d_model=16384, heads=128, kv_heads=8, d_ff=53248, vocab=128256, seq=8192
)
MIXTRAL_8X7B = LlamaConfig(kv_heads=8, d_ff=14336, experts=8, experts_per_token=2)
MIXTRAL_SAVED = ("query_proj", "key_proj", "value_proj", "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo")

RUNS: tuple[PublishedRun, ...] = (
    PublishedRun(
        name="jax-toolbox-llama2-7b",
        title="JAX-Toolbox MaxText Llama-2 7B",
        hardware="8 H100 80GB SXM, one NVIDIA DGX H100",
        gpu="h100",
        target="h100",
        step_s=0.721,
        source=Source(
            JAX_TOOLBOX,
            "docs/frameworks/maxtext/README.md",
            "bcbbfa578be90bf5c1dfef2c67cf074589391eee",
            "| 7B   | H100 80G SXM | BF16      | 4096            | 8     | 2        | 1  | 8    | "
            "1  | 16  | Flash     | minimal_flash| Off  | 0.721         | 22.19         |",
        ),
        setup=Source(
            JAX_TOOLBOX,
            "docs/frameworks/maxtext/README.md",
            "bcbbfa578be90bf5c1dfef2c67cf074589391eee",
            "the table's columns, and its 'XLA Flags' section",
        ),
        config=LlamaConfig(),
        # The README's "XLA Flags" section. Its notes also advise
        # --xla_gpu_enable_custom_fusions=false and
        # --xla_gpu_enable_address_computation_fusion=false, which jax 0.12's XLA no
        # longer has; both fusions are off by default there.
        xla_flags=_maxtext_gpu_flags(
            all_reduce=1073741824,
            all_gather=1073741824,
            reduce_scatter=134217728,
            also=("--xla_gpu_enable_command_buffer=",),
        ),
    ),
    _a3_run(1, 492, all_reduce=134217728, reduce_scatter=67108864),
    _a3_run(2, 422, all_reduce=67108864, reduce_scatter=67108864),
    _a3_run(4, 407, all_reduce=536870912, reduce_scatter=67108864),
    _a3_run(8, 409, all_reduce=1073741824, reduce_scatter=67108864),
    _a3_run(16, 375, all_reduce=1073741824, reduce_scatter=134217728),
    PublishedRun(
        name="a3-mega-llama2-7b-256",
        title="GPU recipe: MaxText Llama-2 7B on A3 Mega",
        hardware="256 H100 80GB, 32 Google Cloud A3 Mega hosts, GPUDirect-TCPXO",
        gpu="h100",
        target="xla_streams/targets/gcp_a3_mega.json",
        step_s=1.500,
        source=Source(
            RECIPES,
            "training/a3mega/llama-2-7b/maxtext-pretraining-gke/README.md",
            "d57d2223fa1130d187f3a9fde3a3d15add90b4e1",
            "completed step: 12, seconds: 1.500, TFLOP/s/device: 503.384, Tokens/s/device: "
            "10922.973, total_weights: 4194304, loss: 0.000",
        ),
        setup=Source(
            RECIPES,
            "src/frameworks/a3mega/maxtext-configs/llama-2-7b-256gpus-a3mega-bf16.yaml; "
            "src/helm-charts/a3mega/maxtext-training/templates/maxtext-configmap.yaml",
            "d57d2223fa1130d187f3a9fde3a3d15add90b4e1",
            "dcn_data_parallelism: 32, ici_fsdp_parallelism: 8, per_device_batch_size: 4, "
            "max_target_length: 4096, model_name: llama2-7b, attention: cudnn_flash_te, "
            "remat_policy: minimal_flash, scan_layers: false",
        ),
        config=LlamaConfig(batch_per_device=4, ici=Parallelism(fsdp=8), dcn=Parallelism(data=32)),
        xla_flags=_maxtext_gpu_flags(
            all_reduce=536870912,
            all_gather=134217728,
            reduce_scatter=67108864,
            also=(
                "--xla_gpu_enable_triton_gemm=false",
                "--xla_gpu_graph_level=0",
                "--xla_gpu_enable_highest_priority_async_stream=true",
                "--xla_gpu_enable_triton_softmax_fusion=false",
            ),
        ),
        assumptions=(
            "the README's example log line is the 256-GPU default's (its tokens per step, "
            "4194304, are 256 GPUs x 4 x 4096)",
            "GPUDirect-TCPXO beyond 2 VMs is not measured: a collective across VMs takes "
            "the share of line rate a 2-VM nccl-tests run reached with as many bytes per NIC "
            "(the target file's network_nccl_tests)",
            "the chart's last flag ends in a stray quote (rematerialization\"), which would "
            "leave XLA's rematerialization pass on; taken as meant",
        ),
    ),
    PublishedRun(
        name="a3-ultra-mixtral-8x7b",
        title="GPU recipe: MaxText Mixtral 8x7B on A3 Ultra",
        hardware="256 H200 141GB, 32 Google Cloud A3 Ultra hosts, 8x400G RoCE each",
        gpu="h200",
        target="xla_streams/targets/gcp_a3_ultra.json",
        step_s=3.437,
        source=Source(
            RECIPES,
            "training/a3ultra/mixtral-8x7b/maxtext-pretraining-gke/README.md",
            "9b1c797180b17cf203ecafdf26d323a61d0f230c",
            "completed step: 45, seconds: 3.437, TFLOP/s/device: 494.168, Tokens/s/device: "
            "5958.570, total_weights: 5242880, loss: 0.000",
        ),
        setup=Source(
            RECIPES,
            "src/frameworks/a3ultra/maxtext-configs/mixtral-8x7b-256gpus-a3u-bf16.yaml; "
            "training/a3ultra/mixtral-8x7b/maxtext-pretraining-gke/values.yaml",
            "9b1c797180b17cf203ecafdf26d323a61d0f230c",
            "base_emb_dim: 4096, base_num_query_heads: 32, base_num_kv_heads: 8, "
            "base_mlp_dim: 14336, base_num_decoder_layers: 32, num_experts: 8, "
            "num_experts_per_tok: 2, megablox: false, capacity_factor: 1, "
            "per_device_batch_size: 5, remat_policy: custom (the projections 'device'), "
            "dcn_fsdp_parallelism: 2, dcn_data_parallelism: 16, ici_expert_parallelism: 8, "
            "weight_dtype: bfloat16, scan_layers: false",
        ),
        config=dataclasses.replace(
            MIXTRAL_8X7B,
            capacity_factor=1.0,
            batch_per_device=5,
            ici=Parallelism(expert=8),
            dcn=Parallelism(data=16, fsdp=2),
            remat_policy="custom",
            saved=MIXTRAL_SAVED,
            weight_dtype="bfloat16",
        ),
        xla_flags=_maxtext_gpu_flags(
            all_reduce=71303168,
            all_gather=536870912,
            reduce_scatter=134217728,
            also=(
                "--xla_gpu_enable_triton_gemm=false",
                '--xla_gpu_enable_command_buffer=""',
            ),
        ),
        assumptions=(
            "MaxText of the recipe's image (ghcr.io/nvidia/jax:maxtext-2025-01-10): with "
            "megablox false its MoE is dense_matmul (capacity-bound dispatch and combine "
            "einsums); ragged_dot came on 2025-01-15",
            "the dispatch as an all-to-all over the expert axis per device (the program's "
            "shard_map), the partition MaxText's einsums ask for; jax 0.12's partitioner, "
            "given only MaxText's sharding constraints, gathers the global batch instead",
            "MaxText's load-balancing loss (a few reductions over the router's mask) left out",
        ),
    ),
    PublishedRun(
        name="a3-ultra-llama3.1-70b",
        title="GPU recipe: MaxText Llama-3.1 70B on A3 Ultra",
        hardware="256 H200 141GB, 32 Google Cloud A3 Ultra hosts, 8x400G RoCE each",
        gpu="h200",
        target="xla_streams/targets/gcp_a3_ultra.json",
        step_s=15.516,
        source=Source(
            RECIPES,
            "training/a3ultra/llama3-1-70b/maxtext-pretraining-gke/README.md",
            "695d769bb88a1bcbbd805c84a98afb1f69797514",
            "completed step: 12, seconds: 15.516, TFLOP/s/device: 508.371, Tokens/s/device: "
            "1055.949, total_weights: 4194304, loss: 0.000",
        ),
        setup=Source(
            RECIPES,
            "src/frameworks/a3ultra/maxtext-configs/llama3-1-70b-256gpus-a3u-bf16.yaml; "
            "training/a3ultra/llama3-1-70b/maxtext-pretraining-gke/values.yaml",
            "695d769bb88a1bcbbd805c84a98afb1f69797514",
            "model_name: llama3.1-70b, dcn_data_parallelism: 2, dcn_fsdp_parallelism: 16, "
            "ici_fsdp_parallelism: 8, per_device_batch_size: 2, max_target_length: 8192, "
            "attention: cudnn_flash_te, remat_policy: save_dot_with_context_except_mlp, "
            "scan_layers: true",
        ),
        config=dataclasses.replace(
            LLAMA3_1_70B,
            batch_per_device=2,
            ici=Parallelism(fsdp=8),
            dcn=Parallelism(data=2, fsdp=16),
            scan_layers=True,
            remat_policy="save_dot_with_context_except_mlp",
        ),
        xla_flags=_maxtext_gpu_flags(
            all_reduce=2147483648,
            all_gather=2147483648,
            reduce_scatter=16777216,
            also=(
                "--xla_gpu_enable_triton_gemm=false",
                "--xla_gpu_graph_level=0",
            ),
        ),
        assumptions=(
            "the README's example log line is the BF16 256-GPU default's: its tokens per "
            "step (4194304 = 256 x 2 x 8192) and TFLOP/s fit it (the 405B README repeats "
            "the same line, where they do not)",
        ),
    ),
    PublishedRun(
        name="a4-llama3.1-70b-fp8",
        title="GPU recipe: MaxText Llama-3.1 70B FP8 on A4",
        hardware="256 B200, 32 Google Cloud A4 hosts, 8x400G RoCE each",
        gpu="b200",
        target="xla_streams/targets/gcp_a4.json",
        step_s=20.935,
        source=Source(
            RECIPES,
            "training/a4/llama3-1-70b/maxtext-pretraining-gke/README.md",
            "a98e777f11acd2ad069b5b2a7162513a7b424c94",
            "completed step: 11, seconds: 20.935, TFLOP/s/device: 1507.142, Tokens/s/device: "
            "3130.521, total_weights: 16777216, loss: 12.329",
        ),
        setup=Source(
            RECIPES,
            "src/frameworks/a4/maxtext-configs/llama3-1-70b-256gpus-a4-fp8.yaml; "
            "training/a4/llama3-1-70b/maxtext-pretraining-gke/values.yaml",
            "a98e777f11acd2ad069b5b2a7162513a7b424c94",
            "model_name: llama3.1-70b, dcn_fsdp_parallelism: 32, ici_fsdp_parallelism: 8, "
            "per_device_batch_size: 8, max_target_length: 8192, quantization: fp8, "
            "attention: cudnn_flash_te, remat_policy: full, scan_layers: True",
        ),
        config=dataclasses.replace(
            LLAMA3_1_70B,
            batch_per_device=8,
            ici=Parallelism(fsdp=8),
            dcn=Parallelism(fsdp=32),
            scan_layers=True,
            remat_policy="full",
            fp8=True,
        ),
        xla_flags=_maxtext_gpu_flags(
            all_reduce=2147483648,
            all_gather=2147483648,
            reduce_scatter=16777216,
            also=(
                "--xla_gpu_enable_triton_gemm=false",
                "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL",
            ),
        ),
        assumptions=(
            "the README's example log line is the FP8 256-GPU default's (the first and "
            "default command; its tokens per step are 256 x 8 x 8192)",
            "FP8 as Flax's Fp8DotGeneralOp quantizes (MaxText quantization=fp8), scaled by "
            "each tensor's own amax instead of its amax history",
        ),
    ),
    PublishedRun(
        name="a4-llama3.1-405b-fp8",
        title="GPU recipe: MaxText Llama-3.1 405B FP8 on A4",
        hardware="256 B200, 32 Google Cloud A4 hosts, 8x400G RoCE each",
        gpu="b200",
        target="xla_streams/targets/gcp_a4.json",
        step_s=28.294,
        source=Source(
            RECIPES,
            "training/a4/llama3-1-405b/maxtext-pretraining-gke/README.md",
            "ca27a39d54c40cddfd0f8ed0c82fc02a2be627f9",
            "completed step: 11, seconds: 28.294, TFLOP/s/device: 1520.276, Tokens/s/device: "
            "579.059, total_weights: 4194304, loss: 13.652",
        ),
        setup=Source(
            RECIPES,
            "src/frameworks/a4/maxtext-configs/llama3-1-405b-256gpus-a4-fp8.yaml; "
            "training/a4/llama3-1-405b/maxtext-pretraining-gke/values.yaml",
            "ca27a39d54c40cddfd0f8ed0c82fc02a2be627f9",
            "model_name: llama3.1-405b, dcn_data_parallelism: 2, dcn_fsdp_parallelism: 16, "
            "ici_fsdp_parallelism: 8, per_device_batch_size: 2, max_target_length: 8192, "
            "quantization: fp8, attention: cudnn_flash_te, remat_policy: full "
            "(scan_layers: MaxText's default, true)",
        ),
        config=dataclasses.replace(
            LLAMA3_1_405B,
            batch_per_device=2,
            ici=Parallelism(fsdp=8),
            dcn=Parallelism(data=2, fsdp=16),
            scan_layers=True,
            remat_policy="full",
            fp8=True,
        ),
        xla_flags=_maxtext_gpu_flags(
            all_reduce=17179869184,
            all_gather=17179869184,
            reduce_scatter=17179869184,
            also=(
                "--xla_gpu_enable_triton_gemm=false",
                "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL",
            ),
        ),
        assumptions=(
            "the README's example log line is the FP8 256-GPU default's (the first and "
            "default command; its tokens per step are 256 x 2 x 8192)",
            "FP8 as Flax's Fp8DotGeneralOp quantizes (MaxText quantization=fp8), scaled by "
            "each tensor's own amax instead of its amax history",
        ),
    ),
)
RUNS_BY_NAME = {run.name: run for run in RUNS}


def run_target(run: PublishedRun) -> Target:
    """The simulator's target of ``run``'s cluster: a built-in name or a target file."""
    if run.target.endswith(".json"):
        return load_target(REPO / run.target)
    return get_target(run.target)


def xla_flags_for(run: PublishedRun) -> str:
    """The XLA_FLAGS a row's compiles run with: the published flags as jax 0.12 takes
    them, then XLA's estimator told the cluster."""
    flags, _ = runnable_flags(run.xla_flags)
    options = estimator_options(run_target(run))
    return " ".join([*flags, f"--{ESTIMATOR_OPTIONS_FLAG}={options}"])


# -- one row's compiles, in a process of its own --------------------------------------------


@dataclasses.dataclass(frozen=True)
class Span:
    """A step time's range (seconds)."""

    low: float
    high: float


@dataclasses.dataclass(frozen=True)
class XlaPoint:
    """XLA's estimate of one compile (seconds): its step without the waits on its
    placeholders, its exposed communication, and the placeholders it had."""

    step_s: float
    exposed_communication_s: float
    placeholders: int


@dataclasses.dataclass(frozen=True)
class CompiledPoint:
    """One compile of a row's model and its prediction (``rows[i].compiles[j]``)."""

    layers: int
    step_s: float
    range_s: Span
    compute_only_s: float
    exposed_communication_s: float
    async_collective_pairs: int
    flash_attention_calls: int
    xla: XlaPoint
    compile_s: float
    simulate_s: float


def compile_point(name: str, layers: int) -> CompiledPoint:
    """Compile row ``name`` with ``layers`` layers for its GPUs, deviceless, with XLA's
    schedule dumped; simulate it as XLA runs it on jax 0.12 (one collective stream, the
    default overlap limit, sync collectives on the compute stream). Runs in a process
    whose XLA_FLAGS are the row's (:func:`xla_flags_for`)."""
    run = RUNS_BY_NAME[name]
    begin = time.perf_counter()
    config = dataclasses.replace(run.config, layers=layers)
    topology = gpu_topology(run.gpu, config.devices, config.ici.devices, hosts_per_domain=1)
    fn, args = llama_train_step(topology.devices, config)
    compiled = compile_for_gpu(fn, args, dump=False, schedule=True)
    compile_s = time.perf_counter() - begin
    begin = time.perf_counter()
    module = parse_module(compiled.as_text, f"<{name}, {layers} layers>")
    model = StreamModel(overlap_limit=XLA_DEFAULT_OVERLAP_LIMIT, sync_on_compute=True)
    sim = Simulator(module, run_target(run), model=model)
    one_stream = assign_streams(sim.pairs, 1, "interval")  # what XLA does
    result = sim.run(one_stream)
    span = predict_range(sim, one_stream)
    estimate = parse_schedule(compiled.schedule_text, f"<{name}, {layers} layers: schedule>")
    attention = sum(
        1
        for comp in module.computations
        for inst in comp.instructions
        if inst.opcode == "custom-call" and "fmha" in (inst.attribute("custom_call_target") or "")
    )
    return CompiledPoint(
        layers=layers,
        step_s=result.step_time,
        range_s=Span(span.low, span.high),
        compute_only_s=result.compute_time,
        exposed_communication_s=result.exposed_communication,
        async_collective_pairs=len(sim.pairs),
        flash_attention_calls=attention,
        xla=XlaPoint(
            step_s=estimate.priced_step_us * 1e-6,
            exposed_communication_s=estimate.exposed_communication_us * 1e-6,
            placeholders=len(estimate.placeholders),
        ),
        compile_s=compile_s,
        simulate_s=time.perf_counter() - begin,
    )


@contextmanager
def _environment(**values: str) -> Iterator[None]:
    """``os.environ`` with ``values`` set, restored after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def compile_points(run: PublishedRun, counts: Sequence[int]) -> list[CompiledPoint]:
    """:func:`compile_point` for each count, in a fresh process whose XLA_FLAGS are the
    row's (XLA reads them once per process)."""
    spawn = multiprocessing.get_context("spawn")
    with (
        _environment(JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags_for(run)),
        ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool,
    ):
        return [pool.submit(compile_point, run.name, n).result() for n in counts]


# -- the table -----------------------------------------------------------------------------


def extrapolate(points: dict[int, float], layers: int) -> float:
    """The value at ``layers`` on the line through two (layer count, value) points;
    ValueError unless there are two distinct counts, each at least MIN_FIT_LAYERS."""
    if len(points) != 2:
        raise ValueError(f"a linear fit needs two layer counts, got {sorted(points)}")
    (a, ta), (b, tb) = sorted(points.items())
    if a < MIN_FIT_LAYERS:
        raise ValueError(
            f"a fit from {a} layer(s) is not sound: give counts of at least {MIN_FIT_LAYERS}"
        )
    return ta + (layers - a) * (tb - ta) / (b - a)


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


def default_layers(run: PublishedRun) -> tuple[int, ...]:
    """A row's depth unless told: a scanned model whole, an unrolled one fitted."""
    return (run.config.layers,) if run.config.scan_layers else FIT_LAYERS


@dataclasses.dataclass(frozen=True)
class Row:
    """One published run, its prediction and XLA's estimate (``rows[i]``). The
    predictions are None when the compiles do not predict the full model."""

    name: str
    title: str
    hardware: str
    devices: int
    hosts: int
    target: str
    source: str  # its address
    quote: str  # the published row, verbatim
    setup: str  # where the configuration and flags were read, and what they say
    configuration: dict[str, Any]  # the program's LlamaConfig
    xla_flags: tuple[str, ...]  # as compiled
    flag_notes: tuple[str, ...]  # published flags jax 0.12 does not take, and why
    estimator_options: str  # what XLA's estimator was told of the cluster
    assumptions: tuple[str, ...]
    published_step_s: float
    published_tflops_per_device: float | None
    predicted_step_s: float | None
    predicted_range_s: Span | None
    error: float | None  # predicted / published - 1
    inside_range: bool | None
    exposed_communication_s: float | None
    xla_step_s: float | None  # XLA's estimate without its placeholders
    xla_error: float | None
    xla_exposed_communication_s: float | None
    xla_placeholders: int  # in the largest compile
    how: str
    compiles: tuple[CompiledPoint, ...]


@dataclasses.dataclass(frozen=True)
class Summary:
    """The table's errors (absolute, relative to the published time) over the rows
    predicted."""

    rows: int
    median_abs_error: float
    worst_abs_error: float
    inside_range: int
    xla_median_abs_error: float
    xla_worst_abs_error: float


@dataclasses.dataclass(frozen=True)
class PublishedTable:
    """What the script found: schema ``xla_streams.published.v2`` (``--json``). Read by
    the docs' table (:func:`markdown`) and the script's test."""

    rows: tuple[Row, ...]
    summary: Summary | None  # None: no row predicted
    jax: str

    def to_json(self) -> str:
        data = {"schema": SCHEMA, **dataclasses.asdict(self)}
        return json.dumps(data, indent=2, ensure_ascii=True, allow_nan=False) + "\n"


def row_of(run: PublishedRun, points: Sequence[CompiledPoint]) -> Row:
    """A row: the prediction of the full model from its compiles (one of the full depth,
    or two fitted)."""
    full = run.config.layers
    by_layers = {p.layers: p for p in points}

    def at_full(value: Any) -> float | None:
        if full in by_layers:
            return float(value(by_layers[full]))
        if len(by_layers) == 2:
            return extrapolate({n: value(p) for n, p in by_layers.items()}, full)
        return None

    predicted = at_full(lambda p: p.step_s)
    low, high = at_full(lambda p: p.range_s.low), at_full(lambda p: p.range_s.high)
    xla = at_full(lambda p: p.xla.step_s)
    if full in by_layers:
        how = f"compiled with all {full} layers"
    elif len(by_layers) == 2:
        how = f"extrapolated to {full} layers from {' and '.join(map(str, sorted(by_layers)))}"
    else:
        how = f"{points[0].layers} layers only: no prediction of the published model"
    flags, notes = runnable_flags(run.xla_flags)
    published = run.step_s
    return Row(
        name=run.name,
        title=run.title,
        hardware=run.hardware,
        devices=run.config.devices,
        hosts=run.hosts,
        target=run.target,
        source=run.source.url,
        quote=run.source.quote,
        setup=f"{run.setup.repo} at {run.setup.commit}, {run.setup.path}: {run.setup.quote}",
        configuration=dataclasses.asdict(run.config),
        xla_flags=flags,
        flag_notes=notes,
        estimator_options=estimator_options(run_target(run)),
        assumptions=run.assumptions,
        published_step_s=published,
        published_tflops_per_device=run.tflops_per_device,
        predicted_step_s=predicted,
        predicted_range_s=None if low is None or high is None else Span(low, high),
        error=None if predicted is None else predicted / published - 1,
        inside_range=None if low is None or high is None else low <= published <= high,
        exposed_communication_s=at_full(lambda p: p.exposed_communication_s),
        xla_step_s=xla,
        xla_error=None if xla is None else xla / published - 1,
        xla_exposed_communication_s=at_full(lambda p: p.xla.exposed_communication_s),
        xla_placeholders=max(p.xla.placeholders for p in points),
        how=how,
        compiles=tuple(points),
    )


def summary_of(rows: Sequence[Row]) -> Summary | None:
    predicted = [r for r in rows if r.error is not None and r.xla_error is not None]
    if not predicted:
        return None
    ours = [abs(r.error) for r in predicted if r.error is not None]
    theirs = [abs(r.xla_error) for r in predicted if r.xla_error is not None]
    return Summary(
        rows=len(predicted),
        median_abs_error=statistics.median(ours),
        worst_abs_error=max(ours),
        inside_range=sum(1 for r in predicted if r.inside_range),
        xla_median_abs_error=statistics.median(theirs),
        xla_worst_abs_error=max(theirs),
    )


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:+.0%}"


def format_table(table: PublishedTable) -> str:
    """The table for a terminal: a block per row, then the errors."""
    lines = []
    for r in table.rows:
        c = r.configuration
        moe = f", {c['experts']} experts (top {c['experts_per_token']})" if c["experts"] else ""
        lines += [
            f"{r.title}: {r.hardware}",
            f"  {c['layers']} layers, d_model {c['d_model']}, {c['heads']} heads "
            f"({c['kv_heads']} kv) of {c['head_dim']}, ffn {c['d_ff']}{moe}, vocab "
            f"{c['vocab']}, seq {c['seq']}, {c['batch_per_device']} per GPU, "
            f"{'FP8' if c['fp8'] else 'BF16'}, remat {c['remat_policy']}, scan "
            f"{'on' if c['scan_layers'] else 'off'}; target {r.target}",
            f"  source: {r.source}",
            f"  published: {r.quote}",
        ]
        for p in r.compiles:
            lines.append(
                f"  {p.layers} layers: predicted {p.step_s:.4f} s (range {p.range_s.low:.4f} .. "
                f"{p.range_s.high:.4f}; compute only {p.compute_only_s:.4f} s, exposed "
                f"communication {p.exposed_communication_s:.4f} s); XLA {p.xla.step_s:.4f} s "
                f"(exposed {p.xla.exposed_communication_s:.4f} s, {p.xla.placeholders} "
                f"placeholders); compiled in {p.compile_s:.1f} s, simulated in "
                f"{p.simulate_s:.1f} s"
            )
        if r.predicted_step_s is None or r.predicted_range_s is None:
            lines.append(f"  {r.how}")
            continue
        inside = "inside" if r.inside_range else "OUTSIDE"
        lines.append(
            f"  predicted {r.predicted_step_s:.3f} s ({r.how}; range "
            f"{r.predicted_range_s.low:.3f} .. {r.predicted_range_s.high:.3f} s, published "
            f"{inside}), published {r.published_step_s:.3f} s: {_percent(r.error)}; XLA's "
            f"estimate {r.xla_step_s:.3f} s: {_percent(r.xla_error)}"
        )
    s = table.summary
    if s is not None:
        lines.append(
            f"{s.rows} rows: median |error| {s.median_abs_error:.1%}, worst "
            f"{s.worst_abs_error:.1%}, {s.inside_range} published times inside the range; "
            f"XLA's estimate: median {s.xla_median_abs_error:.1%}, worst "
            f"{s.xla_worst_abs_error:.1%}"
        )
    return "\n".join(lines) + "\n"


def markdown(table: PublishedTable) -> str:
    """The table docs/predictions.md shows (from the last full run's JSON)."""
    out = [
        "| run | GPUs | published | predicted (range) | error | XLA's estimate | XLA's error |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in table.rows:
        if r.predicted_step_s is None or r.predicted_range_s is None:
            continue
        span = r.predicted_range_s
        flag = "" if r.inside_range else " (outside)"
        placeholders = f" ({r.xla_placeholders} placeholders)" if r.xla_placeholders else ""
        out.append(
            f"| [{r.title}]({r.source}) | {r.devices} | {r.published_step_s:.3f} s | "
            f"{r.predicted_step_s:.3f} s ({span.low:.3f} - {span.high:.3f}){flag} | "
            f"{_percent(r.error)} | {r.xla_step_s:.3f} s{placeholders} | "
            f"{_percent(r.xla_error)} |"
        )
    s = table.summary
    if s is not None:
        out.append(
            f"| **{s.rows} rows** | | | {s.inside_range} inside their range | median "
            f"{s.median_abs_error:.1%}, worst {s.worst_abs_error:.1%} | | median "
            f"{s.xla_median_abs_error:.1%}, worst {s.xla_worst_abs_error:.1%} |"
        )
    return "\n".join(out) + "\n"


def load_table(path: Path) -> PublishedTable:
    """A table this script wrote with ``--json``."""
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a table of this script ({SCHEMA})")

    def point(p: dict[str, Any]) -> CompiledPoint:
        return CompiledPoint(**{**p, "range_s": Span(**p["range_s"]), "xla": XlaPoint(**p["xla"])})

    rows = tuple(
        Row(
            **{
                **r,
                "xla_flags": tuple(r["xla_flags"]),
                "flag_notes": tuple(r["flag_notes"]),
                "assumptions": tuple(r["assumptions"]),
                "predicted_range_s": None
                if r["predicted_range_s"] is None
                else Span(**r["predicted_range_s"]),
                "compiles": tuple(point(p) for p in r["compiles"]),
            }
        )
        for r in raw["rows"]
    )
    summary = None if raw["summary"] is None else Summary(**raw["summary"])
    return PublishedTable(rows=rows, summary=summary, jax=raw["jax"])


def list_runs() -> str:
    lines = []
    for run in RUNS:
        lines += [
            f"{run.name}: {run.title}, {run.hardware}; published {run.step_s:.3f} s"
            + (
                f" ({run.tflops_per_device:g} TFLOP/s per GPU)"
                if run.tflops_per_device is not None
                else ""
            ),
            f"  {run.source.url}",
            f"  {run.source.quote}",
        ]
    return "\n".join(lines) + "\n"


def _jax_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jax")
    except PackageNotFoundError:
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--rows",
        help=f"comma-separated rows to predict (default: all; --list names them): "
        f"{', '.join(RUNS_BY_NAME)}",
    )
    parser.add_argument(
        "--layers",
        type=parse_layers,
        help="one layer count for every row, or two to fit and extrapolate from (each at "
        f"least {MIN_FIT_LAYERS}); default: a scanned row whole, an unrolled one fitted "
        f"from {','.join(map(str, FIT_LAYERS))}",
    )
    parser.add_argument("--json", help="also write the table as JSON to this file")
    parser.add_argument("--list", action="store_true", help="list the rows and exit")
    parser.add_argument(
        "--markdown",
        nargs="?",
        const=str(LAST_RUN),
        metavar="JSON",
        help="print the docs' table of a --json file (default: the last full run, "
        f"{LAST_RUN.relative_to(REPO)}) and exit",
    )
    args = parser.parse_args(argv)
    if args.list:
        sys.stdout.write(list_runs())
        return 0
    if args.markdown:
        sys.stdout.write(markdown(load_table(Path(args.markdown))))
        return 0
    names = [n.strip() for n in (args.rows or ",".join(RUNS_BY_NAME)).split(",") if n.strip()]
    unknown = [n for n in names if n not in RUNS_BY_NAME]
    if unknown or not names:
        parser.error(f"unknown rows {unknown}; known: {', '.join(RUNS_BY_NAME)}")
    rows = []
    for name in names:
        run = RUNS_BY_NAME[name]
        counts = args.layers or default_layers(run)
        print(f"[{name}] compiling {' and '.join(map(str, counts))} layers", file=sys.stderr)
        rows.append(row_of(run, compile_points(run, counts)))
    table = PublishedTable(rows=tuple(rows), summary=summary_of(rows), jax=_jax_version())
    sys.stdout.write(format_table(table))
    if args.json:
        Path(args.json).write_text(table.to_json())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
