"""The prediction ``xla-streams simulate --json`` writes: schema ``xla_streams.simulate.v1``.

A :class:`Prediction` is the file as data, times in milliseconds as the file has
them: :meth:`Prediction.of` makes it from the simulator's results, ``to_json``
writes it and ``from_json`` reads it back, refusing at the field's path what breaks
a rule of the schema (``p.json: range.step_ms.low: ...``). The fields are in
docs/formats.md.

``step_ms``, ``compute_only_ms`` and ``exposed_communication_ms`` are the baseline's
(the smallest K under the first policy: one stream, what XLA does); ``results`` has
every (K, policy); ``bounds`` the rule and lower bounds; ``xla_multi_streaming``,
``range`` and ``profile`` are null when not predicted, ``xla_estimate`` (XLA's own
estimate of the same module, from its schedule dump) when not asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args

from xla_streams import _json
from xla_streams.collectives import MAX_STREAMS, POLICIES, Lane
from xla_streams.simulate.errors import ErrorBound
from xla_streams.simulate.execution_streams import MULTI_STREAMING_COMMUNICATION_STREAMS
from xla_streams.simulate.measured import default_perf_table
from xla_streams.simulate.profile import MeasuredCosts
from xla_streams.simulate.ranges import PredictionRange
from xla_streams.simulate.timeline import SimResult
from xla_streams.simulate.whatif import WhatIf
from xla_streams.simulate.xla_estimate import COMMUNICATION_WASTE, XlaEstimate

SCHEMA = "xla_streams.simulate.v1"
RUNS_ON: tuple[Lane, ...] = get_args(Lane)


class PredictionError(ValueError):
    """A prediction file that cannot be read, or breaks a rule of its schema."""


@dataclass(frozen=True)
class PredictedTarget:
    """The GPU predicted for, and the collective table that priced it (``target``)."""

    name: str
    gpu: str
    devices_per_host: int
    perf_table_key: str | None
    perf_table: str | None


@dataclass(frozen=True)
class Baseline:
    """Which result the top-level times are (``baseline``)."""

    streams: int
    policy: str

    @classmethod
    def of(cls, r: SimResult) -> Baseline:
        if r.streams is None or r.policy is None:
            raise ValueError(f"{r.label} is a bound, not a configuration")
        return cls(r.streams, r.policy)


@dataclass(frozen=True)
class Step:
    """A simulated step: its time, the communication it leaves exposed, and its speedup
    over the baseline (None for a step of no time)."""

    step_ms: float
    exposed_communication_ms: float
    speedup: float | None

    @staticmethod
    def times(r: SimResult, base: SimResult) -> dict[str, Any]:
        """The three fields of ``r`` against ``base``, as keywords."""
        return {
            "step_ms": r.step_time * 1e3,
            "exposed_communication_ms": r.exposed_communication * 1e3,
            "speedup": base.step_time / r.step_time if r.step_time > 0 else None,
        }

    def _times_json(self) -> dict[str, Any]:
        return {
            "step_ms": self.step_ms,
            "exposed_communication_ms": self.exposed_communication_ms,
            "speedup": self.speedup,
        }


@dataclass(frozen=True)
class ChangeSplit:
    """A result's change over the baseline split into parts that add up to ``total_ms``
    (``results[i].change_ms``; ``whatif.Change``)."""

    queueing_ms: float
    bandwidth_sharing_ms: float
    interference_ms: float

    @property
    def total_ms(self) -> float:
        return self.queueing_ms + self.bandwidth_sharing_ms + self.interference_ms


@dataclass(frozen=True)
class Result(Step):
    """One K and policy (``results[i]``), with each collective stream's busy time, its
    change over the baseline, split, and the most CTAs its NCCL kernels in flight
    together may need (``residency.py``); the last two None in files written before
    they were added."""

    streams: int
    policy: str
    stream_busy_ms: tuple[float, ...]
    change_ms: ChangeSplit | None = None
    resident_ctas: int | None = None


@dataclass(frozen=True)
class Bound(Step):
    """A bound on the step, and what it assumes (``bounds.rule``, ``bounds.lower``)."""

    label: str


@dataclass(frozen=True)
class Bounds:
    """What the deadlock rule allows at best, and what no assignment beats (``bounds``)."""

    rule: Bound
    lower: Bound


@dataclass(frozen=True)
class XlaMultiStreaming(Step):
    """XLA's own collective multi-streaming replayed (``xla_multi_streaming``)."""

    streams: int


@dataclass(frozen=True)
class Ends:
    """A range: low <= expected <= high."""

    low: float
    expected: float
    high: float


@dataclass(frozen=True)
class StepRange:
    """The baseline with every modelled input at either end of its error bound, and
    those bounds (``range``)."""

    streams: int
    policy: str
    step_ms: Ends
    exposed_communication_ms: Ends
    errors: tuple[ErrorBound, ...]


@dataclass(frozen=True)
class ProfileSummary:
    """How much of the step a PGLE profile measured (``profile``)."""

    path: str
    measured_ms: float
    modeled_ms: float
    measured_fraction: float
    names: int
    names_in_module: int
    skipped: int


@dataclass(frozen=True)
class XlaStep:
    """XLA's own estimate of the module (``xla_estimate``), beside the simulator's
    baseline: its step as scheduled and without the waits on its placeholders (the
    async pairs it charges a flat 5 ms, named by their starts), split as the baseline is
    into kernels and exposed communication, and the scheduler's wasted time by kind."""

    path: str
    module: str
    step_ms: float
    priced_step_ms: float
    kernels_ms: float
    exposed_communication_ms: float
    wasted_ms: dict[str, float]
    placeholders: tuple[str, ...]

    @classmethod
    def of(cls, estimate: XlaEstimate) -> XlaStep:
        wasted: dict[str, float] = {}
        for c in estimate.computations:
            for kind, us in c.wasted_us.items():
                wasted[kind] = wasted.get(kind, 0.0) + us * c.runs / 1e3
        return cls(
            path=estimate.path,
            module=estimate.module,
            step_ms=estimate.step_us / 1e3,
            priced_step_ms=estimate.priced_step_us / 1e3,
            kernels_ms=sum(c.busy_us * c.runs for c in estimate.computations) / 1e3,
            exposed_communication_ms=estimate.exposed_communication_us / 1e3,
            wasted_ms={k: v for k, v in sorted(wasted.items()) if v > 0},
            placeholders=tuple(p.start for p in estimate.placeholders),
        )

    @property
    def communication_wasted_ms(self) -> dict[str, float]:
        """The wasted time of the communication kinds (the rest is fusions', calls')."""
        return {k: v for k, v in self.wasted_ms.items() if k in COMMUNICATION_WASTE}


@dataclass(frozen=True)
class Prediction:
    """What ``xla-streams simulate --json`` writes: schema ``xla_streams.simulate.v1``."""

    module: str
    target: PredictedTarget
    async_pairs: int
    runs_on: dict[str, int]
    baseline: Baseline
    step_ms: float
    compute_only_ms: float
    exposed_communication_ms: float
    serial_ms: float
    results: tuple[Result, ...]
    bounds: Bounds
    xla_multi_streaming: XlaMultiStreaming | None
    range: StepRange | None
    profile: ProfileSummary | None
    notes: tuple[str, ...]
    xla_estimate: XlaStep | None = None
    # What collectives in flight take from the baseline's step (None: an older file).
    interference_ms: float | None = None

    @classmethod
    def of(
        cls,
        what: WhatIf,
        *,
        xla: SimResult | None = None,
        range_: PredictionRange | None = None,
        measured: MeasuredCosts | None = None,
        xla_estimate: XlaEstimate | None = None,
    ) -> Prediction:
        """The prediction of ``what``, with XLA's own multi-streaming, the baseline's
        range and the profile's share when they were simulated, and XLA's own estimate
        of the module when its schedule dump was given."""
        base, target = what.baseline, what.target
        baseline = Baseline.of(base)
        table: str | None = None
        if target.perf_table_key is not None:
            table = target.perf_table.path if target.perf_table is not None else None
            table = table or default_perf_table().path
        places: dict[str, int] = {}
        for pair in what.pairs:
            places[pair.lane] = places.get(pair.lane, 0) + 1
        results = tuple(
            Result(
                streams=k,
                policy=policy,
                stream_busy_ms=tuple(r.lane_busy.get(s, 0.0) * 1e3 for s in range(k)),
                change_ms=ChangeSplit(
                    c.queueing * 1e3, c.bandwidth_sharing * 1e3, c.interference * 1e3
                ),
                resident_ctas=what.resident_ctas[(k, policy)],
                **Step.times(r, base),
            )
            for policy in what.policies
            for k in what.streams
            for r, c in [(what.results[(k, policy)], what.changes[(k, policy)])]
        )
        span = None
        if range_ is not None:
            span = StepRange(
                streams=baseline.streams,
                policy=baseline.policy,
                step_ms=Ends(range_.low * 1e3, range_.expected * 1e3, range_.high * 1e3),
                exposed_communication_ms=Ends(
                    range_.exposed_low * 1e3,
                    range_.exposed_expected * 1e3,
                    range_.exposed_high * 1e3,
                ),
                errors=range_.bounds,
            )
        profile = None
        if measured is not None:
            profile = ProfileSummary(
                path=measured.path,
                measured_ms=base.profiled_time * 1e3,
                modeled_ms=base.modeled_time * 1e3,
                measured_fraction=base.profiled_fraction,
                names=len(measured.seconds),
                names_in_module=len(measured.seconds) - len(measured.unused()),
                skipped=measured.skipped,
            )
        return cls(
            module=what.module,
            target=PredictedTarget(
                target.name, target.gpu, target.devices_per_host, target.perf_table_key, table
            ),
            async_pairs=len(what.pairs),
            runs_on=places,
            baseline=baseline,
            step_ms=base.step_time * 1e3,
            compute_only_ms=base.compute_time * 1e3,
            exposed_communication_ms=base.exposed_communication * 1e3,
            serial_ms=what.serial * 1e3,
            results=results,
            bounds=Bounds(
                Bound(label=what.rule_bound.label, **Step.times(what.rule_bound, base)),
                Bound(label=what.lower_bound.label, **Step.times(what.lower_bound, base)),
            ),
            xla_multi_streaming=(
                None
                if xla is None
                else XlaMultiStreaming(
                    streams=MULTI_STREAMING_COMMUNICATION_STREAMS, **Step.times(xla, base)
                )
            ),
            range=span,
            profile=profile,
            notes=(*what.notes, *what.non_monotone()),
            xla_estimate=None if xla_estimate is None else XlaStep.of(xla_estimate),
            interference_ms=what.interference * 1e3,
        )

    def to_json(self) -> str:
        """The file: indented, ASCII, a final newline."""
        t, span, profile, xla = self.target, self.range, self.profile, self.xla_multi_streaming
        estimate = self.xla_estimate
        return _json.dumps(
            {
                "schema": SCHEMA,
                "module": self.module,
                "target": {
                    "name": t.name,
                    "gpu": t.gpu,
                    "devices_per_host": t.devices_per_host,
                    "perf_table_key": t.perf_table_key,
                    "perf_table": t.perf_table,
                },
                "async_pairs": self.async_pairs,
                "runs_on": self.runs_on,
                "baseline": {"streams": self.baseline.streams, "policy": self.baseline.policy},
                "step_ms": self.step_ms,
                "compute_only_ms": self.compute_only_ms,
                "exposed_communication_ms": self.exposed_communication_ms,
                "serial_ms": self.serial_ms,
                "interference_ms": self.interference_ms,
                "results": [
                    {
                        "streams": r.streams,
                        "policy": r.policy,
                        **r._times_json(),
                        "stream_busy_ms": list(r.stream_busy_ms),
                        "change_ms": None
                        if r.change_ms is None
                        else {
                            "total": r.change_ms.total_ms,
                            "queueing": r.change_ms.queueing_ms,
                            "bandwidth_sharing": r.change_ms.bandwidth_sharing_ms,
                            "interference": r.change_ms.interference_ms,
                        },
                        "resident_ctas": r.resident_ctas,
                    }
                    for r in self.results
                ],
                "bounds": {
                    "rule": {"label": self.bounds.rule.label, **self.bounds.rule._times_json()},
                    "lower": {"label": self.bounds.lower.label, **self.bounds.lower._times_json()},
                },
                "xla_multi_streaming": (
                    None if xla is None else {"streams": xla.streams, **xla._times_json()}
                ),
                "range": None
                if span is None
                else {
                    "streams": span.streams,
                    "policy": span.policy,
                    "step_ms": _ends_json(span.step_ms),
                    "exposed_communication_ms": _ends_json(span.exposed_communication_ms),
                    "errors": {
                        b.name: {"low": b.low, "high": b.high, "source": b.source}
                        for b in span.errors
                    },
                },
                "profile": None
                if profile is None
                else {
                    "path": profile.path,
                    "measured_ms": profile.measured_ms,
                    "modeled_ms": profile.modeled_ms,
                    "measured_fraction": profile.measured_fraction,
                    "names": profile.names,
                    "names_in_module": profile.names_in_module,
                    "skipped": profile.skipped,
                },
                "notes": list(self.notes),
                "xla_estimate": None
                if estimate is None
                else {
                    "path": estimate.path,
                    "module": estimate.module,
                    "step_ms": estimate.step_ms,
                    "priced_step_ms": estimate.priced_step_ms,
                    "kernels_ms": estimate.kernels_ms,
                    "exposed_communication_ms": estimate.exposed_communication_ms,
                    "wasted_ms": estimate.wasted_ms,
                    "placeholders": list(estimate.placeholders),
                },
            }
        )

    @classmethod
    def from_json(cls, text: str, where: str = "prediction") -> Prediction:
        """The prediction in ``text`` (read from ``where``); PredictionError, naming the
        field, for a document that is not one: a wrong type, a missing field (the
        optional parts are null, never absent), a negative time, ``runs_on`` counts
        that do not add up to ``async_pairs``, a stream's busy times not one per
        stream, a range out of order, a measured fraction outside 0..1. Fields it does
        not know are ignored."""
        doc = _json.loads(text, where, PredictionError, what="prediction")
        doc.schema(SCHEMA)
        async_pairs = doc["async_pairs"].integer(0)
        runs_on: dict[str, int] = {}
        for lane, n in doc["runs_on"].fields().items():
            if lane not in RUNS_ON:
                n.fail(f"not a place XLA runs a pair ({', '.join(RUNS_ON)})")
            runs_on[lane] = n.integer(0)
        if sum(runs_on.values()) != async_pairs:
            doc["runs_on"].fail(f"counts add up to {sum(runs_on.values())}, not {async_pairs}")
        t, bounds = doc["target"], doc["bounds"]
        return cls(
            module=doc["module"].string(),
            target=PredictedTarget(
                name=t["name"].string(),
                gpu=t["gpu"].string(),
                devices_per_host=t["devices_per_host"].integer(1),
                perf_table_key=t["perf_table_key"].nullable(_json.Value.string),
                perf_table=t["perf_table"].nullable(_json.Value.string),
            ),
            async_pairs=async_pairs,
            runs_on=runs_on,
            baseline=Baseline(
                doc["baseline"]["streams"].integer(1, MAX_STREAMS),
                doc["baseline"]["policy"].one_of(POLICIES),
            ),
            step_ms=doc["step_ms"].number(0),
            compute_only_ms=doc["compute_only_ms"].number(0),
            exposed_communication_ms=doc["exposed_communication_ms"].number(0),
            serial_ms=doc["serial_ms"].number(0),
            results=tuple(_read_result(r) for r in doc["results"].items()),
            bounds=Bounds(
                Bound(label=bounds["rule"]["label"].string(), **_read_step(bounds["rule"])),
                Bound(label=bounds["lower"]["label"].string(), **_read_step(bounds["lower"])),
            ),
            xla_multi_streaming=doc["xla_multi_streaming"].nullable(
                lambda x: XlaMultiStreaming(streams=x["streams"].integer(1), **_read_step(x))
            ),
            range=doc["range"].nullable(_read_range),
            profile=doc["profile"].nullable(_read_profile),
            notes=tuple(n.string() for n in doc["notes"].items()),
            # Added to v1 after its first files: absent reads as not asked for.
            xla_estimate=_read_xla_step(estimate)
            if (estimate := doc.get("xla_estimate"))
            else None,
            interference_ms=interference.nullable(_json.Value.number)
            if (interference := doc.get("interference_ms"))
            else None,
        )


def _ends_json(ends: Ends) -> dict[str, float]:
    return {"low": ends.low, "expected": ends.expected, "high": ends.high}


def _read_step(doc: _json.Value) -> dict[str, Any]:
    return {
        "step_ms": doc["step_ms"].number(0),
        "exposed_communication_ms": doc["exposed_communication_ms"].number(0),
        "speedup": doc["speedup"].nullable(_json.Value.number),
    }


def _read_result(doc: _json.Value) -> Result:
    streams = doc["streams"].integer(1, MAX_STREAMS)
    busy = tuple(b.number(0) for b in doc["stream_busy_ms"].items())
    if len(busy) != streams:
        doc["stream_busy_ms"].fail(f"expected one time per stream ({streams}), got {len(busy)}")
    change, ctas = doc.get("change_ms"), doc.get("resident_ctas")
    return Result(
        streams=streams,
        policy=doc["policy"].one_of(POLICIES),
        stream_busy_ms=busy,
        change_ms=None if change is None else change.nullable(_read_change),
        resident_ctas=None if ctas is None else ctas.nullable(lambda v: v.integer(0)),
        **_read_step(doc),
    )


def _read_change(doc: _json.Value) -> ChangeSplit:
    split = ChangeSplit(
        doc["queueing"].number(),
        doc["bandwidth_sharing"].number(),
        doc["interference"].number(),
    )
    total = doc["total"].number()
    if abs(total - split.total_ms) > 1e-6 * max(1.0, abs(total)):
        doc["total"].fail(f"expected the sum of the parts ({split.total_ms}), got {total}")
    return split


def _read_ends(doc: _json.Value) -> Ends:
    ends = Ends(doc["low"].number(0), doc["expected"].number(0), doc["high"].number(0))
    if not ends.low <= ends.expected <= ends.high:
        doc.fail(
            f"expected low <= expected <= high, got {ends.low} .. {ends.expected} .. {ends.high}"
        )
    return ends


def _read_range(doc: _json.Value) -> StepRange:
    return StepRange(
        streams=doc["streams"].integer(1, MAX_STREAMS),
        policy=doc["policy"].one_of(POLICIES),
        step_ms=_read_ends(doc["step_ms"]),
        exposed_communication_ms=_read_ends(doc["exposed_communication_ms"]),
        errors=tuple(
            ErrorBound(name, e["low"].number(0), e["high"].number(0), e["source"].string())
            for name, e in doc["errors"].fields().items()
        ),
    )


def _read_xla_step(doc: _json.Value) -> XlaStep | None:
    def read(x: _json.Value) -> XlaStep:
        step = XlaStep(
            path=x["path"].string(),
            module=x["module"].string(),
            step_ms=x["step_ms"].number(0),
            priced_step_ms=x["priced_step_ms"].number(0),
            kernels_ms=x["kernels_ms"].number(0),
            exposed_communication_ms=x["exposed_communication_ms"].number(0),
            wasted_ms={k: v.number(0) for k, v in x["wasted_ms"].fields().items()},
            placeholders=tuple(p.string() for p in x["placeholders"].items()),
        )
        if step.priced_step_ms > step.step_ms * (1 + 1e-9):
            x["priced_step_ms"].fail(
                f"expected at most step_ms ({step.step_ms}), got {step.priced_step_ms}"
            )
        return step

    return doc.nullable(read)


def _read_profile(doc: _json.Value) -> ProfileSummary:
    fraction = doc["measured_fraction"].number(0)
    if fraction > 1:
        doc["measured_fraction"].fail(f"expected a fraction in 0..1, got {fraction}")
    return ProfileSummary(
        path=doc["path"].string(),
        measured_ms=doc["measured_ms"].number(0),
        modeled_ms=doc["modeled_ms"].number(0),
        measured_fraction=fraction,
        names=doc["names"].integer(0),
        names_in_module=doc["names_in_module"].integer(0),
        skipped=doc["skipped"].integer(0),
    )
