"""Shared by the tests of the CUDA backend on the emulated CUDA runtime and NCCL
(``make cuda-emulated``): the built emulator and backend, and replays of lowered
programs through ``xsim-replay``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from xla_streams.pipeline import build_pipeline
from xla_streams.plugin.hook import run_pipeline
from xla_streams.runtime import build as runtime_build
from xla_streams.runtime import emulator
from xla_streams.runtime.emulator import replay

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def built() -> emulator.Built:
    return emulator.build()


@pytest.fixture(scope="session")
def backend() -> Path:
    """libxla_streams_cuda as ``python -m xla_streams.runtime.build --cuda`` builds it."""
    return runtime_build.build("cuda")


@pytest.fixture(scope="session")
def lower() -> Callable[..., str]:
    """``lower(text, streams=4)``: the module lowered for the CUDA runtime, as the
    plugin's ffi mode lowers it."""

    def lowered(text: str, streams: int = 4) -> str:
        return run_pipeline(text, build_pipeline(streams, runtime="cuda")).module.print()

    return lowered


@pytest.fixture
def run_replay(built: emulator.Built, backend: Path, tmp_path: Path) -> Callable[..., Any]:
    """``run_replay(plan, backend=..., env=..., **script_options)``: one process's
    script of ``plan`` played through the backend; the replay's JSON result."""

    def run(
        plan: replay.Plan,
        backend: Path = backend,
        env: dict[str, str] | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        path = tmp_path / "replay.txt"
        path.write_text(plan.script(**options))
        return built.replay(path, backend, env)

    return run


# -- scenarios: each gives the problems found, none when the backend is right -------------

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
TIMEOUT_MS = 1000
LATER = 2 * TIMEOUT_MS + 300  # a later execution: after the timeout, and its report


def three_all_reduces() -> replay.Plan:
    text = run_pipeline(THREE_ALL_REDUCES, build_pipeline(1, runtime="cuda")).module.print()
    return replay.plan(text, devices=8)


def hung_collective(result: dict[str, Any]) -> list[str]:
    """After a good all-reduce, devices 2 and 3 never reach the second. Devices 0 and 1
    must not go on with its results (the emulator poisons an aborted collective's
    outputs, as a real GPU leaves them undefined yet looking like data) and their next
    execution fails naming the op and the devices that never arrived; on devices 2
    and 3 it fails too, since their next all-reduce on that communicator would pair
    with the hung one and finish it with wrong results."""
    problems = [f"a hung collective's result was read: {m}" for m in result["mismatches"][:2]]
    if result["blocked"] != [0, 1]:
        problems.append(f"compute streams still waiting: {result['blocked']}, not [0, 1]")
    for device in (0, 1):
        error = result["device_errors"].get(str(device), "")
        if "'ar1-start'" not in error or "devices that never started it: 2, 3" not in error:
            problems.append(f"device {device} holds {error!r}, not the hung op and 2, 3")
        step = [e for e in result["errors"] if e.startswith(f"device {device},")]
        if not step or not all("'ar1-start'" in e for e in step):
            problems.append(f"device {device}'s next execution: {step}")
    for device in (2, 3):
        step = [e for e in result["errors"] if e.startswith(f"device {device},")]
        expected = "is not run: its NCCL communicator holds a collective that timed out"
        if len(step) != 1 or "'ar2-start'" not in step[0] or expected not in step[0]:
            problems.append(f"device {device}'s next execution: {step}")
    return problems + [f"{r['kind']}: {r['message']}" for r in result["reports"]]


def recreated_communicator(result: dict[str, Any]) -> list[str]:
    """Devices 2 and 3 never reach the first all-reduce, so devices 0 and 1 give up
    creating the communicator; a later execution with all four creates it again (a
    new NCCL unique id: one id makes one communicator) and runs both later
    all-reduces exactly (the second also finds the new communicator alive, which a
    freed handle handed out again must not hide)."""
    problems = [f"wrong result: {m}" for m in result["mismatches"][:2]]
    problems += [f"device {d} never drained" for d in result["blocked"]]
    failed = sorted({e.split(",")[0] for e in result["errors"]})
    if failed != ["device 0", "device 1"] or not all("ar0-start" in e for e in result["errors"]):
        problems.append(f"errors: {result['errors'][:4]}")
    if not any("not every member joined" in e for e in result["errors"]):
        problems.append("no error says a member never joined")
    ran = [op["what"] for op in result["op_log"]]
    for name in ("ar1-start", "ar2-start"):
        if sum(name in w for w in ran) != 8:
            problems.append(f"{name} ran on {sum(name in w for w in ran)} devices, not 8")
    return problems + [f"{r['kind']}: {r['message']}" for r in result["reports"]]


def clean(result: dict[str, Any]) -> list[str]:
    """What a replay that must run exactly found wrong."""
    return (
        [f"error: {e}" for e in result["errors"][:3]]
        + [f"wrong result: {m}" for m in result["mismatches"][:3]]
        + [f"device {d} never drained" for d in result["blocked"]]
        + [f"{r['kind']}: {r['message']}" for r in result["reports"][:3]]
    )


@pytest.fixture
def scenarios(
    run_replay: Callable[..., Any], lower: Callable[..., str]
) -> dict[str, Callable[[Path], list[str]]]:
    """Name -> scenario(backend) -> the problems it finds (none: the backend is right)."""
    fixtures = REPO / "hlo_fixtures"

    def fixture(name: str) -> Callable[[Path], list[str]]:
        return lambda backend: clean(
            run_replay(replay.plan(lower((fixtures / name).read_text()), devices=8), backend)
        )

    return {
        "tp_dp_2d": fixture("tp_dp_2d.limit4.text.hlo"),
        "ppermute_scan": fixture("ppermute_scan.limit4.text.hlo"),
        "moe_all_to_all": fixture("moe_all_to_all.limit4.text.hlo"),
        "hung_collective": lambda backend: hung_collective(
            run_replay(
                three_all_reduces(),
                backend,
                timeout_ms=TIMEOUT_MS,
                skip=frozenset({(2, 1), (3, 1)}),
                at_ms={2: LATER},
            )
        ),
        "recreated_communicator": lambda backend: recreated_communicator(
            run_replay(
                three_all_reduces(),
                backend,
                timeout_ms=TIMEOUT_MS,
                skip=frozenset({(2, 0), (3, 0)}),
                at_ms={1: LATER},
            )
        ),
    }
