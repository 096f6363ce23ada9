"""Reports of a stream assignment: a text table for people, JSON for programs, and the
files the plugin writes (one report per module, and an index of them).

Both are built from a :class:`~xla_streams.passes.base.Compilation` on which
``find-async-pairs`` and ``assign-streams`` have run, as an :class:`AssignmentReport`
(schema ``xla_streams.assignment.v2``); the plugin's directory keeps a
:class:`ReportIndex` (``xla_streams.index.v1``). Their fields, and the versioning
rule, are in docs/formats.md. Each class's ``to_json`` writes the file and
``from_json`` reads it back, refusing what breaks a rule of the schema at the
field's path (``report.json: collectives[3].stream: ...``). The output is a pure
function of the module text and the options, byte for byte, in any process.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

from xla_streams import _json
from xla_streams._io import atomic_write_many
from xla_streams._text import aligned, counted, human_bytes
from xla_streams.collectives import (
    COLLECTIVE_OPCODES,
    MAX_STREAMS,
    POLICIES,
    Lane,
    Policy,
    format_groups,
)
from xla_streams.hlo import Module
from xla_streams.passes.base import Compilation
from xla_streams.streams import AsyncPair, StreamAssignment, max_in_flight

SCHEMA = "xla_streams.assignment.v2"
INDEX_SCHEMA = "xla_streams.index.v1"
RUNS_ON: tuple[Lane, ...] = get_args(Lane)
SerializedBy = Literal["bound", "rule"]


class ReportError(ValueError):
    """A report or an index that cannot be read, or breaks a rule of its schema."""


# -- the formats ---------------------------------------------------------------------


@dataclass(frozen=True)
class ReportedCollective:
    """One async pair of a report, and the stream it was given (``collectives[i]``)."""

    computation: str
    start: str
    done: str
    kind: str
    start_index: int
    done_index: int
    sync: bool
    pipelined: bool
    runs_on: Lane
    stream: int | None
    calls: int
    groups: tuple[tuple[int, ...], ...]
    bytes: int
    serialized_by: SerializedBy | None
    reassigned: str | None


@dataclass(frozen=True)
class ReportSummary:
    """A report's counts; those the collectives also say must agree with them."""

    async_pairs: int
    assigned: int
    streams_used: int
    max_in_flight: int
    serialized: int
    serialized_by_bound: int
    serialized_by_rule: int
    sync: int
    pipelined: int
    synchronous_collectives: int
    # sends and recvs with the host (is_host_transfer=true): no device collectives, so
    # no pairs and no stream; written when there are some
    host_transfers: int
    pairs_by_kind: dict[str, int]
    max_in_flight_by_computation: dict[str, int]


@dataclass(frozen=True)
class AssignmentReport:
    """The stream assignment of one module: schema ``xla_streams.assignment.v2``."""

    module: str
    streams: int
    policy: Policy
    collectives: tuple[ReportedCollective, ...]
    summary: ReportSummary
    # Why ``streams`` is below the K asked for (``fit-on-gpu``); empty where it is not.
    lowered: str = ""

    def to_json(self) -> str:
        """The report's file: two-space indents, one collective per line, a final
        newline; equal reports give equal bytes. Its members are the fields, in order
        (``summary.host_transfers`` and ``lowered`` only when there are some)."""
        summary = _members(self.summary)
        if not summary["host_transfers"]:
            del summary["host_transfers"]  # added to v2 after its first files
        report = {
            "schema": SCHEMA,
            **_members(self),
            "collectives": [_members(c) for c in self.collectives],
            "summary": summary,
        }
        if not self.lowered:
            del report["lowered"]  # added to v2 after its first files
        return _format(report, 0) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "report") -> AssignmentReport:
        """The report in ``text`` (read from ``where``); ReportError, naming the field,
        for a document that is not one: a wrong type, a missing field, a name written
        with ``%``, a stream that is null when the pair runs on the collective streams
        (or not null off them) or not below ``streams``, a summary count that the
        collectives contradict. Fields it does not know are ignored."""
        doc = _json.loads(text, where, ReportError, what="report")
        doc.schema(SCHEMA)
        streams = doc["streams"].integer(1, MAX_STREAMS)
        collectives = tuple(_read_collective(c, streams) for c in doc["collectives"].items())
        return cls(
            module=doc["module"].string(),
            streams=streams,
            policy=doc["policy"].one_of(POLICIES),
            collectives=collectives,
            summary=_read_summary(doc["summary"], collectives),
            lowered=lowered.string() if (lowered := doc.get("lowered")) is not None else "",
        )


@dataclass(frozen=True)
class IndexEntry:
    """One report file of a directory and its module's main counts (``modules[i]``)."""

    module: str
    report: str
    async_pairs: int
    assigned: int
    streams_used: int
    serialized_by_rule: int
    synchronous_collectives: int


@dataclass(frozen=True)
class ReportIndex:
    """Every report in a directory, by module: schema ``xla_streams.index.v1``."""

    modules: tuple[IndexEntry, ...]

    def to_json(self) -> str:
        """The index's file, written as reports are (one entry per line)."""
        modules = [_members(e) for e in self.modules]
        return _format({"schema": INDEX_SCHEMA, "modules": modules}, 0) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "index.json") -> ReportIndex:
        """The index in ``text`` (read from ``where``); ReportError naming the field."""
        return cls._read(_json.loads(text, where, ReportError, what="report index"))

    @classmethod
    def load(cls, path: str) -> ReportIndex:
        """The index file at ``path``; ReportError when it is missing or not one."""
        return cls._read(_json.load(path, ReportError, what="report index"))

    @classmethod
    def _read(cls, doc: _json.Value) -> ReportIndex:
        doc.schema(INDEX_SCHEMA)
        return cls(tuple(_read_entry(e) for e in doc["modules"].items()))


def _read_collective(doc: _json.Value, streams: int) -> ReportedCollective:
    start_index, done_index = doc["start_index"].integer(0), doc["done_index"].integer(0)
    if start_index >= done_index:
        doc["done_index"].fail(f"expected more than start_index ({start_index}), got {done_index}")
    runs_on = doc["runs_on"].one_of(RUNS_ON)
    stream = doc["stream"].nullable(lambda v: v.integer(0, streams - 1))
    if stream is None and runs_on == "communication":
        doc["stream"].fail("expected a stream: the pair runs on the collective streams, got null")
    if stream is not None and runs_on != "communication":
        doc["stream"].fail(f"expected null: the pair runs on the {runs_on} stream, got {stream}")
    return ReportedCollective(
        computation=_name(doc["computation"]),
        start=_name(doc["start"]),
        done=_name(doc["done"]),
        kind=_name(doc["kind"]),
        start_index=start_index,
        done_index=done_index,
        sync=doc["sync"].boolean(),
        pipelined=doc["pipelined"].boolean(),
        runs_on=runs_on,
        stream=stream,
        calls=doc["calls"].integer(0),
        groups=tuple(tuple(d.integer(0) for d in g.items()) for g in doc["groups"].items()),
        bytes=doc["bytes"].integer(0),
        serialized_by=doc["serialized_by"].nullable(lambda v: v.one_of(get_args(SerializedBy))),
        reassigned=doc["reassigned"].nullable(_json.Value.string),
    )


def _name(doc: _json.Value) -> str:
    name = doc.string()
    if name.startswith("%"):
        doc.fail(f"expected a name without '%', got {name!r}")
    return name


def _read_summary(doc: _json.Value, collectives: Sequence[ReportedCollective]) -> ReportSummary:
    # Added to v2 after its first files: absent, there were none to count.
    plain = doc.get("synchronous_collectives")
    host = doc.get("host_transfers")
    summary = ReportSummary(
        async_pairs=doc["async_pairs"].integer(0),
        assigned=doc["assigned"].integer(0),
        streams_used=doc["streams_used"].integer(0),
        max_in_flight=doc["max_in_flight"].integer(0),
        serialized=doc["serialized"].integer(0),
        serialized_by_bound=doc["serialized_by_bound"].integer(0),
        serialized_by_rule=doc["serialized_by_rule"].integer(0),
        sync=doc["sync"].integer(0),
        pipelined=doc["pipelined"].integer(0),
        synchronous_collectives=0 if plain is None else plain.integer(0),
        host_transfers=0 if host is None else host.integer(0),
        pairs_by_kind=_counts(doc["pairs_by_kind"]),
        max_in_flight_by_computation=_counts(doc["max_in_flight_by_computation"]),
    )
    said: dict[str, object] = {
        "async_pairs": len(collectives),
        "assigned": sum(c.stream is not None for c in collectives),
        "streams_used": len({c.stream for c in collectives if c.stream is not None}),
        "sync": sum(c.sync for c in collectives),
        "pipelined": sum(c.pipelined for c in collectives),
        "pairs_by_kind": dict(Counter(c.kind for c in collectives)),
    }
    for key, expected in said.items():
        found = getattr(summary, key)
        if found != expected:
            doc[key].fail(f"{json.dumps(found)}, but the collectives say {json.dumps(expected)}")
    return summary


def _counts(doc: _json.Value) -> dict[str, int]:
    return {name: n.integer(0) for name, n in doc.fields().items()}


def _read_entry(doc: _json.Value) -> IndexEntry:
    return IndexEntry(
        module=doc["module"].string(),
        report=doc["report"].string(),
        async_pairs=doc["async_pairs"].integer(0),
        assigned=doc["assigned"].integer(0),
        streams_used=doc["streams_used"].integer(0),
        serialized_by_rule=doc["serialized_by_rule"].integer(0),
        synchronous_collectives=doc["synchronous_collectives"].integer(0),
    )


def _members(value: Any) -> dict[str, Any]:
    """A dataclass's fields by name, in order (not deep, as ``asdict`` is: fast)."""
    return {f.name: getattr(value, f.name) for f in fields(value)}


def _format(value: Any, level: int) -> str:
    """Objects one member a line, an array of objects one element a line, the rest on
    one line (``json.dumps``); key order is the object's own."""
    pad = "  " * (level + 1)
    end = "  " * level
    if isinstance(value, dict) and value:
        items = [f"{pad}{json.dumps(k)}: {_format(v, level + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        rows = [pad + _compact(v) for v in value]
        return "[\n" + ",\n".join(rows) + "\n" + end + "]"
    return _compact(value)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(", ", ": "), ensure_ascii=True, allow_nan=False)


# -- building ------------------------------------------------------------------------


def build_report(compilation: Compilation) -> AssignmentReport:
    """The report of an assigned compilation."""
    assignment = _assignment(compilation)
    pairs = compilation.pairs
    collectives = tuple(
        ReportedCollective(
            computation=p.computation,
            start=p.start,
            done=p.done,
            kind=p.kind,
            start_index=p.start_index,
            done_index=p.done_index,
            sync=p.sync,
            pipelined=p.pipelined,
            runs_on=p.lane,
            stream=assignment.stream_of[p.key],
            calls=len(p.occurrences),
            groups=p.groups,
            bytes=p.bytes,
            serialized_by=_serialized_by(p, assignment),
            reassigned=assignment.reassigned.get(p.key),
        )
        for p in pairs
    )
    placed = [p for p in pairs if assignment.stream_of[p.key] is not None]
    synchronous, host_transfers = _unpaired_collectives(compilation.module)
    summary = ReportSummary(
        async_pairs=len(pairs),
        assigned=len(placed),
        streams_used=assignment.streams_used,
        max_in_flight=max_in_flight(placed),
        serialized=len(assignment.serialized),
        serialized_by_bound=len(assignment.serialized_by_bound),
        serialized_by_rule=len(assignment.serialized_by_rule),
        sync=sum(p.sync for p in pairs),
        pipelined=sum(p.pipelined for p in pairs),
        synchronous_collectives=synchronous,
        host_transfers=host_transfers,
        pairs_by_kind=dict(sorted(Counter(p.kind for p in pairs).items())),
        max_in_flight_by_computation=_in_flight_by_computation(compilation, placed),
    )
    return AssignmentReport(
        compilation.module.name,
        assignment.streams,
        assignment.policy,
        collectives,
        summary,
        assignment.lowered,
    )


def _unpaired_collectives(module: Module) -> tuple[int, int]:
    """The synchronous collectives (never async) and the host transfers (send and recv
    with ``is_host_transfer=true``): one pass over the instructions for both."""
    synchronous = host_transfers = 0
    for inst in module.instructions():
        opcode = inst.opcode
        if opcode in COLLECTIVE_OPCODES:
            synchronous += 1
        elif opcode in _SEND_RECV and inst.attribute("is_host_transfer") == "true":
            host_transfers += 1
    return synchronous, host_transfers


_SEND_RECV = frozenset({"send", "recv"})


def _assignment(compilation: Compilation) -> StreamAssignment:
    if compilation.assignment is None:
        raise ValueError("the compilation has no stream assignment: run assign-streams first")
    return compilation.assignment


def _serialized_by(p: AsyncPair, assignment: StreamAssignment) -> SerializedBy | None:
    if p.key in assignment.serialized_by_rule:
        return "rule"
    if p.key in assignment.serialized_by_bound:
        return "bound"
    return None


def _in_flight_by_computation(
    compilation: Compilation, placed: Sequence[AsyncPair]
) -> dict[str, int]:
    """Per computation with pairs (in module order), the most of its pairs in flight at once."""
    by_computation: dict[str, list[AsyncPair]] = {}
    for p in placed:
        by_computation.setdefault(p.computation, []).append(p)
    return {
        comp.name: max_in_flight(by_computation[comp.name])
        for comp in compilation.module.computations
        if comp.name in by_computation
    }


# -- text ----------------------------------------------------------------------------


def format_table(compilation: Compilation) -> str:
    """A table of every async pair and its stream, then a summary; ends with a newline."""
    report = build_report(compilation)
    return format_report(report)


def format_report(report: AssignmentReport) -> str:
    """The text form of a report."""
    header = ("kind", "start", "computation", "positions", "stream", "groups", "bytes", "note")
    rows: list[tuple[str, ...]] = [header]
    for c in report.collectives:
        rows.append(
            (
                c.kind,
                c.start,
                c.computation,
                f"{c.start_index}..{c.done_index}",
                "-" if c.stream is None else str(c.stream),
                format_groups(c.groups, c.kind),
                human_bytes(c.bytes),
                _note(c),
            )
        )
    lines = aligned(rows, right={3, 4, 6}, rule=True)  # numbers line up on the right
    if len(rows) == 1:
        plain = report.summary.synchronous_collectives
        lines = [
            "(no async collectives"
            + (
                f": {counted(plain, 'synchronous collective')}, which XLA runs on the compute "
                "stream; XLA:CPU has no async collectives, and XLA_STREAMS_MODE=ffi runs them "
                "on streams)"
                if plain
                else ")"
            )
        ]
    return "\n".join(lines) + "\n\n" + format_summary(report)


def _note(c: ReportedCollective) -> str:
    if c.runs_on == "compute":
        return "sync pair: runs on the compute stream"
    if c.runs_on == "p2p":
        return "pipelined: on XLA's P2P stream"
    if c.reassigned:
        return f"reassigned: {c.reassigned}"
    if c.sync:
        return "sync pair: XLA runs it on stream 0"
    if c.serialized_by == "rule":
        return "serialized: deadlock rule"
    if c.serialized_by == "bound":
        return "serialized: all streams busy"
    return ""


def format_summary(report: AssignmentReport) -> str:
    s = report.summary
    kinds = ", ".join(f"{kind} {n}" for kind, n in s.pairs_by_kind.items())
    per_comp = ", ".join(f"{name} {n}" for name, n in s.max_in_flight_by_computation.items())
    lines = [
        f"module {report.module}: {counted(s.async_pairs, 'async pair')}"
        + (f" ({kinds})" if kinds else ""),
        f"assigned: {s.assigned} on {s.streams_used} of {report.streams} streams "
        f"(policy {report.policy}); pipelined {s.pipelined}",
        # Two different things, both synchronous: async pairs XLA runs synchronously
        # (summary.sync) and collectives that were never async (synchronous_collectives).
        f"synchronous: {counted(s.sync, 'sync pair')} (async start and done with nothing "
        "between, which XLA runs synchronously), "
        f"{counted(s.synchronous_collectives, 'synchronous collective')} (never async)",
        *(
            [
                f"host transfers: {s.host_transfers} (send/recv to or from the host: not "
                "device collectives, no stream)"
            ]
            if s.host_transfers
            else []
        ),
        f"max in flight: {s.max_in_flight}"
        + (f" (by computation: {per_comp})" if per_comp else ""),
        f"serialized: {s.serialized} (all {report.streams} streams busy: "
        f"{s.serialized_by_bound}, deadlock rule: {s.serialized_by_rule})",
        *([f"streams: {report.lowered}"] if report.lowered else []),
    ]
    return "\n".join(lines) + "\n"


def summary_line(compilation: Compilation) -> str:
    """One line for a compiled module: its collectives and where they went."""
    report = build_report(compilation)
    s = report.summary
    line = f"module {report.module}: {counted(s.async_pairs, 'async pair')}"
    if s.async_pairs:
        line += f", {s.assigned} on {s.streams_used} of {report.streams} streams"
        if s.serialized_by_rule:
            line += f" ({s.serialized_by_rule} kept together by the deadlock rule)"
        if report.lowered:
            line += f" ({report.lowered.split(':')[0]})"
    if s.synchronous_collectives:
        line += f", {counted(s.synchronous_collectives, 'synchronous collective')}"
    return line


# -- files ---------------------------------------------------------------------------


def report_paths(report_dir: str, module_name: str, digest: str) -> tuple[str, str]:
    """``<dir>/<module>.<fingerprint>.json`` and ``.txt``."""
    safe = re.sub(r"[^A-Za-z0-9_.\-]", "_", module_name) or "module"
    base = os.path.join(report_dir, f"{safe}.{digest}")
    return base + ".json", base + ".txt"


def write_reports(compilation: Compilation, report_dir: str, digest: str) -> tuple[str, str]:
    """Write the JSON report and the text table of ``compilation``, atomically, and add
    it to the directory's index; returns the paths written, the JSON report first."""
    report = build_report(compilation)
    json_path, text_path = report_paths(report_dir, compilation.module.name, digest)
    os.makedirs(report_dir, exist_ok=True)
    atomic_write_many([(json_path, report.to_json()), (text_path, format_report(report))])
    _add_to_index(report_dir, report, json_path)
    return json_path, text_path


def _add_to_index(report_dir: str, report: AssignmentReport, json_path: str) -> None:
    """``index.json`` and ``index.txt``: every module reported in the directory, one entry
    per report file. Processes sharing the directory take turns (a file lock)."""
    s = report.summary
    entry = IndexEntry(
        module=report.module,
        report=os.path.basename(json_path),
        async_pairs=s.async_pairs,
        assigned=s.assigned,
        streams_used=s.streams_used,
        serialized_by_rule=s.serialized_by_rule,
        synchronous_collectives=s.synchronous_collectives,
    )
    with open(os.path.join(report_dir, ".index.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        index_path = os.path.join(report_dir, "index.json")
        try:
            entries = [e for e in ReportIndex.load(index_path).modules if e.report != entry.report]
        except ReportError:
            entries = []  # none yet, or not ours: start afresh
        index = ReportIndex(tuple(sorted([*entries, entry], key=lambda e: (e.module, e.report))))
        atomic_write_many(
            [
                (index_path, index.to_json()),
                (os.path.join(report_dir, "index.txt"), _index_text(index.modules)),
            ]
        )


def _index_text(entries: Sequence[IndexEntry]) -> str:
    header = (
        "module",
        "async pairs",
        "on streams",
        "streams used",
        "tied by rule",
        "synchronous collectives",
        "report",
    )
    rows = [header] + [
        (
            e.module, str(e.async_pairs), str(e.assigned), str(e.streams_used),
            str(e.serialized_by_rule), str(e.synchronous_collectives), e.report,
        )
        for e in entries
    ]  # fmt: skip
    return "\n".join(aligned(rows)) + "\n"
