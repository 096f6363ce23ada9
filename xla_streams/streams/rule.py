"""The deadlock rule: which async pairs must run on one collective stream.

NCCL kernels on different streams may execute in different orders on different
ranks, so two collectives that occupy communication streams, are in flight at the
same time and whose device groups share two or more devices must sit on one
stream, or the ranks could wait on each other for ever; so must the send and the
recv of one channel. :func:`must_share_stream` says it of two pairs: it is the
definition. :func:`tied_units` (for assign-streams) and
:func:`~xla_streams.streams.verify.verify_streams` ask it of every pair at once,
in a sweep in time order, through its fast equivalents: :class:`InFlight` for the
pairs in flight together that share two devices, :func:`permute_halves` for the
sends and recvs of a channel. ``tests/streams/test_rule_index.py`` checks that they
agree with the definition.

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
  ``GetCollectiveOpGroupMode``); :func:`~xla_streams.collectives.device_groups`
  gives logical ids ``replica * num_partitions + partition`` by the same
  modes. The device assignment maps logical ids one to one onto global ids,
  so every intersection has the same size: the same ties, and every process
  of a multi-host job computes them without knowing the assignment.
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
  A, B and C even when A and C never meet). A pair in a computation that another
  execution thread runs (an async call: ``call-start``, an ``async-start`` of no
  collective) meets everything in flight during the call, since XLA orders nothing
  between the threads.
- Mechanism: XLA's scheduler keeps such collectives apart in time; this
  tool runs after scheduling and keeps the overlap, putting them on one
  stream so that every rank issues them in the same (program) order.

Not tied, deliberately: collectives in flight together that pairwise share at
most one device, even when they close a cycle (A-B on rank 0, B-C on rank 1,
C-A on rank 2; tests/streams/test_rule_index.py builds it and asserts the three
stay on three streams). XLA does not tie them either. Under the strictest
reading of NCCL (no forward-progress guarantee between communicators:
NVIDIA/nccl#574, #195) such a cycle could hang, if on every rank of it a
waiting kernel kept the next one from starting (saturated SMs, an implicit
device synchronisation; not ``CUDA_DEVICE_MAX_CONNECTIONS=1``, whose one queue
starts every rank's work in the program's order: docs/runtimes.md). But
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
being co-resident on the GPU, which ``simulate/residency.py`` checks where the
GPU is known (an NCCL ring holds 16 to 32 SMs: an H100 fits five).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from xla_streams.hlo import HloError, Module
from xla_streams.streams.pairs import AsyncPair, in_flight_order


def must_share_stream(p: AsyncPair, q: AsyncPair) -> bool:
    """The deadlock rule for two pairs, pair by pair: in flight together with some
    group of each sharing two or more devices (on different streams NCCL could run
    them in different orders on different ranks, and hang), or a send and the recv of
    the same channel (one transfer, whose two halves stay on one stream whether or not
    they overlap, since some XLA versions key the NCCL communicator by stream, and a
    send posted on one stream never meets a recv posted on another).

    The reference form, for tests and for reading: the code asks it of all pairs at
    once through :class:`InFlight` and :func:`permute_halves`, which give the same
    answers in near-linear time.
    """
    halves = {p.kind, q.kind} == {"send", "recv"} and p.channel is not None
    if halves and p.channel == q.channel:
        return True
    return p.overlaps(q) and any(len(set(a) & set(b)) >= 2 for a in p.groups for b in q.groups)


def permute_halves(pairs: Iterable[AsyncPair]) -> list[list[AsyncPair]]:
    """The sends and recvs of each channel, in the order of ``pairs``: the halves of one
    permute, which the rule keeps on one stream (:func:`must_share_stream`)."""
    by_channel: dict[int, list[AsyncPair]] = {}
    for p in pairs:
        if p.kind in ("send", "recv") and p.channel is not None:
            by_channel.setdefault(p.channel, []).append(p)
    return list(by_channel.values())


def tied_units(pairs: list[AsyncPair], budget: int | None = None) -> list[list[AsyncPair]]:
    """The pairs the deadlock rule ties to one stream (:func:`must_share_stream`), ties
    taken transitively, as groups ("units"). The sends and recvs of one channel are
    tied all together (:func:`permute_halves`): a channel's sends without a recv too,
    a tie the rule does not ask for. Each unit and the list of them are in order of
    first start.

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
    for halves in permute_halves(pairs):
        first = find(index[id(halves[0])])
        for p in halves[1:]:
            parent[find(index[id(p)])] = first
    units: dict[int, list[AsyncPair]] = {}
    for p in sorted(pairs, key=lambda p: (p.start_time, p.key)):
        units.setdefault(find(index[id(p)]), []).append(p)
    return sorted(units.values(), key=lambda unit: (unit[0].start_time, unit[0].key))


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
    indexed so that the deadlock rule (:func:`must_share_stream`: in flight together,
    sharing two or more devices) tests a starting pair against all of them at once.

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
