"""Any HLO text XLA reads, in the layout XLA prints: one statement a line.

XLA's lexer skips spaces, line breaks and comments between any two tokens, and XLA
prints each statement on a line of its own: the ``HloModule`` header, a computation's
head up to its ``{``, each instruction, the ``}`` closing a computation with the
attributes after it. Tests and hand-written modules do not: they indent the header,
break an instruction or a header over lines, write ``f32[2, 3]`` or ``f32[2]{0}add(``.
The front end reads XLA's layout line by line, which a dump of tens of thousands of
lines needs to be fast; ``xla_layout`` rewrites any other text into it, each statement
with the anchors that map its characters back to where they were written, so that an
error points into the source.

A statement ends where XLA's grammar lets the next one start: its brackets, strings and
comments closed, not after a ``,`` or ``=``, and the next line not one that only
continues it (``, attribute=...``, or the rest of an instruction whose operand list has
not begun). One statement starting in the middle of another's line is not split off.

What XLA's parser makes of other forms is written as XLA would print it: an instruction
written inside another's operand list goes on its own before it (``constant.anon``), a
computation written inline (``to_apply={`` ending a line) before the computation that
holds it (``_``), and a shape XLA infers as plainly as a tuple's is written down. Each
statement keeps the source lines it was read from: untouched, it prints as written.
"""

from __future__ import annotations

import re
from bisect import bisect_right

from xla_streams.hlo.attributes import parse_int_list
from xla_streams.hlo.shape import parse_shape
from xla_streams.hlo.text import (
    NAME,
    WHITESPACE,
    ScanError,
    blank_comments,
    find_closing,
    operand_name,
    split_top_level,
)

_IDENTIFIER_END = r"(?![A-Za-z0-9_.\-])"
# What starts a statement, read from a line's first character that is no whitespace:
# in a computation an instruction, outside one the header or a computation's head.
_INSTRUCTION_START = re.compile(rf"(?:ROOT[ \t]+)?%?{NAME}[ \t]*=|ROOT{_IDENTIFIER_END}")
_HEADER_START = re.compile(rf"HloModule{_IDENTIFIER_END}")
_SECTION = re.compile(rf"(?:FileNames|FunctionNames|FileLocations|StackFrames){_IDENTIFIER_END}|\d")
_COMPUTATION_START = re.compile(rf"ENTRY{_IDENTIFIER_END}|%?{NAME}[ \t]*(?:[({{]|$)")
# A line that ends a statement whose brackets are still open: one that starts another
# beyond doubt (a `%name` no attribute value begins with), as XLA too would stop there.
_RESTART_INSIDE = re.compile(rf"(?:ROOT[ \t]+)?%{NAME}[ \t]*=")
_RESTART_OUTSIDE = re.compile(
    rf"HloModule{_IDENTIFIER_END}|ENTRY{_IDENTIFIER_END}|%{NAME}[ \t]*[({{]"
)
# `to_apply={`: a computation written inline, whose instructions start no statement
# (and where the `{` ends the line, are read as a computation of their own); the thread
# an async op runs it on.
_INLINE_COMPUTATION = re.compile(
    r"(?:to_apply|calls|body|condition|branch_computations|true_computation|false_computation)"
    r"[ \t]*=[ \t]*$"
)
_ASYNC_THREAD = re.compile(r',[ \t]*async_execution_thread=[ \t]*("[^"\\]*")')
# Where an instruction's shape is, and the opcode after it.
_HEAD = re.compile(rf"[ \t]*(?:ROOT[ \t]+)?%?{NAME}[ \t]*=[ \t]*")
_ARRAY = re.compile(r"[a-z][a-z0-9]*[ \t]*\[")
_BUFFER = re.compile(r"b[ \t]*\(")
_OPCODE = re.compile(r"[ \t]*([a-z][a-z0-9\-]*)[ \t]*\(")
_PRINTED_OPCODE = re.compile(r" [a-z][a-z0-9\-]*\(")
_SPACE_IN_BRACKETS = re.compile(r"[\[{][^\]} ]*+ ")
_MODULE_NAME = re.compile(rf"HloModule[ \t]+{NAME}(:)")  # `name:`, an older spelling
_COMPUTATION_NAME = re.compile(rf"(?:ENTRY[ \t]+)?%?({NAME})")
_INSTRUCTION_NAME = re.compile(rf"[ \t]*(ROOT[ \t]+)?%?({NAME})")
_QUOTE_OR_COMMENT = re.compile(r'"|/\*')
_INDEX = re.compile(r",[ \t]*index=([0-9]+)")
_CALLEE = re.compile(
    rf",[ \t]*(?:to_apply|true_computation|branch_computations)=[ \t]*\{{?[ \t]*%?({NAME})"
)
_ELEMENT_TYPE = re.compile(r"[a-z][a-z0-9]*")
_DOT_DIMENSIONS = re.compile(
    r",[ \t]*((?:lhs|rhs)_(?:batch|contracting)_dims)=[ \t]*(\{[0-9, \t]*\})"
)
# The opcodes whose shape XLA infers and this layout writes down: their result is
# shaped as one operand (the first but for select), or as below.
_SHAPED_AS_FIRST_OPERAND = frozenset((
    "abs", "add", "and", "atan2", "cbrt", "ceil", "copy", "cosine", "divide", "exponential",
    "exponential-minus-one", "floor", "log", "log-plus-one", "logistic", "maximum", "minimum",
    "multiply", "negate", "not", "opt-barrier", "or", "popcnt", "power", "remainder",
    "round-nearest-afz", "round-nearest-even", "rsqrt", "shift-left", "shift-right-arithmetic",
    "shift-right-logical", "sign", "sine", "sqrt", "subtract", "tan", "tanh", "while", "xor",
))  # fmt: skip
# What changes the scan's state: brackets, quotes, `=` and the `/` of a comment.
_SIGNIFICANT = re.compile(r'["(){}\[\]=/]')
_STRING_REST = re.compile(r'[^"\\]*+(?:\\.[^"\\]*+)*+"', re.DOTALL)

# Instructions inside instructions inside...: deeper than this they stay (and are refused).
_MAX_NESTING = 64
_Runs = list[tuple[int, int, int]]  # (offset in a statement, source line, source column)
_Entry = tuple[str, int, str | None]  # a statement, its first source line, as written

# Statement kinds; a scan is in code, a string or a /* comment */.
_HEADER, _COMPUTATION, _INSTRUCTION, _CLOSE, _OTHER = range(5)
_CODE, _STRING, _COMMENT = range(3)


class Anchors:
    """Where one statement's characters were written: ``(offset, line, column)`` for each
    run of them, from where it starts in the statement to where the next run does."""

    __slots__ = ("_runs",)

    def __init__(self, runs: list[tuple[int, int, int]]) -> None:
        self._runs = runs

    def locate(self, offset: int) -> tuple[int, int]:
        """The source line (1-based) and column (0-based) of the statement's ``offset``."""
        start, line, column = self._runs[0]
        for run in self._runs:
            if run[0] > offset:
                break
            start, line, column = run
        return line, column + offset - start


class Layout:
    """The statements of a text, each on one line, with the source line it starts on,
    the source lines it was read from as written (together they are the text), and the
    anchors of each one that is not its source line as written, by that line and its
    text (two start on one line where an instruction held another). ``written`` is None
    when the layout made statements of its own (an instruction written inside another,
    or a computation written inline, put on their own)."""

    __slots__ = ("anchors", "lines", "statements", "written")

    def __init__(
        self,
        statements: list[str],
        lines: list[int],
        written: list[str] | None,
        anchors: dict[tuple[int, str], Anchors],
    ) -> None:
        self.statements = statements
        self.lines = lines
        self.written = written
        self.anchors = anchors


def xla_layout(lines: list[str]) -> Layout | None:
    """The statements of the text ``lines`` hold, in XLA's layout; None when each line
    already is one (a text XLA printed: its errors are its own)."""
    out = _Output(lines)
    current: _Statement | None = None
    inside = False  # in a computation's body
    comment = 0  # the line of a /* comment */ between statements not closed yet
    for line_no, line in enumerate(lines, 1):
        if current is not None:
            if current.opens_inline_computation():
                out.open_inline(current, line_no - 1, inside)
                current, inside = None, True
            elif current.is_open() and not (
                current.mode == _CODE
                and not current.inline
                and (_RESTART_INSIDE if inside else _RESTART_OUTSIDE).match(
                    line, _skip_spaces(line, 0)
                )
            ):
                current.extend(line, line_no, 0)
                continue
            elif current.kind == _COMPUTATION and not current.is_open():
                inside = True
        col = 0
        if comment:
            close = line.find("*/")
            if close < 0:
                continue
            comment, col = 0, close + 2
        col = _skip_spaces(line, col)
        commented = col > 0 and not line[:col].isspace()
        while line.startswith("/*", col):  # a comment before a statement: skipped
            close = line.find("*/", col + 2)
            if close < 0:
                comment = line_no
                break
            col, commented = _skip_spaces(line, close + 2), True
        if comment or (commented and col == len(line)):
            continue  # a line of comment only
        if col == len(line) or line.startswith("//", col):
            out.trivia.append((line_no, line))
            continue
        if current is not None and line[col] == ",":
            out.trivia.clear()  # inside the statement: skipped, as XLA's lexer does
            current.extend(line, line_no, col)
            continue
        if inside:
            if line[col] == "}" and out.inline:
                out.finish(current)
                current, inside = out.close_inline(line, line_no, col)
                current.extend(line, line_no, col + 1)  # what follows the `}` is its
                continue
            if line[col] == "}":
                kind = _CLOSE
                inside = False
            elif _INSTRUCTION_START.match(line, col):
                kind = _INSTRUCTION
            elif current is not None and current.kind == _INSTRUCTION and not current.head_done:
                out.trivia.clear()
                current.extend(line, line_no, col)
                continue
            else:
                kind = _OTHER
        elif _HEADER_START.match(line, col):
            kind = _HEADER
        elif _SECTION.match(line, col) or not _COMPUTATION_START.match(line, col):
            kind = _OTHER
        else:
            kind = _COMPUTATION
        out.finish(current)
        current = _Statement(kind, line_no)
        current.extend(line, line_no, 0 if kind == _OTHER else col)
    out.finish(current)
    if comment:  # never closed: the line it opens on, for the reader to refuse
        out.statements.append((lines[comment - 1], comment, out.claim(comment)))
    elif not out.done and not out.hoisted and not out.statements:  # comments only
        out.statements.append(("", len(lines), ""))
    out.flush()
    statements = [text for text, _, _ in out.done]
    if statements == lines:
        return None
    starts = [line for _, line, _ in out.done]
    written = [text for _, _, text in out.done if text is not None]
    if len(written) < len(statements):
        return Layout(statements, starts, None, out.anchors)
    if out.written_to < len(lines):  # comment lines after the last statement
        written[-1] += "\n" + "\n".join(lines[out.written_to :])
    return Layout(statements, starts, written, out.anchors)


class _Output:
    """The statements read so far, each with its first source line and the source lines
    it was read from (where it is not that line as written, its anchors too); and the
    computations written inline that they are reading, each put on its own before the
    computation that holds it."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.done: list[_Entry] = []  # before the computation being read
        self.hoisted: list[_Entry] = []  # computations written inline in it
        self.statements: list[_Entry] = []  # of the computation, from its head
        self.anchors: dict[tuple[int, str], Anchors] = {}
        self.trivia: list[tuple[int, str]] = []  # blank and // lines after the statement
        self.written_to = 0  # the source lines so far read into statements
        self.instructions = _Instructions()
        # For each computation being read inline: the instruction that holds it, where
        # its `{` is, and the hoisted, statements and `inside` it was read in.
        self.inline: list[tuple[_Statement, int, int, list[_Entry], list[_Entry], bool]] = []

    def finish(self, statement: _Statement | None) -> None:
        if statement is not None:
            if statement.kind == _COMPUTATION:
                self.flush()
            made = self.instructions.read(statement.kind, *statement.text())
            for text, runs in made[:-1]:  # written inside the last
                self.put(text, runs, None)
            self.put(*made[-1], self.claim(statement.last_line))
        for line_no, line in self.trivia:
            self.statements.append((line, line_no, self.claim(line_no)))
        self.trivia.clear()

    def claim(self, line: int) -> str | None:
        """The source lines up to ``line`` not read into a statement yet, as written;
        None inside a computation written inline (the instruction holding it has them)."""
        if self.inline:
            return None
        written = "\n".join(self.lines[self.written_to : line])
        self.written_to = max(self.written_to, line)
        return written

    def flush(self) -> None:
        """The computation read so far is done: the ones written inline in it first."""
        self.done += self.hoisted
        self.done += self.statements
        self.hoisted, self.statements = [], []

    def put(self, statement: str, runs: _Runs, written: str | None) -> None:
        line = runs[0][1]
        self.statements.append((statement, line, written))
        if statement != self.lines[line - 1]:
            self.anchors[(line, statement)] = Anchors(runs)

    def open_inline(self, holder: _Statement, line_no: int, inside: bool) -> None:
        """``holder``, an instruction, ends line ``line_no`` with the `{` of a computation
        written inline (``to_apply={``): the computation is read on its own, and the
        holder names it (when it closes: XLA names the innermost first)."""
        brace = holder.inline_at
        holder.call_inline(line_no)
        self.finish(None)
        self.inline.append((holder, line_no, brace, self.hoisted, self.statements, inside))
        self.hoisted, self.statements = [], []
        self.instructions.enter()

    def close_inline(self, line: str, line_no: int, col: int) -> tuple[_Statement, bool]:
        """Line ``line_no`` closes, at ``col``, the computation read inline: it goes
        before the computation that holds it. Returns the holder and its `inside`."""
        name = self.instructions.leave()
        holder, open_line, brace, hoisted, statements, inside = self.inline.pop()
        holder.name_inline(name)
        body = self.statements
        self.statements = []
        self.put(f"%{name} {{", [(0, open_line, brace)], None)
        self.statements += body
        thread = _ASYNC_THREAD.search(line, col)  # the thread XLA runs it on
        close = f"}}, execution_thread={thread.group(1)}" if thread is not None else "}"
        self.put(close, [(0, line_no, col)], None)
        hoisted += self.hoisted  # what was written inline in it goes before it, too
        hoisted += self.statements
        self.hoisted, self.statements = hoisted, statements
        return holder, inside


class _Statement:
    """One statement being read: its text so far, where each run of it was written,
    and the state of XLA's lexer at its end."""

    __slots__ = (
        "depth",
        "head_done",
        "inline",
        "inline_at",
        "kind",
        "last",
        "last_line",
        "line",
        "mode",
        "parts",
        "runs",
        "seen_equal",
        "size",
    )

    def __init__(self, kind: int, line: int) -> None:
        self.kind = kind
        self.line = line
        self.last_line = line  # the last source line read into it
        self.parts: list[str] = []
        self.runs: list[tuple[int, int, int]] = []
        self.size = 0
        self.depth = 0  # of brackets; a computation's body counts as one
        self.mode = _CODE
        self.last = ""  # the last character of code (no whitespace, no comment)
        self.seen_equal = False  # an instruction's `=`
        self.head_done = False  # an instruction's operand list has begun
        self.inline = False  # it holds a computation written inline
        self.inline_at = -1  # the column of that computation's `{` on the last line read

    def is_open(self) -> bool:
        """Whether the next line must continue this statement, whatever it holds."""
        if self.mode != _CODE or self.last in (",", "="):
            return True
        if self.kind == _COMPUTATION:
            return self.depth != 1 or self.last != "{"
        return self.depth != 0 or (self.kind == _INSTRUCTION and not self.seen_equal)

    def opens_inline_computation(self) -> bool:
        """Whether its last line ends with the `{` of a computation written inline."""
        return self.inline_at >= 0 and self.mode == _CODE and self.last == "{" and self.depth == 1

    def call_inline(self, line_no: int) -> None:
        """Its last line opened a computation inline: its `{` (the statement's last
        character) becomes a `%` for the computation's name (``name_inline``)."""
        self.parts[-1] = self.parts[-1][:-1]
        self.size -= 1
        self._add("%", line_no, self.inline_at)
        self.depth, self.inline_at = 0, -1

    def name_inline(self, name: str) -> None:
        self.parts[-1] += name
        self.size += len(name)
        self.last = name[-1]

    def extend(self, line: str, line_no: int, col: int) -> None:
        """Add ``line[col:]`` (a source line, or its rest) to the statement, joined with a
        space where XLA prints one; without its `//` comment, trailing spaces and (but for
        a statement of no known kind, kept as written) indentation."""
        mode = self.mode
        first = not self.parts
        self.last_line = line_no
        if first and self.kind == _CLOSE:
            self._add("}", line_no, col)  # the body's brace: no part of the scan
            col += 1
        end = self._scan(line, col)
        if self.mode != _STRING:
            while end > col and line[end - 1] in WHITESPACE:
                end -= 1
        if mode == _STRING:  # a line break in a string, escaped as XLA unescapes it
            self._add("\\n", line_no, col)
        elif not (first and self.kind == _OTHER):
            col = _skip_spaces(line, col)
            if col >= end:
                return
            if first and self.kind == _INSTRUCTION:
                self._add("  ", line_no, col)  # XLA's indentation
            elif not first and (
                mode == _COMMENT or (self.parts[-1][-1] not in "([{ " and line[col] not in ")]},")
            ):
                self._add(" ", line_no, col)
        if col < end:
            self._add(line[col:end], line_no, col)

    def text(self) -> tuple[str, list[tuple[int, int, int]]]:
        """The statement on one line, and its runs (an instruction's shape aside)."""
        text, runs = "".join(self.parts), self.runs
        if self.kind == _INSTRUCTION:
            return text, runs
        if "/*" in text:  # XLA prints no comment outside instructions
            text, runs = _without_comments(text, runs)
        name = _MODULE_NAME.match(text) if self.kind == _HEADER else None
        if name is not None:
            text, runs = _rebuilt(text, runs, [(0, name.start(1)), (name.end(1), len(text))])
        return text, runs

    def _add(self, text: str, line: int, column: int) -> None:
        self.runs.append((self.size, line, column))
        self.parts.append(text)
        self.size += len(text)

    def _scan(self, line: str, pos: int) -> int:
        """Read ``line[pos:]`` as XLA's lexer would; returns where its code ends (a `//`
        comment runs to the end of the line)."""
        start, end = pos, len(line)
        self.inline_at = -1
        while pos < end:
            if self.mode == _STRING:
                m = _STRING_REST.match(line, pos)
                if m is None:
                    return end
                self.mode, pos = _CODE, m.end()
                continue
            if self.mode == _COMMENT:
                close = line.find("*/", pos)
                if close < 0:
                    return end
                self.mode, pos = _CODE, close + 2
                continue
            m = _SIGNIFICANT.search(line, pos)
            if m is None:
                break
            at = m.start()
            c = line[at]
            pos = at + 1
            if c == '"':
                self.mode = _STRING
            elif c == "/":
                if line.startswith("/*", at):
                    self.mode, pos = _COMMENT, at + 2
                elif line.startswith("//", at):
                    end = at
                    break
            elif c == "=":
                self.seen_equal = self.seen_equal or self.depth == 0
            elif c in "([{":
                if c == "(" and self.depth == 0 and self.seen_equal:
                    self.head_done = self.head_done or _ends_with_opcode(line, at)
                elif (
                    c == "{"
                    and self.depth == 0
                    and self.head_done
                    and _INLINE_COMPUTATION.search(line, max(0, at - 40), at)
                ):
                    self.inline, self.inline_at = True, at
                self.depth += 1
            else:
                self.depth -= 1
        code = line[start:end].rstrip(WHITESPACE)
        while code.endswith("*/") and "/*" in code:  # a comment is no code
            code = code[: code.rindex("/*")].rstrip(WHITESPACE)
        if code:
            self.last = code[-1]
        return end


class _Instructions:
    """Each instruction as XLA prints it: an instruction written inside another's
    operand list (``add(f32[] %a, s32[] constant(1))``) first, on its own, named as XLA
    names it (``constant.anon``); the shape without spaces inside it (but after a
    tuple's commas), one space before the opcode; and where the text gives no shape and
    XLA infers it as plainly as for a tuple (``%t = tuple(%a, %b)``), the one XLA infers,
    from the shapes of the instructions read so far and of the computations' roots."""

    def __init__(self) -> None:
        self.computation = ""
        self.shapes: dict[str, str] = {}  # instruction of the computation -> its shape text
        self.root = ""  # the ROOT's shape, else the last instruction's
        self.has_root = False
        self.roots: dict[str, str] = {}  # computation -> its root's shape text
        self.computations: set[str] = set()
        self.outer: list[tuple[str, dict[str, str], str, bool]] = []  # around inline ones
        self.suffixes: dict[str, int] = {}  # the last `.N` given to a generated name

    def unique(self, base: str, taken: set[str] | dict[str, str]) -> str:
        """``base`` or ``base.N``, the first not ``taken`` (as XLA's name uniquer)."""
        name, n = base, self.suffixes.get(base, 0)
        if n:
            name = f"{base}.{n}"
        while name in taken:
            n += 1
            name = f"{base}.{n}"
        self.suffixes[base] = n
        return name

    def inline_name(self) -> str:
        """A name for a computation written inline, as XLA names one: `_`, `_.1`, ..."""
        name = self.unique("_", self.computations)
        self.computations.add(name)
        return name

    def enter(self) -> None:
        """A computation written inline is read next, in the middle of the current one."""
        self.outer.append((self.computation, self.shapes, self.root, self.has_root))
        self.computation, self.shapes, self.root, self.has_root = "", {}, "", False

    def leave(self) -> str:
        """The computation written inline has been read: its name, as XLA names it."""
        name = self.inline_name()
        self.roots[name] = self.root
        self.computation, self.shapes, self.root, self.has_root = self.outer.pop()
        return name

    def read(self, kind: int, text: str, runs: _Runs) -> list[tuple[str, _Runs]]:
        """The statements that statement ``text`` is as XLA prints it, in order."""
        if kind == _COMPUTATION:
            name = _COMPUTATION_NAME.match(text)
            self.computation = name.group(1) if name is not None else ""
            self.computations.add(self.computation)
            self.shapes, self.root, self.has_root = {}, "", False
        elif kind == _CLOSE:
            self.roots[self.computation] = self.root
        elif kind == _INSTRUCTION:
            statements: list[tuple[str, _Runs]] = []
            self._instruction(text, runs, statements, 0)
            return statements
        return [(text, runs)]

    def _instruction(
        self, text: str, runs: _Runs, statements: list[tuple[str, _Runs]], depth: int
    ) -> None:
        """Append instruction ``text`` to ``statements``, after those nested in it."""
        head = _HEAD.match(text)
        try:
            end = _shape_end(text, head.end()) if head is not None else None
        except ScanError:
            head = None
        if head is None:
            statements.append((text, runs))  # the reader says what is wrong
            return
        start = head.end()
        opcode = _OPCODE.match(text, start if end is None else end)
        if opcode is not None and depth < _MAX_NESTING:
            text, runs = self._unnested(text, runs, opcode.end(), statements, depth)
        if end is None:
            shape = self._inferred(text, start)
            if shape is None:
                statements.append((text, runs))  # the reader says what is missing
                return
            text, runs = _rebuilt(
                text, runs, [(0, start), (shape + " ", start), (start, len(text))]
            )
        else:
            text, runs, shape = _canonical_shape(text, runs, start, end)
        name = _INSTRUCTION_NAME.match(text)
        if name is not None:
            self.shapes[name.group(2)] = shape
            if not self.has_root:
                self.root, self.has_root = shape, name.group(1) is not None
        statements.append((text, runs))

    def _unnested(
        self, text: str, runs: _Runs, operands: int, statements: list[tuple[str, _Runs]], depth: int
    ) -> tuple[str, _Runs]:
        """``text`` with each instruction nested in the operand list that starts at
        ``operands`` named instead, appended to ``statements`` on its own."""
        try:
            items = split_top_level(text, operands, find_closing(text, operands - 1))
        except ScanError:
            return text, runs
        pieces: list[tuple[int, int] | tuple[str, int]] = []
        kept = 0
        for a, b in items:
            nested = _nested_opcode(text, a, b)
            if nested is None:
                continue
            name = self.unique(f"{nested}.anon", self.shapes)
            self.shapes[name] = ""  # taken
            own = _rebuilt(text, runs, [(f"  %{name} = ", a), (a, b)])
            self._instruction(*own, statements, depth + 1)
            pieces += [(kept, a), (f"%{name}", a)]
            kept = b
        if not pieces:
            return text, runs
        pieces.append((kept, len(text)))
        return _rebuilt(text, runs, pieces)

    def _inferred(self, text: str, at: int) -> str | None:
        """The shape of the shapeless instruction whose opcode is at ``text[at]``."""
        opcode = _OPCODE.match(text, at)
        if opcode is None:
            return None
        op = opcode.group(1)
        if op == "after-all":
            return "token[]"
        if op in ("call", "conditional"):
            callee = _CALLEE.search(text, opcode.end())
            return self.roots.get(callee.group(1)) if callee is not None else None
        operands: list[str] = []
        try:
            close = find_closing(text, opcode.end() - 1)
            for a, b in split_top_level(text, opcode.end(), close):
                shape = self._operand_shape(blank_comments(text[a:b]).strip(WHITESPACE))
                if shape is None:
                    return None
                operands.append(shape)
        except ScanError:
            return None
        if op == "tuple":
            return "(" + ", ".join(operands) + ")"
        if not operands:
            return None
        first = operands[0]
        if op in _SHAPED_AS_FIRST_OPERAND:
            return first
        if op == "select" and len(operands) == 3:
            return operands[1]
        if op == "compare":
            return _ELEMENT_TYPE.sub("pred", first, count=1)
        if op == "dot" and len(operands) == 2:
            return _dot_shape(first, operands[1], text[close:])
        index = _INDEX.search(text, close)
        if op == "get-tuple-element" and index is not None and first.startswith("("):
            elements = split_top_level(first, 1, len(first) - 1)
            i = int(index.group(1))
            if i < len(elements):
                a, b = elements[i]
                return blank_comments(first[a:b]).strip(WHITESPACE)
        return None

    def _operand_shape(self, operand: str) -> str | None:
        """The shape of ``operand`` (`%name`, or `shape %name` as older XLA printed it)."""
        start, end = operand_name(operand)
        if start == end:
            return None
        typed = operand[:start].removesuffix("%").strip(WHITESPACE)
        return typed or self.shapes.get(operand[start:end]) or None


def _dot_shape(lhs: str, rhs: str, attributes: str) -> str | None:
    """The shape of a dot of shapes ``lhs`` and ``rhs``: the batch dimensions, then the
    others of ``lhs``, then those of ``rhs`` (XLA's ShapeInference::InferDotOpShape)."""
    try:
        dims = {key: parse_int_list(value) for key, value in _DOT_DIMENSIONS.findall(attributes)}
        left, right = parse_shape(lhs), parse_shape(rhs)
    except ScanError:
        return None
    if left.element_type is None or right.element_type is None:
        return None
    batch = dims.get("lhs_batch_dims", ())
    left_free = set(batch) | set(dims.get("lhs_contracting_dims", ()))
    right_free = set(dims.get("rhs_batch_dims", ())) | set(dims.get("rhs_contracting_dims", ()))
    if not all(d < len(left.dimensions) for d in left_free) or not all(
        d < len(right.dimensions) for d in right_free
    ):
        return None
    result = [left.dimensions[d] for d in batch]
    result += [n for d, n in enumerate(left.dimensions) if d not in left_free]
    result += [n for d, n in enumerate(right.dimensions) if d not in right_free]
    return f"{left.element_type}[{','.join(map(str, result))}]"


def _nested_opcode(text: str, start: int, end: int) -> str | None:
    """The opcode of the instruction ``text[start:end]`` is, an operand written as one
    (`s32[] constant(0)`, `add(%a, %b)`); None for an operand that names one."""
    if not text.endswith(")", start, end):
        return None
    try:
        shape_end = _shape_end(text, start)
    except ScanError:
        return None
    opcode = _OPCODE.match(text, start if shape_end is None else shape_end)
    return opcode.group(1) if opcode is not None else None


def _ends_with_opcode(line: str, at: int) -> bool:
    """Whether the `(` at ``line[at]`` follows an opcode: a word, but not the `b` of a
    buffer shape `b(...)` (a tuple shape's `(` follows the `=`)."""
    end = at
    while end > 0 and line[end - 1] in " \t":
        end -= 1
    start = end
    while start > 0 and (line[start - 1].isalnum() or line[start - 1] == "-"):
        start -= 1
    return start < end and line[start:end] != "b"


def _canonical_shape(
    text: str, runs: list[tuple[int, int, int]], start: int, end: int
) -> tuple[str, list[tuple[int, int, int]], str]:
    """``text``, an instruction whose shape is ``text[start:end]``, with that shape and
    the space before the opcode as XLA prints them; and the shape."""
    shape = text[start:end]
    if (
        _PRINTED_OPCODE.match(text, end)
        and "\t" not in shape
        and " " not in shape.replace(", ", "")
        and not _SPACE_IN_BRACKETS.search(shape)
    ):
        return text, runs, shape  # as XLA prints it (most instructions)
    pieces: list[tuple[int, int] | tuple[str, int]] = [(0, start)]
    depth = 0  # of [ and {: a comma outside them separates tuple elements
    run = start
    for i in range(start, end):
        c = text[i]
        if c in " \t":
            if run < i:
                pieces.append((run, i))
            run = i + 1
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
        elif c == "," and depth == 0:
            pieces.append((run, i + 1))
            pieces.append((" ", i + 1))
            run = i + 1
    if run < end:
        pieces.append((run, end))
    shape = "".join(text[a:b] if isinstance(a, int) else a for a, b in pieces[1:])
    opcode = _OPCODE.match(text, end)
    if opcode is None:
        return text, runs, shape  # the reader says what is missing
    pieces.append((" ", opcode.start(1)))
    pieces.append((opcode.start(1), opcode.end(1)))
    pieces.append((opcode.end() - 1, len(text)))
    canonical, canonical_runs = _rebuilt(text, runs, pieces)
    return (text, runs, shape) if canonical == text else (canonical, canonical_runs, shape)


def _shape_end(text: str, start: int) -> int | None:
    """Where the shape at ``text[start]`` ends; None if no shape starts there."""
    if text.startswith("(", start):
        return find_closing(text, start) + 1
    buffer = _BUFFER.match(text, start)
    if buffer is not None:
        return find_closing(text, buffer.end() - 1) + 1
    array = _ARRAY.match(text, start)
    if array is None:
        return None
    end = find_closing(text, array.end() - 1) + 1
    layout = _skip_spaces(text, end)
    if text.startswith("{", layout):
        return find_closing(text, layout) + 1
    return end


def _without_comments(
    text: str, runs: list[tuple[int, int, int]]
) -> tuple[str, list[tuple[int, int, int]]]:
    """``text`` with each ``/*...*/`` (not in a string) a space."""
    pieces: list[tuple[int, int] | tuple[str, int]] = []
    kept = pos = 0
    while (m := _QUOTE_OR_COMMENT.search(text, pos)) is not None:
        if m.group() == '"':
            string = _STRING_REST.match(text, m.end())
            if string is None:
                break
            pos = string.end()
            continue
        close = text.find("*/", m.end())
        if close < 0:
            break
        pieces += [(kept, m.start()), (" ", m.start())]
        kept = pos = close + 2
    pieces.append((kept, len(text)))
    return _rebuilt(text, runs, pieces)


def _rebuilt(
    text: str,
    runs: list[tuple[int, int, int]],
    pieces: list[tuple[int, int] | tuple[str, int]],
) -> tuple[str, list[tuple[int, int, int]]]:
    """The text of ``pieces`` with its runs: each piece a span of ``text``, or a string
    put where the character at an offset of ``text`` was written, in increasing order
    of offset (so that one pass over the runs places them all)."""
    parts: list[str] = []
    new_runs: list[tuple[int, int, int]] = []
    size = 0
    first = pieces[0][1] if isinstance(pieces[0][0], str) else pieces[0][0]
    j = max(0, bisect_right(runs, first, key=_offset) - 1)  # the run holding the offset
    for a, b in pieces:
        at = b if isinstance(a, str) else a
        while j + 1 < len(runs) and runs[j + 1][0] <= at:
            j += 1
        start, line, column = runs[j]
        new_runs.append((size, line, column + at - start))
        if isinstance(a, str):
            parts.append(a)
            size += len(a)
            continue
        while j + 1 < len(runs) and runs[j + 1][0] < b:
            j += 1
            new_runs.append((size + runs[j][0] - a, runs[j][1], runs[j][2]))
        parts.append(text[a:b])
        size += b - a
    return "".join(parts), new_runs


def _offset(run: tuple[int, int, int]) -> int:
    return run[0]


def _skip_spaces(line: str, col: int) -> int:
    while col < len(line) and line[col] in WHITESPACE:
        col += 1
    return col
