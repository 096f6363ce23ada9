"""What the code knows about collectives: each kind (:data:`KINDS`), the devices an
instruction involves (:func:`device_groups`), where XLA runs it
(:class:`StreamModel`), the async pairs and when they are in flight, and the
stream assignment made for them.

The deadlock rule, in one predicate (:meth:`AsyncPair.must_share_stream_with`):
NCCL kernels on different streams may execute in different orders on different
ranks, so two collectives that occupy communication streams, are in flight at
the same time and whose device groups share two or more devices must sit on one
stream. ``verify-streams`` checks it independently of how the assignment was made.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Literal

from xla_streams.hlo import Instruction, Module
from xla_streams.hlo.attributes import (
    Groups,
    decode,
    parse_frontend_attributes,
    parse_replica_groups,
    parse_source_target_pairs,
)
from xla_streams.hlo.text import ScanError

Policy = Literal["interval", "round-robin"]
POLICIES: tuple[Policy, ...] = ("interval", "round-robin")
DEFAULT_POLICY: Policy = "interval"
MAX_STREAMS = 64
DEFAULT_STREAMS = 4  # K when the user turns the plugin on without saying how many
STREAM_COUNTS = (1, 2, 4, 8)  # the K that predictions and searches compare


def check_streams(value: object) -> int:
    """``value`` as a number of collective streams K; ValueError (one message for every
    front end, which names where the value came from) unless an integer in 1..64."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_STREAMS:
        raise ValueError(
            f"the number of collective streams must be an integer from 1 to {MAX_STREAMS}, "
            f"not {value!r}"
        )
    return value


@dataclass(frozen=True)
class Kind:
    """What the code knows about one kind of collective; :data:`KINDS` has them all.

    Adding a kind is one row here, plus whatever is truly new about it (a cost
    formula, a runtime kernel).
    """

    name: str  # its opcode as a plain collective ("all-gather"); "send"/"recv" for p2p
    # How its start is spelled: "<name>-start" (dedicated), "async-start(...),
    # calls=" around it (wrapped; printed sugared as "<name>-start"), or send/recv.
    async_form: Literal["dedicated", "wrapped", "p2p"]
    # Where its devices come from: replica_groups; (source, target) pairs, in
    # source_target_pairs or (send/recv) a frontend attribute.
    groups: Literal["replica_groups", "pairs"]
    # It has a use_global_device_ids field (without it, channel_id means
    # replica-and-partition groups, not partition groups).
    global_ids_field: bool
    # The cost model's algorithm family (simulate/cost.py).
    cost: Literal["all-reduce", "ring", "pairwise", "one-hop", "broadcast"]
    reduces: bool  # it has a reduction (to_apply)
    ffi: bool  # our runtime runs it (lower-to-ffi, asyncify, csrc/)
    color: str  # its colour in timelines


_ROWS = (  # name, async form, groups, global-ids field, cost family, reduces, ffi, colour
    Kind("all-reduce", "dedicated", "replica_groups", True, "all-reduce", True, True, "#b07aa1"),
    Kind("all-gather", "dedicated", "replica_groups", True, "ring", False, True, "#59a14f"),
    Kind("reduce-scatter", "wrapped", "replica_groups", True, "ring", True, True, "#f28e2b"),
    Kind("all-to-all", "wrapped", "replica_groups", False, "pairwise", False, True, "#edc948"),
    Kind("ragged-all-to-all", "wrapped", "replica_groups", False, "pairwise", False, False,
         "#edc948"),
    Kind("collective-permute", "dedicated", "pairs", False, "one-hop", False, True, "#9c755f"),
    Kind("collective-broadcast", "wrapped", "replica_groups", False, "broadcast", False, False,
         "#ff9da7"),
    Kind("send", "p2p", "pairs", False, "one-hop", False, False, "#9c755f"),
    Kind("recv", "p2p", "pairs", False, "one-hop", False, False, "#9c755f"),
)  # fmt: skip
KINDS: dict[str, Kind] = {k.name: k for k in _ROWS}
# The opcodes of plain collectives (send and recv are never plain).
COLLECTIVE_OPCODES = frozenset(k.name for k in KINDS.values() if k.async_form != "p2p")


# The frontend attribute XLA:GPU reads to run a collective on communication_stream[k].
STREAM_ATTRIBUTE = "_xla_stream_annotation"

# Where XLA runs a sync pair that is on the communication lane, annotated or not.
SYNC_PAIR_STREAM = 0

# Where a collective runs on the GPU.
Lane = Literal["communication", "compute", "p2p"]


@dataclass(frozen=True)
class StreamModel:
    """Where XLA runs each collective, given how the module was compiled.

    The one place that says it (measured with XLA's thunk-sequence dumps,
    deviceless; see DESIGN.md):

    - an async pair runs on ``communication_stream[k]``, k its
      ``_xla_stream_annotation`` (default 0);
    - a pipelined send/recv runs on XLA's own P2P stream;
    - a plain (synchronous) collective runs on the compute stream;
    - a *sync pair* (``is_sync``, or one XLA will make sync after scheduling
      because nothing but no-ops lies between start and done) runs on the
      compute stream on jax >= 0.11 and with the overlap limit at 1; XLA 0.10.2
      with the limit above 1 runs it as an async thunk on
      ``communication_stream[0]`` (XLA PR 40520), where it takes part in the
      deadlock rule, pinned to stream 0.

    With ``ffi``, our runtime runs the collectives instead of XLA: every pair
    runs on its assigned stream, and XLA makes none synchronous.

    ``overlap_limit`` is the ``xla_gpu_experimental_parallel_collective_overlap_limit``
    the module was compiled with, 0 when unknown; ``sync_on_compute`` says the
    module comes from jax >= 0.11. The defaults are the safe assumption for a
    module whose settings are unknown: sync pairs occupy stream 0.
    """

    overlap_limit: int = 0
    sync_on_compute: bool = False
    ffi: bool = False

    def lane(self, *, sync: bool, pipelined: bool) -> Lane:
        if pipelined:
            return "p2p"
        if sync and not self.ffi and (self.sync_on_compute or self.overlap_limit == 1):
            return "compute"
        return "communication"


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
    _group_sets: tuple[frozenset[int], ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_group_sets", tuple(frozenset(g) for g in self.groups))
        if not self.occurrences:
            object.__setattr__(self, "occurrences", ((self.start_time, self.done_time),))

    @property
    def needs_stream(self) -> bool:
        """It occupies one of the collective streams (the ones we assign)."""
        return self.lane == "communication"

    def overlaps(self, other: AsyncPair) -> bool:
        """True when both are in flight at some point of the execution."""
        return any(a < d and c < b for a, b in self.occurrences for c, d in other.occurrences)

    def shares_devices_with(self, other: AsyncPair) -> bool:
        """The deadlock rule's test: some group of each shares two or more devices."""
        return any(len(a & b) >= 2 for a in self._group_sets for b in other._group_sets)

    def must_share_stream_with(self, other: AsyncPair) -> bool:
        """Both in flight together and sharing two devices: on different streams NCCL
        could run them in different orders on different ranks, and hang. Or the two
        halves of one permute (see :meth:`halves_of_one_permute`)."""
        return self.halves_of_one_permute(other) or (
            self.overlaps(other) and self.shares_devices_with(other)
        )

    def halves_of_one_permute(self, other: AsyncPair) -> bool:
        """A send and the recv of the same channel: one transfer, whose two halves stay on
        one stream whether or not they overlap, since some XLA versions key the NCCL
        communicator by stream, and a send posted on one stream never meets a recv
        posted on another."""
        return (
            {self.kind, other.kind} == {"send", "recv"}
            and self.channel is not None
            and self.channel == other.channel
        )


@dataclass(frozen=True)
class StreamAssignment:
    """The collective stream of each pair (by start name); None off the communication lane.

    ``reassigned`` maps a pair whose annotation in the module could not be kept
    to why (a stream >= K, or pins the deadlock rule cannot honour).
    """

    streams: int
    policy: Policy
    stream_of: dict[str, int | None]
    serialized_by_bound: frozenset[str] = frozenset()
    serialized_by_rule: frozenset[str] = frozenset()
    reassigned: dict[str, str] = field(default_factory=dict)

    @property
    def serialized(self) -> frozenset[str]:
        return self.serialized_by_bound | self.serialized_by_rule

    @property
    def streams_used(self) -> int:
        return len({s for s in self.stream_of.values() if s is not None})


def in_flight_order(
    pairs: list[AsyncPair] | tuple[AsyncPair, ...],
) -> list[tuple[int, int, AsyncPair]]:
    """Every occurrence (start, done, pair) of ``pairs``, by start time: the order in
    which a sweep meets them (the pairs still in flight at a start are those
    earlier occurrences whose done is later)."""
    return sorted(((a, b, p) for p in pairs for a, b in p.occurrences), key=lambda o: (o[0], o[1]))


def max_in_flight(pairs: list[AsyncPair] | tuple[AsyncPair, ...]) -> int:
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


# -- device groups -------------------------------------------------------------------


def device_groups(module: Module, op: Instruction, kind: str) -> Groups:
    """The groups of global device ids (replica * num_partitions + partition) of ``op``.

    Follows XLA's collective group modes: without channel_id the ids are replicas;
    with one they are partitions, or with ``use_global_device_ids`` global ids.
    Permutes and send/recv give each source/target pair as a group.
    """
    _check_spelling(op)
    replicas, partitions = module.replica_count, module.num_partitions
    has_channel = op.attribute("channel_id") is not None
    if KINDS[kind].groups == "pairs":
        if KINDS[kind].async_form == "p2p":
            pairs = _send_recv_pairs(op)
        else:
            pairs = decode(op, "source_target_pairs", parse_source_target_pairs)
        if pairs is None:
            raise op.error(f"{op.opcode} without source_target_pairs")
        groups: Groups = tuple(pairs)
        mode = "partition" if has_channel else "replica"
    else:
        groups = decode(op, "replica_groups", parse_replica_groups) or ()
        global_ids = op.attribute("use_global_device_ids") == "true"
        if not has_channel:
            mode = "replica"
        elif global_ids:
            mode = "global"
        elif KINDS[kind].global_ids_field:
            mode = "replica-and-partition"
        else:
            mode = "partition"
    return _to_device_ids(op, groups, mode, replicas, partitions)


# The attributes that decide a collective's devices: a misspelled one would silently
# change the group mode (no channel_id: replica groups), so a near miss is an error.
_GROUP_ATTRIBUTES = ("channel_id", "replica_groups", "use_global_device_ids", "source_target_pairs")


def _check_spelling(op: Instruction) -> None:
    for key in op.attributes:
        if key in _GROUP_ATTRIBUTES:
            continue
        close = difflib.get_close_matches(key, _GROUP_ATTRIBUTES, n=1, cutoff=0.8)
        if close and op.attribute(close[0]) is None:
            raise op.error_at_attribute(
                key, -len(key) - 1, f"unknown attribute '{key}': did you mean '{close[0]}'?"
            )


def _send_recv_pairs(op: Instruction) -> tuple[tuple[int, int], ...] | None:
    attributes = decode(op, "frontend_attributes", parse_frontend_attributes) or {}
    value = attributes.get("_xla_send_recv_source_target_pairs")
    if value is None:
        return None
    try:
        return parse_source_target_pairs(value)
    except ScanError as e:
        raise op.error_at_attribute(
            "frontend_attributes", 0, f"bad _xla_send_recv_source_target_pairs: {e.message}"
        ) from None


def _to_device_ids(
    op: Instruction, groups: Groups, mode: str, replicas: int, partitions: int
) -> Groups:
    total = replicas * partitions
    # The ids are checked against their own range before any list is built: a
    # few bytes of text may name a huge grid.
    limit, noun = {"global": (total, "devices"), "partition": (partitions, "partitions")}.get(
        mode, (replicas, "replicas")
    )
    for group in groups:
        for device in group:
            if not 0 <= device < limit:
                raise op.error(
                    f"device {device} is outside the module's {limit} {noun} "
                    f"(replica_count={replicas}, num_partitions={partitions})"
                )
    if mode == "global":
        return groups or (tuple(range(total)),)
    if mode == "partition":
        groups = groups or (tuple(range(partitions)),)
        return tuple(tuple(r * partitions + p for p in g) for r in range(replicas) for g in groups)
    if mode == "replica":
        groups = groups or (tuple(range(replicas)),)
        return tuple(
            tuple(r * partitions + p for r in g) for p in range(partitions) for g in groups
        )
    # replica-and-partition: every partition of the grouped replicas
    groups = groups or (tuple(range(replicas)),)
    return tuple(tuple(r * partitions + p for r in g for p in range(partitions)) for g in groups)
