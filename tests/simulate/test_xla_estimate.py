"""XLA's own estimate, read from the schedule dump of real deviceless GPU compiles.

The oracle for each figure is another reading of the same compile: the module text
XLA printed (its loops' trip counts, its async pairs) and the dump's own statistics.
"""

from __future__ import annotations

import os
import re

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before anything imports JAX

import pytest

from xla_streams import programs
from xla_streams.hlo import parse_module
from xla_streams.simulate import get_target, what_if
from xla_streams.simulate.xla_estimate import (
    PLACEHOLDER_PAIR_US,
    ScheduleError,
    parse_schedule,
    read_schedule,
)

pytestmark = pytest.mark.slow


def _compile(name: str) -> tuple[str, str]:
    from xla_streams.aot import compile_for_gpu, gpu_topology

    program = programs.PROGRAMS[name]
    topology = gpu_topology("h100", program.num_devices, program.devices_per_host)
    fn, args = program.build(topology.devices)
    compiled = compile_for_gpu(fn, args, dump=False, schedule=True)
    return compiled.as_text, compiled.schedule_text


@pytest.fixture(scope="module")
def tp_dp_2d() -> tuple[str, str]:
    return _compile("tp_dp_2d")


@pytest.fixture(scope="module")
def fsdp_scan() -> tuple[str, str]:
    return _compile("fsdp_scan")


def test_a_loop_free_step_is_the_entry_schedule_and_agrees_with_ours(
    tp_dp_2d: tuple[str, str],
) -> None:
    text, schedule = tp_dp_2d
    estimate = parse_schedule(schedule)
    (entry,) = estimate.computations
    total = float(re.search(r"total_cycles: ([\d.]+)", schedule).group(1))  # type: ignore[union-attr]
    assert entry.runs == 1 and estimate.step_us == pytest.approx(total)
    assert estimate.placeholders == ()
    assert 0 < estimate.exposed_communication_us < estimate.step_us
    # Two models that both price this in-host all-reduce from XLA's measured table:
    # a peer, not an oracle, so within a quarter of each other.
    ours = what_if(parse_module(text), get_target("h100"), (1,)).baseline.step_time * 1e6
    assert estimate.step_us == pytest.approx(ours, rel=0.25)


def test_loop_bodies_count_once_per_iteration(fsdp_scan: tuple[str, str]) -> None:
    text, schedule = fsdp_scan
    estimate = parse_schedule(schedule)
    trips = sorted(int(n) for n in re.findall(r'known_trip_count":\{"n":"(\d+)"', text))
    bodies = sorted(c.runs for c in estimate.computations if c.runs != 1)
    assert bodies == trips and len(bodies) >= 1
    assert estimate.step_us == pytest.approx(
        sum(c.total_us * c.runs for c in estimate.computations)
    )
    assert estimate.step_us > max(c.total_us for c in estimate.computations)


def test_async_fusions_are_named_as_placeholders(fsdp_scan: tuple[str, str]) -> None:
    text, schedule = fsdp_scan
    estimate = parse_schedule(schedule)
    module = parse_module(text)
    async_fusions = {
        inst.name
        for comp in module.computations
        for inst in comp.instructions
        if inst.opcode == "fusion-start"
    }
    assert async_fusions, "the scan's stacked-buffer updates should be async fusions"
    named = {p.start for p in estimate.placeholders}
    assert async_fusions <= named
    # Priced collectives are not placeholders.
    assert not any("gather" in p.start or "scatter" in p.start for p in estimate.placeholders)
    assert estimate.placeholder_us >= PLACEHOLDER_PAIR_US * len(async_fusions)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "no hlo_module"),
        ("hlo_module { name: 'm' entry_computation_id: 1 }\ncomputation_schedules {", "x.txt:2"),
        (
            "hlo_module { name: 'm' }\ncomputation_schedules { computation_id: 7 }",
            "computation 7, not in the module",
        ),
    ],
)
def test_a_damaged_dump_is_refused_with_its_place(text: str, expected: str) -> None:
    with pytest.raises(ScheduleError, match=re.escape(expected)):
        parse_schedule(text, "x.txt")


def test_a_missing_file_says_so(tmp_path: object) -> None:
    with pytest.raises(ScheduleError, match="cannot read the schedule dump"):
        read_schedule(f"{tmp_path}/absent.schedule.txt")


def test_the_priced_step_leaves_out_only_the_placeholders_waits(
    tp_dp_2d: tuple[str, str], fsdp_scan: tuple[str, str]
) -> None:
    """Without placeholders a schedule's idle time is its communication's waste, so the
    priced step is the step; with the scan's 5 ms async fusions it is what is left, and
    then near our own model's step (a peer, within a factor of two)."""
    plain = parse_schedule(tp_dp_2d[1])
    assert plain.priced_step_us == pytest.approx(plain.step_us, rel=1e-6)
    text, schedule = fsdp_scan
    scan = parse_schedule(schedule)
    ours = what_if(parse_module(text), get_target("h100"), (1,)).baseline.step_time * 1e6
    assert scan.priced_step_us < scan.step_us / 5
    assert ours / 2 < scan.priced_step_us < ours * 2
