"""Passes, the registry, pipeline specs and the pass manager.

A pass is a frozen dataclass: ``name`` says what it is called in a pipeline spec,
its fields are its options, ``requires``/``ensures`` are the facts it needs
before and guarantees after. The manager checks both around every pass and an
error names the pass that failed. Specs read like xdsl-opt's:
``find-async-pairs,assign-streams{streams=4,policy=interval},verify-streams``.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import time
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar, get_args, get_origin

from xla_streams.collectives import AsyncPair, StreamAssignment
from xla_streams.hlo import HloError, Module


class Fact(enum.StrEnum):
    """What a pass can rely on having been established before it."""

    ASYNC_PAIRS = "async-pairs"
    STREAMS_ASSIGNED = "streams-assigned"
    STREAMS_VERIFIED = "streams-verified"
    STREAMS_ANNOTATED = "streams-annotated"


@dataclass
class Compilation:
    """The module and what the passes have learned about it so far."""

    module: Module
    pairs: tuple[AsyncPair, ...] = ()
    assignment: StreamAssignment | None = None
    facts: set[Fact] = field(default_factory=set)


class PipelineError(Exception):
    """A pipeline that cannot be built or run as written (not bad HLO input)."""


class VerificationError(Exception):
    """An invariant of the stream assignment does not hold."""


@dataclass(frozen=True)
class ModulePass:
    """Base of all passes; subclasses are frozen dataclasses registered by ``@register``."""

    name: ClassVar[str]
    requires: ClassVar[frozenset[Fact]] = frozenset()
    ensures: ClassVar[frozenset[Fact]] = frozenset()

    def run(self, compilation: Compilation) -> None:
        raise NotImplementedError

    def spec(self) -> str:
        """This pass as it would be written in a pipeline spec."""
        options = ",".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))
        return f"{self.name}{{{options}}}" if options else self.name


PassT = TypeVar("PassT", bound=type[ModulePass])
_REGISTRY: dict[str, type[ModulePass]] = {}


def register(cls: PassT) -> PassT:
    if cls.name in _REGISTRY:
        raise PipelineError(f"two passes are named '{cls.name}'")
    _REGISTRY[cls.name] = cls
    return cls


def registered_passes() -> dict[str, type[ModulePass]]:
    import xla_streams.passes  # noqa: F401 - importing registers every pass

    return dict(_REGISTRY)


_SPEC_ITEM = re.compile(r"\s*([a-z][a-z0-9-]*)\s*(?:\{([^{}]*)\})?\s*(?:,|$)")


def parse_pipeline(spec: str) -> list[ModulePass]:
    """Build the passes of a spec such as ``a,b{opt=1,other=x},c`` (``""``: no passes)."""
    passes = registered_passes()
    result: list[ModulePass] = []
    pos = 0
    spec = spec.strip()
    while pos < len(spec):
        m = _SPEC_ITEM.match(spec, pos)
        if m is None or m.end() == pos:
            raise PipelineError(f"bad pipeline spec at column {pos + 1}: {spec!r}")
        name, options = m.group(1), m.group(2)
        if name not in passes:
            raise PipelineError(f"unknown pass '{name}'; known passes: {', '.join(sorted(passes))}")
        result.append(_build(passes[name], options or ""))
        pos = m.end()
    return result


def _build(cls: type[ModulePass], options: str) -> ModulePass:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for item in filter(None, re.split(r"[,\s]+", options.strip())):
        key, eq, raw = item.partition("=")
        if not eq or key not in fields:
            accepted = ", ".join(f"{k}=<{_type_name(hints[k])}>" for k in fields) or "none"
            raise PipelineError(f"pass '{cls.name}': bad option '{item}'; options: {accepted}")
        values[key] = _convert(cls.name, key, raw, hints[key])
    try:
        return cls(**values)
    except (ValueError, TypeError) as e:
        raise PipelineError(f"pass '{cls.name}': {e}") from None


def _convert(pass_name: str, key: str, raw: str, hint: Any) -> Any:
    if get_origin(hint) is Literal:
        if raw not in get_args(hint):
            allowed = ", ".join(get_args(hint))
            raise PipelineError(f"pass '{pass_name}': {key}={raw} is not one of {allowed}")
        return raw
    if hint is bool:
        if raw not in ("true", "false"):
            raise PipelineError(f"pass '{pass_name}': {key} must be true or false, not '{raw}'")
        return raw == "true"
    if hint is int:
        try:
            return int(raw)
        except ValueError:
            raise PipelineError(
                f"pass '{pass_name}': {key} must be an integer, not '{raw}'"
            ) from None
    return raw


def _type_name(hint: Any) -> str:
    if get_origin(hint) is Literal:
        return "|".join(get_args(hint))
    return getattr(hint, "__name__", str(hint))


@dataclass
class PassManager:
    """Runs passes in order, checking each one's requires/ensures; records timings."""

    passes: list[ModulePass]
    print_after_all: Callable[[ModulePass, Module], None] | None = None
    timings: list[tuple[str, float]] = field(default_factory=list)

    @classmethod
    def from_spec(cls, spec: str, **kwargs: Any) -> PassManager:
        return cls(parse_pipeline(spec), **kwargs)

    def __iter__(self) -> Iterator[ModulePass]:
        return iter(self.passes)

    def run(self, compilation: Compilation) -> Compilation:
        for p in self.passes:
            missing = p.requires - compilation.facts
            if missing:
                raise PipelineError(
                    f"pass '{p.name}' requires {', '.join(sorted(missing))}, which no earlier pass "
                    f"established; put {_providers(missing)} before it"
                )
            begin = time.perf_counter()
            try:
                p.run(compilation)
            except (HloError, VerificationError, PipelineError):
                raise
            except Exception as e:
                raise PipelineError(f"pass '{p.name}' failed: {type(e).__name__}: {e}") from e
            self.timings.append((p.name, time.perf_counter() - begin))
            compilation.facts |= p.ensures
            _check_ensured(p, compilation)
            if self.print_after_all is not None:
                self.print_after_all(p, compilation.module)
        return compilation


def _providers(facts: set[Fact] | frozenset[Fact]) -> str:
    names = [
        f"'{name}'" for name, cls in sorted(registered_passes().items()) if cls.ensures & facts
    ]
    return " or ".join(names) or "a pass that establishes it"


def _check_ensured(p: ModulePass, compilation: Compilation) -> None:
    """The facts a pass claims must be visible in the compilation afterwards."""
    assignment = compilation.assignment
    if Fact.STREAMS_ASSIGNED in p.ensures and (
        assignment is None or set(assignment.stream_of) != {q.start for q in compilation.pairs}
    ):
        raise PipelineError(
            f"pass '{p.name}' claims a stream assignment but did not assign every pair"
        )
