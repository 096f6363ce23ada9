"""XLA's HLO grammar, construct by construct: each module below is written by hand in
one form XLA's parser (``hlo_parser.cc``, ``hlo_lexer.cc``) reads, and XLA's own parser
from the pinned jaxlib (``jaxlib._hlo.hlo_module_from_text``) is the oracle:

* XLA reads the module, and so does the front end, which sees what XLA sees: the same
  computations, entry, execution threads and, in each computation, the same opcodes and
  shapes (compared by reading XLA's own printing of the module with the front end);
* what is untouched prints back byte for byte, an edited instruction in XLA's form, and
  XLA reads that too (a module with instructions or computations written inside others
  prints, edited, in XLA's layout: one statement a line, as the line reader reads it);
* errors in such a module point at the line and column of the source, as XLA's do;
* what XLA refuses, the front end refuses, on the line XLA names.

What XLA reads and the front end refuses on purpose (a computation written inline on
one line, two instructions on one line) is refused with a located message saying so.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import pytest
from conftest import ADD_REDUCER
from jaxlib import _hlo

import xla_streams.hlo.layout
from xla_streams.hlo import HloError, Module, Shape, parse_module
from xla_streams.hlo.layout import xla_layout


@dataclass(frozen=True)
class Construct:
    id: str
    text: str
    # XLA keeps an attribute's text as it read it: its printing breaks the line there too.
    xla_prints_it_over_lines: bool = False
    # Instructions or computations written inside others, which are put on their own.
    nested: bool = False


def with_reducer(text: str) -> str:
    """``text``'s `HloModule` line, the shared `%add` reducer, then the rest."""
    header, rest = text.split("\n", 1)
    return f"{header}\n\n{ADD_REDUCER}\n{rest}"


# fmt: off
READ = [
    Construct("execution-thread-after-a-computation", """\
HloModule m, num_partitions=2

%gemm (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  ROOT %n = f32[4]{0} negate(%a)
}, execution_thread="parallel"

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %start = ((f32[4]{0}), f32[4]{0}, s32[]) call-start(%p), async_execution_thread="parallel", to_apply=%gemm
  ROOT %done = f32[4]{0} call-done(%start)
}, execution_thread="main"
"""),
    Construct("attribute-value-over-lines", with_reducer("""\
HloModule m
ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %ar = f32[4]{0} all-reduce(%p), replica_groups={}, to_apply=%add, backend_config={"a":1,
                      "b":{"c":"2"}}
}
"""), xla_prints_it_over_lines=True),
    Construct("header-value-over-lines", """\
HloModule m, entry_computation_layout={(f32[4]{0})
  ->f32[4]{0}}, frontend_attributes={a="1",
  b="2"}

ENTRY %main (p: f32[4]) -> f32[4] {
  ROOT %p = f32[4]{0} parameter(0)
}
"""),
    Construct("string-over-lines", """\
HloModule m

ENTRY %main (p: f32[4]) -> f32[4] {
  ROOT %p = f32[4]{0} parameter(0), metadata={op_name="two
lines"}
}
"""),
    Construct("buffer-shapes", """\
HloModule m

ENTRY %main (p: s32[4]) -> s32[4] {
  %p = s32[4]{0} parameter(0)
  %b = b(s32[4]{0}) custom-call(%p), custom_call_target="Pin", output_to_operand_aliasing={{}: (0, {})}
  ROOT %v = s32[4]{0} custom-call(%b), custom_call_target="Unpin", output_to_operand_aliasing={{}: (0, {})}
}
"""),
    Construct("indented-module", """
    HloModule m

    ENTRY main {
      p = f32[4] parameter(0)
      ROOT n = f32[4] negate(p)
    }
"""),
    Construct("instruction-over-lines", with_reducer("""\
HloModule m
ENTRY %main (p: f32[4], q: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %q = f32[4]{0} parameter(1)
  %sum = f32[4]{0} add(%p,
                       %q)
  %ar = f32[4]{0}
      all-reduce(%sum), replica_groups={},
      to_apply=%add
  ROOT %n = f32[4]{0} negate(%ar)
      , metadata={op_name="n"}
}
""")),
    Construct("name-reused-in-another-computation", """\
HloModule m

%body (x: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  ROOT %n = f32[] negate(%x)
}

ENTRY %main (x: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  ROOT %n = f32[] call(%x), to_apply=%body
}
"""),
    Construct("spaces-inside-shapes", """\
HloModule m

ENTRY %main (p: f32[2,3]) -> (f32[2,3], s32[]) {
  %p = f32[2, 3] {1, 0} parameter(0)
  %c = s32[ ] constant(1)
  ROOT %t = ( f32[2,3]{1,0} , s32[] ) tuple(%p, %c)
}
"""),
    Construct("no-space-between-shape-and-opcode", """\
HloModule m

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4]{0}parameter(0)
  ROOT %n = f32[4]{0}negate(%p)
}
"""),
    Construct("no-computation-marked-entry", """\
HloModule m

%first (a: f32[]) -> f32[] {
  ROOT %a = f32[] parameter(0)
}

%last (b: f32[]) -> f32[] {
  %b = f32[] parameter(0)
  ROOT %c = f32[] call(%b), to_apply=%first
}
"""),
    Construct("indented-computation-heads", """\
HloModule m

  %first (a: f32[]) -> f32[] {
    ROOT %a = f32[] parameter(0)
  }

  ENTRY %main (b: f32[]) -> f32[] {
    %b = f32[] parameter(0)
    ROOT %c = f32[] call(%b), to_apply=%first
  }
"""),
    Construct("shapes-xla-infers", """\
HloModule m

%cond (t: (s32[], f32[4])) -> pred[] {
  %t = (s32[], f32[4]) parameter(0)
  %i = get-tuple-element(%t), index=0
  %n = s32[] constant(4)
  ROOT %lt = compare(%i, %n), direction=LT
}

%body (t: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t = (s32[], f32[4]) parameter(0)
  %i = get-tuple-element(%t), index=0
  %one = s32[] constant(1)
  %next = add(%i, %one)
  %v = get-tuple-element(%t), index=1
  ROOT %r = tuple(%next, %v)
}

ENTRY %main (p: f32[4], m: f32[2,4,3]) -> f32[2,3] {
  %p = f32[4] parameter(0)
  %zero = s32[] constant(0)
  %init = tuple(%zero, %p)
  %loop = while(%init), condition=%cond, body=%body
  %out = get-tuple-element(%loop), index=1
  %m = f32[2,4,3] parameter(1)
  %dot = dot(%m, %out), lhs_batch_dims={}, lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %sum = f32[2,3] add(%dot, %dot)
}
"""),
    Construct("header-over-lines", """\
HloModule m,
    num_partitions=2,
    is_scheduled=true

ENTRY
%main
  (p: f32[4])
  -> f32[4]
{
  ROOT %p = f32[4]{0} parameter(0)
}
"""),
    Construct("comments-outside-instructions", """\
/* a module written by hand */
// and a line comment
HloModule m /* its name */, num_partitions=2

ENTRY /* the entry */ %main (p: f32[4]) -> f32[4] { // the body
  /* a parameter */ %p = f32[4]{0} parameter(0) // the only one
  ROOT %n = f32[4]{0} negate(%p)
} // main
"""),
    Construct("line-comments-after-instructions", """\
HloModule m

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0) // the input
  ROOT %n = f32[4]{0} negate(%p), metadata={op_name="a//b"} // negated
}
"""),
    Construct("instructions-nested-in-operands", """\
HloModule m

ENTRY %main (p: f32[4], q: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %d = f32[1]{0} dynamic-slice(%p, s32[] constant(0)), dynamic_slice_sizes={1}
  %b = f32[4]{0} broadcast(%d), dimensions={}
  ROOT %r = get-tuple-element(
    (f32[4], f32[4]) tuple(add(multiply(f32[4] parameter(1), %b), %p), %p)
  ), index=0
}
""", nested=True),
    Construct("computations-written-inline", """\
HloModule m

ENTRY %main (p: s32[]) -> s32[] {
  %p = s32[] parameter(0)
  ROOT %c = s32[] call(%p), to_apply={
    %a = s32[] parameter(0)
    %start = ((s32[]), s32[], s32[]) call-start(%a), to_apply={
      %b = s32[] parameter(0)
      ROOT %abs = abs(%b)
    }, async_execution_thread="thread"
    ROOT %done = s32[] call-done(%start)
  }
}
""", nested=True),
    Construct("module-name-with-a-colon", """\
HloModule old_style:

ENTRY %main (p: f32[4]) -> f32[4] {
  ROOT %p = f32[4]{0} parameter(0)
}
"""),
]
# fmt: on
TEXT = {c.id: c.text for c in READ}


def xla(text: str) -> object:
    return _hlo.hlo_module_from_text(text)


def structure(module: Module) -> list[tuple[object, ...]]:
    """What XLA's parser and the front end must agree on, names aside (XLA renames an
    instruction whose name another computation has): each computation's name, entry
    mark, thread, root and its instructions' (opcode, shape), in any order."""
    return sorted(
        (
            comp.name,
            comp.is_entry,
            comp.execution_thread,
            (comp.root.opcode, repr(comp.root.shape)),
            sorted((i.opcode, repr(i.shape)) for i in comp.instructions),
        )
        for comp in module.computations
    )


@pytest.mark.parametrize("case", READ, ids=[c.id for c in READ])
def test_front_end_reads_what_xla_reads(case: Construct) -> None:
    printed_by_xla = xla(case.text).to_string()  # type: ignore[attr-defined]
    module = parse_module(case.text, "hand.hlo")
    assert module.print() == case.text
    assert structure(module) == structure(parse_module(printed_by_xla))


def line_by_line(text: str, monkeypatch: pytest.MonkeyPatch) -> Module:
    """``text`` read by the line reader alone, which reads XLA's layout only."""

    def not_needed(lines: list[str]) -> None:
        raise AssertionError("xla_layout was called")

    with monkeypatch.context() as patch:
        patch.setattr(xla_streams.hlo.layout, "xla_layout", not_needed)
        return parse_module(text)


@pytest.mark.parametrize("case", READ, ids=[c.id for c in READ])
def test_an_edited_module_prints_what_is_untouched_as_written(
    case: Construct, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = parse_module(case.text, "hand.hlo")
    module.restructured = True  # printed from its parts
    if case.nested:  # what was put on its own prints so, all in XLA's layout
        assert structure(line_by_line(module.print(), monkeypatch)) == structure(module)
    else:
        assert module.print() == case.text
    module.entry.root.set_attribute("metadata", '{op_name="edited"}')
    printed = module.print()
    assert structure(parse_module(printed)) == structure(module)
    assert xla(printed).to_string().count('metadata={op_name="edited"}') == 1  # type: ignore[attr-defined]


def test_execution_thread_is_kept_on_the_computation() -> None:
    module = parse_module(TEXT["execution-thread-after-a-computation"])
    threads = {c.name: c.execution_thread for c in module.computations}
    assert threads == {"gemm": "parallel", "main": "main"}


def test_a_computation_without_a_thread_runs_on_the_main_thread() -> None:
    module = parse_module(TEXT["instruction-over-lines"])
    assert {c.execution_thread for c in module.computations} == {"main"}


def test_the_last_computation_is_the_entry_when_none_is_marked() -> None:
    module = parse_module(TEXT["no-computation-marked-entry"])
    assert module.entry.name == "last"
    assert [c.is_entry for c in module.computations] == [False, True]


def test_a_buffer_shape_reads_as_its_array() -> None:
    module = parse_module(TEXT["buffer-shapes"])
    assert module.entry.get("b").shape == Shape("s32", (4,))  # type: ignore[union-attr]


def test_names_are_scoped_per_computation() -> None:
    module = parse_module(TEXT["name-reused-in-another-computation"])
    body, main = module.computations
    assert body.get("n").opcode == "negate"  # type: ignore[union-attr]
    assert main.get("n").opcode == "call"  # type: ignore[union-attr]
    # A name new to the module is new to each computation.
    assert module.unique_name("n") == "n.1"


def test_an_inferred_shape_is_what_xla_infers() -> None:
    module = parse_module(TEXT["shapes-xla-infers"])
    main = module.entry
    assert main.get("init").shape == Shape(None, (), (Shape("s32"), Shape("f32", (4,))))  # type: ignore[union-attr]
    assert main.get("out").shape == Shape("f32", (4,))  # type: ignore[union-attr]
    assert main.get("dot").shape == Shape("f32", (2, 3))  # type: ignore[union-attr]
    assert module.computation("cond").root.shape == Shape("pred")  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "case", [c for c in READ if not c.xla_prints_it_over_lines], ids=lambda c: c.id
)
def test_xla_printing_is_read_line_by_line(
    case: Construct, monkeypatch: pytest.MonkeyPatch
) -> None:
    """XLA's own printing of a construct needs no rewriting into XLA's layout: the line
    reader reads it, as fast as ever."""
    printed = xla(case.text).to_string()  # type: ignore[attr-defined]
    assert line_by_line(printed, monkeypatch).print() == printed


# -- errors: located in the source, on XLA's line -------------------------------------


def xla_error_line(text: str) -> int:
    with pytest.raises(Exception) as info:
        xla(text)
    m = re.search(r"(\d+):(\d+): error:", str(info.value))
    assert m is not None, str(info.value)
    return int(m.group(1))


def our_error(text: str) -> HloError:
    with pytest.raises(HloError) as info:
        module = parse_module(text, "bad.hlo")
        for inst in module.instructions():
            inst.attributes  # noqa: B018
            inst.operand_shapes  # noqa: B018
    return info.value


SPLIT = TEXT["instruction-over-lines"]
THREADS = TEXT["execution-thread-after-a-computation"]
# THREADS with the generic spelling of its async call, and a second computation.
ASYNC_CALLS = THREADS.replace(
    "\nENTRY", "\n%gemm2 (b: f32[4]) -> f32[4] {\n  %b = f32[4]{0} parameter(0)\n"
    '  ROOT %m = f32[4]{0} negate(%b)\n}, execution_thread="parallel"\n\nENTRY'
).replace("call-start(%p), async_execution_thread=\"parallel\", to_apply=%gemm",
          "async-start(%p), async_execution_thread=\"parallel\", calls=%gemm"
).replace("call-done(%start)", "async-done(%start)")  # fmt: skip

# (id, text, line, column, message): XLA refuses each; the line is XLA's too.
# fmt: off
REFUSED = [
    ("undefined-operand-on-a-continuation-line", SPLIT.replace("%q)", "%r)"),
     13, 24, "operand '%r' is not defined before '%sum'"),
    ("bad-shape-split-from-its-instruction", SPLIT.replace("%ar = f32[4]{0}", "%ar = f32[4,]{0}"),
     14, 9, "expected a shape such as 'f32[8,128]{1,0}', found 'f32[4,]{0}'"),
    ("bad-attribute-on-a-continuation-line", SPLIT.replace("to_apply=%add\n", "to_apply=%nope\n"),
     16, 16, "to_apply=%nope names no computation defined before 'main'"),
    ("unknown-opcode", THREADS.replace("negate(", "negat("), 5, 23, "unknown opcode 'negat'"),
    ("unknown-opcode-over-lines", SPLIT.replace("all-reduce(", "all-reduse("),
     15, 7, "unknown opcode 'all-reduse'"),
    ("two-entry-computations", TEXT["no-computation-marked-entry"].replace("\n%", "\nENTRY %"),
     7, 1, "a second ENTRY computation, 'last': the first is 'first' at line 3"),
    ("unknown-computation-attribute", THREADS.replace('"parallel"\n', '"parallel", foo="x"\n'),
     6, 33, "unexpected attribute 'foo' of computation 'gemm'"),
    ("execution-thread-twice", THREADS.replace('"parallel"\n', '"parallel", execution_thread="x"\n'),
     6, 33, "duplicate attribute 'execution_thread'"),
    ("async-start-shape-without-its-operands",
     THREADS.replace("((f32[4]{0}), f32[4]{0}, s32[]) call-start", "(f32[4]{0}, f32[4]{0}, s32[]) call-start"),
     10, 12, "an async start or update is '((operands), outputs, state...)'"),
    ("name-twice-in-one-computation",
     TEXT["name-reused-in-another-computation"].replace("ROOT %n = f32[] negate", "ROOT %x = f32[] negate"),
     5, 9, "duplicate instruction name '%x' (first defined at line 4)"),
]
# fmt: on


# XLA finds these once it has read the token after the instruction (the next line's):
# here the instruction's own line, at what is wrong in it.
# fmt: off
REFUSED_PAST_THE_INSTRUCTION = [
    ("async-done-of-another-opcode", THREADS.replace("call-done(%start)", "negate-done(%start)"),
     11, 26, "negate-done '%done' continues '%start', which runs call"),
    ("async-done-on-another-thread",
     THREADS.replace("call-done(%start)", 'call-done(%start), async_execution_thread="main"'),
     11, 68, "async_execution_thread=\"main\" is not what '%start' runs (async_execution_thread: parallel"),
    ("async-done-of-another-computation",
     ASYNC_CALLS.replace("async-done(%start)", "async-done(%start), calls=%gemm2"),
     16, 52, "calls=%gemm2 is not what '%start' runs (calls: gemm"),
]
# fmt: on


# (id, text, line, column, message, lines XLA's error lies past ours)
ALL_REFUSED = [(*r, 0) for r in REFUSED] + [(*r, 1) for r in REFUSED_PAST_THE_INSTRUCTION]


@pytest.mark.parametrize(
    ("text", "line", "column", "message", "xla_past"),
    [r[1:] for r in ALL_REFUSED],
    ids=[r[0] for r in ALL_REFUSED],
)
def test_what_xla_refuses_is_refused_at_its_line(
    text: str, line: int, column: int, message: str, xla_past: int
) -> None:
    err = our_error(text)
    assert message in err.message
    assert err.line + xla_past == xla_error_line(text)
    if line:
        assert (err.line, err.column) == (line, column), str(err)
    assert str(err).startswith(f"bad.hlo:{err.line}:{err.column}: error: ")


def test_an_async_op_wrapping_any_opcode_is_an_opcode() -> None:
    text = THREADS.replace("call-start(", "custom-call-start(").replace(
        "call-done(", "custom-call-done("
    )
    assert parse_module(text).entry.root.opcode == "custom-call-done"


# -- read by XLA, refused here on purpose, with a located message ---------------------

# fmt: off
NOT_READ = [
    ("a-computation-inline-on-one-line", """\
HloModule m

ENTRY %main (p: s32[]) -> s32[] {
  %p = s32[] parameter(0)
  ROOT %c = s32[] call(%p), to_apply={ ROOT %a = s32[] parameter(0) }
}
""", 5, 38, "bad to_apply: an inline computation"),
    # Found when the first one's attributes are read: the line reader takes the second
    # for them, and nothing splits a line.
    ("two-statements-on-one-line", """\
HloModule m

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)  ROOT %n = f32[4]{0} negate(%p)
}
""", 4, 32, "a second instruction on the line of another"),
]
# fmt: on


@pytest.mark.parametrize(
    ("text", "line", "column", "message"), [r[1:] for r in NOT_READ], ids=[r[0] for r in NOT_READ]
)
def test_what_is_not_read_is_refused_with_a_reason(
    text: str, line: int, column: int, message: str
) -> None:
    xla(text)  # XLA reads it
    err = our_error(text)
    assert (err.line, err.column) == (line, column), str(err)
    assert message in err.message


# -- any layout is read in time linear in the text -------------------------------------

_HEAD = "HloModule m\n\nENTRY %main (p: f32[8]) -> f32[8] {\n  %p = f32[8]{0} parameter(0)\n"
_N = 20_000
# fmt: off
SLOW_PATH = [
    ("instructions-over-lines",
     _HEAD + "".join(f"  %x{i} = f32[8]{{0}}\n    negate(%p)\n" for i in range(_N // 4)) + "}\n", None),
    ("an-instruction-over-many-lines",
     _HEAD + "  ROOT %x = f32[8]{0} negate(%p)\n" + "    , a=1\n" * _N + "}\n", "duplicate attribute 'a'"),
    ("a-shape-over-many-lines", _HEAD + "  ROOT %x = f32[\n" + "1 ,\n" * _N + "8] negate(%p)\n}\n", None),
    ("brackets-that-never-close", _HEAD + "  %x = f32[8]{0} negate(\n" + "(\n" * _N + "}\n", "unbalanced"),
    ("comments-that-never-close", "/*\n" * _N + "HloModule m\n", "expected 'HloModule <name>'"),
    ("a-string-over-many-lines",
     _HEAD + '  ROOT %x = f32[8]{0} negate(%p), metadata={op_name="' + "a\n" * _N + '"}\n}\n', None),
    ("instructions-nested-too-deep",
     _HEAD + "  ROOT %x = f32[8]{0} negate(" + "f32[8] negate(" * 2000 + "%p" + ")" * 2001 + "\n}\n",
     "an instruction nested in operands more deeply than this front end reads"),
    ("many-nested-instructions", _HEAD + "  ROOT %x = (" + ", ".join(["s32[]"] * _N) + ") tuple("
     + ", ".join(["s32[] constant(0)"] * _N) + ")\n}\n", None),
    ("many-computations-written-inline", _HEAD + "".join(
        f"  %c{i} = f32[8]{{0}} call(%p), to_apply={{\n    ROOT %z = f32[8]{{0}} parameter(0)\n  }}\n"
        for i in range(_N // 4)) + "  ROOT %r = f32[8]{0} negate(%p)\n}\n", None),
    ("shapes-to-infer", _HEAD + "".join(f"  %t{i} = tuple(%p, %p)\n" for i in range(_N // 4))
     + "  ROOT %r = f32[8]{0} negate(%p)\n}\n", None),
]
# fmt: on


@pytest.mark.slow
@pytest.mark.parametrize(
    ("text", "message"), [c[1:] for c in SLOW_PATH], ids=[c[0] for c in SLOW_PATH]
)
def test_any_layout_is_read_in_bounded_time(text: str, message: str | None) -> None:
    start = time.perf_counter()
    if message is None:
        parse_module(text)
    else:
        assert message in our_error(text).message
    # Generous: the slowest takes about 0.6 s on a quiet 2-core machine, and a quadratic
    # reading of 20,000 statements takes minutes.
    assert time.perf_counter() - start < 5.0


def test_anchors_map_a_statement_back_to_its_source() -> None:
    lines = ["HloModule m", "ENTRY %e {", "  %p =", "    f32[2,", "  3] parameter(0)", "}"]
    layout = xla_layout(lines)
    assert layout is not None
    assert layout.statements == [
        "HloModule m", "ENTRY %e {", "  %p = f32[2,3] parameter(0)", "}"
    ]  # fmt: skip
    assert layout.lines == [1, 2, 3, 6]
    anchors = layout.anchors[(3, layout.statements[2])]
    for offset, where in [(2, (3, 2)), (7, (4, 4)), (12, (4, 9)), (13, (5, 2)), (16, (5, 5))]:
        assert anchors.locate(offset) == where, offset


def test_xla_layout_leaves_xla_printing_alone() -> None:
    assert xla_layout(xla(THREADS).to_string().split("\n")) is None  # type: ignore[attr-defined]
