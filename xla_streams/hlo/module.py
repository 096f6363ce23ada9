"""The IR: a module of computations of instructions, printed back to HLO text.

A module is made by the reader (``reader.parse_module``) through ``ModuleBuilder``, and
changed by passes through the edit methods of its computations and instructions. An
instruction decodes its operands and attributes only when asked. What is untouched prints
back byte for byte (CRLF line ends, tabs, comment and blank lines included); an edited
instruction prints in XLA's canonical form (and an edited module that had instructions or
computations written inside others, all in XLA's layout).
"""

from __future__ import annotations

import re

from xla_streams.hlo.attributes import (
    decode,
    format_frontend_attributes,
    parse_frontend_attributes,
)
from xla_streams.hlo.errors import HloError
from xla_streams.hlo.shape import Shape, parse_shape
from xla_streams.hlo.text import (
    NAME,
    WHITESPACE,
    ScanError,
    blank_comments,
    code_end,
    excerpt,
    find_closing,
    operand_name,
    parse_int,
    split_top_level,
)

TYPE_CHECKING = False  # not typing's: the front end imports nothing it need not
if TYPE_CHECKING:
    from collections.abc import Iterator

    from xla_streams.hlo.layout import Anchors

# XLA's opcodes as its text spells them (jaxlib 0.12's HloOpcode, checked by a test), and
# any of them as `op-start`, `op-update`, `op-done`: an async op wrapping it.
OPCODES = frozenset((
    "abs", "acos", "acosh", "add", "add-dependency", "after-all", "all-gather",
    "all-gather-done", "all-gather-start", "all-reduce", "all-reduce-done", "all-reduce-start",
    "all-to-all", "and", "asin", "asinh", "async-done", "async-start", "async-update", "atan2",
    "atanh", "batch-norm-grad", "batch-norm-inference", "batch-norm-training", "bitcast",
    "bitcast-convert", "broadcast", "call", "cbrt", "ceil", "cholesky", "clamp",
    "collective-broadcast", "collective-permute", "collective-permute-done",
    "collective-permute-start", "collective-reduce", "compare", "complex", "concatenate",
    "conditional", "constant", "convert", "convolution", "copy", "copy-done", "copy-start",
    "cosine", "cosh", "count-leading-zeros", "custom-call", "divide", "domain", "dot",
    "dynamic-reshape", "dynamic-slice", "dynamic-update-slice", "erf", "exp2", "exponential",
    "exponential-minus-one", "fft", "floor", "fusion", "gather", "get-dimension-size",
    "get-tuple-element", "imag", "infeed", "iota", "is-finite", "log", "log-plus-one", "log2",
    "logistic", "map", "maximum", "minimum", "mulhi", "multiply", "negate", "not", "opt-barrier",
    "or", "outfeed", "pad", "parameter", "partition-id", "popcnt", "power", "ragged-all-to-all",
    "ragged-dot", "real", "recv", "recv-done", "reduce", "reduce-precision", "reduce-scatter",
    "reduce-window", "remainder", "replica-id", "reshape", "reverse", "rng", "rng-bit-generator",
    "rng-get-and-update-state", "round-nearest-afz", "round-nearest-even", "rsqrt", "scaled-dot",
    "scan", "scatter", "select", "select-and-scatter", "send", "send-done", "set-dimension-size",
    "shift-left", "shift-right-arithmetic", "shift-right-logical", "shuffle", "sign", "sine",
    "sinh", "slice", "sort", "sqrt", "stochastic-convert", "subtract", "tan", "tanh", "topk",
    "transpose", "triangular-solve", "tuple", "while", "xor",
))  # fmt: skip
_ASYNC_WRAPPED = re.compile(r"(.+)-(?:start|update|done)")
# Opcodes whose parentheses hold no operands (a parameter number, a literal).
NO_OPERANDS = frozenset({"parameter", "constant", "iota", "rng-bit-generator-state"})
# An instruction, where only attributes may follow on a line of XLA's layout.
_SECOND_STATEMENT = re.compile(
    rf"(?:ROOT[ \t]+)?%?{NAME}[ \t]*=[ \t]*(?:\(|[a-z][a-z0-9]*\[|[a-z][a-z0-9\-]*\()"
)
# Attributes XLA prints after `frontend_attributes` (jaxlib 0.10.2's canonical order).
_AFTER_FRONTEND_ATTRIBUTES = (
    "control-predecessors", "statistics", "result_accuracy", "origin", "metadata", "backend_config",
)  # fmt: skip
_PLAIN_OPERAND = re.compile(rf"%({NAME})")
_PLAIN_OPERANDS = re.compile(rf"%{NAME}(?:, %{NAME})*")  # as XLA prints most lists

# One operand: (instruction name, tuple index path, offset of the name in the line).
_OperandRef = tuple[str, tuple[int, ...], int]


def async_wrapped(opcode: str) -> tuple[str, str] | None:
    """``(step, wrapped opcode)`` of an async op (XLA's kAsyncStart/Update/Done):
    ``async-start``, or a sugared ``<op>-start`` of an op that is not async by itself
    (``fusion-start``, ``custom-call-done``; ``all-reduce-start`` is an opcode of its
    own); the wrapped opcode is "" where ``calls=`` names it. None for any other."""
    if opcode in ("async-start", "async-update", "async-done"):
        return opcode[len("async-") :], ""
    if opcode in OPCODES:
        return None
    wrapped = _ASYNC_WRAPPED.fullmatch(opcode)
    if wrapped is None or wrapped.group(1) not in OPCODES:
        return None
    return opcode[len(wrapped.group(1)) + 1 :], wrapped.group(1)


class Instruction:
    """One HLO instruction. Fields are read from its source line on first use."""

    __slots__ = (
        "_attributes",
        "_edited",
        "_operands_end",
        "_operands_start",
        "computation",
        "is_root",
        "line",
        "name",
        "opcode",
        "shape_text",
        "source",
    )

    def __init__(
        self,
        computation: Computation,
        line: int,
        source: str,
        name: str,
        shape_text: str,
        opcode: str,
        operands_start: int,
        operands_end: int,
        is_root: bool,
    ) -> None:
        self.computation = computation
        self.line = line  # 1-based; 0 for instructions a pass created
        # The source line (or, for a created instruction, its head) with the
        # operand list at fixed offsets; stale past the operands once edited.
        self.source = source
        self._edited = False
        self.name = name
        self.shape_text = shape_text
        self.opcode = opcode
        self._operands_start = operands_start
        self._operands_end = operands_end  # its ")"; -1: found on first use
        self.is_root = is_root
        self._attributes: dict[str, str] | None = None

    @classmethod
    def create(
        cls,
        computation: Computation,
        name: str,
        shape_text: str,
        opcode: str,
        operands: str,
        attributes: dict[str, str],
        *,
        is_root: bool = False,
    ) -> Instruction:
        """A new instruction, printed in canonical form; ``operands`` is the raw list text."""
        head = f"  {'ROOT ' if is_root else ''}%{name} = {shape_text} {opcode}("
        inst = cls(
            computation, 0, head + operands + ")", name, shape_text, opcode, len(head),
            len(head) + len(operands), is_root,
        )  # fmt: skip
        inst._attributes = dict(attributes)
        inst._edited = True
        return inst

    def __repr__(self) -> str:
        return f"<Instruction %{self.name} = {self.opcode} at line {self.line}>"

    # -- reading -----------------------------------------------------------------

    @property
    def shape(self) -> Shape:
        try:
            return parse_shape(self.shape_text)
        except ScanError as e:  # pragma: no cover - shapes are checked when parsed
            raise self.error_at(self.source.find(self.shape_text) + e.offset, e.message) from None

    @property
    def operands_text(self) -> str:
        """The raw text between the opcode's parentheses."""
        return self.source[self._operands_start : self._operands_span_end()]

    @property
    def operands_span(self) -> tuple[int, int]:
        """Where the operand list is written in ``source``: after its "(", at its ")"."""
        return self._operands_start, self._operands_span_end()

    @property
    def operand_refs(self) -> list[tuple[str, tuple[int, ...]]]:
        """Each operand as (instruction name, tuple index path).

        jax >= 0.11 dumps leave out get-tuple-element instructions and write the
        element in the operand: ``%t#1`` is element 1 of ``%t`` (path ``(1,)``),
        ``%t#1#0`` element 0 of that (``(1, 0)``). A plain ``%t`` has path ``()``.
        """
        return [(name, path) for name, path, _ in self._operand_refs()]

    @property
    def operand_names(self) -> list[str]:
        """Names of the operand instructions (for `parameter`/`constant`: none).

        ``%t#1`` names ``t``: the instruction whose result holds the operand.
        """
        if self.opcode not in NO_OPERANDS:
            # The plain list of _operand_refs, without its offsets: the cost model asks
            # this of every instruction of every fused computation.
            source, start, end = self.source, self._operands_start, self._operands_span_end()
            if _PLAIN_OPERANDS.fullmatch(source, start, end) is not None:
                return source[start + 1 : end].split(", %")
        return [name for name, _, _ in self._operand_refs()]

    @property
    def operands(self) -> list[Instruction]:
        """The operand instructions, looked up in this instruction's computation.

        For ``%t#1`` that is ``%t`` itself (see ``operand_refs``/``operand_shapes``).
        """
        return [self._operand(name, at) for name, _, at in self._operand_refs()]

    @property
    def operand_shape_texts(self) -> list[str]:
        """Each operand's shape as printed, tuple indices applied (``%t#1``: element 1 of
        ``%t``'s tuple shape, without its ``/*index=N*/`` comment)."""
        texts = []
        for name, path, at in self._operand_refs():
            operand = self._operand(name, at)
            text = operand.shape_text
            for index in path:
                elements = []
                if text.startswith("("):
                    elements = split_top_level(text, 1, len(text) - 1)  # checked when parsed
                if index >= len(elements):
                    raise self.error_at(
                        at,
                        f"operand '%{name}': no tuple element {index} in shape "
                        f"'{excerpt(operand.shape_text)}'",
                    )
                a, b = elements[index]
                text = blank_comments(text[a:b]).strip(WHITESPACE)
            texts.append(text)
        return texts

    @property
    def operand_shapes(self) -> list[Shape]:
        """The shape of each operand, tuple indices applied (see ``operand_shape_texts``)."""
        return [parse_shape(text) for text in self.operand_shape_texts]

    @property
    def attributes(self) -> dict[str, str]:
        """Raw attribute values by name, in printed order (decode with `attributes.py`)."""
        if self._attributes is None:
            self._attributes = self._parse_attributes()
        return self._attributes

    def attribute(self, key: str) -> str | None:
        return self.attributes.get(key)

    def error_at_attribute(self, key: str, offset: int, message: str) -> HloError:
        """An HloError pointing ``offset`` characters into attribute ``key``'s value."""
        at = self.source.find(f"{key}=", self._operands_span_end())
        column = at + len(key) + 1 + offset if at >= 0 else 0
        return self.error_at(column, message)

    def error(self, message: str) -> HloError:
        """An HloError pointing at this instruction's name."""
        return self.error_at(self._name_offset(), message)

    def error_at(self, offset: int, message: str) -> HloError:
        """An HloError pointing ``offset`` characters into ``source``."""
        return self.computation.module.error_at(self.line, self.source, offset, message)

    # -- editing -----------------------------------------------------------------

    def set_frontend_attribute(self, key: str, value: str) -> None:
        """Set ``key="value"`` among the frontend attributes (other keys stay). The module
        records the edit (``Module.frontend_attribute_edits``): all XLA needs to take it."""
        attributes = decode(self, "frontend_attributes", parse_frontend_attributes) or {}
        if attributes.get(key) == value:
            return
        attributes[key] = value
        self._set(key="frontend_attributes", value=format_frontend_attributes(attributes))
        edits = self.computation.module.frontend_attribute_edits
        edits.setdefault(self.name, {})[key] = value

    def set_attribute(self, key: str, value: str) -> None:
        """Set an attribute's raw value; a new key goes where XLA prints it. The module is
        then restructured: only a printed module can carry such an edit back to XLA."""
        self._set(key, value)
        self.computation.module.restructured = True

    def _set(self, key: str, value: str) -> None:
        attributes = self.attributes
        if key not in attributes and key == "frontend_attributes":
            later = [k for k in attributes if k in _AFTER_FRONTEND_ATTRIBUTES]
            if later:
                position = list(attributes).index(later[0])
                items = list(attributes.items())
                items.insert(position, (key, value))
                self._attributes = dict(items)
                self._edited = True
                return
        attributes[key] = value
        self._edited = True

    @property
    def text(self) -> str:
        """The instruction as printed: its source line if untouched, else canonical."""
        if not self._edited:
            return self.source
        head = self.source[: self._operands_span_end() + 1]
        # A line of a CRLF file keeps its "\r" so the output keeps one line-end style.
        tail = "\r" if self.source.endswith("\r") else ""
        return head + "".join(f", {k}={v}" for k, v in self.attributes.items()) + tail

    # -- internals ---------------------------------------------------------------

    def _operands_span_end(self) -> int:
        if self._operands_end < 0:
            try:
                self._operands_end = find_closing(self.source, self._operands_start - 1)
            except ScanError as e:
                raise self.error_at(e.offset, e.message) from None
        return self._operands_end

    def _operand(self, name: str, at: int) -> Instruction:
        operand = self.computation.get(name)
        if operand is None:
            raise self.error_at(
                at, f"operand '%{name}' is not defined in computation '{self.computation.name}'"
            )
        return operand

    def _operand_refs(self) -> list[_OperandRef]:
        if self.opcode in NO_OPERANDS:
            return []
        source = self.source
        start, end = self._operands_start, self._operands_span_end()
        # `%a, %b, ...` as XLA prints most lists, read as the loop's general case would
        # read it (a name holds no ",", " " or "%").
        if _PLAIN_OPERANDS.fullmatch(source, start, end) is not None:
            refs: list[_OperandRef] = []
            at = start + 1
            for name in source[at:end].split(", %"):
                refs.append((name, (), at))
                at += len(name) + len(", %")
            return refs
        try:
            spans = split_top_level(source, start, end)
        except ScanError as e:
            raise self.error_at(e.offset, e.message) from None
        refs = []
        for a, b in spans:
            plain = _PLAIN_OPERAND.fullmatch(source, a, b)
            if plain is not None:
                refs.append((plain.group(1), (), a + 1))
                continue
            # `[shape] %name[#index...]`, with /*index=N*/ comments anywhere.
            item = blank_comments(source[a:b])
            head, *indices = item.split("#")
            start, end = operand_name(head)
            name, at = head[start:end], a + start
            if not name:
                if head.rstrip(WHITESPACE).endswith(")"):
                    raise self.error_at(
                        a, f"an instruction nested in operands more deeply than this front end "
                        f"reads ('{excerpt(item.strip())}')",
                    )  # fmt: skip
                raise self.error_at(a, f"expected an operand '%name', found '{excerpt(item)}'")
            path: list[int] = []
            offset = a + len(head) + 1
            for index in indices:
                try:
                    path.append(parse_int(index, offset))
                except ScanError as e:
                    raise self.error_at(
                        e.offset, f"bad tuple index of '%{name}': {e.message}"
                    ) from None
                if path[-1] < 0:
                    raise self.error_at(offset, f"tuple index of '%{name}' is negative")
                offset += len(index) + 1
            refs.append((name, tuple(path), at))
        return refs

    def _parse_attributes(self) -> dict[str, str]:
        text = self.source
        start = self._operands_span_end() + 1
        end = code_end(text, start) if "//" in text else len(text)
        while end > start and text[end - 1] in WHITESPACE:  # "\r" of a CRLF line
            end -= 1
        if start >= end:
            return {}
        comma = start
        while text[comma] in WHITESPACE:  # XLA prints ", "; its lexer skips any spacing
            comma += 1
        if text[comma] != ",":
            if _SECOND_STATEMENT.match(text, comma):
                raise self.error_at(
                    comma, "a second instruction on the line of another: this front end reads "
                    "one instruction a line (after the operands, expected ', attribute=value')",
                )  # fmt: skip
            raise self.error_at(start, "expected ', attribute=value' or end of line after operands")
        try:
            spans = split_top_level(text, comma + 1, end)
        except ScanError as e:
            raise self.error_at(e.offset, e.message) from None
        attributes: dict[str, str] = {}
        previous = 0  # where the previous attribute starts
        for a, b in spans:
            eq = text.find("=", a, b)
            if eq < 0:
                raise self.error_at(a, f"expected 'attribute=value', found '{excerpt(text[a:b])}'")
            key = text[a:eq]
            if key == "device_ids" and text.startswith("replica_groups=mesh[", previous):
                # `replica_groups=mesh[...], device_ids=(...) {axes}` is one value.
                attributes["replica_groups"] = text[previous + len("replica_groups=") : b]
                continue
            if key in attributes:
                raise self.error_at(a, f"duplicate attribute '{excerpt(key)}'")
            attributes[key] = text[eq + 1 : b]
            previous = a
        return attributes

    def _name_offset(self) -> int:
        """Where the name starts: after the indentation, `ROOT ` and `%`."""
        source = self.source
        i = 0
        while i < len(source) and source[i] in " \t":
            i += 1
        if self.is_root:
            i += len("ROOT")
            while i < len(source) and source[i] in " \t":
                i += 1
        return i + 1 if source.startswith("%", i) else i


class Computation:
    """A computation: its instructions in schedule order (the printed order)."""

    __slots__ = (
        "_by_name",
        "_trivia",
        "execution_thread",
        "footer",
        "header",
        "instructions",
        "is_entry",
        "line",
        "module",
        "name",
    )

    def __init__(self, module: Module, name: str, header: str, line: int, is_entry: bool) -> None:
        self.module = module
        self.name = name
        self.header = header
        self.line = line
        self.is_entry = is_entry
        # The thread XLA runs it on: `}, execution_thread="..."` (windowed einsum's
        # parallel GEMMs, host offloading); XLA's main thread when the text names none.
        self.execution_thread = "main"
        self.instructions: list[Instruction] = []
        self._by_name: dict[str, Instruction] = {}
        # The source text that closes the computation: its `}` line, after any
        # comment or blank lines that follow the last instruction.
        self.footer = "}"
        # Comment and blank lines inside the computation, by the name of the
        # instruction they precede (printed back in place; none in XLA's output).
        self._trivia: dict[str, list[str]] = {}

    def __repr__(self) -> str:
        return f"<Computation %{self.name}: {len(self.instructions)} instructions>"

    def __iter__(self) -> Iterator[Instruction]:
        return iter(self.instructions)

    def get(self, name: str) -> Instruction | None:
        return self._by_name.get(name)

    @property
    def root(self) -> Instruction:
        for inst in self.instructions:
            if inst.is_root:
                return inst
        return self.instructions[-1]

    # -- editing (the only way passes change a computation; each records it) ---------

    def insert(self, index: int, inst: Instruction) -> None:
        """Schedule ``inst`` (made by ``Instruction.create``) at position ``index``."""
        self.module.restructured = True
        self.instructions.insert(index, inst)
        self._by_name[inst.name] = inst

    def replace(self, old: Instruction, new: Instruction) -> None:
        """Put ``new`` where ``old`` is scheduled; ``old`` goes."""
        self.module.restructured = True
        self.instructions[self.instructions.index(old)] = new
        if old.name != new.name:
            self._by_name.pop(old.name, None)
        self._by_name[new.name] = new

    def remove(self, inst: Instruction) -> None:
        self.module.restructured = True
        self.instructions.remove(inst)
        self._by_name.pop(inst.name, None)

    def reschedule(self, instructions: list[Instruction]) -> None:
        """Make ``instructions`` the computation's schedule: its own, reordered, with
        new ones (``Instruction.create``) among them."""
        self.module.restructured = True
        self.instructions[:] = instructions
        self._by_name = {inst.name: inst for inst in instructions}

    def users(self) -> dict[str, list[str]]:
        """Names of the instructions that take each instruction as an operand."""
        found: dict[str, list[str]] = {}
        for inst in self.instructions:
            for name in inst.operand_names:
                found.setdefault(name, []).append(inst.name)
        return found

    def _print(self, out: list[str]) -> None:
        out.append(self.header)
        written = self.module._written
        if not self._trivia and not written:
            out.extend(inst.text for inst in self.instructions)
        else:
            for inst in self.instructions:
                out.extend(self._trivia.get(inst.name, ()))
                out.append(inst.text if inst._edited else written.get(inst, inst.text))
        out.append(self.footer)


class Module:
    """A parsed HLO module. ``print()`` gives the text back."""

    def __init__(
        self,
        path: str,
        text: str,
        lines: list[str],
        anchors: dict[tuple[int, str], Anchors] | None = None,
    ) -> None:
        self.path = path
        self._text = text
        self._lines = lines
        # Where the statements read in XLA's layout came from, by their first source line
        # and text (none when the text is in XLA's layout: each line is its own statement).
        self._anchors = anchors or {}
        self.name = ""
        self.header_line = 1
        # Raw `HloModule name, key=value, ...` attributes (e.g. `num_partitions`), and the
        # device counts among them, checked when read.
        self.header_attributes: dict[str, str] = {}
        self.replica_count = 1
        self.num_partitions = 1
        # How each instruction read in XLA's layout but written otherwise prints untouched.
        self._written: dict[Instruction, str] = {}
        self.computations: list[Computation] = []
        self._computations_by_name: dict[str, Computation] = {}
        # Printed layout: raw lines and computations, in source order.
        self._items: list[str | Computation] = []
        self._reserved: set[str] | None = None  # instruction names, once unique_name asks
        # What the edit methods changed, which decides how the module goes back to XLA:
        # frontend attribute edits are written into XLA's own proto (nothing else of it
        # is touched); a restructured module is printed and parsed back.
        self.frontend_attribute_edits: dict[str, dict[str, str]] = {}  # name -> key -> value
        self.restructured = False  # instructions added, removed, reordered or re-attributed

    def __repr__(self) -> str:
        return f"<Module {self.name}: {len(self.computations)} computations>"

    @property
    def entry(self) -> Computation:
        for comp in self.computations:
            if comp.is_entry:
                return comp
        raise HloError("module has no ENTRY computation", path=self.path, line=1, column=1)

    @property
    def changed(self) -> bool:
        return self.restructured or bool(self.frontend_attribute_edits)

    def unique_name(self, base: str) -> str:
        """``base``, or ``base.N`` for the first N no instruction of the module has (XLA
        prints names unique in the module, though it reads them unique per computation);
        reserved, so the next call gives another."""
        if self._reserved is None:
            self._reserved = {i.name for comp in self.computations for i in comp.instructions}
        name, n = base, 0
        while name in self._reserved:
            n += 1
            name = f"{base}.{n}"
        self._reserved.add(name)
        return name

    def computation(self, name: str) -> Computation | None:
        return self._computations_by_name.get(name)

    @property
    def is_scheduled(self) -> bool:
        return self.header_attributes.get("is_scheduled") == "true"

    def instructions(self) -> Iterator[Instruction]:
        for comp in self.computations:
            yield from comp.instructions

    def source_line(self, line: int) -> str:
        """Source line ``line`` (1-based) for error messages, without a CRLF's "\r"."""
        return self._lines[line - 1].rstrip("\r") if 0 < line <= len(self._lines) else ""

    def error_at(self, line: int, statement: str, offset: int, message: str) -> HloError:
        """An HloError at ``offset`` characters into ``statement``, read from source line
        ``line``: there, or where its text was written if XLA's layout put it together."""
        anchors = self._anchors.get((line, statement))
        if anchors is not None:
            line, offset = anchors.locate(offset)
        return HloError(
            message,
            path=self.path,
            line=line,
            column=max(offset, 0) + 1,
            source_line=self.source_line(line),
        )

    def print(self) -> str:
        if not self.changed:
            return self._text  # what every line would print: its source
        out: list[str] = []
        for item in self._items:
            if isinstance(item, str):
                out.append(item)
            else:
                item._print(out)
        return "\n".join(out)


class ModuleBuilder:
    """How a reader makes a module, statement by statement in source order: the one
    way into a module's parts besides the edit methods (which record what they change).

    ``line`` is the source line a statement starts on; ``written``, how it prints while
    untouched (the statement itself, unless XLA's layout put it together from others).
    """

    def __init__(self, module: Module) -> None:
        self.module = module  # as constructed: no computation yet

    def text(self, written: str) -> None:
        """A line outside the computations (blank, comment, debug-info section)."""
        self.module._items.append(written)

    def header(
        self,
        name: str,
        line: int,
        written: str,
        attributes: dict[str, str],
        device_counts: tuple[int, int],
    ) -> None:
        """The ``HloModule`` statement: its name, attributes and checked
        (replica_count, num_partitions)."""
        module = self.module
        module.name = name
        module.header_line = line
        module.header_attributes = attributes
        module.replica_count, module.num_partitions = device_counts
        module._items.append(written)

    def computation(self, name: str, written: str, line: int, is_entry: bool) -> Computation:
        """A computation opened by its header; ``body`` gives its instructions."""
        module = self.module
        comp = Computation(module, name, written, line, is_entry)
        module.computations.append(comp)
        module._computations_by_name[name] = comp
        module._items.append(comp)
        return comp

    def body(
        self,
        comp: Computation,
        instructions: list[Instruction],
        by_name: dict[str, Instruction],
        trivia: dict[str, list[str]],
        footer: str,
        execution_thread: str = "main",
    ) -> None:
        """``comp``'s instructions in schedule order (and ``by_name``, each by its name),
        the comment and blank lines before each (by its name), and the text that closes
        it; the instructions were made with ``comp`` as their computation."""
        comp.instructions = instructions
        comp._by_name = by_name
        comp._trivia = trivia
        comp.footer = footer
        comp.execution_thread = execution_thread

    def entry(self, comp: Computation) -> None:
        """Make ``comp`` the entry: XLA's choice when no computation says ENTRY."""
        comp.is_entry = True

    def written_as(self, inst: Instruction, written: str) -> None:
        """``inst`` was read in XLA's layout but prints, untouched, as ``written``."""
        self.module._written[inst] = written
