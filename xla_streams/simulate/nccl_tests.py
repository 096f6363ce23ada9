"""A cluster network as nccl-tests measured it: the share of its line rate a collective
reaches at each size, where a flat efficiency would price a small collective as fast,
per byte, as a large one.

A target file's ``network_nccl_tests`` holds one published nccl-tests run on the
cluster's own fabric (``all_reduce_perf``, ``all_gather_perf`` or
``reduce_scatter_perf`` over ``ranks`` GPUs, ``ranks_per_host`` to a host), its
out-of-place ``size`` and ``busbw`` columns as printed. nccl-tests defines ``busbw``
as the bytes each rank moves over the time (``2 (n-1)/n size`` for an all-reduce,
``(n-1)/n size`` for an all-gather or a reduce-scatter: its doc/PERFORMANCE.md), and
a ring through a host's GPUs carries ``1/ranks_per_host`` of them through each GPU's
NIC (``cost.py``'s cross-host rings). So each row says: a collective that puts ``x``
bytes through each GPU's NIC took ``x / (line * e)`` seconds, ``e = busbw /
(ranks_per_host * line)`` the share of the NIC's line rate it reached.

:meth:`NcclTestsRun.seconds` prices any collective across hosts by the bytes it puts
through each NIC: ``e`` linear in log2 of them between the measured rows, the largest
row's beyond them, and below the smallest row that row's time (a smaller message is no
faster, as for XLA's tables). The measured time includes the latency of the run's own
ranks and hosts, so it replaces the model's time, not just its bandwidth, and
``cost.py`` moves that latency to the collective's own: NCCL's latency grows with a
ring's steps (``2 (n-1)`` for an all-reduce, ``2 (hosts-1)`` of them over the network)
or a tree's depth (``src/graph/tuning.cc``), so the same collective priced over the
run's devices says what part of the measured time was latency, and the collective's
own latency replaces it in the same proportion. Assumed: that a collective of another
kind, group or host count reaches the share the measured one reached with as many
bytes per NIC (nccl-tests on more hosts would tell).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from xla_streams._json import is_finite_number

# Bytes each rank moves, per byte of nccl-tests' ``size``, by test (ranks n).
_BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
}


class NcclTestsError(ValueError):
    """A ``network_nccl_tests`` entry that cannot be read; says where."""


@dataclass(frozen=True)
class NcclTestsRun:
    """One nccl-tests run on a cluster's network (see the module docstring)."""

    collective: str  # all_reduce, all_gather or reduce_scatter
    ranks: int
    ranks_per_host: int
    rows: tuple[tuple[float, float], ...]  # (size in bytes, busbw in GB/s), sizes rising

    def shares(self, line: float) -> list[tuple[float, float]]:
        """(bytes through each GPU's NIC, share of ``line`` reached) of each row, for
        a NIC of ``line`` bytes/s per GPU."""
        factor = _BUS_FACTOR[self.collective](self.ranks)
        return [
            (factor * size / self.ranks_per_host, busbw * 1e9 / (self.ranks_per_host * line))
            for size, busbw in self.rows
        ]

    def seconds(self, nic_bytes: float, line: float) -> float:
        """The time of a collective that puts ``nic_bytes`` through each GPU's NIC of
        ``line`` bytes/s, as this run measured it."""
        shares = self.shares(line)
        first_bytes, first_share = shares[0]
        if nic_bytes <= first_bytes:
            return first_bytes / (line * first_share)
        share = shares[-1][1]
        for (a, sa), (b, sb) in pairwise(shares):
            if nic_bytes <= b:
                w = math.log2(nic_bytes / a) / math.log2(b / a)
                share = sa + w * (sb - sa)
                break
        return nic_bytes / (line * share)

    @staticmethod
    def from_json(value: Any, origin: str) -> NcclTestsRun:
        """The run a target file describes; NcclTestsError naming the field otherwise."""
        where = f"{origin}: network_nccl_tests"
        if not isinstance(value, dict):
            raise NcclTestsError(f"{where}: expected an object")
        known = ("collective", "ranks", "ranks_per_host", "size_bytes_busbw_gbps")
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise NcclTestsError(
                f"{where}: unknown field '{unknown[0]}'; fields: {', '.join(known)}"
            )
        collective = value.get("collective")
        if collective not in _BUS_FACTOR:
            raise NcclTestsError(
                f"{where}.collective: expected one of {', '.join(_BUS_FACTOR)}, not {collective!r}"
            )
        counts = {}
        for key, least in (("ranks", 2), ("ranks_per_host", 1)):
            n = value.get(key)
            if not isinstance(n, int) or isinstance(n, bool) or n < least:
                raise NcclTestsError(f"{where}.{key}: expected an integer of at least {least}")
            counts[key] = n
        if counts["ranks"] <= counts["ranks_per_host"]:
            raise NcclTestsError(f"{where}: a run across hosts has more ranks than ranks_per_host")
        if counts["ranks"] % counts["ranks_per_host"]:
            raise NcclTestsError(f"{where}: ranks must fill whole hosts of ranks_per_host")
        table = value.get("size_bytes_busbw_gbps")
        if not isinstance(table, list) or not table:
            raise NcclTestsError(f"{where}.size_bytes_busbw_gbps: expected a list of [bytes, GB/s]")
        rows: list[tuple[float, float]] = []
        for i, row in enumerate(table):
            ok = (
                isinstance(row, list)
                and len(row) == 2
                and all(is_finite_number(v) and v > 0 for v in row)
            )
            if not ok:
                raise NcclTestsError(
                    f"{where}.size_bytes_busbw_gbps[{i}]: expected [bytes, GB/s], both positive"
                )
            if rows and row[0] <= rows[-1][0]:
                raise NcclTestsError(f"{where}.size_bytes_busbw_gbps[{i}]: sizes must rise")
            rows.append((float(row[0]), float(row[1])))
        return NcclTestsRun(collective, counts["ranks"], counts["ranks_per_host"], tuple(rows))
