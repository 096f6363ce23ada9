"""The defects the emulator found in the CUDA backend, each replayed as XLA:GPU
would drive it: a collective a device never reaches, a communicator whose
creation timed out, a communicator handle freed and handed out again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xla_streams.pipeline import build_pipeline
from xla_streams.plugin.hook import run_pipeline
from xla_streams.runtime.emulator import replay

Replay = Callable[..., dict[str, Any]]

# Three all-reduces over {0,1,2,3} and {4,5,6,7}: on one stream, one communicator.
THREE_ALL_REDUCES = """\
HloModule defects, is_scheduled=true, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

ENTRY %main (p: f32[64]) -> (f32[64], f32[64], f32[64]) {
  %p = f32[64]{0} parameter(0)
  %ar0-start = f32[64]{0} all-reduce-start(%p), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  %ar0 = f32[64]{0} all-reduce-done(%ar0-start)
  %ar1-start = f32[64]{0} all-reduce-start(%p), channel_id=2, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  %ar1 = f32[64]{0} all-reduce-done(%ar1-start)
  %ar2-start = f32[64]{0} all-reduce-start(%p), channel_id=3, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  %ar2 = f32[64]{0} all-reduce-done(%ar2-start)
  ROOT %t = (f32[64]{0}, f32[64]{0}, f32[64]{0}) tuple(%ar0, %ar1, %ar2)
}
"""
TIMEOUT_MS = 1500
LATER = 2 * TIMEOUT_MS + 500  # a later execution: after the timeout, and its report


def plan() -> replay.Plan:
    lowered = run_pipeline(THREE_ALL_REDUCES, build_pipeline(1, runtime="cuda")).module.print()
    return replay.plan(lowered, devices=8)


def test_a_hung_collective_never_gives_results_that_read_as_valid(run_replay: Replay) -> None:
    """After a good all-reduce, devices 2 and 3 never reach the second: devices 0 and
    1 must not go on with its results (the emulator poisons an aborted collective's
    outputs, as a real GPU would leave them undefined), and the next execution fails
    on them with an error naming the op and the devices that never arrived. On
    devices 2 and 3 it fails too: their next all-reduce on that communicator would
    pair with the hung one and finish it with wrong results."""
    result = run_replay(
        plan(), timeout_ms=TIMEOUT_MS, skip=frozenset({(2, 1), (3, 1)}), at_ms={2: LATER}
    )
    assert result["mismatches"] == [], "a hung collective's results were read as valid"
    assert result["blocked"] == [0, 1]  # their compute streams wait on it for ever
    for device in (0, 1):
        error = result["device_errors"][str(device)]
        assert "'ar1-start'" in error and "devices that never started it: 2, 3" in error, error
        step = [e for e in result["errors"] if e.startswith(f"device {device},")]
        assert step and all("'ar1-start'" in e for e in step), result["errors"]
    for device in (2, 3):
        step = [e for e in result["errors"] if e.startswith(f"device {device},")]
        assert len(step) == 1 and "'ar2-start'" in step[0], result["errors"]
        assert "is not run: its NCCL communicator holds a collective that timed out" in step[0]
    assert result["reports"] == []


def test_a_communicator_is_created_again_after_its_creation_timed_out(run_replay: Replay) -> None:
    """Devices 2 and 3 never reach the first all-reduce, so devices 0 and 1 give up
    creating the communicator; a later step, with all four, creates it again (a new
    NCCL unique id: one id makes one communicator) and runs both later all-reduces
    with exact results (the second one also finds the new communicator alive, which
    a handle freed by the abort and handed out again must not hide)."""
    result = run_replay(
        plan(), timeout_ms=TIMEOUT_MS, skip=frozenset({(2, 0), (3, 0)}), at_ms={1: LATER}
    )
    assert result["mismatches"] == [] and result["blocked"] == []
    assert result["reports"] == []
    failed = sorted({e.split(",")[0] for e in result["errors"]})
    assert failed == ["device 0", "device 1"], result["errors"]
    assert all("ar0-start" in e for e in result["errors"]), result["errors"]
    assert any("not every member joined" in e for e in result["errors"])
    ran = [op["what"] for op in result["op_log"]]
    assert sum("ar1-start" in w for w in ran) == 8 and sum("ar2-start" in w for w in ran) == 8
