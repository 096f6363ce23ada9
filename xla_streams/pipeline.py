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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args, get_origin

from xla_streams.collectives import AsyncPair, Policy, StreamAssignment, StreamModel
from xla_streams.hlo import HloError, Instruction, Module
from xla_streams.hlo.attributes import decode, format_frontend_attributes, parse_frontend_attributes


class Fact(enum.StrEnum):
    """What a pass can rely on having been established before it."""

    ASYNC_PAIRS = "async-pairs"
    STREAMS_ASSIGNED = "streams-assigned"
    STREAMS_VERIFIED = "streams-verified"
    STREAMS_ANNOTATED = "streams-annotated"


@dataclass
class Compilation:
    """The module and what the passes have learned about it so far.

    How the module changed decides how it goes back to XLA: frontend attribute
    edits are written into XLA's own proto (nothing else of it is touched),
    a restructured module is printed and parsed back.
    """

    module: Module
    pairs: tuple[AsyncPair, ...] = ()
    assignment: StreamAssignment | None = None
    facts: set[Fact] = field(default_factory=set)
    # Instruction name -> the frontend attributes set on it (key -> value).
    frontend_attribute_edits: dict[str, dict[str, str]] = field(default_factory=dict)
    restructured: bool = False  # instructions were added, removed or reordered

    @property
    def changed(self) -> bool:
        return self.restructured or bool(self.frontend_attribute_edits)

    def set_frontend_attribute(self, inst: Instruction, key: str, value: str) -> None:
        """Set ``key="value"`` in the frontend attributes of ``inst`` (other keys stay)."""
        if set_frontend_attribute(inst, key, value):
            self.frontend_attribute_edits.setdefault(inst.name, {})[key] = value


def set_frontend_attribute(inst: Instruction, key: str, value: str) -> bool:
    """Set ``key="value"`` in the frontend attributes of ``inst``; False if already so."""
    attributes = decode(inst, "frontend_attributes", parse_frontend_attributes) or {}
    if attributes.get(key) == value:
        return False
    attributes[key] = value
    inst.set_attribute("frontend_attributes", format_frontend_attributes(attributes))
    return True


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
        options = ",".join(
            f"{f.name}={_spelled(getattr(self, f.name))}" for f in dataclasses.fields(self)
        )
        return f"{self.name}{{{options}}}" if options else self.name


_REGISTRY: dict[str, type[ModulePass]] = {}


def register[PassT: type[ModulePass]](cls: PassT) -> PassT:
    if cls.name in _REGISTRY:
        raise PipelineError(f"two passes are named '{cls.name}'")
    _REGISTRY[cls.name] = cls
    return cls


def registered_passes() -> dict[str, type[ModulePass]]:
    import xla_streams.passes  # noqa: F401 - importing registers every pass

    return dict(_REGISTRY)


_PASS_NAME = re.compile(r"[a-z][a-z0-9-]*")


@dataclass(frozen=True)
class SpecItem:
    """One pass as written in a spec: its name, its options as written, where it starts."""

    name: str
    options: dict[str, str]
    column: int  # 1-based


def spec_items(spec: str) -> list[SpecItem]:
    """The passes of a spec such as ``a,b{opt=1,other=x},c``, as written, unchecked
    against the registry; raises PipelineError pointing at the column that is wrong."""
    items: list[SpecItem] = []
    pos, end = 0, len(spec)

    def skip_space(i: int) -> int:
        while i < end and spec[i].isspace():
            i += 1
        return i

    pos = skip_space(pos)
    while pos < end:
        m = _PASS_NAME.match(spec, pos)
        if m is None:
            raise _spec_error(spec, pos, "expected a pass name (lowercase letters, digits, '-')")
        name, column = m.group(), pos + 1
        pos = skip_space(m.end())
        options: dict[str, str] = {}
        if pos < end and spec[pos] == "{":
            close = spec.find("}", pos)
            nested = spec.find("{", pos + 1)
            if close < 0 or 0 <= nested < close:
                raise _spec_error(spec, pos, f"'{{' opening the options of '{name}' is not closed")
            for option in re.finditer(r"[^,\s]+", spec[pos + 1 : close]):
                key, eq, value = option.group().partition("=")
                if not eq or not key:
                    at = pos + 1 + option.start()
                    raise _spec_error(
                        spec, at, f"expected 'option=value' in the options of '{name}'"
                    )
                options[key] = value
            pos = skip_space(close + 1)
        items.append(SpecItem(name, options, column))
        if pos < end:
            if spec[pos] != ",":
                raise _spec_error(spec, pos, "expected ',' between passes")
            pos = skip_space(pos + 1)
            if pos == end:
                raise _spec_error(spec, pos, "expected a pass name after ','")
    return items


def _spec_error(spec: str, offset: int, message: str) -> PipelineError:
    caret = " " * offset + "^"
    return PipelineError(
        f"bad pipeline spec at column {offset + 1}: {message}\n  {spec}\n  {caret}"
    )


def parse_pipeline(
    spec: str, defaults: Mapping[str, Mapping[str, Any]] | None = None
) -> list[ModulePass]:
    """Build the passes of a spec such as ``a,b{opt=1,other=x},c`` (``""``: no passes).

    An option the spec does not write takes its value from ``defaults[pass][option]``
    when given (the plugin's settings), else the pass's own default.
    """
    items = spec_items(spec)
    passes = registered_passes() if items else {}  # importing the passes takes time
    result: list[ModulePass] = []
    for item in items:
        if item.name not in passes:
            known = ", ".join(sorted(passes))
            raise PipelineError(f"unknown pass '{item.name}'; known passes: {known}")
        given = dict((defaults or {}).get(item.name, {}))
        result.append(_build(passes[item.name], item.options, given))
    return result


def _build(
    cls: type[ModulePass], written: Mapping[str, str], given: Mapping[str, Any]
) -> ModulePass:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {k: v for k, v in given.items() if k in fields}
    for key, raw in written.items():
        if key not in fields:
            accepted = ", ".join(f"{k}=<{_type_name(hints[k])}>" for k in fields) or "none"
            raise PipelineError(f"pass '{cls.name}': bad option '{key}={raw}'; options: {accepted}")
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


def _spelled(value: Any) -> str:
    """An option's value as a spec writes it."""
    return str(value).lower() if isinstance(value, bool) else str(value)


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


Runtime = Literal["xla", "host", "cuda"]


def default_pipeline(
    streams: int,
    policy: Policy = "interval",
    *,
    runtime: Runtime | None = "xla",
    model: StreamModel | None = None,
    devices: tuple[int, ...] = (),
) -> list[ModulePass]:
    """The passes that give ``streams`` collective streams to a module's collectives.

    ``runtime`` says who then runs them: ``xla`` (native mode: annotations XLA
    honours), ``host``/``cuda`` (ffi mode: our custom calls; XLA:CPU's synchronous
    collectives are split first, and the CUDA runtime needs the module's
    ``devices``), or None (assign and verify only, the module unchanged).
    """
    from xla_streams.passes.annotate_streams import AnnotateStreams
    from xla_streams.passes.assign_streams import AssignStreams
    from xla_streams.passes.asyncify import Asyncify
    from xla_streams.passes.find_async_pairs import FindAsyncPairs
    from xla_streams.passes.lower_to_ffi import LowerToFfi
    from xla_streams.passes.verify_streams import VerifyStreams

    model = model or StreamModel()
    if runtime in ("host", "cuda"):
        model = dataclasses.replace(model, ffi=True)
    passes: list[ModulePass] = [Asyncify()] if runtime == "host" else []
    passes += [FindAsyncPairs.of(model), AssignStreams(streams, policy), VerifyStreams()]
    if runtime == "xla":
        passes.append(AnnotateStreams())
    elif runtime is not None:
        passes.append(LowerToFfi(runtime, ":".join(map(str, devices))))
    return passes
