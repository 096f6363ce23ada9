"""Each shared lever's predicted effect on the scanned and the unrolled twin (issue 32).

fsdp_tp_remat_scan and fsdp_tp_remat_unrolled are one model (same mesh, same stacked
weights under jax.checkpoint), its 8 layers in a while loop or in a Python loop. A
lever that acts on both should be predicted to move both alike; where it cannot (the
loop levers only rewrite while loops), the test says what XLA compiled instead.

Each twin is compiled deviceless (about 8 to 15 s each) at XLA's defaults and with
each lever setting below, taken from tune's own levers so the options are the ones
tune compiles; the prediction is tune's one-stream price of each compile (the
one-stream what-if, or XLA's two streams under its multi-streaming).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before anything imports JAX

from xla_streams import jax_compat
from xla_streams.collectives import DEFAULT_POLICY, StreamModel
from xla_streams.hlo import Module, parse_module
from xla_streams.simulate import get_target, what_if
from xla_streams.streams import find_async_pairs
from xla_streams.tuning.evaluation import predict
from xla_streams.tuning.levers import (
    CollectiveCensus,
    Flags,
    collective_census,
    describe,
    levers,
    overlap_limit,
)
from xla_streams.xla_options import MULTI_STREAMING

pytestmark = pytest.mark.slow

SCAN, UNROLLED = "fsdp_tp_remat_scan", "fsdp_tp_remat_unrolled"
TWINS = (SCAN, UNROLLED)
H100 = get_target("h100")

# Tune's levers; the settings read here (overlap limits, toggles) do not depend on the
# module's collectives, so the levers of a module without any list them.
_LEVERS = {lv.name: lv for lv in levers(CollectiveCensus(0, 0, frozenset(), frozenset(), False, 0))}


def setting(**labels: str) -> Flags:
    """The options tune compiles for these levers' settings, by label (``overlap_limit="2"``)."""
    flags: Flags = {}
    for name, label in labels.items():
        lever = _LEVERS[name.replace("_", "-")]
        flags.update(lever.settings[lever.labels.index(label)])
    return flags


# Settings of the levers that act on both twins: the overlap limits tune tries,
# start-early and XLA's multi-streaming alone (one-lever moves) and beside the first
# overlap limit (the pair tune's search also tries; both only schedule collectives to
# overlap, which needs a limit above 1).
SHARED = (
    setting(overlap_limit="2"),
    setting(overlap_limit="4"),
    setting(start_early="on"),
    setting(xla_multi_streaming="on"),
    setting(overlap_limit="2", start_early="on"),
    setting(overlap_limit="2", xla_multi_streaming="on"),
)
DISAGREE = pytest.mark.xfail(
    strict=True,
    reason="XLA's two streams in turn pair different collectives in a loop body than "
    "unrolled (see the test's docstring)",
)
# A lever that only rewrites while loops.
LOOP_ONLY = setting(double_buffering="on")
SETTINGS: tuple[Flags, ...] = ({}, *SHARED, LOOP_ONLY)


@dataclass(frozen=True)
class Compiled:
    text: str
    module: Module
    flags: Mapping[str, object]
    devices_per_host: int

    @cached_property
    def census(self) -> CollectiveCensus:
        pairs = find_async_pairs(self.module, StreamModel(overlap_limit(self.flags)))
        return collective_census(self.module, pairs, self.devices_per_host)

    @cached_property
    def schedule(self) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
        """Every computation's scheduled sequence of instructions (name and opcode)."""
        return tuple(
            (c.name, tuple((i.name, i.opcode) for i in c.instructions))
            for c in self.module.computations
        )


Price = Callable[[Compiled], float]


@pytest.fixture(scope="module")
def compiled() -> dict[tuple[str, str], Compiled]:
    """Both twins compiled deviceless for 4 hosts of 8 H100s with every setting."""
    assert jax_compat.cuda_plugin_module() is not None, (
        "install the gpu-aot extra (jax[cuda12]): pip install -e '.[test,gpu-aot]'"
    )
    from xla_streams.aot import compile_for_gpu, gpu_topology
    from xla_streams.programs import PROGRAMS

    out = {}
    for name in TWINS:
        program = PROGRAMS[name]
        topology = gpu_topology("h100", program.num_devices, program.devices_per_host)
        fn, args = program.build(topology.devices)
        for flags in SETTINGS:
            t0 = time.perf_counter()
            text = compile_for_gpu(fn, args, compiler_options=flags, dump=False).as_text
            print(f"compiled {name} with {describe(flags)} in {time.perf_counter() - t0:.1f} s")
            out[(name, describe(flags))] = Compiled(
                text, parse_module(text, name), flags, program.devices_per_host
            )
    return out


def one_stream_step(c: Compiled) -> float:
    """Tune's price of a compile on one collective stream (XLA's two under its
    multi-streaming), seconds."""
    return predict(c.text, c.flags, H100, streams=(1,)).results[(1, DEFAULT_POLICY)][0]


def best_step(c: Compiled) -> float:
    """Tune's price of a compile at its best stream count and policy, seconds: what a
    configuration is worth to the search."""
    return min(step for step, *_ in predict(c.text, c.flags, H100).results.values())


def test_the_census_says_the_loop_levers_act_only_on_the_scan(
    compiled: dict[tuple[str, str], Compiled],
) -> None:
    census = {name: compiled[(name, describe({}))].census for name in TWINS}
    acting = {
        name: {lv.name for lv in levers(c) if lv.skip(c) is None} for name, c in census.items()
    }
    print({name: sorted(names) for name, names in acting.items()})
    shared = {"overlap-limit", "start-early", "xla-multi-streaming"}
    loop_only = {"double-buffering", *(n for n in _LEVERS if n.startswith("pipeline-"))}
    assert shared <= acting[SCAN] & acting[UNROLLED]
    assert loop_only <= acting[SCAN]
    assert not loop_only & acting[UNROLLED]


def test_a_loop_lever_changes_the_scan_and_leaves_the_unrolled_twin_as_compiled(
    compiled: dict[tuple[str, str], Compiled],
) -> None:
    """Double buffering unrolls a while loop's body twice: with no loop holding a
    collective, the unrolled twin's compile is XLA's default one."""
    default = {name: compiled[(name, describe({}))] for name in TWINS}
    buffered = {name: compiled[(name, describe(LOOP_ONLY))] for name in TWINS}
    for name in TWINS:
        print(
            f"{name}: async pairs {default[name].census.async_pairs} at XLA's defaults, "
            f"{buffered[name].census.async_pairs} double buffered"
        )
    assert buffered[UNROLLED].schedule == default[UNROLLED].schedule
    assert buffered[UNROLLED].census.async_pairs == default[UNROLLED].census.async_pairs
    assert buffered[SCAN].schedule != default[SCAN].schedule
    assert buffered[SCAN].census.async_pairs > default[SCAN].census.async_pairs


def baseline_disagreement(compiled: dict[tuple[str, str], Compiled], price: Price) -> float:
    """How far apart the twins' predicted steps are at XLA's defaults (relative to the
    smaller): the simulator prices one model two ways this differently, so a lever's
    effect (a ratio of two such steps) is held to agree no closer than this. A lever
    that took the same time off both steps would move their ratios apart by only this
    much times its own effect."""
    scan, unrolled = (price(compiled[(name, describe({}))]) for name in TWINS)
    return abs(scan - unrolled) / min(scan, unrolled)


def explain(c: Compiled) -> str:
    """What the one-stream what-if says of a compile (ms), and how XLA compiled its
    collectives: async pairs (on the collective stream) and synchronous ones (on the
    compute stream, free to run beside an async one once the limit allows two)."""
    what = what_if(c.module, H100, (1,), (DEFAULT_POLICY,))
    base, census = what.baseline, c.census
    return (
        f"step {base.step_time * 1e3:.3f}, compute {base.compute_time * 1e3:.3f}, "
        f"exposed communication {base.exposed_communication * 1e3:.3f}, "
        f"interference {what.interference * 1e3:.3f}, async pairs {census.async_pairs}, "
        f"synchronous collectives {census.sync_collectives}"
    )


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param(f, marks=DISAGREE) if f.get(MULTI_STREAMING) and len(f) > 1 else f
        for f in SHARED
    ],
    ids=describe,
)
def test_a_shared_levers_effect_agrees_between_the_twins(
    compiled: dict[tuple[str, str], Compiled], flags: Flags
) -> None:
    """At each twin's best stream count (what tune decides on) the effects agree. On
    one stream they do not, because XLA compiled the twins' collectives differently:
    with an overlap limit above 1 the scan keeps a cross-host all-gather and the
    tensor-parallel all-reduces of its loop body synchronous, on the compute stream,
    where they run beside the async all-gather on the collective stream, while the
    unrolled twin makes all its all-gathers async, which queue on one stream and
    overlap on two (measured with jax 0.12: overlap limit 2 gains 6.2% on the scan and
    loses 0.4% on the unrolled twin on one stream, 8.4% and 4.9% at the best K).
    XLA's multi-streaming has no K to choose: its two streams in turn, in post-order,
    put different pairs side by side in a loop body of 10 pairs than in the 51 of the
    unrolled twin (the scan gains 8.5%, the unrolled twin 1.9%); a strict xfail marks
    the disagreement, and fails the day the twins agree."""
    lines = []
    effect: dict[str, dict[str, float]] = {"best": {}, "one stream": {}}
    for name in TWINS:
        default, tuned = compiled[(name, describe({}))], compiled[(name, describe(flags))]
        effect["best"][name] = best_step(tuned) / best_step(default)
        effect["one stream"][name] = one_stream_step(tuned) / one_stream_step(default)
        same = " (compiled as at XLA's defaults)" if tuned.schedule == default.schedule else ""
        lines.append(
            f"{name}: effect {effect['best'][name]:.4f} at the best K, "
            f"{effect['one stream'][name]:.4f} on one stream{same}"
        )
        lines.append(f"  XLA's defaults: {explain(default)}")
        lines.append(f"  {describe(flags)}: {explain(tuned)}")
    best_tolerance = baseline_disagreement(compiled, best_step)
    one_tolerance = baseline_disagreement(compiled, one_stream_step)
    report = "\n".join(
        [f"{describe(flags)}, tolerance {best_tolerance:.4f} (best K), {one_tolerance:.4f} (one)",
         *lines]
    )  # fmt: skip
    print(report)
    best = effect["best"]
    assert best[SCAN] == pytest.approx(best[UNROLLED], abs=best_tolerance), report
