"""What the code knows about collectives: each kind (:data:`KINDS`), the devices an
instruction involves (:func:`device_groups`), where XLA runs it
(:class:`StreamModel`), and what a number of collective streams and a policy are.

The async pairs, the deadlock rule and the stream assignment made for them are
analyses of a module: :mod:`xla_streams.streams`.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Literal, NamedTuple

from xla_streams.hlo import Instruction, Module
from xla_streams.hlo.attributes import (
    MAX_DEVICES,
    Groups,
    decode,
    parse_frontend_attributes,
    parse_int_list,
    parse_replica_groups,
    parse_source_target_pairs,
)
from xla_streams.hlo.text import ScanError, split_top_level
from xla_streams.option import choice, integer

Policy = Literal["interval", "round-robin"]
POLICIES: tuple[Policy, ...] = ("interval", "round-robin")
DEFAULT_POLICY: Policy = "interval"
MAX_STREAMS = 64
DEFAULT_STREAMS = 4  # K when the user turns the plugin on without saying how many
STREAM_COUNTS = (1, 2, 4, 8)  # the K that predictions and searches compare

# The readers of a number of collective streams K and of a policy, wherever one is
# given: a setting, a flag, a pass option, a tune option.
STREAMS = integer(1, MAX_STREAMS, metavar="K")
POLICY = choice(POLICIES)


def check_streams(value: object) -> int:
    """``value`` as a number of collective streams K; ValueError unless an integer in
    1..MAX_STREAMS."""
    try:
        return STREAMS.check(value)
    except ValueError:
        raise ValueError(
            f"the number of collective streams must be {STREAMS.takes}, not {value!r}"
        ) from None


class CollectiveKind(NamedTuple):
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
    # XLA's collective performance table measures it (simulate/measured.py).
    perf_table: bool
    color: str  # its colour in timelines


# name, async form, groups, global-ids field, cost family, reduces, ffi, perf table, colour
_ROWS = (
    CollectiveKind(
        "all-reduce", "dedicated", "replica_groups", True, "all-reduce", True, True, True, "#b07aa1"
    ),
    CollectiveKind(
        "all-gather", "dedicated", "replica_groups", True, "ring", False, True, True, "#59a14f"
    ),
    CollectiveKind(
        "reduce-scatter", "wrapped", "replica_groups", True, "ring", True, True, True, "#f28e2b"
    ),
    CollectiveKind(
        "all-to-all", "wrapped", "replica_groups", False, "pairwise", False, True, True, "#edc948"
    ),
    CollectiveKind(
        "ragged-all-to-all", "wrapped", "replica_groups", False, "pairwise", False, False, False,
        "#edc948",
    ),
    CollectiveKind(
        "collective-permute", "dedicated", "pairs", False, "one-hop", False, True, True, "#9c755f"
    ),
    CollectiveKind(
        "collective-broadcast", "wrapped", "replica_groups", False, "broadcast", False, False,
        False, "#ff9da7",
    ),
    CollectiveKind("send", "p2p", "pairs", False, "one-hop", False, False, False, "#9c755f"),
    CollectiveKind("recv", "p2p", "pairs", False, "one-hop", False, False, False, "#9c755f"),
)  # fmt: skip
KINDS: dict[str, CollectiveKind] = {k.name: k for k in _ROWS}
# The opcodes of plain collectives (send and recv are never plain).
COLLECTIVE_OPCODES = frozenset(k.name for k in KINDS.values() if k.async_form != "p2p")


# The frontend attribute XLA:GPU reads to run a collective on communication_stream[k].
STREAM_ATTRIBUTE = "_xla_stream_annotation"

# Where XLA runs a sync pair that is on the communication lane, annotated or not.
SYNC_PAIR_STREAM = 0

# Where a collective runs on the GPU.
Lane = Literal["communication", "compute", "p2p"]


class StreamModel(NamedTuple):
    """Where XLA runs each collective, given how the module was compiled.

    The one place that says it (measured with XLA's thunk-sequence dumps,
    deviceless, by tools/prove_native_streams.py):

    - an async pair runs on ``communication_stream[k]``, k its
      ``_xla_stream_annotation`` (default 0), wherever it is: in a computation another
      execution thread runs too (that thread issues it), and a send/recv chain through
      a loop's tuple, one pair, where its first start is (read in XLA's source, not
      measured: ``ExecutionStreamAssignment`` gives only that start, the chain's
      ``FindCanonicalSendRecvStartOp``, a stream);
    - a pipelined send/recv runs on XLA's own P2P stream;
    - a plain (synchronous) collective runs on the compute stream;
    - a *sync pair* (``is_sync``, or one XLA will make sync after scheduling
      because nothing but no-ops lies between start and done) runs on the
      compute stream on jax >= 0.11 and with the overlap limit at 1; XLA 0.10.2
      with the limit above 1 runs it as an async thunk on
      ``communication_stream[0]`` (XLA PR 40520), where it takes part in the
      deadlock rule, pinned to stream 0.

    A host transfer (``is_host_transfer=true``) is no device collective: no pair, so
    no lane.

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


# -- device groups -------------------------------------------------------------------


def device_groups(module: Module, op: Instruction, kind: str) -> Groups:
    """The groups of global device ids (replica * num_partitions + partition) of ``op``.

    Follows XLA's collective group modes: without channel_id the ids are replicas;
    with one they are partitions, or with ``use_global_device_ids`` global ids.
    Permutes and send/recv give each source/target pair as a group. A count of 1 reads
    as unset, as XLA's verifier reads it: the ids are then the groups' own.
    """
    _check_spelling(op)
    replicas, partitions = module.replica_count, module.num_partitions
    has_channel = op.attribute("channel_id") is not None
    if KINDS[kind].groups == "pairs":
        if KINDS[kind].async_form == "p2p":
            pairs = _send_recv_pairs(op)
        elif op.attribute("slice_sizes") is not None:  # in place: a pair per slice
            pairs = decode(op, "source_target_pairs", _slice_pairs)
        else:
            pairs = decode(op, "source_target_pairs", parse_source_target_pairs)
        if pairs is None:
            raise op.error(f"{op.opcode} without source_target_pairs")
        groups: Groups = tuple(pairs)
        mode = "partition" if has_channel else "replica"
    else:
        groups = decode(op, "replica_groups", parse_replica_groups) or ()
        global_ids = op.attribute("use_global_device_ids") == "true"
        if global_ids and not has_channel:  # which ids would the groups hold?
            raise op.error_at_attribute(
                "use_global_device_ids", -len("use_global_device_ids") - 1,
                "use_global_device_ids=true needs a channel_id: without one the groups hold "
                "replica ids (XLA: Cannot have use_global_device_ids=true without channel_id)",
            )  # fmt: skip
        if not has_channel:
            mode = "replica"
        elif global_ids:
            mode = "global"
        elif KINDS[kind].global_ids_field:
            mode = "replica-and-partition"
        else:
            mode = "partition"
    return _to_device_ids(
        op, groups, mode, replicas, partitions, pairs=KINDS[kind].groups == "pairs"
    )


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


def _slice_pairs(value: str) -> tuple[tuple[int, int], ...]:
    """The distinct pairs of an in-place permute's ``source_target_pairs`` (its operands:
    input and output buffers and the offsets of the ``slice_sizes`` slices it moves). It
    names a pair once per slice, as XLA's verifier allows (``CheckDuplicatedSourceOrTarget``:
    each device a source, and a target, once per slice)."""
    if not (value.startswith("{") and value.endswith("}")):
        raise ScanError(0, "expected '{{source,target},...}'")
    pairs: dict[tuple[int, int], None] = {}
    for a, b in split_top_level(value, 1, len(value) - 1):
        try:
            pair = parse_int_list(value[a:b])
        except ScanError as e:
            raise ScanError(a + e.offset, e.message) from None
        if len(pair) != 2 or min(pair) < 0:
            raise ScanError(a, "expected a {source,target} pair of device ids")
        pairs[(pair[0], pair[1])] = None
    return tuple(pairs)


def _to_device_ids(
    op: Instruction, groups: Groups, mode: str, replicas: int, partitions: int, *, pairs: bool
) -> Groups:
    total = replicas * partitions
    # The ids are checked against their own range before any list is built: a
    # few bytes of text may name a huge grid.
    limit, noun = {"global": (total, "devices"), "partition": (partitions, "partitions")}.get(
        mode, (replicas, "replicas")
    )
    counts = f"replica_count={replicas}, num_partitions={partitions}"
    unset = limit == 1 and bool(groups)
    if unset:
        # 1 is also the count of a header that sets none (XLA's own test modules): XLA's
        # verifier then reads the ids as the groups give them, groups holding 0..n-1 and
        # pairs any id (hlo_verifier.cc: CheckReplicaGroups, "replica and/or partition
        # count is not set ... skip this part of the verification";
        # CheckDuplicatedSourceOrTarget, "limit == 1 ||"), and so does this.
        limit = max(max(g) for g in groups) + 1 if pairs else sum(len(g) for g in groups)
        counts += f": 1 reads as unset, as in XLA's verifier, so the ids are the {noun}"
        if limit > MAX_DEVICES:
            raise op.error(f"device {limit - 1} is past the {MAX_DEVICES} devices read ({counts})")
    for group in groups:
        for device in group:
            if not 0 <= device < limit:
                raise op.error(f"device {device} is outside the module's {limit} {noun} ({counts})")
    if unset:
        if mode in ("global", "partition"):
            partitions = limit
        else:
            replicas = limit
        total = replicas * partitions
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


# -- device groups as people read them -------------------------------------------


def format_groups(groups: Sequence[Sequence[int]], kind: str = "") -> str:
    """A short form of device groups.

    ``{0..7}``, ``{0,64,...,960}``: one group; ``4x{0,4}``: four groups, each the
    first shifted so that together they tile the devices (``step N`` is added when
    they do not tile);
    ``8 pairs 0->1..7->0``: a permute whose pairs shift every device of a range;
    ``2x(4 pairs 0->1..3->0)``: a pattern repeated on shifted devices. Anything
    else is listed, the middle elided when long.
    """
    items = [tuple(g) for g in groups]
    if not items:
        return "{}"
    is_pairs = kind in KINDS and KINDS[kind].groups == "pairs" and all(len(g) == 2 for g in items)
    return _format_pairs(items) if is_pairs else _format_sets(items)


def _format_sets(items: list[tuple[int, ...]]) -> str:
    if len(items) == 1:
        return _braces(items[0])
    period = _period(items)
    if period is not None:
        p, step = period
        if p == 1:
            devices = sorted(d for g in items for d in g)
            tiles = devices == list(range(devices[0], devices[0] + len(devices)))
            return f"{len(items)}x{_braces(items[0])}" + ("" if tiles else f" step {step}")
        return f"{len(items) // p}x({_format_sets(items[:p])}) step {step}"
    return _elide([_braces(g) for g in items], "groups")


def _format_pairs(items: list[tuple[int, ...]]) -> str:
    if len(items) == 1:
        return _arrow(items[0])
    if _is_shift(items) and len(items) > 2:
        return f"{len(items)} pairs {_arrow(items[0])}..{_arrow(items[-1])}"
    period = _period(items)
    if period is not None:
        p, step = period
        block = items[:p]
        inner = _format_pairs(block)
        devices = sorted(d for g in block for d in g)
        width = devices[-1] - devices[0] + 1
        return f"{len(items) // p}x({inner})" + ("" if step == width else f" step {step}")
    return _elide([_arrow(g) for g in items], "pairs")


def _is_shift(items: list[tuple[int, ...]]) -> bool:
    """Sources are a consecutive range and every target is its source moved by the same
    amount, either straight (``0->1..6->7``) or around the range (``0->1..7->0``)."""
    sources = [s for s, _ in items]
    first, m = sources[0], len(items)
    if sources != list(range(first, first + m)):
        return False
    delta = items[0][1] - first
    straight = all(t - s == delta for s, t in items)
    around = all(t == first + (s - first + delta) % m for s, t in items)
    return straight or around


def _period(items: list[tuple[int, ...]]) -> tuple[int, int] | None:
    """The smallest p < len(items) such that item i is item i mod p with every id raised
    by (i div p) * step, for one step; with that step. None when there is none."""
    n = len(items)
    for p in range(1, n // 2 + 1):
        if n % p:
            continue
        step = items[p][0] - items[0][0] if items[p] and items[0] else 0
        if step == 0:
            continue
        if all(
            len(items[i]) == len(items[i % p])
            and all(a == b + (i // p) * step for a, b in zip(items[i], items[i % p], strict=True))
            for i in range(p, n)
        ):
            return p, step
    return None


def _braces(group: Sequence[int]) -> str:
    """``{0..3,8,10}``, ``{0,64,...,960}``: runs of three or more consecutive ids and of
    four or more evenly spaced ids shortened."""
    parts: list[str] = []
    i = 0
    while i < len(group):
        j = i
        if i + 1 < len(group):
            step = group[i + 1] - group[i]
            while j + 1 < len(group) and group[j + 1] - group[j] == step:
                j += 1
            if step == 1 and j - i >= 2:
                parts.append(f"{group[i]}..{group[j]}")
                i = j + 1
                continue
            if step > 1 and j - i >= 3:
                parts.append(f"{group[i]},{group[i + 1]},...,{group[j]}")
                i = j + 1
                continue
        parts.append(str(group[i]))
        i += 1
    return "{" + ",".join(parts) + "}"


def _arrow(pair: Sequence[int]) -> str:
    return f"{pair[0]}->{pair[1]}"


def _elide(parts: list[str], noun: str, keep: int = 4) -> str:
    if len(parts) <= keep:
        return ",".join(parts)
    return ",".join(parts[: keep - 1]) + f",...,{parts[-1]} ({len(parts)} {noun})"
