"""Whether the NCCL kernels an assignment may keep in flight together fit on the GPU
at once: the co-residency the deadlock rule relies on (``streams/rule.py``).

The rule lets collectives whose groups share one device run on different streams,
as XLA's does. Under the strictest reading of NCCL (no forward progress between
communicators: NVIDIA/nccl#574, #195) no order of the work can deadlock while the
kernel of every stream can be resident beside the others (the emulator's
``residency`` at the streams in use, docs/runtimes.md). With fewer, a kernel waiting
for its peers keeps its SMs while another waits for them, and a cycle can form, not
must: the emulator closes one on ``tp_dp_2d`` when it keeps one waiting kernel per
device. NCCL's own developers name the hazard: several ranks on one GPU are "not
recommended due to the possibility of creating deadlocks in cases where all kernels
do not get scheduled simultaneously on the GPU" (nluehr in NVIDIA/nccl#103). Compute
kernels do not matter here: they wait for no other device, so they end and give
their SMs back. So this is the premise checked, the safe side of it: an assignment
over the GPU's SMs may still never hang, but nothing then guarantees it.

An NCCL CTA takes a whole SM (``nccl.py``): its threads use many registers, capped at
96 so that 640 of them fit in an SM's 65,536 (``makefiles/common.mk`` 103; sjeaugey
in NVIDIA/nccl#181: "maxrregcount=96 ... is needed to make sure we can launch up to
640 threads while having enough registers"; NVIDIA/nccl#689: "NCCL CTAs won't share
an SM"). So the kernels in flight together fit while their CTAs add up to at most
the GPU's SMs.

:func:`resident_ctas` bounds what they add up to over one execution from the
schedule alone, so that no timing (the model's or a real GPU's) exceeds it: a pair's
kernel runs, on any GPU, between the compute stream reaching its start and passing
its done, and a blocking collective while the compute stream is at it. So at every
point of the schedule each stream counts the largest kernel in flight there (a stream
runs its kernels one after another): the collective streams and XLA's P2P stream
their pairs', the compute stream its blocking collective there or a pair XLA runs on
it; a send or recv fired for a later iteration (its done elsewhere) and a collective
of a computation another thread runs (at some time in its async call) count at every
point. H100
holds five of its 24-CTA rings (120 of 132 SMs): six ring all-gathers in flight on
six streams (K = 8 with an overlap limit of 6 or more) do not fit.

:func:`fit_on_gpu` keeps an assignment to that bound where the streams are made (the
``fit-on-gpu`` pass, which the plugin runs on a GPU it knows): a K whose kernels may
not fit gives way to the largest K below it that does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping, Sequence

from xla_streams.hlo import Instruction, Module
from xla_streams.simulate.compiler import CompiledModule
from xla_streams.simulate.cost import CostModel, OpCost
from xla_streams.simulate.network import CollectiveSpec
from xla_streams.simulate.targets import Target
from xla_streams.streams import AsyncPair, StreamAssignment, assign_each
from xla_streams.streams.pairs import instruction_times


def resident_ctas[Key: Hashable](
    module: Module,
    pairs: Sequence[AsyncPair],
    specs: Sequence[CollectiveSpec],
    assignments: Mapping[Key, StreamAssignment],
) -> dict[Key, int]:
    """The most CTAs the NCCL kernels of each assignment may hold at once, as the module
    docstring says. ``specs`` are the simulator's for ``module``: the first
    ``len(pairs)`` are the pairs' own, in their order; the rest the blocking collectives
    (``at`` places them in ``module``'s schedule) and side kernels."""
    kernels, anywhere = _blocking(module, pairs, specs)
    ctas = [spec.cost.sms for spec in specs[: len(pairs)]] + [n for n, _ in kernels]
    # (time, -1 done / +1 start, kernel): a done first at a tie, as occurrences are
    # half-open (AsyncPair.overlaps).
    runs = [p.occurrences for p in pairs] + [spans for _, spans in kernels]
    events = sorted(
        (time, delta, i)
        for i, spans in enumerate(runs)
        for start, done in spans
        for time, delta in ((start, 1), (done, -1))
    )
    on_compute = ("compute",) * len(kernels)
    peaks: dict[tuple[Hashable, ...], int] = {}  # by where each kernel runs
    found = {}
    for key, assignment in assignments.items():
        streams = (*(_stream(p, assignment) for p in pairs), *on_compute)
        if streams not in peaks:
            peaks[streams] = _peak(events, streams, ctas)
        found[key] = peaks[streams] + anywhere
    return found


def _stream(pair: AsyncPair, assignment: StreamAssignment) -> Hashable:
    """Where ``pair``'s kernel runs: its collective stream, XLA's P2P stream, or the
    compute stream."""
    if pair.lane == "communication":
        return assignment.stream_of.get(pair.key)
    return pair.lane


def _blocking(
    module: Module, pairs: Sequence[AsyncPair], specs: Sequence[CollectiveSpec]
) -> tuple[list[tuple[int, list[tuple[int, int]]]], int]:
    """The blocking collectives the compute stream runs at their places in the schedule,
    each as (CTAs, when: its tick at every call of its computation), and the most
    CTAs of those that may run beside anything: a send or recv fired for a later
    iteration (its done elsewhere), or a collective that a thread an async call starts
    runs at some time in that call's window."""
    blocking = [s for s in specs[len(pairs) :] if not s.side]
    placed = [(s.cost.sms, s.at) for s in blocking if s.at is not None]
    anywhere = [s.cost.sms for s in blocking if s.at is None]
    wanted: dict[str, list[int]] = {}
    for _, (computation, position) in placed:
        wanted.setdefault(computation, []).append(position)
    times = instruction_times(module, wanted) if wanted else {}
    kernels: list[tuple[int, list[tuple[int, int]]]] = []
    for sms, at in placed:
        ticks, windows = times[at]
        kernels.append((sms, [(t, t + 1) for t in ticks]))
        if windows:
            anywhere.append(sms)
    return kernels, max(anywhere, default=0)


def _peak(
    events: list[tuple[int, int, int]], streams: Sequence[Hashable], ctas: Sequence[int]
) -> int:
    """The most CTAs in flight at once, each stream counted at its largest kernel."""
    in_flight: dict[Hashable, dict[int, int]] = {}  # stream -> CTAs -> kernels
    largest: dict[Hashable, int] = {}
    total = most = 0
    for _, delta, i in events:
        stream, n = streams[i], ctas[i]
        counts = in_flight.setdefault(stream, {})
        before = largest.get(stream, 0)
        if delta > 0:
            counts[n] = counts.get(n, 0) + 1
            if n > before:
                largest[stream] = n
                total += n - before
                most = max(most, total)
        elif counts[n] > 1:
            counts[n] -= 1
        else:
            del counts[n]
            if n == before:  # its largest kernel ended: the next largest counts now
                largest[stream] = max(counts, default=0)
                total += largest[stream] - before
    return most


class _CollectivesOnly(CostModel):
    """Prices the collectives alone: all the bound reads, at a tenth of the time of a
    compile that prices every kernel (the plugin runs it at every compile on a GPU)."""

    def instruction(self, inst: Instruction) -> OpCost:
        return _UNPRICED


_UNPRICED = OpCost(0.0, "free")


def fit_on_gpu(
    module: Module, pairs: Sequence[AsyncPair], assignment: StreamAssignment, target: Target
) -> StreamAssignment:
    """``assignment`` where its NCCL kernels fit on ``target`` at once (:func:`resident_ctas`
    at most its SMs); else the assignment of the largest K below it that fits, under the
    same policy, its ``lowered`` saying why (K = 1 where none does: one stream is what
    XLA runs without us, so a K = 1 assignment is kept as it is)."""
    specs = CompiledModule(module, target, pairs, cost=_CollectivesOnly(module, target)).specs
    (need,) = resident_ctas(module, pairs, specs, {"asked": assignment}).values()
    if need <= target.sm_count or assignment.streams == 1:
        return assignment
    fewer = assign_each(pairs, range(assignment.streams - 1, 0, -1), (assignment.policy,))
    ctas = resident_ctas(module, pairs, specs, fewer)
    k = next((k for (k, _), n in ctas.items() if n <= target.sm_count), 1)
    why = (
        f"K={assignment.streams} lowered to K={k}: the NCCL kernels in flight together may "
        f"need {need} CTAs, more than the {target.sm_count} SMs of {target.name}, and they "
        "must all be resident at once for no order of the work to deadlock"
    )
    if ctas[(k, assignment.policy)] > target.sm_count:
        why += f" (even K=1 may need {ctas[(k, assignment.policy)]})"
    else:
        why += f" (K={k} needs at most {ctas[(k, assignment.policy)]})"
    return dataclasses.replace(fewer[(k, assignment.policy)], lowered=why)
