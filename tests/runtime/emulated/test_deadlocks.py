"""The deadlock rule, executed: collectives in flight together whose groups share two
or more devices must share a stream, because NCCL kernels on different streams may
start in different orders on different ranks. The rule relies on what streams.md
says it does: kernels of different streams co-resident on the GPU.

- Where the GPU keeps a waiting collective kernel of every stream resident
  (``residency`` at least the streams in use), no order deadlocks: every op then waits
  only for work issued before it, or for its own peers.
- On the model's strictest GPU (``residency`` 1: one waiting collective kernel per
  device), the rule removes the cycles of two collectives that share two devices,
  which form as soon as two ranks take their streams in different orders: without
  it they deadlock, the cycle named when it forms. It does not remove the cycle of
  four that tensor-parallel rows and data-parallel columns can close, sharing one
  device each, which the rule accepts deliberately (streams.md, "Not tied").
- One hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1) starts every device's work in
  its issue order, the same on every rank of an SPMD program, and deadlocks neither.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from xla_streams.runtime.emulator import replay

REPO = Path(__file__).resolve().parents[3]
SEEDS = range(8)
SEEDS_UNTIL_A_DEADLOCK = range(64)
STRICTEST = {"residency": 1}
A_SLOT_PER_STREAM = {"residency": 2}  # the rule leaves tp_dp_2d two streams

# One op of a reported cycle: its label, stream, device and communicator.
CYCLE_OP = re.compile(
    r"\[\S+ \(op \d+ start, stream=(\d+)\) \w+\([^)]*\) on device (\d+),"
    r"[^\]]*? of communicator (\S+), call (\d+)\]"
)


@pytest.fixture(scope="module")
def tp_dp_2d(lower: Callable[..., str]) -> str:
    return lower((REPO / "hlo_fixtures" / "tp_dp_2d.limit4.text.hlo").read_text())


def without_the_rule(lowered: str) -> str:
    """Every pair on stream op_id mod 4, as round-robin would put it without the rule."""

    def moved(m: re.Match[str]) -> str:
        return f"op_id = {m[1]} : i64, {m[2]}stream = {int(m[1]) % 4} : i64"

    pattern = r'op_id = (\d+) : i64, (name = "[^"]*", kind = "[^"]*", )stream = \d+ : i64'
    return re.sub(pattern, moved, lowered)


def deadlocks(result: dict[str, Any]) -> list[str]:
    cycles = [r["message"] for r in result["reports"] if r["kind"] == "deadlock"]
    for cycle in cycles:  # a cycle names every op it counts, two at least
        counted = re.match(r"a cycle of (\d+) ops", cycle)
        assert counted and int(counted[1]) == cycle.count(" on device ") >= 2, cycle
    return cycles


def collectives_of(cycle: str) -> dict[tuple[str, str], tuple[str, set[int]]]:
    """Each collective of a cycle (communicator, call) -> (stream, its devices in it)."""
    found: dict[tuple[str, str], tuple[str, set[int]]] = {}
    for stream, device, communicator, call in CYCLE_OP.findall(cycle):
        found.setdefault((communicator, call), (stream, set()))[1].add(int(device))
    return found


def pairs_the_rule_forbids(cycle: str) -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """Two collectives of the cycle on different streams that share two devices in it."""
    ops = collectives_of(cycle)
    return [
        (a, b)
        for a, b in itertools.combinations(ops, 2)
        if ops[a][0] != ops[b][0] and len(ops[a][1] & ops[b][1]) >= 2
    ]


def test_the_rule_serialises_pairs_that_share_devices(tp_dp_2d: str) -> None:
    assert set(re.findall(r"stream = (\d) : i64", tp_dp_2d)) == {"0", "1"}
    assert set(re.findall(r"stream = (\d) : i64", without_the_rule(tp_dp_2d))) == {
        "0",
        "1",
        "2",
        "3",
    }


@pytest.mark.parametrize("connections", ["8", "1"])
def test_with_a_slot_for_each_stream_as_assigned_never_deadlocks(
    tp_dp_2d: str, connections: str, run_replay: Callable[..., Any]
) -> None:
    plan = replay.plan(tp_dp_2d, devices=8)
    for seed in SEEDS:
        result = run_replay(
            plan,
            env={"CUDA_DEVICE_MAX_CONNECTIONS": connections},
            configure={**A_SLOT_PER_STREAM, "seed": seed},
            timeout_ms=60000,
        )
        assert deadlocks(result) == [] and result["blocked"] == [] and result["mismatches"] == []


def test_on_the_strictest_gpu_as_assigned_no_cycle_pairs_two_collectives_sharing_two_devices(
    tp_dp_2d: str, run_replay: Callable[..., Any]
) -> None:
    plan = replay.plan(tp_dp_2d, devices=8)
    for seed in SEEDS:
        result = run_replay(plan, configure={**STRICTEST, "seed": seed}, timeout_ms=60000)
        assert result["errors"] == [] and result["mismatches"] == []
        for cycle in deadlocks(result):
            # Only the cycle the rule accepts: TP rows and DP columns, four collectives
            # on alternating streams, each two sharing at most one device.
            assert pairs_the_rule_forbids(cycle) == [], cycle
            assert len(collectives_of(cycle)) >= 4, cycle


def test_without_the_rule_it_deadlocks_and_names_the_cycle_before_any_timeout(
    tp_dp_2d: str, run_replay: Callable[..., Any]
) -> None:
    plan = replay.plan(without_the_rule(tp_dp_2d), devices=8)
    found: list[str] = []
    # A seed fixes the model's choices, not the host threads' timing, which decides
    # what is ready when it chooses: about one run in three deadlocks on two
    # collectives sharing two devices, so seeds are tried until one does.
    for seed in SEEDS_UNTIL_A_DEADLOCK:
        result = run_replay(plan, configure={**STRICTEST, "seed": seed}, timeout_ms=60000)
        found += [cycle for cycle in deadlocks(result) if pairs_the_rule_forbids(cycle)]
        assert result["errors"] == []  # found long before the 60 s timeout
        if found:
            break
    assert found, "no seed deadlocked: the check, or the model, lost its teeth"
    cycle = found[0]
    assert cycle.startswith("a cycle of ") and " waits for [" in cycle
    # Each op of the cycle is named: label, device, stream and communicator.
    assert re.search(r"\[all-reduce-start\S* \(op \d+ start, stream=\d\) ncclAllReduce", cycle)
    assert "rank " in cycle and "of communicator" in cycle


def test_one_hardware_queue_deadlocks_no_spmd_program(
    tp_dp_2d: str, run_replay: Callable[..., Any]
) -> None:
    """Even without the rule, on the strictest GPU: with one queue every device starts
    its collectives in issue order, which is the same on every rank."""
    plan = replay.plan(without_the_rule(tp_dp_2d), devices=8)
    for seed in SEEDS:
        result = run_replay(
            plan,
            env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
            configure={**STRICTEST, "seed": seed},
            timeout_ms=60000,
        )
        assert deadlocks(result) == [] and result["blocked"] == [] and result["mismatches"] == []
