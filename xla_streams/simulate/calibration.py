"""Measured corrections to the cost model: the calibration file.

The cost model's constants come from datasheets and NCCL's tuner (``targets.py``);
a calibration file says, per target, how far off its predictions were on a real
GPU, as ``measured time / predicted time`` per kernel class. The simulator then
multiplies each prediction by its class's ratio. Schema
``xla_streams.calibration.v1`` (docs/formats.md)::

    {
      "schema": "xla_streams.calibration.v1",
      "provenance": {"gpu": "NVIDIA H200", "jax": "0.11.2", "date": "2026-08-30",
                     "program": "transformer_step, one device's program",
                     "tool": "tools/gpu_check.py"},
      "targets": {
        "h200": {"matmul": 1.31, "memory": 0.92, "collective": {"all-reduce": 1.1}}
      }
    }

Classes: ``matmul`` (dots, convolutions, GEMM fusions, cuBLAS/cuDNN calls),
``memory`` (every other kernel: memory-bound fusions, copies) and, under
``collective``, one ratio per collective kind (its latency and transfer scale
together). A class left out keeps ratio 1. ``provenance`` records where the
numbers were measured (free-form strings; ``gpu``, ``jax``, ``date`` and
``program`` are expected).

Producing one: :func:`calibrate` from the kernel times a profiler trace measured
(:mod:`~xla_streams.simulate.profiler_trace`) of one program's module, as
``xla-streams calibrate TRACE --hlo=MODULE.hlo --target=h200 --json=calibration.json``
does; ``python tools/gpu_check.py OUT_DIR`` on a machine with an NVIDIA GPU
measures one and writes ``OUT_DIR/calibration.json``. Both give the compute
classes only: collective ratios need two or more GPUs; take them from NCCL's own
tests and add them by hand. Using one: ``xla-streams simulate IN.hlo --target=h200
--calibration=calibration.json``, or ``load_calibration(path).apply(target)``.

Per-instruction measurements have a format of their own, XLA's PGLE profile
(``ProfiledInstructionsProto``, what ``--xla_gpu_pgle_profile_file_or_directory_path``
reads): the same GPU check writes ``OUT_DIR/pgle_profile.pb`` for the program it
calibrated on, and for any program ``jax.profiler.trace(DIR)`` around a few steps
followed by ``jax.experimental.profiler.get_profiled_instructions_proto(
"DIR/plugins/profile/<run>")`` makes one (JAX's ``JAX_ENABLE_PGLE=true`` does it
on its own). Class ratios carry over to other programs; a PGLE profile only to
the program it was measured on: the simulator takes it as that program's measured
costs (``profile.py``: ``Simulator(module, target, measured=load_profile(path)
.for_module(module))``), which replace the model's for the instructions it names.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xla_streams import _json
from xla_streams.collectives import KINDS
from xla_streams.hlo import Module, parse_module
from xla_streams.simulate.simulator import Simulator
from xla_streams.simulate.targets import Target, get_target
from xla_streams.streams import assign_streams

SCHEMA = "xla_streams.calibration.v1"
COMPUTE_CLASSES = ("matmul", "memory")
COLLECTIVE_KINDS = tuple(sorted(KINDS))


class CalibrationError(ValueError):
    """A calibration file that cannot be read or does not fit the target."""


@dataclass(frozen=True)
class Calibration:
    """Ratios (measured / predicted) per target name and class, and where they come from.

    ``ratios[target]`` maps ``matmul``, ``memory`` and collective kinds to ratios.
    """

    ratios: dict[str, dict[str, float]]
    provenance: dict[str, str] = field(default_factory=dict)

    def apply(self, target: Target) -> Target:
        """``target`` with this file's ratios for it (CalibrationError if it has none)."""
        ratios = self.ratios.get(target.name)
        if ratios is None:
            known = ", ".join(sorted(self.ratios)) or "none"
            raise CalibrationError(
                f"the calibration has no ratios for target '{target.name}' (it has: {known})"
            )
        origin = ", ".join(f"{k} {v}" for k, v in sorted(self.provenance.items()))
        return dataclasses.replace(
            target,
            calibration={**target.calibration, **ratios},
            sources=(*target.sources, f"calibration: {origin or 'no provenance given'}"),
        )

    def to_json(self) -> str:
        """The file: per target the compute classes, then the collective kinds."""
        targets: dict[str, dict[str, Any]] = {}
        for name, ratios in sorted(self.ratios.items()):
            entry: dict[str, Any] = {c: ratios[c] for c in COMPUTE_CLASSES if c in ratios}
            collective = {k: v for k, v in sorted(ratios.items()) if k in COLLECTIVE_KINDS}
            if collective:
                entry["collective"] = collective
            targets[name] = entry
        data = {"schema": SCHEMA, "provenance": dict(self.provenance), "targets": targets}
        return _json.dumps(data)

    @classmethod
    def from_json(cls, text: str, where: str = "calibration") -> Calibration:
        """The calibration in ``text`` (read from ``where``); CalibrationError naming the
        field for a document that is not one: a wrong type, an unknown key, class or
        collective kind, a ratio that is not a positive number, no target at all."""
        return _read(_json.loads(text, where, CalibrationError, what="calibration file"))


def load_calibration(path: str | Path) -> Calibration:
    """Read and check a calibration file (CalibrationError saying what is wrong, where)."""
    return _read(_json.load(path, CalibrationError, what="calibration file"))


def _read(doc: _json.Value) -> Calibration:
    doc.schema(SCHEMA)
    doc.only("schema", "provenance", "targets")
    given = doc.get("provenance")
    provenance = {} if given is None else {k: v.string() for k, v in given.fields().items()}
    targets = doc["targets"].fields()
    if not targets:
        doc["targets"].fail("expected the ratios of at least one target, got none")
    ratios: dict[str, dict[str, float]] = {}
    for name, entry in targets.items():
        flat: dict[str, float] = {}
        for key, value in entry.fields().items():
            if key == "collective":
                for kind, ratio in value.fields().items():
                    if kind not in COLLECTIVE_KINDS:
                        ratio.fail(
                            f"unknown collective kind '{kind}'; kinds: "
                            + ", ".join(COLLECTIVE_KINDS)
                        )
                    flat[kind] = _ratio(ratio)
            elif key in COMPUTE_CLASSES:
                flat[key] = _ratio(value)
            else:
                value.fail(
                    f"unknown class '{key}'; classes: "
                    + ", ".join((*COMPUTE_CLASSES, "collective"))
                )
        ratios[name] = flat
    return Calibration(ratios, provenance)


def _ratio(doc: _json.Value) -> float:
    """measured / predicted: a positive number."""
    value = doc.raw
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        doc.fail(f"a ratio must be a positive number, got {_json.describe(value)}")
    return float(value)


@dataclass(frozen=True)
class ClassTimes:
    """Predicted and measured time of one kernel class, summed over matched instructions."""

    predicted: float
    measured: float
    instructions: int

    @property
    def ratio(self) -> float:
        return self.measured / self.predicted if self.predicted > 0 else math.nan


def compare_kernel_classes(
    module: Module, target: Target, measured: Mapping[str, float]
) -> dict[str, ClassTimes]:
    """Per compute class, the model's time against ``measured`` (instruction name ->
    seconds of its kernels in one execution), over the compute instructions the
    simulator charges that were measured (collectives and control flow are not).

    Each instruction counts once: for a program whose loops are unrolled (as the
    embedded ones calibrated by ``tools/gpu_check.py``) that is one step.
    ``target`` should be uncalibrated, so that the ratios are against the model.
    """
    totals = {c: ClassTimes(0.0, 0.0, 0) for c in COMPUTE_CLASSES}
    for name, (kind, predicted) in Simulator(module, target).kernels().items():
        seconds = measured.get(name)
        if seconds is not None and kind in totals:
            t = totals[kind]
            totals[kind] = ClassTimes(
                t.predicted + predicted, t.measured + seconds, t.instructions + 1
            )
    return totals


def calibrate(
    hlo_text: str,
    measured: Mapping[str, float],
    step_seconds: float | None,
    provenance: Mapping[str, str],
    target: str,
) -> tuple[Calibration, dict[str, Any]]:
    """The calibration of ``target`` from measured kernel times per instruction of one
    step (``measured``, as :func:`~xla_streams.simulate.profiler_trace.seconds_by_instruction`
    gives them) of the module ``hlo_text``, and the figures: per class and for the
    step's compute, predicted (before and after calibration) against measured
    (``step_seconds``: the measured step, None when unknown).

    A class no measured instruction belongs to gets no ratio (it stays at 1).
    """
    module = parse_module(hlo_text, "<compiled>")
    model = get_target(target)
    classes = compare_kernel_classes(module, model, measured)
    ratios = {c: round(t.ratio, 4) for c, t in classes.items() if t.instructions > 0}
    calibration = Calibration({target: ratios}, dict(provenance))
    step: dict[str, float] = {}
    if step_seconds is not None:
        step["measured_ms"] = round(step_seconds * 1e3, 4)
    for name, chosen in (("predicted", model), ("calibrated", calibration.apply(model))):
        sim = Simulator(module, chosen)
        result = sim.run(assign_streams(sim.pairs, 1, "interval"))
        step[f"{name}_compute_ms"] = round(result.compute_time * 1e3, 4)
        # With the collectives as modelled: for reference (one GPU measures none).
        step[f"{name}_step_with_collectives_ms"] = round(result.step_time * 1e3, 4)
    figures = {
        "ratios": ratios,
        "classes": {
            c: {"predicted_ms": round(t.predicted * 1e3, 4),
                "measured_ms": round(t.measured * 1e3, 4), "instructions": t.instructions}
            for c, t in classes.items()
        },
        "instructions_measured": len(measured),
        "step": step,
    }  # fmt: skip
    return calibration, figures
