"""What ``xla-streams tune`` found, and its file: :class:`Configuration`, :class:`TuneResult`
(schema ``xla_streams.tune.v1``: ``to_json`` writes it, ``from_json`` reads it back
checked), the table and the command in words.

The plugin reads tune files (``XLA_STREAMS_CONFIG``) through :func:`load_tune_result`,
so this module stays light: it imports neither JAX nor the simulator, only the names
of XLA's options, of the stream policies and of the levers.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from xla_streams import _json
from xla_streams import xla_options as xo
from xla_streams._text import aligned
from xla_streams.collectives import DEFAULT_POLICY, MAX_STREAMS, POLICIES, check_streams
from xla_streams.option import ascii_integer
from xla_streams.tuning.levers import describe, format_bytes

SCHEMA = "xla_streams.tune.v1"
# The search evaluates at most this many option sets unless told. Measured with jax
# 0.12.0.1, all levers (docs/tune.md, "The search"): the embedded 32-GPU
# programs finish their neighbour check in 33 (multihost_32) to 89 (fsdp_tp_remat_scan)
# evaluations; 200 leaves room for a move the check finds, the descent and the check
# after it.
DEFAULT_BUDGET_COMPILES = 200
# The wall-time safety limit, twice what the default compile budget takes at most on
# a busy 2-core machine (about 9 s an evaluation with 2 jobs: 1,800 s): the compile
# budget ends a search first, so that its result does not depend on the machine.
DEFAULT_BUDGET_S = 3600.0
# What can end a search early (TuneResult.stopped_by; "" for nothing).
STOPPED_BY = ("", "budget_compiles", "budget_s")
# What tune decided (TuneResult.decision; "" in a file written before it was recorded):
# the pick is recommended; its gain lies inside the model's uncertainty, so XLA's
# defaults stay; or the search found nothing faster than them that fits.
DECISIONS = ("", "recommended", "no_reliable_gain", "no_gain")
# Why a candidate was dropped, in words: XLA refused or crashed on its options, this
# package could not read or simulate its compiled module, or XLA gave no usable memory
# figures for it.
DROP_STAGES = {
    "compile": "XLA refused it",
    "read": "its compiled module could not be read",
    "simulate": "its compiled module could not be simulated",
    "memory": "its memory could not be checked",
}
DEFAULT_HEADROOM = 0.10
DEFAULT_SCRIPT = "python train.py"


class TuneError(ValueError):
    """Bad input to the tuner (a program, a builder, a flag, a tune file): one line."""


def first_line(e: BaseException) -> str:
    """``ValueError: the first line of its message``, at most 300 characters: what a
    TuneError says of an exception raised by the user's program or by XLA."""
    text = str(e).strip().splitlines()
    line = text[0] if text else ""
    line = f"{type(e).__name__}: {line}" if line else type(e).__name__
    return line if len(line) <= 300 else line[:297] + "..."


# -- results -----------------------------------------------------------------------------


@dataclass(frozen=True)
class XlaOpinion:
    """XLA's own estimate of a compiled module: what its latency-hiding scheduler predicted
    (:mod:`xla_streams.simulate.xla_estimate`), a second opinion beside the simulator's.

    ``priced_step_ms`` is the one compared: the step without the waits on XLA's
    placeholders, the async computations it cannot price and charges a flat 5 ms (async
    fusions; ``placeholders`` names their start instructions); ``step_ms`` keeps them.
    ``unpriced`` are the collectives XLA could not price either and charged the same
    5 ms: their waits stay in (they are communication), so with any of them XLA's
    figures are no opinion on the communication. ``spans`` (kept in memory, not
    written) are the async collectives XLA priced: their start, the time XLA's schedule
    lets each run (at least the latency XLA charged it) in microseconds, and runs per
    step."""

    step_ms: float
    priced_step_ms: float
    exposed_communication_ms: float
    placeholders: tuple[str, ...] = ()
    unpriced: tuple[str, ...] = ()
    spans: tuple[tuple[str, float, int], ...] = field(default=(), compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "step_ms": round(self.step_ms, 6),
            "priced_step_ms": round(self.priced_step_ms, 6),
            "exposed_communication_ms": round(self.exposed_communication_ms, 6),
            "placeholders": list(self.placeholders),
            "unpriced": list(self.unpriced),
        }

    @classmethod
    def from_json(cls, doc: _json.Value) -> XlaOpinion:
        return cls(
            step_ms=doc["step_ms"].number(0),
            priced_step_ms=doc["priced_step_ms"].number(0),
            exposed_communication_ms=doc["exposed_communication_ms"].number(0),
            placeholders=_strings(doc["placeholders"]),
            unpriced=_strings(doc["unpriced"]),
        )


@dataclass(frozen=True)
class Configuration:
    """XLA options, the number of collective streams and the policy, with what they cost.

    ``xla_flags`` keys are ``DebugOptions`` field names, values as
    ``compile(compiler_options=...)`` takes them. ``streams`` 1 means the plugin
    is off. ``compile_s`` is set on candidates only.
    """

    xla_flags: Mapping[str, object]
    streams: int
    policy: str
    predicted_step_ms: float
    peak_memory_bytes: int
    exposed_communication_ms: float | None = None
    compile_s: float | None = None
    fits: bool = True
    by_streams: Mapping[int, float] = field(default_factory=dict)  # K -> step ms (best policy)
    # The simulator's range of the step time: every input at the optimistic end of its
    # error bound (low), at the pessimistic end plus interference (high).
    step_low_ms: float | None = None
    step_high_ms: float | None = None
    xla: XlaOpinion | None = None  # XLA's own estimate of the same compiled module
    # The step as modelled with the simulator's interference term off (what in-flight
    # collectives take from compute): set on the baseline and the pick only.
    step_without_interference_ms: float | None = None

    @property
    def settings(self) -> str:
        """The options in short words: ``overlap-limit=4, pipeline-all-gather=on``."""
        return describe(self.xla_flags)

    def to_json(self, *, candidate: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "xla_flags": dict(sorted(self.xla_flags.items())),
            "streams": self.streams,
            "policy": self.policy,
            "predicted_step_ms": round(self.predicted_step_ms, 6),
            "peak_memory_bytes": self.peak_memory_bytes,
        }
        if self.exposed_communication_ms is not None:
            out["exposed_communication_ms"] = round(self.exposed_communication_ms, 6)
        if self.step_low_ms is not None and self.step_high_ms is not None:
            out["predicted_step_range_ms"] = {
                "low": round(self.step_low_ms, 6),
                "expected": round(self.predicted_step_ms, 6),
                "high": round(self.step_high_ms, 6),
            }
        if self.step_without_interference_ms is not None:
            out["predicted_step_ms_without_interference"] = round(
                self.step_without_interference_ms, 6
            )
        if self.xla is not None:
            out["xla_estimate"] = self.xla.to_json()
        if candidate:
            out["compile_s"] = round(self.compile_s or 0.0, 3)
            out["fits"] = self.fits
            out["settings"] = self.settings
            if self.by_streams:
                out["step_ms_by_streams"] = {
                    str(k): round(v, 6) for k, v in sorted(self.by_streams.items())
                }
        return out

    @classmethod
    def from_json(cls, doc: _json.Value, *, candidate: bool = False) -> Configuration:
        """A configuration as :meth:`to_json` writes it, checked: the document's error at
        the field that is wrong. Its ``xla_flags`` may only be options the tuner searches
        (``xla_options.OPTIONS``), each typed and ranged: a value can never add a flag of
        its own to ``XLA_FLAGS``, nor abort XLA's flag parser."""
        xla_flags = _xla_flags(doc["xla_flags"])
        streams = doc["streams"].integer()
        try:
            check_streams(streams)
        except ValueError:
            doc["streams"].fail(f"expected an integer from 1 to {MAX_STREAMS}, got {streams}")
        spread = doc.get("predicted_step_range_ms")
        by_streams: dict[int, float] = _optional(doc, "step_ms_by_streams", _step_by_streams, {})
        return cls(
            xla_flags=xla_flags,
            streams=streams,
            policy=doc["policy"].one_of(POLICIES),
            predicted_step_ms=doc["predicted_step_ms"].number(0),
            peak_memory_bytes=doc["peak_memory_bytes"].integer(0),
            exposed_communication_ms=_optional(doc, "exposed_communication_ms", _number, None),
            compile_s=doc["compile_s"].number() if candidate else None,
            fits=_optional(doc, "fits", _json.Value.boolean, True),
            by_streams=by_streams,
            step_low_ms=spread["low"].number() if spread is not None else None,
            step_high_ms=spread["high"].number() if spread is not None else None,
            xla=_optional(doc, "xla_estimate", XlaOpinion.from_json, None),
            step_without_interference_ms=_optional(
                doc, "predicted_step_ms_without_interference", _number, None
            ),
        )


def paired_steps(base: Configuration, c: Configuration) -> list[tuple[str, float, float]]:
    """``(end, c's step, base's step)`` in ms at the optimistic end of both ranges, as
    modelled, and at the pessimistic end (the ends where both ranges are known): each
    pair priced with every input at the same end, on the same machine (the errors are
    the hardware's and move both configurations alike)."""
    out = [("expected", c.predicted_step_ms, base.predicted_step_ms)]
    for end, mine, theirs in (
        ("optimistic", c.step_low_ms, base.step_low_ms),
        ("pessimistic", c.step_high_ms, base.step_high_ms),
    ):
        if mine and theirs:
            out.append((end, mine, theirs))
    return out


def _xla_flags(flags: _json.Value) -> dict[str, object]:
    """A configuration's ``xla_flags``: only options the tuner searches, each typed and
    ranged (a value can never add a flag of its own to ``XLA_FLAGS``)."""
    xla_flags = {}
    for name, value in flags.fields().items():
        if name not in xo.OPTIONS:
            flags.fail(
                f"{_short(name)!r} is not an option xla-streams tune searches (those are "
                f"the {len(xo.OPTIONS)} options of xla_streams/xla_options.py)"
            )
        try:
            xla_flags[name] = xo.check_option(name, value.raw)
        except ValueError as e:
            value.fail(str(e))
    return xla_flags


@dataclass(frozen=True)
class Dropped:
    """A candidate the search could not use, and why: ``stage`` (a key of
    :data:`DROP_STAGES`) and XLA's or this package's first line."""

    xla_flags: Mapping[str, object]
    stage: str
    reason: str

    @property
    def settings(self) -> str:
        return describe(self.xla_flags)

    @property
    def words(self) -> str:
        """What went wrong, for people: ``its compiled module could not be read: ...``."""
        return f"{DROP_STAGES[self.stage]}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return {
            "xla_flags": dict(sorted(self.xla_flags.items())),
            "settings": self.settings,
            "stage": self.stage,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, doc: _json.Value) -> Dropped:
        return cls(
            xla_flags=_xla_flags(doc["xla_flags"]),
            stage=doc["stage"].one_of(tuple(DROP_STAGES)),
            reason=doc["reason"].string(),
        )


@dataclass(frozen=True)
class TuneResult:
    """What ``tune`` found: schema ``xla_streams.tune.v1`` (:meth:`to_json`)."""

    program: str
    target: str
    devices: int
    devices_per_host: int
    baseline: Configuration
    best: Configuration
    candidates: tuple[Configuration, ...]
    command: str
    hbm_bytes: int = 0
    headroom: float = DEFAULT_HEADROOM
    verdict: str = ""
    reasons: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    elapsed_s: float = 0.0
    budget_s: float = DEFAULT_BUDGET_S
    compiles: int = 0  # XLA compiles this run made (not those the disk cache held)
    script: str = DEFAULT_SCRIPT
    cache_hits: int = 0  # option sets whose compile came from the disk cache
    evaluated: int = 0  # option sets evaluated (compiled, cached or dropped)
    guarantee: str = ""  # what the search proved of its result, in words
    topology: str = ""  # the compile-only topology, <partitions>x<hosts>x<devices>
    dropped: tuple[Dropped, ...] = ()  # candidates the search could not use, and why
    budget_compiles: int = DEFAULT_BUDGET_COMPILES
    # What ended the search early: "budget_compiles", "budget_s" (the wall-time safety
    # limit: then the result depends on the machine's speed), or "" (nothing).
    stopped_by: str = ""
    # XLA's own estimate on the pick (else on XLA's defaults), in one line (empty
    # without one).
    second_opinion: str = ""
    decision: str = ""  # one of DECISIONS
    # The search's pick, recommended or not (None: nothing faster than XLA's defaults
    # fits); ``best`` is what to run.
    pick: Configuration | None = None
    # The recommendation's scheduled module (compiled.as_text()); not in the JSON.
    best_hlo: str = field(default="", repr=False, compare=False)

    @property
    def speedup(self) -> float:
        """Baseline step time over the recommended one's (1.0: the baseline stays)."""
        best = self.best.predicted_step_ms
        return self.baseline.predicted_step_ms / best if best > 0 else 1.0

    @property
    def memory_limit_bytes(self) -> int:
        return int(self.hbm_bytes * (1.0 - self.headroom))

    @property
    def interference_share(self) -> float | None:
        """The share of the pick's predicted gain (ms a step saved against XLA's defaults)
        that interference takes back: 1 - saved / saved without it; negative where it
        hurts the defaults more. None without a pick, or without a gain to take back."""
        pick, base = self.pick, self.baseline
        if pick is None or pick.step_without_interference_ms is None:
            return None
        if base.step_without_interference_ms is None:
            return None
        quiet = base.step_without_interference_ms - pick.step_without_interference_ms
        if quiet <= 0:
            return None
        return 1.0 - (base.predicted_step_ms - pick.predicted_step_ms) / quiet

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "program": self.program,
            "target": self.target,
            "devices": self.devices,
            "devices_per_host": self.devices_per_host,
            "baseline": self.baseline.to_json(),
            "best": self.best.to_json(),
            "candidates": [c.to_json(candidate=True) for c in self.candidates],
            "command": self.command,
            "speedup": round(self.speedup, 4),
            "verdict": self.verdict,
            "reasons": list(self.reasons),
            "hbm_bytes": self.hbm_bytes,
            "headroom": self.headroom,
            "skipped": list(self.skipped),
            "notes": list(self.notes),
            "compiles": self.compiles,
            "cache_hits": self.cache_hits,
            "evaluated": self.evaluated,
            "guarantee": self.guarantee,
            "topology": self.topology,
            "dropped": [d.to_json() for d in self.dropped],
            "budget_compiles": self.budget_compiles,
            "stopped_by": self.stopped_by,
            "second_opinion": self.second_opinion,
            "decision": self.decision,
            "pick": self.pick.to_json() if self.pick is not None else None,
            "interference_share": _rounded(self.interference_share),
            "elapsed_s": round(self.elapsed_s, 1),
            "budget_s": self.budget_s,
        }

    @classmethod
    def from_json(cls, doc: _json.Value) -> TuneResult:
        """A tune result as :meth:`to_json` writes it, checked against its schema: the
        document's error naming the file and the field that is wrong. Fields written
        only for people (``speedup``, a candidate's ``settings``) are not read."""
        doc.schema(SCHEMA)
        return cls(
            program=doc["program"].string(),
            target=doc["target"].string(),
            devices=doc["devices"].integer(1),
            devices_per_host=doc["devices_per_host"].integer(1),
            baseline=Configuration.from_json(doc["baseline"]),
            best=Configuration.from_json(doc["best"]),
            candidates=tuple(
                Configuration.from_json(c, candidate=True) for c in doc["candidates"].items()
            ),
            command=doc["command"].string(),
            hbm_bytes=_optional(doc, "hbm_bytes", _count, 0),
            headroom=_optional(doc, "headroom", _number, DEFAULT_HEADROOM),
            verdict=_optional(doc, "verdict", _json.Value.string, ""),
            reasons=_optional(doc, "reasons", _strings, ()),
            skipped=_optional(doc, "skipped", _strings, ()),
            notes=_optional(doc, "notes", _strings, ()),
            elapsed_s=_optional(doc, "elapsed_s", _number, 0.0),
            budget_s=_optional(doc, "budget_s", _number, DEFAULT_BUDGET_S),
            compiles=_optional(doc, "compiles", _count, 0),
            cache_hits=_optional(doc, "cache_hits", _count, 0),
            evaluated=_optional(doc, "evaluated", _count, 0),
            guarantee=_optional(doc, "guarantee", _json.Value.string, ""),
            topology=_optional(doc, "topology", _json.Value.string, ""),
            dropped=_optional(doc, "dropped", _dropped, ()),
            budget_compiles=_optional(doc, "budget_compiles", _count, DEFAULT_BUDGET_COMPILES),
            stopped_by=_optional(doc, "stopped_by", _stopped_by, ""),
            second_opinion=_optional(doc, "second_opinion", _json.Value.string, ""),
            decision=_optional(doc, "decision", _decision, ""),
            pick=_optional(doc, "pick", _configuration, None),
        )

    def json_text(self) -> str:
        """The tune file: :meth:`to_json` as text."""
        return json.dumps(self.to_json(), indent=1) + "\n"

    def table(self) -> str:
        """The ranked candidates and the recommendation, as text."""
        return format_result(self)


def command_line(
    xla_flags: Mapping[str, object], streams: int, policy: str, script: str = DEFAULT_SCRIPT
) -> str:
    """The shell line that runs ``script`` with these settings (the plugin reads the
    ``XLA_STREAMS_*`` variables; XLA reads ``XLA_FLAGS``)."""
    parts = []
    if xla_flags:
        parts.append("XLA_FLAGS=" + shlex.quote(" ".join(xo.as_xla_flags(dict(xla_flags)))))
    if streams > 1:
        parts.append(f"XLA_STREAMS_COLLECTIVE_STREAMS={streams}")
        if policy != DEFAULT_POLICY:
            parts.append(f"XLA_STREAMS_POLICY={policy}")
    parts.append(script)
    return " ".join(parts)


def xla_speedup(base: Configuration, c: Configuration) -> float | None:
    """XLA's own estimate of how much faster ``c`` is than ``base`` (None without one)."""
    if base.xla is None or c.xla is None or c.xla.priced_step_ms <= 0:
        return None
    return base.xla.priced_step_ms / c.xla.priced_step_ms


def _xla_speedup_words(base: Configuration, c: Configuration) -> str:
    found = xla_speedup(base, c)
    return "-" if found is None else f"{found:.3f}x"


def _same(c: Configuration, other: Configuration | None) -> bool:
    """Whether ``c`` is ``other``'s options and stream count."""
    return other is not None and (c.xla_flags, c.streams) == (other.xla_flags, other.streams)


def _range_words(c: Configuration) -> str:
    if c.step_low_ms is None or c.step_high_ms is None:
        return "-"
    return f"{c.step_low_ms:.3f}-{c.step_high_ms:.3f}"


def format_result(result: TuneResult) -> str:
    """The ranked table, the recommendation and the command."""
    base = result.baseline
    lines = [
        f"tune {result.program} on {result.target}: {result.devices} GPUs, "
        f"{result.devices_per_host} per host"
        + (f" (topology {result.topology})" if result.topology else "")
        + f"; {result.compiles} compiles"
        + (f", {result.cache_hits} from the cache" if result.cache_hits else "")
        + f" in {result.elapsed_s:.0f} s (budget {result.budget_compiles} compiles, "
        f"time limit {result.budget_s:.0f} s)",
    ]
    if result.hbm_bytes:
        lines.append(
            f"memory limit {format_bytes(result.memory_limit_bytes)} per GPU "
            f"({format_bytes(result.hbm_bytes)} HBM less {result.headroom:.0%} headroom)"
        )
    header = [
        "rank",
        "step ms",
        "range ms",
        "exposed ms",
        "memory",
        "speedup",
        "XLA ms",
        "XLA x",
        "K",
        "policy",
        "compile s",
        "settings",
    ]
    rows = [header]
    for i, c in enumerate(result.candidates, 1):
        mark = ""
        if c.xla_flags == base.xla_flags:
            mark = "  <- baseline" + (f" (K={c.streams})" if c.streams != 1 else "")
        if c.xla_flags == result.best.xla_flags and (
            c.streams == result.best.streams or result.best is result.baseline
        ):
            mark += "  <- recommended"
        elif result.decision == "no_reliable_gain" and _same(c, result.pick):
            mark += "  <- best found: no reliable gain"
        rows.append(
            [
                str(i),
                f"{c.predicted_step_ms:.3f}",
                _range_words(c),
                f"{c.exposed_communication_ms or 0.0:.3f}",
                format_bytes(c.peak_memory_bytes) + ("" if c.fits else " (no fit)"),
                f"{base.predicted_step_ms / c.predicted_step_ms:.3f}x"
                if c.predicted_step_ms
                else "-",
                f"{c.xla.priced_step_ms:.3f}" if c.xla is not None else "-",
                _xla_speedup_words(base, c),
                str(c.streams),
                c.policy,
                f"{c.compile_s or 0.0:.1f}",
                c.settings + mark,
            ]
        )
    for d in result.dropped:
        rows.append(["-", *("-" for _ in header[1:-1]), f"{d.settings}  <- dropped: {d.words}"])
    lines += aligned(rows, right={0, 1, 2, 3, 4, 5, 6, 7, 8, 10}, indent="  ")
    best = result.best
    delta = best.peak_memory_bytes - base.peak_memory_bytes
    kept = best.xla_flags == base.xla_flags and best.streams == base.streams
    if kept:
        why = (
            "no reliable gain: keep XLA's defaults"
            if result.decision == "no_reliable_gain"
            else "nothing beats them by the 1% margin"
        )
        lines.append(
            f"recommended: XLA's defaults, one stream ({base.predicted_step_ms:.3f} ms): {why}"
        )
        lines += [f"  why: {r}" for r in result.reasons]
    else:
        lines.append(
            f"recommended: {best.settings}, K={best.streams} {best.policy}: "
            f"{best.predicted_step_ms:.3f} ms predicted ({_range_words(best)}) against "
            f"{base.predicted_step_ms:.3f} ms ({_range_words(base)}), {result.speedup:.3f}x"
        )
        lines.append(
            f"memory: {format_bytes(best.peak_memory_bytes)} per GPU against the baseline's "
            f"{format_bytes(base.peak_memory_bytes)} ({'+' if delta >= 0 else '-'}"
            f"{format_bytes(abs(delta))}, {delta / base.peak_memory_bytes:+.1%})"
            if base.peak_memory_bytes
            else f"memory: {format_bytes(best.peak_memory_bytes)} per GPU"
        )
    pick = result.pick
    if pick is not None and kept:
        lines.append(
            f"best found: {pick.settings}, K={pick.streams} {pick.policy}: "
            f"{pick.predicted_step_ms:.3f} ms predicted ({_range_words(pick)}) against "
            f"{base.predicted_step_ms:.3f} ms ({_range_words(base)}), "
            f"{base.predicted_step_ms / pick.predicted_step_ms:.3f}x"
        )
    share = result.interference_share
    if pick is not None and share is not None:
        assert pick.step_without_interference_ms and base.step_without_interference_ms
        saved = base.predicted_step_ms - pick.predicted_step_ms
        quiet = base.step_without_interference_ms - pick.step_without_interference_ms
        lines.append(
            f"interference: takes back {share:.1%} of the pick's predicted gain ({saved:.3f} ms "
            f"a step saved as modelled, {quiet:.3f} ms if collectives in flight took nothing "
            "from compute)"
        )
    if result.second_opinion:
        lines.append(f"XLA's estimate: {result.second_opinion}")
    if result.guarantee:
        lines.append(f"search: {result.guarantee}")
    lines.append(f"command: {result.command}")
    lines.append(f"     or: XLA_STREAMS_CONFIG=<the --json file> {result.script}")
    if result.skipped:
        lines.append("levers skipped: " + "; ".join(result.skipped))
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(line for line in lines if line) + "\n"


# -- the tune file ------------------------------------------------------------------------


# A tune file holds a few dozen candidates: a few KB. Anything this big is not one.
MAX_TUNE_FILE_BYTES = 16 << 20


def load_tune_result(path: str | os.PathLike[str]) -> TuneResult:
    """A tune result written by ``xla-streams tune --json``, checked against its schema.

    Raises :class:`TuneError` naming the file and the field that is wrong; never
    anything else for what the file holds (its size is capped, deep nesting is
    refused).
    """
    doc = _json.load(path, TuneError, what="tune result", max_bytes=MAX_TUNE_FILE_BYTES)
    return TuneResult.from_json(doc)


def _optional[T](doc: _json.Value, key: str, read: Callable[[_json.Value], T], default: T) -> T:
    """The member ``key`` of ``doc`` as ``read`` reads it, ``default`` when it is absent."""
    value = doc.get(key)
    return default if value is None else read(value)


def _number(value: _json.Value) -> float:
    return value.number()


def _count(value: _json.Value) -> int:
    return value.integer(0)


def _strings(value: _json.Value) -> tuple[str, ...]:
    return tuple(item.string() for item in value.items())


def _step_by_streams(value: _json.Value) -> dict[int, float]:
    """``{"1": 9.0, "2": 8.0}``: the step in ms per stream count K."""
    out = {}
    for k, step in value.fields().items():
        try:
            streams = ascii_integer(k, signed=False)
        except ValueError:
            step.fail("expected a stream count as the key")
        out[streams] = step.number(0)
    return out


def _dropped(value: _json.Value) -> tuple[Dropped, ...]:
    return tuple(Dropped.from_json(item) for item in value.items())


def _stopped_by(value: _json.Value) -> str:
    return value.one_of(STOPPED_BY)


def _decision(value: _json.Value) -> str:
    return value.one_of(DECISIONS)


def _configuration(value: _json.Value) -> Configuration | None:
    return value.nullable(Configuration.from_json)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."
