"""Whether the NCCL kernels a stream assignment may keep in flight together fit on the GPU
(``xla_streams/simulate/residency.py``): the bound (against its definition, computed
point by point, on random schedules), the note simulate prints, the JSON field, and tune
leaving out the stream counts that do not fit.

The modules gather over the perfect matchings of 8 GPUs: any two of those groups share
one device at most, so the deadlock rule lets each all-gather take a stream of its own,
and each is a 24-CTA ring on an H100 (1 MiB over 2 GPUs: NCCL's 24 channels).
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from conftest import ADD_REDUCER, CompiledStandIn

from xla_streams.hlo import parse_module
from xla_streams.jax_compat import hlo_bindings
from xla_streams.simulate import get_target, what_if
from xla_streams.simulate.prediction import Prediction
from xla_streams.simulate.residency import resident_ctas
from xla_streams.simulate.simulation import format_what_if
from xla_streams.streams import AsyncPair, StreamAssignment, assign_streams
from xla_streams.tuning.driver import tune_lowered
from xla_streams.tuning.result import TuneResult

H100 = get_target("h100")
RING = 24  # CTAs of each all-gather below on an H100
STREAMS = (1, 2, 4, 8)


def matchings(n: int = 8) -> list[list[tuple[int, int]]]:
    """The n - 1 perfect matchings of n devices (a round-robin tournament's rounds)."""
    rounds = []
    for r in range(n - 1):
        pairs = [(r, n - 1)] + [((r + i) % (n - 1), (r - i) % (n - 1)) for i in range(1, n // 2)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs])
    return rounds


def gathers(count: int, *, sync_all_reduce: bool = False) -> str:
    """``count`` all-gathers in flight together, each over one matching; with
    ``sync_all_reduce`` a synchronous all-reduce over all 8 GPUs runs while they are."""
    starts, dones = [], []
    for i, matching in enumerate(matchings()[:count]):
        groups = ",".join(f"{{{a},{b}}}" for a, b in matching)
        starts.append(
            f"  %ag{i} = (f32[131072]{{0}}, f32[262144]{{0}}) all-gather-start(%p), "
            f"channel_id={i + 1}, replica_groups={{{groups}}}, dimensions={{0}}, "
            "use_global_device_ids=true"
        )
        dones.append(f"  %ag{i}.done = f32[262144]{{0}} all-gather-done(%ag{i})")
    middle = (
        "  %n = f32[131072]{0} all-reduce(%p), channel_id=99, replica_groups={{0,1,2,3,4,5,6,7}}, "
        "use_global_device_ids=true, to_apply=%add"
        if sync_all_reduce
        else "  %n = f32[131072]{0} negate(%p)"
    )
    return "\n".join(
        [
            "HloModule crowded, is_scheduled=true, num_partitions=8",
            "",
            ADD_REDUCER,
            "ENTRY %main (p: f32[131072]) -> f32[131072] {",
            "  %p = f32[131072]{0} parameter(0)",
            *starts,
            middle,
            *dones,
            "  ROOT %r = f32[131072]{0} negate(%n)",
            "}",
            "",
        ]
    )


def test_the_groups_share_one_device_at_most_so_each_gather_can_take_its_own_stream() -> None:
    rounds = [{frozenset(p) for p in m} for m in matchings()]
    assert all(len(m) == 4 and len(set().union(*m)) == 8 for m in rounds)
    for i, a in enumerate(rounds):
        for b in rounds[i + 1 :]:
            assert all(len(x & y) <= 1 for x in a for y in b)
    for text in (gathers(6), gathers(2, sync_all_reduce=True)):
        hlo_bindings().hlo_module_from_text(text)  # modules XLA reads
    what = what_if(parse_module(gathers(6)), H100, STREAMS, ("interval",))
    assert [spec.cost.sms for spec in what.specs] == [RING] * 6
    assert len(set(what.assignments[(8, "interval")].stream_of.values())) == 6


def test_six_rings_on_six_streams_do_not_fit_on_an_h100_and_the_output_says_so() -> None:
    what = what_if(parse_module(gathers(6)), H100, STREAMS, ("interval",))
    # One kernel per stream at a time: K streams hold min(K, 6) rings.
    assert what.resident_ctas == {(k, "interval"): min(k, 6) * RING for k in STREAMS}
    assert [k for k in STREAMS if not what.fits_on_the_gpu((k, "interval"))] == [8]
    crowded = [n for n in what.notes if "cannot all be resident" in n]
    assert crowded == [
        "K=8 interval: its NCCL kernels in flight together may need 144 CTAs, more than the "
        "132 SMs of h100 (one CTA each): they cannot all be resident at once, which the "
        "deadlock rule relies on (docs/streams.md)"
    ]
    assert "note: " + crowded[0] in format_what_if(what)
    written = Prediction.of(what)
    read = Prediction.from_json(written.to_json())
    assert [(r.streams, r.resident_ctas) for r in read.results] == [
        (k, min(k, 6) * RING) for k in STREAMS
    ]
    # Five fit (120 of 132): no note.
    five = what_if(parse_module(gathers(5)), H100, STREAMS, ("interval",))
    assert five.resident_ctas[(8, "interval")] == 5 * RING
    assert not any("cannot all be resident" in n for n in five.notes)


def test_a_stream_holds_one_kernel_at_a_time() -> None:
    """Six rings in flight on one stream need the SMs of one."""
    what = what_if(parse_module(gathers(6)), H100, (1,), ("interval",))
    one = {"K=1": assign_streams(what.pairs, 1, "interval")}
    assert resident_ctas(what.pairs, what.specs, one) == {"K=1": RING}


def test_the_compute_stream_counts_its_largest_collective() -> None:
    what = what_if(parse_module(gathers(2, sync_all_reduce=True)), H100, (1, 2), ("interval",))
    sync = what.specs[-1]
    assert sync.pair is None and sync.name == "n" and sync.cost.sms > 0
    assert what.resident_ctas == {(1, "interval"): RING + sync.cost.sms,
                                  (2, "interval"): 2 * RING + sync.cost.sms}  # fmt: skip


class _Crowded:
    """A stand-in compiler whose every candidate compiles to ``count`` gathers."""

    def __init__(self, count: int) -> None:
        self.count = count

    def compile(self, compiler_options: dict[str, object]) -> CompiledStandIn:
        return CompiledStandIn(gathers(self.count), temp=1 << 20)


def test_tune_never_picks_streams_whose_kernels_cannot_all_be_resident() -> None:
    def tuned(count: int) -> TuneResult:
        return tune_lowered(_Crowded(count), program="crowded", devices=8, levers=["overlap-limit"])

    five, six = tuned(5), tuned(6)
    # Five rings fit: K=8 gives each its own stream, and is the pick.
    assert five.pick is not None and five.pick.streams == 8
    assert not any("resident" in n for n in five.notes)
    # Six do not: no candidate is predicted with K=8, and the result says why.
    assert six.pick is not None and six.pick.streams == 4
    assert all(8 not in c.by_streams for c in six.candidates)
    left_out = [n for n in six.notes if "resident" in n]
    assert len(left_out) == 1
    assert left_out[0].startswith("K=8 interval, K=8 round-robin left out of 2 candidate(s)")
    assert "may need up to 144 CTAs, more than the 132 SMs of h100" in left_out[0]


def _brute_force(
    occurrences: list[list[tuple[int, int]]], streams: list[int], ctas: list[int]
) -> int:
    """At every start, each stream's largest kernel in flight, summed: the definition."""
    most = 0
    for t in {a for occ in occurrences for a, _ in occ}:
        largest: dict[int, int] = {}
        for occ, stream, n in zip(occurrences, streams, ctas, strict=True):
            if any(a <= t < b for a, b in occ):
                largest[stream] = max(largest.get(stream, 0), n)
        most = max(most, sum(largest.values()))
    return most


@pytest.mark.parametrize("seed", range(40))
def test_the_bound_is_the_definition_on_random_schedules(seed: int) -> None:
    rng = random.Random(seed)
    count = rng.randint(1, 12)
    occurrences = []
    for _ in range(count):
        starts = sorted(rng.sample(range(60), rng.randint(1, 3)))
        occurrences.append([(a, a + rng.randint(1, 15)) for a in starts])
    streams = [rng.randrange(3) for _ in range(count)]
    ctas = [rng.choice((1, 4, 16, 24, 32)) for _ in range(count)]
    pairs = [
        AsyncPair("main", f"s{i}", f"d{i}", "all-gather", 0, 1, occ[0][0], occ[0][1], False,
                  False, ((0, 1),), 1, occurrences=tuple(occ))
        for i, occ in enumerate(occurrences)
    ]  # fmt: skip
    specs = [SimpleNamespace(cost=SimpleNamespace(sms=n), side=False) for n in ctas]
    assignment = StreamAssignment(
        3, "interval", {p.key: s for p, s in zip(pairs, streams, strict=True)}
    )
    found = resident_ctas(pairs, specs, {"k": assignment})  # type: ignore[arg-type]
    assert found == {"k": _brute_force(occurrences, streams, ctas)}
