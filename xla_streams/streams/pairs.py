"""The async pairs of a module: every async collective start/done pair in every
computation, and when each is in flight.

:func:`find_async_pairs` reads the dedicated pairs (``all-reduce-start``/``-done`` ...),
wrapped ones in both spellings (``async-start(...), calls=%c`` around a collective,
and the sugared ``reduce-scatter-start`` that ``compiled.as_text()`` prints) and
send/recv. For each it records the schedule positions, when it is in flight at every
call of its computation, where XLA runs it (the :class:`StreamModel`), the global
device ids of its groups, the bytes it moves and a stream annotation it already has.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

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

_DONE_OF_SEND_RECV = {"send-done": "send", "recv-done": "recv"}
_SEND_RECV = frozenset(_DONE_OF_SEND_RECV.values())
# The opcode of the start each done completes, and every start opcode: one lookup
# classifies an instruction (most are neither; every one is asked).
_START_OF_DONE = {
    **{f"{kind}-done": f"{kind}-start" for kind in COLLECTIVE_OPCODES},
    "async-done": "async-start",
    **_DONE_OF_SEND_RECV,
}
_STARTS = frozenset(_START_OF_DONE.values())
PIPELINE_ATTRIBUTE = "_xla_send_recv_pipeline"


@dataclass(frozen=True)
class AsyncPair:
    """One async collective: its start and done instructions and what it does.

    ``start_index``/``done_index`` are positions in the computation's schedule.
    ``occurrences`` are its (start, done) times in one execution of the whole
    program, one per call of its computation (callees laid out inside each
    calling instruction); two pairs are in flight together exactly when some
    occurrences intersect. ``start_time``/``done_time`` are the first one.
    ``lane`` is where XLA runs it (:class:`StreamModel`); ``annotation`` the
    ``_xla_stream_annotation`` the module already gave it, if any.
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

    def __post_init__(self) -> None:
        if not self.occurrences:
            object.__setattr__(self, "occurrences", ((self.start_time, self.done_time),))

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
    # is (for execution_layout).
    not_work: dict[str, set[Instruction]] = {}
    control_flow: dict[Computation, list[int]] = {}
    for comp in module.computations:
        starts_done: set[str] = set()
        starts: list[Instruction] = []
        async_ops: set[Instruction] = set()
        control_flow[comp] = flow = []
        for i, inst in enumerate(comp.instructions):
            opcode = inst.opcode
            if opcode in _STARTS:
                starts.append(inst)  # checked once every done has claimed its start
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
        for inst in starts:
            # A start a done completes is one (an async-start's collectives were found
            # then); any other start must be one a later iteration completes.
            if inst.name not in starts_done:
                if not _is_start(inst):
                    continue  # an async-start that runs no collective
                if not _is_pipelined(inst):
                    raise inst.error(f"async start '%{inst.name}' has no done in '{comp.name}'")
            if inst.opcode not in _SEND_RECV:
                async_ops.add(inst)
        if async_ops:
            not_work[comp.name] = async_ops
    layout = execution_layout(module, {comp.name for comp, _, _, _ in found}, control_flow)
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
    return pairs


# The most call paths laid out from ENTRY to the computations holding pairs: a
# call graph that reaches them in more ways is refused rather than expanded (a
# tiny module can declare exponentially many), and no real program comes close.
MAX_CALL_PATHS = 100_000


@dataclass(frozen=True)
class Layout:
    """One execution of the program, on a clock that ticks at each instruction's
    start and end; callees of control flow run inside their calling instruction."""

    # computation -> ticks before each instruction starts (of those in ``wanted``, their
    # callers and any running control flow: no other is asked)
    offsets: dict[str, list[int]]
    bases: dict[str, list[int]]  # computation -> its start time at each call

    def times(self, computation: str, index: int) -> list[int]:
        """When instruction ``index`` of ``computation`` starts, at each call."""
        offset = self.offsets[computation][index]
        return [base + offset + 1 for base in self.bases[computation]]


def execution_layout(
    module: Module, wanted: set[str], control_flow: dict[Computation, list[int]]
) -> Layout:
    """Lay the program out from ENTRY, every call site counted, for the computations
    in ``wanted`` (and those calling them). Computations not reached from ENTRY
    follow, once each, in text order. Iterative: call chains may be deep.
    ``control_flow``: each computation's control-flow instructions, by position.
    """
    callees = {
        comp.name: _control_flow_callees(module, comp, control_flow[comp])
        for comp in module.computations
    }
    order = _callers_first(module, callees)
    relevant = set(wanted)  # these and their callers
    sizes: dict[str, int] = {}  # every computation's length in ticks
    # The offsets of the relevant computations and of those running control flow: the
    # others (most: fusions, reducers) are never asked when an instruction starts.
    offsets: dict[str, list[int]] = {}
    for name in reversed(order):  # callees first
        comp = module.computation(name)
        assert comp is not None
        calls, n = callees[name], len(comp.instructions)
        if not calls:  # no control flow (most computations): two ticks per instruction
            sizes[name] = 2 * n
            if name in relevant:
                offsets[name] = list(range(0, 2 * n, 2))
            continue
        if any(c in relevant for cs in calls.values() for c in cs):
            relevant.add(name)
        ticks, starts = 0, []
        for i in range(n):
            starts.append(ticks)
            ticks += 2 + sum(sizes[c] for c in calls.get(i, ()))
        offsets[name], sizes[name] = starts, ticks
    bases: dict[str, list[int]] = {name: [] for name in order}
    clock = 0
    reached = set(_reachable(module.entry.name, callees))
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
        if paths > MAX_CALL_PATHS:
            raise _module_error(
                module,
                f"the call graph reaches computation '{name}' and its callees in more than "
                f"{MAX_CALL_PATHS} ways; xla_streams lays out every call site and refuses this",
            )
    return Layout(offsets, bases)


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


def _callers_first(module: Module, callees: dict[str, dict[int, list[str]]]) -> list[str]:
    """Computations ordered so that every caller comes before its callees."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    post: list[str] = []
    for comp in module.computations:
        if comp.name in state:
            continue
        if not callees[comp.name]:  # most computations: done at once, no stack
            state[comp.name] = 2
            post.append(comp.name)
            continue
        stack = [(comp.name, iter([c for cs in callees[comp.name].values() for c in cs]))]
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
                stack.append((child, iter([c for cs in callees[child].values() for c in cs])))
    return post[::-1]


def _reachable(entry: str, callees: dict[str, dict[int, list[str]]]) -> Iterator[str]:
    seen = {entry}
    stack = [entry]
    while stack:
        name = stack.pop()
        yield name
        for called in callees[name].values():
            for c in called:
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
    start = comp.get(names[0])
    # async-update links may sit between the start and the done. Each is defined
    # before its user (parse_module), so the chain ends; the hop count says so too.
    hops = 0
    while start is not None and start.opcode.endswith("-update") and start.operand_names:
        hops += 1
        if hops > len(comp.instructions):
            raise done.error(f"the async-update chain of {opcode} '%{done.name}' loops")
        start = comp.get(start.operand_names[0])
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


def _is_start(inst: Instruction) -> bool:
    opcode = inst.opcode
    if opcode not in _STARTS:
        return False
    return opcode != "async-start" or bool(_wrapped(inst))


def _wrapped(start: Instruction) -> list[Instruction]:
    """The collectives an ``async-start(...), calls=%c`` runs: its computation's root
    when that is one; else every collective of the computation (a collectives group,
    XLA's ``_collectives_group``: several collectives launched together, which XLA's
    deadlock check treats as one whose groups are all of theirs); none if not a
    collective at all."""
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
    return [inst for inst in callee.instructions if inst.opcode in COLLECTIVE_OPCODES]


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
    occurrences = tuple(
        zip(layout.times(comp.name, start_index), layout.times(comp.name, done_index), strict=True)
    )
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
    if not (value.isascii() and value.isdigit()) or len(value) > 18:
        raise op.error_at_attribute(
            "channel_id", 0, f"channel_id={excerpt(value)} is not a number (ASCII digits)"
        )
    return int(value)


# The most digits a stream annotation may have (K is at most MAX_STREAMS anyway).
_ANNOTATION_DIGITS = 6


def _annotation(start: Instruction, frontend: dict[str, str]) -> int | None:
    """The ``_xla_stream_annotation`` already on a start (a user's pin, or a stale one),
    from its decoded ``frontend`` attributes: ASCII decimal digits, as XLA reads it;
    anything else is an error at the value."""
    value = frontend.get(STREAM_ATTRIBUTE)
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > _ANNOTATION_DIGITS:
        raw = start.attribute("frontend_attributes") or ""
        at = raw.find(f"{STREAM_ATTRIBUTE}=")
        raise start.error_at_attribute(
            "frontend_attributes",
            at + len(STREAM_ATTRIBUTE) + 1 + raw.startswith('"', at + len(STREAM_ATTRIBUTE) + 1)
            if at >= 0
            else 0,
            f'{STREAM_ATTRIBUTE}="{excerpt(value)}" is not a stream number: expected '
            f"ASCII decimal digits, at most {_ANNOTATION_DIGITS}",
        )
    return int(value)


def _is_sync(inst: Instruction) -> bool:
    config = decode(inst, "backend_config", parse_backend_config)
    if config is None:
        return False
    collective = config.get("collective_backend_config", {})
    return bool(isinstance(collective, dict) and collective.get("is_sync", False))
