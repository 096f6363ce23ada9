"""What every pass shares: the facts passes establish, the compilation they work on,
the base class, and the error of a pipeline that cannot run as written.

A pass is a frozen dataclass: ``name`` says what it is called in a pipeline spec,
its fields are its options (each declared with :func:`xla_streams.option.option`:
its default, reader and help; a spec writes it ``name=value``), ``requires``/
``ensures`` are the facts it needs before and guarantees after
(:mod:`xla_streams.pipeline` checks both around every pass and names the pass that
failed).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, ClassVar

from xla_streams.hlo import Module
from xla_streams.option import check_fields, options_of

if TYPE_CHECKING:  # `xla-streams opt` loads no analysis unless a pass does
    from xla_streams.streams import AsyncPair, StreamAssignment


class Fact(enum.StrEnum):
    """What a pass can rely on having been established before it."""

    ASYNC_PAIRS = "async-pairs"
    STREAMS_ASSIGNED = "streams-assigned"
    STREAMS_VERIFIED = "streams-verified"
    STREAMS_ANNOTATED = "streams-annotated"


class Compilation:
    """The module and what the passes have learned about it so far. What changed in
    the module, the module itself records (``Module.changed``)."""

    def __init__(self, module: Module) -> None:
        self.module = module
        self.pairs: tuple[AsyncPair, ...] = ()
        self.assignment: StreamAssignment | None = None
        self.facts: set[Fact] = set()


class PipelineError(Exception):
    """A pipeline that cannot be built or run as written (not bad HLO input)."""


class ModulePass:
    """Base of all passes; each is listed by name in ``xla_streams.pipeline.PASSES``.

    Each pass is a frozen dataclass; the base is a plain class, so that the command
    line loads ``dataclasses`` only when it loads a pass."""

    name: ClassVar[str]
    requires: ClassVar[frozenset[Fact]] = frozenset()
    ensures: ClassVar[frozenset[Fact]] = frozenset()

    def __post_init__(self) -> None:
        # Every option checked and kept in its one spelling, however the pass was made:
        # OptionError (a ValueError) naming the first one that is wrong.
        check_fields(self)

    def run(self, compilation: Compilation) -> None:
        raise NotImplementedError

    def spec(self) -> str:
        """This pass as it would be written in a pipeline spec."""
        options = ",".join(
            f"{name}={declared.reader.show(getattr(self, name))}"
            for name, declared in options_of(type(self)).items()
        )
        return f"{self.name}{{{options}}}" if options else self.name
