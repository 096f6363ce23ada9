"""Predicted timelines as a Chrome trace (JSON object format), for ui.perfetto.dev,
chrome://tracing and TensorBoard's trace viewer.

Each simulated configuration is one process (``pid``); its lanes are threads
(``tid``) named by ``thread_name`` metadata: ``compute`` first, then
``collective stream 0`` ..., ``side compute stream 0`` ... (async fusions) and
``p2p stream``. Every instruction and collective
is a complete event (``"ph": "X"``) with its name, ``cat`` (its kind), start
``ts`` and ``dur`` in microseconds, and ``args`` holding the kind, bytes and
predicted time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from xla_streams.simulate.targets import Target
from xla_streams.simulate.timeline import (
    COMPUTE_LANE,
    P2P_LANE,
    SIDE_COMPUTE_LANE,
    SimResult,
    lane_name,
)

_US = 1e6


def lane_tid(lane: int) -> int:
    """Thread id of a lane: compute 0, collective stream k at k + 1, then the side
    compute streams, P2P last."""
    if lane == COMPUTE_LANE:
        return 0
    if lane == P2P_LANE:
        return 1 << 20
    if lane <= SIDE_COMPUTE_LANE:
        return (1 << 19) + SIDE_COMPUTE_LANE - lane
    return lane + 1


def lanes_of(result: SimResult) -> list[int]:
    """Lanes to draw, compute first: those busy in the result or carrying slices."""
    lanes = {COMPUTE_LANE} | {lane for lane, busy in result.lane_busy.items() if busy > 0}
    if result.slices:
        lanes |= {s.lane for s in result.slices}
    if result.streams is not None:
        lanes |= set(range(result.streams))
    return sorted(lanes, key=lane_tid)


def trace_events(results: Sequence[SimResult], module_name: str, target: Target) -> dict[str, Any]:
    """The trace as a JSON-ready object; ``results`` need ``slices`` (``record=True``)."""
    events: list[dict[str, Any]] = []
    for pid, result in enumerate(results, start=1):
        events.append(_meta("process_name", pid, 0, name=f"{module_name}: {result.label}"))
        events.append(_meta("process_sort_index", pid, 0, sort_index=pid))
        events.append(
            _meta(
                "process_labels", pid, 0,
                labels=f"predicted step {result.step_time * 1e3:.3f} ms on {target.name}",
            )
        )  # fmt: skip
        for lane in lanes_of(result):
            tid = lane_tid(lane)
            events.append(_meta("thread_name", pid, tid, name=lane_name(lane)))
            events.append(_meta("thread_sort_index", pid, tid, sort_index=tid))
        for s in result.slices or ():
            if s.duration <= 0:
                continue
            events.append(
                {
                    "ph": "X",
                    "name": s.name or s.kind,
                    "cat": s.kind,
                    "pid": pid,
                    "tid": lane_tid(s.lane),
                    "ts": s.start * _US,
                    "dur": s.duration * _US,
                    "args": s.args,
                }
            )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {
            "module": module_name,
            "target": target.name,
            "generator": "xla_streams.simulate",
            "configurations": [r.label for r in results],
        },
    }


def trace_json(results: Sequence[SimResult], module_name: str, target: Target) -> str:
    return json.dumps(trace_events(results, module_name, target), separators=(",", ":"))


def _meta(event: str, pid: int, tid: int, **args: Any) -> dict[str, Any]:
    return {"ph": "M", "name": event, "pid": pid, "tid": tid, "args": args}
