"""What the code knows about collectives: each kind (:data:`KINDS`), the devices an
instruction involves (:func:`device_groups`), where XLA runs it
(:class:`StreamModel`), the async pairs and when they are in flight, and the
stream assignment made for them.

The deadlock rule, in one predicate (:meth:`AsyncPair.must_share_stream_with`):
NCCL kernels on different streams may execute in different orders on different
ranks, so two collectives that occupy communication streams, are in flight at
the same time and whose device groups share two or more devices must sit on one
stream; :func:`tied_units` groups the pairs it ties. ``verify-streams`` checks it
independently of how the assignment was made.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

from xla_streams.hlo import HloError, Instruction, Module
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


# What a number of collective streams must be, as every front end's message says it.
STREAMS_EXPECTED = f"an integer from 1 to {MAX_STREAMS}"


def check_streams(value: object) -> int:
    """``value`` as a number of collective streams K; ValueError unless an integer in
    1..MAX_STREAMS. Front ends that name the value as the user spelled it say
    :data:`STREAMS_EXPECTED` in their own message."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_STREAMS:
        raise ValueError(
            f"the number of collective streams must be {STREAMS_EXPECTED}, not {value!r}"
        )
    return value


def streams_from_text(text: str) -> int:
    """K as a user writes it (``"4"``, surrounding spaces allowed): ValueError as
    :func:`check_streams` raises it, naming ``text``, unless decimal digits of a
    number in 1..MAX_STREAMS."""
    digits = text.strip()
    return check_streams(int(digits) if digits.isascii() and digits.isdecimal() else text)


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
    deviceless, by tools/prove_native_streams.py):

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

    def __post_init__(self) -> None:
        if not self.occurrences:
            object.__setattr__(self, "occurrences", ((self.start_time, self.done_time),))

    @property
    def _group_sets(self) -> tuple[frozenset[int], ...]:
        """The groups as sets, made on first use (groups may list 65,536 devices)."""
        sets = self.__dict__.get("_sets")
        if sets is None:
            sets = self.__dict__["_sets"] = tuple(frozenset(g) for g in self.groups)
        return sets

    @property
    def needs_stream(self) -> bool:
        """It occupies one of the collective streams (the ones we assign)."""
        return self.lane == "communication"

    def overlaps(self, other: AsyncPair) -> bool:
        """True when both are in flight at some point of the execution."""
        return any(a < d and c < b for a, b in self.occurrences for c, d in other.occurrences)

    def shares_devices_with(self, other: AsyncPair) -> bool:
        """The deadlock rule's test: some group of each shares two or more devices.

        The reference form, pair by pair; :func:`tied_units` and ``verify-streams``
        ask it of every pair in flight at once through :class:`InFlight`, which gives
        the same answers in time near-linear in the groups.
        """
        return any(len(a & b) >= 2 for a in self._group_sets for b in other._group_sets)

    def must_share_stream_with(self, other: AsyncPair) -> bool:
        """Both in flight together and sharing two devices: on different streams NCCL
        could run them in different orders on different ranks, and hang. Or the two
        halves of one permute (see :meth:`halves_of_one_permute`).

        At least as strict as XLA's own check, which keeps such collectives from being
        in flight together when it schedules several at once
        (``GpuScheduleCrossesOverlapLimit`` in
        ``xla/service/gpu/gpu_latency_hiding_scheduler.cc``, openxla/xla #19026,
        #40656, #47467). Point by point:

        - Threshold: the same. XLA's ``CountOverlappingDevices`` takes, over every
          group of one and every group of the other, the most devices they share,
          and refuses the overlap when it is more than one.
        - Device ids: XLA resolves groups to ``GlobalDeviceId`` through the
          module's device assignment (``GetParticipatingDevicesGroups`` in
          ``xla/service/collective_ops_utils.cc``, with the four group modes of
          ``GetCollectiveOpGroupMode``); :func:`device_groups` gives logical ids
          ``replica * num_partitions + partition`` by the same modes. The device
          assignment maps logical ids one to one onto global ids, so every
          intersection has the same size: the same ties, and every process of a
          multi-host job computes them without knowing the assignment.
        - Permutes: as in #47467, each source/target pair is a two-device group,
          the ids partitions with a channel_id and replicas without, expanded over
          the other axis; send/recv the same, from
          ``_xla_send_recv_source_target_pairs``.
        - Collective groups (#46043, an ``async-start`` whose computation holds
          several collectives, ``_collectives_group``): XLA's
          ``GetParticipatingDevicesGroupsForAsyncStart`` takes the groups of every
          collective inside; so does find-async-pairs (one pair for the group).
        - Empty or unknown groups: XLA treats a group it cannot resolve as unsafe
          with everything in flight. Here an absent or empty ``replica_groups`` is
          every device (its meaning in XLA too; with ``use_global_device_ids``,
          which XLA rejects, also every device, which ties it to every collective
          that communicates at all), and groups that cannot be resolved are an
          HloError: the module is refused, not assigned.
        - Scope, stricter: XLA compares only collectives in flight in one
          computation's schedule, on its two collective resources (the default and
          the scale-up one; send/recv and custom calls not at all). Here the whole
          program is laid out, every call site counted (a collective in flight
          across a ``while`` meets those of its body), send/recv and sync pairs on
          the communication lane included, and ties are transitive (A-B and B-C tie
          A, B and C even when A and C never meet).
        - Mechanism: XLA's scheduler keeps such collectives apart in time; this
          tool runs after scheduling and keeps the overlap, putting them on one
          stream so that every rank issues them in the same (program) order.

        Not tied, deliberately: collectives in flight together that pairwise share at
        most one device, even when they close a cycle (A-B on rank 0, B-C on rank 1,
        C-A on rank 2; tests/passes/test_rule_index.py builds it and asserts the three
        stay on three streams). XLA does not tie them either. Under the strictest
        reading of NCCL (no forward-progress guarantee between communicators:
        NVIDIA/nccl#574, #195) such a cycle could hang, if on every rank of it a
        waiting kernel kept the next one from starting (saturated SMs,
        ``CUDA_DEVICE_MAX_CONNECTIONS=1``, an implicit device synchronisation). But
        that reading condemns two collectives just as well: tensor-parallel
        collectives over the rows of a 2x2 mesh and data-parallel ones over its
        columns share one device per pair of groups, and their groups form the
        4-cycle row0 - col1 - row1 - col0 - row0. So:

        - tying only cycles of three or more collectives would not make the rule
          sound (that 4-cycle has two), and costs the overlap of every mesh with
          three axes in flight at once (a 2x2x2 mesh with one all-reduce per axis
          in flight: 3 streams -> 1); on the 57 example programs (hlo_fixtures/,
          K=4) it ties no pair, because none keeps three such collectives in flight;
        - tying every cycle of groups (sound under that reading) ties TP with DP:
          on the examples every program that gets two streams today gets one
          (tp_dp_2d, transformer_step, multihost_32, gspmd_step,
          large_transformer: 2 -> 1 stream; large_transformer's pairs serialized by
          the rule 181 -> 261 of 401), which is the overlap this tool exists for.

        The rule stays XLA's: it excludes the two-rank cycle that any order
        difference between two ranks makes, and relies, as XLA and every TP x DP
        job on separate communicators do, on NCCL kernels of different streams
        being co-resident on the GPU (a few CTAs each).
        """
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


def tied_units(pairs: list[AsyncPair], budget: int | None = None) -> list[list[AsyncPair]]:
    """The pairs the deadlock rule ties to one stream, as groups ("units"): in flight
    together while sharing two or more devices, or a send and a recv of one channel
    (:meth:`AsyncPair.must_share_stream_with`), ties taken transitively. Each unit
    and the list of them are in order of first start.

    Near-linear (see :class:`InFlight`); RuleWorkExceeded past ``budget`` steps
    (default :data:`MAX_RULE_WORK`).
    """
    index = {id(p): i for i, p in enumerate(pairs)}
    parent = list(range(len(pairs)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    # Sweep in start order; an occurrence is in flight at a later start until its done.
    flight = InFlight(MAX_RULE_WORK if budget is None else budget)
    holder: dict[int, int] = {}  # grouping in flight -> one pair holding it (all are tied)
    ending: list[tuple[int, int]] = []  # (done, pair index), a heap
    for begin, end, p in in_flight_order(pairs):
        while ending and ending[0][0] <= begin:
            flight.finish(pairs[heapq.heappop(ending)[1]])
        i = index[id(p)]
        for grouping in flight.conflicts(p):
            parent[find(i)] = find(holder[grouping])
        begun = flight.begin(p)
        if begun is not None:
            holder[begun] = i
        heapq.heappush(ending, (end, i))
    index_of = {p.start: index[id(p)] for p in pairs}
    by_channel: dict[int, int] = {}
    for p in pairs:
        if p.kind in ("send", "recv") and p.channel is not None:
            first = by_channel.setdefault(p.channel, index_of[p.start])
            parent[find(index_of[p.start])] = find(first)
    units: dict[int, list[AsyncPair]] = {}
    for p in sorted(pairs, key=lambda p: (p.start_time, p.start)):
        units.setdefault(find(index[id(p)]), []).append(p)
    return sorted(units.values(), key=lambda unit: (unit[0].start_time, unit[0].start))


# The most steps the deadlock rule may take on one module (a step: one device of a
# group looked up, or one grouping in flight compared). Real programs take well under
# a million; a module built to make the rule quadratic is refused with an error at
# the collective where the budget ran out, after a few seconds, rather than running on.
MAX_RULE_WORK = 20_000_000


class RuleWorkExceeded(Exception):
    """The deadlock rule ran past its work budget at ``pair``'s start."""

    def __init__(self, pair: AsyncPair, budget: int) -> None:
        super().__init__(
            f"the deadlock rule needs more than {budget} steps for this module (collectives "
            f"in flight together over too many distinct device groups); refused at this "
            f"{pair.kind} rather than run on"
        )
        self.pair = pair

    def located(self, module: Module) -> HloError:
        """This error as an HloError at the pair's start instruction in ``module``."""
        comp = module.computation(self.pair.computation)
        start = comp.get(self.pair.start) if comp is not None else None
        if start is None:
            line = self.pair.start_line or module.header_line
            return HloError(str(self), path=module.path, line=line, column=1)
        return start.error(str(self))


class InFlight:
    """The device groups of the collectives in flight during a sweep in time order,
    indexed so that the deadlock rule (:meth:`AsyncPair.shares_devices_with`) tests a
    starting pair against all of them at once.

    A pair's *grouping* is the tuple of its groups of two or more devices (a group
    of one shares at most one device with anything, so pairs with no other are never
    tied and never indexed); equal groupings are interned once per sweep. Two pairs
    with the same grouping in flight together always share two devices. For the
    others, :meth:`conflicts` takes the cheaper of two ways:

    - compare with each distinct grouping in flight, each answer remembered per
      couple of groupings (real programs have a few groupings, the mesh axes, met
      again and again; the first answer costs the smaller grouping's size);
    - or, for a small grouping while many distinct ones are in flight, look its
      devices up in a device -> (grouping, group) index, counting per group until
      two devices meet.

    So a sweep costs about the size of the groups plus, per start, the distinct
    groupings in flight; a budget bounds what a hostile module can make it cost
    (RuleWorkExceeded, a located error once the caller knows the module).
    """

    def __init__(self, budget: int = MAX_RULE_WORK) -> None:
        self.budget = budget
        self.work = 0
        self._ids: dict[tuple[tuple[int, ...], ...], int] = {}
        self._groupings: list[tuple[tuple[int, ...], ...]] = []
        self._sizes: list[int] = []
        self._of_pair: dict[int, int | None] = {}  # id(pair) -> grouping
        self._count: dict[int, int] = {}  # grouping in flight -> occurrences in flight
        self._maps: dict[int, dict[int, list[int]]] = {}  # grouping -> device -> its groups
        self._shares: dict[tuple[int, int], bool] = {}
        self._indexed: set[int] = set()
        self._index: dict[int, list[tuple[int, int]]] = {}  # device -> (grouping, group)

    def grouping(self, pair: AsyncPair) -> int | None:
        """The interned grouping of ``pair``; None when no group has two devices."""
        key = id(pair)
        if key in self._of_pair:
            return self._of_pair[key]
        # Each group as its distinct devices (a permute pair {0,0} is one device).
        groups = tuple(
            g if len(g) == 2 and g[0] != g[1] else tuple(sorted(set(g)))
            for g in pair.groups
            if len(g) >= 2 and (len(g) > 2 or g[0] != g[1])
        )
        groups = tuple(g for g in groups if len(g) >= 2)
        found = None
        if groups:
            found = self._ids.get(groups)
            if found is None:
                found = self._ids[groups] = len(self._groupings)
                self._groupings.append(groups)
                self._sizes.append(sum(map(len, groups)))
        self._of_pair[key] = found
        return found

    def conflicts(self, pair: AsyncPair) -> list[int]:
        """The groupings in flight that share two or more devices with ``pair``'s
        (its own among them when another pair holding it is in flight)."""
        mine = self.grouping(pair)
        if mine is None or not self._count:
            return []
        if self._sizes[mine] * 4 < len(self._count):
            return self._conflicts_by_device(pair, mine)
        self._spend(pair, len(self._count))
        found = []
        for other in self._count:
            if other == mine or self._share(pair, mine, other):
                found.append(other)
        return found

    def begin(self, pair: AsyncPair) -> int | None:
        """``pair`` is in flight from now on; returns its grouping."""
        mine = self.grouping(pair)
        if mine is not None:
            self._count[mine] = self._count.get(mine, 0) + 1
            if mine not in self._indexed:  # each grouping is indexed once, then kept
                self._indexed.add(mine)
                self._spend(pair, self._sizes[mine])
                for j, group in enumerate(self._groupings[mine]):
                    for device in group:
                        self._index.setdefault(device, []).append((mine, j))
        return mine

    def finish(self, pair: AsyncPair) -> int | None:
        """``pair`` is no longer in flight (one occurrence of it); returns its grouping."""
        mine = self.grouping(pair)
        if mine is not None:
            left = self._count[mine] - 1
            if left:
                self._count[mine] = left
            else:
                del self._count[mine]
        return mine

    def _share(self, pair: AsyncPair, a: int, b: int) -> bool:
        key = (a, b) if a < b else (b, a)
        known = self._shares.get(key)
        if known is None:
            small, large = (a, b) if self._sizes[a] <= self._sizes[b] else (b, a)
            where = self._device_map(pair, large)
            self._spend(pair, self._sizes[small])
            known = self._shares[key] = any(
                _two_in_one(group, where) for group in self._groupings[small]
            )
        return known

    def _device_map(self, pair: AsyncPair, grouping: int) -> dict[int, list[int]]:
        where = self._maps.get(grouping)
        if where is None:
            self._spend(pair, self._sizes[grouping])
            where = self._maps[grouping] = {}
            for j, group in enumerate(self._groupings[grouping]):
                for device in group:
                    where.setdefault(device, []).append(j)
        return where

    def _conflicts_by_device(self, pair: AsyncPair, mine: int) -> list[int]:
        found = {mine} if mine in self._count else set()
        for group in self._groupings[mine]:
            met: dict[tuple[int, int], int] = {}
            for device in group:
                entries = self._index.get(device, ())
                self._spend(pair, len(entries) + 1)
                for entry in entries:
                    if entry[0] in self._count and entry[0] != mine:
                        seen = met[entry] = met.get(entry, 0) + 1
                        if seen == 2:
                            found.add(entry[0])
        return list(found)

    def _spend(self, pair: AsyncPair, steps: int) -> None:
        self.work += steps
        if self.work > self.budget:
            raise RuleWorkExceeded(pair, self.budget)


def _two_in_one(group: tuple[int, ...], where: dict[int, list[int]]) -> bool:
    """Whether two devices of ``group`` lie in one group of the grouping ``where`` maps."""
    met: dict[int, int] = {}
    for device in group:
        for j in where.get(device, ()):
            if j in met:
                return True
            met[j] = 1
    return False


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
        close = _near_miss(key)
        if close is not None and op.attribute(close) is None:
            raise op.error_at_attribute(
                key, -len(key) - 1, f"unknown attribute '{key}': did you mean '{close}'?"
            )


@lru_cache(maxsize=1024)  # a module repeats a few dozen attribute names on every collective
def _near_miss(key: str) -> str | None:
    """The group attribute ``key`` is a near miss of, if any."""
    import difflib  # only here: an import the command line's start-up need not pay

    close = difflib.get_close_matches(key, _GROUP_ATTRIBUTES, n=1, cutoff=0.8)
    return close[0] if close else None


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
