"""Every pair in every spelling XLA reads: each construct in its own small hand-written
module, XLA's own parser (jaxlib) reading it first, and the pairs found as XLA pairs
them (``FindCanonicalSendRecvStartOp``, ``ExecutionStreamAssignment``, the verifier in
``hlo_verifier.cc``, openxla/xla).

- host transfers (``is_host_transfer=true``) are no device collectives: no pair, no
  stream (tests/test_report.py: the report names them);
- a send/recv chain through a while loop's tuple is one pair, from its first start
  before the loop to its last done after it; its links inside the body are none;
- sends and recvs an ``async-start`` launches together are one pair, the group;
- an in-place collective-permute names a pair once per slice it moves;
- a start no done completes: a send or recv is no pair (XLA's verifier takes a tuple
  as its user); a start in a fusion's computation runs in the fusion's kernel;
- a pair in a computation another execution thread runs is in flight during the whole
  async call that runs it, and the deadlock rule sees it there;
- names reused across computations (XLA scopes names per computation) key their pairs
  apart.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from conftest import hlo_module

from xla_streams import cli
from xla_streams.hlo import HloError, parse_module
from xla_streams.jax_compat import hlo_bindings
from xla_streams.passes.annotate_streams import STREAM_ATTRIBUTE
from xla_streams.report import AssignmentReport
from xla_streams.streams import (
    AsyncPair,
    StreamAssignment,
    VerificationError,
    assign_streams,
    find_async_pairs,
    verify_streams,
)

P2P = "frontend_attributes={_xla_send_recv_source_target_pairs={{0,1},{1,2},{2,3}}}"


def pairs_of(text: str) -> dict[str, AsyncPair]:
    """The pairs of ``text``, which XLA's parser must read too, by start name."""
    hlo_bindings().hlo_module_from_text(text)
    return {p.start: p for p in find_async_pairs(parse_module(text, "hand.hlo"))}


def assigned(text: str, tmp_path: Path) -> tuple[str, AssignmentReport]:
    """``xla-streams assign`` of ``text``: the module it writes, which XLA reads back,
    and its report."""
    source, out, report = tmp_path / "in.hlo", tmp_path / "out.hlo", tmp_path / "r.json"
    source.write_text(text)
    stderr = io.StringIO()
    code = cli.main(
        ["assign", str(source), "--streams=4", f"--output={out}", f"--json={report}", "--quiet"],
        stdout=io.StringIO(),
        stderr=stderr,
    )
    assert code == 0, stderr.getvalue()
    hlo_bindings().hlo_module_from_text(out.read_text())
    return out.read_text(), AssignmentReport.from_json(report.read_text())


def annotated(printed: str) -> set[str]:
    """The instructions of ``printed`` that carry a stream annotation."""
    return {
        line.split("=")[0].strip().removeprefix("ROOT ").lstrip("%")
        for line in printed.splitlines()
        if STREAM_ATTRIBUTE in line
    }


# -- host transfers ------------------------------------------------------------------

HOST = hlo_module(
    "HloModule host, is_scheduled=true, num_partitions=4",
    """\
ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %tok = token[] after-all()
  %from-host = (f32[8]{0}, u32[], token[]) recv(%tok), channel_id=1, is_host_transfer=true
  %ar = f32[8]{0} all-reduce-start(%p), channel_id=3, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
  %from-host.done = (f32[8]{0}, token[]) recv-done(%from-host), channel_id=1, is_host_transfer=true
  %value = f32[8]{0} get-tuple-element(%from-host.done), index=0
  %to-host = (f32[8]{0}, u32[], token[]) send(%value, %tok), channel_id=2, is_host_transfer=true
  %to-host.done = token[] send-done(%to-host), channel_id=2, is_host_transfer=true
  %ar.done = f32[8]{0} all-reduce-done(%ar)
  ROOT %out = f32[8]{0} add(%ar.done, %value)
}
""",
)


def test_host_transfers_are_no_pairs_and_get_no_stream(tmp_path: Path) -> None:
    assert set(pairs_of(HOST)) == {"ar"}
    printed, report = assigned(HOST, tmp_path)
    assert annotated(printed) == {"ar", "ar.done"}
    assert report.summary.host_transfers == 2


def test_a_device_send_without_its_pairs_is_still_refused() -> None:
    device = HOST.replace(", is_host_transfer=true", "")
    with pytest.raises(HloError, match="recv without source_target_pairs"):
        find_async_pairs(parse_module(device))


# -- a header that sets no device count -------------------------------------------------

# XLA's own test modules often leave the counts at 1 while their groups name 8 devices;
# XLA's verifier reads a count of 1 as unset and takes the ids as the groups give them.
UNCOUNTED = hlo_module(
    "HloModule uncounted, is_scheduled=true",
    """\
ENTRY %main (p: f32[64]) -> f32[64] {
  %p = f32[64]{0} parameter(0)
  %ar = f32[64]{0} all-reduce-start(%p), replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add
  %cp = f32[64]{0} collective-permute-start(%p), channel_id=1, source_target_pairs={{0,9},{9,0}}
  %e = f32[64]{0} exponential(%p)
  %ar.done = f32[64]{0} all-reduce-done(%ar)
  %cp.done = f32[64]{0} collective-permute-done(%cp)
  ROOT %r = f32[64]{0} add(%ar.done, %cp.done)
}
""",
)


def test_without_counts_in_the_header_the_ids_are_the_devices(tmp_path: Path) -> None:
    pairs = pairs_of(UNCOUNTED)
    assert pairs["ar"].groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert pairs["cp"].groups == ((0, 9), (9, 0))
    _, report = assigned(UNCOUNTED, tmp_path)
    assert report.summary.async_pairs == 2


def test_without_counts_groups_still_hold_each_id_from_0_once() -> None:
    # XLA's verifier: "Replica 8 is out of range (should be in [0, 8) range)".
    gap = UNCOUNTED.replace("{4,5,6,7}}", "{4,5,6,8}}")
    with pytest.raises(HloError, match=r"device 8 is outside the module's 8 replicas \("
                       r"replica_count=1, num_partitions=1: 1 reads as unset"):  # fmt: skip
        find_async_pairs(parse_module(gap))
    # Pairs may name any id, but no more devices than any module may have.
    far = UNCOUNTED.replace("{{0,9},{9,0}}", "{{0,65536},{65536,0}}")
    with pytest.raises(HloError, match="device 65536 is past the 65536 devices read"):
        find_async_pairs(parse_module(far))


# -- send/recv chains through a loop's tuple -----------------------------------------

CONTEXT = "(f32[64]{0}, u32[], token[])"
STATE = f"(s32[], {CONTEXT}, {CONTEXT})"
CHAIN = hlo_module(
    "HloModule chain, is_scheduled=true, num_partitions=4",
    f"""\
%cond (c: {STATE}) -> pred[] {{
  %c = {STATE} parameter(0)
  %ci = s32[] get-tuple-element(%c), index=0
  %limit = s32[] constant(3)
  ROOT %more = pred[] compare(%ci, %limit), direction=LT
}}

%body (b: {STATE}) -> {STATE} {{
  %b = {STATE} parameter(0)
  %bi = s32[] get-tuple-element(%b), index=0
  %sent = {CONTEXT} get-tuple-element(%b), index=1
  %send.link.done = token[] send-done(%sent), channel_id=1
  %received = {CONTEXT} get-tuple-element(%b), index=2
  %recv.link.done = (f32[64]{{0}}, token[]) recv-done(%received), channel_id=2
  %data = f32[64]{{0}} get-tuple-element(%recv.link.done), index=0
  %ag = (f32[64]{{0}}, f32[128]{{0}}) all-gather-start(%data), channel_id=3, replica_groups={{{{0,1}},{{2,3}}}}, dimensions={{0}}, use_global_device_ids=true
  %tok = token[] after-all()
  %send.link = {CONTEXT} send(%data, %tok), channel_id=1, {P2P}
  %recv.link = {CONTEXT} recv(%tok), channel_id=2, {P2P}
  %work = f32[64]{{0}} exponential(%data)
  %ag.done = f32[128]{{0}} all-gather-done(%ag)
  %one = s32[] constant(1)
  %next = s32[] add(%bi, %one)
  ROOT %state = {STATE} tuple(%next, %send.link, %recv.link)
}}

ENTRY %main (p: f32[64]) -> f32[64] {{
  %p = f32[64]{{0}} parameter(0)
  %zero = s32[] constant(0)
  %first = token[] after-all()
  %send.first = {CONTEXT} send(%p, %first), channel_id=1, {P2P}
  %recv.first = {CONTEXT} recv(%first), channel_id=2, {P2P}
  %init = {STATE} tuple(%zero, %send.first, %recv.first)
  %loop = {STATE} while(%init), condition=%cond, body=%body
  %last.sent = {CONTEXT} get-tuple-element(%loop), index=1
  %send.last = token[] send-done(%last.sent), channel_id=1
  %last.received = {CONTEXT} get-tuple-element(%loop), index=2
  %recv.last = (f32[64]{{0}}, token[]) recv-done(%last.received), channel_id=2
  ROOT %out = f32[64]{{0}} get-tuple-element(%recv.last), index=0
}}
""",
)


def test_a_chain_through_a_loop_is_one_pair_from_its_first_start_to_its_last_done() -> None:
    pairs = pairs_of(CHAIN)
    # XLA gives only the chain's first start a stream (its canonical start); the links
    # inside the body are no scope of their own.
    assert set(pairs) == {"send.first", "recv.first", "ag"}
    send, recv, gather = pairs["send.first"], pairs["recv.first"], pairs["ag"]
    assert (send.computation, send.done, send.kind, send.pipelined) == ("main", "send.last",
                                                                        "send", False)  # fmt: skip
    assert (recv.done, recv.kind, recv.channel) == ("recv.last", "recv", 2)
    assert send.lane == recv.lane == "communication"  # no _xla_send_recv_pipeline
    # In flight for the whole loop: each overlaps the all-gather of the body.
    assert send.overlaps(gather) and recv.overlaps(gather)


def test_a_chain_gets_its_stream_on_the_start_xla_reads_it_from(tmp_path: Path) -> None:
    printed, report = assigned(CHAIN, tmp_path)
    assert annotated(printed) == {"send.first", "send.last", "recv.first", "recv.last",
                                  "ag", "ag.done"}  # fmt: skip
    # The chains and the all-gather share devices 0 and 1 while in flight: one stream.
    assert {c.start: c.stream for c in report.collectives} == {
        "send.first": 0, "recv.first": 0, "ag": 0,
    }  # fmt: skip


def test_a_done_reading_the_other_kind_of_chain_completes_no_pair() -> None:
    # The recv-done after the loop reads the send chain's context: XLA's verifier asks
    # only for a get-tuple-element there; nothing completes the recv chain.
    crossed = CHAIN.replace(
        "get-tuple-element(%loop), index=2", "get-tuple-element(%loop), index=1"
    )
    assert set(pairs_of(crossed)) == {"send.first", "ag"}


def test_a_send_no_done_completes_is_no_pair() -> None:
    text = hlo_module(
        "HloModule open, is_scheduled=true, num_partitions=4",
        f"""\
ENTRY %main (p: f32[64]) -> ({CONTEXT}) {{
  %p = f32[64]{{0}} parameter(0)
  %tok = token[] after-all()
  %send = {CONTEXT} send(%p, %tok), channel_id=1, {P2P}
  ROOT %out = ({CONTEXT}) tuple(%send)
}}
""",
    )
    assert pairs_of(text) == {}


# -- grouped send/recv -----------------------------------------------------------------

GROUPED = hlo_module(
    "HloModule grouped, is_scheduled=true, num_partitions=4",
    f"""\
%both (a: f32[64], t: token[]) -> ({CONTEXT}, {CONTEXT}) {{
  %a = f32[64]{{0}} parameter(0)
  %t = token[] parameter(1)
  %forward = {CONTEXT} send(%a, %t), channel_id=1, frontend_attributes={{_xla_send_recv_source_target_pairs={{{{0,1}},{{1,2}}}}}}
  %backward = {CONTEXT} recv(%t), channel_id=1, frontend_attributes={{_xla_send_recv_source_target_pairs={{{{2,3}}}}}}
  ROOT %contexts = ({CONTEXT}, {CONTEXT}) tuple(%forward, %backward)
}}

ENTRY %main (p: f32[64]) -> f32[64] {{
  %p = f32[64]{{0}} parameter(0)
  %tok = token[] after-all()
  %group = ((f32[64]{{0}}, token[]), ({CONTEXT}, {CONTEXT}), s32[]) async-start(%p, %tok), calls=%both
  %work = f32[64]{{0}} exponential(%p)
  %group.done = ({CONTEXT}, {CONTEXT}) async-done(%group)
  %received = {CONTEXT} get-tuple-element(%group.done), index=1
  %value = f32[64]{{0}} get-tuple-element(%received), index=0
  ROOT %out = f32[64]{{0}} add(%value, %work)
}}
""",
)


def test_grouped_sends_and_recvs_are_one_pair_with_all_their_devices() -> None:
    pairs = pairs_of(GROUPED)
    assert set(pairs) == {"group"}
    group = pairs["group"]
    assert (group.done, group.kind, group.channel) == ("group.done", "send", 1)
    assert group.groups == ((0, 1), (1, 2), (2, 3))


# -- in-place permutes -----------------------------------------------------------------

OFFSETS = "((s32[], s32[]), (s32[], s32[]))"
IN_PLACE = hlo_module(
    "HloModule inplace, is_scheduled=true, num_partitions=2",
    f"""\
ENTRY %main (p: f32[8,4], q: f32[8,4]) -> f32[8,4] {{
  %p = f32[8,4]{{1,0}} parameter(0)
  %q = f32[8,4]{{1,0}} parameter(1)
  %zero = s32[] constant(0)
  %four = s32[] constant(4)
  %top = (s32[], s32[]) tuple(%zero, %zero)
  %bottom = (s32[], s32[]) tuple(%four, %zero)
  %offsets = {OFFSETS} tuple(%top, %bottom)
  %cp = (f32[8,4]{{1,0}}, f32[8,4]{{1,0}}, u32[], u32[]) collective-permute-start(%p, %q, %offsets, %offsets), channel_id=1, source_target_pairs={{{{0,1}},{{1,0}},{{0,1}},{{1,0}}}}, slice_sizes={{{{4,4}},{{4,4}},{{4,4}},{{4,4}}}}
  %work = f32[8,4]{{1,0}} exponential(%p)
  %cp.done = f32[8,4]{{1,0}} collective-permute-done(%cp)
  ROOT %out = f32[8,4]{{1,0}} add(%cp.done, %work)
}}
""",
)


def test_an_in_place_permute_names_a_pair_once_per_slice() -> None:
    assert pairs_of(IN_PLACE)["cp"].groups == ((0, 1), (1, 0))


def test_a_permute_that_is_not_in_place_names_each_device_once() -> None:
    # XLA's verifier refuses the repeat there (CheckDuplicatedSourceOrTarget).
    plain = (
        IN_PLACE.replace("(%p, %q, %offsets, %offsets)", "(%p)")
        .replace(", slice_sizes={{4,4},{4,4},{4,4},{4,4}}", "")
        .replace("(f32[8,4]{1,0}, f32[8,4]{1,0}, u32[], u32[])", "(f32[8,4]{1,0}, f32[8,4]{1,0})")
    )
    with pytest.raises(HloError, match="device 0 is a source in more than one pair"):
        find_async_pairs(parse_module(plain))


# -- a start in a fusion's computation -------------------------------------------------


def test_a_start_in_a_fusion_runs_in_its_kernel() -> None:
    text = hlo_module(
        "HloModule fused, is_scheduled=true, replica_count=2",
        """\
%collective (x: f32[1024]) -> f32[1024] {
  %x = f32[1024]{0} parameter(0)
  ROOT %ar = f32[1024]{0} all-reduce-start(%x), replica_groups={{0,1}}, to_apply=%add
}

ENTRY %main (p: f32[1024]) -> f32[1024] {
  %p = f32[1024]{0} parameter(0)
  ROOT %kernel = f32[1024]{0} fusion(%p), kind=kCustom, calls=%collective
}
""",
    )
    assert pairs_of(text) == {}


# -- computations on other execution threads -------------------------------------------

THREADS = hlo_module(
    "HloModule threads, is_scheduled=true, num_partitions=4",
    """\
%gemm (a: f32[1024]) -> f32[1024] {
  %a = f32[1024]{0} parameter(0)
  %inner = f32[1024]{0} all-reduce-start(%a), channel_id=2, replica_groups=INNER, use_global_device_ids=true, to_apply=%add
  %e = f32[1024]{0} exponential(%a)
  ROOT %inner.done = f32[1024]{0} all-reduce-done(%inner)
}, execution_thread="parallel"

ENTRY %main (p: f32[1024]) -> f32[1024] {
  %p = f32[1024]{0} parameter(0)
  %call = ((f32[1024]{0}), f32[1024]{0}, s32[]) call-start(%p), async_execution_thread="parallel", to_apply=%gemm
  %outer = f32[1024]{0} all-reduce-start(%p), channel_id=1, replica_groups={{0,1},{2,3}}, use_global_device_ids=true, to_apply=%add
  %x = f32[1024]{0} exponential(%p)
  %outer.done = f32[1024]{0} all-reduce-done(%outer)
  %call.done = f32[1024]{0} call-done(%call)
  ROOT %s = f32[1024]{0} add(%outer.done, %call.done)
}
""",
)
# The same call unsugared, as an async-start of a computation that calls %gemm.
WRAPPED = (
    THREADS.replace(
        'call-start(%p), async_execution_thread="parallel", to_apply=%gemm',
        'async-start(%p), async_execution_thread="parallel", calls=%wrapped',
    )
    .replace("call-done(%call)", "async-done(%call)")
    .replace(
        "\nENTRY",
        """
%wrapped (w: f32[1024]) -> f32[1024] {
  %w = f32[1024]{0} parameter(0)
  ROOT %c = f32[1024]{0} call(%w), to_apply=%gemm
}, execution_thread="parallel"

ENTRY""",
    )
)
SPELLINGS = pytest.mark.parametrize("text", [THREADS, WRAPPED], ids=["call-start", "async-start"])


@SPELLINGS
def test_a_pair_on_another_thread_is_in_flight_during_the_whole_call(text: str) -> None:
    pairs = pairs_of(text.replace("INNER", "{{0,1},{2,3}}"))
    inner, outer = pairs["inner"], pairs["outer"]
    assert inner.computation == "gemm"
    # The call runs from %call to %call.done (positions 1 and 5 of main): XLA orders
    # nothing between the threads, so %inner may be in flight at any time between.
    call_window = (outer.start_time - 2, outer.done_time + 2)
    assert inner.occurrences == (call_window,)
    assert inner.overlaps(outer)


@SPELLINGS
def test_the_deadlock_rule_sees_a_pair_on_another_thread(text: str) -> None:
    tied = text.replace("INNER", "{{0,1},{2,3}}")  # the groups of %outer: tied to it
    module = parse_module(tied)
    pairs = find_async_pairs(module)
    assignment = assign_streams(pairs, 4, "interval")
    assert assignment.stream_of == {"inner": 0, "outer": 0}
    verify_streams(pairs, assignment, module)
    apart = StreamAssignment(4, "interval", {"inner": 1, "outer": 0})
    with pytest.raises(VerificationError, match="'%inner'.*'%outer'|'%outer'.*'%inner'"):
        verify_streams(pairs, apart, module)  # the walk enters the call at its start
    # Groups sharing one device at most overlap on two streams.
    free = text.replace("INNER", "{{0,2},{1,3}}")
    assert assign_streams(find_async_pairs(parse_module(free)), 4, "interval").stream_of == {
        "inner": 0, "outer": 1,
    }  # fmt: skip


def test_a_module_with_a_pair_on_another_thread_is_assigned_as_xla_reads_it(
    tmp_path: Path,
) -> None:
    printed, report = assigned(THREADS.replace("INNER", "{{0,1},{2,3}}"), tmp_path)
    assert annotated(printed) == {"inner", "inner.done", "outer", "outer.done"}
    assert {c.start: c.serialized_by for c in report.collectives} == {
        "inner": None, "outer": "rule",
    }  # fmt: skip


# -- names reused across computations ----------------------------------------------------


def test_pairs_whose_names_another_computation_reuses_are_keyed_apart() -> None:
    text = hlo_module(
        "HloModule scoped, is_scheduled=true, num_partitions=4",
        """\
%other (a: f32[1024]) -> f32[1024] {
  %a = f32[1024]{0} parameter(0)
  %ar = f32[1024]{0} all-reduce-start(%a), channel_id=2, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
  %e = f32[1024]{0} exponential(%a)
  ROOT %ar.done = f32[1024]{0} all-reduce-done(%ar)
}

ENTRY %main (p: f32[1024]) -> f32[1024] {
  %p = f32[1024]{0} parameter(0)
  %ar = f32[1024]{0} all-reduce-start(%p), channel_id=1, replica_groups={{0,1},{2,3}}, use_global_device_ids=true, to_apply=%add
  %c = f32[1024]{0} call(%p), to_apply=%other
  %ar.done = f32[1024]{0} all-reduce-done(%ar)
  ROOT %s = f32[1024]{0} add(%ar.done, %c)
}
""",
    )
    hlo_bindings().hlo_module_from_text(text)
    module = parse_module(text)
    pairs = find_async_pairs(module)
    assert [(p.computation, p.start, p.key) for p in pairs] == [
        ("main", "ar", "main/ar"), ("other", "ar", "other/ar"),
    ]  # fmt: skip
    assignment = assign_streams(pairs, 4, "interval")
    assert assignment.stream_of == {"main/ar": 0, "other/ar": 0}  # in flight together: tied
    verify_streams(pairs, assignment, module)
