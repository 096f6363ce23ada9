"""Unit tests of the front end's decoders: replica groups in every printed form,
source-target pairs, frontend attributes, backend_config JSON, shapes, module
header attributes, operand lists and attribute splitting.

Expected device lists are worked out by hand in the comments; the iota and mesh
forms are also cross-checked against numpy reshape/transpose with hypothesis,
following XLA's definitions (``IotaReplicaGroupList``: iota(N) reshaped to
``dims``, transposed by ``perm``, cut into groups; ``MeshAxesReplicaGroupList``:
the mesh's device array, each referenced sub-axis split out, the grouped axes
transposed to the end in the order listed, cut into groups).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import LAYOUT_MODULE, hlo_module
from hypothesis import given, settings
from hypothesis import strategies as st

from xla_streams.hlo import HloError, Shape, parse_module, parse_shape
from xla_streams.hlo.attributes import (
    format_frontend_attributes,
    parse_backend_config,
    parse_frontend_attributes,
    parse_int_list,
    parse_replica_groups,
    parse_source_target_pairs,
)
from xla_streams.hlo.text import ScanError, find_closing, split_top_level

# -- replica groups ----------------------------------------------------------------

HAND_WORKED = [
    # iota(8) cut in 2 groups of 4.
    ("[2,4]<=[8]", ((0, 1, 2, 3), (4, 5, 6, 7))),
    # [[0,1,2,3],[4,5,6,7]] transposed -> [[0,4],[1,5],[2,6],[3,7]].
    ("[4,2]<=[2,4]T(1,0)", ((0, 4), (1, 5), (2, 6), (3, 7))),
    # [[0,1],[2,3],[4,5],[6,7]] transposed -> [[0,2,4,6],[1,3,5,7]].
    ("[2,4]<=[4,2]T(1,0)", ((0, 2, 4, 6), (1, 3, 5, 7))),
    # a[i,j,k] = 4i+2j+k read in (k,j,i) order: 0,4,2,6,1,5,3,7.
    ("[4,2]<=[2,2,2]T(2,1,0)", ((0, 4), (2, 6), (1, 5), (3, 7))),
    # a[i,j,k] = 4i+2j+k read in (j,i,k) order: 0,1,4,5,2,3,6,7.
    ("[2,4]<=[2,2,2]T(1,0,2)", ((0, 1, 4, 5), (2, 3, 6, 7))),
    ("[1,8]<=[8]", ((0, 1, 2, 3, 4, 5, 6, 7),)),
    ("[8,1]<=[8]", tuple((i,) for i in range(8))),
    ("[2,2]<=[4]", ((0, 1), (2, 3))),
    # {} is one group of all devices, spelled as no groups.
    ("{}", ()),
    ("{{0,1},{2,3}}", ((0, 1), (2, 3))),
    ("{{0,2},{1,3}}", ((0, 2), (1, 3))),
    ("{{0}}", ((0,),)),
    ("{{3,1,0,2}}", ((3, 1, 0, 2),)),
    ("{{0,1,2,3,4,5,6,7}}", ((0, 1, 2, 3, 4, 5, 6, 7),)),
    # Mesh [2,1,4] (device d = 4*a0 + a2): vary axis_2 with axis_0 fixed.
    ("mesh['axis_0'=2,'axis_1'=1,'axis_2'=4] {'axis_2'}", ((0, 1, 2, 3), (4, 5, 6, 7))),
    # vary axis_0 with axis_2 fixed.
    ("mesh['axis_0'=2,'axis_1'=1,'axis_2'=4] {'axis_0'}", ((0, 4), (1, 5), (2, 6), (3, 7))),
    # axis_1 has size 1: every device alone.
    ("mesh['axis_0'=2,'axis_1'=1,'axis_2'=4] {'axis_1'}", tuple((i,) for i in range(8))),
    ("mesh['axis_0'=2,'axis_1'=1,'axis_2'=4] {'axis_0','axis_2'}", (tuple(range(8)),)),
    # Grouped axes go to the end in the order listed: axis_2 major, axis_0 minor.
    ("mesh['axis_0'=2,'axis_1'=1,'axis_2'=4] {'axis_2','axis_0'}", ((0, 4, 1, 5, 2, 6, 3, 7),)),
    # Mesh [4,2], a = 2*a_hi + a_lo, d = 2a + b = 4a_hi + 2a_lo + b.
    # 'a':(2)2 is a_lo (pre-size 2, size 2): groups over a_lo, (a_hi, b) fixed.
    ("mesh['a'=4,'b'=2] {'a':(2)2}", ((0, 2), (1, 3), (4, 6), (5, 7))),
    # 'a':(1)2 is a_hi: groups over a_hi, (a_lo, b) fixed.
    ("mesh['a'=4,'b'=2] {'a':(1)2}", ((0, 4), (1, 5), (2, 6), (3, 7))),
    # XLA's own example: 'a'=8 as [2,2,2] (d = 4x+2y+z), aggregate over x and z.
    ("mesh['a'=8] {'a':(1)2,'a':(4)2}", ((0, 1, 4, 5), (2, 3, 6, 7))),
    # ... listed z first: z is the major one inside each group.
    ("mesh['a'=8] {'a':(4)2,'a':(1)2}", ((0, 4, 1, 5), (2, 6, 3, 7))),
    # 'a':(2)4 on a=8 is the minor 4 of a: d = 4x + w, groups over w.
    ("mesh['a'=8] {'a':(2)4}", ((0, 1, 2, 3), (4, 5, 6, 7))),
    # Mesh [2,4] (d = 4x + y, y = 2*y_hi + y_lo): groups over (y_hi, x), y_lo fixed.
    ("mesh['x'=2,'y'=4] {'y':(1)2,'x'}", ((0, 4, 2, 6), (1, 5, 3, 7))),
    # Sub-axis and a full axis of another dimension: (a_lo, b) vary, a_hi fixed.
    ("mesh['a'=4,'b'=2] {'a':(2)2,'b'}", ((0, 1, 2, 3), (4, 5, 6, 7))),
]


@pytest.mark.parametrize(("text", "groups"), HAND_WORKED, ids=[t for t, _ in HAND_WORKED])
def test_replica_groups_hand_worked(text: str, groups: tuple[tuple[int, ...], ...]) -> None:
    assert parse_replica_groups(text) == groups


# A mesh whose device order is not iota prints its device ids (jaxlib 0.10.2 parses
# and prints back this exact spelling): mesh [2,4] holding [[0,4,1,5],[2,6,3,7]].
MESH_DEVICE_IDS = "mesh['a'=2,'b'=4], device_ids=(0,4,1,5,2,6,3,7) {'b'}"


def test_replica_groups_mesh_with_device_ids() -> None:
    assert parse_replica_groups(MESH_DEVICE_IDS) == ((0, 4, 1, 5), (2, 6, 3, 7))


def test_replica_groups_mesh_with_device_ids_is_one_attribute() -> None:
    """The `, device_ids=` inside the value must not split the attribute list."""
    text = MODULE_TEMPLATE.replace("REPLICA_GROUPS", MESH_DEVICE_IDS)
    inst = parse_module(text).entry.get("ar")
    assert inst is not None
    assert inst.attribute("replica_groups") == MESH_DEVICE_IDS
    assert "device_ids" not in inst.attributes
    assert list(inst.attributes) == [
        "channel_id",
        "replica_groups",
        "use_global_device_ids",
        "to_apply",
    ]


@pytest.mark.parametrize(
    ("text", "offset", "message"),
    [
        ("[2,4]<=[7]", 0, "2x4 groups do not cover the 7 devices of [7]"),
        ("[4,4]<=[8]", 0, "4x4 groups do not cover the 8 devices"),
        ("[2,4]<=[2,4]T(0,0)", 14, "T(0,0) is not a permutation of 2 dimensions"),
        ("[2,4]<=[2,4]T(1,2)", 14, "T(1,2) is not a permutation of 2 dimensions"),
        ("[2,4]<=[2,4]T(1)", 14, "T(1) is not a permutation of 2 dimensions"),
        ("[2,4]<=[8", 0, "expected '[groups,size]<=[dims]'"),
        ("{{0,1},{2,x}}", 7, "expected a list of integers like '{1,0}', found '{2,x}'"),
        ("{{0,1},{2,3}", 7, "'{' is never closed: expected '}'"),
        ("", 0, "expected replica groups"),
        ("mesh['x'=2,'y'=2] {'z'}", 19, "expected a mesh axis of ['x', 'y'], found ''z''"),
        ("mesh['a'=4] {'a':(2)4}", 13, "does not divide axis size 4"),
        ("mesh['a'=4] {'a':(3)2}", 13, "does not divide axis size 4"),
        ("mesh['a'=4 {'a'}", 0, "expected \"mesh['axis'=size,...] {'axis',...}\""),
    ],
)
def test_replica_groups_errors(text: str, offset: int, message: str) -> None:
    with pytest.raises(ScanError) as err:
        parse_replica_groups(text)
    assert message in err.value.message
    assert err.value.offset == offset


@st.composite
def iota_forms(draw: st.DrawFn) -> tuple[str, np.ndarray]:
    dims = draw(st.lists(st.integers(1, 5), min_size=1, max_size=4))
    perm = draw(st.permutations(range(len(dims))))
    total = math.prod(dims)
    divisors = [d for d in range(1, total + 1) if total % d == 0]
    size = draw(st.sampled_from(divisors))
    expected = np.arange(total).reshape(dims).transpose(perm).reshape(total // size, size)
    identity = list(perm) == sorted(perm)
    spell_t = not identity or draw(st.booleans())
    t = f"T({','.join(map(str, perm))})" if spell_t else ""
    text = f"[{total // size},{size}]<=[{','.join(map(str, dims))}]{t}"
    return text, expected


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(iota_forms())
def test_iota_matches_numpy(form: tuple[str, np.ndarray]) -> None:
    text, expected = form
    assert parse_replica_groups(text) == tuple(map(tuple, expected.tolist()))


@st.composite
def mesh_forms(draw: st.DrawFn) -> tuple[str, np.ndarray]:
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    names = [f"axis_{i}" for i in range(len(sizes))]
    chosen = draw(
        st.lists(st.sampled_from(range(len(sizes))), unique=True, min_size=1, max_size=len(sizes))
    )
    others = [i for i in range(len(sizes)) if i not in chosen]
    total = math.prod(sizes)
    group = math.prod(sizes[i] for i in chosen)
    expected = np.arange(total).reshape(sizes).transpose(others + chosen).reshape(-1, group)
    axes = ",".join(f"'{n}'={s}" for n, s in zip(names, sizes, strict=True))
    refs = ",".join(f"'{names[i]}'" for i in chosen)
    return f"mesh[{axes}] {{{refs}}}", expected


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(mesh_forms())
def test_mesh_axes_match_numpy(form: tuple[str, np.ndarray]) -> None:
    text, expected = form
    assert parse_replica_groups(text) == tuple(map(tuple, expected.tolist()))


@st.composite
def sub_axis_forms(draw: st.DrawFn) -> tuple[str, np.ndarray]:
    """One axis split as [pre, size, rest]; group over the middle factor (XLA's rule)."""
    pre, size, rest = (draw(st.integers(1, 3)) for _ in range(3))
    size += 1  # a sub-axis has size > 1
    other = draw(st.integers(1, 3))
    full = pre * size * rest
    if size == full:  # that is the whole axis, not a sub-axis
        rest += 1
        full = pre * size * rest
    major = draw(st.booleans())  # the split axis before or after the other one
    sizes = [full, other] if major else [other, full]
    refined = [pre, size, rest, other] if major else [other, pre, size, rest]
    grouped = 1 if major else 2
    others = [i for i in range(4) if i != grouped]
    expected = (
        np.arange(full * other).reshape(refined).transpose([*others, grouped]).reshape(-1, size)
    )
    mesh = f"mesh['a'={sizes[0]},'b'={sizes[1]}]"
    split = "a" if major else "b"
    return f"{mesh} {{'{split}':({pre}){size}}}", expected


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(sub_axis_forms())
def test_sub_axes_match_numpy(form: tuple[str, np.ndarray]) -> None:
    text, expected = form
    assert parse_replica_groups(text) == tuple(map(tuple, expected.tolist()))


# -- source-target pairs, integer lists --------------------------------------------


def test_source_target_pairs() -> None:
    assert parse_source_target_pairs("{{0,1},{1,0}}") == ((0, 1), (1, 0))
    assert parse_source_target_pairs("{{0,1},{1,2},{2,3},{3,0}}") == (
        (0, 1),
        (1, 2),
        (2, 3),
        (3, 0),
    )
    assert parse_source_target_pairs("{}") == ()


@pytest.mark.parametrize(
    ("text", "offset", "message"),
    [
        ("{{0,1,2}}", 0, "expected {source,target} pairs, found a group of 3"),
        ("{{0}}", 0, "found a group of 1"),
        ("{{0,1},{1,x}}", 7, "found '{1,x}'"),
        ("{0,1}", 1, "expected a list of integers"),
        ("0,1", 0, "expected '{'"),
    ],
)
def test_source_target_pairs_errors(text: str, offset: int, message: str) -> None:
    with pytest.raises(ScanError) as err:
        parse_source_target_pairs(text)
    assert message in err.value.message
    assert err.value.offset == offset


def test_int_list() -> None:
    assert parse_int_list("{1,0}") == (1, 0)
    assert parse_int_list("{}") == ()
    assert parse_int_list("{-1, 2}") == (-1, 2)
    with pytest.raises(ScanError):
        parse_int_list("{1,a}")


# -- frontend attributes, backend_config -----------------------------------------


def test_frontend_attributes() -> None:
    assert parse_frontend_attributes("{}") == {}
    assert parse_frontend_attributes('{a="1",b="x"}') == {"a": "1", "b": "x"}
    # Commas and braces inside the quoted value do not split it; escapes stay as printed.
    assert parse_frontend_attributes('{a="x,y}{",b="\\"q"}') == {"a": "x,y}{", "b": '\\"q'}
    assert parse_frontend_attributes('{_xla_stream_annotation="1"}') == {
        "_xla_stream_annotation": "1"
    }


def test_frontend_attributes_unquoted_dict_value() -> None:
    """XLA prints a value that lexes as a `{...}` dict unquoted (seen in real pipelined
    send/recv: `_xla_send_recv_source_target_pairs={{0,1},{1,2}}`)."""
    text = '{_xla_send_recv_pipeline="0",_xla_send_recv_source_target_pairs={{0,1},{1,2}}}'
    parsed = parse_frontend_attributes(text)
    assert parsed == {
        "_xla_send_recv_pipeline": "0",
        "_xla_send_recv_source_target_pairs": "{{0,1},{1,2}}",
    }
    assert format_frontend_attributes(parsed) == text
    assert parse_source_target_pairs(parsed["_xla_send_recv_source_target_pairs"]) == (
        (0, 1),
        (1, 2),
    )


# Spellings jaxlib 0.10.2 prints: a value that lexes as one `{...}` goes bare,
# anything else (even when it starts with "{") stays quoted.
XLA_PRINTED_FRONTEND_ATTRIBUTES = [
    "{k={{0,1}}}",
    "{k={}}",
    '{k="{"}',
    '{k="{1},{2}"}',
    '{a="{2}x",b={1}}',
    '{k="a\\"b"}',
]


@pytest.mark.parametrize("text", XLA_PRINTED_FRONTEND_ATTRIBUTES)
def test_frontend_attributes_reformat_as_xla_prints_them(text: str) -> None:
    """Re-formatting (what an edit does to the other keys) must not change them."""
    assert format_frontend_attributes(parse_frontend_attributes(text)) == text


def test_format_frontend_attributes_sorts_like_xla() -> None:
    assert format_frontend_attributes({"b": "2", "a": "1", "_x": "0"}) == '{_x="0",a="1",b="2"}'
    assert format_frontend_attributes({}) == "{}"
    value = '{a="x,y}{",b="\\"q"}'
    assert format_frontend_attributes(parse_frontend_attributes(value)) == value


@pytest.mark.parametrize(
    ("text", "offset"), [("{a=1}", 1), ('a="1"', 0), ('{a="1",b}', 7), ('{a="1"', 0)]
)
def test_frontend_attributes_errors(text: str, offset: int) -> None:
    with pytest.raises(ScanError) as err:
        parse_frontend_attributes(text)
    assert err.value.offset == offset


def test_backend_config_json() -> None:
    config = '{"a":"}{,\\"x\\"","b":{"c":[1,2]},"collective_backend_config":{"is_sync":true}}'
    assert parse_backend_config(config) == {
        "a": '}{,"x"',
        "b": {"c": [1, 2]},
        "collective_backend_config": {"is_sync": True},
    }
    # The older quoted-string spelling.
    assert parse_backend_config('"{\\"a\\":1}"') == {"a": 1}
    assert parse_backend_config("{}") == {}


@pytest.mark.parametrize(
    ("text", "offset", "message"),
    [
        ('{"a":1', 6, "invalid JSON: Expecting ',' delimiter"),
        ('{"a":1,}', 7, "invalid JSON: Expecting property name"),
        ("[1]", 0, "expected a JSON object"),
        ('"[1]"', 0, "expected a JSON object"),
    ],
)
def test_backend_config_errors(text: str, offset: int, message: str) -> None:
    with pytest.raises(ScanError) as err:
        parse_backend_config(text)
    assert message in err.value.message
    assert err.value.offset == offset


# -- shapes -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "element_type", "dimensions", "byte_size"),
    [
        ("f32[8,128]{1,0}", "f32", (8, 128), 4096),
        ("f32[]", "f32", (), 4),
        ("f32[]{}", "f32", (), 4),
        ("bf16[2,3]", "bf16", (2, 3), 12),
        # Tiled layout with element size and memory space.
        ("f32[8,128]{1,0:T(8,128)(2,1)S(1)}", "f32", (8, 128), 4096),
        ("s32[2,3]{0,1:T(2,128)(4,1)E(4)}", "s32", (2, 3), 24),
        # Dynamic dimensions count at their bound.
        ("bf16[<=4,8]", "bf16", (4, 8), 64),
        ("f32[<=2]{0:D(1)}", "f32", (2,), 8),
        ("token[]", "token", (), 0),
        ("opaque[]", "opaque", (), 0),
        ("pred[3]", "pred", (3,), 3),
        # Sub-byte types are packed, rounded up to whole bytes.
        ("s4[3]", "s4", (3,), 2),  # 12 bits
        ("u4[4]", "u4", (4,), 2),  # 16 bits
        ("s2[5]", "s2", (5,), 2),  # 10 bits
        ("u2[4]", "u2", (4,), 1),  # 8 bits
        ("f4e2m1fn[3]", "f4e2m1fn", (3,), 2),
        ("f8e4m3fn[3]", "f8e4m3fn", (3,), 3),
        ("c64[2]", "c64", (2,), 16),
        ("c128[2]", "c128", (2,), 32),
        ("s4[]", "s4", (), 1),
    ],
)
def test_array_shapes(
    text: str, element_type: str, dimensions: tuple[int, ...], byte_size: int
) -> None:
    shape = parse_shape(text)
    assert shape.element_type == element_type
    assert shape.dimensions == dimensions
    assert not shape.is_tuple
    assert shape.byte_size == byte_size
    assert shape.leaves() == (shape,)


def test_tuple_shapes_with_index_comments() -> None:
    leaves = ", ".join(f"f32[{i + 1}]{{0}}" for i in range(5))
    text = f"({leaves}, /*index=5*/s32[], (bf16[2,2]{{1,0}}, token[]), /*index=7*/u4[3])"
    shape = parse_shape(text)
    assert shape.is_tuple
    assert len(shape.tuple_shapes) == 8
    assert shape.tuple_shapes[5] == Shape("s32", ())
    assert shape.tuple_shapes[6].tuple_shapes == (Shape("bf16", (2, 2)), Shape("token", ()))
    assert [leaf.element_type for leaf in shape.leaves()] == ["f32"] * 5 + [
        "s32",
        "bf16",
        "token",
        "u4",
    ]
    assert shape.byte_size == 4 * (1 + 2 + 3 + 4 + 5) + 4 + 8 + 0 + 2


def test_nested_and_empty_tuples() -> None:
    assert parse_shape("()").tuple_shapes == ()
    assert parse_shape("()").byte_size == 0
    nested = parse_shape("((f32[2]{0}), f32[3]{0})")
    assert nested.tuple_shapes[0].tuple_shapes == (Shape("f32", (2,)),)
    assert nested.byte_size == 20


@pytest.mark.parametrize(
    ("text", "offset", "message"),
    [
        ("q32[2]", 0, "unknown element type 'q32'"),
        ("f32[2", 0, "expected a shape such as 'f32[8,128]{1,0}', found 'f32[2'"),
        ("f32[a]", 0, "expected a shape"),
        ("f32[8,]{0}", 0, "expected a shape"),
        ("f32[2]{0", 0, "expected a shape"),
        ("(f32[2]", 6, "expected ')' closing the tuple shape"),
        ("(f32[2], q8[1])", 9, "unknown element type 'q8'"),
        ("(f32[2], /*index=1*/x[1])", 20, "unknown element type 'x'"),
    ],
)
def test_shape_errors(text: str, offset: int, message: str) -> None:
    with pytest.raises(ScanError) as err:
        parse_shape(text)
    assert message in err.value.message
    assert err.value.offset == offset


# -- modules: header, operands, attributes ----------------------------------------

# REPLICA_GROUPS stands for a spelling of the groups.
MODULE_TEMPLATE = hlo_module(
    "HloModule m, is_scheduled=true, num_partitions=8",
    """\
ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %ar = f32[8]{0} all-reduce(%p), channel_id=1, replica_groups=REPLICA_GROUPS, use_global_device_ids=true, to_apply=%add
}
""",
)

HEADER = (
    "HloModule jit_step, is_scheduled=true, entry_computation_layout={(f32[2]{0}, f32[2]{0}, "
    "f32[2]{0}, f32[2]{0}, f32[2]{0}, /*index=5*/f32[2]{0})->(f32[], s32[])}, "
    "allow_spmd_sharding_propagation_to_output={true}, num_partitions=8, replica_count=2, "
    'frontend_attributes={fingerprint_before_lhs="47d7",x="a,b"}'
)


def test_header_attributes() -> None:
    module = parse_module(
        HEADER + "\n\nENTRY %main () -> f32[] {\n  ROOT %c = f32[] constant(0)\n}\n"
    )
    assert module.name == "jit_step"
    assert module.is_scheduled
    assert module.num_partitions == 8
    assert module.replica_count == 2
    attributes = module.header_attributes
    assert list(attributes) == [
        "is_scheduled",
        "entry_computation_layout",
        "allow_spmd_sharding_propagation_to_output",
        "num_partitions",
        "replica_count",
        "frontend_attributes",
    ]
    layout = attributes["entry_computation_layout"]
    assert layout.startswith("{(f32[2]{0},") and layout.endswith(
        "/*index=5*/f32[2]{0})->(f32[], s32[])}"
    )
    assert parse_frontend_attributes(attributes["frontend_attributes"]) == {
        "fingerprint_before_lhs": "47d7",
        "x": "a,b",
    }


def test_header_defaults() -> None:
    module = parse_module(
        "HloModule bare\n\nENTRY %main () -> f32[] {\n  ROOT %c = f32[] constant(0)\n}\n"
    )
    assert module.name == "bare"
    assert module.header_attributes == {}
    assert not module.is_scheduled
    assert module.num_partitions == 1
    assert module.replica_count == 1


def test_comment_lines_before_header() -> None:
    text = "// RUN: something\n// CHECK: x\nHloModule m\n\nENTRY %e () -> f32[] {\n  ROOT %c = f32[] constant(0)\n}\n"
    module = parse_module(text)
    assert module.name == "m"
    assert module.entry.get("c").line == 6  # type: ignore[union-attr]
    assert module.print() == text


OPERANDS = """\
HloModule m

ENTRY %main (p: f32[2]) -> (f32[2], f32[2], f32[2], f32[2], f32[2], f32[2], f32[2]) {
  %p = f32[2]{0} parameter(0)
  %n.1 = f32[2]{0} negate(%p)
  %n.2 = f32[2]{0} negate(%n.1)
  %t = (f32[2]{0}, f32[2]{0}, f32[2]{0}, f32[2]{0}, f32[2]{0}, /*index=5*/f32[2]{0}, f32[2]{0}) tuple(%p, %n.1, %n.2, %p, %n.1, /*index=5*/%n.2, %p)
  %with_shapes = (f32[2]{0}, f32[2]{0}) tuple(f32[2]{0} %p, /*index=1*/f32[2]{0} %n.1)
  %c = f32[2]{0} constant({1, 2})
  %i = s32[2]{0} iota(), iota_dimension=0
  %tok = token[] after-all()
  ROOT %gte = f32[2]{0} get-tuple-element(%t), index=5
}
"""


def test_operands_with_index_comments() -> None:
    module = parse_module(OPERANDS)
    comp = module.entry
    t = comp.get("t")
    assert t is not None
    assert t.operand_names == ["p", "n.1", "n.2", "p", "n.1", "n.2", "p"]
    assert [o.name for o in t.operands] == t.operand_names
    assert t.operands_text.startswith("%p, %n.1") and "/*index=5*/%n.2" in t.operands_text
    assert comp.get("with_shapes").operand_names == ["p", "n.1"]  # type: ignore[union-attr]
    assert comp.get("c").operand_names == []  # type: ignore[union-attr]
    assert comp.get("i").operand_names == []  # type: ignore[union-attr]
    assert comp.get("tok").operand_names == []  # type: ignore[union-attr]
    gte = comp.root
    assert gte.name == "gte" and gte.is_root
    assert gte.attributes == {"index": "5"}
    assert t.shape.tuple_shapes[5] == Shape("f32", (2,))
    assert module.print() == OPERANDS


TRICKY_ATTRIBUTES = (
    "HloModule m\n\nENTRY %main (p: f32[8]) -> f32[8] {\n"
    "  %p = f32[8]{0} parameter(0)\n"
    '  ROOT %n = f32[8]{0} negate(%p), sharding={devices=[2]<=[2]}, frontend_attributes={a="{,}",b="x"}, '
    'metadata={op_name="jit(f)/a, b={c}=(d" source_file="/x/y.py" source_line=3}, '
    'backend_config={"k":"}{\\"]","l":[{"m":"(,"}],"n":"a=b, c=d"}\n'
    "}\n"
)


def test_attributes_with_brackets_inside_strings() -> None:
    module = parse_module(TRICKY_ATTRIBUTES)
    inst = module.entry.root
    assert list(inst.attributes) == [
        "sharding",
        "frontend_attributes",
        "metadata",
        "backend_config",
    ]
    assert inst.attribute("sharding") == "{devices=[2]<=[2]}"
    assert parse_frontend_attributes(inst.attributes["frontend_attributes"]) == {
        "a": "{,}",
        "b": "x",
    }
    assert (
        inst.attribute("metadata")
        == '{op_name="jit(f)/a, b={c}=(d" source_file="/x/y.py" source_line=3}'
    )
    assert parse_backend_config(inst.attributes["backend_config"]) == {
        "k": '}{"]',
        "l": [{"m": "(,"}],
        "n": "a=b, c=d",
    }
    assert module.print() == TRICKY_ATTRIBUTES


def test_set_attribute_replaces_in_place_and_adds_frontend_attributes_canonically() -> None:
    module = parse_module(TRICKY_ATTRIBUTES)
    inst = module.entry.root
    inst.set_attribute("sharding", "{replicated}")
    assert list(inst.attributes) == [
        "sharding",
        "frontend_attributes",
        "metadata",
        "backend_config",
    ]
    assert ", sharding={replicated}, frontend_attributes=" in module.print()
    other = module.entry.get("p")
    assert other is not None
    other.set_attribute("frontend_attributes", '{k="v"}')
    assert other.text == '  %p = f32[8]{0} parameter(0), frontend_attributes={k="v"}'
    # Untouched lines print from their source.
    assert module.print().split("\n")[0] == "HloModule m"


def test_structure_is_in_text_and_schedule_order() -> None:
    module = parse_module(MODULE_TEMPLATE.replace("REPLICA_GROUPS", "{}"))
    assert [c.name for c in module.computations] == ["add", "main"]
    assert [c.is_entry for c in module.computations] == [False, True]
    assert module.entry.name == "main"
    assert [i.name for i in module.computation("add").instructions] == ["lhs", "rhs", "sum"]  # type: ignore[union-attr]
    assert [i.line for i in module.instructions()] == [4, 5, 6, 10, 11]
    ar = module.entry.get("ar")
    assert ar is not None and ar.opcode == "all-reduce" and ar.is_root
    assert ar.shape == Shape("f32", (8,))
    assert parse_replica_groups(ar.attributes["replica_groups"]) == ()
    assert module.computation("nope") is None


def test_attributes_are_decoded_lazily() -> None:
    """A malformed attribute list parses; it is an error only once read."""
    text = "HloModule m\n\nENTRY %main (p: f32[8]) -> f32[8] {\n  ROOT %p = f32[8]{0} parameter(0) junk\n}\n"
    module = parse_module(text)
    with pytest.raises(HloError, match="expected ', attribute=value'"):
        module.entry.root.attributes  # noqa: B018


# -- the bracket/string scanner ---------------------------------------------------


def test_split_top_level() -> None:
    s = 'a={1,2}, b="x,}", c=(d, [e, f]), /*g, h*/ i'
    assert [s[a:b] for a, b in split_top_level(s)] == [
        "a={1,2}",
        'b="x,}"',
        "c=(d, [e, f])",
        "/*g, h*/ i",
    ]
    assert split_top_level("") == []
    assert split_top_level("   ") == []
    assert find_closing('(a, "b)", (c))', 0) == 13


@pytest.mark.parametrize(
    ("text", "offset", "message"),
    [
        ("a={1,2", 2, "'{' is never closed: expected '}'"),
        ("a={1,2]", 6, "unbalanced ']': expected '}'"),
        ("a=1)", 3, "unbalanced ')'"),
        ('a="x', 2, "unterminated string"),
    ],
)
def test_split_top_level_errors(text: str, offset: int, message: str) -> None:
    with pytest.raises(ScanError) as err:
        split_top_level(text)
    assert err.value.offset == offset
    assert message in err.value.message


# -- what XLA's parser accepts (its lexer skips whitespace and comments) ----------------

SPELLED_LIKE_XLA = [
    # iota forms with spaces (any whitespace between tokens)
    ("[2, 4]<=[8]", "[2,4]<=[8]"),
    ("[4,2]<=[2,4]T(1, 0)", "[4,2]<=[2,4]T(1,0)"),
    ("[ 4 , 2 ] <= [ 2 , 4 ] T( 1 , 0 )", "[4,2]<=[2,4]T(1,0)"),
    (" [2,4]<=[8] ", "[2,4]<=[8]"),
    # /*...*/ comments inside replica groups (commas and brackets in them included)
    ("{{0,1}, /*a,b}*/ {2,3}}", "{{0,1},{2,3}}"),
    ("{/*x*/{0, 1},{2,3 /*y*/}}", "{{0,1},{2,3}}"),
    ("[2,4]<=[8]/*x*/", "[2,4]<=[8]"),
    ("/*x*/[2,4]/*y*/<=[8]", "[2,4]<=[8]"),
    ("mesh['a'=2, 'b'=4] { /*c*/ 'b' }", "mesh['a'=2,'b'=4] {'b'}"),
    ("mesh['a'=2,'b'=4] {'a','b'} /*x*/", "mesh['a'=2,'b'=4] {'a','b'}"),
    ("mesh['a'=4,'b'=2] {'a' : ( 2 ) 2}", "mesh['a'=4,'b'=2] {'a':(2)2}"),
    (
        "mesh['a'=2,'b'=4], device_ids=([2, 4]T(1, 0)) {'b'}",
        "mesh['a'=2,'b'=4], device_ids=([2,4]T(1,0)) {'b'}",
    ),
    ("mesh['a'=2,'b'=4], device_ids=(0, 4, 1, 5, 2, 6, 3, 7) {'b'}", MESH_DEVICE_IDS),
]


@pytest.mark.parametrize(
    ("text", "canonical"), SPELLED_LIKE_XLA, ids=[t for t, _ in SPELLED_LIKE_XLA]
)
def test_replica_groups_with_whitespace_and_comments(text: str, canonical: str) -> None:
    assert parse_replica_groups(text) == parse_replica_groups(canonical)


def test_replica_groups_with_comments_in_a_module() -> None:
    """The comment's comma does not split the attribute list, and the value decodes."""
    text = MODULE_TEMPLATE.replace("REPLICA_GROUPS", "{{0,1,2,3}, /*x, y*/ {4,5,6,7}}")
    inst = parse_module(text).entry.root
    assert inst.attribute("replica_groups") == "{{0,1,2,3}, /*x, y*/ {4,5,6,7}}"
    assert parse_replica_groups(inst.attributes["replica_groups"]) == ((0, 1, 2, 3), (4, 5, 6, 7))


LAYOUT_LF = LAYOUT_MODULE.replace("REPLICA_GROUPS", "[2, 4]<=[8]")
LAYOUTS = {"tabs-comments-blank-lines": LAYOUT_LF, "crlf": LAYOUT_LF.replace("\n", "\r\n")}


@pytest.mark.parametrize("text", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_layouts_xla_accepts(text: str) -> None:
    module = parse_module(text)
    assert [(c.name, [i.name for i in c.instructions]) for c in module.computations] == [
        ("add", ["a", "b", "s"]),
        ("main", ["p", "ar", "n"]),
    ]
    assert module.computation("add").root.name == "s"  # type: ignore[union-attr]
    ar = module.entry.get("ar")
    assert ar is not None and ar.operand_names == ["p"]
    assert list(ar.attributes) == [
        "channel_id",
        "replica_groups",
        "use_global_device_ids",
        "to_apply",
    ]
    assert ar.attributes["to_apply"] == "%add"  # no "\r" in the last attribute of a CRLF line
    assert parse_replica_groups(ar.attributes["replica_groups"]) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert module.num_partitions == 8
    # Untouched: byte for byte, comment and blank lines, tabs and "\r" included.
    assert module.print() == text
    # Edited: only that line changes, and it keeps the file's line ends.
    ar.set_attribute("frontend_attributes", '{k="v"}')
    before, after = text.split("\n"), module.print().split("\n")
    assert [i for i, (x, y) in enumerate(zip(before, after, strict=True)) if x != y] == [14]
    assert after[14].endswith(
        'to_apply=%add, frontend_attributes={k="v"}' + ("\r" if "\r" in text else "")
    )


def test_crlf_errors_show_the_line_without_its_carriage_return() -> None:
    text = LAYOUTS["crlf"].replace("negate(%ar)", "negate(%nope)")
    with pytest.raises(HloError) as err:
        parse_module(text, "crlf.hlo")
    assert (err.value.line, err.value.source_line) == (16, "  ROOT %n = f32[8]{0} negate(%nope)")
    assert "\r" not in str(err.value)


@pytest.mark.parametrize(
    "header",
    [
        "ENTRY %main {",
        "ENTRY %main (p: f32[8])->f32[8]{",
        "ENTRY\t%main\t(p: f32[8]) -> f32[8]  {  ",
    ],
)
def test_computation_header_spellings(header: str) -> None:
    text = f"HloModule m\n\n{header}\n  ROOT %p = f32[8]{{0}} parameter(0)\n}}\n"
    module = parse_module(text)
    assert module.entry.name == "main"
    assert module.print() == text


# -- jax 0.11/0.12 forms -----------------------------------------------------------

TUPLE_OPERANDS = """\
HloModule m

ENTRY %main (p: f32[2]) -> f32[2] {
  %p = f32[2]{0} parameter(0)
  %u = (f32[2]{0}, s32[]) tuple(%p, %p)
  %t = (f32[2]{0}, (f32[2]{0}, s32[])) tuple(%p, %u)
  %a = f32[2]{0} add(%t#0, %u#0)
  %b = f32[2]{0} add(f32[2]{0} %t#1#0, /*index=1*/%u # 0)
  ROOT %r = (f32[2]{0}, s32[]) tuple(%a, %t#1#1)
}
"""


def test_tuple_element_operands() -> None:
    """jax >= 0.11 dumps write get-tuple-element inline: ``%t#1#0`` is ``t[1][0]``
    (jaxlib 0.12's parser reads them so; see test_hlo_roundtrip.py)."""
    module = parse_module(TUPLE_OPERANDS)
    get = module.entry.get
    a, b, r = get("a"), get("b"), get("r")
    assert a is not None and b is not None and r is not None
    assert a.operand_refs == [("t", (0,)), ("u", (0,))]
    assert b.operand_refs == [("t", (1, 0)), ("u", (0,))]
    assert r.operand_refs == [("a", ()), ("t", (1, 1))]
    assert a.operand_names == ["t", "u"]
    assert [o.name for o in b.operands] == ["t", "u"]
    assert b.operand_shapes == [Shape("f32", (2,)), Shape("f32", (2,))]
    assert r.operand_shapes == [Shape("f32", (2,)), Shape("s32", ())]
    assert r.operand_shape_texts == ["f32[2]{0}", "s32[]"]
    assert module.print() == TUPLE_OPERANDS


def test_tuple_element_shape_text_drops_index_comment() -> None:
    """What a pass needs to spell a new instruction's operand shape (XLA prints
    `/*index=N*/` before every fifth element of a long tuple)."""
    text = OPERANDS.replace("get-tuple-element(%t), index=5", "negate(%t#5)")
    gte = parse_module(text).entry.root
    assert gte.operand_refs == [("t", (5,))]
    assert gte.operand_shape_texts == ["f32[2]{0}"]


@pytest.mark.parametrize(
    ("operand", "message"),
    [
        ("%u#2", "operand '%u': no tuple element 2 in shape '(f32[2]{0}, s32[])'"),
        ("%p#0", "operand '%p': no tuple element 0 in shape 'f32[2]{0}'"),
        ("%u#0#0", "operand '%u': no tuple element 0"),
        ("%u#-1", "tuple index of '%u' is negative"),
        ("%u#", "bad tuple index of '%u': expected an integer, found ''"),
        (
            "%u#99999999999999999999",
            "bad tuple index of '%u': integer 99999999999999999999 is out of range",
        ),
        ("#0", "expected an operand '%name', found '#0'"),
    ],
)
def test_tuple_element_operand_errors(operand: str, message: str) -> None:
    text = TUPLE_OPERANDS.replace("add(%t#0, %u#0)", f"add(%t#0, {operand})")
    inst = parse_module(text).entry.get("a")
    assert inst is not None
    with pytest.raises(HloError) as err:
        inst.operand_shapes  # noqa: B018
    assert message in err.value.message
    assert err.value.line == 7


ALL_REDUCE_012 = hlo_module(
    "HloModule m, is_scheduled=true, num_partitions=4",
    """\
ENTRY %main (p: (f32[8], s32[])) -> f32[8] {
  %p = (f32[8]{0}, s32[]) parameter(0)
  %ars = ((f32[8]{0}), f32[8]{0}) all-reduce-start(%p#0), channel_id=1, replica_groups=mesh['x'=4] {'x'}, use_global_device_ids=true, to_apply=%add, output_to_operand_aliasing={{1}: (0, {})}, backend_config={"operation_queue_id":"0","wait_on_operation_queues":[],"collective_backend_config":{"is_sync":false,"no_parallel_custom_call":false,"is_pipelined":false,"backend":"DEFAULT"},"force_earliest_schedule":false,"reification_cost":[],"device_type":"DEVICE_TYPE_INVALID"}
  ROOT %ard = f32[8]{0} all-reduce-done(%ars)
}
""",
)


def test_jax_0_12_async_all_reduce() -> None:
    """``((T), T) all-reduce-start`` with ``output_to_operand_aliasing={{1}: (0, {})}``
    and a tuple-element operand: the `{}: (` value is one attribute."""
    from xla_streams.streams import find_async_pairs

    module = parse_module(ALL_REDUCE_012)
    ars = module.entry.get("ars")
    assert ars is not None
    assert list(ars.attributes) == [
        "channel_id",
        "replica_groups",
        "use_global_device_ids",
        "to_apply",
        "output_to_operand_aliasing",
        "backend_config",
    ]
    assert ars.attributes["output_to_operand_aliasing"] == "{{1}: (0, {})}"
    assert (
        parse_backend_config(ars.attributes["backend_config"])["device_type"]
        == "DEVICE_TYPE_INVALID"
    )
    assert ars.operand_refs == [("p", (0,))]
    pairs = find_async_pairs(module)
    assert [(p.start, p.done, p.groups) for p in pairs] == [("ars", "ard", ((0, 1, 2, 3),))]
    assert module.print() == ALL_REDUCE_012


JAX_0_12_DUMP = Path(__file__).resolve().parents[1] / "data" / "jax0_12_fsdp_scan.dump.hlo"


def test_jax_0_12_dump() -> None:
    """A real jax 0.12 deviceless H100 dump (``--xla_dump_to``, after optimizations) of a
    2-layer FSDP scan: tuple-element operands everywhere, async all-gathers in the while
    body. Made by the forward half of programs.embedded._fsdp on 4 devices, overlap limit 2."""
    from xla_streams.streams import find_async_pairs

    text = JAX_0_12_DUMP.read_bytes().decode("utf-8")
    module = parse_module(text, str(JAX_0_12_DUMP))
    assert module.print() == text
    indexed = [i for i in module.instructions() if any(path for _, path in i.operand_refs)]
    assert len(indexed) >= 5
    for inst in module.instructions():
        assert len(inst.operand_shapes) == len(inst.operands)
    start = next(i for i in module.instructions() if i.name == "fusion-start.1")
    assert start.operand_refs == [("param", (2,)), ("param", (0,))]
    assert start.operand_shapes == [Shape("f32", (2, 512, 4096)), Shape("s32", ())]
    pairs = find_async_pairs(module)
    assert sorted((p.kind, p.groups) for p in pairs) == [("all-gather", ((0, 1, 2, 3),))] * 2


# -- decoders reject what XLA rejects, and bound what they expand -----------------------


@pytest.mark.parametrize(
    ("text", "offset", "message"),
    [
        ("mesh['a'=2] {}", 12, "expected at least one mesh axis to group over, found '{}'"),
        ("mesh['a'=0] {'a'}", 9, "mesh axis 'a' has size 0"),
        ("mesh['a'=2,'a'=2] {'a'}", 11, "duplicate mesh axis 'a'"),
        ("mesh['a'=2,'b'=2] {'a','a'}", 23, "mesh axes to group over overlap"),
        ("mesh['a'=8] {'a':(1)2,'a':(1)4}", 22, "mesh axes to group over overlap"),
        ("mesh['a'=12] {'a':(2)2,'a':(3)4}", 14, "sub-axes of mesh axis 'a' overlap"),
        ("mesh['a'=8] {'a':(0)2}", 13, "expected (pre-size >= 1)size >= 2"),
        ("mesh['a'=8] {'a':(1)1}", 13, "expected (pre-size >= 1)size >= 2"),
        ("mesh['a'=99999999999] {'a'}", 9, "the mesh has more than the 65536 devices"),
        ("mesh['a'=256,'b'=257] {'a'}", 17, "the mesh has more than the 65536 devices"),
        ("mesh['a'=2] {'a'} x", 17, "unexpected ' x'"),
        ("mesh['a'=2} {'a'}", 0, "unbalanced '}': expected ']'"),
        ("mesh['a'=2,'b'=4], device_ids=([3,4]) {'b'}", 31, "device_ids are not a permutation"),
        (
            "mesh['a'=2,'b'=4], device_ids=([99999999999,99999999999]) {'b'}",
            31,
            "device_ids are not a permutation",
        ),
        ("[1,300000000]<=[300000000]", 0, "1x300000000 groups address more than the 65536 devices"),
        ("[1,8]<=[99999999999,99999999999]", 0, "do not cover the more than MAX_DEVICES devices"),
        ("[0,0]<=[0]", 0, "expected at least one device each"),
        ("[2,4]<=[99999999999999999999]", 8, "integer 99999999999999999999 is out of range"),
        ("{{0,1},{1,2}}", 7, "device 1 is in more than one replica group"),
        ("{{0,1},{}}", 7, "empty replica group"),
        ("{{0,-1}}", 1, "negative device id -1"),
    ],
)
def test_replica_groups_rejected(text: str, offset: int, message: str) -> None:
    with pytest.raises(ScanError) as err:
        parse_replica_groups(text)
    assert message in err.value.message
    assert err.value.offset == offset


def test_source_target_pairs_each_device_once_per_role() -> None:
    with pytest.raises(ScanError, match="device 0 is a source in more than one pair"):
        parse_source_target_pairs("{{0,1},{0,2}}")
    with pytest.raises(ScanError, match="device 1 is a target in more than one pair"):
        parse_source_target_pairs("{{0,1},{2,1}}")


def test_header_device_counts_are_checked() -> None:
    def header(attributes: str) -> str:
        return f"HloModule m, {attributes}\n\nENTRY %e () -> f32[] {{\n  ROOT %c = f32[] constant(0)\n}}\n"

    module = parse_module(header("replica_count=256, num_partitions=256"))
    assert (module.replica_count, module.num_partitions) == (256, 256)
    for attributes, message in [
        ("replica_count=abc", "replica_count must be a positive integer, found 'abc'"),
        ("num_partitions=-2", "num_partitions must be a positive integer, found '-2'"),
        ("num_partitions=65537", "num_partitions=65537 is more than the 65536 devices"),
        ("replica_count=2, num_partitions=32769", "replica_count=2 x num_partitions=32769"),
    ]:
        with pytest.raises(HloError, match=re.escape(message)):
            parse_module(header(attributes))
