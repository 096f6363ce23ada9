"""Programs the tuner reads without their Python: JAX's own dump, or saved StableHLO.

``xla-streams tune DIR_OR_FILE`` takes

- a folder JAX dumped with ``JAX_DUMP_IR_TO=DIR`` (one ``jax_ir<N>_<module>_compile.mlir``
  per XLA compile: the exact StableHLO JAX hands XLA). The training step is the
  largest module with a ``stablehlo.dot_general`` (helpers JAX compiles for random
  numbers, casts and ``device_put`` have none, and under Flax NNX's eager sharding
  they have the step's partitions too, so the partition count cannot tell them
  apart); the others are listed in the result's notes;
- a file of StableHLO text: such a dump file, or ``lowered.as_text()`` saved
  (``as_text(debug_info=True)`` keeps the source locations, so the compiled
  module's instruction names are those of ``lowered.compile()``).

XLA's own dump (``XLA_FLAGS=--xla_dump_to=DIR``) is refused with what to dump
instead: its ``*.before_optimizations.txt`` HLO lost ``num_partitions`` and buffer
donation on the way, so a recompile of it is a different program.

What a dump does not record: which physical devices the partitions ran on (a mesh
over devices 7..0 dumps the same text as one over 0..7). The recompile assigns
partition p to device p of the compile-only topology (host-major, what
``jax.make_mesh`` gives on a symmetric GPU cluster). A module lowered on CPU (a dump
of a CPU run) was lowered with CPU rules: programs with platform-specific lowerings
(cuDNN attention, Pallas/Triton kernels) should be dumped on the GPU cluster, or
lowered there with ``jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))``.
JAX-free.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from xla_streams.tuning.result import TuneError

# A StableHLO file this big is not a training step's (the largest seen are a few MB).
MAX_STABLEHLO_BYTES = 1 << 30
_MODULE = re.compile(r"^module @([^\s{]+)", re.M)
_PARTITIONS = re.compile(r"mhlo\.num_partitions = (\d+)")
_REPLICAS = re.compile(r"mhlo\.num_replicas = (\d+)")


@dataclass(frozen=True)
class StableHlo:
    """One StableHLO module read from a file: its name, where it runs, its size, its
    matrix multiplies."""

    path: Path
    name: str
    replicas: int
    partitions: int
    size: int
    dots: int
    text: str

    @property
    def devices(self) -> int:
        return self.replicas * self.partitions

    def words(self) -> str:
        return (
            f"{self.path.name} ({self.name}: {self.devices} device(s), {self.size} bytes, "
            f"{self.dots} dot_general)"
        )


def parse_stablehlo(text: str, path: Path) -> StableHlo:
    """The :class:`StableHlo` of ``text``; TuneError when it is not StableHLO."""
    module = _MODULE.search(text)
    if module is None or "func.func" not in text:
        if text.lstrip().startswith("HloModule"):
            raise TuneError(
                f"{path}: HLO text, not StableHLO: tune recompiles the StableHLO JAX hands "
                f"XLA; {WHAT_TO_DUMP}"
            )
        raise TuneError(f"{path}: not StableHLO text (no 'module @...' with a func.func)")
    partitions = _PARTITIONS.search(text)
    replicas = _REPLICAS.search(text)
    return StableHlo(
        path=path,
        name=module.group(1),
        replicas=int(replicas.group(1)) if replicas else 1,
        partitions=int(partitions.group(1)) if partitions else 1,
        size=len(text),
        dots=text.count("stablehlo.dot_general"),
        text=text,
    )


WHAT_TO_DUMP = (
    "dump it with JAX_DUMP_IR_TO=DIR python train.py (JAX writes "
    "DIR/jax_ir<N>_jit_<step>_compile.mlir; run one step, on the cluster's devices or "
    "XLA_FLAGS=--xla_force_host_platform_device_count=N on CPU) and pass DIR, or save "
    "jax.jit(step).lower(*args).as_text(debug_info=True) to a file and pass that"
)


def _read(path: Path) -> str:
    try:
        if path.stat().st_size > MAX_STABLEHLO_BYTES:
            raise TuneError(f"{path}: larger than {MAX_STABLEHLO_BYTES} bytes")
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise TuneError(f"cannot read '{path}': {reason}") from None


def is_xla_dump(folder: Path) -> bool:
    """True for a folder XLA's ``--xla_dump_to`` wrote."""
    return any(folder.glob("module_*.before_optimizations.txt")) or any(
        folder.glob("*after_optimizations*.txt")
    )


def read_program(path: str | os.PathLike[str]) -> tuple[StableHlo, list[StableHlo]]:
    """The training step in ``path`` (a ``JAX_DUMP_IR_TO`` folder or a StableHLO file)
    and the other modules of the folder, largest first. Raises TuneError saying what
    to give instead."""
    where = Path(path)
    if where.is_file():
        return parse_stablehlo(_read(where), where), []
    if not where.is_dir():
        raise TuneError(f"cannot read '{where}': no such file or folder")
    files = sorted(where.glob("*.mlir"))
    if not files:
        if is_xla_dump(where):
            inputs = sorted(where.glob("module_*/module.mlir"))
            hint = (
                f" (its PJRT compile inputs hold the same StableHLO: pass "
                f"{inputs[-1]} for one module)"
                if inputs
                else ""
            )
            raise TuneError(
                f"'{where}' is XLA's own dump (--xla_dump_to): its before_optimizations HLO "
                f"loses num_partitions and buffer donation, so it recompiles to a different "
                f"program{hint}. Instead, {WHAT_TO_DUMP}"
            )
        raise TuneError(f"'{where}' holds no StableHLO (*.mlir) files; {WHAT_TO_DUMP}")
    modules = []
    for f in files:
        try:
            modules.append(parse_stablehlo(_read(f), f))
        except TuneError:
            continue  # not StableHLO: another tool's file
    if not modules:
        raise TuneError(f"'{where}' holds no StableHLO module; {WHAT_TO_DUMP}")
    with_dots = [m for m in modules if m.dots]
    pool = with_dots or modules
    step = max(pool, key=lambda m: (m.size, m.devices, m.path.name))
    others = sorted((m for m in modules if m is not step), key=lambda m: -m.size)
    return step, others
