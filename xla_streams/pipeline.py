"""The pass registry, pipeline specs, the pass manager and the default pipeline.

Passes (``passes/``, the package ``xla_streams.passes``) are frozen dataclasses
whose fields are their options (``xla_streams.passes.base``). :data:`PASSES`
names each one and loads it on first use, as xDSL's registry does: the passes
import their base, never this module, so nothing loops. Specs read like
xdsl-opt's: ``find-async-pairs,assign-streams{streams=4,policy=interval},verify-streams``;
they are parsed once into a :class:`PipelineSpec` and built into passes with
typed options. The manager checks each pass's requires/ensures, and its errors
name the pass that failed or the pass that would provide a missing fact.
"""

from __future__ import annotations

import importlib
import re
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, NamedTuple

from xla_streams.collectives import DEFAULT_POLICY, Policy, StreamModel
from xla_streams.hlo import HloError, Module
from xla_streams.option import OptionError, options_of, suggestion
from xla_streams.passes.base import Compilation, Fact, ModulePass, PipelineError


def _lazy(module: str, cls: str) -> Callable[[], type[ModulePass]]:
    def load() -> type[ModulePass]:
        loaded: type[ModulePass] = getattr(
            importlib.import_module(f"xla_streams.passes.{module}"), cls
        )
        return loaded

    return load


# Every pass, by the name a spec gives it. Adding a pass: its file in passes/ and a line here.
PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "annotate-streams": _lazy("annotate_streams", "AnnotateStreams"),
    "assign-streams": _lazy("assign_streams", "AssignStreams"),
    "asyncify": _lazy("asyncify", "Asyncify"),
    "find-async-pairs": _lazy("find_async_pairs", "FindAsyncPairs"),
    "fit-on-gpu": _lazy("fit_on_gpu", "FitOnGpu"),
    "lower-to-ffi": _lazy("lower_to_ffi", "LowerToFfi"),
    "verify-streams": _lazy("verify_streams", "VerifyStreams"),
}


def register[PassT: type[ModulePass]](cls: PassT) -> PassT:
    """Add a pass defined outside ``passes/`` (a user's own, a test's) under its name."""
    params = getattr(cls, "__dataclass_params__", None)  # what @dataclass(...) was given
    if params is None or not params.frozen:
        raise PipelineError(
            f"pass '{cls.name}' is not a frozen dataclass: a pass's options "
            "are its fields, fixed once it is made (@dataclass(frozen=True))"
        )
    if cls.name in PASSES:
        raise PipelineError(f"two passes are named '{cls.name}'")
    PASSES[cls.name] = lambda: cls
    return cls


def pass_class(name: str) -> type[ModulePass]:
    """The pass a spec calls ``name``; PipelineError naming the known ones otherwise."""
    load = PASSES.get(name)
    if load is None:
        raise PipelineError(
            f"unknown pass '{name}'{suggestion(name, PASSES)}; known passes: "
            f"{', '.join(sorted(PASSES))}"
        )
    return load()


_PASS_NAME = re.compile(r"[a-z][a-z0-9-]*")


class SpecItem(NamedTuple):
    """One pass of a spec: its name and the options it writes (typed as the pass's
    fields are)."""

    name: str
    options: Mapping[str, Any]


class PipelineSpec(NamedTuple):
    """A pipeline spec, parsed and checked once against the passes and their options;
    :meth:`build` then gives its passes, with options it does not write taken from
    typed defaults (the plugin's settings)."""

    text: str
    items: tuple[SpecItem, ...]

    @classmethod
    def parse(cls, text: str) -> PipelineSpec:
        """Raises PipelineError: a syntax error points at its column; an unknown pass or
        option, or a value of the wrong type, names the pass."""
        items = []
        for name, written in _spec_syntax(text):
            pass_cls = pass_class(name)
            options = _typed_options(pass_cls, written)
            _construct(pass_cls, options)  # every value checked now, not at first use
            items.append(SpecItem(name, options))
        return cls(text.strip(), tuple(items))

    def build(self, defaults: Mapping[str, Mapping[str, Any]] | None = None) -> list[ModulePass]:
        """The passes, each with ``defaults[pass]`` under the options the spec writes."""
        passes = []
        for item in self.items:
            pass_cls = pass_class(item.name)
            declared = options_of(pass_cls)  # its fields, all options
            given = {k: v for k, v in (defaults or {}).get(item.name, {}).items() if k in declared}
            passes.append(_construct(pass_cls, {**given, **item.options}))
        return passes

    def written(self, pass_name: str, option: str) -> set[Any]:
        """The values the spec writes for ``option`` of every ``pass_name`` in it."""
        return {
            i.options[option] for i in self.items if i.name == pass_name and option in i.options
        }

    def has(self, pass_name: str) -> bool:
        return any(i.name == pass_name for i in self.items)


def parse_pipeline(spec: str) -> list[ModulePass]:
    """The passes of a spec such as ``a,b{opt=1,other=x},c`` (``""``: no passes)."""
    return PipelineSpec.parse(spec).build()


def _spec_syntax(spec: str) -> Iterator[tuple[str, dict[str, str]]]:
    """(name, options as written) for each pass of a spec; PipelineError pointing at
    the column that is wrong."""
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
        name = m.group()
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
        yield name, options
        if pos < end:
            if spec[pos] != ",":
                raise _spec_error(spec, pos, "expected ',' between passes")
            pos = skip_space(pos + 1)
            if pos == end:
                raise _spec_error(spec, pos, "expected a pass name after ','")


def _spec_error(spec: str, offset: int, message: str) -> PipelineError:
    caret = " " * offset + "^"
    return PipelineError(
        f"bad pipeline spec at column {offset + 1}: {message}\n  {spec}\n  {caret}"
    )


def _typed_options(cls: type[ModulePass], written: Mapping[str, str]) -> dict[str, Any]:
    """The options a spec writes for pass ``cls``, each read by its declaration."""
    declared = options_of(cls)
    options: dict[str, Any] = {}
    for key, raw in written.items():
        found = declared.get(key)
        if found is None:
            accepted = ", ".join(f"{k}=<{o.metavar}>" for k, o in declared.items()) or "none"
            raise PipelineError(
                f"pass '{cls.name}': bad option '{key}={raw}'{suggestion(key, declared)}; "
                f"options: {accepted}"
            )
        try:
            options[key] = found.read(raw, "spec")
        except OptionError as e:
            raise PipelineError(f"pass '{cls.name}': {e}") from None
    return options


def _construct(cls: type[ModulePass], options: Mapping[str, Any]) -> ModulePass:
    try:
        return cls(**options)
    except (ValueError, TypeError) as e:
        raise PipelineError(f"pass '{cls.name}': {e}") from None


class PassManager:
    """Runs passes in order, checking each one's requires/ensures; records timings."""

    def __init__(
        self,
        passes: list[ModulePass],
        print_after_all: Callable[[ModulePass, Module], None] | None = None,
    ) -> None:
        self.passes = passes
        self.print_after_all = print_after_all
        self.timings: list[tuple[str, float]] = []

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
            except (HloError, PipelineError):
                raise
            except Exception as e:
                # Imported here: only a pass that loaded the analyses can have raised it.
                from xla_streams.streams import VerificationError

                if isinstance(e, VerificationError):
                    raise
                raise PipelineError(f"pass '{p.name}' failed: {type(e).__name__}: {e}") from e
            self.timings.append((p.name, time.perf_counter() - begin))
            compilation.facts |= p.ensures
            _check_ensured(p, compilation)
            if self.print_after_all is not None:
                self.print_after_all(p, compilation.module)
        return compilation


def _providers(facts: set[Fact] | frozenset[Fact]) -> str:
    names = [f"'{name}'" for name in sorted(PASSES) if pass_class(name).ensures & facts]
    return " or ".join(names) or "a pass that establishes it"


def _check_ensured(p: ModulePass, compilation: Compilation) -> None:
    """The facts a pass claims must be visible in the compilation afterwards."""
    assignment = compilation.assignment
    if Fact.STREAMS_ASSIGNED in p.ensures and (
        assignment is None or set(assignment.stream_of) != {q.key for q in compilation.pairs}
    ):
        raise PipelineError(
            f"pass '{p.name}' claims a stream assignment but did not assign every pair"
        )


Runtime = Literal["xla", "host", "cuda"]


def build_pipeline(
    streams: int,
    policy: Policy = DEFAULT_POLICY,
    *,
    runtime: Runtime | None = "xla",
    model: StreamModel | None = None,
    devices: tuple[int, ...] = (),
    spec: PipelineSpec | None = None,
    gpu: str | None = None,
) -> list[ModulePass]:
    """The passes that give ``streams`` collective streams to a module's collectives: the
    one place where settings become passes.

    ``runtime`` says who then runs them: ``xla`` (native mode: annotations XLA
    honours), ``host``/``cuda`` (ffi mode: our custom calls; XLA:CPU's synchronous
    collectives are split first, and the CUDA runtime needs the module's
    ``devices``), or None (assign and verify only, the module unchanged). With ``gpu``
    (a target's name: the GPU the module runs on) K is lowered where the NCCL kernels
    would not fit on it at once (``fit-on-gpu``). A user's ``spec`` replaces the default
    passes; the options it does not write come from these same values.
    """
    model = model or StreamModel()
    ffi = runtime in ("host", "cuda")
    model = model._replace(ffi=ffi)
    options: dict[str, dict[str, Any]] = {
        "find-async-pairs": {
            "overlap_limit": model.overlap_limit,
            "sync_on_compute": model.sync_on_compute,
            "ffi": model.ffi,
        },
        "assign-streams": {"streams": streams, "policy": policy},
        "lower-to-ffi": {"backend": runtime, "devices": devices} if ffi else {},
        "fit-on-gpu": {"gpu": gpu} if gpu is not None else {},
    }
    if spec is not None:
        return spec.build(options)
    names = ["asyncify"] if runtime == "host" else []
    names += ["find-async-pairs", "assign-streams"]
    names += ["fit-on-gpu"] if gpu is not None else []
    names.append("verify-streams")
    if runtime == "xla":
        names.append("annotate-streams")
    elif ffi:
        names.append("lower-to-ffi")
    return [_construct(pass_class(name), options.get(name, {})) for name in names]
