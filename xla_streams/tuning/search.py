"""The search: compile option sets, predict their step time (with its range) and memory,
search the levers as a set, and recommend. JAX-free: the compiles go through the
:class:`~xla_streams.tuning.compiling.Compiler` the :class:`Session` is given.

How it searches
---------------

A candidate is a set of XLA options (``DebugOptions`` fields, passed to the
deviceless compile as ``compile(compiler_options=...)``: XLA reads ``XLA_FLAGS``
once per process, compile options every time), one setting per lever
(:mod:`xla_streams.tuning.levers`). A compile costs seconds, so:

- The number of collective streams K and the assignment policy need no compile,
  only re-assignment and simulation of the same module: every K and policy is
  simulated per compile (K > 1 only where the overlap limit is set above 1 and two
  collectives really are in flight: otherwise one stream is all there is).
- Compiles the facts prove redundant are never made: a lever that cannot act on
  the module (no while loop holding a collective: the pipeliners and double
  buffering only rewrite loops; no collective of a combine threshold's kind; no
  collective inside one NVLink domain) stays at XLA's default. Two candidates
  whose compiled modules are the same text get the same prediction: it is
  simulated once. Compiles are cached on disk, and a batch of them runs in
  parallel (``--jobs``).
- First the joint move of the levers that pay together (the overlap limit, the
  pipeliners, double buffering, start-early: :attr:`Lever.together`), kept when it
  is faster by ``MIN_GAIN`` (0.5%) and fits: on scan models none pays alone.
- Coordinate descent from there, over the levers in the order their effect is
  expected: each lever's settings are tried from the current best (a pipeliner
  also together with double buffering: that pair pays as a set on scan models,
  where neither pays alone), the best that is faster by ``MIN_GAIN`` and fits in
  memory is kept, and passes repeat, re-trying a lever only when its context
  changed, until one changes nothing.
- Then a check of the result: every configuration that differs from it in one
  lever, or in two of the scheduling levers (the size levers, combine thresholds
  and collective matmul, one at a time), is compiled (those the descent has not
  already), in parallel batches, the changes of the levers that pay together
  first. As soon as one is faster by ``MIN_GAIN`` the search moves there and
  descends again.
- A candidate that cannot be used is dropped with its reason (:class:`Dropped`:
  XLA refused or crashed on it, its module cannot be read or simulated, XLA gave
  no usable memory figures) and the search goes on; only XLA's defaults failing
  is an error.

**What it guarantees**: the result is a configuration that no change of one lever,
nor of two scheduling levers, makes faster by ``MIN_GAIN`` or more (among those
that fit), as predicted. It is a local optimum, not the global one: the predicted step of a
configuration not compiled is unknown (its compute time changes too), so no
method that compiles less than the whole grid can promise the global best. With
at most two levers that can act (a program without while loops: the overlap limit
and start-early) the check covers the whole grid and the result is its best. When
the budget stops the search first, the result says how far the check got (or
that it makes no claim, when it stopped before the check).

**And it is repeatable**: the budget is in compiles (``budget_compiles``: every
option set evaluated counts, compiled now, from the cache or dropped), so the
same program, target, options and compile budget give the same result on a busy
and on a quiet machine, from the cache or not. Wall time (``budget_s``) is only a
safety limit; when it stops the search, the result says it is not repeatable.

The recommendation
------------------

Each candidate's step time comes with the simulator's range
(:func:`xla_streams.simulate.predict_range`): the step re-simulated with every
input at the optimistic end of its error bound (low) and at the pessimistic end
plus interference from collectives in flight (high). The recommendation is the
search's result when it

- fits in memory,
- is faster than XLA's defaults by ``MIN_SPEEDUP`` (1%) as modelled, and
- is faster than XLA's defaults at each end of the range: its low below their
  low and its high below their high.

The ends are compared pairwise because the errors are the hardware's (kernel
efficiencies, link bandwidths, NCCL's latencies and interference): on the GPUs
both configurations run on, they move both the same way. Comparing a candidate's
high with the defaults' expected value would compare two different machines, and
reject every gain smaller than the model's error width (about 25%), even one that
holds on every machine the bounds describe. What the pairwise rule does not
cover: errors that differ per kernel class in opposite directions (the range moves
all inputs together), and anything outside the stated bounds. Otherwise the
recommendation is XLA's defaults with one stream, with the reasons. Ties go to
fewer streams, then the interval policy.

The time limit (``--budget-s``, default 3600 s) counts everything from the start;
a batch of compiles is started only as far as the slowest compile so far would
still fit (compiles the cache holds are free).

Beside each prediction is XLA's own estimate of the same compile, and the
recommendation gets a line on whether XLA's estimate favours it
(:mod:`~xla_streams.tuning.opinion`).

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
XLA's multi-streaming is predicted on the streams XLA gives each collective
(:func:`xla_streams.simulate.xla_stream_assignment`: two streams in turn, in
XLA's post-order), the plugin off. A calibration file (``--calibration``)
corrects the cost model's kernel classes with measured ratios, a performance
table (``--perf-table``, XLA's format) prices the collectives it measured, and
a PGLE profile (``--profile``) gives the instructions it names their measured
times (in the candidates whose module still has them).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

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
from xla_streams.streams import AsyncPair, assign_streams, find_async_pairs, max_in_flight
from xla_streams.tuning.cache import Compiled, Refused
from xla_streams.tuning.compiling import Compiler
from xla_streams.tuning.levers import (
    Facts,
    Flags,
    Lever,
    Point,
    describe,
    describe_point,
    flags_of,
    format_bytes,
    module_facts,
    overlap_limit,
)
from xla_streams.tuning.opinion import Candidate, placeholder_notes, second_opinion
from xla_streams.tuning.options import TuneOptions
from xla_streams.tuning.result import (
    DROP_STAGES,
    Configuration,
    Dropped,
    TuneError,
    TuneResult,
    XlaOpinion,
    command_line,
    first_line,
)

# The recommendation must beat XLA's defaults by this fraction, or the defaults stay.
MIN_SPEEDUP = 0.01
# A move is kept only when it makes the current best this much faster.
MIN_GAIN = 0.005
# The final check compiles this many neighbours at a time (and moves as soon as one
# batch holds a faster one).
CHECK_BATCH = 8

Key = tuple[int, str]  # (K, policy)
Predictions = dict[Key, tuple[float, float]]  # (K, policy) -> (step s, exposed s)


# -- memory -----------------------------------------------------------------------------------


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


# -- predicting one compiled module --------------------------------------------------------------


@dataclass(frozen=True)
class Prediction:
    """What the simulator predicts for one scheduled module under one candidate's options:
    per (K, policy) the step and exposed communication (seconds), the ranges of the best
    (K, policy) and of one stream, and the what-if (None for XLA's multi-streaming)."""

    results: Predictions
    ranges: Mapping[Key, PredictionRange]
    what: WhatIf | None
    module: Module
    pairs: tuple[AsyncPair, ...]


def _best_key(results: Predictions) -> Key:
    return min(results, key=lambda k: (results[k][0], k[0], _policy_index(k[1])))


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
) -> Prediction:
    """The :class:`Prediction` for the scheduled module ``text`` compiled with ``flags``.
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
) -> Prediction:
    limit = overlap_limit(flags)
    measured = profile.for_module(module) if profile is not None else None
    simulator = Simulator(module, target, pairs, measured=measured)
    results: Predictions = {}
    ranges: dict[Key, PredictionRange] = {}
    one = (1, DEFAULT_POLICY)
    if flags.get(xo.MULTI_STREAMING):
        # XLA runs async collectives on its two streams in turn; the plugin stays off.
        assignment = xla_stream_assignment(module, pairs, multi_streaming=True)
        r = simulator.run(assignment)
        results[one] = (r.step_time, r.exposed_communication)
        ranges[one] = predict_range(simulator, assignment)
        return Prediction(results, ranges, None, module, pairs)
    in_flight = max_in_flight([p for p in pairs if p.needs_stream])
    # More than one stream only where the candidate sets the overlap limit itself: with
    # K > 1 and no limit in XLA_FLAGS the plugin would raise it to K, a different compile.
    if xo.OVERLAP_LIMIT in flags and limit > 1 and in_flight >= 2:
        ks, policies = tuple(sorted(set(streams) | {1})), POLICIES
    else:
        ks, policies = (1,), (DEFAULT_POLICY,)
    what = what_if(module, target, ks, policies, simulator=simulator)
    for key, r in what.results.items():
        results[(key[0], str(key[1]))] = (r.step_time, r.exposed_communication)
    best = _best_key(results)
    for key in dict.fromkeys((best, one)):
        found = {(k, str(p)): a for (k, p), a in what.assignments.items()}
        assignment = found.get(key) or assign_streams(pairs, key[0], key[1])  # type: ignore[arg-type]
        ranges[key] = predict_range(simulator, assignment)
    return Prediction(results, ranges, what, module, pairs)


# -- one evaluated option set -------------------------------------------------------------------


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
    facts: Facts
    label: str = ""
    text: str = ""  # the scheduled module, as compiled.as_text() prints it
    fingerprint: str = ""  # SHA-256 of text
    cached: bool = False  # the compile came from the disk cache
    shared: bool = False  # another candidate compiled to the same text
    xla: XlaOpinion | None = None  # XLA's own estimate of the same compile
    xla_missing: str = ""  # why there is none
    prediction: Prediction | None = field(default=None, repr=False)  # module and pairs

    @property
    def best_key(self) -> Key:
        return _best_key(self.results)

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


def _policy_index(policy: str) -> int:
    return POLICIES.index(policy) if policy in POLICIES else len(POLICIES)


def _key(flags: Mapping[str, object]) -> str:
    return json.dumps(dict(sorted(flags.items())), sort_keys=True)


def compile_options(
    flags: Mapping[str, object], unavailable: frozenset[str] = frozenset()
) -> dict[str, object]:
    """What a candidate is compiled with: every searched option spelled out (XLA's
    default unless ``flags`` says otherwise; not those this XLA lacks), so
    ``XLA_FLAGS`` in this process cannot change the baseline."""
    spelled = {k: v for k, v in xo.DEFAULTS.items() if k not in unavailable}
    return {**spelled, **flags}


# -- the session: its budget, its progress, its compiles ----------------------------------


class Progress:
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


class BudgetSpent(Exception):
    """The budget stops the search before the next compile: its label, which budget
    (``budget_compiles``, or ``budget_s``, the wall-time safety limit) and its limit in
    words (``200 compiles``)."""

    def __init__(self, label: str, budget: str = "budget_compiles", limit: str = "") -> None:
        super().__init__(label, budget, limit)
        self.label = label
        self.budget = budget
        self.limit = limit

    @property
    def words(self) -> str:
        """``the compile budget (200 compiles)``, ``the time limit (3600 s)``."""
        name = "the time limit" if self.budget == "budget_s" else "the compile budget"
        return f"{name} ({self.limit})" if self.limit else name


_NO_SUCH_OPTION = re.compile(r"No such compile option: '([A-Za-z0-9_]+)'")


@dataclass
class Session:
    """One search: its options (the budget, the stream counts, the headroom, what the
    result names), what it compiles with, what it predicts for, and every option set
    evaluated so far."""

    compiler: Compiler
    options: TuneOptions
    target: Target
    domain_size: int  # GPUs per NVLink domain
    hbm: int
    start: float
    say: Callable[[str], None]
    sync_on_compute: bool
    profile: Profile | None = None
    evaluations: dict[str, Evaluation] = field(default_factory=dict)
    dropped: dict[str, Dropped] = field(default_factory=dict)  # key -> why it was dropped
    durations: list[float] = field(default_factory=list)  # seconds per real compile
    predict_durations: list[float] = field(default_factory=list)  # seconds per prediction
    facts: Facts | None = None
    baseline: Evaluation | None = None
    unavailable: frozenset[str] = frozenset()  # options this XLA does not have
    compiled: int = 0  # real compiles (not from the cache)
    cache_hits: int = 0
    _predictions: dict[tuple[str, int, bool, bool], Prediction] = field(default_factory=dict)

    @property
    def memory_limit(self) -> int:
        """The most a configuration may hold per GPU: the HBM less the headroom."""
        return int(self.hbm * (1.0 - self.options.headroom))

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    @property
    def evaluated(self) -> int:
        """Option sets evaluated so far, each one of the compile budget: compiled,
        from the cache, or dropped."""
        return len(self.evaluations) + len(self.dropped)

    def start_baseline(self) -> Evaluation:
        """Compile XLA's defaults; an option this XLA does not know is dropped from
        every compile (and from the levers) and the baseline compiled again."""
        while True:
            self.say("compile 1: XLA defaults (the baseline)")
            compiled = self._compile([{}])[0]
            if isinstance(compiled, Refused):
                match = _NO_SUCH_OPTION.search(str(compiled))
                if match and match.group(1) in xo.DEFAULTS and match[1] not in self.unavailable:
                    self.unavailable |= {match.group(1)}
                    self.say(f"  this XLA has no option {match.group(1)}: not searched")
                    continue
                raise TuneError(f"XLA could not compile the program: {compiled}")
            try:
                ev = self._add({}, "XLA defaults (the baseline)", compiled)
            except Unusable as e:
                # Nothing to compare the candidates with: only here is it an error.
                raise TuneError(f"XLA's defaults: {DROP_STAGES[e.stage]}: {e.reason}") from None
            self.baseline = ev
            return ev

    def _fits_in_budget(self, wanted: int) -> int:
        """How many of ``wanted`` compiles (and their predictions) fit in what is left of
        the budget, at the slowest compile and prediction so far, ``workers`` at a time."""
        left = self.options.budget_s - self.elapsed()
        compile_s = max(self.durations)
        predict_s = max(self.predict_durations, default=0.0)
        workers = max(self.compiler.workers, 1)
        n = 0
        while n < wanted:
            k = n + 1
            if math.ceil(k / workers) * compile_s + k * predict_s > left:
                break
            n = k
        return n

    def _compile(self, flags_list: Sequence[Flags]) -> list[Compiled | Refused]:
        options = [compile_options(f, self.unavailable) for f in flags_list]
        results = self.compiler.compile_many(options)
        for r in results:
            if isinstance(r, Compiled):
                if r.cached:
                    self.cache_hits += 1
                else:
                    self.compiled += 1
                    self.durations.append(r.compile_s)
            else:
                self.compiled += 1
        return results

    def evaluate_many(self, requests: Sequence[tuple[Flags, str]]) -> list[Evaluation | None]:
        """Compile (in parallel, where the compiler has workers) and predict each option
        set not evaluated yet; None where it was dropped (:class:`Dropped`). Raises
        :class:`BudgetSpent` when the compile budget is spent, or when a compile would
        not finish within the wall-time limit (those before it are kept)."""
        todo: dict[str, tuple[Flags, str]] = {}
        for flags, label in requests:
            key = _key(flags)
            if key not in self.evaluations and key not in self.dropped and key not in todo:
                todo[key] = (flags, label)
        stop: BudgetSpent | None = None
        left = self.options.budget_compiles - self.evaluated
        if len(todo) > left:
            limit = f"{self.options.budget_compiles} compiles"
            stop = BudgetSpent(list(todo.values())[max(left, 0)][1], "budget_compiles", limit)
            todo = dict(list(todo.items())[: max(left, 0)])
        if todo and self.durations:
            real = [
                k
                for k, (f, _) in todo.items()
                if self.compiler.will_compile(compile_options(f, self.unavailable))
            ]
            allowed = self._fits_in_budget(len(real))
            if len(real) > allowed:
                limit = f"{self.options.budget_s:.0f} s"
                stop = BudgetSpent(todo[real[allowed]][1], "budget_s", limit)
                for k in real[allowed:]:
                    del todo[k]
        if todo:
            items = list(todo.items())
            for i, (_, (_, label)) in enumerate(items):
                self.say(f"compile {self.evaluated + i + 1}: {label}")
            compiled = self._compile([flags for _, (flags, _) in items])
            for (key, (flags, label)), result in zip(items, compiled, strict=True):
                try:
                    if isinstance(result, Refused):
                        raise Unusable("compile", str(result))
                    self._add(flags, label, result)
                except Unusable as e:
                    self.dropped[key] = Dropped(dict(flags), e.stage, e.reason)
                    self.say(f"  dropped {describe(flags)}: {DROP_STAGES[e.stage]}: {e.reason}")
        if stop is not None:
            raise stop
        out: list[Evaluation | None] = []
        for flags, _ in requests:
            out.append(self.evaluations.get(_key(flags)))
        return out

    def _add(self, flags: Flags, label: str, compiled: Compiled) -> Evaluation:
        """The evaluation of one compile; :class:`Unusable` when it cannot be read,
        simulated or memory-checked."""
        memory = MemoryUse(*compiled.memory)
        problem = memory.problem()
        if problem is not None:
            raise Unusable("memory", problem)
        fingerprint = hashlib.sha256(compiled.text.encode("utf-8")).hexdigest()
        limit = overlap_limit(flags)
        pkey = (
            fingerprint,
            limit,
            xo.OVERLAP_LIMIT in flags,
            bool(flags.get(xo.MULTI_STREAMING)),
        )
        shared = pkey in self._predictions
        if not shared:
            t0 = time.perf_counter()
            self._predictions[pkey] = predict(
                compiled.text,
                flags,
                self.target,
                streams=self.options.streams,
                sync_on_compute=self.sync_on_compute,
                profile=self.profile,
            )
            self.predict_durations.append(time.perf_counter() - t0)
        p = self._predictions[pkey]
        if self.facts is None:
            self.facts = module_facts(p.module, p.pairs, self.domain_size)
        ev = Evaluation(
            index=len(self.evaluations),
            flags=dict(flags),
            compile_s=compiled.compile_s,
            memory=memory,
            fits=memory.peak <= self.memory_limit,
            results=p.results,
            ranges=p.ranges,
            what=p.what,
            facts=self.facts,
            label=label,
            text=compiled.text,
            fingerprint=fingerprint,
            cached=compiled.cached,
            shared=shared,
            xla=compiled.xla,
            xla_missing=compiled.xla_missing,
            prediction=p,
        )
        self.evaluations[_key(flags)] = ev
        base = self.baseline.step if self.baseline else ev.step
        k, policy = ev.best_key
        spread = ev.range()
        ends = f" [{spread.low * 1e3:.3f}-{spread.high * 1e3:.3f}]" if spread else ""
        how = "from the cache" if compiled.cached else f"compiled in {compiled.compile_s:.1f}s"
        xla = f", XLA {ev.xla.priced_step_ms:.3f} ms" if ev.xla is not None else ""
        self.say(
            f"  {ev.step * 1e3:.3f} ms{ends} ({base / ev.step:.3f}x) with K={k} {policy}{xla}, "
            f"{format_bytes(memory.peak)}{'' if ev.fits else ' (does not fit)'}, {how}"
            + (" (same module as an earlier candidate)" if shared else "")
        )
        return ev


# -- the search ------------------------------------------------------------------------------


class Evaluator(Protocol):
    """What the search needs: the baseline, and a way to evaluate option sets (None: XLA
    refused one). :class:`Session` is one; a table of recorded predictions is another."""

    @property
    def baseline(self) -> Any: ...

    def evaluate_many(self, requests: Sequence[tuple[Flags, str]]) -> Sequence[Any]: ...


@dataclass
class Outcome:
    """Where the search ended: the best candidate found and its point, whether the check
    of its neighbours completed (the guarantee holds), and notes."""

    best: Any
    point: Point
    certified: bool
    neighbours: int
    notes: list[str]
    guarantee: str
    stopped_by: str = ""  # the budget that stopped it (BudgetSpent.budget), "" for none


def _replace(point: Point, index: int, value: int) -> Point:
    return (*point[:index], value, *point[index + 1 :])


def neighbours(chosen: Sequence[Lever], point: Point) -> list[Point]:
    """Every configuration that differs from ``point`` in one lever, or in two levers
    that pair (:attr:`Lever.pairs`): first those that change only levers that pay
    together (:attr:`Lever.together`), then the other single changes, then the other
    pairs, each in lever order."""
    every = _neighbours(chosen, point)

    def group(other: Point) -> int:
        changed = [i for i, (a, b) in enumerate(zip(other, point, strict=True)) if a != b]
        if all(chosen[i].together is not None for i in changed):
            return 0
        return 1 if len(changed) == 1 else 2

    return sorted(every, key=group)  # stable: lever order within each group


def _neighbours(chosen: Sequence[Lever], point: Point) -> list[Point]:
    out: list[Point] = []
    n = len(chosen)
    for i in range(n):
        for v in range(len(chosen[i].settings)):
            if v != point[i]:
                out.append(_replace(point, i, v))
    for i in range(n):
        if not chosen[i].pairs:
            continue
        for j in range(i + 1, n):
            if not chosen[j].pairs:
                continue
            for v in range(len(chosen[i].settings)):
                if v == point[i]:
                    continue
                for w in range(len(chosen[j].settings)):
                    if w != point[j]:
                        out.append(_replace(_replace(point, i, v), j, w))
    return out


def search(session: Evaluator, chosen: Sequence[Lever]) -> Outcome:
    """The joint move of the levers that pay together, coordinate descent with joint
    moves, then the check of every one- and two-lever neighbour of the result (see the
    module docstring)."""
    base = session.baseline
    start: Point = tuple(0 for _ in chosen)
    known: dict[Point, Any] = {start: base}
    names = [lv.name for lv in chosen]
    db = names.index("double-buffering") if "double-buffering" in names else None

    def run(points: Sequence[Point], why: str) -> list[Any]:
        todo = [p for p in dict.fromkeys(points) if p not in known]
        if todo:
            requests = [(flags_of(chosen, p), f"{describe_point(chosen, p)} ({why})") for p in todo]
            for p, ev in zip(todo, session.evaluate_many(requests), strict=True):
                known[p] = ev
        return [known[p] for p in points]

    def best_of(points: Sequence[Point], why: str) -> tuple[Point, Any] | None:
        found = [(p, ev) for p, ev in zip(points, run(points, why), strict=True)]
        fitting = [(p, ev) for p, ev in found if ev is not None and ev.fits]
        return min(fitting, key=lambda pe: pe[1].step) if fitting else None

    def gains(ev: Any, than: Any) -> bool:
        return bool(ev.step < than.step * (1 - MIN_GAIN))

    current, cur_ev = start, base
    tried: dict[int, Point] = {}
    checked = total = 0
    notes: list[str] = []
    certified = False
    stopped: BudgetSpent | None = None
    try:
        joint: Point = tuple(lv.together or 0 for lv in chosen)
        if joint != start:
            best = best_of([joint], "the levers that pay together")
            if best is not None and gains(best[1], cur_ev):
                current, cur_ev = best
        while True:
            while True:  # coordinate descent
                changed = False
                for i, lever in enumerate(chosen):
                    if tried.get(i) == current:
                        continue
                    values = [v for v in range(len(lever.settings)) if v != current[i]]
                    moves = [_replace(current, i, v) for v in values]
                    if lever.with_double_buffering and db is not None and current[db] == 0:
                        moves += [_replace(_replace(current, i, v), db, 1) for v in values]
                    best = best_of(moves, f"moving {lever.name}")
                    if best is not None and gains(best[1], cur_ev):
                        current, cur_ev = best
                        changed = True
                    tried[i] = current
                if not changed:
                    break
            # The check, in batches: the first batch that holds a faster neighbour moves
            # the search there (and it descends again); the budget can stop it between.
            around = neighbours(chosen, current)
            total, checked = len(around), 0
            moved = False
            pending = [p for p in around if p not in known]
            batches = [[p for p in around if p in known]] + [
                pending[i : i + CHECK_BATCH] for i in range(0, len(pending), CHECK_BATCH)
            ]
            for batch in batches:
                best = best_of(batch, "checking the neighbours")
                checked += len(batch)
                if best is not None and gains(best[1], cur_ev):
                    current, cur_ev = best
                    moved = True
                    break
            if moved:
                continue
            certified = True
            break
    except BudgetSpent as stop:
        stopped = stop
        partial = (
            f"; {checked} of the {total} neighbours of the result checked, none faster"
            if total
            else ""
        )
        notes.append(
            f"{stop.words} stopped the search before {stop.label}: the result is the best "
            f"found so far{partial}"
        )
    paired = [lv.name for lv in chosen if lv.pairs]
    single = [lv.name for lv in chosen if not lv.pairs]
    if stopped is not None and total:
        guarantee = (
            f"partial: {stopped.words} stopped the check after {checked} of the {total} one- "
            f"and two-lever neighbours (none of those faster by {MIN_GAIN:.1%})"
        )
    elif certified:
        guarantee = (
            f"no change of one lever, nor of two of {', '.join(paired) or 'none'}, makes it "
            f"faster by {MIN_GAIN:.1%} or more (all {checked} such neighbours checked"
            + (f"; {', '.join(single)} checked one at a time" if single else "")
            + ")"
        )
        if len(chosen) <= 2 and not single:
            guarantee += ": that is every configuration of these levers, so it is their best"
    else:
        guarantee = "none: the search did not finish"
    stopped_by = stopped.budget if stopped is not None else ""
    return Outcome(
        cur_ev, current, certified, checked, notes, guarantee + _repeatable(stopped_by), stopped_by
    )


def _repeatable(stopped_by: str) -> str:
    """What the result promises about running the search again."""
    if stopped_by == "budget_s":
        return (
            "; not repeatable: the time limit, not the compile budget, ended the search, so "
            "a faster or less busy machine goes further (raise --budget-s)"
        )
    return (
        "; repeatable: the same program, target, options and compile budget give this "
        "result on any machine, busy or quiet, from the cache or not"
    )


def exhaustive(session: Evaluator, chosen: Sequence[Lever]) -> Outcome:
    """Every configuration of ``chosen`` (their product), compiled as one batch; the
    fastest that fits."""
    points = list(itertools.product(*(range(len(lv.settings)) for lv in chosen)))
    base = session.baseline
    notes: list[str] = []
    stopped_by = ""
    try:
        found = session.evaluate_many(
            [(flags_of(chosen, p), f"{describe_point(chosen, p)} (grid)") for p in points]
        )
        certified = True
    except BudgetSpent as stop:
        notes.append(f"{stop.words} stopped the grid before {stop.label}")
        found, certified, stopped_by = [], False, stop.budget
    best_point: Point = tuple(0 for _ in chosen)
    best = base
    for p, ev in zip(points, found, strict=False):
        if ev is not None and ev.fits and ev.step < best.step:
            best_point, best = p, ev
    guarantee = (
        f"exhaustive: the fastest of all {len(points)} configurations of "
        f"{', '.join(lv.name for lv in chosen) or 'no levers'}"
        if certified
        else "none: the grid did not finish"
    )
    return Outcome(best, best_point, certified, len(points), notes, guarantee, stopped_by)


# -- the recommendation ------------------------------------------------------------------------


def recommend(
    session: Session,
    outcome: Outcome,
    *,
    levers: Sequence[Lever] = (),
    skipped: Sequence[str],
    notes: Sequence[str],
    topology: str = "",
) -> TuneResult:
    """The result of the search of ``session`` over ``levers`` that found ``outcome``:
    its best, or XLA's defaults with the reasons nothing beats them (see the module
    docstring), with XLA's own estimate beside it (:mod:`~xla_streams.tuning.opinion`),
    for the program and topology of the session's options; ``skipped`` are the levers
    not searched and why, ``notes`` go into the result, ``topology`` is its shape."""
    options = session.options
    devices, per_host, _ = options.topology()
    assert options.program is not None  # the driver names every program it tunes
    base_ev = session.baseline
    assert base_ev is not None
    found: Evaluation = outcome.best
    evaluations = list(session.evaluations.values())
    one = (1, DEFAULT_POLICY)
    baseline = base_ev.configuration(one)
    ranked = sorted(evaluations, key=lambda e: (e.step, len(e.flags), e.best_key[0], e.index))
    candidates = tuple(e.configuration(candidate=True) for e in ranked)
    chosen = found if found.fits else None
    notes = [*notes, *outcome.notes]
    dropped = tuple(session.dropped.values())
    if dropped:
        counts = Counter(d.stage for d in dropped)
        why = ", ".join(f"{n} because {DROP_STAGES[stage]}" for stage, n in counts.items())
        shown = "; ".join(dict.fromkeys(f"{d.settings}: {d.reason}" for d in dropped[:2]))
        notes.append(f"dropped {len(dropped)} candidate(s), {why} (listed in the table): {shown}")
    notes += placeholder_notes([baseline, *candidates])
    if session.unavailable:
        notes.append(
            "this XLA has no option " + ", ".join(sorted(session.unavailable)) + ": not searched"
        )
    notes += xla_flags_notes(os.environ.get("XLA_FLAGS", ""))
    if not base_ev.fits:
        notes.append(
            f"XLA's defaults need {format_bytes(base_ev.memory.peak)} per GPU, more than the "
            f"{format_bytes(session.memory_limit)} limit"
        )
    recommended = base_ev
    reasons: list[str] = []
    if chosen is not None and chosen is not base_ev:
        why_not = _beats(chosen, base_ev)
        if why_not is None or (not base_ev.fits and chosen.step <= base_ev.step):
            recommended = chosen
        else:
            reasons.append(why_not)
    if recommended is base_ev:
        reasons += _why_not(session, chosen, baseline.predicted_step_ms / 1e3)
    else:
        recommended = _leanest(recommended, evaluations)
        if recommended is not chosen:
            assert chosen is not None
            extra = {k: v for k, v in chosen.flags.items() if k not in recommended.flags}
            notes.append(
                f"left out {describe(extra)}: the search's result compiles to the same module "
                "without it"
            )
    best = recommended.configuration(one) if recommended is base_ev else recommended.configuration()
    speedup = baseline.predicted_step_ms / best.predicted_step_ms if best.predicted_step_ms else 1.0
    if recommended is base_ev:
        verdict = "nothing beats XLA's defaults: keep them" + (
            f" ({reasons[0]})" if reasons else ""
        )
    else:
        verdict = f"{best.settings} with {best.streams} stream(s): {speedup:.3f}x predicted"
    opinion = _second_opinion(session, base_ev, recommended, best, ranked, levers)
    return TuneResult(
        program=options.program,
        target=options.target,
        devices=devices,
        devices_per_host=per_host,
        baseline=baseline,
        best=best,
        candidates=candidates,
        command=command_line(best.xla_flags, best.streams, best.policy, options.script),
        hbm_bytes=session.hbm,
        headroom=options.headroom,
        verdict=verdict,
        reasons=tuple(dict.fromkeys(reasons)),
        skipped=tuple(skipped),
        notes=tuple(notes),
        elapsed_s=session.elapsed(),
        budget_s=options.budget_s,
        compiles=session.compiled,
        cache_hits=session.cache_hits,
        evaluated=session.evaluated,
        guarantee=outcome.guarantee,
        topology=topology,
        dropped=dropped,
        budget_compiles=options.budget_compiles,
        stopped_by=outcome.stopped_by,
        second_opinion=opinion,
        script=options.script,
        best_hlo=recommended.text,
    )


def _second_opinion(
    session: Session,
    base: Evaluation,
    recommended: Evaluation,
    best: Configuration,
    evaluations: Sequence[Evaluation],
    levers: Sequence[Lever],
) -> str:
    """XLA's own estimate on the recommendation, in one line (:func:`opinion.second_opinion`)."""

    def candidate(e: Evaluation, configuration: Configuration) -> Candidate:
        assert e.prediction is not None
        return Candidate(configuration, e.prediction.module, e.prediction.pairs, e.xla_missing)

    _, per_host, _ = session.options.topology()
    return second_opinion(
        candidate(base, base.configuration((1, DEFAULT_POLICY))),
        candidate(recommended, best),
        [candidate(e, e.configuration()) for e in evaluations],
        levers,
        session.target,
        per_host,
    )


def _leanest(found: Evaluation, evaluations: Sequence[Evaluation]) -> Evaluation:
    """``found``, or the evaluation with the fewest of its options that compiled to the
    same module with the same predictions (a lever that changes nothing is left out)."""
    same = [
        e
        for e in evaluations
        if e.fingerprint == found.fingerprint
        and e.results == found.results
        and e.fits
        and e.flags.items() <= found.flags.items()
    ]
    return min(same, key=lambda e: (len(e.flags), e.index), default=found)


def _beats(chosen: Evaluation, base: Evaluation) -> str | None:
    """None when ``chosen`` beats ``base`` (see the module docstring), else why not."""
    step, base_step = chosen.step, base.step
    if not step < base_step * (1 - MIN_SPEEDUP):
        return (
            f"the best configuration found ({describe(chosen.flags)}) is only "
            f"{base_step / step:.4f}x, below the {MIN_SPEEDUP:.0%} margin"
        )
    mine, theirs = chosen.range(), base.range((1, DEFAULT_POLICY))
    if mine is None or theirs is None:
        return None
    for end, a, b in (
        ("pessimistic", mine.high, theirs.high),
        ("optimistic", mine.low, theirs.low),
    ):
        if not a < b:
            return (
                f"the best configuration found ({describe(chosen.flags)}) is "
                f"{base_step / step:.3f}x as modelled but not faster at the {end} end of the "
                f"range ({a * 1e3:.3f} ms against the defaults' {b * 1e3:.3f} ms)"
            )
    return None


# Options in XLA_FLAGS that make every candidate's compile write files.
_DUMP_FLAGS = ("xla_dump_to", "xla_dump_hlo_as", "xla_dump_hlo_pass_re", "xla_dump_hlo_module_re")


def xla_flags_notes(xla_flags: str) -> list[str]:
    """What the tune result says about ``XLA_FLAGS`` set in this process: its value in
    full (options the tuner does not search apply to every candidate and belong in the
    command too), and a warning for dump flags."""
    if not xla_flags.strip():
        return []
    out = [
        f"XLA_FLAGS is set in this process: {xla_flags.strip()!r}; the options it sets "
        "that the tuner does not search apply to every candidate (and must be in the "
        "command too); the searched ones are overridden per candidate"
    ]
    dumps = sorted({name for name in xo.options_in(xla_flags) if name.startswith(_DUMP_FLAGS)})
    if dumps:
        out.append(
            f"XLA_FLAGS sets {', '.join('--' + d for d in dumps)}: every candidate's compile "
            "writes its dump (slower, and the files add up); unset it for tuning"
        )
    return out


def _why_not(session: Session, best: Evaluation | None, baseline_step: float) -> list[str]:
    """Why nothing beats XLA's defaults, from the baseline's simulation and the search."""
    base = session.baseline
    assert base is not None and session.facts is not None
    facts = session.facts
    what = base.what
    out: list[str] = []
    if facts.collectives == 0:
        return ["the program has no collectives"]
    step, exposed = base.results[(1, DEFAULT_POLICY)]
    if exposed <= 0.01 * step:
        out.append(
            f"communication is already hidden: {exposed * 1e3:.3f} ms of the "
            f"{step * 1e3:.3f} ms step is exposed"
        )
    elif what is not None and what.lower_bound.step_time >= step * (1 - MIN_SPEEDUP):
        out.append(
            "collectives form a dependency chain: each one's input comes from the compute "
            "just before it and its result is needed just after, so even every collective "
            "on its own stream would not be faster "
            f"({facts.sync_collectives} of {facts.collectives} run synchronously, "
            f"{exposed * 1e3:.3f} ms of {step * 1e3:.3f} ms exposed)"
        )
    elif what is not None and what.rule_bound.step_time >= step * (1 - MIN_SPEEDUP):
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
            f"{format_bytes(e.memory.peak)} > {format_bytes(session.memory_limit)})"
        )
    if not out and (best is None or best is base):
        out.append(
            "none of the levers tried makes XLA schedule more overlap that pays "
            f"({len(session.evaluations)} option sets compiled)"
        )
    return out
