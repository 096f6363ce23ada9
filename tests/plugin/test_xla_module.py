"""The proto <-> text bridge: device counts and device ids from the device assignment."""

from __future__ import annotations

from xla_streams._wire import encode_varint, field
from xla_streams.plugin.xla_module import (
    DeviceAssignment,
    device_assignment,
    device_assignment_field,
    with_device_counts,
)


def test_device_assignment_gives_counts_and_the_device_of_each_logical_id() -> None:
    # DeviceAssignmentProto{replica_count=2, computation_count=2, computation_devices=[...]}:
    # partition p of replica r runs on computation_devices[p].replica_device_ids[r].
    assignment = field(1, 2) + field(2, 2)
    for ids in ([5, 7], [6, 4]):
        assignment += field(3, field(1, b"".join(encode_varint(i) for i in ids)))  # packed
    proto = field(1, b"jit_f") + field(4, b"\x00" * 200) + field(15, assignment)
    assert device_assignment(proto) == DeviceAssignment(2, 2, (5, 6, 7, 4))
    assert device_assignment(field(1, b"jit_f")) is None
    # Counts without the per-partition device lists: the ids are unknown.
    counts_only = field(15, field(1, 1) + field(2, 300))
    assert device_assignment(counts_only) == DeviceAssignment(1, 300, ())


def test_device_counts_go_into_the_header_when_missing() -> None:
    header = "HloModule jit_f, is_scheduled=true, entry_computation_layout={()->f32[]}"
    text = header + "\n\nENTRY ..."
    eight = DeviceAssignment(1, 8, ())
    assert with_device_counts(text, eight) == header + ", num_partitions=8\n\nENTRY ..."
    assert with_device_counts(text, DeviceAssignment(2, 4, ())).startswith(
        header + ", replica_count=2, num_partitions=4\n"
    )
    already = header + ", num_partitions=8\nrest"
    assert with_device_counts(already, eight) == already
    assert with_device_counts(text, DeviceAssignment(1, 1, (0,))) == text
    assert with_device_counts(text, None) == text


def test_device_assignment_field_round_trips() -> None:
    for assignment in (DeviceAssignment(2, 2, (5, 6, 7, 4)), DeviceAssignment(1, 8, ())):
        proto = field(1, b"jit_f") + device_assignment_field(assignment)
        assert device_assignment(proto) == assignment
