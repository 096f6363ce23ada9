"""``xla-streams tune``: the XLA settings and collective streams that make a program fastest,
found without a GPU.

    xla-streams tune train.py[:build] --devices=32 --devices-per-host=8 [--target=h100]
        [--json=tune.json] [--budget-s=300] [--calibration=cal.json]
    xla-streams tune --program=fsdp_tp_scan

``build(devices) -> (jitted_fn, abstract_args)`` is the contract of
:mod:`xla_streams.programs`: ``devices`` are the compile-only topology's GPUs in
host-major order (device d is on host d // devices_per_host), ``abstract_args``
are ``jax.ShapeDtypeStruct``\\ s sharded over them. From Python::

    result = xla_streams.tune(build, devices=32, devices_per_host=8, target="h100")
    result.best.xla_flags, result.best.streams, result.best.policy, result.command

How it searches
---------------

Each candidate is a set of XLA options (``DebugOptions`` fields, passed to the
deviceless compile as ``compile(compiler_options=...)``: XLA reads ``XLA_FLAGS``
once per process, compile options every time). A compile costs seconds, so:

- Compiles are cached by option set; the number of collective streams K and the
  assignment policy need no compile, only re-assignment and simulation of the
  same module (K > 1 only where the overlap limit is set above 1 and two
  collectives really are in flight: otherwise one stream is all there is).
- The search is coordinate descent from XLA's defaults over the levers, in the
  order their effect is expected (DESIGN.md, "Levers that create overlap"): the
  overlap limit (the prerequisite), the loop pipeliner per collective kind, each
  also tried together with while-loop double buffering (on scan models neither
  pays alone: the pipelined collective only overlaps the next iteration once the
  loop is double buffered), double buffering alone, start-as-early-as-possible,
  XLA's own multi-streaming, the scale-up (NVLink) overlap limit, and lowered
  combine thresholds. A lever's moves are tried from the current best; the best
  move that is faster by ``MIN_GAIN`` (0.5%) and fits in memory is kept. Passes
  repeat, re-trying only levers whose context changed (a move that would only
  take back an option kept earlier is not retried), until one changes nothing.
  Overlap limits above the largest stream count allowed are not tried.
- The recommendation is the search's result when it beats XLA's defaults by
  ``MIN_SPEEDUP`` (1%), else the defaults with one stream, with the reasons;
  never a configuration predicted slower, never one that does not fit. Ties go
  to fewer streams, then the interval policy.
- Levers a module cannot use are skipped, with the reason: the pipeliner and
  double buffering without a while loop holding such a collective, the combine
  thresholds without a combined collective, the scale-up limit without a
  collective inside one host, multi-streaming with at most one collective in
  flight.
- The budget (``--budget-s``, default 300 s) counts everything from the start; a
  compile is started only when the slowest one so far would still fit.

The search is deterministic for the same inputs as long as it ends before the
budget; when the budget stops it, how far it got depends on the machine's speed
(the result says so).

Memory
------

``peak_memory_bytes`` is per GPU, from XLA's own ``compiled.memory_analysis()``:
``temp + argument + output - alias``. XLA:GPU allocates the temporaries as one
block that lives for the whole step, beside the arguments and the outputs that
do not reuse an argument's buffer (donated ones do: ``alias``), so this is what
the executable holds at once (it equals XLA's ``total_allocation_bytes``; the
heap-simulated ``peak_memory_in_bytes`` is at most this). A configuration fits
when that is at most the target's HBM less ``headroom`` (default 10%) for the
CUDA context, NCCL's buffers and the allocator's fragmentation. HBM sizes are the
``device_memory_size`` of XLA's GpuTargetConfigProto for each target
(``xla_streams/targets/``; H200: 143,771 MiB, as nvidia-smi reports it).

What a prediction assumes
-------------------------

The step time is the simulator's (:mod:`xla_streams.simulate`, its module
docstring lists what it models and what not), on the module XLA really
scheduled under those options, with the stream model of jax >= 0.11 (sync
collectives on the compute stream) and the overlap limit of the candidate.
XLA's multi-streaming is predicted as XLA runs it: streams 0 and 1 in turn
(round-robin over two streams), the plugin off. A calibration file
(``--calibration``, :mod:`xla_streams.simulate.calibration`) corrects the cost
model's kernel classes with measured ratios.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from xla_streams import jax_compat
from xla_streams import xla_options as xo
from xla_streams.aot import GPU_CONFIGS
from xla_streams.collectives import MAX_STREAMS, POLICIES, AsyncPair

if TYPE_CHECKING:
    from absl import flags

    from xla_streams.hlo import Module
    from xla_streams.simulate.targets import Target

SCHEMA = "xla_streams.tune.v1"
DEFAULT_BUDGET_S = 300.0
DEFAULT_HEADROOM = 0.10
# The recommendation must beat XLA's defaults by this fraction, or the defaults stay.
MIN_SPEEDUP = 0.01
# A lever's move is kept only when it makes the current best this much faster.
MIN_GAIN = 0.005
STREAM_COUNTS = (1, 2, 4, 8)
# Overlap limits tried (besides XLA's default, 1).
OVERLAP_LIMITS = (2, 4)
DEFAULT_BUILDER = "build"
DEFAULT_SCRIPT = "python train.py"
TARGET_NAMES = tuple(GPU_CONFIGS)  # the GPUs we compile for without one
# Combine thresholds tried below XLA's default (about 30 MiB).
LOWERED_COMBINE_THRESHOLD = 4 << 20

Builder = Callable[[Sequence[Any]], Any]
Flags = dict[str, object]


class TuneError(ValueError):
    """Bad input to the tuner (a program, a builder, a flag, a tune file): one line."""


# -- results -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Configuration:
    """XLA options, the number of collective streams and the policy, with what they cost.

    ``xla_flags`` keys are ``DebugOptions`` field names, values as
    ``compile(compiler_options=...)`` takes them. ``streams`` 1 means the plugin
    is off. ``compile_s`` is set on candidates only.
    """

    xla_flags: Mapping[str, object]
    streams: int
    policy: str
    predicted_step_ms: float
    peak_memory_bytes: int
    exposed_communication_ms: float | None = None
    compile_s: float | None = None
    fits: bool = True
    by_streams: Mapping[int, float] = field(default_factory=dict)  # K -> step ms (best policy)

    @property
    def settings(self) -> str:
        """The options in short words: ``overlap-limit=4, pipeline-all-gather=on``."""
        return describe(self.xla_flags)

    def to_json(self, *, candidate: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "xla_flags": dict(sorted(self.xla_flags.items())),
            "streams": self.streams,
            "policy": self.policy,
            "predicted_step_ms": round(self.predicted_step_ms, 6),
            "peak_memory_bytes": self.peak_memory_bytes,
        }
        if self.exposed_communication_ms is not None:
            out["exposed_communication_ms"] = round(self.exposed_communication_ms, 6)
        if candidate:
            out["compile_s"] = round(self.compile_s or 0.0, 3)
            out["fits"] = self.fits
            out["settings"] = self.settings
            if self.by_streams:
                out["step_ms_by_streams"] = {
                    str(k): round(v, 6) for k, v in sorted(self.by_streams.items())
                }
        return out


@dataclass(frozen=True)
class TuneResult:
    """What ``tune`` found: schema ``xla_streams.tune.v1`` (:meth:`to_json`)."""

    program: str
    target: str
    devices: int
    devices_per_host: int
    baseline: Configuration
    best: Configuration
    candidates: tuple[Configuration, ...]
    command: str
    hbm_bytes: int = 0
    headroom: float = DEFAULT_HEADROOM
    verdict: str = ""
    reasons: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    elapsed_s: float = 0.0
    budget_s: float = DEFAULT_BUDGET_S
    compiles: int = 0
    script: str = DEFAULT_SCRIPT
    # The recommendation's scheduled module (compiled.as_text()); not in the JSON.
    best_hlo: str = field(default="", repr=False, compare=False)

    @property
    def speedup(self) -> float:
        """Baseline step time over the recommended one's (1.0: the baseline stays)."""
        best = self.best.predicted_step_ms
        return self.baseline.predicted_step_ms / best if best > 0 else 1.0

    @property
    def memory_limit_bytes(self) -> int:
        return int(self.hbm_bytes * (1.0 - self.headroom))

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "program": self.program,
            "target": self.target,
            "devices": self.devices,
            "devices_per_host": self.devices_per_host,
            "baseline": self.baseline.to_json(),
            "best": self.best.to_json(),
            "candidates": [c.to_json(candidate=True) for c in self.candidates],
            "command": self.command,
            "speedup": round(self.speedup, 4),
            "verdict": self.verdict,
            "reasons": list(self.reasons),
            "hbm_bytes": self.hbm_bytes,
            "headroom": self.headroom,
            "skipped": list(self.skipped),
            "notes": list(self.notes),
            "compiles": self.compiles,
            "elapsed_s": round(self.elapsed_s, 1),
            "budget_s": self.budget_s,
        }

    def json_text(self) -> str:
        return json.dumps(self.to_json(), indent=1) + "\n"

    def table(self) -> str:
        """The ranked candidates and the recommendation, as text."""
        return format_result(self)


# -- XLA options in words ------------------------------------------------------------------

_LABELS: dict[str, str] = {
    xo.OVERLAP_LIMIT: "overlap-limit",
    **{name: f"pipeline-{kind}" for kind, name in xo.PIPELINE.items()},
    xo.WHILE_LOOP_DOUBLE_BUFFERING: "double-buffering",
    xo.START_AS_EARLY_AS_POSSIBLE: "start-early",
    xo.MULTI_STREAMING: "xla-multi-streaming",
    xo.SCALE_UP_OVERLAP_LIMIT: "scale-up-overlap-limit",
    **{name: f"{kind}-combine-threshold" for kind, name in xo.COMBINE_THRESHOLD.items()},
}


def describe(options: Mapping[str, object]) -> str:
    """``overlap-limit=4, pipeline-all-gather=on``; ``XLA defaults`` for none."""
    if not options:
        return "XLA defaults"
    words = []
    for name in sorted(options, key=_option_order):
        value = options[name]
        if isinstance(value, bool):
            text = "on" if value else "off"
        elif isinstance(value, str) and value.startswith(xo.ENUM_PREFIXES):
            text = xo.as_xla_flags({name: value})[0].split("=", 1)[1].lower()
        elif name in xo.COMBINE_THRESHOLD.values() and isinstance(value, int):
            text = _bytes(value)
        else:
            text = str(value)
        words.append(f"{_LABELS.get(name, name)}={text}")
    return ", ".join(words)


def _option_order(name: str) -> tuple[int, str]:
    order = list(_LABELS)
    return (order.index(name) if name in order else len(order), name)


def _bytes(n: int) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    if n >= 2**20:
        return f"{n / 2**20:.0f} MiB" if n % 2**20 == 0 else f"{n / 2**20:.1f} MiB"
    return f"{n} B"


def canonical(options: Mapping[str, object]) -> Flags:
    """``options`` without those set to XLA's default, sorted by name."""
    return {
        name: value
        for name, value in sorted(options.items())
        if name not in xo.DEFAULTS or xo.DEFAULTS[name] != value
    }


def command_line(
    xla_flags: Mapping[str, object], streams: int, policy: str, script: str = DEFAULT_SCRIPT
) -> str:
    """The shell line that runs ``script`` with these settings (the plugin reads the
    ``XLA_STREAMS_*`` variables; XLA reads ``XLA_FLAGS``)."""
    parts = []
    if xla_flags:
        parts.append("XLA_FLAGS=" + shlex.quote(" ".join(xo.as_xla_flags(dict(xla_flags)))))
    if streams > 1:
        parts.append(f"XLA_STREAMS_COLLECTIVE_STREAMS={streams}")
        if policy != POLICIES[0]:
            parts.append(f"XLA_STREAMS_POLICY={policy}")
    parts.append(script)
    return " ".join(parts)


# -- the levers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Facts:
    """What XLA's default compile of the program says about which levers can act."""

    async_pairs: int
    collectives: int  # async pairs and plain (synchronous) collectives
    loop_kinds: frozenset[str]  # kinds of collectives inside while loops
    combined_kinds: frozenset[str]  # kinds with a collective of several operands
    within_host: bool  # some collective's groups each sit inside one host
    sync_collectives: int  # plain collectives and sync pairs: nothing between start and done


Move = tuple[str, Flags]


@dataclass(frozen=True)
class Lever:
    """One of XLA's overlap levers: the moves it offers from a configuration, and
    why it cannot act on a module (None: it can)."""

    name: str
    moves: Callable[[Flags], list[Move]]
    skip: Callable[[Facts, Flags], str | None]


def _value(flags: Flags, name: str) -> object:
    return flags.get(name, xo.DEFAULTS.get(name))


def _limit(flags: Flags) -> int:
    value = _value(flags, xo.OVERLAP_LIMIT)
    return value if isinstance(value, int) else 1


def _overlap_moves(limits: Sequence[int]) -> Callable[[Flags], list[Move]]:
    def moves(flags: Flags) -> list[Move]:
        return [(str(v), {xo.OVERLAP_LIMIT: v}) for v in (*limits, 1) if v != _limit(flags)]

    return moves


def _toggle(name: str) -> Callable[[Flags], list[Move]]:
    def moves(flags: Flags) -> list[Move]:
        on = bool(_value(flags, name))
        return [("off", {name: False})] if on else [("on", {name: True})]

    return moves


def _pipeline_moves(kind: str) -> Callable[[Flags], list[Move]]:
    name = xo.PIPELINE[kind]

    def moves(flags: Flags) -> list[Move]:
        if _value(flags, name) == xo.PIPELINING_ON:
            if xo.DEFAULTS.get(name) == xo.PIPELINING_ON:
                return []
            return [("default", {name: xo.DEFAULTS.get(name, xo.PIPELINING_DEFAULT)})]
        out: list[Move] = []
        if not _value(flags, xo.WHILE_LOOP_DOUBLE_BUFFERING):
            out.append(
                (
                    "on+double-buffering",
                    {name: xo.PIPELINING_ON, xo.WHILE_LOOP_DOUBLE_BUFFERING: True},
                )
            )
        out.append(("on", {name: xo.PIPELINING_ON}))
        return out

    return moves


def _scale_up_moves(flags: Flags) -> list[Move]:
    current = _value(flags, xo.SCALE_UP_OVERLAP_LIMIT)
    return [(str(v), {xo.SCALE_UP_OVERLAP_LIMIT: v}) for v in (4, 1) if v != current]


def _combine_moves(kinds: Callable[[], frozenset[str]]) -> Callable[[Flags], list[Move]]:
    def moves(flags: Flags) -> list[Move]:
        names = [xo.COMBINE_THRESHOLD[k] for k in sorted(kinds()) if k in xo.COMBINE_THRESHOLD]
        if not names:
            return []
        lowered = all(_value(flags, n) == LOWERED_COMBINE_THRESHOLD for n in names)
        if lowered:
            return [("default", {n: xo.DEFAULTS[n] for n in names})]
        return [
            (_bytes(LOWERED_COMBINE_THRESHOLD), dict.fromkeys(names, LOWERED_COMBINE_THRESHOLD))
        ]

    return moves


def _needs_collectives(facts: Facts) -> str | None:
    if facts.collectives == 0:
        return "the program has no collectives"
    return None


def _skip_overlap(facts: Facts, flags: Flags) -> str | None:
    if facts.collectives == 0:
        return "the program has no collectives"
    if facts.collectives < 2 and not facts.loop_kinds:
        return "one collective, outside any loop: nothing can be in flight beside it"
    return None


def _skip_pipeline(kind: str) -> Callable[[Facts, Flags], str | None]:
    name = xo.PIPELINE[kind]

    def skip(facts: Facts, flags: Flags) -> str | None:
        if kind not in facts.loop_kinds:
            return f"no {kind} inside a while loop (the pipeliner works on loops)"
        if xo.DEFAULTS.get(name) == xo.PIPELINING_ON and name not in flags:
            return "on by default in this XLA"
        return None

    return skip


def _skip_double_buffering(facts: Facts, flags: Flags) -> str | None:
    if not facts.loop_kinds:
        return "no while loop holds a collective"
    return None


def _skip_start_early(facts: Facts, flags: Flags) -> str | None:
    if facts.async_pairs == 0:
        return "no async collectives (nothing to start earlier)"
    return None


def _skip_multi_streaming(facts: Facts, flags: Flags) -> str | None:
    if facts.async_pairs < 2 and not facts.loop_kinds:
        return "fewer than two async collectives"
    if _limit(flags) <= 1 and not _value(flags, xo.MULTI_STREAMING):
        return "needs the overlap limit above 1 (one collective in flight uses one stream)"
    return None


def _skip_scale_up(facts: Facts, flags: Flags) -> str | None:
    if not facts.within_host:
        return "no collective stays inside one host (NVLink domain)"
    return _needs_collectives(facts)


def _skip_combine(facts: Facts, flags: Flags) -> str | None:
    if not facts.combined_kinds & set(xo.COMBINE_THRESHOLD):
        return "XLA combined no collectives (no multi-operand all-gather/reduce-scatter/all-reduce)"
    return None


def levers(facts: Facts, max_streams: int = max(STREAM_COUNTS)) -> list[Lever]:
    """Every lever, in search order (see the module docstring). Overlap limits above
    ``max_streams`` (the most streams a recommendation may use) are not tried."""
    limits = [v for v in OVERLAP_LIMITS if v <= max(max_streams, 2)]
    return [
        Lever("overlap-limit", _overlap_moves(limits), _skip_overlap),
        Lever("pipeline-all-gather", _pipeline_moves("all-gather"), _skip_pipeline("all-gather")),
        Lever(
            "pipeline-reduce-scatter",
            _pipeline_moves("reduce-scatter"),
            _skip_pipeline("reduce-scatter"),
        ),
        Lever("pipeline-all-reduce", _pipeline_moves("all-reduce"), _skip_pipeline("all-reduce")),
        Lever("double-buffering", _toggle(xo.WHILE_LOOP_DOUBLE_BUFFERING), _skip_double_buffering),
        Lever("start-early", _toggle(xo.START_AS_EARLY_AS_POSSIBLE), _skip_start_early),
        Lever("xla-multi-streaming", _toggle(xo.MULTI_STREAMING), _skip_multi_streaming),
        Lever("scale-up-overlap-limit", _scale_up_moves, _skip_scale_up),
        Lever("combine-thresholds", _combine_moves(lambda: facts.combined_kinds), _skip_combine),
    ]


LEVER_NAMES = (
    "overlap-limit",
    "pipeline-all-gather",
    "pipeline-reduce-scatter",
    "pipeline-all-reduce",
    "double-buffering",
    "start-early",
    "xla-multi-streaming",
    "scale-up-overlap-limit",
    "combine-thresholds",
)


def module_facts(module: Module, pairs: Sequence[AsyncPair], devices_per_host: int) -> Facts:
    """The :class:`Facts` of a scheduled module and its pairs."""
    from xla_streams.collectives import device_groups
    from xla_streams.passes.find_async_pairs import COLLECTIVES

    in_loops = _loop_computations(module)
    loop_kinds: set[str] = set()
    combined: set[str] = set()
    within_host = False

    def inside_one_host(groups: Sequence[Sequence[int]]) -> bool:
        return any(len(g) >= 2 for g in groups) and all(
            len({d // devices_per_host for d in g}) <= 1 for g in groups
        )

    for p in pairs:
        if p.computation in in_loops:
            loop_kinds.add(p.kind)
        comp = module.computation(p.computation)
        start = comp.get(p.start) if comp is not None else None
        if start is not None and len(start.operand_names) >= 2:
            combined.add(p.kind)
        within_host = within_host or inside_one_host(p.groups)
    plain = 0
    paired = {p.start for p in pairs} | {p.done for p in pairs}
    for comp in module.computations:
        for inst in comp.instructions:
            if inst.opcode not in COLLECTIVES or inst.name in paired:
                continue
            plain += 1
            if comp.name in in_loops:
                loop_kinds.add(inst.opcode)
            if len(inst.operand_names) >= 2:
                combined.add(inst.opcode)
            try:
                groups = device_groups(module, inst, inst.opcode)
            except Exception:  # an attribute this front end cannot read: not scale-up
                continue
            within_host = within_host or inside_one_host(groups)
    async_pairs = sum(1 for p in pairs if not p.sync)
    return Facts(
        async_pairs=async_pairs,
        collectives=len(pairs) + plain,
        loop_kinds=frozenset(loop_kinds),
        combined_kinds=frozenset(combined),
        within_host=within_host,
        sync_collectives=plain + sum(1 for p in pairs if p.sync),
    )


def _loop_computations(module: Module) -> set[str]:
    """Names of while bodies and conditions, and what they call, transitively."""
    found: set[str] = set()
    todo: list[str] = []
    for inst in module.instructions():
        if inst.opcode == "while":
            for key in ("body", "condition"):
                value = inst.attribute(key)
                if value:
                    todo.append(value.strip().lstrip("%"))
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        comp = module.computation(name)
        if comp is None:
            continue
        for inst in comp.instructions:
            keys = ("body", "condition", "to_apply") if inst.opcode in ("while", "call") else ()
            for key in keys:
                value = inst.attribute(key)
                if value:
                    todo.append(value.strip().lstrip("%"))
    return found


# -- evaluating one option set -----------------------------------------------------------------


@dataclass(frozen=True)
class MemoryUse:
    """``compiled.memory_analysis()`` of one compile, per GPU (bytes)."""

    argument: int
    output: int
    alias: int
    temp: int
    xla_peak: int = 0  # XLA's heap-simulated peak_memory_in_bytes, where it reports one

    @property
    def peak(self) -> int:
        """What the executable holds at once: temp + argument + output - alias."""
        return self.temp + self.argument + self.output - self.alias


@dataclass
class Evaluation:
    """One compiled option set and the predictions for each (K, policy)."""

    index: int
    flags: Flags
    compile_s: float
    memory: MemoryUse
    fits: bool
    results: dict[tuple[int, str], tuple[float, float]]  # (K, policy) -> (step s, exposed s)
    what: Any  # the simulator's WhatIf (the K=1 grid and the bounds)
    facts: Facts
    label: str = ""
    text: str = ""  # the scheduled module, as compiled.as_text() prints it

    @property
    def best_key(self) -> tuple[int, str]:
        return min(
            self.results,
            key=lambda k: (self.results[k][0], k[0], _policy_index(k[1])),
        )

    @property
    def step(self) -> float:
        return self.results[self.best_key][0]

    def configuration(
        self, key: tuple[int, str] | None = None, *, candidate: bool = False
    ) -> Configuration:
        k, policy = key or self.best_key
        step, exposed = self.results[(k, policy)]
        by_streams: dict[int, float] = {}
        for (kk, _), (s, _) in self.results.items():
            by_streams[kk] = min(by_streams.get(kk, math.inf), s * 1e3)
        return Configuration(
            xla_flags=dict(self.flags),
            streams=k,
            policy=policy,
            predicted_step_ms=step * 1e3,
            peak_memory_bytes=self.memory.peak,
            exposed_communication_ms=exposed * 1e3,
            compile_s=self.compile_s if candidate else None,
            fits=self.fits,
            by_streams=by_streams if candidate else {},
        )


def _policy_index(policy: str) -> int:
    return POLICIES.index(policy) if policy in POLICIES else len(POLICIES)


def _key(flags: Mapping[str, object]) -> str:
    return json.dumps(dict(sorted(flags.items())), sort_keys=True)


def predict(
    text: str,
    flags: Mapping[str, object],
    target: Target,
    *,
    streams: Sequence[int] = STREAM_COUNTS,
    sync_on_compute: bool = True,
) -> tuple[dict[tuple[int, str], tuple[float, float]], Any, Module, tuple[AsyncPair, ...]]:
    """Predictions for the scheduled module ``text`` compiled with ``flags``: per
    (K, policy) the step time and exposed communication (seconds), the what-if,
    the parsed module and its pairs."""
    from xla_streams.collectives import StreamModel, max_in_flight
    from xla_streams.hlo import parse_module
    from xla_streams.passes.find_async_pairs import find_async_pairs
    from xla_streams.simulate import Simulator, what_if

    module = parse_module(text, "<tune>")
    limit = _limit(dict(flags))
    pairs = tuple(find_async_pairs(module, StreamModel(limit, sync_on_compute)))
    simulator = Simulator(module, target, pairs)
    results: dict[tuple[int, str], tuple[float, float]] = {}
    if flags.get(xo.MULTI_STREAMING):
        # XLA runs async collectives on streams 0 and 1 in turn; the plugin stays off.
        what = what_if(module, target, (2,), ("round-robin",), simulator=simulator)
        r = what.results[(2, "round-robin")]
        results[(1, POLICIES[0])] = (r.step_time, r.exposed_communication)
        return results, what, module, pairs
    in_flight = max_in_flight([p for p in pairs if p.needs_stream])
    # More than one stream only where the candidate sets the overlap limit itself: with
    # K > 1 and no limit in XLA_FLAGS the plugin would raise it to K, a different compile.
    if xo.OVERLAP_LIMIT in flags and limit > 1 and in_flight >= 2:
        ks, policies = tuple(sorted(set(streams) | {1})), POLICIES
    else:
        ks, policies = (1,), POLICIES[:1]
    what = what_if(module, target, ks, policies, simulator=simulator)
    for key, r in what.results.items():
        results[(key[0], str(key[1]))] = (r.step_time, r.exposed_communication)
    return results, what, module, pairs


# -- the search ------------------------------------------------------------------------------


class _Progress:
    """A progress bar over the budget, on standard error (one line per step)."""

    WIDTH = 24

    def __init__(self, out: TextIO | None, budget_s: float, start: float) -> None:
        self.out = out
        self.budget_s = budget_s
        self.start = start

    def __call__(self, message: str) -> None:
        if self.out is None:
            return
        elapsed = time.perf_counter() - self.start
        done = min(int(self.WIDTH * elapsed / self.budget_s), self.WIDTH) if self.budget_s else 0
        bar = "#" * done + "." * (self.WIDTH - done)
        print(
            f"[tune {bar} {elapsed:5.0f}s/{self.budget_s:.0f}s] {message}",
            file=self.out,
            flush=True,
        )


class _Budget(Exception):
    """The next compile would not finish within the budget."""


@dataclass
class _Session:
    lowered: Any
    target: Target
    devices_per_host: int
    hbm: int
    memory_limit: int
    budget_s: float
    start: float
    say: Callable[[str], None]
    streams: Sequence[int]
    sync_on_compute: bool
    evaluations: dict[str, Evaluation] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    facts: Facts | None = None
    baseline: Evaluation | None = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def evaluate(self, flags: Flags, label: str) -> Evaluation | None:
        """Compile and predict ``flags`` (cached); None when XLA refused them.
        Raises _Budget when the compile would not fit the budget."""
        key = _key(flags)
        cached = self.evaluations.get(key)
        if cached is not None:
            return cached
        if key in self.failures:
            return None
        if self.durations and self.elapsed() + max(self.durations) > self.budget_s:
            raise _Budget(label)
        self.say(f"compile {len(self.evaluations) + 1}: {label}")
        t0 = time.perf_counter()
        try:
            compiled = self.lowered.compile(compiler_options=compile_options(flags))
            text = compiled.as_text()
        except Exception as e:  # XLA refused the options: note it, go on
            if self.baseline is None:
                raise TuneError(f"XLA could not compile the program: {_first_line(e)}") from None
            self.failures.append(key)
            self.say(f"  XLA refused {describe(flags)}: {_first_line(e)}")
            return None
        compile_s = time.perf_counter() - t0
        memory = _memory_use(compiled)
        results, what, module, pairs = predict(
            text, flags, self.target, streams=self.streams, sync_on_compute=self.sync_on_compute
        )
        if self.facts is None:
            self.facts = module_facts(module, pairs, self.devices_per_host)
        self.durations.append(time.perf_counter() - t0)
        ev = Evaluation(
            index=len(self.evaluations),
            flags=dict(flags),
            compile_s=compile_s,
            memory=memory,
            fits=memory.peak <= self.memory_limit,
            results=results,
            what=what,
            facts=self.facts,
            label=label,
            text=text,
        )
        self.evaluations[key] = ev
        base = self.baseline.step if self.baseline else ev.step
        k, policy = ev.best_key
        self.say(
            f"  {ev.step * 1e3:.3f} ms ({base / ev.step:.3f}x) with K={k} {policy}, "
            f"{_bytes(memory.peak)}{'' if ev.fits else ' (does not fit)'}, "
            f"compiled in {compile_s:.1f}s"
        )
        return ev


def compile_options(flags: Mapping[str, object]) -> dict[str, object]:
    """What a candidate is compiled with: every searched option spelled out (XLA's
    default unless ``flags`` says otherwise), so ``XLA_FLAGS`` in this process
    cannot change the baseline."""
    return {**xo.DEFAULTS, **flags}


def _memory_use(compiled: Any) -> MemoryUse:
    stats = compiled.memory_analysis()
    if stats is None:
        return MemoryUse(0, 0, 0, 0)

    def get(name: str) -> int:
        value = getattr(stats, name, 0)
        return int(value) if isinstance(value, int) else 0

    return MemoryUse(
        argument=get("argument_size_in_bytes"),
        output=get("output_size_in_bytes"),
        alias=get("alias_size_in_bytes"),
        temp=get("temp_size_in_bytes"),
        xla_peak=get("peak_memory_in_bytes"),
    )


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else ""
    line = f"{type(e).__name__}: {line}" if line else type(e).__name__
    return line if len(line) <= 300 else line[:297] + "..."


def _undoes(flags: Flags, current: Flags) -> bool:
    """True when ``flags`` only takes options of ``current`` back to XLA's defaults:
    each was kept because it paid, so the budget goes to new moves instead."""
    return set(flags.items()) < set(current.items())


def search(
    session: _Session, lever_names: Sequence[str] | None = None
) -> tuple[Evaluation, list[str], list[str]]:
    """Coordinate descent from the baseline; returns (the best found, skipped levers, notes)."""
    assert session.baseline is not None and session.facts is not None
    facts = session.facts
    every = {lv.name: lv for lv in levers(facts, max(session.streams))}
    chosen = list(every.values()) if lever_names is None else [every[n] for n in lever_names]
    current = session.baseline
    tried: dict[str, str] = {}
    skipped: dict[str, str] = {}
    notes: list[str] = []
    try:
        while True:
            changed = False
            for lever in chosen:
                context = _key(current.flags)
                if tried.get(lever.name) == context:
                    continue
                why = lever.skip(facts, current.flags)
                if why is not None:
                    skipped[lever.name] = why
                    tried[lever.name] = context
                    continue
                skipped.pop(lever.name, None)
                best: Evaluation | None = None
                for label, settings in lever.moves(current.flags):
                    flags = canonical({**current.flags, **settings})
                    if _key(flags) == context or _undoes(flags, current.flags):
                        continue
                    ev = session.evaluate(
                        flags, f"{lever.name}={label} on {describe(current.flags)}"
                    )
                    if ev is None or not ev.fits:
                        continue
                    if best is None or ev.step < best.step:
                        best = ev
                if best is not None and best.step < current.step * (1 - MIN_GAIN):
                    current = best
                    changed = True
                tried[lever.name] = _key(current.flags)
            if not changed:
                break
    except _Budget as stop:
        untried = [
            lv.name
            for lv in chosen
            if tried.get(lv.name) != _key(current.flags) and lv.name not in skipped
        ]
        notes.append(
            f"the budget ({session.budget_s:.0f} s) stopped the search before {stop.args[0]}"
            + (f"; levers not tried from the best so far: {', '.join(untried)}" if untried else "")
        )
    return current, [f"{name}: {why}" for name, why in skipped.items()], notes


# -- targets --------------------------------------------------------------------------------


def hbm_bytes(target: str) -> int:
    """The per-GPU memory of ``target``: ``device_memory_size`` of its XLA target config."""
    from xla_streams import aot

    match = re.search(r"device_memory_size: (\d+)", aot.target_config(target))
    if match is None:
        raise TuneError(f"no device_memory_size in the target config of {target}")
    return int(match.group(1))


def _simulation_target(target: str, calibration: str | os.PathLike[str] | None) -> Target:
    from xla_streams.simulate.targets import get_target

    chosen = get_target(target)
    if calibration is None:
        return chosen
    try:
        from xla_streams.simulate import calibration as cal
    except ImportError:
        raise TuneError("this version of the simulator takes no calibration file") from None
    try:
        calibrated: Target = cal.load_calibration(os.fspath(calibration)).apply(chosen)
    except (OSError, ValueError) as e:
        raise TuneError(f"calibration: {e}") from None
    return calibrated


def _ensure_deviceless() -> None:
    """Deviceless compiles need JAX_PLATFORMS=cpu before JAX starts its backends."""
    platforms = os.environ.get("JAX_PLATFORMS")
    if platforms == "cpu":
        return
    if platforms is None and not jax_compat.backends_started():
        os.environ["JAX_PLATFORMS"] = "cpu"
        return
    raise TuneError(
        "tune compiles without a GPU and needs JAX_PLATFORMS=cpu before JAX starts "
        f"(it is {platforms!r}); run it in a process of its own"
    )


# -- the program --------------------------------------------------------------------------


def load_builder(spec: str) -> tuple[str, Builder]:
    """``PROGRAM.py[:BUILDER]`` -> (a name for reports, the builder function)."""
    path, name = spec, DEFAULT_BUILDER
    head, sep, tail = spec.rpartition(":")
    if sep and head and re.fullmatch(r"[A-Za-z_]\w*", tail):
        path, name = head, tail
    file = Path(path)
    if not file.is_file():
        why = "no such file" if not file.exists() else "not a file"
        raise TuneError(f"cannot read program '{path}': {why}")
    module_name = f"_xla_streams_tune_{re.sub(r'[^0-9A-Za-z_]', '_', file.stem)}"
    loader_spec = importlib.util.spec_from_file_location(module_name, file)
    if loader_spec is None or loader_spec.loader is None:
        raise TuneError(f"cannot load program '{path}' as Python")
    module = importlib.util.module_from_spec(loader_spec)
    folder = str(file.resolve().parent)
    sys.path.insert(0, folder)
    sys.modules[module_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:
        sys.modules.pop(module_name, None)
        raise TuneError(f"program '{path}' failed to load: {_first_line(e)}") from None
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
    builder = getattr(module, name, None)
    if builder is None:
        defined = sorted(
            n
            for n, v in vars(module).items()
            if callable(v)
            and not n.startswith("_")
            and getattr(v, "__module__", None) == module_name
        )
        listed = f" (it defines: {', '.join(defined)})" if defined else ""
        raise TuneError(f"program '{path}' defines no '{name}'{listed}")
    if not callable(builder):
        raise TuneError(f"'{name}' in '{path}' is not a function")
    return f"{file.name}:{name}", builder


def _build(builder: Builder, devices: Sequence[Any], name: str) -> tuple[Any, tuple[Any, ...]]:
    try:
        built = builder(devices)
    except (Exception, SystemExit) as e:
        raise TuneError(f"{name}(devices) raised {_first_line(e)}") from None
    if not isinstance(built, tuple | list) or len(built) != 2:
        got = type(built).__name__ + (
            f" of {len(built)}" if isinstance(built, tuple | list) else ""
        )
        raise TuneError(f"{name}(devices) must return (jitted_fn, abstract_args), got {got}")
    fn, args = built
    if not callable(fn):
        raise TuneError(f"{name}(devices) returned {type(fn).__name__} as its function")
    if not isinstance(args, tuple | list):
        raise TuneError(
            f"{name}(devices) must return its abstract arguments as a tuple, got "
            f"{type(args).__name__}"
        )
    return fn, tuple(args)


def _lower(fn: Any, args: tuple[Any, ...], name: str) -> Any:
    import jax

    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    try:
        return jitted.lower(*args)
    except Exception as e:
        raise TuneError(
            f"lowering the function {name}(devices) returned failed: {_first_line(e)}"
        ) from None


# -- tune ---------------------------------------------------------------------------------


def tune(
    build: Builder,
    *,
    devices: int,
    devices_per_host: int = 8,
    target: str = "h100",
    budget_s: float = DEFAULT_BUDGET_S,
    headroom: float = DEFAULT_HEADROOM,
    calibration: str | os.PathLike[str] | None = None,
    program: str | None = None,
    levers: Sequence[str] | None = None,
    streams: Sequence[int] = STREAM_COUNTS,
    progress: TextIO | None = None,
    script: str = DEFAULT_SCRIPT,
) -> TuneResult:
    """Search XLA's overlap levers and the collective streams for ``build``'s program.

    ``build(devices) -> (jitted_fn, abstract_args)`` gets the ``devices`` GPUs of a
    compile-only ``target`` topology, ``devices_per_host`` per host, in host-major
    order. ``levers`` restricts the search to those names (:data:`LEVER_NAMES`), in
    that order; ``streams`` are the stream counts K a recommendation may use;
    ``progress`` gets one line per step (e.g. ``sys.stderr``); ``script`` is what
    the printed command runs. Raises :class:`TuneError` for bad input. See the
    module docstring for the method.
    """
    start = time.perf_counter()
    _check_arguments(devices, devices_per_host, target, budget_s, headroom, levers, streams)
    if not callable(build):
        raise TuneError(f"build must be a function of the devices, not {type(build).__name__}")
    name = str(program or getattr(build, "__name__", "build"))
    _ensure_deviceless()
    from xla_streams import aot

    if progress is not None:
        _Progress(progress, float(budget_s), start)(
            f"{name}: {devices} GPUs ({devices_per_host} per host) of {target}"
        )
    try:
        topology = aot.gpu_topology(target.lower(), devices, devices_per_host)
    except (aot.GpuAotUnavailable, ValueError) as e:
        raise TuneError(str(e)) from None
    gpus = sorted(topology.devices, key=lambda d: (d.process_index, d.id))
    builder_name = getattr(build, "__name__", "build")
    fn, args = _build(build, gpus, builder_name)
    lowered = _lower(fn, args, builder_name)
    return tune_lowered(
        lowered,
        program=name,
        devices=devices,
        devices_per_host=devices_per_host,
        target=target,
        budget_s=budget_s,
        headroom=headroom,
        calibration=calibration,
        levers=levers,
        streams=streams,
        progress=progress,
        script=script,
        start=start,
    )


def tune_lowered(
    lowered: Any,
    *,
    program: str,
    devices: int,
    devices_per_host: int = 8,
    target: str = "h100",
    budget_s: float = DEFAULT_BUDGET_S,
    headroom: float = DEFAULT_HEADROOM,
    calibration: str | os.PathLike[str] | None = None,
    levers: Sequence[str] | None = None,
    streams: Sequence[int] = STREAM_COUNTS,
    progress: TextIO | None = None,
    script: str = DEFAULT_SCRIPT,
    start: float | None = None,
) -> TuneResult:
    """:func:`tune` for a program already lowered for the compile-only topology
    (``jax.jit(f).lower(*abstract_args)``): anything with
    ``compile(compiler_options=...)`` returning an object with ``as_text()`` and
    ``memory_analysis()``. ``start`` is when the budget began (default: now)."""
    start = time.perf_counter() if start is None else start
    _check_arguments(devices, devices_per_host, target, budget_s, headroom, levers, streams)
    target = target.lower()
    plugin = sys.modules.get("xla_streams.plugin")
    if plugin is not None and getattr(plugin, "current", lambda: None)() is not None:
        raise TuneError(
            "the xla_streams plugin is on in this process and would annotate every "
            "candidate's module; tune in a process without it (no XLA_STREAMS_* settings)"
        )

    sim_target = _simulation_target(target, calibration)
    hbm = hbm_bytes(target)
    try:
        sync_on_compute = jax_compat.jax_version() >= (0, 11)
    except ImportError:
        sync_on_compute = True
    session = _Session(
        lowered=lowered,
        target=sim_target,
        devices_per_host=devices_per_host,
        hbm=hbm,
        memory_limit=int(hbm * (1.0 - headroom)),
        budget_s=float(budget_s),
        start=start,
        say=_Progress(progress, float(budget_s), start),
        streams=tuple(streams),
        sync_on_compute=sync_on_compute,
    )
    baseline = session.evaluate({}, "XLA defaults (the baseline)")
    assert baseline is not None
    session.baseline = baseline
    found, skipped, notes = search(session, levers)
    result = _result(
        session, found, program, target, devices, devices_per_host, headroom, skipped, notes,
        script,
    )  # fmt: skip
    session.say(f"done: {result.verdict}")
    return result


def _check_arguments(
    devices: int,
    devices_per_host: int,
    target: str,
    budget_s: float,
    headroom: float,
    levers: Sequence[str] | None,
    streams: Sequence[int],
) -> None:
    if not isinstance(target, str) or target.lower() not in TARGET_NAMES:
        raise TuneError(f"unknown target {target!r}; known: {', '.join(TARGET_NAMES)}")
    for what, value in (("devices", devices), ("devices_per_host", devices_per_host)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TuneError(f"{what} must be a positive integer, not {value!r}")
    if devices % devices_per_host:
        raise TuneError(
            f"devices={devices} is not a multiple of devices_per_host={devices_per_host}"
        )
    if isinstance(budget_s, bool) or not isinstance(budget_s, int | float) or not budget_s > 0:
        raise TuneError(f"budget_s must be a positive number of seconds, not {budget_s!r}")
    if isinstance(headroom, bool) or not isinstance(headroom, int | float) or not 0 <= headroom < 1:
        raise TuneError(f"headroom must be a fraction from 0 to 1, not {headroom!r}")
    if levers is not None:
        unknown = [lv for lv in levers if lv not in LEVER_NAMES]
        if unknown or not levers or len(set(levers)) != len(levers):
            raise TuneError(
                f"levers must be distinct names from: {', '.join(LEVER_NAMES)}; got "
                f"{', '.join(levers) or 'none'}"
            )
    bad = [
        k
        for k in streams
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_STREAMS
    ]
    if bad or not streams:
        raise TuneError(f"streams must be integers from 1 to {MAX_STREAMS}, not {list(streams)!r}")


def _result(
    session: _Session,
    found: Evaluation,
    program: str,
    target: str,
    devices: int,
    devices_per_host: int,
    headroom: float,
    skipped: list[str],
    notes: list[str],
    script: str,
) -> TuneResult:
    base_ev = session.baseline
    assert base_ev is not None
    evaluations = list(session.evaluations.values())
    baseline = base_ev.configuration((1, POLICIES[0]))
    ranked = sorted(evaluations, key=lambda e: (e.step, len(e.flags), e.best_key[0], e.index))
    candidates = tuple(e.configuration(candidate=True) for e in ranked)
    # The search's result: each of its options made it faster by MIN_GAIN. (The fastest
    # candidate may hold an option that gained less: noise in a recommendation.)
    chosen = found if found.fits else None
    reasons: list[str] = []
    notes = list(notes)
    if session.failures:
        notes.append(f"XLA refused {len(session.failures)} option set(s); see the progress log")
    if os.environ.get("XLA_FLAGS", "").strip():
        notes.append(
            "XLA_FLAGS is set in this process; the options it sets that the tuner does not "
            "search apply to every candidate (and must be in the command too)"
        )
    if not base_ev.fits:
        notes.append(
            f"XLA's defaults need {_bytes(base_ev.memory.peak)} per GPU, more than the "
            f"{_bytes(session.memory_limit)} limit"
        )
    recommend = base_ev
    baseline_step = baseline.predicted_step_ms / 1e3
    if chosen is not None and chosen is not base_ev:
        margin = chosen.step < baseline_step * (1 - MIN_SPEEDUP)
        if margin or (not base_ev.fits and chosen.step <= baseline_step):
            recommend = chosen
    if recommend is base_ev:
        reasons = _why_not(session, chosen, baseline_step)
    best = (
        recommend.configuration((1, POLICIES[0]))
        if recommend is base_ev
        else recommend.configuration()
    )
    speedup = baseline.predicted_step_ms / best.predicted_step_ms if best.predicted_step_ms else 1.0
    if recommend is base_ev:
        verdict = "nothing beats XLA's defaults: keep them" + (
            f" ({reasons[0]})" if reasons else ""
        )
    else:
        verdict = f"{best.settings} with {best.streams} stream(s): {speedup:.3f}x predicted"
    return TuneResult(
        program=program,
        target=target,
        devices=devices,
        devices_per_host=devices_per_host,
        baseline=baseline,
        best=best,
        candidates=candidates,
        command=command_line(best.xla_flags, best.streams, best.policy, script),
        hbm_bytes=session.hbm,
        headroom=headroom,
        verdict=verdict,
        reasons=tuple(reasons),
        skipped=tuple(skipped),
        notes=tuple(notes),
        elapsed_s=session.elapsed(),
        budget_s=session.budget_s,
        compiles=len(session.evaluations) + len(session.failures),
        script=script,
        best_hlo=recommend.text,
    )


def _why_not(session: _Session, best: Evaluation | None, baseline_step: float) -> list[str]:
    """Why nothing beats XLA's defaults, from the baseline's simulation and the search."""
    base = session.baseline
    assert base is not None and session.facts is not None
    facts = session.facts
    what = base.what
    out: list[str] = []
    if facts.collectives == 0:
        return ["the program has no collectives"]
    result = what.results[(1, POLICIES[0])]
    step, exposed = result.step_time, result.exposed_communication
    lower = what.lower_bound.step_time
    if exposed <= 0.01 * step:
        out.append(
            f"communication is already hidden: {exposed * 1e3:.3f} ms of the "
            f"{step * 1e3:.3f} ms step is exposed"
        )
    elif lower >= step * (1 - MIN_SPEEDUP):
        out.append(
            "collectives form a dependency chain: each one's input comes from the compute "
            "just before it and its result is needed just after, so even every collective "
            "on its own stream would not be faster "
            f"({facts.sync_collectives} of {facts.collectives} run synchronously, "
            f"{exposed * 1e3:.3f} ms of {step * 1e3:.3f} ms exposed)"
        )
    else:
        rule = getattr(what, "rule_bound", None)
        if rule is not None and rule.step_time >= step * (1 - MIN_SPEEDUP):
            out.append(
                "collectives in flight share devices: the deadlock rule keeps them on one "
                "stream, so they queue whatever the stream count"
            )
    faster = [
        e
        for e in session.evaluations.values()
        if not e.fits and e.step < baseline_step * (1 - MIN_SPEEDUP)
    ]
    if faster:
        e = min(faster, key=lambda e: e.step)
        out.append(
            f"the faster configurations do not fit in memory ({describe(e.flags)}: "
            f"{_bytes(e.memory.peak)} > {_bytes(session.memory_limit)})"
        )
    if best is not None and best is not base and best.step < baseline_step:
        gain = baseline_step / best.step
        out.append(
            f"the best configuration found ({describe(best.flags)}) is only {gain:.4f}x, "
            f"below the {MIN_SPEEDUP:.0%} margin"
        )
    if not out:
        out.append(
            "none of the levers tried makes XLA schedule more overlap that pays "
            f"({len(session.evaluations)} option sets compiled)"
        )
    return out


# -- text ---------------------------------------------------------------------------------


def format_result(result: TuneResult) -> str:
    """The ranked table, the recommendation and the command."""
    base = result.baseline
    lines = [
        f"tune {result.program} on {result.target}: {result.devices} GPUs, "
        f"{result.devices_per_host} per host; {result.compiles} compiles in "
        f"{result.elapsed_s:.0f} s (budget {result.budget_s:.0f} s)",
    ]
    if result.hbm_bytes:
        lines.append(
            f"memory limit {_bytes(result.memory_limit_bytes)} per GPU "
            f"({_bytes(result.hbm_bytes)} HBM less {result.headroom:.0%} headroom)"
        )
    header = [
        "rank",
        "step ms",
        "exposed ms",
        "memory",
        "speedup",
        "K",
        "policy",
        "compile s",
        "settings",
    ]
    rows = [header]
    for i, c in enumerate(result.candidates, 1):
        mark = ""
        if c.xla_flags == base.xla_flags:
            mark = "  <- baseline" + (f" (K={c.streams})" if c.streams != 1 else "")
        if c.xla_flags == result.best.xla_flags and (
            c.streams == result.best.streams or result.best is result.baseline
        ):
            mark += "  <- recommended"
        rows.append(
            [
                str(i),
                f"{c.predicted_step_ms:.3f}",
                f"{c.exposed_communication_ms or 0.0:.3f}",
                _bytes(c.peak_memory_bytes) + ("" if c.fits else " (no fit)"),
                f"{base.predicted_step_ms / c.predicted_step_ms:.3f}x"
                if c.predicted_step_ms
                else "-",
                str(c.streams),
                c.policy,
                f"{c.compile_s or 0.0:.1f}",
                c.settings + mark,
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    right = {1, 2, 3, 4, 5, 7}
    for r in rows:
        cells = [
            cell.rjust(w) if i in right or i == 0 else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  " + "  ".join(cells).rstrip())
    best = result.best
    delta = best.peak_memory_bytes - base.peak_memory_bytes
    if result.best.xla_flags == base.xla_flags and best.streams == base.streams:
        lines.append(
            f"recommended: XLA's defaults, one stream ({base.predicted_step_ms:.3f} ms): "
            "nothing beats them by the 1% margin"
        )
        lines += [f"  why: {r}" for r in result.reasons]
    else:
        lines.append(
            f"recommended: {best.settings}, K={best.streams} {best.policy}: "
            f"{best.predicted_step_ms:.3f} ms predicted against {base.predicted_step_ms:.3f} ms, "
            f"{result.speedup:.3f}x"
        )
        lines.append(
            f"memory: {_bytes(best.peak_memory_bytes)} per GPU against the baseline's "
            f"{_bytes(base.peak_memory_bytes)} ({'+' if delta >= 0 else '-'}"
            f"{_bytes(abs(delta))}, {delta / base.peak_memory_bytes:+.1%})"
            if base.peak_memory_bytes
            else f"memory: {_bytes(best.peak_memory_bytes)} per GPU"
        )
    lines.append(f"command: {result.command}")
    lines.append(f"     or: XLA_STREAMS_CONFIG=<the --json file> {result.script}")
    if result.skipped:
        lines.append("levers skipped: " + "; ".join(result.skipped))
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(line for line in lines if line) + "\n"


# -- the tune file ------------------------------------------------------------------------


def load_tune_result(path: str | os.PathLike[str]) -> TuneResult:
    """A tune result written by ``xla-streams tune --json``, checked against its schema.

    Raises :class:`TuneError` naming the file and the field that is wrong.
    """
    where = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise TuneError(f"{where}: cannot read the tune result: {reason}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TuneError(f"{where}: not JSON: {e}") from None
    return parse_tune_result(data, where)


def parse_tune_result(data: Any, where: str = "tune result") -> TuneResult:
    """:func:`load_tune_result` for data already parsed from JSON."""
    check = _Checker(where)
    top = check.object(data, "")
    schema = top.get("schema")
    if schema != SCHEMA:
        check.fail("schema", f"expected {SCHEMA!r}, got {schema!r}")
    candidates = check.field(top, "candidates", list)
    return TuneResult(
        program=check.field(top, "program", str),
        target=check.field(top, "target", str),
        devices=check.positive(top, "devices"),
        devices_per_host=check.positive(top, "devices_per_host"),
        baseline=check.configuration(top, "baseline"),
        best=check.configuration(top, "best"),
        candidates=tuple(
            check.configuration({"candidates": candidates}, f"candidates[{i}]", candidate=True)
            for i in range(len(candidates))
        ),
        command=check.field(top, "command", str),
        hbm_bytes=int(top.get("hbm_bytes", 0)) if isinstance(top.get("hbm_bytes"), int) else 0,
        headroom=float(top.get("headroom", DEFAULT_HEADROOM))
        if isinstance(top.get("headroom"), int | float)
        else DEFAULT_HEADROOM,
        verdict=str(top.get("verdict", "")),
        reasons=tuple(str(r) for r in top.get("reasons", []) if isinstance(r, str)),
        skipped=tuple(str(r) for r in top.get("skipped", []) if isinstance(r, str)),
        notes=tuple(str(r) for r in top.get("notes", []) if isinstance(r, str)),
    )


_OPTION_NAME = re.compile(r"xla_[a-z0-9_]+")


class _Checker:
    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, path: str, message: str) -> None:
        at = f"{self.where}: {path}: " if path else f"{self.where}: "
        raise TuneError(at + message)

    def object(self, value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(path, f"expected a JSON object, got {_json_type(value)}")
        return value  # type: ignore[no-any-return]

    def field(self, obj: Mapping[str, Any], key: str, kind: type, path: str = "") -> Any:
        name = f"{path}.{key}" if path else key
        if key not in obj:
            self.fail(name, "missing")
        value = obj[key]
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok:
            self.fail(
                name, f"expected {_TYPE_NAMES.get(kind, kind.__name__)}, got {_json_type(value)}"
            )
        return value

    def positive(self, obj: Mapping[str, Any], key: str, path: str = "") -> int:
        value: int = self.field(obj, key, int, path)
        if value < 1:
            self.fail(f"{path}.{key}" if path else key, f"expected a positive integer, got {value}")
        return value

    def configuration(
        self, parent: Mapping[str, Any], key: str, *, candidate: bool = False
    ) -> Configuration:
        if candidate:
            index = int(key[key.index("[") + 1 : -1])
            obj = self.object(parent["candidates"][index], key)
        else:
            obj = self.object(self.field(parent, key, dict), key)
        flags = self.object(self.field(obj, "xla_flags", dict, key), f"{key}.xla_flags")
        for name, value in flags.items():
            if not _OPTION_NAME.fullmatch(name):
                self.fail(
                    f"{key}.xla_flags",
                    f"{name!r} is not an XLA option name (DebugOptions field, e.g. "
                    f"{xo.OVERLAP_LIMIT})",
                )
            if not isinstance(value, bool | int | str) or (
                isinstance(value, float) and not value.is_integer()
            ):
                self.fail(
                    f"{key}.xla_flags.{name}",
                    f"expected a boolean, integer or string, got {_json_type(value)}",
                )
        streams: int = self.field(obj, "streams", int, key)
        if not 1 <= streams <= MAX_STREAMS:
            self.fail(
                f"{key}.streams", f"expected an integer from 1 to {MAX_STREAMS}, got {streams}"
            )
        policy: str = self.field(obj, "policy", str, key)
        if policy not in POLICIES:
            self.fail(f"{key}.policy", f"expected one of {', '.join(POLICIES)}, got {policy!r}")
        step: float = self.field(obj, "predicted_step_ms", float, key)
        if not math.isfinite(step) or step < 0:
            self.fail(f"{key}.predicted_step_ms", f"expected a non-negative number, got {step}")
        memory: int = self.field(obj, "peak_memory_bytes", int, key)
        if memory < 0:
            self.fail(f"{key}.peak_memory_bytes", f"expected a non-negative integer, got {memory}")
        compile_s = None
        if candidate:
            compile_s = float(self.field(obj, "compile_s", float, key))
        exposed = obj.get("exposed_communication_ms")
        return Configuration(
            xla_flags=dict(flags),
            streams=streams,
            policy=policy,
            predicted_step_ms=float(step),
            peak_memory_bytes=memory,
            exposed_communication_ms=float(exposed)
            if isinstance(exposed, int | float) and not isinstance(exposed, bool)
            else None,
            compile_s=compile_s,
            fits=bool(obj.get("fits", True)),
        )


_TYPE_NAMES: dict[type, str] = {
    str: "a string",
    int: "an integer",
    float: "a number",
    list: "a JSON array",
    dict: "a JSON object",
}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})" if len(value) < 40 else "a string"
    if isinstance(value, list):
        return "a JSON array"
    if isinstance(value, dict):
        return "a JSON object"
    return type(value).__name__


# -- the command line ---------------------------------------------------------------------


def define_flags(fv: flags.FlagValues) -> None:
    """The flags of ``xla-streams tune``."""
    from absl import flags as absl_flags

    absl_flags.DEFINE_string(
        "program", None, "An embedded program (xla_streams/programs.py) to tune instead of "
        "PROGRAM.py; its own device counts are the defaults.", flag_values=fv,
    )  # fmt: skip
    absl_flags.DEFINE_integer(
        "devices", None, "Number of GPUs the program runs on (all hosts together).",
        lower_bound=1, flag_values=fv,
    )  # fmt: skip
    absl_flags.DEFINE_integer(
        "devices-per-host", None, "GPUs per host (default 8; device d is on host d // M).",
        lower_bound=1, flag_values=fv,
    )  # fmt: skip
    absl_flags.DEFINE_enum(
        "target", "h100", list(TARGET_NAMES), "The GPU to compile and predict for.",
        flag_values=fv,
    )  # fmt: skip
    absl_flags.DEFINE_string(
        "json", None, f"Also write the result (schema {SCHEMA}) to this file ('-': standard "
        "output); XLA_STREAMS_CONFIG=FILE applies it.", flag_values=fv,
    )  # fmt: skip
    absl_flags.DEFINE_string(
        "hlo", None, "Also write the recommendation's scheduled module (HLO text) to this "
        "file, e.g. for `xla-streams simulate --html`.", flag_values=fv,
    )  # fmt: skip
    absl_flags.DEFINE_float(
        "budget-s", DEFAULT_BUDGET_S, "Stop starting compiles once this many seconds are spent.",
        lower_bound=1.0, flag_values=fv,
    )  # fmt: skip
    absl_flags.DEFINE_float(
        "headroom", DEFAULT_HEADROOM, "Fraction of the GPU's memory kept free: a configuration "
        "fits when its peak is at most (1 - headroom) x HBM.", lower_bound=0.0, upper_bound=0.9,
        flag_values=fv,
    )  # fmt: skip
    absl_flags.DEFINE_string(
        "calibration", None, "A calibration file (schema xla_streams.calibration.v1) of measured "
        "corrections to the cost model.", flag_values=fv,
    )  # fmt: skip
    absl_flags.DEFINE_list(
        "levers", None, "Search only these levers, in this order (default: all, in the "
        f"order {', '.join(LEVER_NAMES)}).",
        flag_values=fv,
    )  # fmt: skip
    absl_flags.DEFINE_string(
        "script", DEFAULT_SCRIPT, "What the printed command runs.", flag_values=fv
    )
    absl_flags.DEFINE_bool("progress", True, "Report progress on standard error.", flag_values=fv)


class TuneUsageError(TuneError):
    """A command line that cannot be run as written."""


def run_command(
    positional: Sequence[str], flag: Callable[[str], Any], stderr: TextIO | None
) -> TuneResult:
    """``xla-streams tune`` on its parsed arguments (``flag(name)`` reads the flags of
    :func:`define_flags`); raises TuneUsageError or TuneError, which ``cli.py`` turns
    into one line and exit code 2."""
    embedded = flag("program")
    if embedded and positional:
        raise TuneUsageError("give PROGRAM.py[:BUILDER] or --program, not both")
    if not embedded and len(positional) != 1:
        found = " ".join(positional) or "none"
        raise TuneUsageError(
            f"expected one PROGRAM.py[:BUILDER] (or --program=NAME), found: {found}"
        )
    devices, per_host = flag("devices"), flag("devices-per-host")
    _ensure_deviceless()  # before PROGRAM.py can start JAX
    if embedded:
        from xla_streams.programs import PROGRAMS

        spec = PROGRAMS.get(embedded)
        if spec is None:
            raise TuneUsageError(
                f"--program: unknown program '{embedded}'; known: {', '.join(sorted(PROGRAMS))}"
            )
        name, builder = embedded, spec.build
        devices = devices or spec.num_devices
        per_host = per_host or spec.devices_per_host
    else:
        name, builder = load_builder(positional[0])
        if devices is None:
            raise TuneUsageError("--devices is required with PROGRAM.py")
        per_host = per_host or 8
    return tune(
        builder,
        devices=devices,
        devices_per_host=min(per_host, devices),
        target=flag("target"),
        budget_s=flag("budget-s"),
        headroom=flag("headroom"),
        calibration=flag("calibration"),
        program=name,
        levers=flag("levers"),
        progress=stderr if flag("progress") else None,
        script=flag("script"),
    )
