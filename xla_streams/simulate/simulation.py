"""One simulation of a module, as ``xla-streams simulate`` runs it: the what-if sweep,
XLA's own multi-streaming, the range of the baseline, the pictures, and the what-if
table in words."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xla_streams._text import aligned, counted
from xla_streams.collectives import POLICIES, STREAM_COUNTS, Policy, StreamModel
from xla_streams.hlo import Module
from xla_streams.simulate.compiler import Progress
from xla_streams.simulate.execution_streams import MULTI_STREAMING_COMMUNICATION_STREAMS
from xla_streams.simulate.prediction import Prediction, XlaStep
from xla_streams.simulate.profile import MeasuredCosts, Profile
from xla_streams.simulate.ranges import PredictionRange, predict_range
from xla_streams.simulate.simulator import Simulator
from xla_streams.simulate.targets import Target
from xla_streams.simulate.timeline import SimResult, runs_on
from xla_streams.simulate.visual import pictures, run_xla_multi_streaming
from xla_streams.simulate.whatif import WhatIf, what_if
from xla_streams.simulate.xla_estimate import XlaEstimate
from xla_streams.streams import AsyncPair
from xla_streams.streams.pairs import check_scheduled
from xla_streams.xla_options import MULTI_STREAMING


@dataclass
class Simulation:
    """Everything one run produced; ``trace`` and ``html`` only when pictures were asked
    for. ``xla``: XLA's own multi-streaming replayed (None when not asked for);
    ``range``: the baseline's step time at the ends of the model's error bounds (None
    when not asked for); ``measured``: the profile's costs, when one was given;
    ``xla_estimate``: XLA's own estimate of the module, when its schedule was given."""

    what: WhatIf
    table: str
    trace: str | None = None
    html: str | None = None
    xla: SimResult | None = None
    range: PredictionRange | None = None
    measured: MeasuredCosts | None = None
    xla_estimate: XlaEstimate | None = None

    def prediction(self) -> Prediction:
        """What ``--json`` writes."""
        return Prediction.of(
            self.what,
            xla=self.xla,
            range_=self.range,
            measured=self.measured,
            xla_estimate=self.xla_estimate,
        )


def simulate_module(
    module: Module,
    target: Target,
    streams: Sequence[int] = STREAM_COUNTS,
    policies: Sequence[Policy] = POLICIES,
    *,
    model: StreamModel | None = None,
    pictures_for: str | None = None,
    progress: Progress | None = None,
    pairs: Sequence[AsyncPair] | None = None,
    profile: Profile | None = None,
    xla_multi_streaming: bool = True,
    prediction_range: bool = True,
    xla_estimate: XlaEstimate | None = None,
) -> Simulation:
    """The what-if predictions for ``module``, of ``pairs`` (default: found under
    ``model``); with ``pictures_for`` (the trace's address for the HTML's link,
    or "" for none) also its trace and HTML. ``profile``: the program's measured
    costs replace the model's where it names an instruction. ``xla_multi_streaming``:
    also replay XLA's own two-stream placement; ``prediction_range``: also the
    baseline at the ends of the model's error bounds; ``xla_estimate``: XLA's own
    estimate of the module, shown beside the baseline."""
    check_scheduled(module)  # an unscheduled module has no overlap to predict
    if progress:
        count = sum(len(c.instructions) for c in module.computations)
        progress(f"cost model for {count} instructions")
    measured = profile.for_module(module) if profile is not None else None
    sim = Simulator(module, target, pairs, model=model, progress=progress, measured=measured)
    what = what_if(module, target, streams, policies, progress=progress, simulator=sim)
    xla = None
    if xla_multi_streaming:
        if progress:
            progress("simulating XLA's own multi-streaming")
        xla = run_xla_multi_streaming(sim)
    span = None
    if prediction_range:
        if progress:
            progress("simulating the ends of the error bounds")
        span = predict_range(sim, what.assignments[(what.streams[0], what.policies[0])])
    result = Simulation(
        what,
        format_what_if(
            what,
            xla=xla,
            range_=span,
            measured=measured,
            xla_estimate=None if xla_estimate is None else XlaStep.of(xla_estimate),
        ),
        xla=xla,
        range=span,
        measured=measured,
        xla_estimate=xla_estimate,
    )
    if pictures_for is not None:
        if progress:
            progress("recording timelines")
        result.trace, result.html = pictures(
            sim, what, trace_href=pictures_for or None, xla_multi_streaming=xla is not None
        )
    return result


def format_what_if(
    what: WhatIf,
    *,
    xla: SimResult | None = None,
    range_: PredictionRange | None = None,
    measured: MeasuredCosts | None = None,
    xla_estimate: XlaStep | None = None,
) -> str:
    """The what-if table as aligned text; with ``xla`` XLA's own multi-streaming,
    with ``range_`` the baseline's range, with ``measured`` how much of the step the
    profile measured, with ``xla_estimate`` XLA's own estimate beside the baseline."""
    base = what.baseline.step_time
    places: dict[str, int] = {}
    for pair in what.pairs:
        where = runs_on(pair)
        places[where] = places.get(where, 0) + 1
    lines = [
        f"module {what.module} on {what.target.name} ({what.target.description}): "
        + counted(len(what.pairs), "async pair")
        + ("; XLA runs " if places else "")
        + ", ".join(f"{n} on {where}" for where, n in places.items()),
        "predicted step time (exposed communication, speedup over K=1):",
    ]

    def grid(streams: Sequence[int], cell: Callable[[int, str], str]) -> list[str]:
        """One row per K, one column per policy."""
        rows = [["K", *what.policies]]
        rows += [[str(k), *(cell(k, p) for p in what.policies)] for k in streams]
        return aligned(rows, indent="  ")

    def step(k: int, p: str) -> str:
        r = what.results[(k, p)]
        return (
            f"{r.step_time * 1e3:.4f} ms ({r.exposed_communication * 1e3:.4f} ms, "
            f"{_ratio(base, r.step_time)})"
        )

    def busy(k: int, p: str) -> str:
        lanes = what.results[(k, p)].lane_busy
        return " ".join(f"{lanes.get(s, 0.0) * 1e3:.3f}" for s in range(k))

    def change(k: int, p: str) -> str:
        c = what.changes[(k, p)]
        return (
            f"{c.queueing * 1e3:+.4f} {c.bandwidth_sharing * 1e3:+.4f} "
            f"{c.interference * 1e3:+.4f} = {c.total * 1e3:+.4f}"
        )

    lines.extend(grid(what.streams, step))
    lines.append("busy time of collective streams 0..K-1 (ms):")
    lines.extend(grid(what.streams, busy))
    if len(what.streams) > 1:
        lines.append(
            f"change over K={what.baseline.streams} (ms): queueing + bandwidth sharing + "
            f"interference = total; interference adds {what.interference * 1e3:.4f} ms to "
            f"K={what.baseline.streams}'s step:"
        )
        lines.extend(grid(what.streams[1:], change))
    if xla is not None:
        lines.append(
            f"XLA's own multi-streaming (--{MULTI_STREAMING}: "
            f"{MULTI_STREAMING_COMMUNICATION_STREAMS} streams in turn, in post-order): "
            f"{xla.step_time * 1e3:.4f} ms ({xla.exposed_communication * 1e3:.4f} ms, "
            f"{_ratio(base, xla.step_time)})"
        )
    for bound, how in what.bounds():
        lines.append(
            f"{bound.label}: {bound.step_time * 1e3:.4f} ms "
            f"({bound.exposed_communication * 1e3:.4f} ms, {_ratio(base, bound.step_time)}): "
            f"{how}, no bandwidth sharing"
        )
    lines.append(
        f"compute only: {what.baseline.compute_time * 1e3:.4f} ms; serial (nothing overlapped): "
        f"{what.serial * 1e3:.4f} ms"
    )
    if range_ is not None:
        lines.append(
            f"range of {what.baseline.label} (every modelled input at either end of its error "
            f"bound): step {range_.low * 1e3:.4f} .. {range_.expected * 1e3:.4f} .. "
            f"{range_.high * 1e3:.4f} ms (low .. expected .. high), exposed communication "
            f"{range_.exposed_low * 1e3:.4f} .. {range_.exposed_expected * 1e3:.4f} .. "
            f"{range_.exposed_high * 1e3:.4f} ms"
        )
    if measured is not None:
        lines.append(_measured_line(what.baseline, measured))
    if xla_estimate is not None:
        lines += _xla_estimate_lines(what, xla_estimate)
    for policy in what.policies:
        a = what.assignments[(max(what.streams), policy)]
        if a.serialized_by_rule or a.serialized_by_bound:
            lines.append(
                f"K={a.streams} {policy}: {len(a.serialized_by_rule)} pairs queue behind a pair "
                f"they share devices with (deadlock rule), {len(a.serialized_by_bound)} for want "
                "of streams"
            )
    for note in list(what.notes) + what.non_monotone():
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"


def _measured_line(base: SimResult, measured: MeasuredCosts) -> str:
    names = len(measured.seconds)
    used = names - len(measured.unused())
    return (
        f"profile {measured.path}: {base.profiled_time * 1e3:.4f} ms of the step's work "
        f"measured ({base.profiled_fraction:.1%}), {base.modeled_time * 1e3:.4f} ms modelled; "
        f"{used} of its {names} instruction names are in this module"
        + (f", {measured.skipped} entries of other modules skipped" if measured.skipped else "")
    )


def _xla_estimate_lines(what: WhatIf, estimate: XlaStep) -> list[str]:
    """XLA's estimate of the module and, split alike, where the baseline differs."""
    base = what.baseline
    waits = ", ".join(
        f"{kind.replace('_', '-')} {ms:.4f} ms"
        for kind, ms in estimate.communication_wasted_ms.items()
    )
    xla = (
        f"XLA's own estimate ({estimate.path}): step {estimate.priced_step_ms:.4f} ms: kernels "
        f"{estimate.kernels_ms:.4f} ms, exposed communication "
        f"{estimate.exposed_communication_ms:.4f} ms"
    )
    if waits:
        xla += f" ({waits})"
    if estimate.placeholders:
        xla += (
            f"; {len(estimate.placeholders)} async pairs it cannot price charged 5 ms each "
            f"(placeholders, their waits left out: {estimate.step_ms:.4f} ms with them)"
        )
    step = _change(base.step_time, estimate.priced_step_ms)
    kernels = _change(base.compute_time, estimate.kernels_ms)
    exposed = _change(base.exposed_communication, estimate.exposed_communication_ms)
    lines = [
        xla,
        f"{base.label} against XLA's estimate: step {step}, kernels {kernels}, exposed "
        f"communication {exposed}",
    ]
    if estimate.module != what.module:
        lines.append(
            f"note: the schedule is of module {estimate.module}, not {what.module}: "
            "XLA's estimate is of another compile"
        )
    return lines


def _change(seconds: float, xla_ms: float) -> str:
    """Ours (``seconds``) against XLA's (``xla_ms``), as a signed share of XLA's."""
    ours = seconds * 1e3
    return f"{ours - xla_ms:+.4f} ms ({ours / xla_ms - 1:+.1%})" if xla_ms > 0 else f"{ours:.4f} ms"


def _ratio(base: float, value: float) -> str:
    return f"{base / value:.2f}x" if value > 0 else "-"
