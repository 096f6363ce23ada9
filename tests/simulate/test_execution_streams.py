"""XLA's own stream assignment (``simulate/execution_streams.py``): with
``--xla_gpu_experimental_enable_collective_multi_streaming`` collectives take streams
0 and 1 in turn over the *post-order* of the module, not the schedule; async fusions
take compute streams 0..3 in turn; synchronous collectives take none.

The two modules in ``data/`` are jax 0.12 deviceless 8xH100 compiles (dumped after
optimizations) whose streams were read from XLA's own thunk sequence
(``*thunk_sequence.txt``: ``kAsyncStart ... stream=communication_stream[k]``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from xla_streams.collectives import StreamModel
from xla_streams.hlo import parse_module
from xla_streams.simulate import Simulator, execution_streams, get_target, xla_stream_assignment
from xla_streams.simulate.execution_streams import post_order
from xla_streams.streams import find_async_pairs

DATA = Path(__file__).resolve().parent / "data"
JAX_012 = StreamModel(overlap_limit=1, sync_on_compute=True)


def load(name: str):  # type: ignore[no-untyped-def]
    module = parse_module((DATA / name).read_text(), name)
    return module, find_async_pairs(module, JAX_012)


def test_collectives_alternate_over_the_post_order_as_xlas_thunks_show() -> None:
    module, pairs = load("multistream_probe.hlo")
    scheduled = [p.start for p in sorted(pairs, key=lambda p: p.start_index)]
    assert scheduled == [
        "all-gather-start.2", "all-gather-start.3", "all-reduce-start", "reduce-scatter-start.1",
    ]  # fmt: skip
    assignment = xla_stream_assignment(module, pairs)
    # XLA's thunk sequence: AG.2 -> 0, AG.3 -> 1, RS.1 -> 0, AR -> 1 (round robin in
    # schedule order would have put AR on 0 and RS.1 on 1).
    assert assignment.stream_of == {
        "all-gather-start.2": 0,
        "all-gather-start.3": 1,
        "all-reduce-start": 1,
        "reduce-scatter-start.1": 0,
    }
    assert assignment.streams == 2
    # The collectives XLA made synchronous took no stream.
    synchronous = {i.name for i in module.entry.instructions if i.opcode == "all-gather"}
    assert synchronous and not synchronous & set(execution_streams(module, pairs).communication)
    # Without the flag everything is on stream 0.
    off = xla_stream_assignment(module, pairs, multi_streaming=False)
    assert set(off.stream_of.values()) == {0} and off.streams == 1


def test_the_counter_runs_on_into_loop_bodies_and_fusions_take_compute_streams() -> None:
    module, pairs = load("multistream_scan_probe.hlo")
    streams = execution_streams(module, pairs, communication_streams=2)
    # XLA's thunks: entry AG.2 -> 0, AG.1 -> 1 ... body AG -> 0, body RS -> 1; the body's
    # dynamic-slice copies on computation_stream[0] and [1].
    assert streams.communication == {
        "all-gather-start.2": 0,
        "all-gather-start.1": 1,
        "all-gather-start": 0,
        "reduce-scatter-start": 1,
    }
    assert streams.compute == {"fusion-start": 0, "fusion-start.1": 1}
    # The simulator runs those fusions on the side streams XLA gives them.
    sim = Simulator(module, get_target("h100"), pairs)
    result = sim.run(xla_stream_assignment(module, pairs), label="XLA multi-streaming")
    assert set(result.lane_busy) >= {-100, -101} and result.side_compute_time > 0
    assert result.label == "XLA multi-streaming"


POST_ORDER = """HloModule m, is_scheduled=true

ENTRY %main (a: f32[8], b: f32[8]) -> (f32[8], f32[8]) {
  %a = f32[8]{0} parameter(0)
  %b = f32[8]{0} parameter(1)
  %y = f32[8]{0} negate(%b)
  %x = f32[8]{0} negate(%a), control-predecessors={%y}
  %side = f32[8]{0} exponential(%a)
  %z = f32[8]{0} add(%x, %y)
  ROOT %t = (f32[8]{0}, f32[8]{0}) tuple(%z, %x)
}
"""


def test_post_order_is_xlas() -> None:
    # DFS from each instruction nothing uses, in order (%side, then ROOT): operands left
    # to right, a control predecessor before the operands.
    order = [i.name for i in post_order(parse_module(POST_ORDER).entry)]
    assert order == ["a", "side", "b", "y", "x", "z", "t"]


@pytest.mark.parametrize("name", ["multistream_probe.hlo", "multistream_scan_probe.hlo"])
def test_every_instruction_appears_once_in_post_order(name: str) -> None:
    module, _ = load(name)
    for comp in module.computations:
        names = [i.name for i in post_order(comp)]
        assert sorted(names) == sorted(i.name for i in comp.instructions)
