"""The defects the emulator found in the CUDA backend, each replayed as XLA:GPU would
drive it (the scenarios are in conftest.py; the mutation suite checks that each one
fails on the defect put back): a collective a device never reaches, a communicator
whose creation timed out, and (in every replay, by the lockset check) NCCL called on
one communicator by two threads without a common lock."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

Scenarios = dict[str, Callable[[Path], list[str]]]


def test_a_hung_collective_never_gives_results_that_read_as_valid(
    scenarios: Scenarios, backend: Path
) -> None:
    assert scenarios["hung_collective"](backend) == []


def test_a_communicator_is_created_again_after_its_creation_timed_out(
    scenarios: Scenarios, backend: Path
) -> None:
    assert scenarios["recreated_communicator"](backend) == []


def test_the_watchdog_and_the_starts_never_call_nccl_on_a_communicator_at_once(
    scenarios: Scenarios, backend: Path
) -> None:
    """The backend's watchdog polls every collective in flight from a thread of its own
    while the device threads enqueue on the same communicators."""
    assert scenarios["tp_dp_2d"](backend) == []
