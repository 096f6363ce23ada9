"""Mutants of real modules through the front end and find-async-pairs.

A seeded, deterministic mutator edits real scheduled modules (delete, duplicate
or swap lines; flip characters; truncate; put huge numbers, stray brackets,
comments and hostile attribute values in). For every mutant:

* ``parse_module`` succeeds or raises an HloError reading ``path:line:col: error:``;
* a module that parses prints back byte for byte (nothing was edited), its
  mutated instructions decode (operands, operand shapes, attributes, the
  collective attributes) or raise located HloErrors, and ``find_async_pairs``
  returns or raises a located HloError / PipelineError;
* nothing else is ever raised, and no mutant takes longer than CASE_SECONDS.

The default run is a few hundred mutants (seconds); for a longer hunt:

    XLA_STREAMS_FUZZ_CASES=5000 XLA_STREAMS_FUZZ_SEED=7 pytest tests/test_fuzz.py

A failure names the fixture and seed; ``mutant(fixture, seed)`` rebuilds the text.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from functools import cache
from pathlib import Path

import pytest
from conftest import alarm

import xla_streams.passes  # noqa: F401 - registers the passes
from xla_streams.hlo import HloError, Instruction, Module, parse_module
from xla_streams.hlo.attributes import (
    MAX_DEVICES,
    decode,
    parse_backend_config,
    parse_frontend_attributes,
    parse_replica_groups,
    parse_source_target_pairs,
)
from xla_streams.passes.base import Compilation, PipelineError
from xla_streams.pipeline import PassManager, build_pipeline
from xla_streams.streams import VerificationError, find_async_pairs

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# Small real modules with every collective form between them: dedicated and
# wrapped async pairs, send/recv in while bodies, mesh and iota groups, jax 0.12
# tuple-element operands.
FIXTURES = [
    REPO / "tests" / "data" / "jax0_12_fsdp_scan.dump.hlo",
    REPO / "hlo_fixtures" / "ppermute_scan.limit4_pp_enable.dump.hlo",
    REPO / "hlo_fixtures" / "psum_scatter.limit4.dump.hlo",
    REPO / "hlo_fixtures" / "tp_dp_2d.limit4.text.hlo",
    REPO / "hlo_fixtures" / "filecheck" / "find_async_pairs.hlo",
]
CASES = int(os.environ.get("XLA_STREAMS_FUZZ_CASES", "300"))
SEED = int(os.environ.get("XLA_STREAMS_FUZZ_SEED", "0"))
# A mutant is at most a few hundred KB; every step is linear in it, so a second
# is generous on a slow machine. The alarm stops a runaway Python loop.
CASE_SECONDS = 2.0
ALARM_SECONDS = 10

HUGE_NUMBERS = ["0", "-1", "1", str(MAX_DEVICES), str(MAX_DEVICES + 1), "99999999999",
                str(2**63), "9" * 30, "9" * 5000]  # fmt: skip
GROUPS = [
    "{}",
    "{{}}",
    "{{0,0}}",
    "{{0,1},{1,0}}",
    "{{-1}}",
    "{{0,1,2,3},{}}",
    "{{0,1}, /*x*/ {2,3}}",
    "[1,300000000]<=[300000000]",
    "[0,0]<=[0]",
    "[2, 4]<=[8]",
    "[4,2]<=[2,4]T(1, 0)",
    "[1,1]<=[" + ",".join(["1"] * 2000) + "]",
    "[2,4]<=[2,4]T(0,0)",
    "[2,4]<=[8]T(0)",
    "mesh['a'=0] {'a'}",
    "mesh['a'=2,'a'=2] {'a'}",
    "mesh['a'=2] {}",
    "mesh['a'=99999999999] {'a'}",
    "mesh['a'=4] {'a':(0)2}",
    "mesh['a'=4] {'a':(1)2,'a'}",
    "mesh['a'=2], device_ids=([9]) {'a'}",
    "mesh['a'=4] {'a':(3)2}",
    "mesh['a'=2,'b'=2] {'a','a'}",
    "mesh[] {}",
    "mesh['a'=2]",
]
PAIRS = ["{}", "{{0,1},{0,2}}", "{{0,1,2}}", "{{0}}", "{{-1,0}}", "{{0,99999999999}}", "{0,1}"]
JSON = [
    '{"a":' + "[" * 3000,
    "[" * 3000 + "]" * 3000,
    '{"n":' + "9" * 5000 + "}",
    "[]",
    '"{}"',
    '{"collective_backend_config":{"is_sync":true}}',
    '{"collective_backend_config":[]}',
]
FRONTEND = [
    "{a=1}",
    '{_xla_send_recv_pipeline="0"}',
    '{_xla_send_recv_source_target_pairs="{{0,1},{0,2}}"}',
    "{_xla_send_recv_source_target_pairs={{0,1},{0,1}}}",
    '{a="',
    "{}",
]
ANY = [
    '"unterminated',
    "/*",
    "{/*",
    "%nope",
    "{%nope}",
    "(" * 200 + ")" * 200,
    "{{1}: (0, {})}",
    "",
]
HOSTILE_VALUES: dict[str, list[str]] = {
    "replica_groups": GROUPS,
    "source_target_pairs": PAIRS,
    "backend_config": JSON,
    "frontend_attributes": FRONTEND,
    "num_partitions": [*HUGE_NUMBERS, "abc", "2, num_partitions=2"],
    "replica_count": [*HUGE_NUMBERS, "abc"],
}
STRUCTURAL_CHARS = "(){}[],%=\"'#/*\\ \t\r\n-:<>T0123456789abcxyz"


@cache
def source(path: Path) -> str:
    return path.read_bytes().decode("utf-8")


# -- the mutator ------------------------------------------------------------------


def _lines(text: str) -> list[str]:
    return text.split("\n")


def delete_line(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    del lines[rng.randrange(len(lines))]
    return "\n".join(lines)


def duplicate_line(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    i = rng.randrange(len(lines))
    lines.insert(rng.randrange(len(lines) + 1), lines[i])
    return "\n".join(lines)


def swap_lines(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


def flip_characters(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 4)):
        chars[rng.randrange(len(chars))] = rng.choice(STRUCTURAL_CHARS)
    return "".join(chars)


def insert_characters(rng: random.Random, text: str) -> str:
    at = rng.randrange(len(text) + 1)
    token = rng.choice(["(", ")", "{", "}", "[", "]", '"', "/*", "*/", "//", "#1", ",", "ROOT "])
    return text[:at] + token * rng.choice([1, 1, 2, 1000]) + text[at:]


def truncate(rng: random.Random, text: str) -> str:
    return text[: rng.randrange(len(text))]


def huge_number(rng: random.Random, text: str) -> str:
    numbers = list(re.finditer(r"\d+", text))
    if not numbers:
        return text
    m = rng.choice(numbers)
    return text[: m.start()] + rng.choice(HUGE_NUMBERS) + text[m.end() :]


def hostile_attribute(rng: random.Random, text: str) -> str:
    """An attribute value (or the header's device counts) replaced by a hostile one."""
    keys = list(re.finditer(r"(?:^|, )([a-z_]+)=", text, re.MULTILINE))
    decoded = [m for m in keys if m.group(1) in HOSTILE_VALUES]
    if not keys:
        return text
    m = rng.choice(decoded if decoded and rng.random() < 0.8 else keys)
    start = m.end()
    end, depth = start, 0  # the value ends at a comma outside brackets, or the line's end
    while end < len(text) and text[end] != "\n":
        if text[end] in "({[":
            depth += 1
        elif text[end] in ")}]":
            depth -= 1
        elif text[end] == "," and depth <= 0:
            break
        end += 1
    value = rng.choice(HOSTILE_VALUES.get(m.group(1), ANY) if rng.random() < 0.8 else ANY)
    return text[:start] + value + text[end:]


def tuple_index(rng: random.Random, text: str) -> str:
    operands = list(re.finditer(r"[(,] ?%[\w.\-]+", text))
    if not operands:
        return text
    m = rng.choice(operands)
    return (
        text[: m.end()] + "#" + rng.choice(["0", "1", "7", "-1", "x", "0#0", ""]) + text[m.end() :]
    )


def relayout(rng: random.Random, text: str) -> str:
    """What XLA also accepts: CRLF, tab indentation, comment and blank lines."""
    choice = rng.randrange(3)
    if choice == 0:
        return text.replace("\n", "\r\n")
    if choice == 1:
        return text.replace("\n  ", "\n\t")
    lines = _lines(text)
    lines.insert(
        rng.randrange(len(lines)), rng.choice(["", "  // comment", "\t", "// x = f32[] y("])
    )
    return "\n".join(lines)


# Weighted toward the values the front end decodes: most line edits are plain
# syntax errors, found at once.
MUTATIONS: list[Callable[[random.Random, str], str]] = [
    delete_line, duplicate_line, swap_lines, flip_characters, insert_characters, truncate,
    huge_number, huge_number, tuple_index, relayout, *[hostile_attribute] * 5,
]  # fmt: skip


def mutant(path: Path, seed: int) -> tuple[str, list[str]]:
    """The mutant of ``path`` for ``seed``, and the names of the mutations applied."""
    rng = random.Random(f"{path.name}:{seed}")
    text = source(path)
    applied = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        mutation = rng.choice(MUTATIONS)
        if text:
            text = mutation(rng, text)
        applied.append(mutation.__name__)
    return text, applied


# -- the checks --------------------------------------------------------------------


def assert_located(err: Exception, path: str) -> None:
    head = str(err).split("\n", 1)[0]
    assert re.match(rf"{re.escape(path)}:\d+:\d+: error: ", head), f"not located: {head!r}"


# Every lazy accessor of an instruction, and each collective attribute's decoder.
ACCESSORS: list[Callable[[Instruction], object]] = [
    lambda inst: inst.operand_refs,
    lambda inst: inst.operand_shapes,
    lambda inst: inst.attributes,
    lambda inst: inst.shape,
    lambda inst: decode(inst, "replica_groups", parse_replica_groups),
    lambda inst: decode(inst, "source_target_pairs", parse_source_target_pairs),
    lambda inst: decode(inst, "frontend_attributes", parse_frontend_attributes),
    lambda inst: decode(inst, "backend_config", parse_backend_config),
]


def decode_mutated(module: Module, original: set[str], path: str) -> None:
    """Run every accessor on each instruction whose line the mutation changed."""
    for inst in module.instructions():
        if inst.source in original:
            continue
        for access in ACCESSORS:
            try:
                access(inst)
            except HloError as err:
                assert_located(err, path)


def check(text: str, path: str, original: set[str]) -> str:
    """Run one mutant through everything; return what happened."""
    try:
        module = parse_module(text, path)
    except HloError as err:
        assert_located(err, path)
        return "rejected"
    module.restructured = True  # printed from its parts, not the source whole
    assert module.print() == text, "untouched lines must print back byte for byte"
    decode_mutated(module, original, path)
    try:
        find_async_pairs(module)
    except (HloError, PipelineError) as err:
        assert_located(err, path)
        return "pairs-error"
    return "accepted"


def run_cases(path: Path, seeds: range) -> dict[str, int]:
    original = set(_lines(source(path)))
    outcomes: dict[str, int] = {}
    for seed in seeds:
        text, applied = mutant(path, seed)
        where = f"{path.name} seed={seed} mutations={applied}"
        start = time.perf_counter()
        try:
            with alarm(ALARM_SECONDS):
                outcome = check(text, "mutant.hlo", original)
        except AssertionError as err:
            raise AssertionError(f"{where}: {err}") from None
        except Exception as err:
            raise AssertionError(f"{where}: raised {type(err).__name__}: {err}") from err
        elapsed = time.perf_counter() - start
        assert elapsed < CASE_SECONDS, f"{where}: took {elapsed:.2f} s"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return outcomes


@pytest.mark.parametrize("path", FIXTURES, ids=[p.name for p in FIXTURES])
def test_mutants_parse_or_fail_located(path: Path) -> None:
    share = CASES // len(FIXTURES)
    outcomes = run_cases(path, range(SEED * CASES, SEED * CASES + share))
    # The mutator reaches both sides: well-formed mutants and rejected ones.
    assert outcomes.get("rejected", 0) > 0 and outcomes.get("accepted", 0) > 0, outcomes


# -- structural mutants: what the text's grammar allows but XLA's parser refuses --------
#
# Each operator edits names, not syntax: an operand that names its own instruction, a
# later one, one of another computation or none; a control predecessor defined later;
# a call of its own computation (through every kind of call the module has), of a later
# one or of none; a start fed by its own done; a NUL in a name. Then groups over 65,536
# devices and stream pins in other digits (superscript two, Arabic-Indic one), which XLA
# accepts and we must refuse, located. For every mutant: no hang, no traceback, only
# located errors, and XLA's own parser (jaxlib, in a child process: see XlaOracle) as
# the oracle: whatever it rejects, we reject. The default run is a few dozen mutants per
# fixture (seconds); XLA_STREAMS_FUZZ_CASES scales it like the run above.

STRUCTURAL_CASES = max(10, CASES // 10)
CALL_KEYS = ("to_apply", "calls", "body", "condition", "branch_computations",
             "true_computation", "false_computation", "called_computations")  # fmt: skip
PIN_VALUES = ["\u00b2", "\u0661", "\uff15", "-1", "0x1", " 1", "1e3", "9999999", "3", "0"]
GROUPS_VALUE = re.compile(
    r"replica_groups=(mesh\[[^\]]*\](?:, device_ids=\([^)]*\))? \{[^}]*\}"
    r"|\{[{}\d,\s]*\}|\[[^\]]*\]<=\[[^\]]*\](?:T\([\d,]*\))?)"
)
GIANT_GROUPS = ["{}", "[32768,2]<=[65536]", "[2,32768]<=[65536]", "[32768,2]<=[2,32768]T(1,0)"]


@dataclasses.dataclass(frozen=True)
class Site:
    """One instruction of a (valid) fixture: where it is and what it names."""

    index: int  # line index in the text
    comp: int  # its computation's position in the module
    name: str
    opcode: str
    operands: tuple[str, ...]
    callees: tuple[tuple[str, str], ...]  # (attribute, computation)


@cache
def sites(path: Path) -> tuple[tuple[str, ...], tuple[Site, ...]]:
    module = parse_module(source(path), str(path))
    found = []
    for c, comp in enumerate(module.computations):
        for inst in comp.instructions:
            callees = tuple(
                (key, name)
                for key in CALL_KEYS
                if inst.attribute(key) is not None
                for name in inst.attribute(key).strip("{} ").replace("%", "").split(",")  # type: ignore[union-attr]
            )
            found.append(
                Site(
                    inst.line - 1,
                    c,
                    inst.name,
                    inst.opcode,
                    tuple(inst.operand_names),
                    tuple((k, n.strip()) for k, n in callees),
                )
            )
    return tuple(c.name for c in module.computations), tuple(found)


def _replace_in_operands(line: str, old: str, new: str) -> str:
    """``line`` with operand ``%old`` (the first, as a whole name) written ``%new``."""
    m = re.search(rf"%{re.escape(old)}(?![\w.\-])", line[line.index("(") :])
    if m is None:
        return line
    at = line.index("(") + m.start()
    return line[:at] + f"%{new}" + line[at + m.end() - m.start() :]


def _with_line(path: Path, index: int, line: str) -> str:
    lines = _lines(source(path))
    lines[index] = line
    return "\n".join(lines)


def _pick(rng: random.Random, items: Sequence[Site]) -> Site | None:
    return rng.choice(items) if items else None


def operand_is_itself(rng: random.Random, path: Path) -> str | None:
    site = _pick(rng, [s for s in sites(path)[1] if s.operands])
    if site is None:
        return None
    line = _lines(source(path))[site.index]
    return _with_line(path, site.index, _replace_in_operands(line, site.operands[0], site.name))


def operand_is_later(rng: random.Random, path: Path) -> str | None:
    all_sites = sites(path)[1]
    choices = [
        (s, t) for s in all_sites if s.operands
        for t in all_sites if t.comp == s.comp and t.index > s.index
    ]  # fmt: skip
    if not choices:
        return None
    site, later = rng.choice(choices)
    line = _lines(source(path))[site.index]
    return _with_line(path, site.index, _replace_in_operands(line, site.operands[0], later.name))


def operand_is_elsewhere_or_nowhere(rng: random.Random, path: Path) -> str | None:
    all_sites = sites(path)[1]
    site = _pick(rng, [s for s in all_sites if s.operands])
    if site is None:
        return None
    others = [t.name for t in all_sites if t.comp != site.comp]
    new = rng.choice([*others[:50], "nosuch", "nosuch.1"])
    line = _lines(source(path))[site.index]
    return _with_line(path, site.index, _replace_in_operands(line, site.operands[0], new))


def control_predecessor_later(rng: random.Random, path: Path) -> str | None:
    all_sites = sites(path)[1]
    choices = [(s, t) for s in all_sites for t in all_sites
               if t.comp == s.comp and t.index >= s.index and s.opcode != "parameter"]  # fmt: skip
    if not choices:
        return None
    site, later = rng.choice(choices[:2000])
    line = _lines(source(path))[site.index].rstrip("\r")
    if "control-predecessors=" in line:
        return None
    return _with_line(path, site.index, f"{line}, control-predecessors={{%{later.name}}}")


def call_recurses(rng: random.Random, path: Path) -> str | None:
    """A call of its own computation, a later one or none, through any kind of call."""
    names, all_sites = sites(path)
    site = _pick(rng, [s for s in all_sites if s.callees])
    if site is None:
        return None
    key, callee = rng.choice(site.callees)
    new = rng.choice([names[site.comp], *names[site.comp + 1 :], "nosuch_computation"])
    line = _lines(source(path))[site.index]
    at = line.find(f"{key}=")
    at = line.find(f"%{callee}", at)
    if at < 0:
        return None
    return _with_line(path, site.index, line[:at] + f"%{new}" + line[at + 1 + len(callee) :])


def start_fed_by_its_done(rng: random.Random, path: Path) -> str | None:
    all_sites = sites(path)[1]
    dones = [s for s in all_sites if s.opcode.endswith("-done") and s.operands]
    site = _pick(rng, dones)
    if site is None:
        return None
    start = next((s for s in all_sites if s.name == site.operands[0] and s.operands), None)
    if start is None:
        return None
    line = _lines(source(path))[start.index]
    return _with_line(path, start.index, _replace_in_operands(line, start.operands[0], site.name))


def nul_in_a_name(rng: random.Random, path: Path) -> str | None:
    site = _pick(rng, list(sites(path)[1]))
    if site is None:
        return None
    line = _lines(source(path))[site.index]
    at = line.index(site.name) + rng.randrange(1, len(site.name) + 1)
    return _with_line(path, site.index, line[:at] + "\0" + line[at:])


def giant_groups(rng: random.Random, path: Path) -> str | None:
    """65,536 devices: the header says so and a collective's groups use them."""
    text = source(path)
    found = list(re.finditer(GROUPS_VALUE, text))
    if not found:
        return None
    m = rng.choice(found)
    text = text[: m.start(1)] + rng.choice(GIANT_GROUPS) + text[m.end(1) :]
    text = re.sub(r"num_partitions=\d+", "num_partitions=65536", text, count=1)
    return re.sub(r", replica_count=\d+", "", text, count=1)


def hostile_pin(rng: random.Random, path: Path) -> str | None:
    starts = [s for s in sites(path)[1] if s.opcode.endswith("-start")]
    site = _pick(rng, starts)
    if site is None:
        return None
    line = _lines(source(path))[site.index].rstrip("\r")
    if "_xla_stream_annotation" in line:
        return None
    value = rng.choice(PIN_VALUES)
    if "frontend_attributes={" in line:
        line = line.replace(
            "frontend_attributes={", f'frontend_attributes={{_xla_stream_annotation="{value}",', 1
        )
    else:
        line += f', frontend_attributes={{_xla_stream_annotation="{value}"}}'
    return _with_line(path, site.index, line)


STRUCTURAL: list[Callable[[random.Random, Path], str | None]] = [
    operand_is_itself, operand_is_later, operand_is_elsewhere_or_nowhere,
    control_predecessor_later, call_recurses, call_recurses, start_fed_by_its_done,
    nul_in_a_name, giant_groups, hostile_pin, hostile_pin,
]  # fmt: skip


# The one deliberate difference from XLA's parser: a control predecessor printed after
# its user is read (XLA's printer writes double-buffered loops so) unless it closes a
# cycle, which parse_module rejects. XLA's parser refuses every such module, so this
# mutation is checked for located errors and hangs, not against the oracle.
LATE_CONTROL = frozenset({"control_predecessor_later"})
# Mutations whose every mutant XLA's parser rejects (checked by the oracle above too).
ALWAYS_INVALID = frozenset(
    {"operand_is_itself", "operand_is_later", "nul_in_a_name", "start_fed_by_its_done"}
)


def structural_mutant(path: Path, seed: int) -> tuple[str | None, str]:
    rng = random.Random(f"structural:{path.name}:{seed}")
    mutation = rng.choice(STRUCTURAL)
    return mutation(rng, path), mutation.__name__


# XLA's parser in a child process, one text at a time: some edits crash jaxlib 0.12
# outright (a bad to_apply or control-predecessors on a sugared reduce-scatter-start is a
# segmentation fault), which must fail no test and stop no run. A crash counts as a
# rejection; the child is started again for the next text.
_XLA_WORKER = """
import struct, sys
sys.path.insert(0, sys.argv[1])
from conftest import xla_parsable
from xla_streams.jax_compat import hlo_bindings
parse = hlo_bindings().hlo_module_from_text
while header := sys.stdin.buffer.read(8):
    text = sys.stdin.buffer.read(struct.unpack("<Q", header)[0]).decode("utf-8", "surrogatepass")
    try:
        parse(xla_parsable(text))
        answer = b"accepts\\n"
    except Exception as err:
        answer = b"rejects\\n" if "INVALID_ARGUMENT" in str(err) or isinstance(err, ValueError) else b"?\\n"
    sys.stdout.buffer.write(answer)
    sys.stdout.buffer.flush()
"""


class XlaOracle:
    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.crashes = 0

    def accepts(self, text: str) -> bool:
        if self.child is None or self.child.poll() is not None:
            self.child = subprocess.Popen(
                [sys.executable, "-c", _XLA_WORKER, str(REPO / "tests")],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        assert self.child.stdin is not None and self.child.stdout is not None
        data = text.encode("utf-8", "surrogatepass")
        try:
            self.child.stdin.write(struct.pack("<Q", len(data)) + data)
            self.child.stdin.flush()
            answer = self.child.stdout.readline()
        except BrokenPipeError:
            answer = b""
        if not answer:  # it crashed on this text
            self.child.wait()
            self.child = None
            self.crashes += 1
            return False
        assert answer in (b"accepts\n", b"rejects\n"), answer
        return answer == b"accepts\n"

    def close(self) -> None:
        if self.child is not None:
            self.child.stdin.close()  # type: ignore[union-attr]
            self.child.wait(timeout=30)


@pytest.fixture(scope="module")
def xla() -> Iterator[XlaOracle]:
    oracle = XlaOracle()
    yield oracle
    oracle.close()


def check_structural(text: str, path: str) -> str:
    """Through the whole native pipeline; return "accepted" or "rejected"."""
    try:
        module = parse_module(text, path)
        passes = build_pipeline(4, runtime="xla")
        PassManager(passes).run(Compilation(module))
    except (HloError, PipelineError) as err:
        assert_located(err, path)
        return "rejected"
    except VerificationError as err:  # our own assignment broke the rule: a bug
        raise AssertionError(f"verify-streams failed on our own assignment: {err}") from err
    return "accepted"


@pytest.mark.parametrize("path", FIXTURES, ids=[p.name for p in FIXTURES])
def test_structural_mutants_are_rejected_where_xla_rejects_them(path: Path, xla: XlaOracle) -> None:
    assert xla.accepts(source(path)), "the fixture itself must be valid for XLA"
    outcomes: dict[str, int] = {}
    for seed in range(SEED * STRUCTURAL_CASES, (SEED + 1) * STRUCTURAL_CASES):
        text, name = structural_mutant(path, seed)
        if text is None:
            continue
        where = f"{path.name} seed={seed} mutation={name}"
        start = time.perf_counter()
        try:
            with alarm(ALARM_SECONDS):
                ours = check_structural(text, "mutant.hlo")
        except AssertionError as err:
            raise AssertionError(f"{where}: {err}") from None
        except Exception as err:
            raise AssertionError(f"{where}: raised {type(err).__name__}: {err}") from err
        elapsed = time.perf_counter() - start
        assert elapsed < CASE_SECONDS, f"{where}: took {elapsed:.2f} s"
        if ours == "accepted" and name not in LATE_CONTROL:
            assert xla.accepts(text), f"{where}: XLA rejects what we accepted"
            assert name not in ALWAYS_INVALID, where
        outcomes[f"{name}:{ours}"] = outcomes.get(f"{name}:{ours}", 0) + 1
    assert any(k.endswith(":rejected") for k in outcomes), outcomes
