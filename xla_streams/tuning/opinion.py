"""A second opinion on every pick: XLA's own estimate of the same compiled module beside
the simulator's, and one line on the pick.

Every candidate is compiled with XLA's latency-hiding schedule dumped
(:func:`~xla_streams.tuning.compiling.schedule_dump`): the estimate of the cost model
XLA schedules with (in jax 0.12 its speed-of-light estimator), read by
:mod:`xla_streams.simulate.xla_estimate`. The figure compared is XLA's step without
its placeholders (the async pairs it cannot price and charges a flat 5 ms: async
fusions, collectives whose communication it cannot tell), which are named instead.

:func:`second_opinion` says, in one line, whether XLA's estimate favours the pick
(recommended or not): it agrees when XLA's speedup lies within the range of ours
(the simulator's pairwise ends, :func:`speedup_range`). Otherwise the line names the
lever responsible (the one whose return to XLA's default XLA estimates fastest, or,
where XLA favours the pick more than ours, slowest: the neighbour check compiled
each) and where the two models' inputs differ: the part of
the step (kernels or exposed communication) whose change they see most differently,
and the collective XLA charges most, with its size, the hosts it spans and what each
model charges it (XLA's charge bounded by the shortest time any compile's schedule
gives that collective). Which is right is decided from what is published:

- XLA prices a collective across hosts with a ring over ``nic_speed_gbps``, 25 GB/s
  on H100 unless told (55.56 x 0.45, ``sol_gpu_cost_model.cc``), plus a round trip
  at every ring step; nccl-tests measure 46-48 GB/s per 400 Gb/s NIC (the
  simulator's figure, ``simulate/targets.py``): there the simulator is right, unless
  the cluster's NIC is slower (tell the target);
- XLA charges a kernel it has no model for (a cuDNN or other custom call) 10 us; the
  simulator prices GEMMs from XLA's measured matmul table and other kernels by their
  roofline, and on the published runs of ``docs/predictions.md`` it is the nearer of
  the two (7.8% off at the median where XLA's estimate is 30% fast): on kernels the
  simulator is the better guide;
- both price collectives inside one host from XLA's measured table, so a difference
  there is in the overlap each expects, which only a run on GPUs settles: the line
  says so rather than pick one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from xla_streams.hlo import Module
from xla_streams.simulate import CostModel, Target
from xla_streams.streams import AsyncPair
from xla_streams.tuning.levers import Lever, format_bytes
from xla_streams.tuning.result import Configuration, paired_steps, xla_speedup

# XLA's flat price of an async pair it cannot price (kHighLatency, latency_hiding_scheduler.h).
PLACEHOLDER_MS = 5.0


@dataclass(frozen=True)
class Candidate:
    """A compiled candidate as the second opinion reads it: its configuration (with
    XLA's estimate) and the module and async pairs the simulator read."""

    configuration: Configuration
    module: Module
    pairs: tuple[AsyncPair, ...]
    xla_missing: str = ""  # why there is no XLA estimate (configuration.xla is None)


def speedup_range(base: Configuration, best: Configuration) -> tuple[float, float]:
    """The range of the simulator's speedup of ``best`` over ``base``: at the optimistic
    and at the pessimistic ends of both ranges (the errors are the hardware's and move
    both alike), and as modelled."""
    found = [theirs / mine for _, mine, theirs in paired_steps(base, best)]
    return min(found), max(found)


def second_opinion(
    base: Candidate,
    best: Candidate,
    candidates: Sequence[Candidate],
    levers: Sequence[Lever],
    target: Target,
    devices_per_host: int,
) -> str:
    """One line: what XLA's own estimate says of the pick ``best`` against
    XLA's defaults ``base`` (see the module docstring); ``candidates`` are every
    configuration compiled, ``levers`` those searched."""
    b, c = base.configuration, best.configuration
    found = xla_speedup(b, c)
    if found is None:
        which, missing = ("XLA's defaults", base) if b.xla is None else ("it", best)
        return f"none for {which}: {missing.xla_missing or 'XLA wrote no schedule'}"
    assert b.xla is not None and c.xla is not None
    unpriced = sorted(set(b.xla.unpriced) | set(c.xla.unpriced))
    if unpriced:
        return (
            f"no opinion: XLA could not price {len(unpriced)} of the collectives "
            f"({_names(unpriced)}) and charged each a flat {PLACEHOLDER_MS:.0f} ms"
        )
    figures = f"{c.xla.priced_step_ms:.3f} ms against the defaults' {b.xla.priced_step_ms:.3f} ms"
    if c.xla_flags == b.xla_flags and c.streams == b.streams:
        return (
            f"XLA's defaults at {b.xla.priced_step_ms:.3f} ms (ours {b.predicted_step_ms:.3f} ms)"
        )
    low, high = speedup_range(b, c)
    ours = b.predicted_step_ms / c.predicted_step_ms
    if found > 1.0 and low <= found <= high:
        return (
            f"agrees: {found:.3f}x by XLA ({figures}), within ours {ours:.3f}x "
            f"({low:.3f}-{high:.3f}x)"
        )
    if found <= 1.0:
        head = f"does not favour it: {found:.3f}x by XLA ({figures}) where ours is {ours:.3f}x"
    else:
        head = (
            f"favours it by {found:.3f}x ({figures}), outside ours {ours:.3f}x "
            f"({low:.3f}-{high:.3f}x)"
        )
    configurations = [other.configuration for other in candidates]
    lever = _lever(c, configurations, levers, more=found > high)
    return "; ".join([head, lever, _inputs(base, best, candidates, target, devices_per_host)])


def _lever(
    best: Configuration,
    candidates: Sequence[Configuration],
    levers: Sequence[Lever],
    *,
    more: bool,
) -> str:
    """The lever of ``best`` XLA's estimate disagrees on: the one whose return to XLA's
    default XLA estimates fastest when it favours ``best`` less than ours, slowest (the
    one it credits most) when it favours it ``more``."""
    # Every configuration's options are canonical (XLA's defaults left out): compare them.
    by_flags = {_key(c.xla_flags): c for c in candidates if c.xla is not None}
    reverted = []
    for lever in levers:
        if not lever.options & set(best.xla_flags):
            continue
        flags = {k: v for k, v in best.xla_flags.items() if k not in lever.options}
        other = by_flags.get(_key(flags))
        if other is not None and other.xla is not None:
            reverted.append((other.xla.priced_step_ms, lever.name))
    if not reverted:
        return (
            "the lever responsible is unknown: no candidate with one of its levers at "
            "XLA's default was compiled"
        )
    assert best.xla is not None
    if more:
        step, name = max(reverted)
        return f"the lever XLA credits most: {name} (at XLA's default, XLA estimates {step:.3f} ms)"
    step, name = min(reverted)
    if step < best.xla.priced_step_ms:
        return f"the lever: {name} (at XLA's default, XLA estimates {step:.3f} ms)"
    return (
        "no one lever: XLA estimates the pick slower still with any one of its "
        "levers back at XLA's default"
    )


def _key(flags: Mapping[str, object]) -> tuple[tuple[str, object], ...]:
    return tuple(sorted(flags.items()))


def _inputs(
    base: Candidate,
    best: Candidate,
    candidates: Sequence[Candidate],
    target: Target,
    devices_per_host: int,
) -> str:
    """Where the two models part: the part of the step whose change from XLA's defaults
    they see most differently, and for communication the collective XLA charges most."""
    b, c = base.configuration, best.configuration
    assert b.xla is not None and c.xla is not None

    def parts(x: Configuration) -> tuple[float, float, float, float]:
        assert x.xla is not None
        exposed = x.exposed_communication_ms or 0.0
        return (
            x.predicted_step_ms - exposed,
            exposed,
            x.xla.priced_step_ms - x.xla.exposed_communication_ms,
            x.xla.exposed_communication_ms,
        )

    ours_k, ours_x, xla_k, xla_x = (
        after - before for after, before in zip(parts(c), parts(b), strict=True)
    )
    kernels = abs(xla_k - ours_k) >= abs(xla_x - ours_x)
    part = "kernels" if kernels else "exposed communication"
    ours_d, xla_d = (ours_k, xla_k) if kernels else (ours_x, xla_x)
    words = f"the models part on {part}: ours {ours_d:+.3f} ms, XLA's {xla_d:+.3f} ms"
    if kernels:
        return words + (
            " (XLA charges a kernel it cannot model a flat 10 us, and on published runs ours is "
            "the nearer: trust ours on kernels)"
        )
    return words + _costliest(best, candidates, target, devices_per_host)


def _costliest(
    best: Candidate, candidates: Sequence[Candidate], target: Target, devices_per_host: int
) -> str:
    """The collective of ``best`` XLA charges most, and what each model charges it.
    XLA's charge is at most the time a schedule gives the collective, from its start to
    its done: the bound stated is the shortest any compile gives the same collective
    (its start's name, kind, size and groups)."""
    xla = best.configuration.xla
    assert xla is not None
    mine = {p.start: p for p in best.pairs}
    runs = {start: n for start, _, n in xla.spans if start in mine}
    if not runs:
        return ""
    bound: dict[str, float] = {}
    for other in (best, *candidates):
        theirs = {p.start: p for p in other.pairs}
        for start, span_us, _ in other.configuration.xla.spans if other.configuration.xla else ():
            pair, same = mine.get(start), theirs.get(start)
            if pair is not None and same is not None and _same(pair, same):
                bound[start] = min(bound.get(start, span_us), span_us)
    start = max(runs, key=lambda s: (bound[s] * runs[s], s))
    pair = mine[start]
    ours_ms = CostModel(best.module, target).collective(pair).seconds * 1e3
    hosts = max((len({d // devices_per_host for d in g}) for g in pair.groups), default=1)
    where = f"across {hosts} hosts" if hosts > 1 else "inside one host"
    verdict = (
        "XLA prices collectives across hosts at 25 GB/s per NIC on H100 unless told, plus a "
        "round trip per ring step; nccl-tests measure 46-48 GB/s per 400 Gb/s NIC, ours' "
        "figure: trust ours"
        if hosts > 1
        else "both price it from XLA's measured table: the difference is the overlap each "
        "expects, which only a GPU run settles"
    )
    return (
        f"; the collective XLA charges most, {start} ({pair.kind}, "
        f"{format_bytes(pair.bytes)} {where}): XLA at most {bound[start] / 1e3:.3f} ms (the "
        f"shortest time its schedules give it), ours {ours_ms:.3f} ms ({verdict})"
    )


def _same(a: AsyncPair, b: AsyncPair) -> bool:
    return (a.kind, a.bytes, a.groups) == (b.kind, b.bytes, b.groups)


def placeholder_notes(candidates: Sequence[Configuration]) -> list[str]:
    """The notes naming XLA's placeholders in the candidates' estimates."""
    left_out = sorted({n for c in candidates if c.xla is not None for n in c.xla.placeholders})
    unpriced = sorted({n for c in candidates if c.xla is not None for n in c.xla.unpriced})
    out = []
    if left_out:
        out.append(
            f"XLA's estimate (XLA ms) leaves out the waits on {len(left_out)} async "
            f"computation(s) it cannot price and charges a flat {PLACEHOLDER_MS:.0f} ms: "
            f"{_names(left_out)}"
        )
    if unpriced:
        out.append(
            f"XLA could not price {len(unpriced)} collective(s) and charged each a flat "
            f"{PLACEHOLDER_MS:.0f} ms, kept in XLA ms: {_names(unpriced)}"
        )
    return out


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:4])
    return shown + (f" and {len(names) - 4} more" if len(names) > 4 else "")
