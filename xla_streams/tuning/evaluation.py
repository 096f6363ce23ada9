"""One candidate evaluated: its memory, what the simulator predicts for its compiled
module (every stream count and policy, and the ranges), and the ``Evaluation`` the search
compares (docs/tune.md, "The recommendation" and "Memory")."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from xla_streams import xla_options as xo
from xla_streams.collectives import DEFAULT_POLICY, POLICIES, STREAM_COUNTS, StreamModel
from xla_streams.hlo import HloError, Module, parse_module
from xla_streams.simulate import (
    PredictionRange,
    Profile,
    Simulator,
    Target,
    WhatIf,
    predict_range,
    what_if,
    xla_stream_assignment,
)
from xla_streams.streams import (
    AsyncPair,
    StreamAssignment,
    assign_streams,
    find_async_pairs,
    max_in_flight,
)
from xla_streams.tuning.levers import CollectiveCensus, Flags, overlap_limit
from xla_streams.tuning.result import Configuration, XlaOpinion, first_line

Key = tuple[int, str]  # (K, policy)
Predictions = dict[Key, tuple[float, float]]  # (K, policy) -> (step s, exposed s)


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

    def problem(self) -> str | None:
        """Why these figures cannot say whether a configuration fits (None: they can)."""
        figures = (self.argument, self.output, self.alias, self.temp)
        if not any(figures):
            return "XLA gave no memory figures for it (compiled.memory_analysis())"
        if min(figures) < 0 or self.peak <= 0:
            return (
                f"XLA's memory figures do not add up: temp {self.temp} + argument "
                f"{self.argument} + output {self.output} - alias {self.alias} = {self.peak} B"
            )
        return None


@dataclass(frozen=True)
class CandidatePrediction:
    """What the simulator predicts for one scheduled module under one candidate's options:
    per (K, policy) the step and exposed communication (seconds), the ranges of the best
    (K, policy) and of one stream, and the what-if (None for XLA's multi-streaming)."""

    results: Predictions
    ranges: Mapping[Key, PredictionRange]
    what: WhatIf | None
    module: Module
    pairs: tuple[AsyncPair, ...]

    def assignment(self, key: Key) -> StreamAssignment:
        """The streams the prediction of ``key`` ran on: the what-if's, or for XLA's
        multi-streaming (no what-if) the streams XLA gives each collective."""
        if self.what is None:
            return xla_stream_assignment(self.module, self.pairs, multi_streaming=True)
        found = {(k, str(p)): a for (k, p), a in self.what.assignments.items()}
        return found.get(key) or assign_streams(self.pairs, key[0], key[1])  # type: ignore[arg-type]


def best_key(results: Predictions) -> Key:
    return min(results, key=lambda k: (results[k][0], k[0], policy_index(k[1])))


class Unusable(Exception):
    """A compiled candidate the search cannot use: the ``stage`` that failed (a key of
    :data:`~xla_streams.tuning.result.DROP_STAGES`) and why."""

    def __init__(self, stage: str, reason: str) -> None:
        super().__init__(f"{stage}: {reason}")
        self.stage = stage
        self.reason = reason


def predict(
    text: str,
    flags: Mapping[str, object],
    target: Target,
    *,
    streams: Sequence[int] = STREAM_COUNTS,
    sync_on_compute: bool = True,
    profile: Profile | None = None,
) -> CandidatePrediction:
    """The :class:`CandidatePrediction` for the scheduled module ``text`` compiled with ``flags``.
    :class:`Unusable` when the module cannot be read (parsed, its async pairs found) or
    simulated: any error of the simulator on one candidate drops that candidate, never
    the search."""
    limit = overlap_limit(flags)
    try:
        module = parse_module(text, "<tune>")
        pairs = tuple(find_async_pairs(module, StreamModel(limit, sync_on_compute)))
    except (HloError, ValueError) as e:
        raise Unusable("read", first_line(e)) from None
    try:
        return _simulate(module, pairs, flags, target, streams, profile)
    except Exception as e:
        raise Unusable("simulate", first_line(e)) from None


def _simulate(
    module: Module,
    pairs: tuple[AsyncPair, ...],
    flags: Mapping[str, object],
    target: Target,
    streams: Sequence[int],
    profile: Profile | None,
) -> CandidatePrediction:
    limit = overlap_limit(flags)
    simulator = _simulator(module, pairs, target, profile)
    results: Predictions = {}
    one = (1, DEFAULT_POLICY)
    what: WhatIf | None = None
    if flags.get(xo.MULTI_STREAMING):
        # XLA runs async collectives on its two streams in turn; the plugin stays off.
        assignment = xla_stream_assignment(module, pairs, multi_streaming=True)
        r = simulator.run(assignment)
        results[one] = (r.step_time, r.exposed_communication)
    else:
        in_flight = max_in_flight([p for p in pairs if p.needs_stream])
        # More than one stream only where the candidate sets the overlap limit itself:
        # with K > 1 and no limit in XLA_FLAGS the plugin would raise it to K, a
        # different compile.
        if xo.OVERLAP_LIMIT in flags and limit > 1 and in_flight >= 2:
            ks, policies = tuple(sorted(set(streams) | {1})), POLICIES
        else:
            ks, policies = (1,), (DEFAULT_POLICY,)
        what = what_if(module, target, ks, policies, simulator=simulator)
        for key, r in what.results.items():
            # More streams than the GPU can keep NCCL kernels of resident: never a pick.
            if key[0] == 1 or what.fits_on_the_gpu(key):
                results[(key[0], str(key[1]))] = (r.step_time, r.exposed_communication)
    predicted = CandidatePrediction(results, {}, what, module, pairs)
    ranges = {
        key: predict_range(simulator, predicted.assignment(key))
        for key in dict.fromkeys((best_key(results), one))
    }
    return dataclasses.replace(predicted, ranges=ranges)


def _simulator(
    module: Module, pairs: tuple[AsyncPair, ...], target: Target, profile: Profile | None
) -> Simulator:
    measured = profile.for_module(module) if profile is not None else None
    return Simulator(module, target, pairs, measured=measured)


def step_without_interference(
    prediction: CandidatePrediction, key: Key, target: Target, profile: Profile | None
) -> float:
    """The step (seconds) of ``prediction``'s ``key`` re-simulated with the simulator's
    interference term off (``Target.interference``): what the gain would be if
    collectives in flight took nothing from compute."""
    quiet = dataclasses.replace(target, interference=False)
    simulator = _simulator(prediction.module, prediction.pairs, quiet, profile)
    return simulator.run(prediction.assignment(key)).step_time


@dataclass
class Evaluation:
    """One compiled option set and the predictions for each (K, policy)."""

    index: int
    flags: Flags
    compile_s: float
    memory: MemoryUse
    fits: bool
    results: Predictions
    ranges: Mapping[Key, PredictionRange]
    what: WhatIf | None
    census: CollectiveCensus
    label: str = ""
    text: str = ""  # the scheduled module, as compiled.as_text() prints it
    fingerprint: str = ""  # SHA-256 of text
    cached: bool = False  # the compile came from the disk cache
    shared: bool = False  # another candidate compiled to the same text
    xla: XlaOpinion | None = None  # XLA's own estimate of the same compile
    xla_missing: str = ""  # why there is none
    prediction: CandidatePrediction | None = field(default=None, repr=False)  # module and pairs

    @property
    def best_key(self) -> Key:
        return best_key(self.results)

    @property
    def step(self) -> float:
        return self.results[self.best_key][0]

    def range(self, key: Key | None = None) -> PredictionRange | None:
        return self.ranges.get(key or self.best_key)

    def configuration(self, key: Key | None = None, *, candidate: bool = False) -> Configuration:
        k, policy = key or self.best_key
        step, exposed = self.results[(k, policy)]
        by_streams: dict[int, float] = {}
        for (kk, _), (s, _) in self.results.items():
            by_streams[kk] = min(by_streams.get(kk, math.inf), s * 1e3)
        spread = self.ranges.get((k, policy))
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
            step_low_ms=spread.low * 1e3 if spread is not None else None,
            step_high_ms=spread.high * 1e3 if spread is not None else None,
            xla=self.xla,
        )


def policy_index(policy: str) -> int:
    return POLICIES.index(policy) if policy in POLICIES else len(POLICIES)


def flags_key(flags: Mapping[str, object]) -> str:
    return json.dumps(dict(sorted(flags.items())), sort_keys=True)


def compile_options(
    flags: Mapping[str, object], unavailable: frozenset[str] = frozenset()
) -> dict[str, object]:
    """What a candidate is compiled with: every searched option spelled out (XLA's
    default unless ``flags`` says otherwise; not those this XLA lacks), so
    ``XLA_FLAGS`` in this process cannot change the baseline."""
    spelled = {k: v for k, v in xo.DEFAULTS.items() if k not in unavailable}
    return {**spelled, **flags}
