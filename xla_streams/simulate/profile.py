"""Measured costs of the user's own program: XLA's PGLE profile.

A ``ProfiledInstructionsProto`` (package ``tensorflow.profiler``, from
``tsl/profiler/protobuf/profiled_instructions.proto``) holds what a program's
instructions took on a real GPU::

    costs { name: "gemm_fusion_dot.12" cost_us: 210.5 }
    costs { name: "all-gather-start.2" cost_us: 65.056 }

``costs`` (field 1: ``name`` 1, ``cost_us`` 2, a double) are what the simulator
uses; ``latencies`` (field 2: ``source`` 1, ``target`` 2, ``latency_us`` 3) are read
and, as XLA:GPU does, ignored (its ``FilterWithFingerprint`` keeps only costs).
An async collective's measured start-to-done time is its start's ``cost_us``.

It comes as text or binary, the two ways XLA reads it
(``--xla_gpu_pgle_profile_file_or_directory_path``, or ``fdo_profile``). From
JAX: ``jax.experimental.profiler.get_profiled_instructions_proto(DIR)`` on a
profile of a few steps, or ``JAX_ENABLE_PGLE=true``.

Names are matched as XLA's PGLE does (``gpu_hlo_schedule.cc``
``FilterWithFingerprint``): a name written ``"<fingerprint>::<name>"`` counts only
for the module whose fingerprint it is (its header's
``frontend_attributes={fingerprint_before_lhs="..."}``), the prefix then dropped;
plain names always count; the ``.rematN`` clones of one instruction are averaged
into its name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from xla_streams.hlo import Module
from xla_streams.hlo.attributes import parse_frontend_attributes
from xla_streams.hlo.text import ScanError
from xla_streams.simulate.textproto import Message, ProtoError, decode_wire, parse_text

PROFILE_SCHEMA = {
    "ProfiledInstructionsProto": {
        1: ("costs", "message:InstructionCost"),
        2: ("latencies", "message:Latency"),
    },
    "InstructionCost": {1: ("name", "string"), 2: ("cost_us", "double")},
    "Latency": {1: ("source", "string"), 2: ("target", "string"), 3: ("latency_us", "double")},
}
FINGERPRINT_ATTRIBUTE = "fingerprint_before_lhs"
_REMAT = re.compile(r"\.remat\d*$")


class ProfileError(ProtoError):
    """A profile that cannot be read; says ``path:line: what``."""


@dataclass(frozen=True)
class Profile:
    """Measured costs as read: (name as written, microseconds), in file order."""

    path: str
    costs: tuple[tuple[str, float], ...]
    latencies: int = 0  # how many latency entries were read (and ignored)

    def for_module(self, module: Module) -> MeasuredCosts:
        """The costs that apply to ``module``, by instruction name, in seconds. A
        ``fingerprint::name`` entry counts when the fingerprint is the module's (or the
        module records none: then every prefixed entry counts, prefix dropped)."""
        fingerprint = module_fingerprint(module)
        kept: dict[str, list[float]] = {}
        other_modules = 0
        for name, cost_us in self.costs:
            if "::" in name:
                prefix, _, rest = name.partition("::")
                if "::" in rest or (fingerprint is not None and prefix != fingerprint):
                    other_modules += 1
                    continue
                name = rest
            kept.setdefault(_REMAT.sub("", name), []).append(cost_us)
        seconds = {name: sum(v) / len(v) * 1e-6 for name, v in kept.items()}
        return MeasuredCosts(self.path, seconds, other_modules)


@dataclass(frozen=True)
class MeasuredCosts:
    """Seconds per instruction name, ready for the simulator
    (``Simulator(..., measured=...)``); ``skipped``: entries of other modules."""

    path: str
    seconds: Mapping[str, float]
    skipped: int = 0
    used: set[str] = field(default_factory=set, compare=False)

    def get(self, name: str) -> float | None:
        value = self.seconds.get(name)
        if value is not None:
            self.used.add(name)
        return value

    def unused(self) -> list[str]:
        """Names the profile has that the simulator never looked up (not in the module)."""
        return sorted(set(self.seconds) - self.used)


def module_fingerprint(module: Module) -> str | None:
    """The fingerprint XLA recorded in the module header, if any."""
    raw = module.header_attributes.get("frontend_attributes")
    if raw is None:
        return None
    try:
        attributes = parse_frontend_attributes(raw)
    except ScanError:  # a malformed header attribute: no fingerprint to match
        return None
    return attributes.get(FINGERPRINT_ATTRIBUTE) if attributes else None


def parse_profile(text: str, path: str = "<string>") -> Profile:
    try:
        return _profile(parse_text(text, path), path)
    except ProfileError:
        raise
    except ProtoError as e:  # not a text proto, or a field of the wrong kind or given twice
        raise ProfileError(e.message, path=e.path, line=e.line) from None


def decode_profile(data: bytes, path: str = "<bytes>") -> Profile:
    try:
        root = decode_wire(data, PROFILE_SCHEMA, "ProfiledInstructionsProto", path=path)
        return _profile(root, path)
    except ProfileError:
        raise
    except ProtoError as e:
        raise ProfileError(e.message, path=e.path, line=e.line) from None


def load_profile(path: str | Path) -> Profile:
    """A ``ProfiledInstructionsProto`` file: binary (``.pb``, or anything that is not
    text), else text (``.pbtxt``), as XLA tries them. Errors say ``file:line``."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ProfileError(f"cannot read the profile: {e.strerror}", path=str(p)) from None
    text: str | None = None
    if p.suffix != ".pb":
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
    if text is not None and (p.suffix in (".pbtxt", ".txt", ".textproto") or _texty(text)):
        return parse_profile(text, str(p))
    return decode_profile(data, str(p))


def _texty(text: str) -> bool:
    head = text[:4096]
    return all(c.isprintable() or c in "\n\r\t" for c in head)


def _profile(root: Message, path: str) -> Profile:
    unknown = sorted({n for n, _, _ in root.fields} - {"costs", "latencies"})
    if unknown:
        raise ProfileError(
            f"unknown field '{unknown[0]}': a ProfiledInstructionsProto has costs and latencies",
            path=path,
            line=root.line_of(unknown[0]),
        )
    costs = []
    for entry in root.messages("costs"):
        name = entry.string("name")
        if not name:
            raise ProfileError("a cost without a name", path=path, line=entry.line)
        cost_us = entry.number("cost_us")
        if not cost_us >= 0 or cost_us == float("inf"):
            raise ProfileError(
                f"cost_us of '{name}' must be a non-negative number, not {cost_us}",
                path=path,
                line=entry.line_of("cost_us"),
            )
        costs.append((name, cost_us))
    return Profile(path, tuple(costs), len(root.messages("latencies")))
