"""HLO text defines every instruction before its users and every computation before the
instructions that call it; XLA's parser enforces both ("instruction does not exist",
"computation does not exist"), which rules out every data or control cycle and every
recursion. parse_module rejects the same modules, each with the line and column of
the offending name, and XLA's own parser (jaxlib) is the oracle: it rejects every
case below and accepts every valid variant.
"""

from __future__ import annotations

import re

import pytest
from conftest import ADD_REDUCER

from xla_streams.hlo import HloError, parse_module
from xla_streams.jax_compat import hlo_bindings

HEAD = "HloModule m, is_scheduled=true, num_partitions=2\n\n" + ADD_REDUCER


def entry(*lines: str) -> str:
    body = "\n".join(f"  {line}" for line in lines)
    return f"{HEAD}\nENTRY %main (p: f32[8]) -> f32[8] {{\n  %p = f32[8]{{0}} parameter(0)\n{body}\n}}\n"


AR = "channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=%add"
WRAPPED = """
%wrapped (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  ROOT %ar = f32[8]{0} all-reduce(%x), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=%add
}
"""

# id -> (text, the name the error points at, a phrase of our message)
INVALID: dict[str, tuple[str, str, str]] = {
    "self-use": (
        entry("%w = f32[8]{0} add(%p, %w)", "ROOT %r = f32[8]{0} negate(%w)"),
        "%w)",
        "'%w' uses itself",
    ),
    "mutual-use": (
        entry(
            "%w1 = f32[8]{0} negate(%w2)",
            "%w2 = f32[8]{0} negate(%w1)",
            "ROOT %r = f32[8]{0} add(%w1, %w2)",
        ),
        "%w2)",
        "'%w2' is not defined before '%w1'",
    ),
    "start-fed-by-its-own-done": (
        entry(
            f"%s = f32[8]{{0}} all-reduce-start(%d), {AR}",
            "%d = f32[8]{0} all-reduce-done(%s)",
            "ROOT %r = f32[8]{0} negate(%d)",
        ),
        "%d)",
        "'%d' is not defined before '%s'",
    ),
    "undefined-operand": (
        entry("%w = f32[8]{0} exponential(%nosuch)", "ROOT %r = f32[8]{0} negate(%w)"),
        "%nosuch",
        "'%nosuch' is not defined before '%w'",
    ),
    "operand-of-another-computation": (
        entry("ROOT %r = f32[8]{0} negate(%lhs)"),
        "%lhs)",
        "'%lhs' is not defined before '%r' in computation 'main'",
    ),
    "undefined-after-a-comment-holding-a-bracket": (
        entry("%w = f32[8]{0} add(%p /* ) */, %nosuch)", "ROOT %r = f32[8]{0} negate(%w)"),
        "%nosuch",
        "'%nosuch' is not defined before '%w'",
    ),
    "tuple-element-of-undefined": (
        entry("ROOT %r = f32[8]{0} negate(%t#0)"),
        "%t#0",
        "'%t' is not defined before '%r'",
    ),
    "control-predecessor-cycle": (
        entry(
            "%w1 = f32[8]{0} exponential(%p), control-predecessors={%w2}",
            "%w2 = f32[8]{0} exponential(%p), control-predecessors={%w1}",
            "ROOT %r = f32[8]{0} add(%w1, %w2)",
        ),
        "%w2}",
        "control predecessors of '%w1' close a cycle through it",
    ),
    "async-update-chain-loop": (
        HEAD + WRAPPED + "\nENTRY %main (p: f32[8]) -> f32[8] {\n  %p = f32[8]{0} parameter(0)\n"
        "  %u1 = ((f32[8]{0}), f32[8]{0}, u32[]) async-update(%u2), calls=%wrapped\n"
        "  %u2 = ((f32[8]{0}), f32[8]{0}, u32[]) async-update(%u1), calls=%wrapped\n"
        "  ROOT %d = f32[8]{0} async-done(%u2), calls=%wrapped\n}\n",
        "%u2)",
        "'%u2' is not defined before '%u1'",
    ),
    "missing-to_apply": (
        entry(
            "%s = f32[8]{0} all-reduce-start(%p), channel_id=1, replica_groups={{0,1}}, "
            "use_global_device_ids=true, to_apply=%nosuch",
            "ROOT %d = f32[8]{0} all-reduce-done(%s)",
        ),
        "%nosuch",
        "to_apply=%nosuch names no computation defined before 'main'",
    ),
    "recursion-through-async-calls": (
        HEAD
        + """
%c (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  %s2 = ((f32[8]{0}), f32[8]{0}) async-start(%x), calls=%c
  %d2 = f32[8]{0} async-done(%s2)
  ROOT %ar = f32[8]{0} all-reduce(%d2), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=%add
}

ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %s = ((f32[8]{0}), f32[8]{0}) async-start(%p), calls=%c
  ROOT %d = f32[8]{0} async-done(%s)
}
""",
        "%c\n",
        "computation 'c' calls itself (calls=%c)",
    ),
    "recursion-through-a-fusion": (
        HEAD
        + """
%f (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  ROOT %g = f32[8]{0} fusion(%x), kind=kLoop, calls=%f
}

ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %r = f32[8]{0} fusion(%p), kind=kLoop, calls=%f
}
""",
        "%f\n",
        "computation 'f' calls itself",
    ),
    "recursion-through-a-while-body": (
        HEAD
        + """
%cond (c: f32[8]) -> pred[] {
  %c = f32[8]{0} parameter(0)
  ROOT %t = pred[] constant(false)
}

%body (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  ROOT %w = f32[8]{0} while(%x), condition=%cond, body=%body
}

ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %r = f32[8]{0} while(%p), condition=%cond, body=%body
}
""",
        "%body\n",
        "computation 'body' calls itself",
    ),
    "recursion-through-a-call": (
        HEAD
        + """
%g (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  ROOT %c = f32[8]{0} call(%x), to_apply=%h
}

%h (y: f32[8]) -> f32[8] {
  %y = f32[8]{0} parameter(0)
  ROOT %c2 = f32[8]{0} call(%y), to_apply=%g
}

ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %r = f32[8]{0} call(%p), to_apply=%h
}
""",
        "%h\n",
        "to_apply=%h names no computation defined before 'g'",
    ),
    "conditional-branch-defined-later": (
        HEAD
        + """
ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %i = s32[] constant(0)
  ROOT %r = f32[8]{0} conditional(%i, %p, %p), branch_computations={%b0, %b1}
}

%b0 (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  ROOT %n = f32[8]{0} negate(%x)
}

%b1 (x: f32[8]) -> f32[8] {
  %x.1 = f32[8]{0} parameter(0)
  ROOT %e = f32[8]{0} exponential(%x.1)
}
""",
        "%b0",
        "branch_computations=%b0 names no computation defined before 'main'",
    ),
    "nul-in-a-name": (
        entry("%w\0x = f32[8]{0} negate(%p)", "ROOT %r = f32[8]{0} negate(%p)"),
        "\0",
        "NUL byte",
    ),
    "name-with-a-colon": (
        entry("%w:x = f32[8]{0} negate(%p)", "ROOT %r = f32[8]{0} negate(%p)"),
        "%w:x",
        "expected an instruction",
    ),
    "name-not-ascii": (
        entry("%w\u00e9 = f32[8]{0} negate(%p)", "ROOT %r = f32[8]{0} negate(%p)"),
        "%w\u00e9",
        "expected an instruction",
    ),
}

# Valid spellings the check must keep accepting (jaxlib accepts each too).
VALID: dict[str, str] = {
    "control-predecessor-defined-before": entry(
        "%w1 = f32[8]{0} exponential(%p)",
        "%w2 = f32[8]{0} exponential(%p), control-predecessors={%w1}",
        "ROOT %r = f32[8]{0} add(%w1, %w2)",
    ),
    "names-with-dots-and-dashes": entry(
        "%a-b.1_c = f32[8]{0} negate(%p)", "ROOT %r = f32[8]{0} negate(%a-b.1_c)"
    ),
    "string-holding-a-reference-lookalike": entry(
        '%w = f32[8]{0} negate(%p), metadata={op_name="x, to_apply=%nosuch, calls=%f"}',
        "ROOT %r = f32[8]{0} negate(%w)",
    ),
    "operand-with-shape": entry(
        "%w = f32[8]{0} add(f32[8]{0} %p, f32[8]{0} %p)", "ROOT %r = f32[8]{0} negate(%w)"
    ),
    "call-of-an-earlier-computation": HEAD
    + """
%g (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  ROOT %n = f32[8]{0} negate(%x)
}

ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %r = f32[8]{0} call(%p), to_apply=%g
}
""",
}


def xla_parse(text: str) -> None:
    hlo_bindings().hlo_module_from_text(text)


@pytest.mark.parametrize(("text", "at", "message"), INVALID.values(), ids=INVALID.keys())
def test_xla_and_we_reject_it_at_the_name(text: str, at: str, message: str) -> None:
    with pytest.raises(Exception, match="INVALID_ARGUMENT") as xla_error:
        xla_parse(text)
    with pytest.raises(HloError) as ours:
        parse_module(text, "bad.hlo")
    err = ours.value
    assert message in err.message
    # The same line as XLA's own error, and the column of the name we point at.
    xla_line = int(re.search(r"was parsing (\d+):\d+", str(xla_error.value)).group(1))  # type: ignore[union-attr]
    assert err.line == xla_line, (str(err), str(xla_error.value))
    source = text.split("\n")[err.line - 1]
    assert source.index(at.rstrip("\n")) + 1 == err.column, str(err)
    assert str(err).startswith(f"bad.hlo:{err.line}:{err.column}: error: ")


@pytest.mark.parametrize("text", VALID.values(), ids=VALID.keys())
def test_valid_references_are_accepted(text: str) -> None:
    xla_parse(text)
    assert parse_module(text).print() == text


def test_a_module_without_percent_signs_is_checked_too() -> None:
    text = entry("%w = f32[8]{0} negate(%p)", "ROOT %r = f32[8]{0} negate(%w)").replace("%", "")
    parse_module(text)
    with pytest.raises(HloError, match="'%q' is not defined before '%r'"):
        parse_module(text.replace("negate(w)", "negate(q)"))


def test_the_check_reads_an_operand_list_exactly_when_it_nests() -> None:
    """A tuple-shaped operand or a comment: the exact reader decides, not the fast one."""
    good = entry(
        "%t = (f32[8]{0}, f32[8]{0}) tuple(%p, %p)",
        "%g = f32[8]{0} get-tuple-element((f32[8]{0}, f32[8]{0}) %t), index=0",
        "ROOT %r = f32[8]{0} add(/*index=0*/%g, %g)",
    )
    xla_parse(good)
    parse_module(good)
    bad = good.replace("((f32[8]{0}, f32[8]{0}) %t)", "((f32[8]{0}, f32[8]{0}) %nosuch)")
    with pytest.raises(HloError, match="'%nosuch' is not defined before '%g'"):
        parse_module(bad)


@pytest.mark.slow
def test_the_check_costs_little() -> None:
    """The eager check reads one regex per simple operand list: a module of 20,000
    instructions in one chain parses in well under a second."""
    import time

    lines = ["%w0 = f32[8]{0} negate(%p)"]
    lines += [f"%w{i} = f32[8]{{0}} add(%w{i - 1}, %p)" for i in range(1, 20_000)]
    text = entry(*lines, "ROOT %r = f32[8]{0} negate(%w19999)")
    start = time.perf_counter()
    parse_module(text)
    assert time.perf_counter() - start < 2.0


def test_a_control_predecessor_printed_after_its_user_is_read() -> None:
    # XLA prints double-buffered loops so (a clone's control predecessor after it), and
    # the hook and the tools must read XLA's own output; no cycle runs through it.
    text = entry(
        "%w1 = f32[8]{0} exponential(%p), control-predecessors={%w2}",
        "%w2 = f32[8]{0} negate(%p)",
        "ROOT %r = f32[8]{0} add(%w1, %w2)",
    )
    module = parse_module(text, "late.hlo")
    assert [i.name for i in module.entry.instructions] == ["p", "w1", "w2", "r"]
    # A name not printed may be a tuple element jax >= 0.11 prints as `%x#N` (XLA's own
    # after-optimizations dump of a double-buffered loop names such a one) ...
    gte = entry(
        "%t = (f32[8]{0}, f32[8]{0}) tuple(%p, %p)",
        "%w1 = f32[8]{0} exponential(%t#0), control-predecessors={%t.0}",
        "ROOT %r = f32[8]{0} negate(%w1)",
    )
    assert parse_module(gte, "gte.hlo").entry.get("w1")
    # ... but where no operand is printed so, no line is gone: the name is no instruction.
    with pytest.raises(HloError, match=r"late.hlo:11:58: error: .*control predecessor '%done' of "
                       r"'%w1' is not an instruction of computation 'main'"):  # fmt: skip
        parse_module(text.replace("{%w2}", "{%done}"), "late.hlo")
    # A cycle through data and a late control edge: w2 uses w1, w1 waits for w2.
    with pytest.raises(HloError, match="close a cycle"):
        parse_module(text.replace("negate(%p)", "negate(%w1)"), "cycle.hlo")
