"""What one NCCL kernel holds while it runs: its channels (one CTA each, and a CTA of
NCCL's takes a whole SM), and the HBM bytes it moves per byte it receives.

Read from NCCL 2.30.7 (NVIDIA/nccl@5067397c; paths below are of that commit). The
communicator's channel counts are the target's (``Target.nccl_channels`` inside a
host, ``nccl_channels_network`` across hosts, ``nvls_channels``, the environment's
cap ``nccl_max_channels``; ``targets.py`` says where each comes from); each call
then takes what NCCL's ``topoGetAlgoInfo`` gives it (``src/enqueue.cc`` 2070-2115):

- ring and tree: ``nc = nChannels`` and ``nt`` = the protocol's threads (512 for LL
  and Simple, ``src/include/device.h`` 95-97), then ``while nBytes < nc * nt *
  threshold: nc--`` (at least 1), with the thread threshold 8 for LL (times the ranks
  for a ring: ``src/graph/tuning.cc`` 593) and 64 for Simple
  (``src/include/comm.h`` 49-51); so ``nc = clamp(nBytes // (nt * threshold), 1,
  nChannels)``. ``nBytes`` is the whole buffer (the all-gather's output, the
  reduce-scatter's input: ``src/include/enqueue.h`` ``ncclFuncMaxSendRecvCount``),
  which ``AsyncPair.bytes`` is;
- NVLink SHARP (an all-reduce on the Simple protocol, when the target has NVLS
  channels): ``nvlsChannels`` whatever the size (enqueue.cc 2084-2090; NVLS runs only
  on Simple and all-gather/reduce-scatter take a ring: tuning.cc 295-301;
  ``src/transport/nvls.cc`` 155-157, 209-213 set 16 on Hopper, 24 on one Blackwell
  host); across hosts the NVLS tree with as many;
- send, receive, all-to-all (``scheduleP2pTasksToPlan``, enqueue.cc 1130-1146, and
  ``addP2pToPlan`` 866-925): a peer takes ``nch = min(nChannelsMin, ceil(bytes /
  minPart))``, doubled while a part exceeds ``maxPart`` and ``nch <= perPeer / 2``,
  where ``nChannelsMin`` is ``perPeer`` halved while ``nChannelsMin * ranks >
  p2pChannels``; ``minPart``/``maxPart`` are the P2P chunk / 8 and x 32 on one host
  (chunk 512 KiB, ``NCCL_P2P_NVL_CHUNKSIZE``), / 2 and x 1 across hosts (128 KiB,
  ``NCCL_P2P_NET_CHUNKSIZE``: ``src/init.cc`` 818-838). ``p2pChannels`` is the
  communicator's channels rounded up to a power of two (``src/graph/paths.cc``
  980-991), and so is the per-peer count inside a host (NVLink's per-peer count,
  ``2 x`` the path over one link's bandwidth, exceeds it); across hosts a peer gets
  ``ceil(NIC GB/s / 14)`` (``NCCL_P2P_PER_CHANNEL_NET_BW``, paths.cc 918-953). An
  all-to-all holds the channels of all its peers together.

The CTAs a kernel launches are also capped by 32 KiB cells of traffic
(enqueue.cc 585, 657-674), which never binds below these counts for LL and Simple.
A CTA of NCCL takes a whole SM: 640 threads at 96 registers (``makefiles/common.mk``
103) and shared memory sized for 640 threads (device.h 535-570); "NCCL CTAs won't
share an SM with compute kernels" (sjeaugey, NVIDIA/nccl#689).

HBM bytes per byte received (``src/device/all_reduce.h``, ``prims_simple.h``): a
ring or tree on Simple writes what arrives into its FIFO, reads it, and writes the
output or forwards it: 3 (an all-reduce ring, ``(6 - 4/n) S`` against ``2 (n-1)/n
S`` received, 3.1 for 8 GPUs); LL lines carry 8 bytes in 16 (``union
ncclLLFifoLine``, device.h 75-88), doubling the FIFO's two: 5. GPUDirect-TCPX/TCPXO
unpack what the NIC wrote into the FIFO with the kernel's own warps
(``src/device/network/unpack/unpack.h``): 2 more per byte from the network. sjeaugey
in NVIDIA/nccl#1428: "300GB/s needs to be multiplied by at least 2x for memory
bandwidth ... If you add reading from or writing to user data, it can be 3x."
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xla_streams.simulate.targets import Target

# Threads per CTA of a ring or tree by protocol, and the bytes per thread below which
# NCCL takes a channel away (LL's times the ranks on a ring).
_THREADS = {"ll": 512, "simple": 512}
_THREAD_THRESHOLD = {"ll": 8, "simple": 64}
# P2P chunk sizes (bytes): NCCL_P2P_NVL_CHUNKSIZE inside a host, NCCL_P2P_NET_CHUNKSIZE
# across hosts, and the bandwidth (GB/s) a P2P channel carries over the network.
_P2P_CHUNK_NVLINK = 512 << 10
_P2P_CHUNK_NETWORK = 128 << 10
_P2P_CHANNEL_NETWORK_GBPS = 14
# HBM bytes per byte received: Simple, LL; and what an unpacking network adds.
_HBM_PER_BYTE = {"simple": 3.0, "ll": 5.0}
_UNPACK_PER_BYTE = 2.0


@dataclass(frozen=True)
class NcclKernel:
    """One call's NCCL kernel: its algorithm, its CTAs (= SMs held while it runs), and
    the HBM bytes it moves on a GPU per byte that GPU receives."""

    algorithm: str  # "ring", "tree", "nvls", "nvls-tree", "p2p"
    ctas: int
    hbm_per_byte: float


def kernel(
    target: Target,
    family: str,
    nbytes: int,
    *,
    ranks: int,
    network: bool,
    local: int,
    algorithm: str,
    protocol: str,
) -> NcclKernel:
    """The kernel NCCL launches for a collective of the cost model's ``family``
    (``CollectiveKind.cost``) of ``nbytes`` over ``ranks`` GPUs, across hosts
    (``network``, ``local`` of them on a host) or not, on the ``algorithm`` and
    ``protocol`` the cost model picked as NCCL's tuner does (``cost.py``)."""
    hbm = _HBM_PER_BYTE.get(protocol, _HBM_PER_BYTE["simple"])
    if network and target.network_unpack:
        hbm += _UNPACK_PER_BYTE / max(local, 1)  # a ring's 1/local comes off the NIC
    if family in ("pairwise", "one-hop"):
        return NcclKernel("p2p", _p2p_ctas(target, family, nbytes, ranks, network), hbm)
    channels = communicator_channels(target, network)
    if family == "all-reduce" and protocol == "simple" and target.nvls_channels > 0:
        name = "nvls-tree" if network else "nvls"
        return NcclKernel(name, _capped(target, target.nvls_channels), hbm)
    nt = _THREADS.get(protocol, _THREADS["simple"])
    threshold = _THREAD_THRESHOLD.get(protocol, _THREAD_THRESHOLD["simple"])
    if protocol == "ll" and algorithm == "ring":
        threshold *= ranks
    return NcclKernel(algorithm, max(1, min(channels, nbytes // (nt * threshold))), hbm)


def communicator_channels(target: Target, network: bool) -> int:
    """``comm->nChannels`` of a communicator inside one host or across hosts: the
    target's count, doubled below 16 when the network unpacks on the GPU
    (``NCCL_UNPACK_DOUBLE_NCHANNELS``, ``src/graph/connect.cc`` 485-490), capped by
    the environment (``NCCL_MAX_NCHANNELS``, connect.cc 492-506)."""
    channels = target.nccl_channels_network if network else target.nccl_channels
    if network and target.network_unpack and channels < 16:
        channels *= 2
    return _capped(target, channels)


def _capped(target: Target, channels: int) -> int:
    cap = target.nccl_max_channels
    return min(channels, cap) if cap > 0 else channels


def _p2p_ctas(target: Target, family: str, nbytes: int, ranks: int, network: bool) -> int:
    p2p_channels = _pow2_up(communicator_channels(target, network))
    if network:
        nic_gbps = target.network_bandwidth / 1e9
        per_peer = min(p2p_channels, max(1, math.ceil(nic_gbps / _P2P_CHANNEL_NETWORK_GBPS)))
        min_part, max_part = _P2P_CHUNK_NETWORK // 2, _P2P_CHUNK_NETWORK
    else:
        per_peer = p2p_channels
        min_part, max_part = _P2P_CHUNK_NVLINK // 8, _P2P_CHUNK_NVLINK * 32
    channels_min = per_peer
    while channels_min * ranks > p2p_channels and channels_min > 1:
        channels_min //= 2
    peers = max(ranks - 1, 1) if family == "pairwise" else 1
    per_peer_bytes = max(nbytes // peers, 1)
    nch = min(channels_min, -(-per_peer_bytes // min_part))
    part = max(min_part, -(-per_peer_bytes // nch))
    while part > max_part and nch <= per_peer // 2:
        nch *= 2
        part = -(-per_peer_bytes // nch)
    return min(p2p_channels, peers * nch)


def _pow2_up(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()
