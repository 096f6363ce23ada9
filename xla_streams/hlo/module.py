"""The IR: a module of computations of instructions, read from and printed to HLO text.

Reading is lazy. ``parse_module`` checks every line's structure (instruction
head, shape, brackets, duplicate names) but decodes an instruction's operands
and attributes only when a pass asks. Untouched instructions print back byte
for byte from their source line; an edited one prints in XLA's canonical form.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from xla_streams.hlo.errors import HloError
from xla_streams.hlo.shape import Shape, parse_shape
from xla_streams.hlo.text import ScanError, find_closing, split_top_level

# `  [ROOT ]%name = shape opcode(`. A tuple shape never contains `) word(`, so
# the lazy `\(.*?\)` stops at the shape's own closing parenthesis.
_INSTRUCTION = re.compile(r"  (ROOT )?%?([^\s=%]+) = (\(.*?\)|\S+) ([a-z][a-z0-9\-]*)\(")
_COMPUTATION = re.compile(r"(ENTRY )?%?([^\s(]+) \(.*\) -> .* \{")
_SECTION_HEADERS = frozenset({"FileNames", "FunctionNames", "FileLocations", "StackFrames"})
# Attributes XLA prints after `frontend_attributes` (jaxlib 0.10.2's canonical order).
_AFTER_FRONTEND_ATTRIBUTES = (
    "control-predecessors", "statistics", "result_accuracy", "origin", "metadata", "backend_config",
)  # fmt: skip
_INDEX_COMMENT = re.compile(r"/\*.*?\*/")


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
    def operand_names(self) -> list[str]:
        """Names of the operand instructions (for `parameter`/`constant`: none)."""
        if self.opcode in ("parameter", "constant", "iota", "rng-bit-generator-state"):
            return []
        head = self.source
        start, end = self._operands_start, self._operands_span_end()
        names = []
        for a, b in split_top_level(head, start, end):
            item = _INDEX_COMMENT.sub("", head[a:b]).strip()
            names.append(item.rsplit(" ", 1)[-1].lstrip("%"))
        return names

    @property
    def operands(self) -> list[Instruction]:
        """The operand instructions, looked up in this instruction's computation."""
        result = []
        for name in self.operand_names:
            operand = self.computation.get(name)
            if operand is None:
                raise self._error(
                    self.source.find(name, self._operands_start),
                    f"operand '%{name}' is not defined in computation '{self.computation.name}'",
                )
            result.append(operand)
        return result

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
        # The name is what precedes the first " = " (it may also occur inside "  ROOT %").
        return self._error(self.source.index(" = ") - len(self.name), message)

    # -- editing -----------------------------------------------------------------

    def set_attribute(self, key: str, value: str) -> None:
        """Set an attribute's raw value; a new key goes where XLA prints it."""
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
        return head + "".join(f", {k}={v}" for k, v in self.attributes.items())

    # -- internals ---------------------------------------------------------------

    def _operands_span_end(self) -> int:
        if self._operands_end < 0:
            try:
                self._operands_end = find_closing(self.source, self._operands_start - 1)
            except ScanError as e:
                raise self._error(e.offset, e.message) from None
        return self._operands_end

    def _parse_attributes(self) -> dict[str, str]:
        text = self.source
        start = self._operands_span_end() + 1
        if start >= len(text):
            return {}
        if not text.startswith(", ", start):
            raise self._error(start, "expected ', attribute=value' or end of line after operands")
        try:
            spans = split_top_level(text, start + 2)
        except ScanError as e:
            raise self._error(e.offset, e.message) from None
        attributes: dict[str, str] = {}
        previous = (0, 0)
        for a, b in spans:
            eq = text.find("=", a, b)
            if eq < 0:
                raise self._error(a, f"expected 'attribute=value', found '{text[a:b]}'")
            key = text[a:eq]
            if key == "device_ids" and text.startswith("replica_groups=mesh[", previous[0]):
                # `replica_groups=mesh[...], device_ids=(...) {axes}` is one value.
                attributes["replica_groups"] = text[previous[0] + len("replica_groups=") : b]
                continue
            if key in attributes:
                raise self._error(a, f"duplicate attribute '{key}'")
            attributes[key] = text[eq + 1 : b]
            previous = (a, b)
        return attributes

    def _error(self, offset: int, message: str) -> HloError:
        module = self.computation.module
        source = module.source_line(self.line)
        return HloError(
            message, path=module.path, line=self.line, column=max(offset, 0) + 1, source_line=source
        )


class Computation:
    """A computation: its instructions in schedule order (the printed order)."""

    __slots__ = ("_by_name", "header", "instructions", "is_entry", "line", "module", "name")

    def __init__(self, module: Module, name: str, header: str, line: int, is_entry: bool) -> None:
        self.module = module
        self.name = name
        self.header = header
        self.line = line
        self.is_entry = is_entry
        self.instructions: list[Instruction] = []
        self._by_name: dict[str, Instruction] = {}

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


class Module:
    """A parsed HLO module. ``print()`` gives the text back."""

    def __init__(self, path: str, lines: list[str]) -> None:
        self.path = path
        self._lines = lines
        self.name = ""
        self.header_line = 1
        self.computations: list[Computation] = []
        self._computations_by_name: dict[str, Computation] = {}
        # Printed layout: raw lines and computations, in source order.
        self._items: list[str | Computation] = []
        self._header_attributes: dict[str, str] | None = None

    def __repr__(self) -> str:
        return f"<Module {self.name}: {len(self.computations)} computations>"

    @property
    def entry(self) -> Computation:
        for comp in self.computations:
            if comp.is_entry:
                return comp
        raise HloError("module has no ENTRY computation", path=self.path, line=1, column=1)

    def computation(self, name: str) -> Computation | None:
        return self._computations_by_name.get(name)

    def add_computation(self, comp: Computation) -> None:
        """Append a computation (printed last, after ENTRY)."""
        self.computations.append(comp)
        self._computations_by_name[comp.name] = comp
        self._items.extend(["", comp])

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
        return int(self.header_attributes.get("num_partitions", "1"))

    @property
    def replica_count(self) -> int:
        return int(self.header_attributes.get("replica_count", "1"))

    def instructions(self) -> Iterator[Instruction]:
        for comp in self.computations:
            yield from comp.instructions

    def source_line(self, line: int) -> str:
        return self._lines[line - 1] if 0 < line <= len(self._lines) else ""

    def print(self) -> str:
        out: list[str] = []
        for item in self._items:
            if isinstance(item, str):
                out.append(item)
            else:
                out.append(item.header)
                out.extend(inst.text for inst in item.instructions)
                out.append("}")
        return "\n".join(out)


def parse_module(text: str, path: str = "<string>") -> Module:
    """Parse HLO module text; raises HloError naming path, line and column."""
    lines = text.split("\n")
    module = Module(path, lines)
    # `//` comment lines (FileCheck RUN/CHECK lines in tests) may precede the header.
    first = 0
    while first < len(lines) - 1 and (not lines[first] or lines[first].startswith("//")):
        module._items.append(lines[first])
        first += 1
    if not lines[first].startswith("HloModule "):
        raise _line_error(module, first + 1, 0, "expected 'HloModule <name>'")
    module._items.append(lines[first])
    module.header_line = first + 1
    module.name = lines[first][len("HloModule ") :].split(",", 1)[0].strip()
    module.header_attributes  # noqa: B018 - validate the header eagerly
    names: dict[str, int] = {}
    computation_names: set[str] = set()
    comp: Computation | None = None
    in_section = False
    for index in range(first + 1, len(lines)):
        line = lines[index]
        line_no = index + 1
        if comp is not None:
            if line.startswith("  "):
                _add_instruction(module, comp, line, line_no, names)
            elif line == "}":
                if not comp.instructions:
                    raise _line_error(module, line_no, 0, f"computation '{comp.name}' is empty")
                comp = None
            else:
                raise _line_error(
                    module, line_no, 0,
                    f"expected an instruction or '}}' closing computation '{comp.name}' "
                    f"(opened at line {comp.line})",
                )  # fmt: skip
            continue
        if not line or line.startswith("//"):
            in_section = False
            module._items.append(line)
        elif line in _SECTION_HEADERS:
            in_section = True
            module._items.append(line)
        elif in_section and line[0].isdigit():
            module._items.append(line)
        elif (m := _COMPUTATION.fullmatch(line)) is not None:
            name = m.group(2)
            if name in computation_names:
                raise _line_error(
                    module, line_no, line.find(name), f"duplicate computation '{name}'"
                )
            computation_names.add(name)
            comp = Computation(module, name, line, line_no, is_entry=m.group(1) is not None)
            module.computations.append(comp)
            module._computations_by_name[name] = comp
            module._items.append(comp)
        else:
            raise _line_error(
                module,
                line_no,
                0,
                "expected a computation header '[ENTRY] %name (params) -> shape {'",
            )
    if comp is not None:
        raise _line_error(
            module, len(lines), len(lines[-1]),
            f"unexpected end of text: expected '}}' closing computation '{comp.name}' "
            f"(opened at line {comp.line})",
        )  # fmt: skip
    if not any(c.is_entry for c in module.computations):
        raise _line_error(module, len(lines), 0, "expected an ENTRY computation")
    return module


def _add_instruction(
    module: Module, comp: Computation, line: str, line_no: int, names: dict[str, int]
) -> None:
    m = _INSTRUCTION.match(line)
    if m is None:
        raise _line_error(
            module, line_no, 2, "expected an instruction '%name = shape opcode(operands)'"
        )
    name = m.group(2)
    if name in names:
        raise _line_error(
            module, line_no, m.start(2),
            f"duplicate instruction name '%{name}' (first defined at line {names[name]})",
        )  # fmt: skip
    names[name] = line_no
    shape_text = m.group(3)
    try:
        parse_shape(shape_text)  # cached: a module repeats few distinct shapes
    except ScanError as e:
        raise _line_error(module, line_no, m.start(3) + e.offset, e.message) from None
    # Cheap balance check of the whole line; the exact scan runs only when it fails
    # (brackets inside quoted strings can make the counts differ legitimately).
    if (
        line.count("(") != line.count(")")
        or line.count("{") != line.count("}")
        or line.count("[") != line.count("]")
        or line.count('"') & 1
    ):
        try:
            split_top_level(line, m.end() - 1)  # from the operand list's own "("
        except ScanError as e:
            raise _line_error(module, line_no, e.offset, e.message) from None
    comp._add(
        Instruction(
            comp, line_no, line, name, shape_text, m.group(4), m.end(), m.group(1) is not None
        )
    )


def _parse_header(module: Module) -> dict[str, str]:
    line = module.source_line(module.header_line)
    comma = line.find(",")
    if comma < 0:
        return {}
    try:
        spans = split_top_level(line, comma + 1)
    except ScanError as e:
        raise _line_error(module, module.header_line, e.offset, e.message) from None
    attributes = {}
    for a, b in spans:
        eq = line.find("=", a, b)
        if eq < 0:
            raise _line_error(
                module, module.header_line, a, f"expected 'attribute=value', found '{line[a:b]}'"
            )
        attributes[line[a:eq]] = line[eq + 1 : b]
    return attributes


def _line_error(module: Module, line_no: int, offset: int, message: str) -> HloError:
    return HloError(
        message,
        path=module.path,
        line=line_no,
        column=offset + 1,
        source_line=module.source_line(line_no),
    )
