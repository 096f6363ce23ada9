"""One search's session: its budget (compiles, and wall time as a safety limit), its
progress bar, its compiles, and every option set evaluated so far (docs/tune.md, "The
search")."""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from xla_streams import xla_options as xo
from xla_streams.simulate import Profile, Target
from xla_streams.tuning.cache import Compiled, Refused
from xla_streams.tuning.compiling import Compiler
from xla_streams.tuning.evaluation import (
    CandidatePrediction,
    Evaluation,
    MemoryUse,
    Unusable,
    compile_options,
    flags_key,
    predict,
)
from xla_streams.tuning.levers import (
    CollectiveCensus,
    Flags,
    collective_census,
    describe,
    format_bytes,
    overlap_limit,
)
from xla_streams.tuning.options import TuneOptions
from xla_streams.tuning.result import DROP_STAGES, Dropped, TuneError


class ProgressBar:
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
    census: CollectiveCensus | None = None
    baseline: Evaluation | None = None
    unavailable: frozenset[str] = frozenset()  # options this XLA does not have
    compiled: int = 0  # real compiles (not from the cache)
    cache_hits: int = 0
    _predictions: dict[tuple[str, int, bool, bool], CandidatePrediction] = field(
        default_factory=dict
    )

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
            key = flags_key(flags)
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
            out.append(self.evaluations.get(flags_key(flags)))
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
        if self.census is None:
            self.census = collective_census(p.module, p.pairs, self.domain_size)
        ev = Evaluation(
            index=len(self.evaluations),
            flags=dict(flags),
            compile_s=compiled.compile_s,
            memory=memory,
            fits=memory.peak <= self.memory_limit,
            results=p.results,
            ranges=p.ranges,
            what=p.what,
            census=self.census,
            label=label,
            text=compiled.text,
            fingerprint=fingerprint,
            cached=compiled.cached,
            shared=shared,
            xla=compiled.xla,
            xla_missing=compiled.xla_missing,
            prediction=p,
        )
        self.evaluations[flags_key(flags)] = ev
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
