"""Every fixture with collectives, lowered for the CUDA runtime and played through the
unchanged backend on emulated devices as XLA:GPU drives it (``xsim-replay``): exact
results, no race, no deadlock, and every collective on the CUDA stream its report
gives it, its own and not the compute stream's. The multi-host fixture runs as 4
processes of 8 devices that meet through a key-value store."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from xla_streams.runtime import emulator
from xla_streams.runtime.emulator import replay

REPO = Path(__file__).resolve().parents[3]
Replay = Callable[..., dict[str, Any]]
Lower = Callable[..., str]

FIXTURES = sorted(
    path.name
    for path in (REPO / "hlo_fixtures").glob("*.text.hlo")
    if not path.name.startswith("multihost_32")
)


def devices(text: str) -> int:
    found = re.search(r"num_partitions=(\d+)", text)
    return int(found.group(1)) if found else 1


def assert_clean(result: dict[str, Any]) -> None:
    assert result["errors"] == [] and result["mismatches"] == [] and result["blocked"] == []
    assert result["reports"] == [], result["reports"][:3]


def assert_on_reported_streams(fixture: str, op_log: list[dict[str, Any]]) -> None:
    """Per device: each stream the report gives is one CUDA stream, its own (none
    shared by two report streams, none the compute stream), and each collective ran on
    the one of its report stream."""
    report = json.loads(
        (REPO / "hlo_fixtures" / "reports" / fixture.replace(".hlo", ".json")).read_text()
    )
    reported = {c["start"]: c["stream"] for c in report["collectives"]}
    cuda_streams: dict[tuple[int, int], set[int]] = defaultdict(set)
    for op in op_log:
        match = re.match(r"(\S+) \(op \d+ start, stream=(\d+)\)", op["what"])
        assert match, op["what"]
        name, stream = match.group(1), int(match.group(2))
        assert reported[name] == stream, (name, reported[name], stream)
        assert not op["stream_label"].startswith("compute"), op
        cuda_streams[op["device"], stream].add(op["stream"])
    for (device, stream), ids in cuda_streams.items():
        assert len(ids) == 1, (
            f"report stream {stream} ran on {len(ids)} CUDA streams of device {device}"
        )
    for device in {d for d, _ in cuda_streams}:
        ids = [next(iter(v)) for (d, _), v in cuda_streams.items() if d == device]
        assert len(ids) == len(set(ids)), (
            f"two report streams share a CUDA stream on device {device}"
        )


@pytest.mark.parametrize("fixture", FIXTURES)
def test_every_fixture_runs_exactly_on_its_streams(
    fixture: str, lower: Lower, run_replay: Replay
) -> None:
    text = (REPO / "hlo_fixtures" / fixture).read_text()
    plan = replay.plan(lower(text), devices=devices(text))
    if not plan.calls:
        pytest.skip("XLA compiled no collective the runtime runs")
    result = run_replay(plan, timeout_ms=20000)
    assert_clean(result)
    assert len(result["op_log"]) == devices(text) * sum(c.what == "start" for c in plan.calls)
    assert_on_reported_streams(fixture, result["op_log"])


def test_the_multihost_fixture_runs_as_four_processes(
    built: emulator.Built, backend: Path, lower: Lower, tmp_path: Path
) -> None:
    """32 devices in 4 processes of 8: NCCL ids through a key-value store, collectives
    across processes through the emulated NCCL's sockets."""
    fixture = "multihost_32.limit4.text.hlo"
    plan = replay.plan(lower((REPO / "hlo_fixtures" / fixture).read_text()), devices=32)
    kv = tmp_path / "kv"
    kv.mkdir()
    scripts = []
    for process in range(4):
        script = tmp_path / f"process{process}.txt"
        script.write_text(
            plan.script(process=process, devices_per_process=8, timeout_ms=20000, kv=str(kv))
        )
        scripts.append(script)
    results = built.replay_job(scripts, backend)
    starts = sum(c.what == "start" for c in plan.calls)
    for process, result in enumerate(results):
        assert_clean(result)
        assert len(result["op_log"]) == 8 * starts
        for op in result["op_log"]:  # local ordinals: global id 8 * process + ordinal
            op["device"] += 8 * process
    assert_on_reported_streams(fixture, [op for r in results for op in r["op_log"]])
    assert any(key.name.endswith("_current") for key in kv.iterdir())  # ids went through it


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_any_order_of_the_work_that_may_run_gives_the_same_results(
    seed: int, lower: Lower, run_replay: Replay
) -> None:
    """The emulator runs the work that may run in an order drawn from its seed."""
    text = (REPO / "hlo_fixtures" / "transformer_step.limit4.text.hlo").read_text()
    plan = replay.plan(lower(text), devices=8)
    assert_clean(run_replay(plan, env={"XSIM_SEED": str(seed)}))
