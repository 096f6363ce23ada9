"""Reading XLA's dump: which stream each async start's thunk runs on, and the schedule two
compiles of one program share."""

from __future__ import annotations

from pathlib import Path

import pytest

from xla_streams.xla_dump import read_dump, schedule, schedule_difference, thunk_streams

SEQUENCE = (
    "002: kAsyncStart   [source | next=005 (3) ] stream=communication_stream[0], async_id=2\n"
    "    001: kAllGather [source | sink] kAllGather\n"
    "007: kWhile        [prev=006 (1)  | next=035 (1) ]\n"
    "    013: kAsyncStart         [prev=010 (1) | next=022 (6)] "
    "stream=communication_stream[3], async_id=13\n"
    "    021: kAsyncDone          [source       | sink        ] async_id=13\n"
    "040: kAsyncStart   [prev=035 (1) | sink] stream=compute, async_id=40\n"
)
METADATA = (
    'thunk_metadata {\n  thunk_info {\n    profile_annotation: "all-gather-start"\n'
    '    thunk_id: 2\n  }\n  thunk_kind: "kAsyncStart"\n}\n'
    'thunk_metadata {\n  thunk_info {\n    profile_annotation: "reduce-scatter-start.1"\n'
    '    thunk_id: 13\n  }\n  thunk_kind: "kAsyncStart"\n}\n'
)


def test_each_async_start_on_its_stream_nested_ones_too() -> None:
    assert thunk_streams(SEQUENCE, METADATA) == {
        "all-gather-start": 0,
        "reduce-scatter-start.1": 3,  # inside the while body
        "<thunk 40>": "compute",  # no metadata; not a communication stream
    }


def test_a_dump_folder_is_read_per_module(tmp_path: Path) -> None:
    hlo = "HloModule jit_step\n\nENTRY main {\n  ROOT p = f32[] parameter(0)\n}\n"
    (tmp_path / "module_0003.jit_step.sm_9.0_gpu_after_optimizations.txt").write_text(hlo)
    (tmp_path / "module_0003.jit_step.thunk_sequence.txt").write_text(SEQUENCE)
    (tmp_path / "module_0003.jit_step.thunk_metadata.txt").write_text(METADATA)
    text, streams = read_dump(tmp_path, "jit_step")
    assert text == hlo and streams["reduce-scatter-start.1"] == 3
    with pytest.raises(FileNotFoundError, match=r"expected one \*\.other\..*found 0"):
        read_dump(tmp_path, "other")


def test_schedules_compare_by_opcode() -> None:
    one = "HloModule m\n\nENTRY e {\n  a = f32[] parameter(0)\n  ROOT b = f32[] negate(a)\n}\n"
    renamed = one.replace(" a", " x").replace("(a)", "(x)").replace(" b =", " y =")
    assert schedule(one) == [["parameter", "negate"]]
    assert schedule_difference(schedule(one), schedule(renamed)) is None
    other = [["parameter", "abs"]]
    assert schedule_difference(schedule(one), other) == "computation 0: position 1: negate vs abs"
    assert schedule_difference(schedule(one), [["parameter"]]) == "computation 0: 2 vs 1"
    assert schedule_difference(schedule(one), []) == "1 vs 0 computations"
