"""The what-if sweep: a module simulated for every stream count and policy, with the two
bounds, each stream count's change split into queueing, bandwidth sharing and
interference, and why a larger stream count is predicted slower where it is."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from xla_streams.collectives import POLICIES, STREAM_COUNTS, Policy, StreamModel
from xla_streams.hlo import Module
from xla_streams.simulate.compiler import Progress
from xla_streams.simulate.network import CollectiveSpec
from xla_streams.simulate.residency import resident_ctas
from xla_streams.simulate.simulator import Replayed, Simulator
from xla_streams.simulate.targets import Target
from xla_streams.simulate.timeline import COMPUTE_LANE, SimResult, lane_name
from xla_streams.streams import AsyncPair, StreamAssignment, assign_each


@dataclass(frozen=True)
class Change:
    """How a K's predicted step time differs from one stream's (seconds), in three
    parts that add up: ``queueing``, the change with neither bandwidth sharing nor
    interference (collectives that no longer wait behind each other on one stream);
    ``bandwidth_sharing``, what collectives that now run at once on the same links add;
    ``interference``, what the compute beside more collectives in flight loses to them
    (``interference.py``). Each part is the difference of two replays, K's less one
    stream's, with the effects before it turned off."""

    queueing: float
    bandwidth_sharing: float
    interference: float

    @property
    def total(self) -> float:
        return self.queueing + self.bandwidth_sharing + self.interference


@dataclass
class WhatIf:
    """Predictions for every stream count and policy, and the two bounds.

    ``changes`` split each (K, policy)'s change over one stream (:class:`Change`);
    ``interference`` is what collectives in flight take from one stream's step.
    ``explanations`` say, for each (K, policy) predicted slower than the next
    smaller K under the same policy, why, naming the pairs that cause it.
    ``resident_ctas`` is, for each (K, policy), the most CTAs its NCCL kernels in
    flight together may need (``residency.py``); where that exceeds the GPU's SMs, a
    note says so.
    """

    module: str
    target: Target
    streams: tuple[int, ...]
    policies: tuple[Policy, ...]
    results: dict[tuple[int, str], SimResult]
    assignments: dict[tuple[int, str], StreamAssignment]
    lower_bound: SimResult
    rule_bound: SimResult
    serial: float
    pairs: tuple[AsyncPair, ...]
    specs: list[CollectiveSpec]
    notes: list[str]
    changes: dict[tuple[int, str], Change] = field(default_factory=dict)
    interference: float = 0.0
    explanations: dict[tuple[int, str], str] = field(default_factory=dict)
    resident_ctas: dict[tuple[int, str], int] = field(default_factory=dict)

    def fits_on_the_gpu(self, key: tuple[int, str]) -> bool:
        """The NCCL kernels (K, policy) may keep in flight together can all be resident."""
        return self.resident_ctas[key] <= self.target.sm_count

    def result(self, streams: int, policy: str) -> SimResult:
        return self.results[(streams, policy)]

    @property
    def baseline(self) -> SimResult:
        """One collective stream: what XLA does today."""
        return self.results[(min(self.streams), self.policies[0])]

    def non_monotone(self) -> list[str]:
        """Why a larger K is predicted slower than a smaller one, where it is."""
        return list(self.explanations.values())

    def bounds(self) -> list[tuple[SimResult, str]]:
        """The two bounds, each with what it assumes."""
        return [
            (self.rule_bound, "each group of pairs the deadlock rule ties on a stream of its own"),
            (self.lower_bound, "every collective on a stream of its own"),
        ]


def what_if(
    module: Module,
    target: Target,
    streams: Iterable[int] = STREAM_COUNTS,
    policies: Iterable[Policy] = POLICIES,
    *,
    pairs: Sequence[AsyncPair] | None = None,
    model: StreamModel | None = None,
    progress: Progress | None = None,
    simulator: Simulator | None = None,
) -> WhatIf:
    """Simulate ``module`` for every K in ``streams`` under every policy."""
    streams = tuple(sorted(set(streams)))
    policies = tuple(policies)
    say = progress or (lambda _message: None)
    if simulator is None:
        say(f"cost model: {module.name}")
        simulator = Simulator(module, target, pairs, model=model, progress=progress)
    results: dict[tuple[int, str], SimResult] = {}
    assignments: dict[tuple[int, str], StreamAssignment] = {
        key: assignment
        for key, assignment in assign_each(simulator.pairs, streams, policies).items()
    }
    for (k, policy), assignment in assignments.items():
        say(f"simulating K={k} {policy}")
        results[(k, policy)] = simulator.run(assignment)
    say("splitting each K's change into queueing, bandwidth sharing and interference")
    ends = {key: _ends(simulator, a, results[key]) for key, a in assignments.items()}
    full, calm, free = ends[(streams[0], policies[0])]
    changes = {
        key: Change(f - free, (c - calm) - (f - free), (r - full) - (c - calm))
        for key, (r, c, f) in ends.items()
    }
    say("simulating the bounds")
    lower = simulator.bound(respect_rule=False)
    rule = simulator.bound(respect_rule=True)
    explanations = _explain_non_monotone(simulator, streams, policies, results, assignments, ends)
    what = WhatIf(
        module=module.name,
        target=target,
        streams=streams,
        policies=policies,
        results=results,
        assignments=assignments,
        lower_bound=lower,
        rule_bound=rule,
        serial=simulator.serial_time(),
        pairs=simulator.pairs,
        specs=simulator.specs,
        notes=list(simulator.notes),
        changes=changes,
        interference=full - calm,
        explanations=explanations,
        resident_ctas=resident_ctas(module, simulator.pairs, simulator.specs, assignments),
    )
    what.notes += [
        f"K={k} {policy}: its NCCL kernels in flight together may need {n} CTAs, more than "
        f"the {target.sm_count} SMs of {target.name} (one CTA each): they cannot all be "
        "resident at once, which the deadlock rule relies on (docs/streams.md)"
        for (k, policy), n in what.resident_ctas.items()
        if not what.fits_on_the_gpu((k, policy))
    ]
    return what


def _ends(
    simulator: Simulator, assignment: StreamAssignment, result: SimResult
) -> tuple[float, float, float]:
    """The step time of ``assignment`` as modelled, without interference, and without
    interference or bandwidth sharing."""
    calm = simulator.run(assignment, interference=False)
    free = simulator.run(assignment, interference=False, share_bandwidth=False)
    return result.step_time, calm.step_time, free.step_time


# Relative slack before a larger K counts as slower than a smaller one.
MONOTONE_TOLERANCE = 1e-9
# How many of the collectives waited for longer an explanation names, and how many
# collectives it names as sharing links with, or running ahead of, each.
MAX_VICTIMS = 3
MAX_CULPRITS = 5


def _explain_non_monotone(
    simulator: Simulator,
    streams: tuple[int, ...],
    policies: tuple[Policy, ...],
    results: dict[tuple[int, str], SimResult],
    assignments: dict[tuple[int, str], StreamAssignment],
    ends: dict[tuple[int, str], tuple[float, float, float]],
) -> dict[tuple[int, str], str]:
    """For each K predicted slower than the K before it: the three replays of each
    assignment that split its change (``ends``, :func:`_ends`) tell the three possible
    causes apart, and what those replays kept of their collectives names the pairs."""
    out: dict[tuple[int, str], str] = {}
    for policy in policies:
        for smaller, k in pairwise(streams):
            slow, fast = results[(k, policy)], results[(smaller, policy)]
            if slow.step_time <= fast.step_time * (1 + MONOTONE_TOLERANCE):
                continue
            slow_assignment, fast_assignment = (
                assignments[(k, policy)],
                assignments[(smaller, policy)],
            )
            # The replays that split the change: as modelled, without interference, and
            # without sharing or interference.
            slow_full, slow_calm, unshared_slow = ends[(k, policy)]
            fast_full, fast_calm, unshared_fast = ends[(smaller, policy)]
            head = (
                f"{policy}: K={k} ({slow.step_time * 1e3:.4f} ms) is predicted slower than "
                f"K={smaller} ({fast.step_time * 1e3:.4f} ms): "
            )
            worse = (slow_full - slow_calm) - (fast_full - fast_calm)
            others = (slow.step_time - fast.step_time) - worse
            if worse > others:
                cause = (
                    "compute beside the collectives that now run at the same time loses more "
                    "SMs and HBM bandwidth to their NCCL kernels (interference "
                    f"{worse * 1e3:+.4f} ms against K={smaller}, the rest {others * 1e3:+.4f} ms)"
                )
            elif unshared_slow <= unshared_fast * (1 + MONOTONE_TOLERANCE):
                cause = (
                    "collectives that now run at the same time share link bandwidth, so "
                    "the one the compute stream waits for first finishes later than it would "
                    f"have queued alone (without sharing or interference K={k} would take "
                    f"{unshared_slow * 1e3:.4f} ms, K={smaller} {unshared_fast * 1e3:.4f} ms)"
                )
            else:
                cause = (
                    f"the {policy} assignment for K={k} queues collectives behind "
                    f"different ones than for K={smaller}, and a collective the compute stream "
                    "needs early now waits behind a later one"
                )
            named = _named_causes(simulator, slow_assignment, fast_assignment)
            out[(k, policy)] = head + cause + "".join(f". {n}" for n in named)
    return out


def _named_causes(sim: Simulator, slow: StreamAssignment, fast: StreamAssignment) -> list[str]:
    """One sentence for each collective the compute stream waits for longer under
    ``slow`` than under ``fast`` (longest first): which collectives share its links
    while it runs, and which run ahead of it on its stream, under ``slow``."""
    slow_run = sim.replayed(slow)
    fast_waits = _waits(sim.replayed(fast))
    extra = {name: w - fast_waits.get(name, 0.0) for name, w in _waits(slow_run).items()}
    tolerance = MONOTONE_TOLERANCE * max(slow_run.step_time, 1e-12)
    victims = sorted((n for n, e in extra.items() if e > tolerance), key=lambda n: -extra[n])
    jobs = [job for job in slow_run.finished if not job.spec.side]
    links = {spec.name: set(spec.cost.resources) for spec in sim.specs}
    sentences = []
    for name in victims[:MAX_VICTIMS]:
        sharing: dict[str, int] = {}  # collective -> its lane
        ahead: dict[str, int] = {}
        occurrences = [job for job in jobs if job.spec.name == name]
        for v in occurrences:
            assert v.end is not None  # finished
            ready = v.ready - 1e-9  # when it was issued
            for o in jobs:
                assert o.end is not None
                other = o.spec.name
                if other == name:
                    continue
                if o.lane == v.lane and o.begin < v.begin and o.end > ready:
                    ahead[other] = o.lane
                elif o.begin < v.end and v.begin < o.end and links[name] & links[other]:
                    sharing[other] = o.lane
        first = occurrences[0] if occurrences else None
        where = f"{first.spec.kind}, {lane_name(first.lane)}" if first else "collective"
        sentence = f"%{name} ({where}) is waited for {extra[name] * 1e6:.1f} us longer"
        if sharing:
            sentence += f"; it shares link bandwidth with {_names(sharing)}"
        if ahead:
            stream = lane_name(next(iter(ahead.values())))
            sentence += f"; it queues on {stream} behind {_names(ahead)}"
        sentences.append(sentence)
    return sentences


def _waits(replayed: Replayed) -> dict[str, float]:
    """Per collective, how long the compute stream waited for it (a collective on the
    compute lane: its whole time)."""
    waits: dict[str, float] = {}
    for job in replayed.finished:
        if job.lane == COMPUTE_LANE and not job.spec.side:
            assert job.end is not None
            waits[job.spec.name] = waits.get(job.spec.name, 0.0) + job.end - job.begin
    for job, waited in replayed.waits:
        waits[job.spec.name] = waits.get(job.spec.name, 0.0) + waited
    return waits


def _names(lanes: dict[str, int]) -> str:
    """``%a (collective stream 1), %b (compute)``, at most MAX_CULPRITS, then a count."""
    items = [f"%{n} ({lane_name(lane)})" for n, lane in sorted(lanes.items())]
    more = len(items) - MAX_CULPRITS
    return ", ".join(items[:MAX_CULPRITS]) + (f" and {more} more" if more > 0 else "")
