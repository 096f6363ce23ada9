"""The async pairs of a module: every async collective start/done pair in every
computation, and when each is in flight.

:func:`find_async_pairs` reads the dedicated pairs (``all-reduce-start``/``-done`` ...),
wrapped ones in both spellings (``async-start(...), calls=%c`` around a collective or a
group of them, and the sugared ``reduce-scatter-start`` that ``compiled.as_text()``
prints) and send/recv, pipelined ones through a loop's tuple included. For each it
records the schedule positions, when it is in flight at every call of its computation
(a computation another thread runs, for the whole async call that runs it), where XLA
runs it (the :class:`StreamModel`), the global device ids of its groups, the bytes it
moves and a stream annotation it already has.

Not pairs, as XLA has it: host transfers (``is_host_transfer=true``: no device
collective, no stream), the links of a send/recv chain inside a loop (the chain is one
pair, from its first start to its last done), the sends and recvs an ``async-start``
groups (the group is the pair), a start in a fusion's computation (part of that
fusion's kernel).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from xla_streams.collectives import (
    COLLECTIVE_OPCODES,
    STREAM_ATTRIBUTE,
    Lane,
    StreamModel,
    device_groups,
)
from xla_streams.hlo import Computation, HloError, Instruction, Module
from xla_streams.hlo.attributes import (
    CONTROL_FLOW_CALLEES,
    control_flow_callees,
    decode,
    parse_backend_config,
    parse_computation_names,
    parse_frontend_attributes,
)
from xla_streams.hlo.text import excerpt
from xla_streams.option import ascii_integer

_DONE_OF_SEND_RECV = {"send-done": "send", "recv-done": "recv"}
_SEND_RECV = frozenset(_DONE_OF_SEND_RECV.values())
_GROUPED = COLLECTIVE_OPCODES | _SEND_RECV  # what an async-start may launch together
# The opcode of the start each done completes, and every start opcode: one lookup
# classifies an instruction (most are neither; every one is asked).
_START_OF_DONE = {
    **{f"{kind}-done": f"{kind}-start" for kind in COLLECTIVE_OPCODES},
    "async-done": "async-start",
    **_DONE_OF_SEND_RECV,
}
_STARTS = frozenset(_START_OF_DONE.values())
PIPELINE_ATTRIBUTE = "_xla_send_recv_pipeline"
# The async starts that run a computation (on another execution thread: windowed
# einsum's GEMMs, host offloading) while the caller goes on, and the attribute naming
# it: an async-start that runs no collective, and the sugared call-start.
ASYNC_CALLS = {"async-start": "calls", "call-start": "to_apply"}
_RUN_DONES = frozenset({"async-done", "call-done"})


@dataclass(frozen=True)
class AsyncPair:
    """One async collective: its start and done instructions and what it does.

    ``start_index``/``done_index`` are positions in the computation's schedule.
    ``occurrences`` are its (start, done) times in one execution of the whole
    program, one per call of its computation (callees laid out inside each
    calling instruction); two pairs are in flight together exactly when some
    occurrences intersect. ``start_time``/``done_time`` are the first one.
    ``lane`` is where XLA runs it (:class:`StreamModel`); ``annotation`` the
    ``_xla_stream_annotation`` the module already gave it, if any. ``key`` names it in
    a :class:`~xla_streams.streams.StreamAssignment`: its start's name, or, where
    another computation reuses that name (XLA scopes names per computation),
    ``computation/start``.
    """

    computation: str
    start: str
    done: str
    kind: str
    start_index: int
    done_index: int
    start_time: int
    done_time: int
    sync: bool
    pipelined: bool
    groups: tuple[tuple[int, ...], ...]
    bytes: int
    start_line: int = 0
    lane: Lane = "communication"
    annotation: int | None = None
    channel: int | None = None  # the channel_id of a send or recv
    occurrences: tuple[tuple[int, int], ...] = ()
    key: str = ""

    def __post_init__(self) -> None:
        if not self.occurrences:
            object.__setattr__(self, "occurrences", ((self.start_time, self.done_time),))
        if not self.key:
            object.__setattr__(self, "key", self.start)

    @property
    def needs_stream(self) -> bool:
        """It occupies one of the collective streams (the ones we assign)."""
        return self.lane == "communication"

    def overlaps(self, other: AsyncPair) -> bool:
        """True when both are in flight at some point of the execution."""
        return any(a < d and c < b for a, b in self.occurrences for c, d in other.occurrences)


def in_flight_order(pairs: Sequence[AsyncPair]) -> list[tuple[int, int, AsyncPair]]:
    """Every occurrence (start, done, pair) of ``pairs``, by start time: the order in
    which a sweep meets them (the pairs still in flight at a start are those
    earlier occurrences whose done is later)."""
    return sorted(((a, b, p) for p in pairs for a, b in p.occurrences), key=lambda o: (o[0], o[1]))


def max_in_flight(pairs: Sequence[AsyncPair]) -> int:
    """Largest number of the given pairs in flight at one time."""
    events = sorted(
        [(a, 1) for p in pairs for a, _ in p.occurrences]
        + [(b, -1) for p in pairs for _, b in p.occurrences]
    )
    best = current = 0
    for _, delta in events:
        current += delta
        best = max(best, current)
    return best


def check_scheduled(module: Module) -> None:
    """HloError unless ``module`` is scheduled: which collectives overlap is decided by
    the schedule, and before XLA's optimizations there is none yet."""
    if not module.is_scheduled:
        raise _line_error(
            module,
            module.header_line,
            "this module is not scheduled (no is_scheduled=true in its header): it looks "
            "like HLO before XLA's optimizations, as f.lower(...).as_text(dialect='hlo') "
            "prints it; give the compiled module instead: "
            "f.lower(...).compile().as_text(), or the *after_optimizations.txt file of an "
            "--xla_dump_to dump",
        )


def find_async_pairs(module: Module, model: StreamModel | None = None) -> list[AsyncPair]:
    """All pairs of the module, ordered by when they first start in the execution."""
    model = model or StreamModel()
    found: list[tuple[Computation, Instruction, Instruction, list[Instruction]]] = []
    # One pass over every instruction (a module has tens of thousands) finds, per
    # computation, the pairs, the starts and dones XLA's async-to-sync converter does
    # not count as work (see _work_before; send and recv aside), and where control flow
    # and async calls of other computations are (for execution_layout).
    not_work: dict[str, set[Instruction]] = {}
    control_flow: dict[Computation, list[int]] = {}
    calling: dict[Computation, list[int]] = {}
    for comp in module.computations:
        starts_done: set[str] = set()
        starts: list[tuple[int, Instruction]] = []
        async_ops: set[Instruction] = set()
        control_flow[comp] = flow = []
        calling[comp] = called = []
        for i, inst in enumerate(comp.instructions):
            opcode = inst.opcode
            if opcode in _STARTS:
                starts.append((i, inst))  # checked once every done has claimed its start
            elif opcode in _START_OF_DONE:
                pair = _start_of(inst, comp)
                if pair is None:
                    continue
                start, members = pair
                if start.name in starts_done:
                    raise inst.error(f"'%{start.name}' already has a done")
                starts_done.add(start.name)
                found.append((comp, start, inst, members))
                if opcode not in _DONE_OF_SEND_RECV:
                    async_ops.add(inst)
            elif opcode in CONTROL_FLOW_CALLEES:
                flow.append(i)
            elif opcode in ASYNC_CALLS:
                called.append(i)
        for i, inst in starts:
            # A start a done completes is one (an async-start's collectives were found
            # then). A send or recv no done completes is a link of a chain through a
            # loop (the chain is paired at its ends), one of a group an async-start
            # runs, or never completed (XLA's verifier takes a tuple as its user): no
            # pair of its own.
            if inst.name not in starts_done:
                if inst.opcode in _SEND_RECV:
                    continue
                if not _is_start(inst):
                    called.append(i)  # an async-start that runs no collective
                    continue
                if not _in_fusion(module, comp):
                    raise inst.error(f"async start '%{inst.name}' has no done in '{comp.name}'")
            if inst.opcode not in _SEND_RECV:
                async_ops.add(inst)
        if async_ops:
            not_work[comp.name] = async_ops
    layout = execution_layout(module, {comp.name for comp, _, _, _ in found}, control_flow, calling)
    # Schedule positions by instruction (not name: no cold string read per instruction).
    positions: dict[str, dict[Instruction, int]] = {}
    work: dict[str, list[int]] = {}
    pairs = []
    for comp, start, done, members in found:
        if comp.name not in positions:
            positions[comp.name] = {inst: i for i, inst in enumerate(comp.instructions)}
            work[comp.name] = _work_before(comp, not_work.get(comp.name, set()))
        position, before = positions[comp.name], work[comp.name]
        pairs.append(_pair(module, comp, start, done, members, position, before, layout, model))
    pairs.sort(key=lambda p: (p.start_time, p.start))
    return _keyed(pairs)


def _keyed(pairs: list[AsyncPair]) -> list[AsyncPair]:
    """``pairs``, each whose start's name another pair's start reuses (in another
    computation: XLA scopes names per computation) keyed ``computation/start``."""
    counts = Counter(p.start for p in pairs)
    if len(counts) == len(pairs):
        return pairs  # every name once: each pair's key is its start's name
    return [
        replace(p, key=f"{p.computation}/{p.start}") if counts[p.start] > 1 else p for p in pairs
    ]


def _in_fusion(module: Module, comp: Computation) -> bool:
    """Whether a fusion calls ``comp``: XLA emits it as that fusion's kernel, so an async
    start in it has no done of its own to wait for (a Triton collective fusion)."""
    return any(
        inst.opcode == "fusion" and inst.attribute("calls") in (comp.name, f"%{comp.name}")
        for inst in module.instructions()
    )


# The most call paths laid out from ENTRY to the computations holding pairs: a
# call graph that reaches them in more ways is refused rather than expanded (a
# tiny module can declare exponentially many), and no real program comes close.
MAX_CALL_PATHS = 100_000


@dataclass(frozen=True)
class Layout:
    """One execution of the program, on a clock that ticks at each instruction's
    start and end; callees of control flow run inside their calling instruction. A
    computation an async call runs (on another execution thread) runs beside its caller
    from the async start to its done, in an order XLA does not fix: each of its pairs
    is in flight, for the deadlock rule, during the whole call (a window)."""

    # computation -> ticks before each instruction starts (of those in ``wanted``, their
    # callers and any running control flow: no other is asked)
    offsets: dict[str, list[int]]
    bases: dict[str, list[int]]  # computation -> its start time at each call
    # computation -> the (start, done) times of each async call that runs it (its own,
    # or one of a caller that another thread runs)
    windows: dict[str, list[tuple[int, int]]]

    def times(self, computation: str, index: int) -> list[int]:
        """When instruction ``index`` of ``computation`` starts, at each call."""
        offset = self.offsets[computation][index]
        return [base + offset + 1 for base in self.bases[computation]]

    def occurrences(self, computation: str, start: int, done: int) -> list[tuple[int, int]]:
        """When a pair of ``computation`` at positions ``start`` < ``done`` is in flight,
        at each call: from its start to its done, or the window of an async call."""
        spans = zip(self.times(computation, start), self.times(computation, done), strict=True)
        return [*spans, *self.windows.get(computation, ())]


def instruction_times(
    module: Module, wanted: dict[str, list[int]]
) -> dict[tuple[str, int], tuple[list[int], list[tuple[int, int]]]]:
    """When each instruction of ``wanted`` (computation -> positions) runs, on the clock
    of the pairs' ``occurrences``: its tick at each call of its computation (a pair's
    occurrence ``(a, b)`` holds it exactly when ``a <= tick < b``: the instruction lies
    between the pair's start and done), and the windows of the async calls that run it
    on another thread (at some time inside each)."""
    control_flow: dict[Computation, list[int]] = {}
    calling: dict[Computation, list[int]] = {}
    for comp in module.computations:
        control_flow[comp] = flow = []
        calling[comp] = called = []
        for i, inst in enumerate(comp.instructions):
            opcode = inst.opcode
            if opcode in CONTROL_FLOW_CALLEES:
                flow.append(i)
            elif _calls_computation(inst):
                called.append(i)
    layout = execution_layout(module, set(wanted), control_flow, calling)
    return {
        (name, i): (layout.times(name, i), layout.windows.get(name, []))
        for name, positions in wanted.items()
        for i in positions
    }


def execution_layout(
    module: Module,
    wanted: set[str],
    control_flow: dict[Computation, list[int]],
    calling: dict[Computation, list[int]],
) -> Layout:
    """Lay the program out from ENTRY, every call site counted, for the computations
    in ``wanted`` (and those calling them). Computations not reached from ENTRY
    follow, once each, in text order. Iterative: call chains may be deep.
    ``control_flow``: each computation's control-flow instructions, by position;
    ``calling``: its async starts that run a computation (:data:`ASYNC_CALLS`), by
    position.
    """
    callees = {
        comp.name: _control_flow_callees(module, comp, control_flow[comp])
        for comp in module.computations
    }
    called_async = {
        comp.name: _async_calls(module, comp, calling[comp]) for comp in calling if calling[comp]
    }
    # The computations each one runs, by control flow or async call (most run none).
    edges: dict[str, list[str]] = {}
    for name, calls in callees.items():
        for called in calls.values():
            edges.setdefault(name, []).extend(called)
    for name, calls_of in called_async.items():
        for _, called in calls_of.values():
            edges.setdefault(name, []).extend(called)
    order = _callers_first(module, edges)
    relevant = set(wanted)  # these and their callers
    sizes: dict[str, int] = {}  # every computation's length in ticks
    # The offsets of the relevant computations and of those running control flow: the
    # others (most: fusions, reducers) are never asked when an instruction starts.
    offsets: dict[str, list[int]] = {}
    for name in reversed(order):  # callees first
        comp = module.computation(name)
        assert comp is not None
        calls, n = callees[name], len(comp.instructions)
        if name in edges and any(c in relevant for c in edges[name]):
            relevant.add(name)
        if not calls:  # no control flow (most computations): two ticks per instruction
            sizes[name] = 2 * n
            if name in relevant:
                offsets[name] = list(range(0, 2 * n, 2))
            continue
        ticks, starts = 0, []
        for i in range(n):
            starts.append(ticks)
            ticks += 2 + sum(sizes[c] for c in calls.get(i, ()))
        offsets[name], sizes[name] = starts, ticks
    bases: dict[str, list[int]] = {name: [] for name in order}
    windows: dict[str, list[tuple[int, int]]] = {}
    clock = 0
    reached = set(_reachable(module.entry.name, edges))
    roots = [module.entry.name] + [c.name for c in module.computations if c.name not in reached]
    for root in roots:
        if root in relevant and not bases[root]:
            bases[root].append(clock)
        clock += sizes[root]
    paths = 0
    for name in order:
        for base in bases[name]:
            for i, called in callees[name].items():
                at = base + offsets[name][i] + 1
                for callee in called:
                    if callee in relevant:
                        bases[callee].append(at)
                        paths += 1
                    at += sizes[callee]
        inherited = windows.get(name)
        if inherited:  # the callees of a computation another thread runs run in its window
            for callee in edges.get(name, ()):
                if callee in relevant:
                    windows.setdefault(callee, []).extend(inherited)
                    paths += len(inherited)
        for start, (done, called) in called_async[name].items() if name in called_async else ():
            if not any(callee in relevant for callee in called):
                continue  # it runs no pair
            begin = offsets[name][start] + 1
            end = sizes[name] if done is None else offsets[name][done] + 1
            spans = [(b + begin, b + end) for b in bases[name]]
            for callee in called:
                if callee in relevant:
                    windows.setdefault(callee, []).extend(spans)
                    paths += len(spans)
        if paths > MAX_CALL_PATHS:
            raise _module_error(
                module,
                f"the call graph reaches computation '{name}' and its callees in more than "
                f"{MAX_CALL_PATHS} ways; xla_streams lays out every call site and refuses this",
            )
    return Layout(offsets, bases, windows)


def _control_flow_callees(
    module: Module, comp: Computation, positions: list[int]
) -> dict[int, list[str]]:
    """Instruction index -> the computations it runs as control flow, for the control
    flow instructions at ``positions``."""
    result: dict[int, list[str]] = {}
    for i in positions:
        inst = comp.instructions[i]
        for key, callee in control_flow_callees(inst):
            if module.computation(callee) is None:
                raise inst.error_at_attribute(key, 0, f"unknown computation '{callee}'")
            result.setdefault(i, []).append(callee)
    return result


def async_calls(module: Module, comp: Computation) -> dict[int, tuple[int | None, list[str]]]:
    """Start index -> (done index, computations it runs), for each async start of
    ``comp`` that runs a computation rather than a collective (:data:`ASYNC_CALLS`). Without
    a done (XLA's verifier refuses that) the call runs to the computation's end: None."""
    positions = [i for i, inst in enumerate(comp.instructions) if _calls_computation(inst)]
    return _async_calls(module, comp, positions)


def _calls_computation(inst: Instruction) -> bool:
    """``inst`` is an async start that runs a computation rather than a collective."""
    return inst.opcode in ASYNC_CALLS and not (inst.opcode == "async-start" and _is_start(inst))


def _async_calls(
    module: Module, comp: Computation, positions: list[int]
) -> dict[int, tuple[int | None, list[str]]]:
    """:func:`async_calls` of the async starts at ``positions``."""
    starts = {comp.instructions[i].name: i for i in positions}
    done_of: dict[int, int] = {}
    for j, inst in enumerate(comp.instructions):
        if inst.opcode in _RUN_DONES and inst.operand_names:
            start = _async_head(inst, comp.get(inst.operand_names[0]), comp)
            if start is not None and start.name in starts:
                done_of[starts[start.name]] = j
    result: dict[int, tuple[int | None, list[str]]] = {}
    for i in positions:
        inst = comp.instructions[i]
        key = ASYNC_CALLS[inst.opcode]
        names = decode(inst, key, parse_computation_names) or ()
        for name in names:
            if module.computation(name) is None:
                raise inst.error_at_attribute(key, 0, f"unknown computation '{name}'")
        result[i] = (done_of.get(i), list(names))
    return result


def _async_head(
    done: Instruction, start: Instruction | None, comp: Computation
) -> Instruction | None:
    """The instruction an async done completes: its operand ``start``, through the
    async-update links that may sit between. Each is defined before its user
    (parse_module), so the chain ends; the hop count says so too."""
    hops = 0
    while start is not None and start.opcode.endswith("-update") and start.operand_names:
        hops += 1
        if hops > len(comp.instructions):
            raise done.error(f"the async-update chain of {done.opcode} '%{done.name}' loops")
        start = comp.get(start.operand_names[0])
    return start


def _callers_first(module: Module, edges: dict[str, list[str]]) -> list[str]:
    """Computations ordered so that every caller comes before its callees (``edges``:
    those each one calls, absent for none)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    post: list[str] = []
    for comp in module.computations:
        if comp.name in state:
            continue
        if comp.name not in edges:  # most computations: done at once, no stack
            state[comp.name] = 2
            post.append(comp.name)
            continue
        stack = [(comp.name, iter(edges[comp.name]))]
        state[comp.name] = 1
        while stack:
            name, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                state[name] = 2
                post.append(name)
            elif state.get(child) == 1:
                callee = module.computation(child)
                assert callee is not None
                raise _line_error(module, callee.line, f"computation '{child}' calls itself")
            elif child not in state:
                state[child] = 1
                stack.append((child, iter(edges.get(child, ()))))
    return post[::-1]


def _reachable(entry: str, edges: dict[str, list[str]]) -> Iterator[str]:
    seen = {entry}
    stack = [entry]
    while stack:
        name = stack.pop()
        yield name
        for c in edges.get(name, ()):
            if c not in seen:
                seen.add(c)
                stack.append(c)


def _module_error(module: Module, message: str) -> HloError:
    return _line_error(module, module.entry.line, message)


def _line_error(module: Module, line: int, message: str) -> HloError:
    return HloError(
        message, path=module.path, line=line, column=1, source_line=module.source_line(line)
    )


def _start_of(done: Instruction, comp: Computation) -> tuple[Instruction, list[Instruction]] | None:
    """The start that ``done`` completes and the collectives the pair runs (the start, or
    those an async-start wraps), or None when ``done`` is no collective's done."""
    opcode = done.opcode
    expected = _START_OF_DONE.get(opcode)
    if expected is None:
        return None
    names = done.operand_names
    if not names:
        raise done.error(f"{opcode} has no operand")
    start = _async_head(done, comp.get(names[0]), comp)
    if opcode in _DONE_OF_SEND_RECV:
        if done.attribute("is_host_transfer") == "true":
            return None  # a transfer to or from the host: no device collective
        element = _tuple_element(done, start, comp)
        if element is not None:
            source, index = element
            if source.opcode == "parameter":
                return None  # inside a loop's body: one link of a chain paired at its ends
            start = _chain_start(source, index, comp)
            if start is not None and start.opcode in _SEND_RECV and start.opcode != expected:
                # A recv-done reading a send's chain (XLA's verifier asks only for a
                # get-tuple-element): it completes no transfer of its own kind.
                return None
    if start is None or start.opcode != expected:
        if opcode in _DONE_OF_SEND_RECV and _is_pipelined(done):
            return None  # started in another iteration; XLA keeps it on its P2P stream
        found = f"'%{start.name}' ({start.opcode})" if start else f"'%{names[0]}'"
        raise done.error(
            f"the {expected} of {opcode} '%{done.name}' is missing: its operand is {found}"
        )
    if opcode != "async-done":
        return start, [start]
    members = _wrapped(start)
    if not members:
        return None  # an async computation that is not a collective
    return start, members


def _tuple_element(
    done: Instruction, operand: Instruction | None, comp: Computation
) -> tuple[Instruction, int] | None:
    """(tuple, index) when the context ``done`` takes is an element of a tuple: a
    get-tuple-element's, or (jax >= 0.11 dumps) ``%t#i``; None otherwise."""
    if operand is None:
        return None
    path = done.operand_refs[0][1]
    if path:
        return operand, path[0]
    if operand.opcode != "get-tuple-element":
        return None
    index = operand.attribute("index") or ""
    source = comp.get(operand.operand_names[0]) if index.isdigit() else None
    return None if source is None else (source, int(index))


def _chain_start(source: Instruction, index: int, comp: Computation) -> Instruction | None:
    """The first start of the send/recv chain whose context a done after a while loop
    reads (element ``index`` of ``source``), as XLA finds it
    (``FindCanonicalSendRecvStartOp``): the chain runs through the loop's tuple, started
    before the loop, done and started again in each iteration (links, no pairs of their
    own) and done after it, so it started with the same element of the loop's initial
    tuple. None when ``source`` is no while fed by a tuple."""
    if source.opcode != "while" or not source.operand_names:
        return None
    init = comp.get(source.operand_names[0])
    if init is None or init.opcode != "tuple" or index >= len(init.operand_names):
        return None
    return comp.get(init.operand_names[index])


def _is_start(inst: Instruction) -> bool:
    opcode = inst.opcode
    if opcode not in _STARTS:
        return False
    return opcode != "async-start" or bool(_wrapped(inst))


def _wrapped(start: Instruction) -> list[Instruction]:
    """The collectives an ``async-start(...), calls=%c`` runs: its computation's root
    when that is one; else every collective, send and recv of the computation (a
    collectives group, XLA's ``_collectives_group``, or grouped send/recv: several
    launched together, which XLA's deadlock check treats as one whose groups are all of
    theirs); none if not a collective at all."""
    names = decode(start, "calls", parse_computation_names)
    if names is None:
        raise start.error("async-start without calls=")
    callee = start.computation.module.computation(names[0]) if len(names) == 1 else None
    if callee is None:
        calls = start.attribute("calls")
        raise start.error_at_attribute("calls", 0, f"unknown computation '{calls}'")
    root = callee.root
    if root.opcode in COLLECTIVE_OPCODES:
        return [root]
    return [inst for inst in callee.instructions if inst.opcode in _GROUPED]


def _is_pipelined(inst: Instruction) -> bool:
    return PIPELINE_ATTRIBUTE in _frontend_attributes(inst)


def _frontend_attributes(inst: Instruction) -> dict[str, str]:
    return decode(inst, "frontend_attributes", parse_frontend_attributes) or {}


def _pair(
    module: Module,
    comp: Computation,
    start: Instruction,
    done: Instruction,
    members: list[Instruction],
    position: dict[Instruction, int],
    work: list[int],
    layout: Layout,
    model: StreamModel,
) -> AsyncPair:
    # ``members`` carry the collective's attributes: the start, the collective it
    # wraps, or (a collectives group) every collective it wraps; the group takes the
    # kind of its first and the device groups of all.
    op = members[0]
    kind = op.opcode.removesuffix("-start")
    start_index, done_index = position[start], position[done]
    if done_index <= start_index:
        raise done.error(f"'%{done.name}' is scheduled before its start '%{start.name}'")
    no_work_between = work[done_index] == work[start_index + 1]
    sync = (
        _is_sync(start)
        or any(m is not start and _is_sync(m) for m in members)
        or (not model.ffi and kind not in ("send", "recv") and no_work_between)
    )
    groups = device_groups(module, op, kind)
    if len(members) > 1:
        union = dict.fromkeys(groups)
        for member in members[1:]:
            union.update(dict.fromkeys(device_groups(module, member, member.opcode)))
        groups = tuple(union)
    channels = [_channel(m) for m in members]
    frontend = _frontend_attributes(start)  # decoded once: pipelined, and annotation below
    pipelined = PIPELINE_ATTRIBUTE in frontend
    occurrences = tuple(layout.occurrences(comp.name, start_index, done_index))
    first = occurrences[0] if occurrences else (0, 0)
    return AsyncPair(
        computation=comp.name,
        start=start.name,
        done=done.name,
        kind=kind,
        start_index=start_index,
        done_index=done_index,
        start_time=first[0],
        done_time=first[1],
        sync=sync,
        pipelined=pipelined,
        groups=groups,
        bytes=max(sum(s.byte_size for s in start.operand_shapes), done.shape.byte_size),
        start_line=start.line,
        lane=model.lane(sync=sync, pipelined=pipelined),
        annotation=_annotation(start, frontend),
        occurrences=occurrences,
        channel=channels[0] if kind in ("send", "recv") else None,
    )


# What XLA's async-to-sync converter (run after scheduling, so after our hook)
# treats as no work between a start and its done: then nothing overlaps the
# collective, and XLA makes it synchronous (GpuConvertAsyncCollectivesToSync).
_NO_WORK = frozenset({"parameter", "constant", "bitcast", "get-tuple-element"})


def _work_before(comp: Computation, async_ops: set[Instruction]) -> list[int]:
    """How many instructions before each position (and the end) XLA's converter counts
    as work; a pair with none between its start and done is made synchronous (send
    and recv aside: the converter leaves them alone). ``async_ops``: the computation's
    collective starts and dones but send's and recv's (found while pairing, so no
    instruction is classified twice). One pass per computation, so each pair's
    question costs O(1) however many are in flight."""
    counts = [0]
    n = 0
    for inst in comp.instructions:
        if inst.opcode not in _NO_WORK and inst not in async_ops:
            n += 1
        counts.append(n)
    return counts


def _channel(op: Instruction) -> int | None:
    """The channel_id: ASCII decimal digits (``str.isdigit`` alone takes superscripts and
    other scripts' digits, and ``int`` reads some of them)."""
    value = op.attribute("channel_id")
    if value is None:
        return None
    try:
        return ascii_integer(value, signed=False)
    except ValueError:
        raise op.error_at_attribute(
            "channel_id", 0, f"channel_id={excerpt(value)} is not a number (ASCII digits)"
        ) from None


# The most digits a stream annotation may have (K is at most MAX_STREAMS anyway).
_ANNOTATION_DIGITS = 6


def _annotation(start: Instruction, frontend: dict[str, str]) -> int | None:
    """The ``_xla_stream_annotation`` already on a start (a user's pin, or a stale one),
    from its decoded ``frontend`` attributes: ASCII decimal digits, as XLA reads it;
    anything else is an error at the value."""
    value = frontend.get(STREAM_ATTRIBUTE)
    if value is None:
        return None
    try:
        return ascii_integer(value, signed=False, most_digits=_ANNOTATION_DIGITS)
    except ValueError:
        raw = start.attribute("frontend_attributes") or ""
        at = raw.find(f"{STREAM_ATTRIBUTE}=")
        raise start.error_at_attribute(
            "frontend_attributes",
            at + len(STREAM_ATTRIBUTE) + 1 + raw.startswith('"', at + len(STREAM_ATTRIBUTE) + 1)
            if at >= 0
            else 0,
            f'{STREAM_ATTRIBUTE}="{excerpt(value)}" is not a stream number: expected '
            f"ASCII decimal digits, at most {_ANNOTATION_DIGITS}",
        ) from None


def _is_sync(inst: Instruction) -> bool:
    return bool(decode(inst, "backend_config", _says_sync))


@lru_cache(maxsize=64)  # collectives of one kind print the same config: decoded once
def _says_sync(backend_config: str) -> bool:
    collective = parse_backend_config(backend_config).get("collective_backend_config", {})
    return bool(isinstance(collective, dict) and collective.get("is_sync", False))
