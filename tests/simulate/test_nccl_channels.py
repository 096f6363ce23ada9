"""NCCL's channel rule per GPU kind: the CTAs (= SMs) a collective's kernel holds at
64 KiB, 4 MiB and 256 MiB, as NCCL 2.30.7 gives them (``nccl.py`` cites the lines).

Each expected count is worked out from NCCL's code for that GPU, and where NCCL's own
logs show the communicator's counts they agree (24 coll / 16 NVLS / 32 p2p channels on
8 H100s, 32 / 24 on GB200 NVL72, 24 on 8 A100s, 16 across DGX hosts). The cost model
picks the algorithm and protocol (LL for small buffers, Simple for large), as NCCL's
tuner does; the rule then gives the CTAs:

- a ring on LL keeps ``nBytes // (512 threads x 8 x ranks)`` channels: 64 KiB over 8
  GPUs 2, over 32 GPUs 1; on Simple ``nBytes // (512 x 64)``; both capped at the
  communicator's channels (24 on H100 and A100, 32 on B200, 16 across hosts);
- an all-reduce on Simple takes NVLink SHARP where the GPU has it: 16 CTAs on H100,
  24 on B200, whatever the size; a tree on LL across hosts ``nBytes // (512 x 8)``;
- send/receive of 8 ranks: one peer's share of 32 p2p channels halved to 4, 1 below
  64 KiB, doubled while a part exceeds 16 MiB (16 at 256 MiB); an all-to-all of 8
  ranks holds 7 peers' channels: 7, then 28.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from xla_streams.simulate import get_target, load_target
from xla_streams.simulate.cost import collective_cost
from xla_streams.simulate.targets import Target

TARGET_FILES = Path(__file__).resolve().parents[2] / "xla_streams" / "targets"

SIZES = (64 << 10, 4 << 20, 256 << 20)
ONE_HOST = (tuple(range(8)),)
FOUR_HOSTS = (tuple(range(32)),)  # 4 hosts of 8 GPUs
RING_OF_8 = tuple((i, (i + 1) % 8) for i in range(8))


def ctas(target: Target, kind: str, groups: tuple[tuple[int, ...], ...]) -> list[int]:
    return [collective_cost(kind, groups, size, target).sms for size in SIZES]


@pytest.mark.parametrize("name", ["h100", "h200"])
def test_hopper(name: str) -> None:
    t = get_target(name)
    assert ctas(t, "all-gather", ONE_HOST) == [2, 24, 24]
    assert ctas(t, "reduce-scatter", ONE_HOST) == [2, 24, 24]
    assert ctas(t, "all-reduce", ONE_HOST) == [2, 16, 16]  # ring LL, then NVLS
    assert ctas(t, "all-to-all", ONE_HOST) == [7, 28, 28]
    assert ctas(t, "collective-permute", RING_OF_8) == [1, 4, 16]
    assert ctas(t, "all-gather", FOUR_HOSTS) == [1, 16, 16]
    assert ctas(t, "reduce-scatter", FOUR_HOSTS) == [1, 16, 16]
    assert ctas(t, "all-reduce", FOUR_HOSTS) == [16, 16, 16]  # tree LL, then NVLS tree


def test_ampere() -> None:
    t = get_target("a100")  # no NVLink SHARP
    assert ctas(t, "all-gather", ONE_HOST) == [2, 24, 24]
    assert ctas(t, "reduce-scatter", ONE_HOST) == [2, 24, 24]
    assert ctas(t, "all-reduce", ONE_HOST) == [2, 24, 24]
    assert ctas(t, "all-to-all", ONE_HOST) == [7, 28, 28]
    assert ctas(t, "all-gather", FOUR_HOSTS) == [1, 16, 16]
    assert ctas(t, "all-reduce", FOUR_HOSTS) == [16, 16, 16]


@pytest.mark.parametrize("name", ["b200", "gb200"])
def test_blackwell(name: str) -> None:
    t = get_target(name)
    assert ctas(t, "all-gather", ONE_HOST) == [2, 32, 32]
    assert ctas(t, "reduce-scatter", ONE_HOST) == [2, 32, 32]
    # NCCL's tuner moves a one-host all-reduce to NVLS (24 CTAs) from about 2 MiB; the
    # cost model's LL/Simple crossover (its NCCL latencies, targets.py) is at 6 MiB on
    # Blackwell's NVLink, so 4 MiB still runs a 32-channel LL ring here.
    assert ctas(t, "all-reduce", ONE_HOST) == [2, 32, 24]
    assert ctas(t, "all-to-all", ONE_HOST) == [7, 28, 28]
    if name == "b200":  # GB200's NVLink domain is 72 GPUs: 32 are one host
        assert ctas(t, "all-gather", FOUR_HOSTS) == [1, 16, 16]
        assert ctas(t, "all-reduce", FOUR_HOSTS) == [16, 16, 24]


def test_gcp_a3_high_runs_twelve_channels_of_simple() -> None:
    # GPUDirect-TCPX's environment: Ring, Simple, NCCL_MIN/MAX_NCHANNELS=12, no NVLS.
    t = load_target(TARGET_FILES / "gcp_a3_high.json")
    assert ctas(t, "all-gather", ONE_HOST) == [2, 12, 12]
    assert ctas(t, "all-reduce", ONE_HOST) == [2, 12, 12]
    assert ctas(t, "all-reduce", FOUR_HOSTS) == [2, 12, 12]
    # The device-side unpack: 2 more HBM bytes per byte from the network.
    across = collective_cost("all-reduce", ((0, 8, 16, 24),), 256 << 20, t)
    inside = collective_cost("all-reduce", ONE_HOST, 256 << 20, t)
    assert (across.hbm_per_byte, inside.hbm_per_byte) == (5.0, 3.0)


def test_hbm_bytes_per_byte_received_follow_the_protocol() -> None:
    t = get_target("h100")
    small = collective_cost("all-gather", FOUR_HOSTS, 64 << 10, t)
    large = collective_cost("all-gather", FOUR_HOSTS, 256 << 20, t)
    assert (small.protocol, small.hbm_per_byte) == ("ll", 5.0)  # 8 bytes per 16-byte line
    assert (large.protocol, large.hbm_per_byte) == ("simple", 3.0)
    # A local copy launches no NCCL kernel.
    assert collective_cost("all-gather", ((0,),), 1 << 20, t).sms == 0
