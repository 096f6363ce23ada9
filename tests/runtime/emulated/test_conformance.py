"""xsim-conformance on the stand-ins: the rules the emulator models, as the
expectations tools/gpu_check.py runs against the real CUDA runtime and NCCL on a
GPU (check ``conformance``), hold for the emulator itself; with one device the
two-device ones are skipped, saying so."""

from __future__ import annotations

from xla_streams.runtime import emulator

# One fragment of each expectation's name, in the order the program runs them.
EXPECTATIONS = (
    "cudaEventQuery of a never-recorded event is cudaSuccess",
    "cudaStreamWaitEvent on a never-recorded event is no wait",
    "cudaEventElapsedTime with a never-recorded event is cudaErrorInvalidResourceHandle",
    "cudaEventElapsedTime with a cudaEventDisableTiming event",
    "cudaEventElapsedTime of two recorded, complete events is cudaSuccess",
    "ncclGetVersion",
    "a non-blocking ncclCommInitRankConfig returns ncclInProgress or ncclSuccess",
    "a one-rank ncclAllReduce on a non-blocking communicator",
    "ncclCommAbort of an idle communicator returns ncclSuccess",
    "keeps its stream busy",
    "cudaStreamWaitEvent waits for the record current at the call",
    "once the peer calls, the collective completes on both ranks",
    "the emulator saw no misuse, race or deadlock",
)
TWO_DEVICES = EXPECTATIONS[9:12]


def names(result: dict[str, object]) -> list[str]:
    checks = result["checks"]
    assert isinstance(checks, list)
    return [c["name"] for c in checks]


def test_the_stand_ins_meet_every_expectation(built: emulator.Built) -> None:
    result = emulator.conformance(built.conformance)
    assert result["devices"] == 8
    found = names(result)
    assert len(found) == len(EXPECTATIONS)
    for fragment, name in zip(EXPECTATIONS, found, strict=True):
        assert fragment in name
    failed = [c for c in result["checks"] if c["passed"] is not True]
    assert failed == []
    # Every expectation but the emulator's own report cites the document it checks.
    assert all(c["cites"].startswith(("RT ", "NCCL ")) for c in result["checks"][:-1])


def test_with_one_device_the_two_device_expectations_are_skipped(built: emulator.Built) -> None:
    result = emulator.conformance(built.conformance, env={"XSIM_DEVICES": "1"})
    assert result["devices"] == 1
    by_name = {c["name"]: c for c in result["checks"]}
    for fragment in TWO_DEVICES:
        (check,) = [c for name, c in by_name.items() if fragment in name]
        assert check["passed"] is None
        assert check["detail"] == "skipped: 1 device(s), needs 2"
    ran = [c for c in result["checks"] if c["passed"] is not None]
    assert len(ran) == len(EXPECTATIONS) - len(TWO_DEVICES)
    assert all(c["passed"] is True for c in ran)
