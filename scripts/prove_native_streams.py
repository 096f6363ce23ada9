#!/usr/bin/env python3
"""Prove, without a GPU, that XLA runs each collective on the stream our report assigns.

    JAX_PLATFORMS=cpu python scripts/prove_native_streams.py [--program transformer_step]
        [--streams 4] [--policy interval] [--out DIR] [--exceed]

XLA's GPU compiler runs deviceless here (8 H100s from a GpuTargetConfigProto),
but its compile-only client does not call the plugin's hook. So the proof goes
another faithful way, through the program's StableHLO:

1. ``tagged``: every collective op of the StableHLO gets a frontend attribute
   ``_xla_streams_id="i"`` (its index), and the program is compiled with the
   options native mode sets (overlap limit K, K communication streams). XLA
   carries frontend attributes to the collective's start and done, so each
   async pair of the scheduled module names the op it came from.
2. The plugin's own code (``xla_streams.plugin.process_text``, what the hook
   runs) assigns streams on that scheduled module, exactly as printed for the
   hook (``HloModule.to_string`` with large constants), and writes the report.
3. ``annotated``: the StableHLO gets ``_xla_stream_annotation="k"`` on each op
   whose pairs the report put on stream k, and is compiled again.
4. Checks: the schedule of ``annotated`` is the schedule the assignment was
   made for (same instructions in the same order in every computation); its
   module is the module the hook would have produced (ours with the id tags
   removed); and XLA's thunk sequence (``*.thunk_sequence.txt``, thunk names
   from ``*.thunk_metadata.txt``) starts every collective on
   ``communication_stream[k]`` with k the report's stream; pairs the report
   leaves on no stream (sync) keep XLA's default. Also compiled: ``plain`` (no
   attributes at all), whose schedule must equal ``tagged``'s, so the tags
   change nothing, and whose thunks show XLA's default of one stream.

With ``--exceed`` one more build annotates the first pair with stream K+3 to
show what XLA does with an annotation beyond the streams asked for.

Needs the ``gpu-aot`` extra (jax[cuda12]==0.10.2); exits 0 when every check
passes, 1 when one fails, 2 when the proof cannot run here.
"""

from __future__ import annotations

import argparse
import copy
import glob
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TAG = "_xla_streams_id"
ANNOTATION = "_xla_stream_annotation"
STABLEHLO_COLLECTIVES = frozenset(
    {
        "stablehlo.all_gather",
        "stablehlo.all_reduce",
        "stablehlo.reduce_scatter",
        "stablehlo.all_to_all",
        "stablehlo.collective_permute",
        "stablehlo.collective_broadcast",
    }
)
_THUNK_START = re.compile(
    r"^\s*(\d+): kAsyncStart\b.*?\bstream=(?:communication_stream\[(\d+)\]|(\S+?))[,\s]"
)
_DEDUPLICATED = re.compile(r' ?deduplicated_name="[^"]*"')
_METADATA = re.compile(r'profile_annotation: "([^"]*)"\s*thunk_id: (\d+)')


# -- reading XLA's dumps -----------------------------------------------------------------


def thunk_streams(thunk_sequence: str, thunk_metadata: str) -> dict[str, int | str]:
    """Instruction name -> the communication stream its async start thunk runs on.

    Nested thunks (while bodies) are included. A stream that is not a
    communication stream is given by its printed name.
    """
    names = {int(i): name for name, i in _METADATA.findall(thunk_metadata)}
    result: dict[str, int | str] = {}
    for line in thunk_sequence.splitlines():
        m = _THUNK_START.match(line)
        if m is None:
            continue
        thunk_id = int(m.group(1))
        name = names.get(thunk_id, f"<thunk {thunk_id}>")
        result[name] = int(m.group(2)) if m.group(2) is not None else m.group(3)
    return result


def read_dump(dump_dir: str) -> tuple[str, str, str]:
    """(after-optimizations HLO, thunk sequence, thunk metadata) from an XLA dump folder."""

    def one(pattern: str) -> str:
        found = sorted(glob.glob(os.path.join(dump_dir, pattern)))
        if len(found) != 1:
            raise RuntimeError(f"expected one {pattern} in {dump_dir}, found {len(found)}")
        return Path(found[0]).read_text()

    return (
        one("*after_optimizations.txt"),
        one("*.thunk_sequence.txt"),
        one("*.thunk_metadata.txt"),
    )


def schedule(text: str) -> dict[str, list[str]]:
    """Per computation, its instructions in schedule order, as ``name=opcode``."""
    from xla_streams.hlo import parse_module

    module = parse_module(text)
    return {c.name: [f"{i.name}={i.opcode}" for i in c.instructions] for c in module.computations}


def first_difference(a: Mapping[str, list[str]], b: Mapping[str, list[str]]) -> str | None:
    if list(a) != list(b):
        return f"computations differ: {sorted(set(a) ^ set(b))[:5]}"
    for name in a:
        if a[name] != b[name]:
            for i, (x, y) in enumerate(zip(a[name], b[name], strict=False)):
                if x != y:
                    return f"{name}: position {i}: {x} vs {y}"
            return f"{name}: {len(a[name])} vs {len(b[name])} instructions"
    return None


def tags_of(text: str) -> dict[str, tuple[int, ...]]:
    """Instruction name -> the StableHLO ops it came from, read from ``_xla_streams_id``.

    An instruction XLA combined from several ops carries their ids joined by
    commas (``"3,4"``).
    """
    result = {}
    pattern = r"^\s+(?:ROOT )?%([^\s=]+) = .*?" + TAG + r'="([\d,]+)"'
    for m in re.finditer(pattern, text, re.M):
        result[m.group(1)] = tuple(int(i) for i in m.group(2).split(","))
    return result


def differences_beyond(a: str, b: str, keys: frozenset[str]) -> str | None:
    """Where modules ``a`` and ``b`` differ other than in the frontend attributes ``keys``.

    Compares computations and instructions in order: name, shape, opcode,
    operands and every attribute, frontend attributes without ``keys``, and
    metadata without ``deduplicated_name`` (attributes make otherwise equal
    fusions different, so XLA merges a different set of fusion computations).
    """
    from xla_streams.hlo import parse_module
    from xla_streams.hlo.attributes import decode, parse_frontend_attributes

    ma, mb = parse_module(a), parse_module(b)
    if [c.name for c in ma.computations] != [c.name for c in mb.computations]:
        return "the computations differ"
    for ca, cb in zip(ma.computations, mb.computations, strict=True):
        if len(ca.instructions) != len(cb.instructions):
            return f"{ca.name}: {len(ca.instructions)} vs {len(cb.instructions)} instructions"
        for ia, ib in zip(ca.instructions, cb.instructions, strict=True):
            heads = [(i.name, i.shape_text, i.opcode, i.operands_text) for i in (ia, ib)]
            attrs = []
            for inst in (ia, ib):
                plain = {k: v for k, v in inst.attributes.items() if k != "frontend_attributes"}
                if "metadata" in plain:  # which identical fusions XLA merged: not behaviour
                    plain["metadata"] = _DEDUPLICATED.sub("", plain["metadata"])
                front = decode(inst, "frontend_attributes", parse_frontend_attributes) or {}
                plain["frontend_attributes"] = str(
                    sorted((k, v) for k, v in front.items() if k not in keys)
                )
                attrs.append(plain)
            if heads[0] != heads[1] or attrs[0] != attrs[1]:
                return f"{ca.name}: %{ia.name} differs"
    return None


def annotation_of(text: str) -> dict[str, str]:
    """Instruction name -> its ``_xla_stream_annotation`` value."""
    result = {}
    pattern = r"^\s+(?:ROOT )?%([^\s=]+) = .*?" + ANNOTATION + r'="([^"]*)"'
    for m in re.finditer(pattern, text, re.M):
        result[m.group(1)] = m.group(2)
    return result


# -- building ------------------------------------------------------------------------


@dataclass
class Build:
    label: str
    dump_dir: str
    hook_text: str  # the compiled module as the hook prints it
    dump_text: str
    streams: dict[str, int | str]
    seconds: float


def with_attributes(lowered: Any, attributes_of: Callable[[int], dict[str, str] | None]) -> Any:
    """A copy of ``lowered``'s lowering whose i-th collective op has ``attributes_of(i)``
    added to its ``mhlo.frontend_attributes`` (JAX caches lowerings: never edit in place)."""
    from jax._src.interpreters import mlir

    ir = mlir.ir
    context = mlir.make_ir_context()
    module = ir.Module.parse(
        mlir.module_to_bytecode(lowered._lowering.stablehlo()), context=context
    )
    index = 0

    def visit(op: Any) -> Any:
        nonlocal index
        if op.name in STABLEHLO_COLLECTIVES:
            extra = attributes_of(index)
            index += 1
            if extra:
                merged: dict[str, Any] = {}
                if "mhlo.frontend_attributes" in op.attributes:
                    old = op.attributes["mhlo.frontend_attributes"]
                    merged.update({n.name: n.attr for n in ir.DictAttr(old)})
                for key, value in extra.items():
                    merged[key] = ir.StringAttr.get(value, context=context)
                op.attributes["mhlo.frontend_attributes"] = ir.DictAttr.get(merged, context=context)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    lowering = copy.copy(lowered._lowering)
    lowering._hlo = module
    lowering._executable = None
    return lowering


def compile_build(label: str, lowering: Any, options: Mapping[str, Any], root: str) -> Build:
    from xla_streams import xla_module

    dump_dir = os.path.join(root, label)
    opts = dict(options)
    opts.update(
        xla_dump_to=dump_dir,
        xla_dump_hlo_as_text=True,
        xla_dump_hlo_as_proto=False,
        xla_dump_hlo_pass_re="",
    )
    begin = time.perf_counter()
    executable = lowering.compile(opts)
    seconds = time.perf_counter() - begin
    (module,) = executable.xla_executable.hlo_modules()
    hook_text = module.to_string(xla_module.print_options())
    dump_text, sequence, metadata = read_dump(dump_dir)
    return Build(label, dump_dir, hook_text, dump_text, thunk_streams(sequence, metadata), seconds)


# -- the proof -------------------------------------------------------------------------


@dataclass
class Row:
    start: str
    kind: str
    computation: str
    ops: tuple[int, ...] | None  # the StableHLO ops it came from
    stream: int | None  # the report's
    baseline: int | str | None  # XLA's own choice (tagged build)
    thunk: int | str | None  # the annotated build's
    ok: bool
    expressible: bool  # could be annotated through the StableHLO


@dataclass
class Proof:
    program: str
    streams: int
    policy: str
    rows: list[Row] = field(default_factory=list)
    checks: dict[str, str] = field(default_factory=dict)  # name -> "ok" or the failure
    report: str = ""
    table: str = ""
    seconds: dict[str, float] = field(default_factory=dict)
    exceed: dict[str, Any] | None = None
    coverage: tuple[int, int] = (0, 0)  # pairs expressible / pairs the report puts on a stream
    not_expressible: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(v == "ok" for v in self.checks.values())


def native_options(streams: int) -> dict[str, Any]:
    """The XLA options the plugin puts in XLA_FLAGS for ``streams`` collective streams."""
    from xla_streams.plugin import native_xla_flags

    return {name: int(value) for name, value in native_xla_flags(streams).items()}


def prove(
    program: str = "transformer_step",
    streams: int = 4,
    policy: str = "interval",
    target: str = "h100",
    out_dir: str | None = None,
    *,
    check_plain: bool = True,
    exceed: bool = False,
) -> Proof:
    from xla_streams import aot, programs
    from xla_streams.config import Config
    from xla_streams.plugin import process_text, write_reports
    from xla_streams.report import build_report, format_report

    spec = programs.PROGRAMS[program]
    topology = aot.gpu_topology(target, spec.num_devices, spec.devices_per_host)
    fn, args = spec.build(topology.devices)
    lowered = fn.lower(*args)
    options = native_options(streams)
    root = out_dir or tempfile.mkdtemp(prefix="xla_streams_proof_")
    os.makedirs(root, exist_ok=True)
    proof = Proof(program, streams, policy)

    tagged = compile_build(
        "tagged", with_attributes(lowered, lambda i: {TAG: str(i)}), options, root
    )
    proof.seconds["tagged"] = tagged.seconds

    # What the hook does with this module: the plugin's own entry point.
    config = Config(collective_streams=streams, policy=policy, report_dir=root)  # type: ignore[arg-type]
    processed = process_text(tagged.hook_text, config, name=None, write=False)
    compilation = processed.compilation
    assert compilation.assignment is not None
    proof.report = write_reports(compilation, root, processed.fingerprint)[0]
    proof.table = format_report(build_report(compilation))
    stream_of = compilation.assignment.stream_of

    # Which StableHLO ops to annotate: those of every pair the report puts on a
    # stream. A pair XLA made itself (no op of the program), or whose ops would
    # need two streams, cannot be expressed this way; it is listed, not hidden.
    tags = tags_of(tagged.hook_text)
    op_stream: dict[int, int] = {}
    clashing: set[int] = set()
    for pair in compilation.pairs:
        k = stream_of[pair.start]
        for op in tags.get(pair.start, ()) if k is not None else ():
            if op_stream.setdefault(op, k) != k:
                clashing.add(op)
    expressible = {
        p.start
        for p in compilation.pairs
        if stream_of[p.start] is not None
        and p.start in tags
        and not clashing.intersection(tags[p.start])
    }
    for op in clashing:
        del op_stream[op]
    assigned_pairs = [p for p in compilation.pairs if stream_of[p.start] is not None]
    missing = [p.start for p in assigned_pairs if p.start not in expressible]
    proof.coverage = (len(expressible), len(assigned_pairs))
    proof.not_expressible = missing
    proof.checks["some pair on a stream can be annotated through the StableHLO"] = (
        "ok" if expressible else "none: this program's collectives are all made by XLA"
    )

    annotated = compile_build(
        "annotated",
        with_attributes(
            lowered, lambda i: {ANNOTATION: str(op_stream[i])} if i in op_stream else None
        ),
        options,
        root,
    )
    proof.seconds["annotated"] = annotated.seconds

    diff = first_difference(schedule(tagged.hook_text), schedule(annotated.hook_text))
    proof.checks["annotated schedule == the schedule that was assigned"] = diff or "ok"
    ours = processed.text or tagged.hook_text
    diff = differences_beyond(ours, annotated.hook_text, frozenset({TAG, ANNOTATION}))
    proof.checks["annotated module == the hook's module, but for frontend attributes"] = (
        diff or "ok"
    )
    theirs, mine = annotation_of(annotated.hook_text), annotation_of(ours)
    wrong = [
        name
        for p in compilation.pairs
        if p.start in expressible
        for name in (p.start, p.done)
        if theirs.get(name) != mine.get(name)
    ]
    proof.checks["annotated starts and dones carry the hook's _xla_stream_annotation"] = (
        "ok" if not wrong else f"differ on {wrong[:5]}"
    )

    mismatches = 0
    for pair in compilation.pairs:
        k = stream_of[pair.start]
        thunk = annotated.streams.get(pair.start)
        baseline = tagged.streams.get(pair.start)
        # On no stream, or not expressible: XLA's own choice must stay.
        ok = thunk == k if pair.start in expressible else thunk == baseline
        mismatches += not ok
        proof.rows.append(
            Row(
                pair.start,
                pair.kind,
                pair.computation,
                tags.get(pair.start),
                k,
                baseline,
                thunk,
                ok,
                pair.start in expressible,
            )
        )
    proof.checks["every collective's thunk is on the report's stream"] = (
        "ok"
        if mismatches == 0 and compilation.pairs
        else f"{mismatches} of {len(proof.rows)} differ"
    )
    used = {r.thunk for r in proof.rows if r.expressible}
    assigned = {r.stream for r in proof.rows if r.expressible}
    proof.checks["the streams used are the streams assigned"] = (
        "ok"
        if used == assigned
        else f"thunks use {sorted(map(str, used))}, report {sorted(map(str, assigned))}"
    )

    if check_plain:
        plain = compile_build("plain", lowered._lowering, options, root)
        proof.seconds["plain"] = plain.seconds
        diff = first_difference(schedule(plain.hook_text), schedule(tagged.hook_text))
        proof.checks["tags change nothing: plain schedule == tagged schedule"] = diff or "ok"
        diff = differences_beyond(plain.hook_text, tagged.hook_text, frozenset({TAG}))
        proof.checks["tags change nothing: plain module == tagged module, but for the tags"] = (
            diff or "ok"
        )
        xla_default = sorted({str(v) for v in plain.streams.values()})
        proof.checks["without annotations XLA uses one stream"] = (
            "ok" if xla_default == ["0"] else f"plain build uses {xla_default}"
        )

    if exceed and op_stream:
        first = min(op_stream)
        beyond = streams + 3
        build = compile_build(
            "exceed",
            with_attributes(lowered, lambda i: {ANNOTATION: str(beyond)} if i == first else None),
            options,
            root,
        )
        names = [n for n, ops in tags.items() if first in ops]
        proof.exceed = {
            "op": first,
            "instructions": names,
            "annotation": beyond,
            "thunk_streams": {n: build.streams.get(n) for n in names},
            "compiled": True,
        }
    return proof


def format_proof(proof: Proof) -> str:
    def show(v: int | str | None) -> str:
        return "-" if v is None else (f"communication_stream[{v}]" if isinstance(v, int) else v)

    header = ("start", "kind", "report stream", "XLA alone", "with annotation", "")
    rows = [header] + [
        (
            r.start,
            r.kind,
            "-" if r.stream is None else str(r.stream),
            show(r.baseline),
            show(r.thunk),
            ("ok" if r.ok else "MISMATCH")
            + ("" if r.expressible or r.stream is None else " (made by XLA: not annotated)"),
        )
        for r in proof.rows
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    out = [
        f"program {proof.program}, {proof.streams} streams, policy {proof.policy} "
        f"(deviceless H100 x8 compile; thunks from XLA's thunk_sequence dump)",
        "",
        *lines,
        "",
    ]
    for name, result in proof.checks.items():
        out.append(
            f"[{'PASS' if result == 'ok' else 'FAIL'}] {name}"
            + ("" if result == "ok" else f": {result}")
        )
    done, total = proof.coverage
    out.append(
        f"[INFO] {done} of {total} pairs on a stream could be annotated through the StableHLO"
        + (
            f"; made by XLA, not checked: {', '.join(proof.not_expressible)}"
            if done < total
            else ""
        )
    )
    if proof.exceed is not None:
        e = proof.exceed
        out.append(
            f"[INFO] annotation {e['annotation']} (beyond {proof.streams}) on op {e['op']}: "
            f"compiled; thunks {e['thunk_streams']}"
        )
    out.append(f"report: {proof.report}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--program", default="transformer_step")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--policy", default="interval", choices=("interval", "round-robin"))
    parser.add_argument("--target", default="h100")
    parser.add_argument("--out", default=None, help="keep the dumps and the report here")
    parser.add_argument("--no-plain", action="store_true", help="skip the unannotated build")
    parser.add_argument("--exceed", action="store_true", help="also annotate beyond K")
    parser.add_argument("--json", default=None, help="write the proof as JSON here")
    ns = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from xla_streams.aot import GpuAotUnavailable

    try:
        proof = prove(
            ns.program,
            ns.streams,
            ns.policy,
            ns.target,
            ns.out,
            check_plain=not ns.no_plain,
            exceed=ns.exceed,
        )
    except GpuAotUnavailable as e:
        print(f"cannot prove here: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(proof.table + "\n" + format_proof(proof))
    if ns.json:
        data = {
            "program": proof.program,
            "streams": proof.streams,
            "policy": proof.policy,
            "ok": proof.ok,
            "checks": proof.checks,
            "rows": [r.__dict__ for r in proof.rows],
            "coverage": proof.coverage,
            "exceed": proof.exceed,
            "seconds": proof.seconds,
            "report": proof.report,
        }
        Path(ns.json).write_text(json.dumps(data, indent=1) + "\n")
    return 0 if proof.ok else 1


if __name__ == "__main__":
    sys.exit(main())
