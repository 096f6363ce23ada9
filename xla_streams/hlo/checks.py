"""What XLA's parser checks across the statements of a computation, for the reader.

HLO text's define-before-use rule: every operand and control predecessor names an
earlier instruction of its computation, every called computation an earlier
computation (XLA: "instruction does not exist", "computation does not exist"), which
rules out every data or control cycle and every recursion. What XLA asks of async ops:
the shape of a start or update, and an update or done running what its start runs.
The reader reads the common cases itself; these read the rest.
"""

from __future__ import annotations

import re

from xla_streams.hlo.attributes import decode, parse_computation_names
from xla_streams.hlo.module import NO_OPERANDS, Computation, Instruction, Module, async_wrapped
from xla_streams.hlo.text import NAME, WHITESPACE, excerpt

TYPE_CHECKING = False  # not typing's: the front end imports nothing it need not
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import NoReturn

# Names in an operand list without nested brackets are read with one regex (the
# identifier runs: `%`, spaces and `#index` suffixes fall between).
_OPERAND_NAME = re.compile(rf"({NAME})(?:#[0-9]+)*")
# An attribute that names computations (all but control-predecessors) or instructions,
# and its value when a plain name or a braced list of them (else group 2 and 3 are None).
REFERENCE = re.compile(
    r",[ \t]*(to_apply|calls|body|condition|branch_computations|true_computation|"
    r"false_computation|called_computations|select|scatter|control-predecessors)=[ \t]*"
    rf"(?:%?({NAME})[ \t\r]*(?=,|$)|\{{([^{{}}\"/]*)\}}|)"
)
_COMPUTATION_KEYS = frozenset(
    ("to_apply", "calls", "body", "condition", "branch_computations", "true_computation",
     "false_computation", "called_computations", "select", "scatter")
)  # fmt: skip


# -- define-before-use --------------------------------------------------------------

# (the instruction, the control predecessors it names, where they are written)
ForwardControl = tuple["Instruction", list[str], int, int]


def check_operands(inst: Instruction, operands_start: int, end: int, defined: set[str]) -> int:
    """Every operand of ``inst`` is defined, for an operand list parse_module's test did
    not pass; returns where the list ends for the attribute scan: ``end``, its ")" when no
    bracket or comment is in it, or with ``end`` -1 (a tuple shape, a literal or a
    comment in it) its own closing bracket."""
    if end < 0:
        end = inst.operands_span[1]
        if inst.opcode in NO_OPERANDS:
            return end
    elif defined.issuperset(_OPERAND_NAME.findall(inst.source, operands_start, end)):
        return end  # e.g. `%t#1` (element 1 of `%t`, as jax >= 0.11 prints it)
    # The identifier runs include a shape's element type: only the exact reader can say
    # which operand is undefined, if any.
    if not defined.issuperset(inst.operand_names):
        _undefined(inst, "operand", inst.operand_names, defined, operands_start, end)
    return end


def check_attribute_references(
    inst: Instruction,
    hit: re.Match[str] | None,  # the first; None ends the loop
    end: int,
    defined: set[str],
    closed: set[str],
    forward: list[ForwardControl],
) -> None:
    """The computations ``inst`` names, from its first REFERENCE ``hit`` on: each must be
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
        hit = REFERENCE.search(line, hit.end())


def _check_attributes_exactly(
    inst: Instruction, defined: set[str], closed: set[str], forward: list[ForwardControl]
) -> None:
    """check_attribute_references with the attributes read exactly."""
    line = inst.source
    for key, value in inst.attributes.items():
        if key == "control-predecessors":
            names = _OPERAND_NAME.findall(value.strip(WHITESPACE).removeprefix("{"))
            if not defined.issuperset(names):
                at = line.find(f"{key}=", inst.operands_span[1]) + len(key) + 1
                forward.append((inst, names, at, at + len(value)))
        elif key in _COMPUTATION_KEYS:
            names = list(decode(inst, key, parse_computation_names) or ())
            if not closed.issuperset(names):
                at = line.find(f"{key}=", inst.operands_span[1]) + len(key) + 1
                _undefined_computation(inst, key, names, closed, at, at + len(value))


# An operand that names a tuple element of another instruction: `%x#1`.
_TUPLE_ELEMENT_OPERAND = re.compile(r"%[^\s,(){}#]+#\d")


def check_forward_control(comp: Computation, forward: list[ForwardControl]) -> None:
    """No cycle runs through the control predecessors printed after their user and the
    operands (every other edge is defined before use)."""
    names = {inst.name for inst in comp.instructions}
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
                raise inst.error_at(
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
                raise inst.error_at(
                    _name_at(inst.source, predecessors[0], start, len(inst.source)),
                    f"control predecessors of '%{inst.name}' close a cycle through it in "
                    f"computation '{comp.name}' (XLA: cycle)",
                )
            if name in seen or position[name] < target:
                continue
            seen.add(name)
            node = comp.instructions[position[name]]
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
    raise inst.error_at(
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
    raise inst.error_at(
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


# -- async ops ----------------------------------------------------------------------


def check_async_chains(module: Module, ops: list[Instruction]) -> None:
    """What XLA's parser asks of async ops: a start's and an update's shape is
    ``((operands), outputs, state...)``; an update or done that continues a start or
    update runs what it runs: the same wrapped opcode, computation and execution
    thread, where it names them."""
    comp = ops[0].computation
    for inst in ops:
        found = async_wrapped(inst.opcode)
        assert found is not None
        step, wrapped = found
        if step != "done":
            shape = inst.shape
            if not (shape.is_tuple and len(shape.tuple_shapes) >= 2
                    and shape.tuple_shapes[0].is_tuple):  # fmt: skip
                raise inst.error_at(
                    inst.source.find(inst.shape_text),
                    f"{inst.opcode} '%{inst.name}' has shape {excerpt(inst.shape_text)}: an "
                    "async start or update is '((operands), outputs, state...)' (XLA: "
                    "AsyncStart and AsyncUpdate expect the shape to be in that form)",
                )
        if step == "start":
            continue
        names = inst.operand_names
        previous = comp.get(names[0]) if len(names) == 1 else None
        chain = async_wrapped(previous.opcode) if previous is not None else None
        if previous is None or chain is None or chain[0] == "done":
            continue  # XLA's parser reads it (its verifier would not); pairing says more
        ran, ran_computation = _async_runs(module, previous)
        if wrapped and ran and wrapped != ran:
            raise inst.error_at(
                inst.operands_span[0] - 1 - len(inst.opcode),
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
        step, wrapped = async_wrapped(link.opcode) or ("", "")
        calls = _named(link, "calls")
        name = calls.strip().lstrip("%") if calls is not None else None
        if wrapped or name is not None or step == "start":
            if not wrapped and name is not None:
                called = module.computation(name)
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
    computation = op.computation
    link: Instruction | None = op
    while link is not None and async_wrapped(link.opcode) is not None:
        yield link
        if link.opcode.endswith("-start"):
            return
        names = link.operand_names
        link = computation.get(names[0]) if names else None
