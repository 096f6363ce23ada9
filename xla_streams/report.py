"""Reports of a stream assignment: a text table for people, JSON for programs, and the
files the plugin writes (one report per module, and an index of them).

Both are built from a :class:`~xla_streams.pipeline.Compilation` on which
``find-async-pairs`` and ``assign-streams`` have run. The JSON follows the
schema ``xla_streams.assignment.v2``::

    {"schema": "xla_streams.assignment.v2", "module": str, "streams": K,
     "policy": "interval" | "round-robin",
     "collectives": [{"computation": str, "start": str, "done": str, "kind": str,
                      "start_index": int, "done_index": int, "sync": bool,
                      "pipelined": bool,
                      "runs_on": "communication" | "compute" | "p2p",
                      "stream": int | null, "calls": int,
                      "groups": [[int, ...], ...], "bytes": int,
                      "serialized_by": "bound" | "rule" | null,
                      "reassigned": str | null}, ...],
     "summary": {"async_pairs": int, "assigned": int, "streams_used": int,
                 "max_in_flight": int, "serialized": int,
                 "serialized_by_bound": int, "serialized_by_rule": int,
                 "sync": int, "pipelined": int, "synchronous_collectives": int,
                 "pairs_by_kind": {kind: int}, "max_in_flight_by_computation": {name: int}}}

Names carry no ``%``; ``start_index``/``done_index`` are 0-based positions in
the computation's schedule; ``runs_on`` is where XLA runs the pair (the stream
model of :mod:`xla_streams.collectives`), and ``stream`` is null exactly when
that is not a collective stream; ``calls`` counts the calls of its computation
(each one checked by the deadlock rule); ``reassigned`` says why an annotation
the module already had was not kept; ``groups`` are global device ids;
``synchronous_collectives`` counts plain (not async) collectives. v2 replaced
v1's rule "stream is null for every sync pair" (XLA 0.10.2 runs sync pairs on
stream 0 when the overlap limit is above 1). Fields may be added to v2, never
renamed or removed. "In flight" counts the pairs on collective streams. The
output is a pure function of the module text and the options, byte for byte,
in any process.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Sequence
from typing import Any

from xla_streams._io import atomic_write_many
from xla_streams._text import aligned, human_bytes
from xla_streams.collectives import (
    COLLECTIVE_OPCODES,
    KINDS,
    MAX_STREAMS,
    POLICIES,
    AsyncPair,
    StreamAssignment,
    check_streams,
    max_in_flight,
)
from xla_streams.passes.base import Compilation

SCHEMA = "xla_streams.assignment.v2"
INDEX_SCHEMA = "xla_streams.index.v1"


# -- building ------------------------------------------------------------------------


def build_report(compilation: Compilation) -> dict[str, Any]:
    """The JSON-ready report of an assigned compilation (schema ``xla_streams.assignment.v1``)."""
    assignment = _assignment(compilation)
    pairs = compilation.pairs
    collectives = []
    for p in pairs:
        collectives.append(
            {
                "computation": p.computation,
                "start": p.start,
                "done": p.done,
                "kind": p.kind,
                "start_index": p.start_index,
                "done_index": p.done_index,
                "sync": p.sync,
                "pipelined": p.pipelined,
                "runs_on": p.lane,
                "stream": assignment.stream_of[p.start],
                "calls": len(p.occurrences),
                "groups": [list(g) for g in p.groups],
                "bytes": p.bytes,
                "serialized_by": _serialized_by(p, assignment),
                "reassigned": assignment.reassigned.get(p.start),
            }
        )
    placed = [p for p in pairs if assignment.stream_of[p.start] is not None]
    by_kind: dict[str, int] = {}
    for p in pairs:
        by_kind[p.kind] = by_kind.get(p.kind, 0) + 1
    summary = {
        "async_pairs": len(pairs),
        "assigned": len(placed),
        "streams_used": assignment.streams_used,
        "max_in_flight": max_in_flight(placed),
        "serialized": len(assignment.serialized),
        "serialized_by_bound": len(assignment.serialized_by_bound),
        "serialized_by_rule": len(assignment.serialized_by_rule),
        "sync": sum(p.sync for p in pairs),
        "pipelined": sum(p.pipelined for p in pairs),
        "synchronous_collectives": _synchronous_collectives(compilation),
        "pairs_by_kind": dict(sorted(by_kind.items())),
        "max_in_flight_by_computation": _in_flight_by_computation(compilation, placed),
    }
    return {
        "schema": SCHEMA,
        "module": compilation.module.name,
        "streams": assignment.streams,
        "policy": assignment.policy,
        "collectives": collectives,
        "summary": summary,
    }


def _synchronous_collectives(compilation: Compilation) -> int:
    instructions = compilation.module.instructions()
    return sum(1 for inst in instructions if inst.opcode in COLLECTIVE_OPCODES)


def _assignment(compilation: Compilation) -> StreamAssignment:
    if compilation.assignment is None:
        raise ValueError("the compilation has no stream assignment: run assign-streams first")
    return compilation.assignment


def _serialized_by(p: AsyncPair, assignment: StreamAssignment) -> str | None:
    if p.start in assignment.serialized_by_rule:
        return "rule"
    if p.start in assignment.serialized_by_bound:
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


# -- JSON ----------------------------------------------------------------------------


def to_json(report: dict[str, Any]) -> str:
    """The report as JSON text: two-space indents, one collective per line, final newline.

    Key order is the report's own (insertion) order, so equal reports give equal bytes.
    """
    return _format(report, 0) + "\n"


def _format(value: Any, level: int) -> str:
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


def schema_problems(report: Any) -> list[str]:
    """What keeps ``report`` from being a valid v1 report; empty when it is valid.

    Checks the required fields and their types, and the rules the types cannot
    say (null streams exactly off the collective streams, streams below K,
    counts that agree with the collectives). Extra fields are allowed.
    """
    problems: list[str] = []

    def need(obj: Any, key: str, types: tuple[type, ...], where: str) -> Any:
        if not isinstance(obj, dict) or key not in obj:
            problems.append(f"{where}: missing '{key}'")
            return None
        value = obj[key]
        # bool is an int in Python; JSON keeps them apart.
        ok = isinstance(value, types) and (bool in types or not isinstance(value, bool))
        if not ok:
            names = "|".join("null" if t is type(None) else t.__name__ for t in types)
            problems.append(f"{where}.{key}: expected {names}, found {json.dumps(value)}")
            return None
        return value

    if not isinstance(report, dict):
        return ["report: expected an object"]
    if need(report, "schema", (str,), "report") not in (None, SCHEMA):
        problems.append(f"report.schema: expected '{SCHEMA}', found '{report['schema']}'")
    need(report, "module", (str,), "report")
    streams = need(report, "streams", (int,), "report")
    if streams is not None:
        try:
            check_streams(streams)
        except ValueError:
            problems.append(f"report.streams: {streams} is not in 1..{MAX_STREAMS}")
    policy = need(report, "policy", (str,), "report")
    if policy is not None and policy not in POLICIES:
        problems.append(f"report.policy: '{policy}' is not one of {', '.join(POLICIES)}")
    collectives = need(report, "collectives", (list,), "report") or []
    used: set[int] = set()
    for i, c in enumerate(collectives):
        where = f"collectives[{i}]"
        if not isinstance(c, dict):
            problems.append(f"{where}: expected an object")
            continue
        for key in ("computation", "start", "done", "kind"):
            name = need(c, key, (str,), where)
            if isinstance(name, str) and name.startswith("%"):
                problems.append(f"{where}.{key}: names are written without '%'")
        start = need(c, "start_index", (int,), where)
        done = need(c, "done_index", (int,), where)
        if start is not None and done is not None and not 0 <= start < done:
            problems.append(f"{where}: expected 0 <= start_index < done_index")
        need(c, "sync", (bool,), where)
        need(c, "pipelined", (bool,), where)
        runs_on = need(c, "runs_on", (str,), where)
        stream = need(c, "stream", (int, type(None)), where)
        if runs_on is not None and runs_on not in ("communication", "compute", "p2p"):
            problems.append(f"{where}.runs_on: '{runs_on}' is not communication, compute or p2p")
        if runs_on is not None and "stream" in c:
            if (stream is None) != (runs_on != "communication"):
                problems.append(f"{where}.stream: null exactly when it runs off the streams")
            if stream is not None and streams is not None and not 0 <= stream < streams:
                problems.append(f"{where}.stream: {stream} is not in 0..{streams - 1}")
            if stream is not None:
                used.add(stream)
        groups = need(c, "groups", (list,), where)
        if groups is not None and not all(
            isinstance(g, list)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in g)
            for g in groups
        ):
            problems.append(f"{where}.groups: expected lists of device ids")
        size = need(c, "bytes", (int,), where)
        if size is not None and size < 0:
            problems.append(f"{where}.bytes: negative")
    summary = need(report, "summary", (dict,), "report")
    if summary is not None:
        counts = {
            key: need(summary, key, (int,), "summary")
            for key in ("async_pairs", "assigned", "streams_used", "max_in_flight", "serialized")
        }
        if isinstance(collectives, list) and not problems:
            expected = {
                "async_pairs": len(collectives),
                "assigned": sum(c["stream"] is not None for c in collectives),
                "streams_used": len(used),
            }
            for key, value in expected.items():
                if counts[key] is not None and counts[key] != value:
                    problems.append(
                        f"summary.{key}: {counts[key]}, but the collectives say {value}"
                    )
    return problems


# -- text ----------------------------------------------------------------------------


def format_table(compilation: Compilation) -> str:
    """A table of every async pair and its stream, then a summary; ends with a newline."""
    report = build_report(compilation)
    return format_report(report)


def format_report(report: dict[str, Any]) -> str:
    """The text form of a report built by :func:`build_report`."""
    header = ("kind", "start", "computation", "positions", "stream", "groups", "bytes", "note")
    rows: list[tuple[str, ...]] = [header]
    for c in report["collectives"]:
        rows.append(
            (
                c["kind"],
                c["start"],
                c["computation"],
                f"{c['start_index']}..{c['done_index']}",
                "-" if c["stream"] is None else str(c["stream"]),
                format_groups(c["groups"], c["kind"]),
                human_bytes(c["bytes"]),
                _note(c),
            )
        )
    lines = aligned(rows, right={3, 4, 6}, rule=True)  # numbers line up on the right
    if len(rows) == 1:
        plain = report["summary"].get("synchronous_collectives", 0)
        lines = [
            "(no async collectives"
            + (
                f": {_count(plain, 'synchronous collective')}, which XLA runs on the compute "
                "stream; XLA:CPU has no async collectives, and XLA_STREAMS_MODE=ffi runs them "
                "on streams)"
                if plain
                else ")"
            )
        ]
    return "\n".join(lines) + "\n\n" + format_summary(report)


def _note(c: dict[str, Any]) -> str:
    if c["runs_on"] == "compute":
        return "sync pair: runs on the compute stream"
    if c["runs_on"] == "p2p":
        return "pipelined: on XLA's P2P stream"
    if c.get("reassigned"):
        return f"reassigned: {c['reassigned']}"
    if c["sync"]:
        return "sync pair: XLA runs it on stream 0"
    by = c.get("serialized_by")
    if by == "rule":
        return "serialized: deadlock rule"
    if by == "bound":
        return "serialized: all streams busy"
    return ""


def format_summary(report: dict[str, Any]) -> str:
    s = report["summary"]
    kinds = ", ".join(f"{kind} {n}" for kind, n in s["pairs_by_kind"].items())
    per_comp = ", ".join(f"{name} {n}" for name, n in s["max_in_flight_by_computation"].items())
    lines = [
        f"module {report['module']}: {_count(s['async_pairs'], 'async pair')}"
        + (f" ({kinds})" if kinds else ""),
        f"assigned: {s['assigned']} on {s['streams_used']} of {report['streams']} streams "
        f"(policy {report['policy']}); pipelined {s['pipelined']}",
        # Two different things, both synchronous: async pairs XLA runs synchronously
        # (summary.sync) and collectives that were never async (synchronous_collectives).
        f"synchronous: {_count(s['sync'], 'sync pair')} (async start and done with nothing "
        "between, which XLA runs synchronously), "
        f"{_count(s.get('synchronous_collectives', 0), 'synchronous collective')} (never async)",
        f"max in flight: {s['max_in_flight']}"
        + (f" (by computation: {per_comp})" if per_comp else ""),
        f"serialized: {s['serialized']} (all {report['streams']} streams busy: "
        f"{s['serialized_by_bound']}, deadlock rule: {s['serialized_by_rule']})",
    ]
    return "\n".join(lines) + "\n"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def summary_line(compilation: Compilation) -> str:
    """One line for a compiled module: its collectives and where they went."""
    report = build_report(compilation)
    s = report["summary"]
    line = f"module {report['module']}: {_count(s['async_pairs'], 'async pair')}"
    if s["async_pairs"]:
        line += f", {s['assigned']} on {s['streams_used']} of {report['streams']} streams"
        if s["serialized_by_rule"]:
            line += f" ({s['serialized_by_rule']} kept together by the deadlock rule)"
    if s["synchronous_collectives"]:
        line += f", {_count(s['synchronous_collectives'], 'synchronous collective')}"
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
    atomic_write_many([(json_path, to_json(report)), (text_path, format_report(report))])
    _add_to_index(report_dir, report, json_path)
    return json_path, text_path


def _add_to_index(report_dir: str, report: dict[str, Any], json_path: str) -> None:
    """``index.json`` and ``index.txt``: every module reported in the directory, one entry
    per report file. Processes sharing the directory take turns (a file lock)."""
    s = report["summary"]
    entry = {
        "module": report["module"],
        "report": os.path.basename(json_path),
        "async_pairs": s["async_pairs"],
        "assigned": s["assigned"],
        "streams_used": s["streams_used"],
        "serialized_by_rule": s["serialized_by_rule"],
        "synchronous_collectives": s["synchronous_collectives"],
    }
    with open(os.path.join(report_dir, ".index.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        index_path = os.path.join(report_dir, "index.json")
        try:
            with open(index_path, encoding="utf-8") as f:
                entries = [e for e in json.load(f)["modules"] if e["report"] != entry["report"]]
        except (OSError, ValueError, KeyError, TypeError):
            entries = []  # none yet, or not ours: start afresh
        entries = sorted([*entries, entry], key=lambda e: (e["module"], e["report"]))
        index = {"schema": INDEX_SCHEMA, "modules": entries}
        atomic_write_many(
            [
                (index_path, to_json(index)),
                (os.path.join(report_dir, "index.txt"), _index_text(entries)),
            ]
        )


def _index_text(entries: list[dict[str, Any]]) -> str:
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
            e["module"], str(e["async_pairs"]), str(e["assigned"]), str(e["streams_used"]),
            str(e["serialized_by_rule"]), str(e["synchronous_collectives"]), e["report"],
        )
        for e in entries
    ]  # fmt: skip
    return "\n".join(aligned(rows)) + "\n"


# -- short forms ---------------------------------------------------------------------


def format_groups(groups: Sequence[Sequence[int]], kind: str = "") -> str:
    """A short form of device groups.

    ``{0..7}``, ``{0,64,...,960}``: one group; ``4x{0,4}``: four groups, each the
    first shifted so that together they tile the devices (``step N`` is added when
    they do not tile);
    ``8 pairs 0->1..7->0``: a permute whose pairs shift every device of a range;
    ``2x(4 pairs 0->1..3->0)``: a pattern repeated on shifted devices. Anything
    else is listed, the middle elided when long.
    """
    items = [tuple(g) for g in groups]
    if not items:
        return "{}"
    is_pairs = kind in KINDS and KINDS[kind].groups == "pairs" and all(len(g) == 2 for g in items)
    return _format_pairs(items) if is_pairs else _format_sets(items)


def _format_sets(items: list[tuple[int, ...]]) -> str:
    if len(items) == 1:
        return _braces(items[0])
    period = _period(items)
    if period is not None:
        p, step = period
        if p == 1:
            devices = sorted(d for g in items for d in g)
            tiles = devices == list(range(devices[0], devices[0] + len(devices)))
            return f"{len(items)}x{_braces(items[0])}" + ("" if tiles else f" step {step}")
        return f"{len(items) // p}x({_format_sets(items[:p])}) step {step}"
    return _elide([_braces(g) for g in items], "groups")


def _format_pairs(items: list[tuple[int, ...]]) -> str:
    if len(items) == 1:
        return _arrow(items[0])
    if _is_shift(items) and len(items) > 2:
        return f"{len(items)} pairs {_arrow(items[0])}..{_arrow(items[-1])}"
    period = _period(items)
    if period is not None:
        p, step = period
        block = items[:p]
        inner = _format_pairs(block)
        devices = sorted(d for g in block for d in g)
        width = devices[-1] - devices[0] + 1
        return f"{len(items) // p}x({inner})" + ("" if step == width else f" step {step}")
    return _elide([_arrow(g) for g in items], "pairs")


def _is_shift(items: list[tuple[int, ...]]) -> bool:
    """Sources are a consecutive range and every target is its source moved by the same
    amount, either straight (``0->1..6->7``) or around the range (``0->1..7->0``)."""
    sources = [s for s, _ in items]
    first, m = sources[0], len(items)
    if sources != list(range(first, first + m)):
        return False
    delta = items[0][1] - first
    straight = all(t - s == delta for s, t in items)
    around = all(t == first + (s - first + delta) % m for s, t in items)
    return straight or around


def _period(items: list[tuple[int, ...]]) -> tuple[int, int] | None:
    """The smallest p < len(items) such that item i is item i mod p with every id raised
    by (i div p) * step, for one step; with that step. None when there is none."""
    n = len(items)
    for p in range(1, n // 2 + 1):
        if n % p:
            continue
        step = items[p][0] - items[0][0] if items[p] and items[0] else 0
        if step == 0:
            continue
        if all(
            len(items[i]) == len(items[i % p])
            and all(a == b + (i // p) * step for a, b in zip(items[i], items[i % p], strict=True))
            for i in range(p, n)
        ):
            return p, step
    return None


def _braces(group: Sequence[int]) -> str:
    """``{0..3,8,10}``, ``{0,64,...,960}``: runs of three or more consecutive ids and of
    four or more evenly spaced ids shortened."""
    parts: list[str] = []
    i = 0
    while i < len(group):
        j = i
        if i + 1 < len(group):
            step = group[i + 1] - group[i]
            while j + 1 < len(group) and group[j + 1] - group[j] == step:
                j += 1
            if step == 1 and j - i >= 2:
                parts.append(f"{group[i]}..{group[j]}")
                i = j + 1
                continue
            if step > 1 and j - i >= 3:
                parts.append(f"{group[i]},{group[i + 1]},...,{group[j]}")
                i = j + 1
                continue
        parts.append(str(group[i]))
        i += 1
    return "{" + ",".join(parts) + "}"


def _arrow(pair: Sequence[int]) -> str:
    return f"{pair[0]}->{pair[1]}"


def _elide(parts: list[str], noun: str, keep: int = 4) -> str:
    if len(parts) <= keep:
        return ",".join(parts)
    return ",".join(parts[: keep - 1]) + f",...,{parts[-1]} ({len(parts)} {noun})"
