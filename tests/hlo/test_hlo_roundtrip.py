"""Every fixture through the front end, with XLA's own parser as the oracle.

For each ``hlo_fixtures/*.hlo``:

* parse + print of an unmodified module gives the input back byte for byte;
* XLA (``jaxlib._hlo.hlo_module_from_text``) accepts what we print, and sees
  the same computations, and in each the same instructions, names and opcodes,
  in the same order (and, for scheduled modules, the same schedule);
* edits print in XLA's canonical form: after ``annotate-streams`` (and after
  setting a frontend attribute on *every* instruction) XLA's ``to_string()``
  of each edited instruction lists the same attributes, in the same order,
  with the same values as our printed line; every untouched line is
  byte-identical; and XLA's IR carries the ``_xla_stream_annotation``.

Differences between what XLA's IR holds and the text, and how they are
normalised here:

* The sugared spelling ``%x = ... reduce-scatter-start(%a), <collective attrs>``
  (what ``compiled.as_text()`` prints) is, in XLA's IR, an ``async-start``
  whose ``calls=`` names a computation the parser *creates* (``async_wrapped``
  ...). Those computations exist for XLA and not in the text: every XLA
  computation missing from our module must be the wrapped computation of one
  of our sugared starts (it holds the ``async_wrapped_root()`` of that start).
* Conversely XLA always *prints* async ops sugared: the dump spelling
  ``async-start(%a), calls=%async_computation`` comes back from ``to_string()``
  as ``reduce-scatter-start(%a), channel_id=..., replica_groups=...``: the
  wrapped collective's own attributes replace ``calls=``. Opcodes are compared
  as XLA's enum (``kAsyncStart`` + the wrapped root's opcode) and attributes of
  such an instruction as "ours without calls= is a suffix of XLA's".
* XLA copies an async start's metadata/backend_config onto the wrapped
  instruction, so instructions inside async-wrapped computations are not
  compared attribute by attribute.
* XLA renumbers the stack frame table, so ``stack_frame_id=N`` in metadata is
  compared modulo renumbering.

XLA's parser aborts the whole process (CHECK failure) on some malformed input,
so only well-formed text is ever handed to it here.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from conftest import LAYOUT_MODULE, xla_parsable
from jaxlib import _hlo

from xla_streams.hlo import HloError, Instruction, Module, parse_module
from xla_streams.hlo.attributes import parse_frontend_attributes, parse_replica_groups
from xla_streams.hlo.module import OPCODES
from xla_streams.hlo.text import find_closing, split_top_level
from xla_streams.passes.annotate_streams import STREAM_ATTRIBUTE
from xla_streams.passes.base import Compilation
from xla_streams.pipeline import PassManager

REPO = Path(__file__).resolve().parents[2]
FIXTURE_DIR = REPO / "hlo_fixtures"
# Used only until hlo_fixtures/ has a MANIFEST (the fixtures were being generated).
FALLBACK_FIXTURES = [Path("/tmp/forms.text.hlo"), Path("/tmp/forms.dump.hlo"), Path("/tmp/big.hlo")]
# Fixtures above this size skip the (slow) every-instruction edit oracle; the
# annotate-streams edit and the structural oracle still run on them.
EDIT_ALL_MAX_BYTES = 1_000_000


def _manifest_exists() -> bool:
    return any(FIXTURE_DIR.glob("MANIFEST*"))


def fixture_paths() -> list[Path]:
    found = sorted(FIXTURE_DIR.glob("*.hlo"))
    if found or _manifest_exists():
        return found
    return [p for p in FALLBACK_FIXTURES if p.exists()]


FIXTURES = fixture_paths()
IDS = [p.name for p in FIXTURES]


def test_fixture_directory_is_populated() -> None:
    """Once the fixture generator has written its MANIFEST there must be fixtures."""
    if not _manifest_exists():
        if not FIXTURES:
            pytest.fail("hlo_fixtures/ has no MANIFEST and no fixture")
        return
    assert sorted(FIXTURE_DIR.glob("*.hlo")), f"{FIXTURE_DIR} has a MANIFEST but no .hlo files"


# -- loading (each fixture parsed once per test session) ----------------------


@cache
def source(path: Path) -> str:
    # Bytes decoded as-is: no newline translation, so "byte for byte" means it.
    return path.read_bytes().decode("utf-8")


@cache
def ours(path: Path) -> Module:
    return parse_module(source(path), str(path))


@cache
def xla(path: Path) -> object:
    return _hlo.hlo_module_from_text(xla_parsable(ours(path).print()))


# -- opcodes: XLA's enum <-> the text spelling -----------------------------------

# Enum members whose text spelling is not the kebab-case of the member name.
_SPELLING = {
    "kExp": "exponential",
    "kExpm1": "exponential-minus-one",
    "kLog1p": "log-plus-one",
    "kOptimizationBarrier": "opt-barrier",
    "kPopulationCount": "popcnt",
    "kClz": "count-leading-zeros",
    "kTopK": "topk",
    "kAtan2": "atan2",
    "kCos": "cosine",
    "kSin": "sine",
}
_ASYNC = {"kAsyncStart": "async-start", "kAsyncUpdate": "async-update", "kAsyncDone": "async-done"}


def _kebab(member: str) -> str:
    if member in _SPELLING:
        return _SPELLING[member]
    return re.sub(r"(?<!^)(?=[A-Z])", "-", member[1:]).lower()


TEXT_TO_ENUM = {_kebab(m): m for m in _hlo.HloOpcode.__members__}


def xla_kind(inst: object) -> tuple[str, str]:
    """(enum member, wrapped collective's opcode for async-start, else "")."""
    member = inst.opcode.name  # type: ignore[attr-defined]
    wrapped = ""
    if member == "kAsyncStart":
        wrapped = _kebab(inst.async_wrapped_root().opcode.name)  # type: ignore[attr-defined]
    return member, wrapped


def our_kind(inst: Instruction, module: Module) -> tuple[str, str]:
    """Our opcode as XLA's enum; sugared ``X-start`` and ``async-start`` both map to kAsyncStart."""
    opcode = inst.opcode
    if opcode in TEXT_TO_ENUM:
        member = TEXT_TO_ENUM[opcode]
        if member != "kAsyncStart":
            return member, ""
        calls = inst.attribute("calls")
        assert calls is not None, f"{inst}: async-start without calls="
        callee = module.computation(calls.lstrip("%"))
        assert callee is not None, f"{inst}: unknown computation {calls}"
        return member, callee.root.opcode
    m = re.fullmatch(r"(.+)-(start|update|done)", opcode)
    assert m is not None, (
        f"{inst}: opcode '{opcode}' is neither an XLA opcode nor a sugared async op"
    )
    phase = {"start": "kAsyncStart", "update": "kAsyncUpdate", "done": "kAsyncDone"}[m.group(2)]
    return phase, m.group(1) if phase == "kAsyncStart" else ""


def test_opcode_spelling_table_covers_xla() -> None:
    """Every XLA opcode gets a distinct spelling, so the comparison below is exact."""
    assert len(TEXT_TO_ENUM) == len(_hlo.HloOpcode.__members__)
    assert TEXT_TO_ENUM["all-reduce-start"] == "kAllReduceStart"
    assert TEXT_TO_ENUM["get-tuple-element"] == "kGetTupleElement"
    assert TEXT_TO_ENUM["async-start"] == "kAsyncStart"


def test_the_front_end_knows_xla_opcodes() -> None:
    """The opcodes the front end reads (an unknown one is refused, as XLA does) are XLA's."""
    assert set(TEXT_TO_ENUM) == OPCODES


# -- attributes of one printed instruction line ---------------------------------

_HEAD = re.compile(r"\s*(?:ROOT )?%?[^\s=%]+ = (?:\(.*?\)|\S+) [a-z][a-z0-9\-]*\(")


def line_attributes(line: str) -> list[tuple[str, str]]:
    """``[(key, raw value)]`` of an instruction line, in printed order."""
    m = _HEAD.match(line)
    assert m is not None, line
    close = find_closing(line, m.end() - 1)
    if close + 1 == len(line):
        return []
    assert line.startswith(", ", close + 1), line
    result = []
    for a, b in split_top_level(line, close + 3):
        key, eq, value = line[a:b].partition("=")
        assert eq, line[a:b]
        result.append((key, value))
    return result


_STACK_FRAME = re.compile(r"stack_frame_id=\d+")


def normalised(key: str, value: str) -> object:
    if key == "metadata":
        return _STACK_FRAME.sub("stack_frame_id=N", value)
    if key == "backend_config" and value.startswith("{"):
        return json.loads(value)
    return value


def wrapped_computations(module: Module) -> set[str]:
    """Names of computations our module's async-starts call (XLA rewrites their bodies)."""
    names = set()
    for inst in module.instructions():
        if inst.opcode == "async-start" and inst.attribute("calls"):
            names.add(inst.attribute("calls").lstrip("%"))  # type: ignore[union-attr]
    return names


def compare_attributes(ours_inst: Instruction, xla_line: str) -> None:
    """XLA's printed attributes of an instruction equal ours: keys, order and values."""
    # What xla_parsable dropped, XLA cannot print back.
    mine = [
        (k, normalised(k, v))
        for k, v in ours_inst.attributes.items()
        if (k, v) != ("output_to_operand_aliasing", "{{1}: (0, {})}")
    ]
    theirs = [(k, normalised(k, v)) for k, v in line_attributes(xla_line)]
    where = f"{ours_inst.computation.module.path}:{ours_inst.line} %{ours_inst.name}"
    if ours_inst.opcode.startswith("async-"):
        # XLA prints the sugared form: the wrapped collective's attributes instead of calls=.
        mine = [(k, v) for k, v in mine if k != "calls"]
        assert theirs[len(theirs) - len(mine) :] == mine, (
            f"{where}: attributes differ\n ours: {mine}\n  XLA: {theirs}"
        )
    else:
        assert [k for k, _ in theirs] == [k for k, _ in mine], (
            f"{where}: attribute order differs\n ours: {[k for k, _ in mine]}\n  XLA: "
            f"{[k for k, _ in theirs]}\n  our line: {ours_inst.text.strip()}\n  XLA line: {xla_line}"
        )
        assert theirs == mine, f"{where}: attribute values differ\n ours: {mine}\n  XLA: {theirs}"


def xla_instructions(module: object) -> dict[tuple[str, str], object]:
    return {
        (c.name, i.name): i
        for c in module.computations()  # type: ignore[attr-defined]
        for i in c.instructions()
    }


# -- the round trip ---------------------------------------------------------------


@pytest.mark.parametrize("path", FIXTURES, ids=IDS)
def test_print_unmodified_is_byte_identical(path: Path) -> None:
    text = source(path)
    module = ours(path)
    assert module.print() == text  # unedited
    module.restructured = True  # printed from its parts: each untouched line as it was
    printed = module.print()
    if printed != text:
        a, b = text.split("\n"), printed.split("\n")
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        where = f"line {first + 1}" if first is not None else f"line count {len(a)} vs {len(b)}"
        pytest.fail(f"{path.name}: printed text differs from the input at {where}")
    assert printed.encode("utf-8") == path.read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("path", FIXTURES, ids=IDS)
def test_xla_agrees_on_structure(path: Path) -> None:
    module = ours(path)
    oracle = xla(path)  # XLA accepts what we print
    our_names = [c.name for c in module.computations]
    xla_comps = {c.name: c for c in oracle.computations()}  # type: ignore[attr-defined]
    xla_names = list(xla_comps)
    extra = set(xla_names) - set(our_names)
    assert not set(our_names) - set(xla_names), "computations XLA does not have"
    assert [n for n in xla_names if n not in extra] == our_names

    # Each computation XLA has and we do not is the wrapped body of a sugared start.
    sugared_bodies: set[str] = set()
    nonfusion = {c.name for c in oracle.make_nonfusion_computations()}  # type: ignore[attr-defined]
    for comp in module.computations:
        xla_comp = xla_comps[comp.name]
        ours_names = {i.name for i in comp.instructions}
        # For a %t#1 operand (jax >= 0.11 dumps) XLA makes the get-tuple-element itself.
        xla_insts = [
            i
            for i in xla_comp.instructions()
            if i.name in ours_names or xla_kind(i)[0] != "kGetTupleElement"
        ]
        if comp.name not in nonfusion:
            # A fusion body: XLA lists it in its own post-order and, parsing a jax 0.12
            # dump, may rename its parameters; the same instructions all the same.
            assert sorted(xla_kind(i)[0] for i in xla_insts) == sorted(
                xla_kind(i)[0] for i in xla_comp.instructions()
            )
            assert len(xla_insts) == len(comp.instructions), f"{path.name}: {comp.name}"
            continue
        assert [i.name for i in xla_insts] == [i.name for i in comp.instructions], (
            f"{path.name}: instruction order differs in computation '{comp.name}'"
        )
        for mine, theirs in zip(comp.instructions, xla_insts, strict=True):
            assert our_kind(mine, module) == xla_kind(theirs), (
                f"{path.name}:{mine.line}: %{mine.name} is '{mine.opcode}' to us and "
                f"{xla_kind(theirs)} to XLA"
            )
            if mine.opcode != "async-start" and xla_kind(theirs)[0] == "kAsyncStart":
                root = theirs.async_wrapped_root().name  # type: ignore[attr-defined]
                body = [n for n in extra if root in {i.name for i in xla_comps[n].instructions()}]
                assert len(body) == 1, f"{mine}: wrapped computation of {root} not found"
                sugared_bodies.add(body[0])
    assert sugared_bodies == extra

    if module.is_scheduled:
        schedule = oracle.schedule()  # type: ignore[attr-defined]
        for xla_comp in oracle.make_nonfusion_computations():  # type: ignore[attr-defined]
            if xla_comp.name in extra:
                continue
            comp = module.computation(xla_comp.name)
            assert comp is not None
            names = {i.name for i in comp.instructions}
            sequence = [  # without the get-tuple-elements XLA made for %t#1 operands
                i.name
                for i in schedule.sequence(xla_comp)
                if i.name in names or xla_kind(i)[0] != "kGetTupleElement"
            ]
            assert sequence == [i.name for i in comp.instructions], (
                f"{path.name}: XLA's schedule of '{comp.name}' is not our instruction order"
            )


# -- edits ----------------------------------------------------------------------------


def _renamed_by_xla(inst: Instruction, key: tuple[str, str], by_name: dict[Any, Any]) -> bool:
    """Reading %t#0 operands XLA names its own get-tuple-elements (param_0.N) first, and
    renames a fusion parameter of that name."""
    return key not in by_name and inst.opcode == "parameter"


def check_edit(path: Path, module: Module, printed: str) -> object:
    """Untouched lines byte-identical; XLA prints every edited line as we do. Returns XLA's module."""
    before = source(path).split("\n")
    after = printed.split("\n")
    assert len(after) == len(before)
    edited = {
        inst.line: inst for inst in module.instructions() if inst.text != before[inst.line - 1]
    }
    for number, (old, new) in enumerate(zip(before, after, strict=True), start=1):
        if number not in edited:
            assert new == old, f"{path.name}:{number}: untouched line changed"
        else:
            assert new == edited[number].text
    oracle = _hlo.hlo_module_from_text(xla_parsable(printed))
    by_name = xla_instructions(oracle)
    skip = wrapped_computations(module)
    for inst in edited.values():
        key = (inst.computation.name, inst.name)
        if inst.computation.name in skip or _renamed_by_xla(inst, key, by_name):
            continue
        compare_attributes(inst, by_name[key].to_string())
    return oracle


@pytest.mark.slow
@pytest.mark.parametrize("path", FIXTURES, ids=IDS)
def test_annotate_streams_edit_is_canonical(path: Path) -> None:
    module = parse_module(source(path), str(path))
    compilation = PassManager.from_spec(
        "find-async-pairs,assign-streams{streams=4},verify-streams,annotate-streams"
    ).run(Compilation(module))
    assignment = compilation.assignment
    assert assignment is not None
    oracle = check_edit(path, module, module.print())
    by_name = xla_instructions(oracle)
    annotated = 0
    for pair in compilation.pairs:
        stream = assignment.stream_of[pair.start]
        for name in (pair.start, pair.done):
            printed = by_name[(pair.computation, name)].to_string()  # type: ignore[attr-defined]
            fa = dict(line_attributes(printed)).get("frontend_attributes")
            got = parse_frontend_attributes(fa).get(STREAM_ATTRIBUTE) if fa else None
            # Sync pairs are not annotated: XLA runs them where it does regardless.
            expected = None if stream is None or pair.sync else str(stream)
            assert got == expected, f"{path.name}: XLA sees {STREAM_ATTRIBUTE}={got} on %{name}"
            annotated += got is not None
    if any(assignment.stream_of[p.start] is not None for p in compilation.pairs):
        assert annotated
        assert STREAM_ATTRIBUTE.encode() in oracle.as_serialized_hlo_module_proto()  # type: ignore[attr-defined]


# The large module repeats the smaller ones' instruction kinds; editing all of its
# 29k lines would only add minutes.
SMALL_FIXTURES = [p for p in FIXTURES if p.stat().st_size <= EDIT_ALL_MAX_BYTES]


@pytest.mark.slow
@pytest.mark.parametrize("path", SMALL_FIXTURES, ids=[p.name for p in SMALL_FIXTURES])
def test_frontend_attribute_on_every_instruction_is_canonical(path: Path) -> None:
    """A new frontend attribute goes exactly where XLA prints it, on every kind of instruction."""
    module = parse_module(source(path), str(path))
    for inst in module.instructions():
        inst.set_frontend_attribute("_xla_test_edit", "1")
    check_edit(path, module, module.print())
    # A second key merges into the existing attribute, sorted the way XLA sorts it.
    module = parse_module(module.print(), str(path))
    for inst in module.instructions():
        inst.set_frontend_attribute("_a_first", "x")
    oracle = _hlo.hlo_module_from_text(xla_parsable(module.print()))
    by_name = xla_instructions(oracle)
    skip = wrapped_computations(module)
    for inst in module.instructions():
        key = (inst.computation.name, inst.name)
        if inst.computation.name in skip or _renamed_by_xla(inst, key, by_name):
            continue
        compare_attributes(inst, by_name[key].to_string())
        assert inst.attributes["frontend_attributes"].startswith('{_a_first="x",')


# Attributes XLA prints around frontend_attributes, in XLA's canonical order
# (checked against jaxlib 0.10.2's printer); each line is canonical.
CANONICAL_ORDER = """\
HloModule canonical, is_scheduled=true

ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0), parameter_replication={true}, sharding={replicated}, origin={{"p"}}, metadata={op_name="p"}
  %n = f32[8]{0} negate(%p), control-predecessors={%p}, statistics={visualizing_index=1,stat-1=33}
  %e = f32[8]{0} exponential(%n), result_accuracy={mode=highest}, metadata={op_name="e"}, backend_config={"x":1}
  %o = f32[8]{0} negate(%e), origin={{"o"}}
  %s = f32[8]{0} negate(%o), statistics={visualizing_index=1,stat-1=33}
  ROOT %c = f32[8]{0} custom-call(%s), custom_call_target="foo", api_version=API_VERSION_TYPED_FFI, frontend_attributes={b="2"}, backend_config={}
}
"""


def test_canonical_text_is_its_own_xla_print() -> None:
    printed = _hlo.hlo_module_from_text(CANONICAL_ORDER).to_string()
    for line in CANONICAL_ORDER.splitlines()[3:-1]:
        assert line in printed, line


@pytest.mark.parametrize("name", ["p", "n", "e", "o", "s", "c"])
def test_new_frontend_attribute_goes_where_xla_prints_it(name: str) -> None:
    module = parse_module(CANONICAL_ORDER)
    inst = module.entry.get(name)
    assert inst is not None
    inst.set_frontend_attribute(STREAM_ATTRIBUTE, "3")
    printed = module.print()
    xla_line = xla_instructions(_hlo.hlo_module_from_text(printed))[("main", name)].to_string()
    compare_attributes(inst, xla_line)
    assert f'{STREAM_ATTRIBUTE}="3"' in xla_line
    # Every other line untouched.
    for old, new in zip(CANONICAL_ORDER.split("\n"), printed.split("\n"), strict=True):
        assert old == new or old == inst.source


# The spellings test_hlo_parse.py expects format_frontend_attributes to reproduce.
@pytest.mark.parametrize(
    "value",
    ["{k={{0,1}}}", "{k={}}", '{k="{"}', '{k="{1},{2}"}', '{a="{2}x",b={1}}', '{k="a\\"b"}'],
)
def test_xla_prints_frontend_attributes_like_this(value: str) -> None:
    text = (
        "HloModule m\n\nENTRY %main (p: f32[8]) -> f32[8] {\n"
        f"  ROOT %p = f32[8]{{0}} parameter(0), frontend_attributes={value}\n}}\n"
    )
    printed = _hlo.hlo_module_from_text(text).to_string()
    assert f"parameter(0), frontend_attributes={value}\n" in printed


# -- the edges of the grammar: XLA's parser (jaxlib 0.12) as the oracle -------------------

# Spellings we accept, as (spelling, XLA's canonical print of it).
ORACLE_GROUPS = [
    ("[2, 4]<=[8]", "[2,4]<=[8]"),
    ("[4,2]<=[2,4]T(1, 0)", "[4,2]<=[2,4]T(1,0)"),
    ("[ 2 , 4 ] <= [ 8 ]", "[2,4]<=[8]"),
    ("{{0,1,2,3}, /*x, y*/ {4,5,6,7}}", "{{0,1,2,3},{4,5,6,7}}"),
    ("mesh['a'=2, 'b'=4] { /*c*/ 'b' }", "mesh['a'=2,'b'=4] {'b'}"),
]


@pytest.mark.parametrize(
    ("spelling", "canonical"), ORACLE_GROUPS, ids=[g for g, _ in ORACLE_GROUPS]
)
@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_xla_accepts_the_layouts_we_accept(spelling: str, canonical: str, newline: str) -> None:
    """Tabs, CRLF, comment and blank lines, spaces and comments inside replica groups."""
    text = LAYOUT_MODULE.replace("REPLICA_GROUPS", spelling).replace("\n", newline)
    module = parse_module(text)
    module.restructured = True  # printed from its parts, not the source whole
    assert module.print() == text
    oracle = _hlo.hlo_module_from_text(text)
    assert {
        c.name: [i.name for i in c.instructions()]  # type: ignore[attr-defined]
        for c in oracle.computations()  # type: ignore[attr-defined]
    } == {c.name: [i.name for i in c.instructions] for c in module.computations}
    xla_line = xla_instructions(oracle)[("main", "ar")].to_string()  # type: ignore[attr-defined]
    assert dict(line_attributes(xla_line))["replica_groups"] == canonical
    ours_groups = parse_replica_groups(module.entry.get("ar").attributes["replica_groups"])  # type: ignore[union-attr]
    assert ours_groups == parse_replica_groups(canonical)


TUPLE_OPERANDS = """\
HloModule m

ENTRY %main (p: f32[2]) -> (f32[2], s32[]) {
  %p = f32[2]{0} parameter(0)
  %c = s32[] constant(1)
  %u = (f32[2]{0}, s32[]) tuple(%p, %c)
  %t = (f32[2]{0}, (f32[2]{0}, s32[])) tuple(%p, %u)
  %a = f32[2]{0} add(%t#0, %u#0)
  %b = f32[2]{0} add(f32[2]{0} %t#1#0, /*index=1*/%u # 0)
  ROOT %r = (f32[2]{0}, s32[]) tuple(%b, %t#1#1)
}
"""


def _xla_operand_refs(inst: object) -> list[tuple[str, tuple[int, ...]]]:
    """XLA's operands of ``inst`` as (name, index path): its get-tuple-elements unwound."""
    refs = []
    for operand in inst.operands():  # type: ignore[attr-defined]
        path: list[int] = []
        while operand.opcode.name == "kGetTupleElement":
            path.insert(0, int(re.search(r"index=(\d+)", operand.to_string()).group(1)))  # type: ignore[union-attr]
            operand = operand.operands()[0]
        refs.append((operand.name, tuple(path)))
    return refs


def test_xla_reads_tuple_element_operands_as_we_do() -> None:
    """``%t#1#0`` (jax >= 0.11 dumps) is get-tuple-element(get-tuple-element(t, 1), 0) to XLA."""
    module = parse_module(TUPLE_OPERANDS)
    oracle = xla_instructions(_hlo.hlo_module_from_text(TUPLE_OPERANDS))
    for name in ("a", "b", "r"):
        inst = module.entry.get(name)
        assert inst is not None
        assert inst.operand_refs == _xla_operand_refs(oracle[("main", name)]), name


_BASE_012 = "HloModule m{header}\n\nENTRY %main (p: f32[8]) -> f32[8] {{\n{body}\n}}\n"
_BODY = "  %p = f32[8]{0} parameter(0)\n  ROOT %n = f32[8]{0} negate(%p)"
XLA_REJECTS = {
    "two-ROOTs": _BASE_012.format(header="", body=_BODY.replace("  %p", "  ROOT %p")),
    "duplicate-header-attribute": _BASE_012.format(
        header=", replica_count=1, replica_count=2", body=_BODY
    ),
    "replica-count-not-an-integer": _BASE_012.format(header=", replica_count=abc", body=_BODY),
    "unterminated-comment": _BASE_012.format(
        header="", body=_BODY.replace("negate(%p)", "negate(%p /*)")
    ),
    "tuple-index-out-of-range": _BASE_012.format(
        header="", body=_BODY.replace("negate(%p)", "negate(%p#0)")
    ),
}


@pytest.mark.parametrize("text", XLA_REJECTS.values(), ids=XLA_REJECTS.keys())
def test_we_reject_what_xla_rejects(text: str) -> None:
    with pytest.raises(Exception, match="INVALID_ARGUMENT"):
        _hlo.hlo_module_from_text(text)
    with pytest.raises(HloError):
        module = parse_module(text)
        for inst in module.instructions():
            inst.operand_shapes  # noqa: B018
