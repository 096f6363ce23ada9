"""The reader of HLO text, which is also XLA's grammar checker: ``parse_module``.

It reads the layout XLA prints, a statement a line (other layouts XLA reads are first
put in it: ``layout.py``), and checks each statement's structure (instruction head,
shape, opcode, brackets, names unique in their computation as XLA scopes them, one ROOT
and one ENTRY, names as XLA's lexer reads them, no NUL byte), XLA's define-before-use
rule (every operand and control predecessor names an earlier instruction of its
computation, every called computation an earlier computation: no cycle, no recursion)
and what XLA's parser asks of async ops; an instruction's attributes are decoded only
when a pass asks. The module is made through ``ModuleBuilder``.

Time and memory are bounded by the size of the text: every scan is linear, and
counts the text declares (devices) are checked against MAX_DEVICES before
anything is expanded from them.
"""

from __future__ import annotations

import re

from xla_streams.hlo.attributes import MAX_DEVICES
from xla_streams.hlo.checks import (
    REFERENCE,
    ForwardControl,
    check_async_chains,
    check_attribute_references,
    check_forward_control,
    check_operands,
)
from xla_streams.hlo.errors import HloError
from xla_streams.hlo.module import (
    NO_OPERANDS,
    OPCODES,
    Computation,
    Instruction,
    Module,
    ModuleBuilder,
    async_wrapped,
)
from xla_streams.hlo.shape import parse_shape
from xla_streams.hlo.text import (
    NAME,
    WHITESPACE,
    ScanError,
    excerpt,
    parse_int,
    split_top_level,
)

TYPE_CHECKING = False  # not typing's: the front end imports nothing it need not
if TYPE_CHECKING:
    from collections.abc import Sequence

_NAME = re.compile(NAME)
# `name = opcode(`: an instruction XLA infers the shape of (`add = add(%a, %b)`).
_SHAPELESS = re.compile(rf"[ \t]*(?:ROOT[ \t]+)?%?({NAME})[ \t]*=[ \t]*[a-z][a-z0-9\-]*\(")
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
# What bytes.translate deletes to leave of a text only its line ends and the characters
# whose balance parse_module checks on every instruction line.
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b'(){}[]"\n')


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
        builder = ModuleBuilder(Module(path, text, lines))
        return _read(builder, text, lines, range(1, len(lines) + 1), lines)
    except HloError:
        # Imported here: XLA's printing never needs it, and each process's start counts.
        from xla_streams.hlo.layout import xla_layout

        layout = xla_layout(lines)
        if layout is None:  # the text is in XLA's layout: the error stands
            raise
    builder = ModuleBuilder(Module(path, text, lines, layout.anchors))
    statements = layout.statements
    written = layout.written or statements  # None: edited, it prints in XLA's layout
    module = _read(builder, "\n".join(statements), statements, layout.lines, written)
    if layout.written is not None:
        as_written = {(n, s): w for n, s, w in zip(layout.lines, statements, written, strict=True)}
        for inst in module.instructions():
            w = as_written[(inst.line, inst.source)]
            if w != inst.source:
                builder.written_as(inst, w)
    return module


def _read(
    builder: ModuleBuilder,
    text: str,
    lines: list[str],
    line_numbers: Sequence[int],
    written: list[str],
) -> Module:
    """The module in ``lines``, one statement each (XLA's layout), where ``lines[i]``
    starts on source line ``line_numbers[i]`` and prints, untouched, as ``written[i]``;
    ``text`` is the lines joined."""
    module = builder.module
    # `//` comment lines (FileCheck RUN/CHECK lines in tests) may precede the header.
    first = 0
    while first < len(lines) - 1 and (
        not lines[first].strip(WHITESPACE) or lines[first].startswith("//")
    ):
        builder.text(written[first])
        first += 1
    header = lines[first]
    name = header[len("HloModule ") :].split(",", 1)[0].strip(WHITESPACE)
    if not header.startswith(("HloModule ", "HloModule\t")) or not _NAME.fullmatch(name):
        message = "expected 'HloModule <name>'"
        if header.startswith(("module @", "module {", "func.func", "#loc")):
            message += (
                ": this is StableHLO (MLIR), as f.lower(...).as_text() prints it; give the "
                "compiled module's HLO text: f.lower(...).compile().as_text(), or the "
                "*after_optimizations.txt file of an --xla_dump_to dump"
            )
        raise module.error_at(line_numbers[first], header, 0, message)
    attributes, device_counts = _read_header(module, header, line_numbers[first])
    builder.header(name, line_numbers[first], written[first], attributes, device_counts)
    # The current computation's: its instructions, each by its name (XLA's scope), and
    # the comment and blank lines before each.
    instructions: list[Instruction] = []
    names: dict[str, Instruction] = {}
    trivia: dict[str, list[str]] = {}
    computation_names: set[str] = set()
    closed: set[str] = set()  # computations defined so far: the ones an instruction may call
    forward: list[ForwardControl] = []  # control predecessors printed after their user
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
                        f"line {names[name].line})",
                    )  # fmt: skip
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
                    chained = async_wrapped(opcode) is not None
                    if not chained:
                        if opcode not in OPCODES:
                            raise module.error_at(
                                line_no, line, m.start(4), f"unknown opcode '{excerpt(opcode)}'"
                            )
                        opcodes[opcode] = opcode
                # The list's ")" when the line regex read it; else found when asked for.
                end = -1 if operands is None else operands_start + len(operands)
                inst = Instruction(
                    comp, line_no, line, name, shape_text, opcode, operands_start, end,
                    root is not None,
                )  # fmt: skip
                if chained:
                    async_ops.append(inst)
                instructions.append(inst)
                names[name] = inst
                # Define-before-use; the common case read here: an operand list with no
                # nested bracket that is `%a, %b, ...`, each name defined before (names
                # hold no `%`, `,`, space or `#`, so any other list fails the test).
                if operands is None:  # a tuple shape, a literal or a comment in it
                    end = check_operands(inst, operands_start, -1, defined)
                elif opcode not in NO_OPERANDS and not defined.issuperset(
                    operands.removeprefix("%").split(", %")
                ):
                    check_operands(inst, operands_start, end, defined)
                hit = REFERENCE.search(line, end)
                if hit is not None:
                    check_attribute_references(inst, hit, end, defined, closed, forward)
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
                    trivia[name] = pending
                    pending = []
                continue
            stripped = line.strip(WHITESPACE)
            if stripped[:1] == "}":
                if not instructions:
                    raise module.error_at(line_no, line, 0, f"computation '{comp.name}' is empty")
                thread = "main"
                if stripped != "}":  # `}, execution_thread="..."`
                    thread = _read_computation_attributes(module, comp, line, line_no, thread)
                footer = "\n".join([*pending, written[index]])
                builder.body(comp, instructions, names, trivia, footer, thread)
                if forward:
                    check_forward_control(comp, forward)
                    forward = []
                if async_ops:
                    check_async_chains(module, async_ops)
                    async_ops = []
                closed.add(comp.name)
                comp, root_line, pending = None, 0, []
                instructions, names, trivia, defined = [], {}, {}, set()
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
            builder.text(written[index])
        elif stripped in _SECTION_HEADERS:
            in_section = True
            builder.text(written[index])
        elif in_section and line[0].isdigit():
            builder.text(written[index])
        elif (m := _computation_header(line)) is not None:
            name = m.group(2)
            if name in computation_names:
                raise module.error_at(
                    line_no, line, m.start(2), f"duplicate computation '{excerpt(name)}'"
                )
            computation_names.add(name)
            is_entry = m.group(1) is not None
            if is_entry and entry is not None:
                raise module.error_at(
                    line_no, line, m.start(1),
                    f"a second ENTRY computation, '{excerpt(name)}': the first is "
                    f"'{entry.name}' at line {entry.line} (XLA: expects only one ENTRY)",
                )  # fmt: skip
            comp = builder.computation(name, written[index], line_no, is_entry)
            if is_entry:
                entry = comp
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
        builder.entry(module.computations[-1])
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
    module: Module, comp: Computation, line: str, line_no: int, thread: str
) -> str:
    """The attributes after a computation's `}` (XLA's: execution_thread, backend_config)
    checked; the thread it names, else ``thread``."""
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
            thread = value[1:-1]
    return thread


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


def _check_brackets(module: Module, line: str, line_no: int, operands_start: int) -> None:
    """The exact bracket scan of an instruction line, run when the cheap count of its
    brackets (_is_balanced) fails: brackets inside quoted strings can make it differ."""
    try:
        split_top_level(line, operands_start - 1)  # from the operand list's own "("
    except ScanError as e:
        raise module.error_at(line_no, line, e.offset, e.message) from None


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


def _read_header(module: Module, line: str, line_no: int) -> tuple[dict[str, str], tuple[int, int]]:
    """The attributes of the ``HloModule`` statement ``line``, and its checked
    (replica_count, num_partitions)."""
    comma = line.find(",")
    if comma < 0:
        return {}, (1, 1)
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
    return attributes, (replicas, partitions)
