"""The emulator's checks bite: small changes to a copy of the CUDA backend, each of
which breaks a rule the backend must keep, built with the command that builds the
real one, must each fail a scenario that the real backend passes; a harmless change
(the control) must pass them all."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from xla_streams.runtime import build as runtime_build


@dataclass(frozen=True)
class Mutant:
    name: str
    why: str  # the rule it breaks, and how the emulator must notice
    old: str  # in cuda_backend.cc, exactly once
    new: str
    scenario: str  # conftest.scenarios


MUTANTS = [
    Mutant(
        "start_does_not_wait_for_compute",
        "the collective may read its operands before the compute stream wrote them: a race",
        "  XS_CUDA(cudaStreamWaitEvent(stream, ready, 0));\n",
        "",
        "tp_dp_2d",
    ),
    Mutant(
        "done_does_not_make_compute_wait",
        "the compute stream may read the results before the collective wrote them: a race",
        "  XS_CUDA(cudaStreamWaitEvent(compute, flight.done, 0));\n",
        "",
        "ppermute_scan",
    ),
    Mutant(
        "ready_recorded_on_the_wrong_stream",
        "the event marks the collective stream's work, not the compute stream's: a race",
        "  XS_CUDA(cudaEventRecord(ready, compute));\n",
        "  XS_CUDA(cudaEventRecord(ready, stream));\n",
        "tp_dp_2d",
    ),
    Mutant(
        "group_not_settled",
        "the done event is recorded before the non-blocking group reaches the stream: a race, "
        "and the next call finds the communicator still in progress",
        "  if (auto e = Settle(*comm_state, end, op); !e.success()) return e;\n",
        "",
        "moe_all_to_all",
    ),
    Mutant(
        "every_rank_makes_its_own_id",
        "the ranks join different cliques and never meet: every creation times out",
        "    if (it != g_ids.end()) {\n",
        "    if (false) {\n",
        "recreated_communicator",
    ),
    Mutant(
        "group_never_closed",
        "nothing reaches the stream: the results are never written",
        "  ncclResult_t end = ncclGroupEnd();  // always close the group, even after an error\n",
        "  ncclResult_t end = ncclSuccess;\n",
        "tp_dp_2d",
    ),
    Mutant(
        "watchdog_without_the_lock",
        "the watchdog calls NCCL on a communicator another thread may be using: the lockset check",
        "        if (comm != nullptr && comm->mu.try_lock()) {\n"
        "          if (!comm->aborted) ncclCommGetAsyncError(comm->handle, &async);\n"
        "          comm->mu.unlock();\n",
        "        if (comm != nullptr) {\n"
        "          if (!comm->aborted) ncclCommGetAsyncError(comm->handle, &async);\n",
        "tp_dp_2d",
    ),
    Mutant(
        "failed_id_kept",
        "a communicator whose creation timed out is tried again with its consumed id: it "
        "never forms",
        "      ForgetId(key, id, attempt);\n",
        "",
        "recreated_communicator",
    ),
    Mutant(
        "hung_collective_aborted",
        "a timed-out collective's communicator is aborted: its undefined outputs are read",
        "          w.device->SetError(os.str());\n",
        "          w.device->SetError(os.str());\n"
        "          if (comm != nullptr) { std::lock_guard<std::mutex> l(comm->mu); "
        "AbortLocked(*comm); }\n",
        "hung_collective",
    ),
]
# Harmless: the event goes back to the pool before the wait instead of after it. Only
# this thread takes events from the pool, so nothing records it in between, and a
# wait uses the record as of the call.
CONTROL = Mutant(
    "control_release_before_the_wait",
    "harmless: no one can record the event between the release and the wait",
    "  XS_CUDA(cudaStreamWaitEvent(stream, ready, 0));\n"
    "  device->Release(ready);  // the wait captured the record; the event may be reused\n",
    "  device->Release(ready);\n  XS_CUDA(cudaStreamWaitEvent(stream, ready, 0));\n",
    "tp_dp_2d",
)


@pytest.fixture(scope="module")
def mutants(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every mutant's library, built two at a time."""
    original = runtime_build.source_dir()
    root = tmp_path_factory.mktemp("mutants")

    def build(mutant: Mutant) -> tuple[str, Path]:
        sources = root / mutant.name
        shutil.copytree(original, sources)
        backend = sources / "cuda_backend.cc"
        text = backend.read_text()
        assert text.count(mutant.old) == 1, f"{mutant.name}: its line is gone from the backend"
        backend.write_text(text.replace(mutant.old, mutant.new))
        library = sources / "libmutant.so"
        runtime_build.compile_from("cuda", sources, library)
        return mutant.name, library

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(build, [*MUTANTS, CONTROL]))


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_every_mutant_is_caught(
    mutant: Mutant, mutants: dict[str, Path], scenarios: dict[str, Callable[[Path], list[str]]]
) -> None:
    # The real backend passes every scenario: test_defects.py and the control's test.
    assert scenarios[mutant.scenario](mutants[mutant.name]) != [], f"not caught: {mutant.why}"


def test_the_control_and_the_real_backend_pass_every_scenario(
    mutants: dict[str, Path], scenarios: dict[str, Callable[[Path], list[str]]], backend: Path
) -> None:
    for name, scenario in scenarios.items():
        assert scenario(mutants[CONTROL.name]) == [], f"the control fails {name}"
        assert scenario(backend) == [], f"the real backend fails {name}"
