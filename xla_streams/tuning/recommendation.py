"""The recommendation: the search's pick (its result less the levers the model prices
as no gain) when its gain over XLA's defaults is reliable, at least ``MIN_SPEEDUP`` as
modelled and at each end of the range; else XLA's defaults, with the reasons and the
pick beside them (docs/tune.md, "The recommendation"); and the ``TuneResult`` that
says so."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Sequence

from xla_streams import xla_options as xo
from xla_streams.collectives import DEFAULT_POLICY
from xla_streams.simulate import Target
from xla_streams.tuning.evaluation import Evaluation, Key, step_without_interference
from xla_streams.tuning.levers import Lever, describe, format_bytes
from xla_streams.tuning.opinion import Candidate, placeholder_notes, second_opinion
from xla_streams.tuning.result import (
    DROP_STAGES,
    Configuration,
    TuneResult,
    command_line,
    paired_steps,
)
from xla_streams.tuning.search import SearchOutcome
from xla_streams.tuning.session import Session

# The recommendation must beat XLA's defaults by this fraction, or the defaults stay.
MIN_SPEEDUP = 0.01


def recommend(
    session: Session,
    outcome: SearchOutcome,
    *,
    levers: Sequence[Lever] = (),
    skipped: Sequence[str],
    notes: Sequence[str],
    topology: str = "",
) -> TuneResult:
    """The result of the search of ``session`` over ``levers`` that found ``outcome``:
    its pick, or XLA's defaults with the reasons and the pick beside them (see the module
    docstring), with XLA's own estimate of the pick (:mod:`~xla_streams.tuning.opinion`),
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
    notes += _crowded_notes(evaluations, session.target)
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
    recommended, decision = base_ev, "no_gain"
    reasons: list[str] = []
    pick_ev: Evaluation | None = None
    pick: Configuration | None = None
    if chosen is not None and chosen is not base_ev:
        pick_ev = _leanest(chosen, evaluations)
        if pick_ev is not chosen:
            notes.append(_left_out(chosen, pick_ev))
        pick = _without_interference(session, pick_ev, pick_ev.best_key)
        baseline = _without_interference(session, base_ev, one)
        why_not = _unreliable(pick, baseline)
        if why_not is None or (not base_ev.fits and pick_ev.step <= base_ev.step):
            recommended, decision = pick_ev, "recommended"
        else:
            decision = "no_reliable_gain"
            reasons.append(why_not)
    if recommended is base_ev:
        reasons += _why_not(session, chosen, baseline.predicted_step_ms / 1e3)
    best = baseline if recommended is base_ev else pick
    assert best is not None
    speedup = baseline.predicted_step_ms / best.predicted_step_ms if best.predicted_step_ms else 1.0
    why = f" ({reasons[0]})" if reasons else ""
    if decision == "recommended":
        verdict = f"{best.settings} with {best.streams} stream(s): {speedup:.3f}x predicted"
    elif decision == "no_reliable_gain":
        verdict = "no reliable gain: keep XLA's defaults" + why
    else:
        verdict = "nothing beats XLA's defaults: keep them" + why
    # XLA's estimate of the pick, recommended or not; of its defaults without one.
    judged = pick_ev or base_ev
    opinion = _second_opinion(session, base_ev, judged, pick or baseline, ranked, levers)
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
        decision=decision,
        pick=pick,
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
    """``found``, or the evaluation with the fewest of its options that fits and is
    predicted no slower: a lever the model prices as no gain, or as a loss, is left out
    (one that changes nothing, the compiled module the same, among them)."""
    leaner = [
        e
        for e in evaluations
        if e.fits and e.flags.items() <= found.flags.items() and e.step <= found.step
    ]
    return min(leaner, key=lambda e: (len(e.flags), e.step, e.index), default=found)


def _left_out(found: Evaluation, lean: Evaluation) -> str:
    """The note on the options of the search's result that the pick leaves out."""
    extra = describe({k: v for k, v in found.flags.items() if k not in lean.flags})
    if lean.fingerprint == found.fingerprint:
        return f"left out {extra}: the search's result compiles to the same module without it"
    return (
        f"left out {extra}: the model prices it as no gain (the search's result is "
        f"{found.step * 1e3:.3f} ms with it, {lean.step * 1e3:.3f} ms without)"
    )


def _crowded_notes(evaluations: Sequence[Evaluation], target: Target) -> list[str]:
    """The note on the stream counts ``evaluation._simulate`` left out of candidates (the
    what-if predicted them, the candidate has no result for them) because their NCCL
    kernels in flight together may need more SMs than the GPU has."""
    left_out: set[tuple[int, str]] = set()
    candidates = most = 0
    for e in evaluations:
        what = e.what
        if what is None:
            continue
        over = [key for key in what.results if (key[0], str(key[1])) not in e.results]
        if over:
            candidates += 1
            left_out.update(over)
            most = max(most, *(what.resident_ctas[key] for key in over))
    if not candidates:
        return []
    which = ", ".join(f"K={k} {policy}" for k, policy in sorted(left_out))
    return [
        f"{which} left out of {candidates} candidate(s): the NCCL kernels in flight together "
        f"may need up to {most} CTAs, more than the {target.sm_count} SMs of {target.name}, "
        "so they could not all be resident at once, which the deadlock rule relies on "
        "(docs/streams.md)"
    ]


def _without_interference(session: Session, e: Evaluation, key: Key) -> Configuration:
    """``e``'s configuration at ``key`` with its step as modelled without interference."""
    configuration = e.configuration(key)
    if e.prediction is None:
        return configuration
    quiet = step_without_interference(e.prediction, key, session.target, session.profile)
    return dataclasses.replace(configuration, step_without_interference_ms=quiet * 1e3)


def _unreliable(pick: Configuration, base: Configuration) -> str | None:
    """None when ``pick``'s gain over ``base`` is reliable, else why not: it must save at
    least ``MIN_SPEEDUP`` of their step as modelled and at each end of the range, both
    priced at that end (docs/tune.md, "The recommendation")."""
    ours = base.predicted_step_ms / pick.predicted_step_ms
    for end, mine, theirs in paired_steps(base, pick):
        if mine < theirs * (1 - MIN_SPEEDUP):
            continue
        if end == "expected":
            return (
                f"the best configuration found ({pick.settings}) is only {ours:.4f}x, below "
                f"the {MIN_SPEEDUP:.0%} margin"
            )
        return (
            f"the best configuration found ({pick.settings}) is {ours:.3f}x as modelled but "
            f"{theirs / mine:.3f}x at the {end} end of the range ({mine:.3f} ms against the "
            f"defaults' {theirs:.3f} ms), inside the {MIN_SPEEDUP:.0%} margin"
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
    assert base is not None and session.census is not None
    census = session.census
    what = base.what
    out: list[str] = []
    if census.collectives == 0:
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
            f"({census.sync_collectives} of {census.collectives} run synchronously, "
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
