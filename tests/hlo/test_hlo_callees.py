"""The computations an instruction names (``calls=``, ``to_apply=``,
``branch_computations={...}``) and those it runs as control flow."""

from __future__ import annotations

import pytest

from xla_streams.hlo import HloError, parse_module
from xla_streams.hlo.attributes import control_flow_callees, parse_computation_names
from xla_streams.hlo.text import ScanError


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("%body", ("body",)),
        ("body.1", ("body.1",)),
        (" %c ", ("c",)),
        ("{%a, %b.2}", ("a", "b.2")),
        ("{ %a ,b }", ("a", "b")),
        ("{%only}", ("only",)),
    ],
)
def test_computation_names(text: str, names: tuple[str, ...]) -> None:
    assert parse_computation_names(text) == names


@pytest.mark.parametrize(
    ("text", "offset", "message"),
    [
        ("{}", 0, "expected at least one computation name"),
        ("{%a,,%b}", 4, "expected a computation name, found ''"),
        ("", 0, "expected a computation name, found ''"),
        ("%a b", 0, "expected a computation name, found '%a b'"),
        ("{%a, {%b}}", 5, "expected a computation name, found '{%b}'"),
    ],
)
def test_computation_names_errors(text: str, offset: int, message: str) -> None:
    with pytest.raises(ScanError) as e:
        parse_computation_names(text)
    assert (e.value.offset, e.value.message) == (offset, message)


MODULE = """HloModule m, is_scheduled=true

%cond (c: s32[]) -> pred[] {
  %c = s32[] parameter(0)
  ROOT %lt = pred[] compare(%c, %c), direction=LT
}

%body (b: s32[]) -> s32[] {
  ROOT %b = s32[] parameter(0)
}

%left (l: s32[]) -> s32[] {
  ROOT %l = s32[] parameter(0)
}

%right (r: s32[]) -> s32[] {
  ROOT %r = s32[] parameter(0)
}

ENTRY %main (p: s32[], i: s32[]) -> s32[] {
  %p = s32[] parameter(0)
  %i = s32[] parameter(1)
  %w = s32[] while(%p), condition=%cond, body=%body
  %k = s32[] call(%w), to_apply=%body
  %f = s32[] fusion(%k), kind=kLoop, calls=%body
  ROOT %s = s32[] conditional(%i, %f, %f), branch_computations={%left, %right}
}
"""


def test_control_flow_callees_in_the_order_they_run() -> None:
    entry = parse_module(MODULE).entry
    assert {inst.name: control_flow_callees(inst) for inst in entry.instructions} == {
        "p": [],
        "i": [],
        "w": [("condition", "cond"), ("body", "body")],
        "k": [("to_apply", "body")],
        "f": [],  # a fusion is not control flow
        "s": [("branch_computations", "left"), ("branch_computations", "right")],
    }


def test_a_malformed_callee_list_points_into_the_line() -> None:
    text = MODULE.replace("{%left, %right}", "{%left,,%right}")
    inst = parse_module(text).entry.get("s")
    assert inst is not None
    with pytest.raises(HloError, match="bad branch_computations: expected a computation name"):
        control_flow_callees(inst)
