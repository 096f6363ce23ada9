"""XLA's levers that create overlap, their settings, and the census of a module's
collectives that says which can act.

A lever is a few of XLA's options (``DebugOptions`` fields, spelled as
``compile(compiler_options=...)`` takes them, each in :data:`xla_options.OPTIONS
<xla_streams.xla_options.OPTIONS>`) and the settings the search gives them: the first
is XLA's default (no option set), the others are the alternatives. Levers set disjoint
options, so a configuration is one setting per lever (:class:`Point`), and two
configurations are neighbours when they differ in one or two levers.

:func:`levers` lists them in the order their effect is expected (docs/tune.md, "The
levers"): the overlap limit (the prerequisite), the loop pipeliner per
collective kind (each also moved together with while-loop double buffering: on scan
models neither pays alone, the pipelined collective only overlaps the next
iteration once the loop is double buffered), double buffering, start-as-early-as-
possible, XLA's own multi-streaming, the scale-up (NVLink) domain with its overlap
limit, collective matmul (windowed einsum), and the combine thresholds: all-reduce
swept from 16 MiB up in steps of 2 to the total all-reduced bytes, all-gather and
reduce-scatter raised to at least one layer's size (NVIDIA's JAX-Toolbox guidance,
"Tips for High-Performance LLMs with JAX and XLA"). Overlap limits above the largest
stream count allowed are not offered. The overlap limit, the pipeliners, double
buffering and start-early pay together: each carries its setting in their joint
move (:attr:`Lever.together`), which the search tries first.

Levers a module cannot use are skipped, with the reason (:class:`CollectiveCensus`, read from
XLA's default compile by :func:`collective_census`). These skips are sound: the pipeliner
and double buffering only rewrite while loops (without a while loop holding such a
collective they change nothing), a combine threshold only acts on collectives of its
kind, the scale-up settings only on collectives inside one NVLink domain.

Each lever carries its own names: the one ``--levers`` takes (and older spellings,
``aliases``), and the word each of its options has in a configuration's settings
(:func:`describe`: ``overlap-limit=4, pipeline-all-gather=on``). :data:`LEVER_NAMES`
and those words are read from :func:`levers`, so nothing else lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from xla_streams import xla_options as xo
from xla_streams.collectives import COLLECTIVE_OPCODES, STREAM_COUNTS, device_groups
from xla_streams.hlo import Module
from xla_streams.streams import AsyncPair

Flags = dict[str, object]
Point = tuple[int, ...]  # one setting index per lever, in the order of the levers

# Overlap limits tried (besides XLA's default).
OVERLAP_LIMITS = (2, 4)
# Scale-up (NVLink) overlap limits tried with the scale-up domain assignment.
SCALE_UP_LIMITS = (2, 4)
# The all-reduce combine threshold sweep: from this, doubling (JAX-Toolbox: "try several
# threshold values in steps of 2 from say 16MB to total gradient size").
ALL_REDUCE_SWEEP_FROM = 16 << 20
# At most this many all-reduce thresholds are tried (16 MiB to 16 GiB).
ALL_REDUCE_SWEEP_STEPS = 11
# "Combine everything": JAX-Toolbox's value for all-gather/reduce-scatter thresholds.
COMBINE_ALL = 8 << 30
# Windowed einsum for every GEMM fed by a collective (JAX-Toolbox's value).
WINDOWED_EINSUM_ALL_MIB = 0


@dataclass(frozen=True)
class CollectiveCensus:
    """What XLA's default compile of the program says of its collectives: how many, of
    which kinds, where, how large; the levers' ``skip`` read it to say which can act."""

    async_pairs: int
    collectives: int  # async pairs and plain (synchronous) collectives
    loop_kinds: frozenset[str]  # kinds of collectives inside while loops
    combined_kinds: frozenset[str]  # kinds with a collective of several operands
    within_host: bool  # some collective's groups each sit inside one NVLink domain
    sync_collectives: int  # plain collectives and sync pairs: nothing between start and done
    kind_bytes: tuple[tuple[str, int], ...] = ()  # per kind: bytes of all its collectives
    layer_bytes: tuple[tuple[str, int], ...] = ()  # per kind: most bytes in one loop body

    def total(self, kind: str) -> int:
        return dict(self.kind_bytes).get(kind, 0)

    def layer(self, kind: str) -> int:
        return dict(self.layer_bytes).get(kind, 0)


@dataclass(frozen=True)
class Lever:
    """One of XLA's overlap levers: its name (as ``--levers`` and the progress lines
    spell it; ``aliases``: older names still accepted), the word of each XLA option it
    sets (``words``: option -> word, in the order a configuration's settings list
    them), its settings (``settings[0]`` is XLA's default, no option set), a label for
    each, and why it cannot act on a module (None: it can). ``with_double_buffering``:
    the search also moves it together with double buffering. ``pairs``: the search's
    final check also changes it together with another such lever (the scheduling
    levers, which interact); the size levers (combine thresholds, collective matmul)
    are checked one at a time. ``together``: it is one of the levers that pay
    together (the overlap limit, the pipeliners, double buffering, start-early), and
    its setting in their joint move (0: it stays at XLA's default there); the search
    reaches these first."""

    name: str
    words: Mapping[str, str]
    settings: tuple[Flags, ...]
    labels: tuple[str, ...]
    skip: Callable[[CollectiveCensus], str | None]
    with_double_buffering: bool = False
    pairs: bool = True
    aliases: tuple[str, ...] = ()
    together: int | None = None

    @property
    def options(self) -> frozenset[str]:
        return frozenset(name for s in self.settings for name in s)

    def index(self, flags: Mapping[str, object]) -> int | None:
        """The setting ``flags`` give this lever (None: one it does not offer)."""
        mine = {k: v for k, v in flags.items() if k in self.options}
        for i, setting in enumerate(self.settings):
            if canonical(setting) == canonical(mine):
                return i
        return None


def canonical(options: Mapping[str, object]) -> Flags:
    """``options`` without those set to XLA's default, sorted by name."""
    return {
        name: value
        for name, value in sorted(options.items())
        if name not in xo.DEFAULTS or xo.DEFAULTS[name] != value
    }


def _value(flags: Mapping[str, object], name: str) -> object:
    return flags.get(name, xo.DEFAULTS.get(name))


def overlap_limit(flags: Mapping[str, object]) -> int:
    """The overlap limit XLA compiles ``flags`` with (its default where they set none)."""
    value = _value(flags, xo.OVERLAP_LIMIT)
    return value if isinstance(value, int) else xo.XLA_DEFAULT_OVERLAP_LIMIT


def flags_of(levers: Sequence[Lever], point: Point) -> Flags:
    """The options of ``point`` (one setting per lever), canonical."""
    out: Flags = {}
    for lever, i in zip(levers, point, strict=True):
        out.update(lever.settings[i])
    return canonical(out)


def format_bytes(n: int) -> str:
    """``4 MiB``, ``4.5 MiB``, ``72.00 GiB``; below 1 MiB the exact count (``12 B``).

    Not :func:`xla_streams._text.human_bytes` (``4.0 MiB``, ``72.0 GiB``, KiB below
    1 MiB): these words are in tune results' tables, settings and progress lines."""
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    if n >= 2**20:
        return f"{n / 2**20:.0f} MiB" if n % 2**20 == 0 else f"{n / 2**20:.1f} MiB"
    return f"{n} B"


def describe_point(levers: Sequence[Lever], point: Point) -> str:
    """``overlap-limit=2, double-buffering=on``; ``XLA defaults`` for none."""
    words = [f"{lv.name}={lv.labels[i]}" for lv, i in zip(levers, point, strict=True) if i]
    return ", ".join(words) or "XLA defaults"


# -- why a lever cannot act ---------------------------------------------------------------


def _skip_overlap(census: CollectiveCensus) -> str | None:
    if census.collectives == 0:
        return "the program has no collectives"
    if census.collectives < 2 and not census.loop_kinds:
        return "one collective, outside any loop: nothing can be in flight beside it"
    return None


def _skip_pipeline(kind: str) -> Callable[[CollectiveCensus], str | None]:
    def skip(census: CollectiveCensus) -> str | None:
        if kind not in census.loop_kinds:
            return f"no {kind} inside a while loop (the pipeliner works on loops)"
        return None

    return skip


def _skip_double_buffering(census: CollectiveCensus) -> str | None:
    if not census.loop_kinds:
        return "no while loop holds a collective"
    return None


def _skip_start_early(census: CollectiveCensus) -> str | None:
    if census.async_pairs == 0:
        return "no async collectives (nothing to start earlier)"
    return None


def _skip_multi_streaming(census: CollectiveCensus) -> str | None:
    if census.async_pairs < 2 and not census.loop_kinds:
        return "fewer than two async collectives"
    return None


def _skip_scale_up(census: CollectiveCensus) -> str | None:
    if census.collectives == 0:
        return "the program has no collectives"
    if not census.within_host:
        return "no collective stays inside one NVLink domain"
    return None


def _skip_windowed_einsum(census: CollectiveCensus) -> str | None:
    if not census.total("all-gather") and not census.total("reduce-scatter"):
        return "no all-gather or reduce-scatter to decompose into a collective matmul"
    return None


def _skip_combine(kinds: Sequence[str]) -> Callable[[CollectiveCensus], str | None]:
    def skip(census: CollectiveCensus) -> str | None:
        if not any(census.total(k) for k in kinds):
            return f"no {' or '.join(kinds)}"
        return None

    return skip


# -- the levers ---------------------------------------------------------------------------


def _flags(options: Mapping[str, object]) -> Flags:
    return dict(options)


def _toggle(
    name: str,
    option: str,
    skip: Callable[[CollectiveCensus], str | None],
    together: int | None = None,
) -> Lever:
    other = not xo.DEFAULTS[option]
    labels = ("default", "on" if other else "off")
    return Lever(name, {option: name}, ({}, {option: other}), labels, skip, together=together)


def _pipeline(kind: str) -> Lever:
    """XLA's default, or the other one of ON / OFF (the reduce-scatter pipeliner is on
    by default in jax 0.12: its move is off)."""
    option = xo.PIPELINE[kind]
    other = xo.PIPELINING_OFF if xo.DEFAULTS[option] == xo.PIPELINING_ON else xo.PIPELINING_ON
    name = f"pipeline-{kind}"
    return Lever(
        name,
        {option: name},
        ({}, {option: other}),
        ("default", other.removeprefix("COLLECTIVE_PIPELINING_MODE_").lower()),
        _skip_pipeline(kind),
        with_double_buffering=True,
        together=1 if other == xo.PIPELINING_ON else 0,  # pipelining on, not off
    )


def _powers_of_two(start: int, stop: int, steps: int) -> list[int]:
    out: list[int] = []
    value = start
    while len(out) < steps:
        out.append(value)
        if value >= stop:
            break
        value *= 2
    return out


def _ceil_power_of_two(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def levers(census: CollectiveCensus, max_streams: int = max(STREAM_COUNTS)) -> list[Lever]:
    """Every lever, in search order (see the module docstring). Overlap limits above
    ``max_streams`` (the most streams a recommendation may use) are not tried; the
    combine thresholds tried depend on the module's collective sizes (``census``)."""
    limits = [v for v in OVERLAP_LIMITS if v <= max(max_streams, 2)]
    ar_total = census.total("all-reduce")
    ar_values = _powers_of_two(ALL_REDUCE_SWEEP_FROM, ar_total, ALL_REDUCE_SWEEP_STEPS)
    ar_default = int(str(xo.DEFAULTS[xo.COMBINE_THRESHOLD["all-reduce"]]))
    ar_values = [v for v in ar_values if v != ar_default]
    ag_rs = (xo.COMBINE_THRESHOLD["all-gather"], xo.COMBINE_THRESHOLD["reduce-scatter"])
    ag_default = int(str(xo.DEFAULTS[ag_rs[0]]))
    # At least one layer's weights (the most gathered or scattered in one loop body),
    # and everything.
    layer = max(census.layer("all-gather"), census.layer("reduce-scatter"))
    gather_values = sorted(
        {v for v in (_ceil_power_of_two(layer) if layer else 0, COMBINE_ALL) if v > ag_default}
    )
    return [
        Lever(
            "overlap-limit",
            {xo.OVERLAP_LIMIT: "overlap-limit"},
            ({}, *(_flags({xo.OVERLAP_LIMIT: v}) for v in limits)),
            ("1", *(str(v) for v in limits)),
            _skip_overlap,
            together=1,  # the first limit above 1
        ),
        _pipeline("all-gather"),
        _pipeline("reduce-scatter"),
        _pipeline("all-reduce"),
        _toggle("double-buffering", xo.WHILE_LOOP_DOUBLE_BUFFERING, _skip_double_buffering, 1),
        _toggle("start-early", xo.START_AS_EARLY_AS_POSSIBLE, _skip_start_early, 1),
        _toggle("xla-multi-streaming", xo.MULTI_STREAMING, _skip_multi_streaming),
        Lever(
            "scale-up-overlap-limit",
            {
                xo.SCALE_UP_OVERLAP_LIMIT: "scale-up-overlap-limit",
                xo.COLLECTIVE_DOMAIN_ASSIGNMENT: "collective-domain",
            },
            (
                {},
                {xo.COLLECTIVE_DOMAIN_ASSIGNMENT: xo.SCALE_UP_FABRIC},
                *(
                    {
                        xo.COLLECTIVE_DOMAIN_ASSIGNMENT: xo.SCALE_UP_FABRIC,
                        xo.SCALE_UP_OVERLAP_LIMIT: v,
                    }
                    for v in SCALE_UP_LIMITS
                ),
            ),
            ("default", "nvlink-domain", *(f"nvlink-domain+limit {v}" for v in SCALE_UP_LIMITS)),
            _skip_scale_up,
            aliases=("scale-up-overlap",),  # its name up to 0.2.0
        ),
        Lever(
            "windowed-einsum",
            {xo.WINDOWED_EINSUM_THRESHOLD_MIB: "windowed-einsum-threshold-mib"},
            ({}, {xo.WINDOWED_EINSUM_THRESHOLD_MIB: WINDOWED_EINSUM_ALL_MIB}),
            ("default", "all GEMMs"),
            _skip_windowed_einsum,
            pairs=False,
        ),
        Lever(
            "all-reduce-combine",
            {xo.COMBINE_THRESHOLD["all-reduce"]: "all-reduce-combine-threshold"},
            ({}, *(_flags({xo.COMBINE_THRESHOLD["all-reduce"]: v}) for v in ar_values)),
            ("default", *(format_bytes(v) for v in ar_values)),
            _skip_combine(("all-reduce",)),
            pairs=False,
        ),
        Lever(
            "gather-scatter-combine",
            {
                ag_rs[0]: "all-gather-combine-threshold",
                ag_rs[1]: "reduce-scatter-combine-threshold",
            },
            ({}, *(_flags(dict.fromkeys(ag_rs, v)) for v in gather_values)),
            ("default", *(format_bytes(v) for v in gather_values)),
            _skip_combine(("all-gather", "reduce-scatter")),
            pairs=False,
        ),
    ]


# A lever's names and words do not depend on the module: read them from the levers of
# a module with no collectives.
_EVERY_LEVER = levers(CollectiveCensus(0, 0, frozenset(), frozenset(), False, 0))
LEVER_NAMES = tuple(lv.name for lv in _EVERY_LEVER)
# An older name of a lever -> its name.
LEVER_ALIASES = {alias: lv.name for lv in _EVERY_LEVER for alias in lv.aliases}
# Each XLA option a lever sets -> its word in a configuration's settings, in lever order.
_WORDS = {option: word for lv in _EVERY_LEVER for option, word in lv.words.items()}


def describe(options: Mapping[str, object]) -> str:
    """``overlap-limit=4, pipeline-all-gather=on``; ``XLA defaults`` for none. An option
    no lever sets is named as XLA spells it, after the others."""
    if not options:
        return "XLA defaults"
    words = []
    for name in sorted(options, key=_option_order):
        value = options[name]
        if isinstance(value, bool):
            text = "on" if value else "off"
        elif isinstance(value, str) and value.startswith(xo.ENUM_PREFIXES):
            text = xo.as_xla_flags({name: value})[0].split("=", 1)[1].lower()
        elif name in xo.COMBINE_THRESHOLD.values() and isinstance(value, int):
            text = format_bytes(value)
        else:
            text = str(value)
        words.append(f"{_WORDS.get(name, name)}={text}")
    return ", ".join(words)


def _option_order(name: str) -> tuple[int, str]:
    order = list(_WORDS)
    return (order.index(name) if name in order else len(order), name)


# -- the census of a module's collectives -------------------------------------------------


def collective_census(
    module: Module, pairs: Sequence[AsyncPair], domain_size: int
) -> CollectiveCensus:
    """The :class:`CollectiveCensus` of a scheduled module and its pairs; ``domain_size``
    is the number of GPUs in one NVLink domain (device d is in domain d // domain_size)."""
    in_loops = _loop_computations(module)
    loop_kinds: set[str] = set()
    combined: set[str] = set()
    kind_bytes: dict[str, int] = {}
    body_bytes: dict[tuple[str, str], int] = {}
    within_host = False

    def inside_one_domain(groups: Sequence[Sequence[int]]) -> bool:
        return any(len(g) >= 2 for g in groups) and all(
            len({d // domain_size for d in g}) <= 1 for g in groups
        )

    def count(kind: str, computation: str, nbytes: int) -> None:
        kind_bytes[kind] = kind_bytes.get(kind, 0) + nbytes
        if computation in in_loops:
            loop_kinds.add(kind)
            key = (computation, kind)
            body_bytes[key] = body_bytes.get(key, 0) + nbytes

    for p in pairs:
        count(p.kind, p.computation, p.bytes)
        comp = module.computation(p.computation)
        start = comp.get(p.start) if comp is not None else None
        if start is not None and len(start.operand_names) >= 2:
            combined.add(p.kind)
        within_host = within_host or inside_one_domain(p.groups)
    plain = 0
    paired = {p.start for p in pairs} | {p.done for p in pairs}
    for comp in module.computations:
        for inst in comp.instructions:
            if inst.opcode not in COLLECTIVE_OPCODES or inst.name in paired:
                continue
            plain += 1
            count(inst.opcode, comp.name, inst.shape.byte_size)
            if len(inst.operand_names) >= 2:
                combined.add(inst.opcode)
            try:
                groups = device_groups(module, inst, inst.opcode)
            except Exception:  # an attribute this front end cannot read: not scale-up
                continue
            within_host = within_host or inside_one_domain(groups)
    layer: dict[str, int] = {}
    for (_, kind), nbytes in body_bytes.items():
        layer[kind] = max(layer.get(kind, 0), nbytes)
    async_pairs = sum(1 for p in pairs if not p.sync)
    return CollectiveCensus(
        async_pairs=async_pairs,
        collectives=len(pairs) + plain,
        loop_kinds=frozenset(loop_kinds),
        combined_kinds=frozenset(combined),
        within_host=within_host,
        sync_collectives=plain + sum(1 for p in pairs if p.sync),
        kind_bytes=tuple(sorted(kind_bytes.items())),
        layer_bytes=tuple(sorted(layer.items())),
    )


def _loop_computations(module: Module) -> set[str]:
    """Names of while bodies and conditions, and what they call, transitively."""
    found: set[str] = set()
    todo: list[str] = []
    for inst in module.instructions():
        if inst.opcode == "while":
            for key in ("body", "condition"):
                value = inst.attribute(key)
                if value:
                    todo.append(value.strip().lstrip("%"))
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        comp = module.computation(name)
        if comp is None:
            continue
        for inst in comp.instructions:
            keys = ("body", "condition", "to_apply") if inst.opcode in ("while", "call") else ()
            for key in keys:
                value = inst.attribute(key)
                if value:
                    todo.append(value.strip().lstrip("%"))
    return found
