"""The deadlock rule at scale, and as strict as XLA's.

* ``tied_units`` and verify-streams find the pairs that share two or more devices
  through ``streams.rule.InFlight`` (groups indexed by device, answers remembered per
  couple of groupings); they give the same units and the same verdicts as the
  pair-by-pair definition (``streams.rule.must_share_stream``), checked here on every
  fixture and on random pairs.
* Modules built to make a pair-by-pair rule quadratic finish in seconds (the bounds
  are generous: 10 s for what takes well under one; a return to quadratic takes
  minutes), and one built to exceed the rule's work budget is refused with an error
  at its file, line and column.
* Collectives launched together by one ``async-start`` (a collectives group) are one
  pair with the groups of all, as XLA sees them; the 3-cycle of collectives that
  pairwise share one device stays on three streams (the rule's docstring says why).
"""

from __future__ import annotations

import itertools
import re
import time
from pathlib import Path

import pytest
from bench.hostile import all_reduces
from bench.hostile import module as hostile_module
from conftest import ADD_REDUCER, alarm
from hypothesis import given, settings
from hypothesis import strategies as st

from xla_streams.hlo import HloError, Instruction, parse_module
from xla_streams.passes.base import Compilation
from xla_streams.pipeline import PassManager, build_pipeline
from xla_streams.streams import (
    AsyncPair,
    RuleWorkExceeded,
    StreamAssignment,
    VerificationError,
    assign_streams,
    find_async_pairs,
    must_share_stream,
    tied_units,
    verify_streams,
)
from xla_streams.streams.pairs import in_flight_order

REPO = Path(__file__).resolve().parents[2]
FIXTURES = sorted((REPO / "hlo_fixtures").glob("*.hlo"))
BOUND_S = 10.0


# -- the definition, pair by pair (what the index must agree with) ----------------------


def reference_units(pairs: list[AsyncPair]) -> list[list[str]]:
    """The ties of every couple the rule ties, taken transitively; and, as tied_units
    says it does, every send and recv of one channel together."""
    index = {p.start: i for i, p in enumerate(pairs)}
    parent = list(range(len(pairs)))

    def find(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for i, p in enumerate(pairs):
        for q in pairs[:i]:
            if must_share_stream(p, q):
                parent[find(i)] = find(index[q.start])
    first: dict[int, int] = {}
    for p in pairs:
        if p.kind in ("send", "recv") and p.channel is not None:
            parent[find(index[p.start])] = find(first.setdefault(p.channel, index[p.start]))
    units: dict[int, list[AsyncPair]] = {}
    for p in sorted(pairs, key=lambda p: (p.start_time, p.start)):
        units.setdefault(find(index[p.start]), []).append(p)
    return names(sorted(units.values(), key=lambda u: (u[0].start_time, u[0].start)))


def names(units: list[list[AsyncPair]]) -> list[list[str]]:
    return [[p.start for p in unit] for unit in units]


def reference_violation(pairs: list[AsyncPair], stream_of: dict[str, int | None]) -> bool:
    return any(
        stream_of[p.start] != stream_of[q.start] and must_share_stream(p, q)
        for i, p in enumerate(pairs)
        for q in pairs[:i]
    )


@pytest.mark.slow
@pytest.mark.parametrize("path", FIXTURES, ids=[p.name for p in FIXTURES])
def test_the_index_ties_what_the_definition_ties_on_every_fixture(path: Path) -> None:
    pairs = [
        p for p in find_async_pairs(parse_module(path.read_text(), str(path))) if p.needs_stream
    ]
    assert names(tied_units(pairs)) == reference_units(pairs)


@st.composite
def random_pairs(draw: st.DrawFn, devices: int = 8, most: int = 14) -> list[AsyncPair]:
    pairs = []
    for k in range(draw(st.integers(1, most))):
        occurrences = []
        at = draw(st.integers(0, 10))
        for _ in range(draw(st.integers(1, 3))):
            begin = at + draw(st.integers(0, 8))
            end = begin + draw(st.integers(1, 12))
            occurrences.append((begin, end))
            at = end
        shape = draw(st.sampled_from(["partition", "pairs", "any"]))
        if shape == "partition":  # replica groups: disjoint, covering some devices
            order = draw(st.permutations(range(devices)))
            cuts = sorted(draw(st.sets(st.integers(1, devices - 1), max_size=devices - 1)))
            bounds = [0, *cuts, devices]
            groups = [tuple(order[a:b]) for a, b in itertools.pairwise(bounds)]
        else:  # permute pairs (a device in two, {d,d}) or groups that overlap
            size = 2 if shape == "pairs" else draw(st.integers(1, 4))
            groups = draw(
                st.lists(
                    st.lists(st.integers(0, devices - 1), min_size=size, max_size=size),
                    min_size=1,
                    max_size=5,
                )
            )
        kind = draw(st.sampled_from(["all-reduce", "collective-permute", "send", "recv"]))
        (a, b) = occurrences[0]
        pairs.append(
            AsyncPair(
                "main", f"s{k}", f"d{k}", kind, a, b, a, b, False, False,
                tuple(tuple(g) for g in groups), 64,
                channel=draw(st.sampled_from([None, 1, 2])) if kind in ("send", "recv") else None,
                occurrences=tuple(occurrences),
            )
        )  # fmt: skip
    return pairs


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(random_pairs())
def test_the_index_ties_what_the_definition_ties(pairs: list[AsyncPair]) -> None:
    assert names(tied_units(pairs)) == reference_units(pairs)


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(random_pairs(devices=40, most=60))
def test_the_device_index_path_agrees_too(pairs: list[AsyncPair]) -> None:
    """Many distinct small groupings in flight: the index looks devices up instead of
    comparing groupings (it picks that way when groupings outnumber devices 4 to 1)."""
    assert names(tied_units(pairs)) == reference_units(pairs)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(random_pairs(), st.randoms(use_true_random=False))
def test_verify_finds_a_broken_rule_exactly_when_the_definition_does(
    pairs: list[AsyncPair], rng: object
) -> None:
    placed = [p for p in pairs if p.kind not in ("send", "recv")]  # channels aside
    stream_of: dict[str, int | None] = {p.start: rng.randrange(3) for p in placed}  # type: ignore[attr-defined]
    assignment = StreamAssignment(3, "interval", stream_of)
    broken = reference_violation(placed, stream_of)
    if broken:
        with pytest.raises(VerificationError, match="deadlock rule broken"):
            verify_streams(placed, assignment)
    else:
        verify_streams(placed, assignment)


def reference_serialized(pairs: list[AsyncPair], stream_of: dict[str, int | None],
                         unit_of: dict[str, int]) -> tuple[set[str], set[str]]:  # fmt: skip
    by_bound: set[str] = set()
    by_rule: set[str] = set()
    active: list[tuple[int, AsyncPair]] = []
    for begin, end, p in in_flight_order(pairs):
        active = [(done, q) for done, q in active if done > begin]
        for _, q in active:
            if q is not p and stream_of[q.start] == stream_of[p.start]:
                (by_rule if unit_of[q.start] == unit_of[p.start] else by_bound).add(p.start)
        active.append((end, p))
    return by_bound - by_rule, by_rule


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(random_pairs(), st.integers(1, 4), st.sampled_from(["interval", "round-robin"]))
def test_serialized_counts_what_the_pairwise_sweep_counts(
    pairs: list[AsyncPair], streams: int, policy: str
) -> None:
    assignment = assign_streams(pairs, streams, policy)  # type: ignore[arg-type]
    unit_of = {p.start: u for u, unit in enumerate(tied_units(pairs)) for p in unit}
    by_bound, by_rule = reference_serialized(pairs, assignment.stream_of, unit_of)
    assert (assignment.serialized_by_bound, assignment.serialized_by_rule) == (by_bound, by_rule)


# -- hostile modules --------------------------------------------------------------------


def module(header: str, starts: list[str], dones: list[str]) -> str:
    return hostile_module("hostile", header, starts, dones)


def rings(n: int, steps: tuple[int, int]) -> str:
    starts, dones = [], []
    for k, step in enumerate(steps):
        pairs = ",".join(f"{{{i},{(i + step) % n}}}" for i in range(n))
        starts.append(
            f"%s{k} = (f32[8]{{0}}, f32[8]{{0}}) collective-permute-start(%p), "
            f"channel_id={k + 1}, source_target_pairs={{{pairs}}}"
        )
        dones.append(f"%d{k} = f32[8]{{0}} collective-permute-done(%s{k})")
    return module(f"num_partitions={n}", starts, dones)


HOSTILE = {
    # two replica-mode all-reduces: 65,536 groups of one device each
    "singletons-65536": module("num_partitions=65536", *all_reduces(["{}", "{}"], channel=False)),
    # two all-reduces over 65,536 devices whose groups of two never share two devices
    "pairs-65536": module(
        "num_partitions=65536", *all_reduces(["[32768,2]<=[65536]", "[32768,2]<=[2,32768]T(1,0)"])
    ),
    # two 16,384-device permute rings, i -> i+1 and i -> i+2
    "rings-16384": rings(16384, (1, 2)),
    # 1,000 and 2,000 all-reduces of 8 singleton groups, all in flight
    "in-flight-1000": module("num_partitions=8", *all_reduces(["{}"] * 1000, channel=False)),
    "in-flight-2000": module("num_partitions=8", *all_reduces(["{}"] * 2000, channel=False)),
    # 2,000 in flight over the same 4 pairs of devices (tied: one unit)
    "in-flight-2000-tied": module(
        "num_partitions=8", *all_reduces(["{{0,1},{2,3},{4,5},{6,7}}"] * 2000)
    ),
    # 2,000 in flight, each over two devices of its own: 2,000 distinct groupings
    "in-flight-2000-distinct": module(
        "num_partitions=4000", *all_reduces([f"{{{{{2 * i},{2 * i + 1}}}}}" for i in range(2000)])
    ),
}


def run_pipeline(text: str, path: str = "hostile.hlo", streams: int = 4) -> Compilation:
    """Parse, find-async-pairs, assign-streams, verify-streams (what `assign` runs); a
    run past 3 x BOUND_S fails (TimeoutError) rather than stalls the suite."""
    passes = build_pipeline(streams, runtime=None)
    with alarm(int(BOUND_S) * 3):
        return PassManager(passes).run(Compilation(parse_module(text, path)))


@pytest.mark.slow
@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_modules_are_answered_in_seconds(text: str) -> None:
    start = time.perf_counter()
    compilation = run_pipeline(text)
    elapsed = time.perf_counter() - start
    assert elapsed < BOUND_S, f"{elapsed:.1f} s"
    assert compilation.assignment is not None and compilation.pairs


@pytest.mark.slow
def test_what_the_hostile_modules_tie() -> None:
    untied = ["singletons-65536", "pairs-65536", "rings-16384", "in-flight-2000-distinct"]
    for name in untied:
        pairs = [p for p in run_pipeline(HOSTILE[name]).pairs if p.needs_stream]
        assert all(len(u) == 1 for u in tied_units(pairs)), name
    pairs = [p for p in run_pipeline(HOSTILE["in-flight-2000-tied"]).pairs if p.needs_stream]
    assert [len(u) for u in tied_units(pairs)] == [2000]
    # a ring and its reverse share both devices of every pair: tied
    pairs = list(run_pipeline(rings(64, (1, -1))).pairs)
    assert [len(u) for u in tied_units(pairs)] == [2]


def hub(n: int, width: int = 7) -> str:
    groups = [
        "{{0," + ",".join(str(1 + i * width + k) for k in range(width)) + "}}" for i in range(n)
    ]
    return module("num_partitions=65536", *all_reduces(groups))


def test_a_module_past_the_work_budget_is_refused_with_a_located_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every all-reduce meets every one in flight at device 0: n^2/2 steps. With the
    budget lowered the test stays quick; the error points at the start that ran out."""
    import xla_streams.streams.rule as rule

    monkeypatch.setattr(rule, "MAX_RULE_WORK", 50_000)
    text = hub(600)
    with pytest.raises(HloError) as err:
        run_pipeline(text)
    head = str(err.value).split("\n", 1)[0]
    assert re.match(
        r"hostile\.hlo:\d+:\d+: error: the deadlock rule needs more than 50000 steps", head
    )
    assert text.split("\n")[err.value.line - 1].lstrip().startswith("%s")
    # Under the budget the same kind of module is assigned.
    run_pipeline(hub(100))


def test_the_budget_bounds_verify_too(monkeypatch: pytest.MonkeyPatch) -> None:
    import xla_streams.streams.rule as rule

    compilation = run_pipeline(hub(300))
    assert compilation.assignment is not None
    monkeypatch.setattr(rule.InFlight.__init__, "__defaults__", (1_000,))
    with pytest.raises(HloError, match="deadlock rule needs more than 1000 steps"):
        verify_streams(compilation.pairs, compilation.assignment, compilation.module)
    with pytest.raises(VerificationError, match="needs more than 1000 steps"):
        verify_streams(compilation.pairs, compilation.assignment)
    with pytest.raises(RuleWorkExceeded):
        tied_units([p for p in compilation.pairs if p.needs_stream], budget=1_000)


# -- an async-update chain that loops (only an edited module can hold one) --------------

UPDATES = f"""\
HloModule updates, is_scheduled=true, num_partitions=2

{ADD_REDUCER}
%wrapped (x: f32[8]) -> f32[8] {{
  %x = f32[8]{{0}} parameter(0)
  ROOT %ar = f32[8]{{0}} all-reduce(%x), channel_id=1, replica_groups={{{{0,1}}}}, use_global_device_ids=true, to_apply=%add
}}

ENTRY %main (p: f32[8]) -> f32[8] {{
  %p = f32[8]{{0}} parameter(0)
  %s = ((f32[8]{{0}}), f32[8]{{0}}, u32[]) async-start(%p), calls=%wrapped
  %u1 = ((f32[8]{{0}}), f32[8]{{0}}, u32[]) async-update(%s), calls=%wrapped
  %u2 = ((f32[8]{{0}}), f32[8]{{0}}, u32[]) async-update(%u1), calls=%wrapped
  ROOT %d = f32[8]{{0}} async-done(%u2), calls=%wrapped
}}
"""


def test_an_async_update_chain_through_updates_is_followed() -> None:
    pairs = find_async_pairs(parse_module(UPDATES))
    assert [(p.start, p.done, p.kind) for p in pairs] == [("s", "d", "all-reduce")]


def test_an_async_update_chain_that_loops_is_an_error_not_a_hang() -> None:
    module = parse_module(UPDATES, "loop.hlo")
    main = module.entry
    u1 = main.get("u1")
    assert u1 is not None
    # u1 now reads u2, which reads u1: a loop the text itself cannot spell.
    looped = Instruction.create(
        main, "u1", u1.shape_text, "async-update", "%u2", {"calls": "%wrapped"}
    )
    main.replace(u1, looped)
    with alarm(10), pytest.raises(HloError, match="async-update chain of async-done '%d' loops"):
        find_async_pairs(module)


# -- stream annotations and channel ids: ASCII digits ----------------------------------

ONE_PAIR = f"""\
HloModule m, is_scheduled=true, num_partitions=2

{ADD_REDUCER}
ENTRY %main (p: f32[8]) -> f32[8] {{
  %p = f32[8]{{0}} parameter(0)
  %s = f32[8]{{0}} all-reduce-start(%p), channel_id=1, replica_groups={{{{0,1}}}}, use_global_device_ids=true, to_apply=%add, frontend_attributes={{_xla_stream_annotation="ANNOTATION"}}
  %w = f32[8]{{0}} exponential(%p)
  %d = f32[8]{{0}} all-reduce-done(%s)
  ROOT %r = f32[8]{{0}} add(%d, %w)
}}
"""


@pytest.mark.parametrize("value", ["\u00b2", "\u0661", "\uff11", "1\u00b2", "-1", " 1", "1234567"])
def test_a_stream_annotation_is_ascii_digits_or_a_located_error(value: str) -> None:
    text = ONE_PAIR.replace("ANNOTATION", value)
    with pytest.raises(HloError) as err:
        run_pipeline(text, "pin.hlo")
    assert "is not a stream number" in err.value.message
    line = text.split("\n")[err.value.line - 1]
    assert line[err.value.column - 1 :].startswith(value)


def test_an_ascii_annotation_is_read() -> None:
    pairs = find_async_pairs(parse_module(ONE_PAIR.replace("ANNOTATION", "3")))
    assert [p.annotation for p in pairs] == [3]


@pytest.mark.parametrize("value", ["\u00b2", "\u0661", "x"])
def test_a_channel_id_is_ascii_digits_or_a_located_error(value: str) -> None:
    text = ONE_PAIR.replace("ANNOTATION", "0").replace("channel_id=1", f"channel_id={value}")
    with pytest.raises(HloError, match="is not a number") as err:
        run_pipeline(text, "channel.hlo")
    assert (err.value.path, err.value.line) == ("channel.hlo", 11)


# -- collectives groups: one pair with the groups of all (XLA's view) -------------------

GROUP = f"""\
HloModule grp, is_scheduled=true, num_partitions=4

{ADD_REDUCER}
%group (g: f32[8]) -> (f32[8], f32[8]) {{
  %g = f32[8]{{0}} parameter(0)
  %ar1 = f32[8]{{0}} all-reduce(%g), channel_id=1, replica_groups={{{{0,1}},{{2,3}}}}, use_global_device_ids=true, to_apply=%add
  %ar2 = f32[8]{{0}} all-reduce(%g), channel_id=2, replica_groups={{{{0,2}},{{1,3}}}}, use_global_device_ids=true, to_apply=%add
  ROOT %t = (f32[8]{{0}}, f32[8]{{0}}) tuple(%ar1, %ar2)
}}

ENTRY %main (p: f32[8]) -> f32[8] {{
  %p = f32[8]{{0}} parameter(0)
  %gs = ((f32[8]{{0}}), (f32[8]{{0}}, f32[8]{{0}})) async-start(%p), calls=%group, frontend_attributes={{_collectives_group="true"}}
  %s = f32[8]{{0}} all-reduce-start(%p), channel_id=3, replica_groups=OTHER, use_global_device_ids=true, to_apply=%add
  %w = f32[8]{{0}} exponential(%p)
  %gd = (f32[8]{{0}}, f32[8]{{0}}) async-done(%gs)
  %d = f32[8]{{0}} all-reduce-done(%s)
  %g0 = f32[8]{{0}} get-tuple-element(%gd), index=0
  ROOT %r = f32[8]{{0}} add(%g0, %d)
}}
"""


def test_a_collectives_group_is_one_pair_with_the_groups_of_all() -> None:
    text = GROUP.replace("OTHER", "{{0,1,2,3}}")
    pairs = find_async_pairs(parse_module(text))
    assert [(p.start, p.done) for p in pairs] == [("gs", "gd"), ("s", "d")]
    assert pairs[0].groups == ((0, 1), (2, 3), (0, 2), (1, 3))


@pytest.mark.parametrize(
    ("other", "tied"),
    [
        ("{{0,1,2,3}}", True),  # shares 2 devices with every group of the group
        ("{{0,3},{1,2}}", False),  # shares 1 device with each (a diagonal)
        ("{{1,3},{0,2}}", True),  # the second collective's own groups
    ],
)
def test_a_collectives_group_is_tied_as_xla_sees_it(other: str, tied: bool) -> None:
    compilation = run_pipeline(GROUP.replace("OTHER", other))
    assert compilation.assignment is not None
    streams = compilation.assignment.stream_of
    assert (streams["gs"] == streams["s"]) is tied
    if tied:  # and on different streams verify says the rule is broken
        broken = StreamAssignment(4, "interval", {"gs": 0, "s": 1})
        with pytest.raises(VerificationError, match="deadlock rule broken"):
            verify_streams(compilation.pairs, broken, compilation.module)


# -- the 3-cycle: not tied, as XLA (see xla_streams/streams/rule.py) --------------------

THREE_CYCLE = f"""\
HloModule three_cycle, is_scheduled=true, num_partitions=3

{ADD_REDUCER}
ENTRY %main (p: f32[1024]) -> f32[1024] {{
  %p = f32[1024]{{0}} parameter(0)
  %a = f32[1024]{{0}} all-reduce-start(%p), channel_id=1, replica_groups={{{{0,2}},{{1}}}}, use_global_device_ids=true, to_apply=%add
  %b = f32[1024]{{0}} all-reduce-start(%p), channel_id=2, replica_groups={{{{0,1}},{{2}}}}, use_global_device_ids=true, to_apply=%add
  %c = f32[1024]{{0}} all-reduce-start(%p), channel_id=3, replica_groups={{{{1,2}},{{0}}}}, use_global_device_ids=true, to_apply=%add
  %work = f32[1024]{{0}} exponential(%p)
  %a.done = f32[1024]{{0}} all-reduce-done(%a)
  %b.done = f32[1024]{{0}} all-reduce-done(%b)
  %c.done = f32[1024]{{0}} all-reduce-done(%c)
  %ab = f32[1024]{{0}} add(%a.done, %b.done)
  %abc = f32[1024]{{0}} add(%ab, %c.done)
  ROOT %r = f32[1024]{{0}} add(%abc, %work)
}}
"""


def test_three_collectives_that_pairwise_share_one_device_stay_on_three_streams() -> None:
    """A-B share rank 0, B-C rank 1, C-A rank 2: a cycle of the 'shares a device' graph,
    all three in flight together. The rule (XLA's) ties no two of them."""
    compilation = run_pipeline(THREE_CYCLE, streams=4)
    pairs = list(compilation.pairs)
    assert [p.start for p in pairs] == ["a", "b", "c"]
    assert all(
        p.overlaps(q) and not must_share_stream(p, q) for p in pairs for q in pairs if p is not q
    )
    assert [len(u) for u in tied_units(pairs)] == [1, 1, 1]
    assignment = compilation.assignment
    assert assignment is not None
    assert [assignment.stream_of[n] for n in "abc"] == [0, 1, 2]
    assert not assignment.serialized
    # and on one stream, as a stricter rule would put them, verify is content too
    verify_streams(pairs, StreamAssignment(4, "interval", {"a": 0, "b": 0, "c": 0}))
