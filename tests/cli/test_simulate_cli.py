"""``xla-streams simulate`` with a user's collective table, a PGLE profile and --json.

Run as users run it (a subprocess), except where the Python entry point
``simulate_command`` is what is tested. The JSON must read back as a
``Prediction`` (schema ``xla_streams.simulate.v1``), which refuses damaged files
naming the field; XLA's own multi-streaming must be the replay of
``xla_stream_assignment``; the range must hold the expected value; with XLA's
schedule dump of the same compile, XLA's own estimate is the one the dump holds.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before anything imports JAX

import pytest

from xla_streams import jax_compat, programs
from xla_streams.cli.simulate import simulate_command
from xla_streams.collectives import StreamModel
from xla_streams.hlo import parse_module
from xla_streams.simulate import Simulator, get_target, xla_stream_assignment
from xla_streams.simulate.prediction import SCHEMA, Prediction, PredictionError
from xla_streams.simulate.xla_estimate import read_schedule

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# Ten all-reduces inside one host, in groups of 4: XLA's table prices them.
TP_DP = REPO / "hlo_fixtures" / "tp_dp_2d.limit4.text.hlo"
FINGERPRINT = "0c1bac9873ea4c80ab7f18d1ead85f46"  # TP_DP's fingerprint_before_lhs

# Every all-reduce of TP_DP (8 MiB over 4 GPUs, 16 MiB over 2) at a slow 1 GB/s.
SLOW_TABLE = """\
# a slow cluster
entries {
  key: "sm_90"
  value {
    entries {
      instruction {
        opcode: "all-reduce"
        shape { element_type: F32 dimensions: 2097152 }
        replica_groups { replica_ids: [0, 1, 2, 3] }
      }
      network_throughput_bytes_per_sec: 1000000000
    }
    entries {
      instruction {
        opcode: "all-reduce"
        shape { element_type: F32 dimensions: 4194304 }
        replica_groups { replica_ids: [0, 4] }
      }
      network_throughput_bytes_per_sec: 1000000000
    }
  }
}
"""


def simulate(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xla_streams", "simulate", *map(str, args)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def ms(pattern: str, text: str) -> float:
    found = re.search(pattern, text, re.M)
    assert found, f"{pattern!r} not in:\n{text}"
    return float(found.group(1))


def assert_usage_error(result: subprocess.CompletedProcess[str], *phrases: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    for phrase in phrases:
        assert phrase in result.stderr, result.stderr


# -- --json ---------------------------------------------------------------------------------


def test_json_holds_every_prediction_and_follows_its_schema(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    result = simulate(TP_DP, "--streams=1,2", f"--json={out}", "--sync-on-compute")
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(out.read_text())
    assert report["schema"] == SCHEMA == "xla_streams.simulate.v1"
    assert Prediction.from_json(out.read_text(), out.name).to_json() == out.read_text()
    assert report["module"] == "jit_step" and report["async_pairs"] == 10
    assert report["target"]["name"] == "h100" and report["target"]["perf_table_key"] == "sm_90"
    assert report["target"]["perf_table"].endswith("collective_perf_table.txtpb")
    # One entry per (K, policy); the baseline is K=1 under the first policy.
    configs = [(r["streams"], r["policy"]) for r in report["results"]]
    assert configs == [(1, "interval"), (2, "interval"), (1, "round-robin"), (2, "round-robin")]
    assert report["baseline"] == {"streams": 1, "policy": "interval"}
    assert report["step_ms"] == report["results"][0]["step_ms"]
    assert len(report["results"][1]["stream_busy_ms"]) == 2
    # The text says the same numbers.
    text = result.stdout
    assert report["step_ms"] == pytest.approx(ms(r"^  1  ([0-9.]+) ms", text), abs=1e-4)
    compute = ms(r"compute only: ([0-9.]+) ms", text)
    assert report["compute_only_ms"] == pytest.approx(compute, abs=1e-4)
    assert report["exposed_communication_ms"] <= report["step_ms"]
    assert report["compute_only_ms"] <= report["step_ms"] <= report["serial_ms"]
    rule, lower = report["bounds"]["rule"], report["bounds"]["lower"]
    assert lower["step_ms"] <= rule["step_ms"] <= report["step_ms"] * (1 + 1e-9)
    # The range: low <= expected <= high, expected = the baseline, with its error bounds.
    span = report["range"]
    assert (span["streams"], span["policy"]) == (1, "interval")
    assert span["step_ms"]["low"] < span["step_ms"]["expected"] < span["step_ms"]["high"]
    assert span["step_ms"]["expected"] == pytest.approx(report["step_ms"])
    assert {"matmul", "nvlink", "table_large", "clock_recovery", "collective_hbm"} <= set(
        span["errors"]
    )
    assert re.search(r"range of K=1 interval .*: step [0-9.]+ \.\. [0-9.]+ \.\. [0-9.]+ ms", text)
    low, high = span["step_ms"]["low"], span["step_ms"]["high"]
    assert f"step {low:.4f} .. " in text and f" .. {high:.4f} ms (low .. expected .. high)" in text
    assert report["profile"] is None


def test_xla_multi_streaming_is_xlas_own_stream_placement(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    result = simulate(TP_DP, "--streams=1", f"--json={out}", "--sync-on-compute")
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    module = parse_module(TP_DP.read_text(), str(TP_DP))
    sim = Simulator(module, get_target("h100"), model=StreamModel(sync_on_compute=True))
    assignment = xla_stream_assignment(module, sim.pairs)
    # Streams 0 and 1 in turn over the post-order, not all on one: a real two-stream run.
    assert set(assignment.stream_of.values()) == {0, 1}
    expected = sim.run(assignment)
    xla = report["xla_multi_streaming"]
    assert xla["streams"] == 2
    assert xla["step_ms"] == pytest.approx(expected.step_time * 1e3)
    assert xla["exposed_communication_ms"] == pytest.approx(expected.exposed_communication * 1e3)
    assert xla["step_ms"] != pytest.approx(report["step_ms"])  # not K=1 under another name
    line = ms(r"^XLA's own multi-streaming \(--xla_gpu_experimental_enable_collective_multi_"
              r"streaming: 2 streams in turn, in post-order\): ([0-9.]+) ms", result.stdout)  # fmt: skip
    assert line == pytest.approx(expected.step_time * 1e3, abs=1e-4)


def test_json_to_stdout_sends_the_table_to_stderr() -> None:
    result = simulate(TP_DP, "--streams=1", "--json=-")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["schema"] == SCHEMA
    assert "predicted step time" in result.stderr and "range of" in result.stderr


def test_the_file_reads_back_as_the_prediction_it_was(tmp_path: Path) -> None:
    profile = tmp_path / "pgle.pbtxt"
    profile.write_text('costs { name: "gemm_fusion_dot.8" cost_us: 100.0 }\n')
    text = _report_text(io.StringIO(), streams="1,2", profile=str(profile))
    prediction = Prediction.from_json(text, "p.json")
    assert prediction.to_json() == text
    assert Prediction.from_json(prediction.to_json()) == prediction
    assert prediction.profile is not None and prediction.profile.names == 1
    assert prediction.range is not None and prediction.xla_multi_streaming is not None
    assert [(r.streams, r.policy) for r in prediction.results][:2] == [
        (1, "interval"),
        (2, "interval"),
    ]
    # Fields added to v1 later are ignored by this reader.
    added = json.loads(text)
    added["results"][0]["added_later"] = [1]
    assert Prediction.from_json(json.dumps(added)) == prediction
    # A file written before xla_estimate was added to v1 reads as not asked for.
    older = json.loads(text)
    assert older.pop("xla_estimate") is None
    assert Prediction.from_json(json.dumps(older)) == prediction


_XLA_STEP = {
    "path": "s.txt", "module": "jit_step", "step_ms": 1.5, "priced_step_ms": 1.0,
    "kernels_ms": 0.6, "exposed_communication_ms": 0.4, "wasted_ms": {}, "placeholders": [],
}  # fmt: skip


def _broken(change: Any) -> str:
    data = json.loads(_report_text(io.StringIO()))
    change(data)
    return json.dumps(data)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.__setitem__("schema", "xla_streams.simulate.v0"),
         "schema: expected 'xla_streams.simulate.v1', got 'xla_streams.simulate.v0'"),
        (lambda d: d["bounds"].pop("lower"), "bounds.lower: missing"),
        (lambda d: d.pop("profile"), "profile: missing"),
        (lambda d: d.__setitem__("step_ms", "1.0"), "step_ms: expected a number, got a string"),
        (lambda d: d.__setitem__("serial_ms", -1.0), "serial_ms: expected a number >= 0, got -1.0"),
        (lambda d: d["results"][0].__setitem__("policy", "greedy"),
         "results[0].policy: expected one of interval, round-robin, got 'greedy'"),
        (lambda d: d["results"][0].__setitem__("stream_busy_ms", []),
         "results[0].stream_busy_ms: expected one time per stream (1), got 0"),
        (lambda d: d["range"]["step_ms"].__setitem__("low", 1e9),
         "range.step_ms: expected low <= expected <= high"),
        (lambda d: d["runs_on"].__setitem__("communication", 99),
         "runs_on: counts add up to 99, not 10"),
        (lambda d: d["runs_on"].__setitem__("gpu", 0), "runs_on.gpu: not a place XLA runs a pair"),
        (lambda d: d["target"].pop("gpu"), "target.gpu: missing"),
        (lambda d: d.__setitem__("notes", [3]), "notes[0]: expected a string, got a number (3)"),
        (lambda d: d.__setitem__("xla_estimate", {**_XLA_STEP, "priced_step_ms": 2.0}),
         "xla_estimate.priced_step_ms: expected at most step_ms (1.5), got 2.0"),
        (lambda d: d.__setitem__("xla_estimate", {**_XLA_STEP, "wasted_ms": {"all_gather": -1}}),
         "xla_estimate.wasted_ms.all_gather: expected a number >= 0"),
    ],
)  # fmt: skip
def test_a_damaged_file_is_refused_naming_file_and_field(change: Any, message: str) -> None:
    with pytest.raises(PredictionError) as refused:
        Prediction.from_json(_broken(change), "p.json")
    assert str(refused.value).startswith(f"p.json: {message}"), str(refused.value)


def test_a_profiles_fraction_is_a_fraction(tmp_path: Path) -> None:
    profile = tmp_path / "pgle.pbtxt"
    profile.write_text('costs { name: "gemm_fusion_dot.8" cost_us: 100.0 }\n')
    data = json.loads(_report_text(io.StringIO(), profile=str(profile)))
    data["profile"]["measured_fraction"] = 1.5
    with pytest.raises(PredictionError, match=r"^p\.json: profile\.measured_fraction: expected"):
        Prediction.from_json(json.dumps(data), "p.json")


def test_what_is_not_json_is_refused_naming_the_file() -> None:
    with pytest.raises(PredictionError, match=r"^p\.json: not JSON: "):
        Prediction.from_json("{", "p.json")
    with pytest.raises(PredictionError, match=r"^p\.json: expected a JSON object with \"schema\""):
        Prediction.from_json("3", "p.json")


def _report_text(out: io.StringIO, **options: Any) -> str:
    """The JSON ``simulate_command`` writes for TP_DP, K=1 unless ``streams`` says."""
    import tempfile

    options.setdefault("streams", "1")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.json"
        err = io.StringIO()
        code = simulate_command(str(TP_DP), json_path=str(path), out=out, err=err, **options)
        assert code == 0, err.getvalue()
        return path.read_text()


def _report(out: io.StringIO, **options: Any) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(_report_text(out, **options))
    return report


# -- --perf-table ---------------------------------------------------------------------------


def test_a_users_table_prices_the_collectives(tmp_path: Path) -> None:
    table = tmp_path / "slow.txtpb"
    table.write_text(SLOW_TABLE)
    vendored, mine = tmp_path / "v.json", tmp_path / "m.json"
    assert simulate(TP_DP, "--streams=1", f"--json={vendored}").returncode == 0
    result = simulate(TP_DP, "--streams=1", f"--perf-table={table}", f"--json={mine}")
    assert result.returncode == 0, result.stderr
    slow, fast = json.loads(mine.read_text()), json.loads(vendored.read_text())
    assert slow["target"]["perf_table"] == str(table)
    # 8 MiB at 1 GB/s is 8.4 ms: far slower than XLA's measured NVLink.
    assert slow["step_ms"] > fast["step_ms"] + 50
    assert slow["results"][0]["stream_busy_ms"][0] == pytest.approx(
        (2 * 8 + 8 * 16) * 2**20 / 1e9 * 1e3, rel=1e-6
    )
    # The Python entry point takes it too.
    assert _report(io.StringIO(), perf_table=str(table))["step_ms"] == pytest.approx(
        slow["step_ms"]
    )


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        (SLOW_TABLE.replace('opcode: "all-reduce"', 'opcode: "sort"', 1), ":6:",
         "unsupported opcode 'sort'"),
        (SLOW_TABLE.replace("F32", "F33", 1), ":8:", "unknown element_type 'F33'"),
        (SLOW_TABLE[: SLOW_TABLE.rindex("}")], ":2:", "never closed"),
        (SLOW_TABLE.replace('"sm_90"', '"sm_100_B200"'), "",
         "no measurements for 'sm_90'; the table has: sm_100_B200"),
        (SLOW_TABLE.replace("bytes_per_sec: 1000000000", "bytes_per_sec: 1.5", 1), ":11:",
         "field 'network_throughput_bytes_per_sec' must be an integer"),
        (SLOW_TABLE.replace("bytes_per_sec: 1000000000", "bytes_per_sec: 1 "
                            "network_throughput_bytes_per_sec: 2", 1), ":11:",
         "field 'network_throughput_bytes_per_sec' is given 2 times"),
    ],
)  # fmt: skip
def test_a_bad_table_is_a_usage_error_naming_file_and_line(
    tmp_path: Path, text: str, where: str, what: str
) -> None:
    table = tmp_path / "bad.txtpb"
    table.write_text(text)
    out = tmp_path / "p.json"
    result = simulate(TP_DP, "--streams=1", f"--perf-table={table}", f"--json={out}")
    assert_usage_error(result, f"--perf-table: {table}{where}", what)
    assert not out.exists(), "nothing written on error"
    err = io.StringIO()
    assert simulate_command(str(TP_DP), perf_table=str(table), err=err) == 2
    assert f"{table}{where}" in err.getvalue() and what in err.getvalue()


def test_a_missing_table_is_a_usage_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing.txtpb"
    assert_usage_error(
        simulate(TP_DP, f"--perf-table={missing}"), f"--perf-table: {missing}", "cannot read"
    )


def test_a_table_for_a_target_without_a_key_would_go_unused(tmp_path: Path) -> None:
    table = tmp_path / "slow.txtpb"
    table.write_text(SLOW_TABLE)
    assert_usage_error(
        simulate(TP_DP, "--target=a100", f"--perf-table={table}"),
        "--perf-table: target 'a100' has no key in XLA's performance tables",
        '"perf_table_key"',
    )
    # With the key set in a target file, the table prices A100's collectives.
    target = tmp_path / "a100.json"
    target.write_text('{"base": "a100", "perf_table_key": "sm_90"}')
    out = tmp_path / "p.json"
    result = simulate(
        TP_DP, "--target=a100", f"--target-file={target}", f"--perf-table={table}",
        "--streams=1", f"--json={out}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["target"]["perf_table"] == str(table)


def test_a_target_files_key_the_table_lacks_is_a_usage_error(tmp_path: Path) -> None:
    target = tmp_path / "next.json"
    target.write_text('{"perf_table_key": "sm_120"}')
    out = tmp_path / "p.json"
    assert_usage_error(
        simulate(TP_DP, f"--target-file={target}", f"--json={out}"),
        "perf_table_key:", "no measurements for 'sm_120'", "the table has: ",
    )  # fmt: skip
    assert not out.exists(), "nothing written on error"
    err = io.StringIO()
    assert simulate_command(str(TP_DP), target_file=str(target), err=err) == 2
    assert "no measurements for 'sm_120'" in err.getvalue()


# -- --profile ------------------------------------------------------------------------------


def test_a_profile_says_how_much_of_the_step_was_measured(tmp_path: Path) -> None:
    profile = tmp_path / "pgle.pbtxt"
    profile.write_text(
        "\n".join(
            [f'costs {{ name: "gemm_fusion_dot.{i}" cost_us: 100.0 }}' for i in range(8, 13)]
            + [
                f'costs {{ name: "{FINGERPRINT}::gemm_fusion_dot.13" cost_us: 100.0 }}',
                'costs { name: "0123456789abcdef0123456789abcdef::other" cost_us: 5.0 }',
                'costs { name: "not_in_this_module" cost_us: 5.0 }',
            ]
        )
        + "\n"
    )
    out = tmp_path / "p.json"
    result = simulate(TP_DP, "--streams=1", f"--profile={profile}", f"--json={out}")
    assert result.returncode == 0, result.stderr
    measured = json.loads(out.read_text())["profile"]
    # Six kernels at 100 us measured: 0.6 ms of the step's work; the rest modelled.
    assert measured["path"] == str(profile)
    assert measured["measured_ms"] == pytest.approx(0.6)
    assert 0 < measured["measured_fraction"] < 1
    assert measured["measured_fraction"] == pytest.approx(0.6 / (0.6 + measured["modeled_ms"]))
    assert (measured["names"], measured["names_in_module"], measured["skipped"]) == (7, 6, 1)
    line = re.search(
        r"^profile .*pgle\.pbtxt: ([0-9.]+) ms of the step's work measured \(([0-9.]+)%\), "
        r"([0-9.]+) ms modelled; 6 of its 7 instruction names are in this module, 1 entries "
        r"of other modules skipped$",
        result.stdout,
        re.M,
    )
    assert line, result.stdout
    assert float(line.group(1)) == pytest.approx(0.6, abs=1e-4)
    assert float(line.group(2)) == pytest.approx(measured["measured_fraction"] * 100, abs=0.1)
    # The measured kernels' own, smaller, error bound narrows nothing else: still a range.
    span = json.loads(out.read_text())["range"]["step_ms"]
    assert span["low"] < span["expected"] < span["high"]


@pytest.mark.parametrize(
    ("second", "what"),
    [
        ('costs { name: "b" cost_us: -3 }', "cost_us of 'b' must be a non-negative number"),
        ('costs { name: "b" cost_us: 1.0 cost_us: 2.0 }', "field 'cost_us' is given 2 times"),
        ('costs { name: "b" cost_us: "x" }', "cost_us"),
    ],
)
def test_a_bad_profile_is_a_usage_error_naming_file_and_line(
    tmp_path: Path, second: str, what: str
) -> None:
    profile = tmp_path / "pgle.pbtxt"
    profile.write_text(f'costs {{ name: "a" cost_us: 1.0 }}\n{second}\n')
    assert_usage_error(simulate(TP_DP, f"--profile={profile}"), f"--profile: {profile}:2:", what)
    err = io.StringIO()
    assert simulate_command(str(TP_DP), profile=str(profile), err=err) == 2
    assert f"{profile}:2:" in err.getvalue()


# -- --xla-schedule ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """tp_dp_2d compiled deviceless with XLA's schedule dumped: the module text and the
    dump of the same compile."""
    if jax_compat.cuda_plugin_module() is None:
        pytest.skip("deviceless GPU compiles need jax[cuda12]")
    from xla_streams.aot import compile_for_gpu, gpu_topology

    program = programs.PROGRAMS["tp_dp_2d"]
    fn, args = program.build(gpu_topology("h100", program.num_devices).devices)
    result = compile_for_gpu(fn, args, dump=False, schedule=True)
    folder = tmp_path_factory.mktemp("dump")
    (folder / "jit_step.hlo").write_text(result.as_text)
    (folder / "jit_step.schedule.txt").write_text(result.schedule_text)
    return folder / "jit_step.hlo", folder / "jit_step.schedule.txt"


def test_xla_schedule_puts_xlas_estimate_beside_ours(
    compiled: tuple[Path, Path], tmp_path: Path
) -> None:
    module, schedule = compiled
    out = tmp_path / "p.json"
    result = simulate(module, "--streams=1", f"--xla-schedule={schedule}", f"--json={out}")
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    estimate, xla = read_schedule(schedule), report["xla_estimate"]
    # The figures are the dump's, split as the baseline is: kernels + exposed = the step.
    assert xla["module"] == estimate.module == report["module"]
    assert xla["priced_step_ms"] == pytest.approx(estimate.priced_step_us / 1e3)
    assert xla["step_ms"] == pytest.approx(estimate.step_us / 1e3)
    assert xla["exposed_communication_ms"] == pytest.approx(estimate.exposed_communication_us / 1e3)
    assert xla["kernels_ms"] + xla["exposed_communication_ms"] == pytest.approx(
        xla["priced_step_ms"]
    )
    assert 0 < xla["exposed_communication_ms"] == pytest.approx(xla["wasted_ms"]["all_reduce"])
    assert xla["placeholders"] == []
    assert Prediction.from_json(out.read_text(), out.name).to_json() == out.read_text()
    # The text says the same, and where the baseline differs from it.
    text = result.stdout
    assert ms(r"^XLA's own estimate .*: step ([0-9.]+) ms", text) == pytest.approx(
        xla["priced_step_ms"], abs=1e-4
    )
    ours_minus_xla = ms(r"^K=1 interval against XLA's estimate: step ([-+0-9.]+) ms", text)
    assert ours_minus_xla == pytest.approx(report["step_ms"] - xla["priced_step_ms"], abs=1e-4)
    assert "note: the schedule is of module" not in text
    # The dump folder is as good as the file in it.
    by_folder = simulate(module, "--streams=1", f"--xla-schedule={schedule.parent}")
    assert by_folder.stdout == text


def test_a_schedule_of_another_module_is_said_to_be(
    compiled: tuple[Path, Path], tmp_path: Path
) -> None:
    module, schedule = compiled
    other = tmp_path / "other.schedule.txt"
    other.write_text(schedule.read_text().replace('name: "jit_step"', 'name: "jit_other"', 1))
    result = simulate(module, "--streams=1", f"--xla-schedule={other}")
    assert result.returncode == 0, result.stderr
    assert "note: the schedule is of module jit_other, not jit_step" in result.stdout


def test_a_bad_schedule_is_a_usage_error_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.schedule.txt"
    bad.write_text("hlo_module { name: 3 }\ncomputation_schedules {\n")
    assert_usage_error(simulate(TP_DP, f"--xla-schedule={bad}"), f"--xla-schedule: {bad}")
    assert_usage_error(
        simulate(TP_DP, f"--xla-schedule={tmp_path / 'empty'}"), "--xla-schedule: ", "empty"
    )
    (tmp_path / "folder").mkdir()
    assert_usage_error(
        simulate(TP_DP, f"--xla-schedule={tmp_path / 'folder'}"), "no *.schedule.txt files"
    )
    err = io.StringIO()
    assert simulate_command(str(TP_DP), xla_schedule=str(bad), err=err) == 2
    assert str(bad) in err.getvalue()


def test_help_lists_the_new_flags() -> None:
    result = simulate("--help")
    assert result.returncode == 0
    for flag in (
        "--perf-table=", "--profile=", "--xla-schedule=", "--json=", "xla_streams.simulate.v1",
    ):  # fmt: skip
        assert flag in result.stdout, flag
