"""A cluster's network priced from its nccl-tests run (nccl_tests.py): the run's own
collective is priced as the run measured it, other sizes between its rows, and a run
that cannot be read is refused where it is written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from xla_streams.simulate.cost import collective_cost
from xla_streams.simulate.nccl_tests import NcclTestsRun
from xla_streams.simulate.targets import Target, TargetError, load_target

TARGETS = Path(__file__).resolve().parents[2] / "xla_streams" / "targets"
SHIPPED = sorted(p.name for p in TARGETS.glob("*.json") if "network_nccl_tests" in p.read_text())
# What each rank moves per byte of nccl-tests' size (its doc/PERFORMANCE.md), n ranks.
BUS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n}
KIND = {"all_reduce": "all-reduce", "all_gather": "all-gather"}


def test_the_a3_targets_carry_their_runs() -> None:
    assert SHIPPED == ["gcp_a3_high.json", "gcp_a3_mega.json"]


@pytest.mark.parametrize("name", SHIPPED)
def test_the_run_s_own_collective_takes_the_time_it_measured(name: str) -> None:
    # Independent of the code under test: nccl-tests' time is bus bytes over busbw.
    target = load_target(TARGETS / name)
    run = target.network_nccl_tests
    assert run is not None
    world = (tuple(range(run.ranks)),)
    for size, busbw in run.rows:
        measured = BUS[run.collective](run.ranks) * size / (busbw * 1e9)
        cost = collective_cost(KIND[run.collective], world, int(size), target, dtype="F32")
        assert cost.network and cost.protocol == "nccl-tests"
        assert cost.seconds == pytest.approx(measured, rel=1e-9), size


RUN = NcclTestsRun("all_reduce", 16, 8, ((1 << 20, 1.0), (1 << 22, 4.0), (1 << 30, 80.0)))
LINE = 12.5e9  # bytes/s per GPU: 100 GB/s to a host of 8


def nic_bytes(size: float) -> float:
    return 2 * 15 / 16 * size / 8


def test_between_rows_the_share_is_linear_in_log2_of_the_bytes() -> None:
    # Halfway in log2 between 1 MiB (share 0.01) and 4 MiB (0.04): 2 MiB at 0.025.
    x = nic_bytes(1 << 21)
    assert RUN.seconds(x, LINE) == pytest.approx(x / (LINE * 0.025), rel=1e-12)


def test_below_its_smallest_row_a_collective_is_no_faster_and_above_it_keeps_the_last_share() -> (
    None
):
    smallest = nic_bytes(1 << 20) / (LINE * 0.01)
    assert RUN.seconds(nic_bytes(1 << 20), LINE) == pytest.approx(smallest, rel=1e-12)
    assert RUN.seconds(nic_bytes(1 << 10), LINE) == pytest.approx(smallest, rel=1e-12)
    x = nic_bytes(1 << 33)
    assert RUN.seconds(x, LINE) == pytest.approx(x / (LINE * 0.8), rel=1e-12)


def ring_all_reduce_latency(
    target: Target, ranks: int, hosts: int, protocol: str = "simple"
) -> float:
    """NCCL's latency of a ring all-reduce (tuning.cc): 2 (n-1) steps, 2 (hosts-1) of
    them over the network, at the target's per-step latencies for ``protocol``."""
    p = target.protocols[protocol]
    steps, network = 2 * (ranks - 1), 2 * (hosts - 1)
    return (
        p.ring_base_latency
        + (steps - network) * p.ring_step_latency(False)
        + network * p.ring_step_latency(True)
    )


def test_a_collective_across_hosts_takes_the_share_its_nic_bytes_reach() -> None:
    # Two ranks, one on each host: a ring all-reduce puts its whole buffer through each
    # GPU's NIC; 64 MiB each way is between the run's 256 MiB and 512 MiB rows. Its ring
    # has 2 steps where the run's 16 ranks had 30: that latency is not its own.
    target = load_target(TARGETS / "gcp_a3_high.json")
    run = target.network_nccl_tests
    assert run is not None
    size = 64 << 20
    cost = collective_cost("all-reduce", ((0, 8),), size, target, dtype="F32")
    (a, ba), (b, bb) = run.rows[8], run.rows[9]  # 256 MiB, 512 MiB
    xa, xb = (BUS["all_reduce"](16) * s / 8 for s in (a, b))
    w = math.log2(size / xa) / math.log2(xb / xa)
    share = (ba + w * (bb - ba)) * 1e9 / (8 * target.network_bandwidth)
    measured = size / (target.network_bandwidth * share)
    fewer_steps = ring_all_reduce_latency(target, 2, 2) - ring_all_reduce_latency(target, 16, 2)
    assert fewer_steps < 0
    assert cost.seconds == pytest.approx(measured + fewer_steps, rel=1e-9)
    # The flat efficiency alone would have priced it faster.
    flat = size / (target.network_bandwidth * target.network_efficiency)
    assert cost.seconds > flat


def run_of(target: Target) -> NcclTestsRun:
    assert target.network_nccl_tests is not None
    return target.network_nccl_tests


def test_on_more_hosts_a_collective_adds_the_latency_of_its_longer_ring() -> None:
    # 16 A3 High VMs of 8: a ring (TCPX runs NCCL_ALGO=Ring) of 254 steps, 30 over the
    # network, where the run's (2 VMs of 8) had 30 and 2; the bytes through each NIC
    # take what the run measured.
    target = load_target(TARGETS / "gcp_a3_high.json")
    run = target.network_nccl_tests
    assert run is not None and (run.ranks, run.ranks_per_host) == (16, 8)
    size = 64 << 20
    cost = collective_cost("all-reduce", (tuple(range(128)),), size, target, dtype="F32")
    assert cost.algorithm == "ring"
    nic = BUS["all_reduce"](128) * size / 8
    longer = ring_all_reduce_latency(target, 128, 16) - ring_all_reduce_latency(target, 16, 2)
    assert longer > 0.9e-3  # NCCL's own figures: about a millisecond more
    assert cost.seconds == pytest.approx(
        run.seconds(nic, target.network_bandwidth) + longer, rel=1e-9
    )


@pytest.mark.parametrize(("protocol", "other"), [("simple", "ll"), ("ll", "simple")])
def test_a_run_faster_than_nccl_s_latency_figures_scales_them(
    tmp_path: Path, protocol: str, other: str
) -> None:
    # A ring-only fabric whose 64 KiB all-reduce over 2 hosts of 8 took 6.1 us, less
    # than NCCL's figures give its ring in latency alone (123 us in Simple, 22 in LL):
    # all of the measured time was latency, and a ring over 16 hosts takes its own
    # latency in the same proportion. The run's share holds the protocol NCCL picked:
    # the bytes through each NIC are the buffer's, whatever the protocol's overhead.
    path = tmp_path / "cluster.json"
    run = {"collective": "all_reduce", "ranks": 16, "ranks_per_host": 8,
           "size_bytes_busbw_gbps": [[65536, 20.0], [1 << 30, 90.0]]}  # fmt: skip
    cluster = {"network_bandwidth": 12.5e9, "network_nccl_tests": run,
               "nccl_algorithms": ["ring"], "protocols": {other: None}}  # fmt: skip
    path.write_text(json.dumps(cluster))
    target = load_target(path)
    size = 1 << 16
    measured = BUS["all_reduce"](16) * size / 20e9
    own = collective_cost("all-reduce", (tuple(range(16)),), size, target, dtype="F32")
    assert own.seconds == pytest.approx(measured, rel=1e-9)
    ring = ring_all_reduce_latency(target, 16, 2, protocol)
    assert measured < ring
    wide = collective_cost("all-reduce", (tuple(range(128)),), size, target, dtype="F32")
    at_run = run_of(target).seconds(BUS["all_reduce"](128) * size / 8, 12.5e9)
    assert at_run < ring
    longer = ring_all_reduce_latency(target, 128, 16, protocol)
    assert wide.seconds == pytest.approx(longer * at_run / ring, rel=1e-9)


def test_a_cluster_s_nccl_algo_limits_the_all_reduce_algorithms(tmp_path: Path) -> None:
    # Over 16 hosts NCCL's figures prefer a tree (792 us of latency against a ring's
    # 1,058); a cluster whose NCCL_ALGO allows rings only gets a ring.
    path = tmp_path / "cluster.json"
    group = (tuple(range(128)),)
    for algorithms, expected in (
        (["ring", "tree"], "tree"),
        (["ring"], "ring"),
        (["tree"], "tree"),
    ):
        path.write_text(json.dumps({"nccl_algorithms": algorithms, "protocols": {"ll": None}}))
        cost = collective_cost("all-reduce", group, 1 << 16, load_target(path), dtype="F32")
        assert cost.algorithm == expected, algorithms
    for bad in ([], ["ring", "ring"], ["nvls"], "ring", [["ring"]], [1], None):
        path.write_text(json.dumps({"nccl_algorithms": bad}))
        with pytest.raises(TargetError, match="nccl_algorithms must list some of ring, tree"):
            load_target(path)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ([], "network_nccl_tests: expected an object"),
        ({"collective": "alltoall"}, "network_nccl_tests.collective: expected one of"),
        ({"collective": "all_reduce", "ranks": 1}, "ranks: expected an integer of at least 2"),
        (
            {"collective": "all_reduce", "ranks": 8, "ranks_per_host": 8},
            "more ranks than ranks_per_host",
        ),
        (
            {"collective": "all_reduce", "ranks": 16, "ranks_per_host": 8, "size_bytes_busbw_gbps": [[1, 2, 3]]},
            "size_bytes_busbw_gbps[0]: expected [bytes, GB/s]",
        ),
        (
            {"collective": "all_reduce", "ranks": 16, "ranks_per_host": 8, "size_bytes_busbw_gbps": [[2, 1.0], [1, 1.0]]},
            "size_bytes_busbw_gbps[1]: sizes must rise",
        ),
        (
            {"collective": "all_reduce", "ranks": 16, "ranks_per_host": 8, "size_bytes_busbw_gbps": [[1, -1.0]]},
            "both positive",
        ),
        (
            {"collective": "all_reduce", "ranks": 16, "ranks_per_host": 8, "size_bytes_busbw_gbps": [[10**400, 1.0]]},
            "both positive",
        ),
        (
            {"collective": "all_reduce", "ranks": 12, "ranks_per_host": 8, "size_bytes_busbw_gbps": [[1, 1.0]]},
            "ranks must fill whole hosts of ranks_per_host",
        ),
        (
            {"collective": "all_reduce", "ranks": 16, "ranks_per_host": 8, "size_bytes_busbw_gbps": [[1, 500.0]]},
            "a busbw above ranks_per_host x network_bandwidth",
        ),
        (
            {"collective": "all_reduce", "ranks": 32, "ranks_per_host": 16, "size_bytes_busbw_gbps": [[1, 1.0]]},
            "ran 16 ranks to a host, the target's hosts have 8 GPUs",
        ),
        ({"collective": "all_reduce", "ranks": 16, "ranks_per_host": 8, "size": 1}, "unknown field 'size'"),
    ],
)  # fmt: skip
def test_a_run_that_cannot_be_read_is_refused_with_its_field(
    tmp_path: Path, entry: object, message: str
) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"network_bandwidth": 12.5e9, "network_nccl_tests": entry}))
    with pytest.raises(TargetError) as e:
        load_target(path)
    assert str(e.value).startswith(f"{path}: ")
    assert message in str(e.value)
