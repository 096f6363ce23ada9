"""Whether the NCCL kernels a stream assignment may keep in flight together fit on the GPU
(``xla_streams/simulate/residency.py``): the bound (against its definition, computed
point by point, on random schedules; the compute stream's collectives where it runs
them), the note simulate prints, the JSON field, tune leaving out the stream counts that
do not fit, and where the streams are made: ``fit-on-gpu`` lowering K, and the plugin
running it on the GPUs JAX lists.

The modules gather over the perfect matchings of 8 GPUs: any two of those groups share
one device at most, so the deadlock rule lets each all-gather take a stream of its own,
and each is a 24-CTA ring on an H100 (1 MiB over 2 GPUs: NCCL's 24 channels).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import re
from types import SimpleNamespace

import pytest
from conftest import ADD_REDUCER, CompiledStandIn

from xla_streams import jax_compat
from xla_streams.collectives import StreamModel
from xla_streams.hlo import parse_module
from xla_streams.jax_compat import hlo_bindings
from xla_streams.passes.base import Compilation, PipelineError
from xla_streams.pipeline import PassManager, parse_pipeline
from xla_streams.plugin import hook, xla_module
from xla_streams.plugin.settings import Config
from xla_streams.report import AssignmentReport, build_report, format_report, summary_line
from xla_streams.simulate import get_target, what_if
from xla_streams.simulate.prediction import Prediction
from xla_streams.simulate.residency import fit_on_gpu, resident_ctas
from xla_streams.simulate.simulation import format_what_if
from xla_streams.simulate.targets import target_of_device
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


LOOP = """\
%body (t: (s32[], f32[131072])) -> (s32[], f32[131072]) {
  %t = (s32[], f32[131072]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[131072]{0} get-tuple-element(%t), index=1
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %y = f32[131072]{0} all-reduce(%x), channel_id=99, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  ROOT %out = (s32[], f32[131072]{0}) tuple(%next, %y)
}

%cond (c: (s32[], f32[131072])) -> pred[] {
  %c = (s32[], f32[131072]{0}) parameter(0)
  %j = s32[] get-tuple-element(%c), index=0
  %four = s32[] constant(4)
  ROOT %lt = pred[] compare(%j, %four), direction=LT
}
"""
ALL_REDUCE = {
    "": ["  %n = f32[131072]{0} negate(%p)"],
    # A synchronous all-reduce over all 8 GPUs...
    "all-reduce": [
        "  %n = f32[131072]{0} all-reduce(%p), channel_id=99, "
        "replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add"
    ],
    # ... or the same in the body of a loop run 4 times.
    "loop": [
        "  %zero = s32[] constant(0)",
        "  %init = (s32[], f32[131072]{0}) tuple(%zero, %p)",
        "  %w = (s32[], f32[131072]{0}) while(%init), condition=%cond, body=%body, "
        'backend_config={"known_trip_count":{"n":"4"}}',
        "  %n = f32[131072]{0} get-tuple-element(%w), index=1",
    ],
}


def gathers(count: int, *, all_reduce: str = "", after: bool = False) -> str:
    """``count`` all-gathers in flight together, each over one matching; with
    ``all_reduce`` (a key of ALL_REDUCE) a synchronous all-reduce runs while they are,
    or ``after`` they are done."""
    starts, dones = [], []
    for i, matching in enumerate(matchings()[:count]):
        groups = ",".join(f"{{{a},{b}}}" for a, b in matching)
        starts.append(
            f"  %ag{i} = (f32[131072]{{0}}, f32[262144]{{0}}) all-gather-start(%p), "
            f"channel_id={i + 1}, replica_groups={{{groups}}}, dimensions={{0}}, "
            "use_global_device_ids=true"
        )
        dones.append(f"  %ag{i}.done = f32[262144]{{0}} all-gather-done(%ag{i})")
    middle = ALL_REDUCE[all_reduce]
    return "\n".join(
        [
            "HloModule crowded, is_scheduled=true, num_partitions=8",
            "",
            ADD_REDUCER,
            LOOP if all_reduce == "loop" else "",
            "ENTRY %main (p: f32[131072]) -> f32[131072] {",
            "  %p = f32[131072]{0} parameter(0)",
            *starts,
            "  %busy = f32[131072]{0} exponential(%p)",  # so that no pair is a sync pair
            *([] if after else middle),
            *dones,
            *(middle if after else []),
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
    for all_reduce in ALL_REDUCE:
        for after in (False, True):
            hlo_bindings().hlo_module_from_text(gathers(6, all_reduce=all_reduce, after=after))
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
    module = parse_module(gathers(6))
    assert resident_ctas(module, what.pairs, what.specs, one) == {"K=1": RING}


@pytest.mark.parametrize("all_reduce", ["all-reduce", "loop"])
def test_the_compute_stream_counts_its_collective_where_it_runs(all_reduce: str) -> None:
    """A synchronous all-reduce (in the entry, or in a loop's body) counts beside the
    rings in flight where it runs, not where none is."""

    def ctas(after: bool) -> tuple[list[int], int]:
        text = gathers(2, all_reduce=all_reduce, after=after)
        what = what_if(parse_module(text), H100, (1, 2), ("interval",))
        sync = what.specs[-1]
        assert sync.pair is None and sync.at is not None and 0 < sync.cost.sms < RING
        return [what.resident_ctas[(k, "interval")] for k in (1, 2)], sync.cost.sms

    during, sync = ctas(after=False)
    assert during == [RING + sync, 2 * RING + sync]
    assert ctas(after=True) == ([RING, 2 * RING], sync)


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
    occurrences: list[list[tuple[int, int]]], streams: list[int | str], ctas: list[int]
) -> int:
    """At every start, each stream's largest kernel in flight, summed: the definition."""
    most = 0
    for t in {a for occ in occurrences for a, _ in occ}:
        largest: dict[int | str, int] = {}
        for occ, stream, n in zip(occurrences, streams, ctas, strict=True):
            if any(a <= t < b for a, b in occ):
                largest[stream] = max(largest.get(stream, 0), n)
        most = max(most, sum(largest.values()))
    return most


# A send pipelined through a loop (its done in the next iteration: a link of the chain
# from %s0 to %final.done), then an all-gather after the loop.
FIRED = (
    "HloModule fired, is_scheduled=true, num_partitions=8\n\n"
    + ADD_REDUCER
    + """
%body (t: (s32[], f32[131072], (f32[131072], u32[], token[]))) -> (s32[], f32[131072], (f32[131072], u32[], token[])) {
  %t = (s32[], f32[131072]{0}, (f32[131072]{0}, u32[], token[])) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[131072]{0} get-tuple-element(%t), index=1
  %last = (f32[131072]{0}, u32[], token[]) get-tuple-element(%t), index=2
  %last.done = token[] send-done(%last), channel_id=1, frontend_attributes={_xla_send_recv_pipeline="0"}
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %y = f32[131072]{0} exponential(%x)
  %tok = token[] after-all()
  %s = (f32[131072]{0}, u32[], token[]) send(%y, %tok), channel_id=1, frontend_attributes={_xla_send_recv_pipeline="0",_xla_send_recv_source_target_pairs={{0,1},{1,2},{2,3},{3,4},{4,5},{5,6},{6,7}}}
  ROOT %out = (s32[], f32[131072]{0}, (f32[131072]{0}, u32[], token[])) tuple(%next, %y, %s)
}

%cond (c: (s32[], f32[131072], (f32[131072], u32[], token[]))) -> pred[] {
  %c = (s32[], f32[131072]{0}, (f32[131072]{0}, u32[], token[])) parameter(0)
  %j = s32[] get-tuple-element(%c), index=0
  %four = s32[] constant(4)
  ROOT %lt = pred[] compare(%j, %four), direction=LT
}

ENTRY %main (p: f32[131072]) -> f32[131072] {
  %p = f32[131072]{0} parameter(0)
  %tok0 = token[] after-all()
  %s0 = (f32[131072]{0}, u32[], token[]) send(%p, %tok0), channel_id=1, frontend_attributes={_xla_send_recv_pipeline="0",_xla_send_recv_source_target_pairs={{0,1},{1,2},{2,3},{3,4},{4,5},{5,6},{6,7}}}
  %zero = s32[] constant(0)
  %init = (s32[], f32[131072]{0}, (f32[131072]{0}, u32[], token[])) tuple(%zero, %p, %s0)
  %w = (s32[], f32[131072]{0}, (f32[131072]{0}, u32[], token[])) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"4"}}
  %final = (f32[131072]{0}, u32[], token[]) get-tuple-element(%w), index=2
  %final.done = token[] send-done(%final), channel_id=1, frontend_attributes={_xla_send_recv_pipeline="0"}
  %ag = (f32[131072]{0}, f32[262144]{0}) all-gather-start(%p), channel_id=2, replica_groups={{0,7},{1,6},{2,5},{3,4}}, dimensions={0}, use_global_device_ids=true
  %busy = f32[131072]{0} exponential(%p)
  %ag.done = f32[262144]{0} all-gather-done(%ag)
  %x = f32[131072]{0} get-tuple-element(%w), index=1
  ROOT %r = f32[131072]{0} add(%x, %busy)
}
"""
)


def test_a_send_fired_for_a_later_iteration_counts_beside_everything() -> None:
    """The body's %s has its done elsewhere: it may still run when the all-gather does,
    though the chain's own pair (%s0 to %final.done, XLA's P2P stream) has ended."""
    hlo_bindings().hlo_module_from_text(FIRED)
    what = what_if(parse_module(FIRED), H100, (1,), ("interval",))
    fired = [s for s in what.specs[len(what.pairs) :] if s.name == "s"]
    assert len(fired) == 1 and fired[0].at is None and fired[0].cost.sms > 0
    assert what.resident_ctas == {(1, "interval"): RING + fired[0].cost.sms}


@pytest.mark.parametrize("seed", range(40))
def test_the_bound_is_the_definition_on_random_schedules(seed: int) -> None:
    """Pairs on three collective streams, XLA's P2P stream and the compute stream."""
    rng = random.Random(seed)
    count = rng.randint(1, 12)
    occurrences = []
    for _ in range(count):
        starts = sorted(rng.sample(range(60), rng.randint(1, 3)))
        occurrences.append([(a, a + rng.randint(1, 15)) for a in starts])
    streams: list[int | str] = [rng.choice((0, 1, 2, "p2p", "compute")) for _ in range(count)]
    ctas = [rng.choice((1, 4, 16, 24, 32)) for _ in range(count)]
    pairs = [
        AsyncPair("main", f"s{i}", f"d{i}", "all-gather", 0, 1, occ[0][0], occ[0][1], False,
                  False, ((0, 1),), 1, occurrences=tuple(occ),
                  lane=stream if isinstance(stream, str) else "communication")
        for i, (occ, stream) in enumerate(zip(occurrences, streams, strict=True))
    ]  # fmt: skip
    specs = [SimpleNamespace(cost=SimpleNamespace(sms=n), side=False) for n in ctas]
    assignment = StreamAssignment(
        3,
        "interval",
        {p.key: s if isinstance(s, int) else None for p, s in zip(pairs, streams, strict=True)},
    )
    found = resident_ctas(None, pairs, specs, {"k": assignment})  # type: ignore[arg-type]
    assert found == {"k": _brute_force(occurrences, streams, ctas)}


# -- where the streams are made: fit-on-gpu ---------------------------------------------


def fitted(text: str, streams: int, gpu: str, policy: str = "interval") -> Compilation:
    spec = (
        f"find-async-pairs{{overlap_limit=8}},assign-streams{{streams={streams},"
        f"policy={policy}}},fit-on-gpu{{gpu={gpu}}},verify-streams"
    )
    return PassManager(parse_pipeline(spec)).run(Compilation(parse_module(text)))


@pytest.mark.parametrize("policy", ["interval", "round-robin"])
@pytest.mark.parametrize(("gpu", "ring", "kept"), [("h100", 24, 5), ("b200", 32, 4)])
def test_fit_on_gpu_lowers_k_to_the_largest_whose_kernels_fit(
    gpu: str, ring: int, kept: int, policy: str
) -> None:
    compilation = fitted(gathers(6), 8, gpu, policy)
    got = compilation.assignment
    assert got is not None and got.streams == kept and got.streams_used == kept
    # The assignment of that K, as assign-streams makes it: only K changed.
    assert got.stream_of == assign_streams(compilation.pairs, kept, policy).stream_of
    sms = get_target(gpu).sm_count
    assert got.lowered == (
        f"K=8 lowered to K={kept}: the NCCL kernels in flight together may need "
        f"{6 * ring} CTAs, more than the {sms} SMs of {gpu}, and they must all be resident "
        f"at once for no order of the work to deadlock (K={kept} needs at most {kept * ring})"
    )
    report = build_report(compilation)
    assert report.streams == kept
    assert AssignmentReport.from_json(report.to_json()).lowered == got.lowered
    assert f"streams: {got.lowered}" in format_report(report)
    assert f"of {kept} streams (K=8 lowered to K={kept})" in summary_line(compilation)


def test_fit_on_gpu_keeps_an_assignment_that_fits() -> None:
    compilation = fitted(gathers(5), 8, "h100")
    asked = assign_streams(compilation.pairs, 8, "interval")
    assert compilation.assignment == asked and not asked.lowered
    assert '"lowered"' not in build_report(compilation).to_json()


def test_fit_on_gpu_comes_before_what_uses_the_assignment() -> None:
    spec = "find-async-pairs,assign-streams{streams=8},verify-streams,fit-on-gpu"
    with pytest.raises(PipelineError, match="put it before 'verify-streams'"):
        PassManager(parse_pipeline(spec)).run(Compilation(parse_module(gathers(6))))


def test_where_no_k_fits_one_stream_is_kept_as_xla_would_run_it() -> None:
    """On a GPU of 30 SMs even one stream's ring beside the synchronous all-reduce may
    not fit: K=2 goes to K=1, which is what XLA runs without us, and says so; K=1
    asked stays as it is."""
    tiny = dataclasses.replace(H100, sm_count=30)
    module = parse_module(gathers(2, all_reduce="all-reduce"))
    what = what_if(module, H100, (1,), ("interval",))
    pairs, sync = what.pairs, what.specs[-1].cost.sms
    two = assign_streams(pairs, 2, "interval")
    got = fit_on_gpu(module, pairs, two, tiny)
    assert got.streams == 1
    assert got.lowered.startswith(
        f"K=2 lowered to K=1: the NCCL kernels in flight "
        f"together may need {2 * RING + sync} CTAs, more than the 30"
    )
    assert got.lowered.endswith(f"(even K=1 may need {RING + sync})")
    one = assign_streams(pairs, 1, "interval")
    assert fit_on_gpu(module, pairs, one, tiny) is one


# -- in the plugin: on the GPU the job runs on -------------------------------------------


def _hooked(text: str, kinds: set[str] | None, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The stream annotations of ``text`` after the compile hook (native mode, K=8), on
    GPUs of ``kinds`` as JAX would list them."""
    monkeypatch.setattr(jax_compat, "gpu_device_kinds", lambda: kinds)
    out = hook.transform(
        xla_module.to_proto(text), on_cpu=False, config=Config(8), model=StreamModel(8, True)
    )
    assert out is not None
    return set(re.findall(r'_xla_stream_annotation="(\d+)"', xla_module.module_text(out)[1]))


def test_on_an_h100_the_plugin_keeps_k_to_what_fits_and_warns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="xla_streams"):
        used = _hooked(gathers(6), {"NVIDIA H100 80GB HBM3"}, monkeypatch)
    assert used == {"0", "1", "2", "3", "4"}
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [
        "module crowded: K=8 lowered to K=5: the NCCL kernels in flight together may need "
        "144 CTAs, more than the 132 SMs of h100, and they must all be resident at once for "
        "no order of the work to deadlock (K=5 needs at most 120)"
    ]


def test_on_a_gpu_without_a_model_the_plugin_uses_k_as_given_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(hook, "_said", set())
    with caplog.at_level(logging.INFO, logger="xla_streams"):
        assert _hooked(gathers(6), {"NVIDIA H100 PCIe"}, monkeypatch) == set("012345")
        _hooked(gathers(6), {"NVIDIA H100 PCIe"}, monkeypatch)
    said = [r.getMessage() for r in caplog.records if "no model of" in r.getMessage()]
    assert said == [
        "xla_streams has no model of NVIDIA H100 PCIe: it cannot check that the NCCL kernels "
        "of K streams fit on the GPU at once (the deadlock rule's premise, docs/streams.md), "
        "so K is used as given"
    ]


def test_of_gpus_of_several_kinds_the_one_with_the_fewest_sms_decides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every process of a job sees every device, so each computes the same assignment."""
    monkeypatch.setattr(jax_compat, "gpu_device_kinds", lambda: {"NVIDIA B200", "NVIDIA H200"})
    assert hook.job_gpu() == "h200"  # 132 SMs to B200's 148
    monkeypatch.setattr(jax_compat, "gpu_device_kinds", lambda: {"NVIDIA B200", "AMD MI300X"})
    assert hook.job_gpu() is None


def test_the_gpu_kinds_are_those_jax_lists() -> None:
    import jax

    gpus = {d.device_kind for d in jax.devices() if d.platform == "gpu"}  # starts JAX
    assert jax_compat.gpu_device_kinds() == (gpus or None)


@pytest.mark.parametrize(
    ("kind", "target"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 SXM5 80GB", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GB200", "gb200"),
        ("NVIDIA A100-SXM4-40GB", "a100"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA H100 PCIe", None),  # 114 SMs, no NVLink
        ("NVIDIA H100 NVL", None),  # NVLink bridges, not NVSwitch
        ("NVIDIA H200 NVL", None),
        ("NVIDIA A100-PCIE-40GB", None),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_a_gpu_takes_the_target_of_its_board(kind: str, target: str | None) -> None:
    assert target_of_device(kind) == target
