"""The pass manager: specs, options, requires/ensures, errors that name the pass."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass

import pytest
from conftest import hlo_module

from xla_streams.hlo import Module, parse_module
from xla_streams.passes.base import Compilation, Fact, ModulePass, PipelineError
from xla_streams.pipeline import PASSES, PassManager, parse_pipeline, pass_class, register

MODULE = hlo_module(
    "HloModule m, is_scheduled=true, num_partitions=2",
    """\
ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %ar = f32[8]{0} all-reduce-start(%p), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=%add
  %e = f32[8]{0} exponential(%p)
  ROOT %ar.done = f32[8]{0} all-reduce-done(%ar)
}
""",
)


def run(spec: str, **kwargs: object) -> Compilation:
    return PassManager.from_spec(spec, **kwargs).run(Compilation(parse_module(MODULE)))  # type: ignore[arg-type]


def test_registry_has_every_pass_file() -> None:
    assert {
        "find-async-pairs",
        "assign-streams",
        "verify-streams",
        "annotate-streams",
    } <= set(PASSES)
    # Each name loads the pass of that name, from the one package that holds them.
    for name in PASSES:
        cls = pass_class(name)
        assert cls.name == name and cls.__module__.startswith("xla_streams.passes.")


def test_spec_builds_passes_with_typed_options() -> None:
    passes = parse_pipeline("find-async-pairs, assign-streams{streams=3,policy=round-robin}")
    assert [p.name for p in passes] == ["find-async-pairs", "assign-streams"]
    assert passes[1].streams == 3  # type: ignore[attr-defined]
    assert passes[1].policy == "round-robin"  # type: ignore[attr-defined]
    # xdsl-opt's space-separated options read the same.
    assert parse_pipeline("assign-streams{streams=3 policy=round-robin}") == passes[1:]
    assert passes[1].spec() == "assign-streams{streams=3,policy=round-robin}"
    assert parse_pipeline("") == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no-such-pass", "unknown pass 'no-such-pass'; known passes: "),
        ("asign-streams", "unknown pass 'asign-streams'; did you mean assign-streams?"),
        (
            "assign-streams{streams=0}",
            "pass 'assign-streams': streams=0 is not valid: expected an integer from 1 to 64",
        ),
        ("assign-streams{streams=65}", "streams=65 is not valid: expected an integer from 1 to 64"),
        ("assign-streams{streams=four}", "streams=four is not valid: expected an integer from 1"),
        (
            "assign-streams{policy=random}",
            "policy=random is not valid: expected one of interval, round-robin",
        ),
        (
            "assign-streams{stream=2}",
            "bad option 'stream=2'; did you mean streams?; options: streams=<K>, "
            "policy=<interval|round-robin>",
        ),
        ("verify-streams{x=1}", "bad option 'x=1'; options: none"),
        (
            "find-async-pairs{x=1}",
            "bad option 'x=1'; options: overlap_limit=<N>, sync_on_compute=<true|false>",
        ),
        (
            "lower-to-ffi{devices=1:1}",
            "devices=1:1 is not valid: expected distinct device ids (integers of at least 0)",
        ),
        ("lower-to-ffi{backend=tpu}", "backend=tpu is not valid: expected one of host, cuda"),
        ("find-async-pairs,,", "bad pipeline spec at column 18: expected a pass name"),
        # Where it went wrong, with the spec and a caret under that column.
        (
            "find-async-pairs,assign-streams{streams=4",
            "bad pipeline spec at column 32: '{' opening the options of 'assign-streams' is "
            "not closed\n  find-async-pairs,assign-streams{streams=4\n"
            "                                 ^",
        ),
        ("assign-streams{streams}", "column 16: expected 'option=value'"),
        ("assign-streams verify-streams", "column 16: expected ',' between passes"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(PipelineError, match=re.escape(message)):
        parse_pipeline(spec)


def test_missing_requirement_names_the_pass_and_the_provider() -> None:
    with pytest.raises(
        PipelineError, match="pass 'assign-streams' requires async-pairs.*'find-async-pairs'"
    ):
        run("assign-streams")


def test_facts_flow_through_the_pipeline() -> None:
    compilation = run("find-async-pairs,assign-streams{streams=2},verify-streams,annotate-streams")
    assert compilation.facts == set(Fact)
    assert compilation.assignment is not None
    assert compilation.assignment.stream_of == {"ar": 0}
    assert '_xla_stream_annotation="0"' in compilation.module.print()


@dataclass(frozen=True)
class _Broken(ModulePass):
    name = "broken-for-test"

    def run(self, compilation: Compilation) -> None:
        raise KeyError("boom")


@dataclass(frozen=True)
class _Liar(ModulePass):
    name = "liar-for-test"
    ensures = frozenset({Fact.STREAMS_ASSIGNED})

    def run(self, compilation: Compilation) -> None:
        pass


def test_an_internal_failure_names_the_pass() -> None:
    manager = PassManager([_Broken()])
    with pytest.raises(PipelineError, match="pass 'broken-for-test' failed: KeyError"):
        manager.run(Compilation(parse_module(MODULE)))


class _Loose(ModulePass):  # no @dataclass: no fields, nothing to read its options from
    name = "loose-for-test"


@dataclass
class _Mutable(ModulePass):
    name = "mutable-for-test"


@pytest.mark.parametrize("cls", [_Loose, _Mutable], ids=["plain-class", "not-frozen"])
def test_only_a_frozen_dataclass_registers_as_a_pass(cls: type[ModulePass]) -> None:
    with pytest.raises(PipelineError, match=f"pass '{cls.name}' is not a frozen dataclass"):
        register(cls)
    assert cls.name not in PASSES


def test_ensures_is_checked_after_the_pass() -> None:
    manager = PassManager([*parse_pipeline("find-async-pairs"), _Liar()])
    with pytest.raises(PipelineError, match="'liar-for-test' claims a stream assignment"):
        manager.run(Compilation(parse_module(MODULE)))


def test_time_passes_and_print_after_all() -> None:
    printed: list[tuple[str, str]] = []

    def record(p: ModulePass, module: Module) -> None:
        printed.append((p.name, module.print()))

    manager = PassManager.from_spec(
        "find-async-pairs,assign-streams,annotate-streams", print_after_all=record
    )
    manager.run(Compilation(parse_module(MODULE)))
    assert [name for name, _ in manager.timings] == [p for p, _ in printed]
    assert printed[0][1] == MODULE  # analyses leave the text alone
    assert "_xla_stream_annotation" in printed[-1][1]


def test_importing_the_passes_package_loads_no_pass() -> None:
    code = (
        "import sys, xla_streams.passes, xla_streams.pipeline;"
        "print(sorted(m for m in sys.modules if m.startswith('xla_streams.passes.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['xla_streams.passes.base']"


@pytest.mark.parametrize("written", ["٤", "+2", "1_0", "²"])
def test_spec_numbers_are_ascii_digits(written: str) -> None:
    # int() reads all of these; XLA and the plugin's settings take ASCII digits only.
    with pytest.raises(PipelineError, match="is not valid: expected an integer from 1 to 64"):
        parse_pipeline(f"assign-streams{{streams={written}}}")
