"""What ``xla-streams tune`` found, and its file: :class:`Configuration`, :class:`TuneResult`,
the schema ``xla_streams.tune.v1`` and its checker, the options and the command in words.

The plugin reads tune files (``XLA_STREAMS_CONFIG``) through :func:`load_tune_result`,
so this module stays light: it imports neither JAX nor the simulator, only the names
of XLA's options and of the stream policies.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from xla_streams import xla_options as xo
from xla_streams._text import aligned
from xla_streams.collectives import DEFAULT_POLICY, MAX_STREAMS, POLICIES, check_streams

SCHEMA = "xla_streams.tune.v1"
DEFAULT_BUDGET_S = 300.0
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
        if candidate:
            out["compile_s"] = round(self.compile_s or 0.0, 3)
            out["fits"] = self.fits
            out["settings"] = self.settings
            if self.by_streams:
                out["step_ms_by_streams"] = {
                    str(k): round(v, 6) for k, v in sorted(self.by_streams.items())
                }
        return out


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
    evaluated: int = 0  # option sets evaluated (compiled, cached or refused)
    guarantee: str = ""  # what the search proved of its result, in words
    topology: str = ""  # the compile-only topology, <partitions>x<hosts>x<devices>
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
            "elapsed_s": round(self.elapsed_s, 1),
            "budget_s": self.budget_s,
        }

    def json_text(self) -> str:
        return json.dumps(self.to_json(), indent=1) + "\n"

    def table(self) -> str:
        """The ranked candidates and the recommendation, as text."""
        return format_result(self)


# -- XLA options and the command in words ---------------------------------------------------

_LABELS: dict[str, str] = {
    xo.OVERLAP_LIMIT: "overlap-limit",
    **{name: f"pipeline-{kind}" for kind, name in xo.PIPELINE.items()},
    xo.WHILE_LOOP_DOUBLE_BUFFERING: "double-buffering",
    xo.START_AS_EARLY_AS_POSSIBLE: "start-early",
    xo.MULTI_STREAMING: "xla-multi-streaming",
    xo.SCALE_UP_OVERLAP_LIMIT: "scale-up-overlap-limit",
    xo.COLLECTIVE_DOMAIN_ASSIGNMENT: "collective-domain",
    xo.WINDOWED_EINSUM_THRESHOLD_MIB: "windowed-einsum-threshold-mib",
    xo.WINDOWED_EINSUM_MULTI_STREAMED: "windowed-einsum-multi-streamed",
    **{name: f"{kind}-combine-threshold" for kind, name in xo.COMBINE_THRESHOLD.items()},
}


def describe(options: Mapping[str, object]) -> str:
    """``overlap-limit=4, pipeline-all-gather=on``; ``XLA defaults`` for none."""
    if not options:
        return "XLA defaults"
    words = []
    for name in sorted(options, key=_option_order):
        value = options[name]
        if isinstance(value, bool):
            text = "on" if value else "off"
        elif isinstance(value, str) and value.startswith(xo.ENUM_PREFIXES):
            text = xo.as_xla_flags({name: value})[0].split("=", 1)[1].lower()
        elif name in xo.COMBINE_THRESHOLD.values() and isinstance(value, int):
            text = format_bytes(value)
        else:
            text = str(value)
        words.append(f"{_LABELS.get(name, name)}={text}")
    return ", ".join(words)


def _option_order(name: str) -> tuple[int, str]:
    order = list(_LABELS)
    return (order.index(name) if name in order else len(order), name)


def format_bytes(n: int) -> str:
    """``4 MiB``, ``4.5 MiB``, ``72.00 GiB``; below 1 MiB the exact count (``12 B``).

    Not :func:`xla_streams._text.human_bytes` (``4.0 MiB``, ``72.0 GiB``, KiB below
    1 MiB): these words are in tune results' tables, settings and progress lines."""
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    if n >= 2**20:
        return f"{n / 2**20:.0f} MiB" if n % 2**20 == 0 else f"{n / 2**20:.1f} MiB"
    return f"{n} B"


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
        + f" in {result.elapsed_s:.0f} s (budget {result.budget_s:.0f} s)",
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
                str(c.streams),
                c.policy,
                f"{c.compile_s or 0.0:.1f}",
                c.settings + mark,
            ]
        )
    lines += aligned(rows, right={0, 1, 2, 3, 4, 5, 6, 8}, indent="  ")
    best = result.best
    delta = best.peak_memory_bytes - base.peak_memory_bytes
    if result.best.xla_flags == base.xla_flags and best.streams == base.streams:
        lines.append(
            f"recommended: XLA's defaults, one stream ({base.predicted_step_ms:.3f} ms): "
            "nothing beats them by the 1% margin"
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
    where = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TUNE_FILE_BYTES + 1)
        if len(raw) > MAX_TUNE_FILE_BYTES:
            raise TuneError(f"{where}: larger than {MAX_TUNE_FILE_BYTES} bytes: not a tune result")
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise TuneError(f"{where}: cannot read the tune result: {reason}") from None
    return parse_tune_text(text, where)


def parse_tune_text(text: str, where: str = "tune result") -> TuneResult:
    """:func:`load_tune_result` for the file's text."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TuneError(f"{where}: not JSON: {e}") from None
    except RecursionError:
        raise TuneError(f"{where}: not a tune result: JSON nested too deeply") from None
    except ValueError as e:  # e.g. an integer with too many digits
        raise TuneError(f"{where}: not JSON: {str(e).splitlines()[0]}") from None
    return parse_tune_result(data, where)


def parse_tune_result(data: Any, where: str = "tune result") -> TuneResult:
    """:func:`load_tune_result` for data already parsed from JSON."""
    check = _Checker(where)
    top = check.object(data, "")
    schema = top.get("schema")
    if schema != SCHEMA:
        check.fail("schema", f"expected {SCHEMA!r}, got {schema!r}")
    candidates = check.field(top, "candidates", list)
    return TuneResult(
        program=check.field(top, "program", str),
        target=check.field(top, "target", str),
        devices=check.positive(top, "devices"),
        devices_per_host=check.positive(top, "devices_per_host"),
        baseline=check.configuration(top, "baseline"),
        best=check.configuration(top, "best"),
        candidates=tuple(
            check.configuration({"candidates": candidates}, f"candidates[{i}]", candidate=True)
            for i in range(len(candidates))
        ),
        command=check.field(top, "command", str),
        hbm_bytes=int(top.get("hbm_bytes", 0)) if isinstance(top.get("hbm_bytes"), int) else 0,
        headroom=float(top.get("headroom", DEFAULT_HEADROOM))
        if isinstance(top.get("headroom"), int | float)
        else DEFAULT_HEADROOM,
        verdict=str(top.get("verdict", "")),
        reasons=_strings(top.get("reasons")),
        skipped=_strings(top.get("skipped")),
        notes=_strings(top.get("notes")),
        compiles=_count(top.get("compiles")),
        cache_hits=_count(top.get("cache_hits")),
        evaluated=_count(top.get("evaluated")),
        guarantee=str(top.get("guarantee", "")),
        topology=str(top.get("topology", "")),
    )


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(r for r in value if isinstance(r, str)) if isinstance(value, list) else ()


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class _Checker:
    """The schema check: each method reads one field of the JSON or fails with a
    :class:`TuneError` naming the file and the field's path."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, path: str, message: str) -> None:
        at = f"{self.where}: {path}: " if path else f"{self.where}: "
        raise TuneError(at + message)

    def object(self, value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(path, f"expected a JSON object, got {_json_type(value)}")
        return value  # type: ignore[no-any-return]

    def field(self, obj: Mapping[str, Any], key: str, kind: type, path: str = "") -> Any:
        name = f"{path}.{key}" if path else key
        if key not in obj:
            self.fail(name, "missing")
        value = obj[key]
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok:
            self.fail(
                name, f"expected {_TYPE_NAMES.get(kind, kind.__name__)}, got {_json_type(value)}"
            )
        return value

    def positive(self, obj: Mapping[str, Any], key: str, path: str = "") -> int:
        value: int = self.field(obj, key, int, path)
        if value < 1:
            self.fail(f"{path}.{key}" if path else key, f"expected a positive integer, got {value}")
        return value

    def configuration(
        self, parent: Mapping[str, Any], key: str, *, candidate: bool = False
    ) -> Configuration:
        if candidate:
            index = int(key[key.index("[") + 1 : -1])
            obj = self.object(parent["candidates"][index], key)
        else:
            obj = self.object(self.field(parent, key, dict), key)
        flags = self.object(self.field(obj, "xla_flags", dict, key), f"{key}.xla_flags")
        for name, value in flags.items():
            # Only the options the tuner searches, each typed and ranged: a value can
            # never add a flag of its own to XLA_FLAGS, nor abort XLA's flag parser.
            if name not in xo.OPTIONS:
                self.fail(
                    f"{key}.xla_flags",
                    f"{_short(name)!r} is not an option xla-streams tune searches (those are "
                    f"the {len(xo.OPTIONS)} options of xla_streams/xla_options.py)",
                )
            try:
                xo.check_option(name, value)
            except ValueError as e:
                self.fail(f"{key}.xla_flags.{name}", str(e))
        streams: int = self.field(obj, "streams", int, key)
        try:
            check_streams(streams)
        except ValueError:
            self.fail(
                f"{key}.streams", f"expected an integer from 1 to {MAX_STREAMS}, got {streams}"
            )
        policy: str = self.field(obj, "policy", str, key)
        if policy not in POLICIES:
            self.fail(f"{key}.policy", f"expected one of {', '.join(POLICIES)}, got {policy!r}")
        step: float = self.field(obj, "predicted_step_ms", float, key)
        if not math.isfinite(step) or step < 0:
            self.fail(f"{key}.predicted_step_ms", f"expected a non-negative number, got {step}")
        memory: int = self.field(obj, "peak_memory_bytes", int, key)
        if memory < 0:
            self.fail(f"{key}.peak_memory_bytes", f"expected a non-negative integer, got {memory}")
        compile_s = None
        if candidate:
            compile_s = float(self.field(obj, "compile_s", float, key))
        exposed = obj.get("exposed_communication_ms")
        spread = obj.get("predicted_step_range_ms")
        low = high = None
        if spread is not None:
            spread = self.object(spread, f"{key}.predicted_step_range_ms")
            low = float(self.field(spread, "low", float, f"{key}.predicted_step_range_ms"))
            high = float(self.field(spread, "high", float, f"{key}.predicted_step_range_ms"))
        return Configuration(
            xla_flags=dict(flags),
            streams=streams,
            policy=policy,
            predicted_step_ms=float(step),
            peak_memory_bytes=memory,
            exposed_communication_ms=float(exposed)
            if isinstance(exposed, int | float) and not isinstance(exposed, bool)
            else None,
            compile_s=compile_s,
            fits=bool(obj.get("fits", True)),
            step_low_ms=low,
            step_high_ms=high,
        )


_TYPE_NAMES: dict[type, str] = {
    str: "a string",
    int: "an integer",
    float: "a number",
    list: "a JSON array",
    dict: "a JSON object",
}


def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})" if len(value) < 40 else "a string"
    if isinstance(value, list):
        return "a JSON array"
    if isinstance(value, dict):
        return "a JSON object"
    return type(value).__name__
