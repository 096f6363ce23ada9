"""The deadlock rule on random scheduled modules, checked by a checker of its own.

Random modules have shared callees (a computation called from two places),
nested while loops, sync collectives inside async intervals, pairs XLA will make
synchronous (nothing to overlap) and annotations already in the module. Each is
run through the native pipeline (what the plugin runs) for K in 1..8 and both
policies, under both stream models, and the annotated text is handed to
``violations`` below: an interpreter written for this test alone (regular
expressions over the printed module, no code of xla_streams), which executes the
program in schedule order, entering every call, and reports any two
collectives in flight together on different communication streams whose
groups share two or more devices, and any annotation >= K.
"""

from __future__ import annotations

import re

import pytest
from conftest import ADD_REDUCER
from hypothesis import given, settings
from hypothesis import strategies as st

from xla_streams.collectives import StreamModel
from xla_streams.hlo import parse_module
from xla_streams.passes.base import Compilation
from xla_streams.pipeline import PassManager, build_pipeline

GROUPS = [
    "{{0,1,2,3},{4,5,6,7}}",
    "{{0,4},{1,5},{2,6},{3,7}}",
    "{{0,1},{2,3},{4,5},{6,7}}",
    "{{0,1,2,3,4,5,6,7}}",
    "{{0,2},{1,3},{4,6},{5,7}}",
]
SYNC = 'backend_config={"collective_backend_config":{"is_sync":true}}'
NO_WORK = {"parameter", "constant", "bitcast", "get-tuple-element"}

# -- the checker (independent of xla_streams) ----------------------------------------

_COMPUTATION = re.compile(r"^(?:ENTRY )?%(\S+) \(.*\{$")
_INSTRUCTION = re.compile(r"^  (?:ROOT )?%(\S+) = \S+ ([a-z-]+)\((.*?)\)(.*)$")


def _computations(text: str) -> tuple[str, dict[str, list[tuple[str, str, str, str]]]]:
    comps: dict[str, list[tuple[str, str, str, str]]] = {}
    entry, current = "", None
    for line in text.split("\n"):
        m = _COMPUTATION.match(line)
        if m:
            current = comps.setdefault(m.group(1), [])
            if line.startswith("ENTRY"):
                entry = m.group(1)
            continue
        m = _INSTRUCTION.match(line)
        if m and current is not None:
            current.append((m.group(1), m.group(2), m.group(3), m.group(4)))
    return entry, comps


def _groups(attributes: str) -> list[set[int]]:
    m = re.search(r"replica_groups=\{(\{[^=]*?\})\}", attributes)
    assert m, attributes
    return [set(map(int, g.split(","))) for g in re.findall(r"\{([\d,]+)\}", m.group(1))]


def violations(text: str, streams: int, model: StreamModel) -> list[str]:
    entry, comps = _computations(text)
    found: list[str] = []
    for body in comps.values():
        for name, _, _, attributes in body:
            m = re.search(r'_xla_stream_annotation="(\d+)"', attributes)
            if m and int(m.group(1)) >= streams:
                found.append(f"{name} annotated {m.group(1)} >= K={streams}")

    def stream_of(comp: str, index: int) -> int | None:
        """Where the pair starting at ``index`` runs: a stream, or None (compute)."""
        body = comps[comp]
        name, _, _, attributes = body[index]
        done = next(
            i
            for i, (_, op, operands, _) in enumerate(body)
            if op.endswith("-done") and operands.strip("%") == name
        )
        idle = all(
            op in NO_WORK or op.endswith(("-start", "-done"))
            for _, op, _, _ in body[index + 1 : done]
        )
        if SYNC in attributes or idle:
            if model.sync_on_compute or model.overlap_limit == 1:
                return None
            return 0
        m = re.search(r'_xla_stream_annotation="(\d+)"', attributes)
        return int(m.group(1)) if m else 0

    in_flight: dict[str, tuple[int, list[set[int]]]] = {}
    stack = [(entry, 0)]
    while stack:
        comp, i = stack.pop()
        if i >= len(comps[comp]):
            continue
        stack.append((comp, i + 1))
        name, opcode, operands, attributes = comps[comp][i]
        if opcode.endswith("-start"):
            stream = stream_of(comp, i)
            if stream is not None:
                groups = _groups(attributes)
                for other, (other_stream, other_groups) in in_flight.items():
                    shared = any(len(a & b) >= 2 for a in groups for b in other_groups)
                    if shared and other_stream != stream:
                        found.append(f"{other} on {other_stream} and {name} on {stream}")
                in_flight[name] = (stream, groups)
        elif opcode.endswith("-done"):
            in_flight.pop(operands.strip("%"), None)
        called = re.findall(r"(?:condition|body|to_apply)=%(\S+?)(?:,|$)", attributes)
        if opcode in ("while", "call"):
            for callee in reversed(called):
                stack.append((callee, 0))
    return found


# -- random modules ------------------------------------------------------------------


@st.composite
def modules(draw: st.DrawFn) -> str:
    counter = iter(range(10_000))
    computations: list[str] = []

    def body(depth: int) -> list[str]:
        lines = [f"  %p{next(counter)} = f32[8]{{0}} parameter(0)"]
        value = lines[0].split()[0]
        open_pairs: list[str] = []
        for _ in range(draw(st.integers(1, 8))):
            event = draw(st.sampled_from(["start", "start", "done", "work", "call", "loop"]))
            n = next(counter)
            if event == "start":
                attributes = f"channel_id=1, replica_groups={draw(st.sampled_from(GROUPS))}, use_global_device_ids=true, to_apply=%add"
                if draw(st.integers(0, 4)) == 0:
                    attributes += ", " + SYNC
                if draw(st.integers(0, 3)) == 0:
                    attributes += f', frontend_attributes={{_xla_stream_annotation="{draw(st.integers(0, 9))}"}}'
                lines.append(f"  %s{n} = f32[8]{{0}} all-reduce-start({value}), {attributes}")
                open_pairs.append(f"%s{n}")
            elif event == "done" and open_pairs:
                start = open_pairs.pop(draw(st.integers(0, len(open_pairs) - 1)))
                lines.append(f"  %d{n} = f32[8]{{0}} all-reduce-done({start})")
            elif event == "work":
                lines.append(f"  %w{n} = f32[8]{{0}} exponential({value})")
            elif event == "call" and depth < 2:
                callee = shared(depth + 1)
                for _ in range(draw(st.integers(1, 2))):  # a callee may be called twice
                    lines.append(
                        f"  %c{next(counter)} = f32[8]{{0}} call({value}), to_apply={callee}"
                    )
            elif event == "loop" and depth < 2:
                cond = f"%cond{n}"
                computations.append(
                    f"{cond} (x{n}: f32[8]) -> pred[] {{\n  %x{n} = f32[8]{{0}} parameter(0)\n  ROOT %t{n} = pred[] constant(true)\n}}\n"
                )
                loop_body = shared(depth + 1)
                lines.append(
                    f"  %l{n} = f32[8]{{0}} while({value}), condition={cond}, body={loop_body}"
                )
        for start in open_pairs:
            lines.append(f"  %d{next(counter)} = f32[8]{{0}} all-reduce-done({start})")
        lines.append(f"  ROOT %r{next(counter)} = f32[8]{{0}} exponential({value})")
        return lines

    def shared(depth: int) -> str:
        name = f"%comp{next(counter)}"
        lines = body(depth)
        param = lines[0].split()[0].lstrip("%")
        computations.append(f"{name} ({param}: f32[8]) -> f32[8] {{\n" + "\n".join(lines) + "\n}\n")
        return name

    entry = body(0)
    param = entry[0].split()[0].lstrip("%")
    text = "HloModule random, is_scheduled=true, num_partitions=8\n\n" + ADD_REDUCER + "\n"
    text += "\n".join(computations)
    text += f"\nENTRY %main ({param}: f32[8]) -> f32[8] {{\n" + "\n".join(entry) + "\n}\n"
    return text


MODELS = [StreamModel(), StreamModel(overlap_limit=4, sync_on_compute=True)]


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(
    modules(),
    st.integers(1, 8),
    st.sampled_from(["interval", "round-robin"]),
    st.sampled_from(MODELS),
)
def test_no_assignment_breaks_the_rule(
    text: str, streams: int, policy: str, model: StreamModel
) -> None:
    module = parse_module(text)
    passes = build_pipeline(streams, policy, model=model)  # type: ignore[arg-type]
    PassManager(passes).run(Compilation(module))
    assert violations(module.print(), streams, model) == []


def test_the_checker_finds_a_broken_assignment() -> None:
    """The checker is not vacuous: hand-made streams that break the rule are reported."""
    text = (
        "HloModule m, is_scheduled=true, num_partitions=8\n\n" + ADD_REDUCER + "\n"
        "%shared (x: f32[8]) -> f32[8] {\n  %x = f32[8]{0} parameter(0)\n"
        f'  %in = f32[8]{{0}} all-reduce-start(%x), channel_id=1, replica_groups={GROUPS[0]}, use_global_device_ids=true, to_apply=%add, frontend_attributes={{_xla_stream_annotation="1"}}\n'
        "  %e = f32[8]{0} exponential(%x)\n  ROOT %ind = f32[8]{0} all-reduce-done(%in)\n}\n\n"
        "ENTRY %main (p: f32[8]) -> f32[8] {\n  %p = f32[8]{0} parameter(0)\n"
        "  %c1 = f32[8]{0} call(%p), to_apply=%shared\n"
        f"  %out = f32[8]{{0}} all-reduce-start(%p), channel_id=1, replica_groups={GROUPS[3]}, use_global_device_ids=true, to_apply=%add\n"
        "  %c2 = f32[8]{0} call(%c1), to_apply=%shared\n"
        "  ROOT %outd = f32[8]{0} all-reduce-done(%out)\n}\n"
    )
    assert violations(text, 4, StreamModel()) == ["out on 0 and in on 1"]
    assert violations(text, 1, StreamModel()) == ["in annotated 1 >= K=1", "out on 0 and in on 1"]
    # The pipeline repairs both: the rule wins over the module's own annotation.
    module = parse_module(text)
    PassManager(build_pipeline(4)).run(Compilation(module))
    assert violations(module.print(), 4, StreamModel()) == []


@pytest.mark.parametrize("streams", [1, 2])
def test_a_sync_collective_is_on_stream_0_unless_the_model_says_compute(streams: int) -> None:
    text = (
        "HloModule m, is_scheduled=true, num_partitions=8\n\n" + ADD_REDUCER + "\n"
        "ENTRY %main (p: f32[8]) -> f32[8] {\n  %p = f32[8]{0} parameter(0)\n"
        f'  %a = f32[8]{{0}} all-reduce-start(%p), channel_id=1, replica_groups={GROUPS[1]}, use_global_device_ids=true, to_apply=%add, frontend_attributes={{_xla_stream_annotation="{streams - 1}"}}\n'
        "  %e = f32[8]{0} exponential(%p)\n"
        f"  %s = f32[8]{{0}} all-reduce-start(%p), channel_id=1, replica_groups={GROUPS[3]}, use_global_device_ids=true, to_apply=%add, {SYNC}\n"
        "  %sd = f32[8]{0} all-reduce-done(%s)\n"
        "  ROOT %ad = f32[8]{0} all-reduce-done(%a)\n}\n"
    )
    expected = [] if streams == 1 else ["a on 1 and s on 0"]
    assert violations(text, streams, StreamModel()) == expected
    assert violations(text, streams, StreamModel(sync_on_compute=True)) == []
