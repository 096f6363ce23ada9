"""Stream assignment: both policies on hand-written schedules, the deadlock rule,
verify-streams, and properties over random schedules."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from itertools import combinations
from pathlib import Path

import pytest
from conftest import ADD_REDUCER
from hypothesis import given, settings
from hypothesis import strategies as st

from xla_streams.collectives import STREAMS, StreamModel, check_streams
from xla_streams.hlo import parse_module
from xla_streams.passes.assign_streams import AssignStreams
from xla_streams.streams import (
    AsyncPair,
    StreamAssignment,
    VerificationError,
    assign_each,
    assign_streams,
    find_async_pairs,
    max_in_flight,
    tied_units,
    verify_streams,
)

TP = "{{0,1,2,3},{4,5,6,7}}"  # tensor parallel: devices of one host half
DP = "{{0,4},{1,5},{2,6},{3,7}}"  # data parallel: one device of each half


def schedule(*events: str) -> str:
    """A scheduled 8-device module from events: `start NAME GROUPS`, `done NAME`, `dot`.

    Each start is followed by a dot, so that compute overlaps every collective
    (a pair with nothing but other collectives inside is made sync by XLA).
    """
    lines = ["  %p = f32[1024,1024]{1,0} parameter(0)"]
    dots = 0
    for event in events:
        word, *rest = event.split()
        if word == "start":
            name, groups = rest
            lines.append(
                f"  %{name} = f32[1024,1024]{{1,0}} all-reduce-start(%p), channel_id=1, "
                f"replica_groups={groups}, use_global_device_ids=true, to_apply=%add"
            )
            dots += 1
            lines.append(
                f"  %dot.{dots} = f32[1024,1024]{{1,0}} dot(%p, %p), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}"
            )
        elif word == "done":
            lines.append(f"  %{rest[0]}.done = f32[1024,1024]{{1,0}} all-reduce-done(%{rest[0]})")
        else:
            dots += 1
            lines.append(
                f"  %dot.{dots} = f32[1024,1024]{{1,0}} dot(%p, %p), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}"
            )
    lines.append("  ROOT %out = () tuple()")
    return "\n".join(
        [
            "HloModule test, is_scheduled=true, num_partitions=8",
            "",
            *ADD_REDUCER.splitlines(),
            "",
            "ENTRY %main (p: f32[1024,1024]) -> () {",
            *lines,
            "}",
            "",
        ]
    )


def streams_of(text: str, streams: int, policy: str = "interval") -> dict[str, int | None]:
    pairs = find_async_pairs(parse_module(text))
    assignment = assign_streams(pairs, streams, policy)  # type: ignore[arg-type]
    verify_streams(pairs, assignment)
    return assignment.stream_of


def test_tensor_and_data_parallel_groups_overlap_on_different_streams() -> None:
    # {0,1,2,3} and {0,4} share one device: the rule (XLA's threshold) lets them
    # overlap, relying on their NCCL kernels being co-resident (docs/streams.md).
    text = schedule(f"start tp {TP}", f"start dp {DP}", "dot", "done tp", "done dp")
    assert streams_of(text, 2) == {"tp": 0, "dp": 1}


def test_same_group_collectives_in_flight_share_a_stream() -> None:
    text = schedule(f"start a {TP}", f"start b {TP}", "dot", "done a", "done b")
    pairs = find_async_pairs(parse_module(text))
    assignment = assign_streams(pairs, 4, "interval")
    assert assignment.stream_of == {"a": 0, "b": 0}
    assert assignment.serialized_by_rule == {"b"}
    assert not assignment.serialized_by_bound


def test_ties_are_transitive() -> None:
    # a-b share devices, b-c share devices, a and c do not overlap each other's groups:
    # all three still end up together because b must sit with both.
    text = schedule(
        "start a {{0,1},{2,3},{4,5},{6,7}}",
        "start b {{1,2},{3,4},{5,6},{7,0}}",
        "start c {{0,1,2,3},{4,5,6,7}}",
        "done a",
        "done b",
        "done c",
    )
    assert set(streams_of(text, 4).values()) == {0}


def test_interval_reuses_a_stream_once_its_collective_is_done() -> None:
    text = schedule(f"start a {TP}", f"start b {DP}", "done a", f"start c {TP}", "done b", "done c")
    # c starts after a is done: stream 0 is free again; b still holds stream 1.
    assert streams_of(text, 4) == {"a": 0, "b": 1, "c": 0}


def test_round_robin_is_i_mod_k_in_start_order() -> None:
    text = schedule(f"start a {TP}", "done a", f"start b {DP}", "done b", f"start c {TP}", "done c")
    assert streams_of(text, 2, "round-robin") == {"a": 0, "b": 1, "c": 0}
    # interval needs only one stream here: nothing overlaps.
    assert streams_of(text, 2, "interval") == {"a": 0, "b": 0, "c": 0}


def test_bound_exceeded_waits_for_the_stream_that_frees_first() -> None:
    text = schedule(
        "start a {{0,1}}", "start b {{2,3}}", "start c {{4,5}}", "done b", "done a", "done c"
    )
    pairs = find_async_pairs(parse_module(text))
    assignment = assign_streams(pairs, 2, "interval")
    verify_streams(pairs, assignment)
    # b ends before a, so c queues behind b on stream 1.
    assert assignment.stream_of == {"a": 0, "b": 1, "c": 1}
    assert assignment.serialized_by_bound == {"c"}


SYNC = 'to_apply=%add, backend_config={"collective_backend_config":{"is_sync":true}}'


def test_where_a_sync_pair_runs_depends_on_how_the_module_was_compiled() -> None:
    text = schedule(f"start a {TP}", "done a").replace("to_apply=%add", SYNC)
    # Unknown settings: the safe assumption, XLA 0.10.2's async thunk on stream 0.
    assert streams_of(text, 4) == {"a": 0}
    for model in (StreamModel(overlap_limit=1), StreamModel(sync_on_compute=True)):
        pairs = find_async_pairs(parse_module(text), model)
        assert [p.lane for p in pairs] == ["compute"]
        assert assign_streams(pairs, 4, "interval").stream_of == {"a": None}


def test_a_sync_collective_inside_an_async_interval_takes_part_in_the_rule() -> None:
    # Found with XLA 0.10.2 at overlap limit > 1: the sync all-reduce over all 8 devices
    # runs on communication_stream[0] while the all-gather over {0,4},.. is in flight.
    text = schedule(
        f"start ar {TP}", f"start ag {DP}", "start sync {{0,1,2,3,4,5,6,7}}", "done sync",
        "done ar", "done ag",
    ).replace("replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add",
              "replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, " + SYNC)  # fmt: skip
    assert streams_of(text, 4) == {"ar": 0, "ag": 0, "sync": 0}
    # On jax >= 0.11 the sync one runs on the compute stream: TP and DP overlap freely.
    pairs = find_async_pairs(parse_module(text), StreamModel(sync_on_compute=True))
    assert assign_streams(pairs, 4, "interval").stream_of == {"ar": 0, "ag": 1, "sync": None}


def test_xla_makes_a_pair_with_nothing_to_overlap_sync() -> None:
    # Only other collectives' starts/dones and no-ops between start and done:
    # XLA's async-to-sync converter (after our hook) makes it synchronous.
    text = schedule(f"start a {TP}", "done a").replace(
        "  %dot.1 = f32[1024,1024]{1,0} dot(%p, %p), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n",
        "  %bc = f32[1024,1024]{1,0} bitcast(%p)\n",
    )
    (pair,) = find_async_pairs(parse_module(text), StreamModel(sync_on_compute=True))
    assert pair.sync and pair.lane == "compute"
    (pair,) = find_async_pairs(parse_module(schedule(f"start a {TP}", "done a")))
    assert not pair.sync and pair.lane == "communication"


def test_annotations_in_the_module_are_pins_below_k_and_reassigned_above() -> None:
    pinned = 'to_apply=%add, frontend_attributes={_xla_stream_annotation="3"}'
    text = schedule(f"start a {TP}", f"start b {DP}", "done a", "done b").replace(
        "to_apply=%add", pinned, 1
    )
    pairs = find_async_pairs(parse_module(text))
    assert pairs[0].annotation == 3
    assignment = assign_streams(pairs, 4, "interval")
    assert assignment.stream_of == {"a": 3, "b": 0} and not assignment.reassigned
    assignment = assign_streams(pairs, 2, "interval")
    assert assignment.stream_of == {"a": 0, "b": 1}
    assert assignment.reassigned == {"a": "annotation 3 names a stream >= K=2"}


def test_pins_the_rule_cannot_honour_are_reassigned() -> None:
    text = schedule(f"start a {TP}", f"start b {TP}", "done a", "done b")
    text = text.replace(
        "to_apply=%add", 'to_apply=%add, frontend_attributes={_xla_stream_annotation="1"}', 1
    )
    text = text.replace("%b = f32[1024,1024]{1,0} all-reduce-start(%p), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%add",
                        "%b = f32[1024,1024]{1,0} all-reduce-start(%p), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%add, frontend_attributes={_xla_stream_annotation=\"2\"}")  # fmt: skip
    pairs = find_async_pairs(parse_module(text))
    assert [p.annotation for p in pairs] == [1, 2]
    assignment = assign_streams(pairs, 4, "interval")
    assert assignment.stream_of == {"a": 1, "b": 1}
    assert "deadlock rule ties it to '%a'" in assignment.reassigned["b"]
    verify_streams(pairs, assignment, parse_module(text))


def inner_all_reduce(name: str) -> list[str]:
    """The lines of computation ``name``: one TP all-reduce pair, ``%inner``, with compute
    between its start and done."""
    return [
        f"%{name} (x: f32[64]) -> f32[64] {{",
        "  %x = f32[64]{0} parameter(0)",
        f"  %inner = f32[64]{{0}} all-reduce-start(%x), channel_id=2, replica_groups={TP}, use_global_device_ids=true, to_apply=%add",
        "  %e = f32[64]{0} exponential(%x)",
        "  ROOT %inner.done = f32[64]{0} all-reduce-done(%inner)",
        "}",
    ]


# %shared is called twice; at its second call a DP collective of ENTRY is in flight.
CALLED_TWICE = "\n".join(
    [
        "HloModule calls, is_scheduled=true, num_partitions=8",
        "",
        *ADD_REDUCER.splitlines(),
        "",
        *inner_all_reduce("shared"),
        "",
        "ENTRY %main (p: f32[64]) -> f32[64] {",
        "  %p = f32[64]{0} parameter(0)",
        "  %c1 = f32[64]{0} call(%p), to_apply=%shared",
        "  %outer = f32[64]{0} all-reduce-start(%p), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add",
        "  %c2 = f32[64]{0} call(%c1), to_apply=%shared",
        "  %outer.done = f32[64]{0} all-reduce-done(%outer)",
        "  ROOT %r = f32[64]{0} add(%c2, %outer.done)",
        "}",
        "",
    ]
)


def test_every_call_of_a_computation_counts() -> None:
    module = parse_module(CALLED_TWICE)
    pairs = {p.start: p for p in find_async_pairs(module)}
    assert len(pairs["inner"].occurrences) == 2
    assert pairs["outer"].overlaps(pairs["inner"])
    assignment = assign_streams(list(pairs.values()), 4, "interval")
    assert assignment.stream_of == {"inner": 0, "outer": 0}
    # verify-streams walks both calls: splitting them is caught.
    broken = type(assignment)(4, "interval", {"inner": 1, "outer": 0})
    with pytest.raises(VerificationError, match="deadlock rule broken"):
        verify_streams(list(pairs.values()), broken, module)


def test_the_walk_counts_every_instruction_it_executes(monkeypatch: pytest.MonkeyPatch) -> None:
    # ENTRY's 6, %shared's 4 at each of its 2 calls, %add's 3 (a computation no call
    # reaches is walked once on its own): 17. The walk visits only where something
    # happens; what it skips still counts.
    from xla_streams.streams import verify

    module = parse_module(CALLED_TWICE)
    pairs = find_async_pairs(module)
    assignment = assign_streams(pairs, 4, "interval")
    monkeypatch.setattr(verify, "MAX_WALK", 17)
    verify_streams(pairs, assignment, module)
    monkeypatch.setattr(verify, "MAX_WALK", 16)
    with pytest.raises(VerificationError, match="more than 16 instructions"):
        verify_streams(pairs, assignment, module)


@pytest.mark.parametrize("bad", [0, 65, -1])
def test_stream_bound_is_checked(bad: int) -> None:
    with pytest.raises(ValueError, match="1 to 64"):
        assign_streams([], bad, "interval")


@pytest.mark.parametrize("text", ["0", "65", "-1", "four", "2.5", "", "+4", "\u0664", "4_0"])
def test_stream_count_from_text_is_ascii_digits_in_range(text: str) -> None:
    assert STREAMS.read(" 8 ") == 8
    with pytest.raises(ValueError, match="expected an integer from 1 to 64"):
        STREAMS.read(text)
    with pytest.raises(ValueError, match="not True"):
        check_streams(True)  # bool is no count
    with pytest.raises(ValueError, match=re.escape("streams=True is not valid")):
        AssignStreams(streams=True)


def test_pairs_in_a_while_body_overlap_a_pair_spanning_the_loop() -> None:
    text = "\n".join(
        [
            "HloModule loop, is_scheduled=true, num_partitions=8",
            "",
            *ADD_REDUCER.splitlines(),
            "",
            *inner_all_reduce("body"),
            "",
            "%cond (y: f32[64]) -> pred[] {",
            "  %y = f32[64]{0} parameter(0)",
            "  ROOT %t = pred[] constant(true)",
            "}",
            "",
            "ENTRY %main (p: f32[64]) -> f32[64] {",
            "  %p = f32[64]{0} parameter(0)",
            f"  %outer = f32[64]{{0}} all-reduce-start(%p), channel_id=1, replica_groups={TP}, use_global_device_ids=true, to_apply=%add",
            "  %w = f32[64]{0} while(%p), condition=%cond, body=%body",
            "  %outer.done = f32[64]{0} all-reduce-done(%outer)",
            "  ROOT %r = f32[64]{0} add(%w, %outer.done)",
            "}",
            "",
        ]
    )
    pairs = {p.start: p for p in find_async_pairs(parse_module(text))}
    assert pairs["outer"].overlaps(pairs["inner"])
    # Same groups across the loop boundary: the deadlock rule ties them.
    assert set(streams_of(text, 4).values()) == {0}
    assert streams_of(text.replace(TP, DP, 1), 4) == {"outer": 0, "inner": 1}


def test_verify_names_both_pairs_when_the_deadlock_rule_is_broken() -> None:
    text = schedule(f"start a {TP}", f"start b {TP}", "done a", "done b")
    pairs = find_async_pairs(parse_module(text))
    assignment = assign_streams(pairs, 2, "interval")
    broken = type(assignment)(2, "interval", {"a": 0, "b": 1})
    with pytest.raises(VerificationError, match=r"'%a'.*'%b'"):
        verify_streams(pairs, broken)
    out_of_range = type(assignment)(2, "interval", {"a": 0, "b": 2})
    with pytest.raises(VerificationError, match="outside 0..1"):
        verify_streams(pairs, out_of_range)


def test_assignment_is_a_pure_function_of_the_text(tmp_path: Path) -> None:
    """Processes with different hash seeds (as on different hosts) agree exactly."""
    text = schedule(
        f"start a {TP}", f"start b {DP}", "start c {{0,1}}", "done a", f"start d {DP}",
        "done b", "done c", "done d",
    )  # fmt: skip
    path = tmp_path / "m.hlo"
    path.write_text(text)
    code = (
        "import sys, json\n"
        "from xla_streams.hlo import parse_module\n"
        "from xla_streams.streams import assign_streams, find_async_pairs\n"
        "pairs = find_async_pairs(parse_module(open(sys.argv[1]).read()))\n"
        "a = assign_streams(pairs, 2, 'interval')\n"
        "print(json.dumps([a.stream_of, sorted(a.serialized)]))\n"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code, str(path)],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("0", "1", "12345")
    }
    assert len(outputs) == 1
    assert json.loads(outputs.pop())[0] == streams_of(text, 2)


# -- properties over random schedules ------------------------------------------

_GROUP_SETS = [
    ((0, 1, 2, 3), (4, 5, 6, 7)),
    ((0, 4), (1, 5), (2, 6), (3, 7)),
    ((0, 1), (2, 3), (4, 5), (6, 7)),
    ((0, 1, 2, 3, 4, 5, 6, 7),),
    ((0, 2), (1, 3), (4, 6), (5, 7)),
]


@st.composite
def random_pairs(draw: st.DrawFn, pins: bool = True) -> list[AsyncPair]:
    """Random intervals; with ``pins``, sync pairs on stream 0 and annotations."""
    n = draw(st.integers(0, 14))
    # 2n distinct event times shuffled into n intervals.
    times = draw(st.permutations(list(range(1, 2 * n + 1))))
    pairs = []
    for i in range(n):
        a, b = sorted((times[2 * i], times[2 * i + 1]))
        sync = draw(st.booleans()) and draw(st.booleans())
        pairs.append(
            AsyncPair(
                computation="main",
                start=f"s{i}",
                done=f"d{i}",
                kind="all-reduce",
                start_index=a,
                done_index=b,
                start_time=a,
                done_time=b,
                sync=sync,
                pipelined=False,
                groups=draw(st.sampled_from(_GROUP_SETS)),
                bytes=1024,
                lane="communication" if pins or not sync else "compute",
                annotation=draw(st.none() | st.integers(0, 9)) if pins else None,
            )
        )
    return sorted(pairs, key=lambda p: p.start_time)


def _rule_breaks(pairs: list[AsyncPair], assignment: StreamAssignment) -> list[str]:
    """What ``assignment`` gets wrong, checked from the definitions pair by pair, with
    none of the code under test (verify-streams, ``InFlight``, ``AsyncPair``'s
    predicates): each pair has a stream entry; one on the communication lane a stream
    in 0..K-1, stream 0 when sync, the others none; and no two pairs in flight together
    whose groups share two or more devices are on different streams."""
    stream_of = assignment.stream_of
    wrong = []
    if sorted(stream_of) != sorted(p.start for p in pairs):
        wrong.append(f"streams for {sorted(stream_of)}, pairs {sorted(p.start for p in pairs)}")
    for p in pairs:
        stream = stream_of.get(p.start)
        if p.lane != "communication":
            ok = stream is None
        elif p.sync:
            ok = stream == 0
        else:
            ok = stream in range(assignment.streams)
        if not ok:
            wrong.append(f"{p.start} ({p.lane}, sync={p.sync}) on stream {stream}")
    placed = [p for p in pairs if p.lane == "communication"]
    for p, q in combinations(placed, 2):
        together = any(a < d and c < b for a, b in p.occurrences for c, d in q.occurrences)
        share = any(len(set(g) & set(h)) >= 2 for g in p.groups for h in q.groups)
        if together and share and stream_of.get(p.start) != stream_of.get(q.start):
            wrong.append(f"{p.start} and {q.start} share devices in flight on two streams")
    return wrong


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(random_pairs(), st.integers(1, 8), st.sampled_from(["interval", "round-robin"]))
def test_any_assignment_verifies(pairs: list[AsyncPair], streams: int, policy: str) -> None:
    assignment = assign_streams(pairs, streams, policy)  # type: ignore[arg-type]
    assert _rule_breaks(pairs, assignment) == []
    # A pin below K is kept, or the assignment says why not.
    for p in pairs:
        if not p.sync and p.annotation is not None and p.start not in assignment.reassigned:
            assert assignment.stream_of[p.start] == p.annotation < streams, p.start
    verify_streams(pairs, assignment)


@settings(max_examples=100, deadline=None)
@given(random_pairs(), st.lists(st.integers(1, 8), min_size=1, max_size=4, unique=True))
def test_assigning_many_k_at_once_is_assigning_each_alone(
    pairs: list[AsyncPair], streams: list[int]
) -> None:
    """The what-if and the tuner place every (K, policy) from one finding of the rule's
    units: no placement may change what the next one sees."""
    policies = ("round-robin", "interval")
    together = assign_each(pairs, streams, policies)
    assert list(together) == [(k, policy) for policy in policies for k in streams]
    for (k, policy), assignment in together.items():
        assert assignment == assign_streams(pairs, k, policy)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(random_pairs(), st.integers(1, 4), st.data())
def test_verify_streams_refuses_exactly_what_breaks_the_rule(
    pairs: list[AsyncPair], streams: int, data: st.DataObject
) -> None:
    """verify-streams against the oracle, on assignments made at random: each pair on a
    stream its lane allows (whether the deadlock rule holds is left to chance), and
    sometimes one pair where it cannot be."""

    def allowed(p: AsyncPair) -> st.SearchStrategy[int | None]:
        if p.lane != "communication":
            return st.none()
        return st.just(0) if p.sync else st.integers(0, streams - 1)

    stream_of = {p.start: data.draw(allowed(p)) for p in pairs}
    if pairs and data.draw(st.booleans()):
        p = data.draw(st.sampled_from(pairs))
        wrong = st.sampled_from([None, streams]) if p.lane == "communication" else st.just(0)
        stream_of[p.start] = data.draw(wrong)
    assignment = replace(assign_streams(pairs, streams, "interval"), stream_of=stream_of)
    breaks = _rule_breaks(pairs, assignment)
    if breaks:
        with pytest.raises(VerificationError):
            verify_streams(pairs, assignment)
    else:
        verify_streams(pairs, assignment)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(random_pairs(pins=False))
def test_interval_with_enough_streams_serializes_only_what_the_rule_forces(
    pairs: list[AsyncPair],
) -> None:
    placed = [p for p in pairs if p.needs_stream]
    streams = max(1, max_in_flight(placed))
    assignment = assign_streams(pairs, streams, "interval")
    assert not assignment.serialized_by_bound
    units = tied_units(placed)
    # Every pair serialized by the rule overlaps a pair it is tied to.
    for unit in units:
        for p in unit:
            if p.start in assignment.serialized_by_rule:
                assert any(q is not p and q.overlaps(p) for q in unit)
    # Interval colouring of the units' spans is optimal: as many streams as the
    # most units in flight at once, never more.
    spans = []
    for u in units:
        end = max(p.done_time for p in u)
        spans.append(
            AsyncPair(
                **{**_fields(u[0]), "done_time": end, "occurrences": ((u[0].start_time, end),)}
            )
        )
    assert assignment.streams_used == max_in_flight(spans)


def _fields(p: AsyncPair) -> dict[str, object]:
    return {k: getattr(p, k) for k in AsyncPair.__dataclass_fields__ if not k.startswith("_")}


def test_the_send_and_recv_of_one_permute_share_a_stream_even_apart() -> None:
    """They never overlap here, yet stay on one stream: some XLA versions key the
    communicator by stream, and a send on one stream never meets a recv on another."""
    pairs = "{{0,1},{1,2},{2,3},{3,0}}"
    text = "\n".join(
        [
            "HloModule p2p, is_scheduled=true, num_partitions=4",
            "",
            "ENTRY %main (p: f32[64]) -> f32[64] {",
            "  %p = f32[64]{0} parameter(0)",
            "  %tok = token[] after-all()",
            f'  %recv = (f32[64]{{0}}, u32[], token[]) recv(%tok), channel_id=7, frontend_attributes={{_xla_send_recv_source_target_pairs="{pairs}"}}',
            "  %w1 = f32[64]{0} exponential(%p)",
            "  %recv-done = (f32[64]{0}, token[]) recv-done(%recv), channel_id=7",
            f'  %send = (f32[64]{{0}}, u32[], token[]) send(%p, %tok), channel_id=7, frontend_attributes={{_xla_send_recv_source_target_pairs="{pairs}"}}',
            "  %w2 = f32[64]{0} exponential(%p)",
            "  %send-done = token[] send-done(%send), channel_id=7",
            "  ROOT %out = f32[64]{0} exponential(%w2)",
            "}",
            "",
        ]
    )
    module = parse_module(text)
    found = find_async_pairs(module)
    assert [(p.kind, p.channel) for p in found] == [("recv", 7), ("send", 7)]
    assert not found[0].overlaps(found[1])
    for policy in ("interval", "round-robin"):
        assignment = assign_streams(found, 4, policy)  # type: ignore[arg-type]
        assert assignment.stream_of["recv"] == assignment.stream_of["send"]
    apart = type(assignment)(4, "interval", {"recv": 0, "send": 1})
    with pytest.raises(VerificationError, match="send and recv of one permute"):
        verify_streams(found, apart, module)
