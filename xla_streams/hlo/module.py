"""The IR: a module of computations of instructions, read from and printed to HLO text.

Reading is lazy. ``parse_module`` reads the layout XLA prints, a statement a line
(other layouts XLA reads are first put in it: ``layout.py``), and checks each
statement's structure (instruction head, shape, opcode, brackets, names unique in
their computation as XLA scopes them, one ROOT and one ENTRY, names as XLA's lexer
reads them, no NUL byte) and XLA's define-before-use rule (every operand and control
predecessor names an earlier instruction of its computation, every called
computation an earlier computation: no cycle, no recursion), but decodes an
instruction's attributes only when a pass asks. What is untouched prints back byte for
byte (CRLF line ends, tabs, comment and blank lines included); an edited instruction
prints in XLA's canonical form (and an edited module that had instructions or
computations written inside others, all in XLA's layout).

Time and memory are bounded by the size of the text: every scan is linear, and
counts the text declares (devices) are checked against MAX_DEVICES before
anything is expanded from them.
"""

from __future__ import annotations

import re

from xla_streams.hlo.attributes import (
    MAX_DEVICES,
    decode,
    format_frontend_attributes,
    parse_computation_names,
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
    from collections.abc import Iterator, Sequence
    from typing import NoReturn

    from xla_streams.hlo.layout import Anchors

_NAME = re.compile(NAME)
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
# `name = opcode(`: an instruction XLA infers the shape of (`add = add(%a, %b)`).
_SHAPELESS = re.compile(rf"[ \t]*(?:ROOT[ \t]+)?%?({NAME})[ \t]*=[ \t]*[a-z][a-z0-9\-]*\(")
# An instruction, where only attributes may follow on a line of XLA's layout.
_SECOND_STATEMENT = re.compile(
    rf"(?:ROOT[ \t]+)?%?{NAME}[ \t]*=[ \t]*(?:\(|[a-z][a-z0-9]*\[|[a-z][a-z0-9\-]*\()"
)
# What XLA's parser allows after a computation's closing `}`.
_COMPUTATION_ATTRIBUTES = ("execution_thread", "backend_config")
# `[indent][ROOT ]%name = shape opcode(`. A tuple shape never contains `) word(`,
# so the lazy `\(.*?\)` stops at the shape's own closing parenthesis. Anchored and
# unambiguous: linear on any line. Then, when no bracket nests in it and no comment
# (which may hold a ")") is in it, as in most lines, the operand list up to its `)`
# (group 5; else None), read in the same call.
_INSTRUCTION = re.compile(
    rf"[ \t]*(ROOT[ \t]+)?%?({NAME})[ \t]*=[ \t]*(\(.*?\)|\S+)[ \t]+([a-z][a-z0-9\-]*)\("
    r"(?:([^()/]*+)\))?"
)
# `[ENTRY ]%name`, then optionally `(params) -> shape`, then `{` (checked by
# _computation_header: one regex for the whole line backtracks quadratically
# on a line of repeated `) -> `).
_COMPUTATION_NAME = re.compile(rf"(ENTRY[ \t]+)?%?({NAME})[ \t]*")
_SECTION_HEADERS = frozenset({"FileNames", "FunctionNames", "FileLocations", "StackFrames"})
# Attributes XLA prints after `frontend_attributes` (jaxlib 0.10.2's canonical order).
_AFTER_FRONTEND_ATTRIBUTES = (
    "control-predecessors", "statistics", "result_accuracy", "origin", "metadata", "backend_config",
)  # fmt: skip
_NO_OPERANDS = frozenset({"parameter", "constant", "iota", "rng-bit-generator-state"})
# HLO text defines every instruction before its users and every computation before
# the instructions that call it (XLA's parser: "instruction does not exist", "computation
# does not exist"); parse_module checks both, which rules out every data or control
# cycle and every recursion. Names in an operand list without nested brackets are read
# with one regex (the identifier runs: `%`, spaces and `#index` suffixes fall between).
_OPERAND_NAME = re.compile(rf"({NAME})(?:#[0-9]+)*")
_PLAIN_OPERAND = re.compile(rf"%({NAME})")
# An attribute that names computations (all but control-predecessors) or instructions,
# and its value when a plain name or a braced list of them (else group 2 and 3 are None).
_REFERENCE = re.compile(
    r",[ \t]*(to_apply|calls|body|condition|branch_computations|true_computation|"
    r"false_computation|called_computations|select|scatter|control-predecessors)=[ \t]*"
    rf"(?:%?({NAME})[ \t\r]*(?=,|$)|\{{([^{{}}\"/]*)\}}|)"
)
_COMPUTATION_KEYS = frozenset(
    ("to_apply", "calls", "body", "condition", "branch_computations", "true_computation",
     "false_computation", "called_computations", "select", "scatter")
)  # fmt: skip
# What bytes.translate deletes to leave of a text only its line ends and the characters
# whose balance parse_module checks on every instruction line.
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b'(){}[]"\n')

# One operand: (instruction name, tuple index path, offset of the name in the line).
_OperandRef = tuple[str, tuple[int, ...], int]


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
        self._operands_end = -1
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
            computation, 0, head + operands + ")", name, shape_text, opcode, len(head), is_root
        )
        inst._operands_end = len(head) + len(operands)
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
            raise self._error(self.source.find(self.shape_text) + e.offset, e.message) from None

    @property
    def operands_text(self) -> str:
        """The raw text between the opcode's parentheses."""
        return self.source[self._operands_start : self._operands_span_end()]

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
                    raise self._error(
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
        return self._error(column, message)

    def error(self, message: str) -> HloError:
        """An HloError pointing at this instruction's name."""
        return self._error(self._name_offset(), message)

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
                raise self._error(e.offset, e.message) from None
        return self._operands_end

    def _operand(self, name: str, at: int) -> Instruction:
        operand = self.computation.get(name)
        if operand is None:
            raise self._error(
                at, f"operand '%{name}' is not defined in computation '{self.computation.name}'"
            )
        return operand

    def _operand_refs(self) -> list[_OperandRef]:
        if self.opcode in _NO_OPERANDS:
            return []
        source = self.source
        start, end = self._operands_start, self._operands_span_end()
        # `%name`, most operands (and the whole list of many), read as the loop's general
        # case would read it.
        plain = _PLAIN_OPERAND.fullmatch(source, start, end)
        if plain is not None:
            return [(plain.group(1), (), start + 1)]
        try:
            spans = split_top_level(source, start, end)
        except ScanError as e:
            raise self._error(e.offset, e.message) from None
        refs: list[_OperandRef] = []
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
                    raise self._error(
                        a, f"an instruction nested in operands more deeply than this front end "
                        f"reads ('{excerpt(item.strip())}')",
                    )  # fmt: skip
                raise self._error(a, f"expected an operand '%name', found '{excerpt(item)}'")
            path: list[int] = []
            offset = a + len(head) + 1
            for index in indices:
                try:
                    path.append(parse_int(index, offset))
                except ScanError as e:
                    raise self._error(
                        e.offset, f"bad tuple index of '%{name}': {e.message}"
                    ) from None
                if path[-1] < 0:
                    raise self._error(offset, f"tuple index of '%{name}' is negative")
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
                raise self._error(
                    comma, "a second instruction on the line of another: this front end reads "
                    "one instruction a line (after the operands, expected ', attribute=value')",
                )  # fmt: skip
            raise self._error(start, "expected ', attribute=value' or end of line after operands")
        try:
            spans = split_top_level(text, comma + 1, end)
        except ScanError as e:
            raise self._error(e.offset, e.message) from None
        attributes: dict[str, str] = {}
        previous = 0  # where the previous attribute starts
        for a, b in spans:
            eq = text.find("=", a, b)
            if eq < 0:
                raise self._error(a, f"expected 'attribute=value', found '{excerpt(text[a:b])}'")
            key = text[a:eq]
            if key == "device_ids" and text.startswith("replica_groups=mesh[", previous):
                # `replica_groups=mesh[...], device_ids=(...) {axes}` is one value.
                attributes["replica_groups"] = text[previous + len("replica_groups=") : b]
                continue
            if key in attributes:
                raise self._error(a, f"duplicate attribute '{excerpt(key)}'")
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

    def _error(self, offset: int, message: str) -> HloError:
        return self.computation.module.error_at(self.line, self.source, offset, message)


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

    def _add(self, inst: Instruction) -> None:
        self.instructions.append(inst)
        self._by_name[inst.name] = inst

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
        self._header = ""  # the `HloModule` statement
        # How each instruction read in XLA's layout but written otherwise prints untouched.
        self._written: dict[Instruction, str] = {}
        self.computations: list[Computation] = []
        self._computations_by_name: dict[str, Computation] = {}
        # Printed layout: raw lines and computations, in source order.
        self._items: list[str | Computation] = []
        self._header_attributes: dict[str, str] | None = None
        self._device_counts = (1, 1)  # (replica_count, num_partitions), checked
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
    def header_attributes(self) -> dict[str, str]:
        """Raw `HloModule name, key=value, ...` attributes (e.g. `num_partitions`)."""
        if self._header_attributes is None:
            self._header_attributes = _parse_header(self)
        return self._header_attributes

    @property
    def is_scheduled(self) -> bool:
        return self.header_attributes.get("is_scheduled") == "true"

    @property
    def num_partitions(self) -> int:
        """Checked when parsed: a positive integer, and with replica_count <= MAX_DEVICES."""
        self.header_attributes  # noqa: B018 - parses and checks the counts
        return self._device_counts[1]

    @property
    def replica_count(self) -> int:
        self.header_attributes  # noqa: B018 - parses and checks the counts
        return self._device_counts[0]

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


def parse_module(text: str, path: str = "<string>") -> Module:
    """Parse HLO module text; raises HloError naming path, line and column.

    Text in XLA's printed layout is read line by line. Other text XLA reads too (a
    test's: indented, an instruction over several lines, spaces in a shape) fails that
    reading somewhere; it is then read in XLA's layout (``layout.xla_layout``), and
    errors point back into the source.
    """
    _check_no_nul(text, path)
    # Split on "\n" only: a CRLF line keeps its "\r", read as trailing whitespace
    # and printed back as it was.
    lines = text.split("\n")
    try:
        return _read(Module(path, text, lines), text, lines, range(1, len(lines) + 1), lines)
    except HloError:
        # Imported here: XLA's printing never needs it, and each process's start counts.
        from xla_streams.hlo.layout import xla_layout

        layout = xla_layout(lines)
        if layout is None:  # the text is in XLA's layout: the error stands
            raise
    module = Module(path, text, lines, layout.anchors)
    statements = layout.statements
    written = layout.written or statements  # None: edited, it prints in XLA's layout
    _read(module, "\n".join(statements), statements, layout.lines, written)
    if layout.written is not None:
        as_written = {(n, s): w for n, s, w in zip(layout.lines, statements, written, strict=True)}
        for inst in module.instructions():
            w = as_written[(inst.line, inst.source)]
            if w != inst.source:
                module._written[inst] = w
    return module


def _read(
    module: Module, text: str, lines: list[str], line_numbers: Sequence[int], written: list[str]
) -> Module:
    """The module in ``lines``, one statement each (XLA's layout), where ``lines[i]``
    starts on source line ``line_numbers[i]`` and prints, untouched, as ``written[i]``;
    ``text`` is the lines joined."""
    # `//` comment lines (FileCheck RUN/CHECK lines in tests) may precede the header.
    first = 0
    while first < len(lines) - 1 and (
        not lines[first].strip(WHITESPACE) or lines[first].startswith("//")
    ):
        module._items.append(written[first])
        first += 1
    header = lines[first]
    module.name = header[len("HloModule ") :].split(",", 1)[0].strip(WHITESPACE)
    if not header.startswith(("HloModule ", "HloModule\t")) or not _NAME.fullmatch(module.name):
        message = "expected 'HloModule <name>'"
        if header.startswith(("module @", "module {", "func.func", "#loc")):
            message += (
                ": this is StableHLO (MLIR), as f.lower(...).as_text() prints it; give the "
                "compiled module's HLO text: f.lower(...).compile().as_text(), or the "
                "*after_optimizations.txt file of an --xla_dump_to dump"
            )
        raise module.error_at(line_numbers[first], header, 0, message)
    module._items.append(written[first])
    module.header_line = line_numbers[first]
    module._header = header
    module.header_attributes  # noqa: B018 - validate the header eagerly
    names: dict[str, int] = {}  # instruction -> line, in the current computation (XLA's scope)
    computation_names: set[str] = set()
    closed: set[str] = set()  # computations defined so far: the ones an instruction may call
    forward: list[_ForwardControl] = []  # control predecessors printed after their user
    defined: set[str] = set()  # instructions of the current computation defined so far
    comp: Computation | None = None
    entry: Computation | None = None
    root_line = 0  # of the current computation's ROOT instruction
    pending: list[str] = []  # comment and blank lines inside the current computation
    in_section = False
    # The brackets and quotes of every line, in one pass over the text in C: a line's
    # balance is counted once per distinct sequence of them (a module has a few dozen),
    # not with seven str.count calls per line. UTF-8 keeps the lines ("\n" is no part
    # of any other character's bytes); surrogatepass, since a str may hold lone ones.
    skeletons = text.encode("utf-8", "surrogatepass").translate(None, _NOT_BRACKETS).split(b"\n")
    # The distinct skeletons whose brackets do not pair up (most modules: none).
    unbalanced = {s for s in set(skeletons) if not _is_balanced(s)}
    # One string object per distinct shape and opcode, shared by the instructions that
    # print it: less memory, and passes that test every instruction's opcode or look its
    # shape up read a few hot strings, not one cold string per instruction. A shape is
    # checked once, when first seen (parse_shape's own cache is shared and slower).
    shapes: dict[str, str] = {}
    opcodes: dict[str, str] = {}
    async_ops: list[Instruction] = []  # of the current computation, checked at its end
    for index in range(first + 1, len(lines)):
        line = lines[index]
        line_no = line_numbers[index]
        if comp is not None:
            m = _INSTRUCTION.match(line)
            if m is not None:
                # An instruction line (most lines): its checks run here, in the order
                # they report, with helpers only for the rare cases; a module has tens
                # of thousands of these lines, and each call or group() costs.
                root, name, shape_text, opcode, operands = m.groups()
                operands_start = m.end(4) + 1
                if name in names:
                    raise module.error_at(
                        line_no, line, m.start(2),
                        f"duplicate instruction name '%{excerpt(name)}' (first defined at "
                        f"line {names[name]})",
                    )  # fmt: skip
                names[name] = line_no
                known = shapes.get(shape_text)
                if known is not None:
                    shape_text = known
                else:
                    try:
                        parse_shape(shape_text)
                    except ScanError as e:
                        if _SHAPELESS.match(line):  # `%x = add(f32[] %a, ...)`
                            raise _instruction_error(module, line, line_no) from None
                        at = m.start(3) + e.offset
                        raise module.error_at(line_no, line, at, e.message) from None
                    shapes[shape_text] = shape_text
                if unbalanced and skeletons[index] in unbalanced:
                    _check_brackets(module, line, line_no, operands_start)
                known = opcodes.get(opcode)
                chained = False
                if known is not None:
                    opcode = known
                else:
                    # An async op (never cached: each is checked with its chain) is rare.
                    chained = _async_wrapped(opcode) is not None
                    if not chained:
                        if opcode not in OPCODES:
                            raise module.error_at(
                                line_no, line, m.start(4), f"unknown opcode '{excerpt(opcode)}'"
                            )
                        opcodes[opcode] = opcode
                inst = Instruction(
                    comp, line_no, line, name, shape_text, opcode, operands_start, root is not None
                )
                if chained:
                    async_ops.append(inst)
                comp.instructions.append(inst)  # comp._add(inst), without the call
                comp._by_name[name] = inst
                # Define-before-use; the common case read here: an operand list with no
                # nested bracket that is `%a, %b, ...`, each name defined before (names
                # hold no `%`, `,`, space or `#`, so any other list fails the test).
                if operands is None:  # a tuple shape, a literal or a comment in it
                    end = _check_operands(inst, operands_start, -1, defined)
                else:
                    end = operands_start + len(operands)
                    if opcode not in _NO_OPERANDS and not defined.issuperset(
                        operands.removeprefix("%").split(", %")
                    ):
                        _check_operands(inst, operands_start, end, defined)
                hit = _REFERENCE.search(line, end)
                if hit is not None:
                    _check_attribute_references(inst, hit, end, defined, closed, forward)
                defined.add(name)
                if root is not None:
                    if root_line:
                        raise module.error_at(
                            line_no, line, m.start(1),
                            f"computation '{comp.name}' has a second ROOT instruction "
                            f"(the first is at line {root_line})",
                        )  # fmt: skip
                    root_line = line_no
                if pending:
                    comp._trivia[name] = pending
                    pending = []
                continue
            stripped = line.strip(WHITESPACE)
            if stripped[:1] == "}":
                if not comp.instructions:
                    raise module.error_at(line_no, line, 0, f"computation '{comp.name}' is empty")
                if stripped != "}":  # `}, execution_thread="..."`
                    _read_computation_attributes(module, comp, line, line_no)
                comp.footer = "\n".join([*pending, written[index]])
                if forward:
                    _check_forward_control(comp, forward)
                    forward = []
                if async_ops:
                    _check_async_chains(module, async_ops)
                    async_ops = []
                closed.add(comp.name)
                comp, root_line, pending = None, 0, []
                defined, names = set(), {}
            elif not stripped or stripped.startswith("//"):
                pending.append(written[index])  # XLA's lexer skips these; printed in place
            elif line[0] in " \t":
                raise _instruction_error(module, line, line_no)
            else:
                raise module.error_at(
                    line_no, line, 0,
                    f"expected an instruction or '}}' closing computation '{comp.name}' "
                    f"(opened at line {comp.line})",
                )  # fmt: skip
            continue
        stripped = line.strip(WHITESPACE)
        if not stripped or stripped.startswith("//"):
            in_section = False
            module._items.append(written[index])
        elif stripped in _SECTION_HEADERS:
            in_section = True
            module._items.append(written[index])
        elif in_section and line[0].isdigit():
            module._items.append(written[index])
        elif (m := _computation_header(line)) is not None:
            name = m.group(2)
            if name in computation_names:
                raise module.error_at(
                    line_no, line, m.start(2), f"duplicate computation '{excerpt(name)}'"
                )
            computation_names.add(name)
            comp = Computation(
                module, name, written[index], line_no, is_entry=m.group(1) is not None
            )
            if comp.is_entry:
                if entry is not None:
                    raise module.error_at(
                        line_no, line, m.start(1),
                        f"a second ENTRY computation, '{excerpt(name)}': the first is "
                        f"'{entry.name}' at line {entry.line} (XLA: expects only one ENTRY)",
                    )  # fmt: skip
                entry = comp
            module.computations.append(comp)
            module._computations_by_name[name] = comp
            module._items.append(comp)
        else:
            raise module.error_at(
                line_no,
                line,
                0,
                "expected a computation header '[ENTRY] %name (params) -> shape {'",
            )
    if comp is not None:
        raise module.error_at(
            line_numbers[-1], lines[-1], len(lines[-1]),
            f"unexpected end of text: expected '}}' closing computation '{comp.name}' "
            f"(opened at line {comp.line})",
        )  # fmt: skip
    if not module.computations:
        raise module.error_at(
            line_numbers[-1], lines[-1], len(lines[-1]),
            "unexpected end of text: expected a computation '[ENTRY] %name (params) -> shape {'",
        )  # fmt: skip
    if entry is None:  # as XLA does: the last computation is the entry
        module.computations[-1].is_entry = True
    return module


def _computation_header(line: str) -> re.Match[str] | None:
    """The name match of ``[ENTRY] %name [(params) -> shape] {``, or None.

    Checked piecewise with find(): the one-regex form `\\(.*\\) -> .* \\{`
    backtracks quadratically on a line of repeated `) -> `.
    """
    m = _COMPUTATION_NAME.match(line)
    if m is None:
        return None
    end = len(line)
    while end > m.end() and line[end - 1] in WHITESPACE:
        end -= 1
    if end == m.end() or line[end - 1] != "{":
        return None
    signature_start, signature_end = m.end(), end - 1
    if signature_start == signature_end:
        return m  # `%name {`: XLA allows a computation without a signature
    if line[signature_start] != "(":
        return None
    arrow = line.find("->", signature_start, signature_end)
    if arrow < 0 or not line[arrow + 2 : signature_end].strip(WHITESPACE):
        return None
    close = arrow
    while line[close - 1] in " \t":
        close -= 1
    return m if line[close - 1] == ")" else None


def _read_computation_attributes(
    module: Module, comp: Computation, line: str, line_no: int
) -> None:
    """The attributes after a computation's `}` (XLA's: execution_thread, backend_config)."""
    close = line.index("}")
    rest = line[close + 1 :].lstrip(WHITESPACE)
    if not rest.startswith(","):
        at = len(line) - len(rest)
        raise module.error_at(
            line_no, line, at, f"expected ', execution_thread=\"...\"' or end of line after '}}' "
            f"closing computation '{comp.name}'",
        )  # fmt: skip
    start = len(line) - len(rest) + 1
    try:
        spans = split_top_level(line, start)
    except ScanError as e:
        raise module.error_at(line_no, line, e.offset, e.message) from None
    seen = set()
    for a, b in spans:
        key, eq, value = line[a:b].partition("=")
        if not eq or key not in _COMPUTATION_ATTRIBUTES:
            raise module.error_at(
                line_no, line, a, f"unexpected attribute '{excerpt(key)}' of computation "
                f"'{comp.name}': XLA allows {' and '.join(_COMPUTATION_ATTRIBUTES)}",
            )  # fmt: skip
        if key in seen:
            raise module.error_at(line_no, line, a, f"duplicate attribute '{key}'")
        seen.add(key)
        if key == "execution_thread":
            value = value.strip(WHITESPACE)
            if len(value) < 2 or value[0] != '"' or value[-1] != '"':
                raise module.error_at(
                    line_no, line, a + len(key) + 1,
                    f"expected a quoted thread name, found '{excerpt(value)}'",
                )  # fmt: skip
            comp.execution_thread = value[1:-1]


def _instruction_error(module: Module, line: str, line_no: int) -> HloError:
    """What is wrong with ``line``, in a computation and no instruction as XLA prints one."""
    indent = len(line) - len(line.lstrip(WHITESPACE))
    shapeless = _SHAPELESS.match(line)
    if shapeless is not None:
        return module.error_at(
            line_no, line, shapeless.start(1),
            f"instruction '%{shapeless.group(1)}' has no shape: XLA infers it, this front end "
            "reads each instruction's shape as XLA prints it ('%name = shape opcode(...)')",
        )  # fmt: skip
    return module.error_at(
        line_no, line, indent, "expected an instruction '%name = shape opcode(operands)'"
    )


def _async_wrapped(opcode: str) -> tuple[str, str] | None:
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


def _check_async_chains(module: Module, ops: list[Instruction]) -> None:
    """What XLA's parser asks of async ops: a start's and an update's shape is
    ``((operands), outputs, state...)``; an update or done that continues a start or
    update runs what it runs: the same wrapped opcode, computation and execution
    thread, where it names them."""
    comp = ops[0].computation
    for inst in ops:
        found = _async_wrapped(inst.opcode)
        assert found is not None
        step, wrapped = found
        if step != "done":
            shape = inst.shape
            if not (shape.is_tuple and len(shape.tuple_shapes) >= 2
                    and shape.tuple_shapes[0].is_tuple):  # fmt: skip
                raise inst._error(
                    inst.source.find(inst.shape_text),
                    f"{inst.opcode} '%{inst.name}' has shape {excerpt(inst.shape_text)}: an "
                    "async start or update is '((operands), outputs, state...)' (XLA: "
                    "AsyncStart and AsyncUpdate expect the shape to be in that form)",
                )
        if step == "start":
            continue
        names = inst.operand_names
        previous = comp._by_name.get(names[0]) if len(names) == 1 else None
        chain = _async_wrapped(previous.opcode) if previous is not None else None
        if previous is None or chain is None or chain[0] == "done":
            continue  # XLA's parser reads it (its verifier would not); pairing says more
        ran, ran_computation = _async_runs(module, previous)
        if wrapped and ran and wrapped != ran:
            raise inst._error(
                inst._operands_start - 1 - len(inst.opcode),
                f"{inst.opcode} '%{inst.name}' continues '%{previous.name}', which runs "
                f"{ran} (XLA: expect async wrapped opcode to be {ran}, but got {wrapped})",
            )
        for key, theirs in (
            ("calls", ran_computation),
            ("async_execution_thread", _async_thread(previous)),
        ):
            mine = _named(inst, key)
            if mine is not None and theirs is not None and mine.strip().strip('"%') != theirs:
                raise inst.error_at_attribute(
                    key, 0, f"{key}={mine.strip()} is not what '%{previous.name}' runs "
                    f"({key}: {theirs}; XLA: expect {key} to be {theirs})",
                )  # fmt: skip


def _async_runs(module: Module, op: Instruction) -> tuple[str, str | None]:
    """(wrapped opcode, computation) of the async chain ``op`` is a link of: the
    nearest link back to its start that says (a sugared opcode, ``calls=``); the
    wrapped opcode of a computation is its root's ("" and None where no link says)."""
    for link in _links_back(op):
        step, wrapped = _async_wrapped(link.opcode) or ("", "")
        calls = _named(link, "calls")
        name = calls.strip().lstrip("%") if calls is not None else None
        if wrapped or name is not None or step == "start":
            if not wrapped and name is not None:
                called = module._computations_by_name.get(name)
                if called is not None and called.instructions:
                    wrapped = called.root.opcode
            return wrapped, name
    return "", None


def _async_thread(op: Instruction) -> str:
    """The execution thread the async chain ``op`` is a link of runs on: the nearest
    link's ``async_execution_thread`` back to its start, else XLA's main thread."""
    for link in _links_back(op):
        thread = _named(link, "async_execution_thread")
        if thread is not None:
            return thread.strip().strip('"')
    return "main"


def _named(inst: Instruction, key: str) -> str | None:
    """``inst``'s attribute ``key``; its attributes read only when the line names it
    (an async op's own attributes are rarely these)."""
    return inst.attribute(key) if f"{key}=" in inst.source else None


def _links_back(op: Instruction) -> Iterator[Instruction]:
    """``op``, then each async op before it in its chain, back to the chain's start
    (every link is defined before its user, so the walk ends)."""
    by_name = op.computation._by_name
    link: Instruction | None = op
    while link is not None and _async_wrapped(link.opcode) is not None:
        yield link
        if link.opcode.endswith("-start"):
            return
        names = link.operand_names
        link = by_name.get(names[0]) if names else None


def _check_brackets(module: Module, line: str, line_no: int, operands_start: int) -> None:
    """The exact bracket scan of an instruction line, run when the cheap count of its
    brackets (_is_balanced) fails: brackets inside quoted strings can make it differ."""
    try:
        split_top_level(line, operands_start - 1)  # from the operand list's own "("
    except ScanError as e:
        raise module.error_at(line_no, line, e.offset, e.message) from None


# (the instruction, the control predecessors it names, where they are written)
_ForwardControl = tuple["Instruction", list[str], int, int]

# HLO text's define-before-use rule, as XLA's parser enforces it: every operand of an
# instruction is one defined before it in its computation, and every computation it
# names one defined before its own. parse_module reads the common case itself (an
# operand list `%a, %b, ...` of names defined before, no attribute naming a computation
# or control predecessor); these read the rest.


def _check_operands(inst: Instruction, operands_start: int, end: int, defined: set[str]) -> int:
    """Every operand of ``inst`` is defined, for an operand list parse_module's test did
    not pass; returns where the list ends for the attribute scan: ``end``, its ")" when no
    bracket or comment is in it, or with ``end`` -1 (a tuple shape, a literal or a
    comment in it) its own closing bracket."""
    if end < 0:
        end = inst._operands_span_end()
        if inst.opcode in _NO_OPERANDS:
            return end
    elif defined.issuperset(_OPERAND_NAME.findall(inst.source, operands_start, end)):
        return end  # e.g. `%t#1` (element 1 of `%t`, as jax >= 0.11 prints it)
    # The identifier runs include a shape's element type: only the exact reader can say
    # which operand is undefined, if any.
    if not defined.issuperset(inst.operand_names):
        _undefined(inst, "operand", inst.operand_names, defined, operands_start, end)
    return end


def _check_attribute_references(
    inst: Instruction,
    hit: re.Match[str] | None,  # the first; None ends the loop
    end: int,
    defined: set[str],
    closed: set[str],
    forward: list[_ForwardControl],
) -> None:
    """The computations ``inst`` names, from its first _REFERENCE ``hit`` on: each must be
    defined before ``inst``'s own. A control predecessor may come later (XLA prints
    double-buffered loops so, though its own parser refuses them): it goes to
    ``forward``, checked when the computation closes."""
    line = inst.source
    while hit is not None:
        key, name, listed = hit.group(1, 2, 3)
        if line.find('"', end, hit.start()) >= 0 or (
            name is None and (listed is None or "=" in listed)
        ):
            # After a string (which may hold ", to_apply=") or not a plain name or list
            # of names (`=` in it: a computation written inline): the exact attribute
            # reader decides.
            _check_attributes_exactly(inst, defined, closed, forward)
            return
        names = [name] if name is not None else _OPERAND_NAME.findall(listed)
        if key == "control-predecessors":
            if not defined.issuperset(names):
                forward.append((inst, names, hit.end(1), hit.end()))
        elif not closed.issuperset(names):
            _undefined_computation(inst, key, names, closed, hit.end(1), hit.end())
        hit = _REFERENCE.search(line, hit.end())


def _check_attributes_exactly(
    inst: Instruction, defined: set[str], closed: set[str], forward: list[_ForwardControl]
) -> None:
    """_check_attribute_references with the attributes read exactly."""
    line = inst.source
    for key, value in inst.attributes.items():
        if key == "control-predecessors":
            names = _OPERAND_NAME.findall(value.strip(WHITESPACE).removeprefix("{"))
            if not defined.issuperset(names):
                at = line.find(f"{key}=", inst._operands_span_end()) + len(key) + 1
                forward.append((inst, names, at, at + len(value)))
        elif key in _COMPUTATION_KEYS:
            names = list(decode(inst, key, parse_computation_names) or ())
            if not closed.issuperset(names):
                at = line.find(f"{key}=", inst._operands_span_end()) + len(key) + 1
                _undefined_computation(inst, key, names, closed, at, at + len(value))


# An operand that names a tuple element of another instruction: `%x#1`.
_TUPLE_ELEMENT_OPERAND = re.compile(r"%[^\s,(){}#]+#\d")


def _check_forward_control(comp: Computation, forward: list[_ForwardControl]) -> None:
    """No cycle runs through the control predecessors printed after their user and the
    operands (every other edge is defined before use)."""
    names = set(comp._by_name)
    for inst, predecessors, start, end in forward:
        if inst.name in predecessors:
            _undefined(inst, "control predecessor", predecessors, names - {inst.name}, start, end)
    # A name the computation does not print may be a tuple element that jax >= 0.11
    # prints as `%x#N` (its get-tuple-element line is gone): an edge XLA has, not an
    # error. Where no operand is printed that way, no line is gone.
    if not any(_TUPLE_ELEMENT_OPERAND.search(i.source) for i in comp.instructions):
        for inst, predecessors, start, end in forward:
            missing = [n for n in predecessors if n not in names]
            if missing:
                raise inst._error(
                    _name_at(inst.source, missing[0], start, end),
                    f"control predecessor '%{missing[0]}' of '%{inst.name}' is not an "
                    f"instruction of computation '{comp.name}' (XLA: instruction "
                    f"'{missing[0]}' is not defined)",
                )
    forward = [(i, [n for n in p if n in names], s, e) for i, p, s, e in forward]
    later = {inst.name: predecessors for inst, predecessors, _, _ in forward}
    position = {inst.name: i for i, inst in enumerate(comp.instructions)}
    # Every other edge runs from an earlier instruction to a later one, so a cycle must
    # take a forward edge: from each one's predecessor, search the earlier-defined
    # edges backwards for its user.
    for inst, predecessors, start, _ in forward:
        target, seen = position[inst.name], set()
        todo = [p for p in predecessors if position[p] > target]
        while todo:
            name = todo.pop()
            if name == inst.name:
                raise inst._error(
                    _name_at(inst.source, predecessors[0], start, len(inst.source)),
                    f"control predecessors of '%{inst.name}' close a cycle through it in "
                    f"computation '{comp.name}' (XLA: cycle)",
                )
            if name in seen or position[name] < target:
                continue
            seen.add(name)
            node = comp._by_name[name]
            todo.extend(node.operand_names)
            todo.extend(later.get(name, ()))
            control = node.attribute("control-predecessors")
            if control is not None:
                todo.extend(_OPERAND_NAME.findall(control))


def _undefined(
    inst: Instruction, what: str, names: list[str], defined: set[str], start: int, end: int
) -> NoReturn:
    name = next(n for n in names if n not in defined)
    at = _name_at(inst.source, name, start, end)
    comp = inst.computation.name
    if name == inst.name:
        reason = f"'%{name}' uses itself"
    else:
        reason = f"'%{name}' is not defined before '%{inst.name}' in computation '{comp}'"
    raise inst._error(
        at,
        f"{what} {reason}: HLO text defines every instruction before its users (XLA: "
        f"instruction does not exist: {name})",
    )


def _undefined_computation(
    inst: Instruction, key: str, names: list[str], closed: set[str], start: int, end: int
) -> NoReturn:
    name = next(n for n in names if n not in closed)
    at = _name_at(inst.source, name, start, end)
    comp = inst.computation.name
    if name == comp:
        reason = f"computation '{comp}' calls itself ({key}=%{name})"
    else:
        reason = f"{key}=%{name} names no computation defined before '{comp}'"
    raise inst._error(
        at,
        f"{reason}: HLO text defines every computation before the instructions that call "
        f"it, so none can recurse (XLA: computation does not exist: {name})",
    )


def _name_at(line: str, name: str, start: int, end: int) -> int:
    """Where ``name`` is written (as a whole name, its `%` included) in ``line[start:end]``."""
    for m in _OPERAND_NAME.finditer(line, start, end):
        if m.group(1) == name:
            return m.start() - (line[m.start() - 1] == "%")
    return start


def _check_no_nul(text: str, path: str) -> None:
    """XLA's lexer rejects a NUL byte (XLA itself prints none: strings are C-escaped)."""
    at = text.find("\0")
    if at < 0:
        return
    line_start = text.rfind("\n", 0, at) + 1
    line_end = text.find("\n", at, at + 100)
    # The line up to a little past the NUL (a file of zeros is one huge line).
    source = text[line_start : line_end if line_end >= 0 else at + 100]
    raise HloError(
        "NUL byte (\\0) in the text: HLO text never holds one (XLA's lexer rejects it)",
        path=path,
        line=text.count("\n", 0, at) + 1,
        column=at - line_start + 1,
        source_line=source.rstrip("\r").replace("\0", "?") if at - line_start < 10_000 else "",
    )


def _is_balanced(brackets: bytes) -> bool:
    """As many of each opening bracket as of its closing one, and quotes in pairs."""
    return (
        brackets.count(b"(") == brackets.count(b")")
        and brackets.count(b"{") == brackets.count(b"}")
        and brackets.count(b"[") == brackets.count(b"]")
        and not brackets.count(b'"') & 1
    )


def _parse_header(module: Module) -> dict[str, str]:
    line_no = module.header_line
    line = module._header
    comma = line.find(",")
    if comma < 0:
        return {}
    try:
        spans = split_top_level(line, comma + 1)
    except ScanError as e:
        raise module.error_at(line_no, line, e.offset, e.message) from None
    attributes: dict[str, str] = {}
    value_at: dict[str, int] = {}
    for a, b in spans:
        eq = line.find("=", a, b)
        if eq < 0:
            raise module.error_at(
                line_no, line, a, f"expected 'attribute=value', found '{excerpt(line[a:b])}'"
            )
        key = line[a:eq]
        if key in attributes:
            raise module.error_at(line_no, line, a, f"duplicate attribute '{excerpt(key)}'")
        attributes[key] = line[eq + 1 : b]
        value_at[key] = eq + 1
    counts = []
    for key in ("replica_count", "num_partitions"):
        value = attributes.get(key)
        count = 1
        if value is not None:
            try:
                count = parse_int(value)
            except ScanError:
                count = 0
            if count < 1:
                raise module.error_at(
                    line_no, line, value_at[key],
                    f"{key} must be a positive integer, found '{excerpt(value)}'",
                )  # fmt: skip
            if count > MAX_DEVICES:
                raise module.error_at(
                    line_no, line, value_at[key],
                    f"{key}={count} is more than the {MAX_DEVICES} devices a module may "
                    "address (MAX_DEVICES)",
                )  # fmt: skip
        counts.append(count)
    replicas, partitions = counts
    if replicas * partitions > MAX_DEVICES:
        raise module.error_at(
            line_no, line, value_at["num_partitions"],
            f"replica_count={replicas} x num_partitions={partitions} is more than the "
            f"{MAX_DEVICES} devices a module may address (MAX_DEVICES)",
        )  # fmt: skip
    module._device_counts = (replicas, partitions)
    return attributes
