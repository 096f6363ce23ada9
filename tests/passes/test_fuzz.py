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

import os
import random
import re
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import pytest

import xla_streams.passes  # noqa: F401 - registers the passes
from xla_streams.hlo import HloError, Instruction, Module, parse_module
from xla_streams.hlo.attributes import (
    decode,
    parse_backend_config,
    parse_frontend_attributes,
    parse_replica_groups,
    parse_source_target_pairs,
)
from xla_streams.hlo.module import MAX_DEVICES
from xla_streams.passes.base import PipelineError
from xla_streams.passes.find_async_pairs import find_async_pairs

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


@contextmanager
def alarm(seconds: int) -> Iterator[None]:
    """Raise TimeoutError in this (main) thread after ``seconds``: a hang fails, not stalls."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


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
    assert module.print() == text, "an unedited module must print back byte for byte"
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
