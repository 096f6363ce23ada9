"""The JAX plugin: settings, the compile hook, reports, failing fast, strict mode.

Unit tests run without JAX. The hook is exercised for real: in this process
(one CPU device, the Python API) and in subprocesses with 8 CPU host devices
(``--xla_force_host_platform_device_count=8``), where an unmodified script gets
the plugin from the environment alone, through the ``jax_plugins`` entry point.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before anything imports JAX

from xla_streams import plugin
from xla_streams.config import Config, ConfigError, ignored_env

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "hlo_fixtures" / "transformer_step.limit4.text.hlo"
ENTRY_POINT_INSTALLED = any(
    ep.value == "xla_streams.plugin" for ep in entry_points(group="jax_plugins")
)
assert ENTRY_POINT_INSTALLED, "the jax_plugins entry point is not installed: pip install -e ."


def needs_entry_point(test: Any) -> Any:
    """Marks tests that reach the plugin through JAX's entry point (checked above)."""
    return test


# -- settings ------------------------------------------------------------------------


def env(**values: str) -> dict[str, str]:
    return {f"XLA_STREAMS_{k.upper()}": v for k, v in values.items()}


def test_off_without_streams_or_pipeline() -> None:
    assert Config.from_env({}) is None
    assert Config.from_env(env(collective_streams="")) is None
    assert ignored_env(env(policy="interval")) == ["XLA_STREAMS_POLICY"]


def test_env_settings() -> None:
    config = Config.from_env(
        env(collective_streams=" 3 ", policy="round-robin", strict="yes", mode="NATIVE")
    )
    assert config == Config(3, "round-robin", "native", strict=True)
    spec = config.pipeline_spec()
    assert spec == (
        "find-async-pairs,assign-streams{streams=3,policy=round-robin},"
        "verify-streams,annotate-streams"
    )


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (dict(collective_streams="abc"), "XLA_STREAMS_COLLECTIVE_STREAMS='abc' is not valid: "
         "expected an integer from 1 to 64"),
        (dict(collective_streams="0"), "XLA_STREAMS_COLLECTIVE_STREAMS='0'"),
        (dict(collective_streams="65"), "from 1 to 64"),
        (dict(collective_streams="4", policy="fifo"),
         "XLA_STREAMS_POLICY='fifo' is not valid; accepted values: interval, round-robin"),
        (dict(collective_streams="4", mode="fast"),
         "XLA_STREAMS_MODE='fast' is not valid; accepted values: native, ffi"),
        (dict(collective_streams="4", strict="maybe"),
         "XLA_STREAMS_STRICT='maybe' is not valid; accepted values: 1, 0, true, false"),
        (dict(pipeline="find-async-pairs,nope"), "unknown pass 'nope'"),
        (dict(pipeline="find-async-pairs"), "has no assign-streams pass"),
        (dict(collective_streams="4", pipeline="find-async-pairs,assign-streams{streams=2}"),
         "XLA_STREAMS_PIPELINE says streams=2 but XLA_STREAMS_COLLECTIVE_STREAMS=4"),
    ],
)  # fmt: skip
def test_bad_env_values_name_the_variable(values: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        Config.from_env(env(**values))
    assert expected in str(e.value)


def test_pipeline_supplies_streams_and_policy() -> None:
    spec = "find-async-pairs,assign-streams{streams=2,policy=round-robin},verify-streams"
    config = Config.from_env(env(pipeline=spec))
    assert config is not None
    assert (config.collective_streams, config.policy, config.pipeline_spec()) == (
        2,
        "round-robin",
        spec,
    )


def test_report_dir_must_be_a_directory(tmp_path: Path) -> None:
    a_file = tmp_path / "f"
    a_file.write_text("")
    with pytest.raises(ConfigError, match="XLA_STREAMS_REPORT_DIR=.* not a directory"):
        Config.from_env(env(collective_streams="2", report_dir=str(a_file)))
    config = Config.from_env(env(collective_streams="2", report_dir=str(tmp_path / "new")))
    assert config is not None and config.report_dir == str(tmp_path / "new")


def test_keyword_and_flag_spellings() -> None:
    with pytest.raises(ConfigError, match=r"^policy='x' is not valid"):
        Config.from_values({"collective_streams": 2, "policy": "x"}, "kwarg")
    with pytest.raises(ConfigError, match=r"^--xla_streams_collective_streams=99 is not valid"):
        Config.from_values({"collective_streams": "99"}, "flag")
    with pytest.raises(ConfigError, match="collective_streams=True"):
        Config(True)  # type: ignore[arg-type]
    # A flag overrides its environment variable; errors name the layer they came from.
    config = Config.from_layers(
        [(env_settings(collective_streams="8", policy="interval"), "env"),
         ({"collective_streams": "2"}, "flag")]
    )  # fmt: skip
    assert config is not None and (config.collective_streams, config.policy) == (2, "interval")


def env_settings(**values: str) -> dict[str, str]:
    return dict(values)


def test_xla_flags_added_only_when_missing() -> None:
    wanted = plugin.native_xla_flags(4)
    new, added, users = plugin.xla_flags_with("", wanted)
    assert added == [
        "--xla_gpu_experimental_parallel_collective_overlap_limit=4",
        "--xla_gpu_executable_num_communication_streams=4",
    ]
    assert new == " ".join(added) and users == {}
    current = "--xla_force_host_platform_device_count=8 --xla_gpu_experimental_parallel_collective_overlap_limit=2"
    new, added, users = plugin.xla_flags_with(current, wanted)
    assert added == ["--xla_gpu_executable_num_communication_streams=4"]
    assert new == current + " --xla_gpu_executable_num_communication_streams=4"
    assert users == {"xla_gpu_experimental_parallel_collective_overlap_limit": "2"}


# -- the module the hook sees ----------------------------------------------------------


def test_process_text_annotates_and_reports(tmp_path: Path) -> None:
    from xla_streams.report import build_report, format_report, to_json

    text = FIXTURE.read_text()
    config = Config(4, report_dir=str(tmp_path))
    processed = plugin.process_text(text, config)
    assert processed.text is not None and processed.text != text
    assert processed.text.count('_xla_stream_annotation="1"') >= 2
    assert processed.fingerprint == plugin.fingerprint(text)
    json_path, txt_path = processed.reports
    assert Path(json_path).name == f"{processed.name}.{processed.fingerprint}.json"
    report = build_report(processed.compilation)
    assert Path(json_path).read_text() == to_json(report)
    assert Path(txt_path).read_text() == format_report(report)
    assert sorted(os.listdir(tmp_path)) == sorted([Path(json_path).name, Path(txt_path).name])
    # The same text gives the same bytes (what every process of a job computes).
    again = plugin.process_text(text, Config(4), name="x")
    assert again.text == processed.text and again.reports == ()


def test_report_html_adds_a_trace_and_a_timeline(tmp_path: Path) -> None:
    config = Config.from_env(
        {
            "XLA_STREAMS_COLLECTIVE_STREAMS": "4",
            "XLA_STREAMS_REPORT_DIR": str(tmp_path),
            "XLA_STREAMS_REPORT_HTML": "1",
        }
    )
    assert config is not None and config.report_html
    processed = plugin.process_text(FIXTURE.read_text(), config)
    json_path, _, trace_path, html_path = processed.reports
    stem = Path(json_path).name.removesuffix(".json")
    assert Path(trace_path).name == f"{stem}.trace.json"
    assert json.loads(Path(trace_path).read_text())["traceEvents"]
    assert Path(html_path).name == f"{stem}.html"
    assert "<svg" in Path(html_path).read_text()
    with pytest.raises(ConfigError, match="XLA_STREAMS_REPORT_HTML='maybe'"):
        Config.from_env({"XLA_STREAMS_COLLECTIVE_STREAMS": "4", "XLA_STREAMS_REPORT_HTML": "maybe"})
    with pytest.raises(ConfigError, match="report_html needs report_dir"):
        Config.from_env({"XLA_STREAMS_COLLECTIVE_STREAMS": "4", "XLA_STREAMS_REPORT_HTML": "1"})


def test_reports_appear_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each report file comes into existence whole, by a rename of a finished file."""
    text = FIXTURE.read_text()
    real_replace = os.replace
    seen = []

    def replace(src: str, dst: str) -> None:
        assert not os.path.exists(dst), "a report file existed before its rename"
        assert os.path.dirname(os.path.abspath(src)) == os.path.dirname(os.path.abspath(dst))
        content = Path(src).read_text()
        if dst.endswith(".json"):
            json.loads(content)  # complete before it becomes visible
        seen.append(os.path.basename(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    processed = plugin.process_text(text, Config(2, report_dir=str(tmp_path)))
    assert sorted(seen) == sorted(os.path.basename(p) for p in processed.reports)
    assert sorted(os.listdir(tmp_path)) == sorted(seen)  # no temporary file left


# -- the hook inside a real compile (this process, one CPU device) ----------------------


@pytest.fixture
def jax_cpu() -> Iterator[Any]:
    import jax

    plugin.disable()
    plugin.reset_stats()
    try:
        yield jax
    finally:
        plugin.disable()


def compile_n(jax: Any, n: int) -> list[Any]:
    import jax.numpy as jnp

    x = jax.ShapeDtypeStruct((64,), jnp.float32)
    return [jax.jit(lambda v, i=i: jnp.sin(v) * (i + 2)).lower(x).compile() for i in range(n)]


def test_hook_runs_once_for_every_compile(jax_cpu: Any, tmp_path: Path) -> None:
    plugin.enable(2, report_dir=tmp_path)
    plugin.enable(3, report_dir=tmp_path)  # enabling again replaces, never registers twice
    compile_n(jax_cpu, 3)
    stats = plugin.stats()
    assert (stats.calls, stats.failed, len(stats.modules)) == (3, 0, 3)
    assert len(stats.reports) == 3 and all(Path(p).exists() for p in stats.reports)
    assert {json.loads(Path(p).read_text())["streams"] for p in stats.reports} == {3}
    plugin.disable()
    compile_n(jax_cpu, 2)
    assert plugin.stats().calls == 3
    plugin.enable(2)
    compile_n(jax_cpu, 1)
    assert plugin.stats().calls == 4


def test_context_manager_restores_the_previous_state(jax_cpu: Any) -> None:
    import xla_streams

    assert xla_streams.current() is None
    with xla_streams.collective_streams(2) as config:
        assert xla_streams.current() == config
        with xla_streams.collective_streams(5, policy="round-robin"):
            assert plugin.current() == Config(5, "round-robin")
            compile_n(jax_cpu, 1)
        assert xla_streams.current() == config
        compile_n(jax_cpu, 1)
    assert xla_streams.current() is None
    compile_n(jax_cpu, 1)
    assert plugin.stats().calls == 2
    with (
        pytest.raises(ConfigError, match="mode='fast'"),
        xla_streams.collective_streams(2, mode="fast"),
    ):
        pass
    assert xla_streams.current() is None


def _raise(*args: object) -> None:
    raise RuntimeError("injected failure")


def test_internal_error_leaves_the_module_unchanged(
    jax_cpu: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    import jax.numpy as jnp

    from xla_streams.passes.verify_streams import VerifyStreams

    monkeypatch.setattr(VerifyStreams, "run", _raise)
    # A report makes the hook run its passes on every module (without one, a module
    # with no async collective, as on CPU, is skipped before parsing).
    plugin.enable(2, report_dir=tmp_path)
    with caplog.at_level("WARNING"):
        out = jax_cpu.jit(lambda v: jnp.cos(v) + 1)(jnp.arange(4.0))
    assert out.tolist() == (jnp.cos(jnp.arange(4.0)) + 1).tolist()
    assert plugin.stats().failed >= 1
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        "module jit__lambda left unchanged" in m and "injected failure" in m for m in messages
    ), messages


def test_strict_mode_fails_the_compile(
    jax_cpu: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import jax.numpy as jnp

    from xla_streams.passes.verify_streams import VerifyStreams

    monkeypatch.setattr(VerifyStreams, "run", _raise)
    plugin.enable(2, strict=True, report_dir=tmp_path)
    with pytest.raises(Exception, match=r"xla_streams failed on module jit__lambda.*injected"):
        jax_cpu.jit(lambda v: jnp.tan(v) * 3)(jnp.arange(4.0))


def test_changed_module_round_trips_with_large_constants(
    jax_cpu: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A module the pipeline changes goes back to XLA whole, large constants included
    (the default ``to_string()`` would print them as ``{...}`` and lose them)."""
    import numpy as np

    from xla_streams.passes.annotate_streams import AnnotateStreams, set_frontend_attribute

    def mark_root(self: object, compilation: Any) -> None:
        set_frontend_attribute(compilation.module.entry.root, "_xla_streams_test", "1")

    monkeypatch.setattr(AnnotateStreams, "run", mark_root)
    constant = np.random.RandomState(0).rand(4000).astype(np.float32)
    f = jax_cpu.jit(lambda v: v * constant + 1)
    plugin.enable(2, report_dir=tmp_path)
    out = np.asarray(f(np.ones(4000, np.float32)))
    stats = plugin.stats()
    assert stats.changed >= 1 and stats.failed == 0
    np.testing.assert_array_equal(out, constant + 1)


# -- subprocesses: 8 CPU host devices, the environment only -----------------------------

COLLECTIVES_SCRIPT = """
import sys
import numpy as np
import jax, jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))

def step(x):
    y = jax.lax.psum(x, "b")
    z = jax.lax.all_gather(y, "a", tiled=True)
    w = jax.lax.psum_scatter(z * 2, "a", tiled=True)
    v = jax.lax.all_to_all(w, "b", 0, 0, tiled=True)
    return jax.lax.ppermute(v, "b", [(i, (i + 1) % 4) for i in range(4)]) + jnp.tanh(x)

f = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=P("a", "b"), out_specs=P("a", "b")))
x = jnp.asarray(np.random.RandomState(0).randn(32, 64).astype(np.float32))
np.save(sys.argv[1], np.asarray(f(x)))
"""


def run_python(
    args: list[str], cwd: Path, extra_env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("XLA_STREAMS_", "XLA_FLAGS"))
    }
    environ.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8")
    environ.update(extra_env)
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def module_names_in_dump(dump: Path) -> set[str]:
    names = set()
    for f in dump.glob("module_*.txt"):
        # module_0003.jit_step.cpu_after_optimizations.txt -> jit_step
        names.add(f.name.split(".")[1])
    return names


def run_collectives_script(
    tmp_path: Path, settings: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], Any, Any, Path, Path]:
    """COLLECTIVES_SCRIPT with ``settings`` (plus a report dir and an HLO dump) and
    without the plugin: (the run with it, its result, the result without, reports, dump)."""
    import numpy as np

    script = tmp_path / "collectives.py"
    script.write_text(COLLECTIVES_SCRIPT)
    reports, dump = tmp_path / "reports", tmp_path / "dump"
    on = run_python(
        [str(script), str(tmp_path / "on.npy")],
        tmp_path,
        {
            **settings,
            "XLA_STREAMS_REPORT_DIR": str(reports),
            "XLA_FLAGS": f"--xla_force_host_platform_device_count=8 --xla_dump_to={dump} "
            "--xla_dump_hlo_pass_re=^$",
        },
        timeout=300,
    )
    assert on.returncode == 0, on.stderr
    off = run_python([str(script), str(tmp_path / "off.npy")], tmp_path, {})
    assert off.returncode == 0, off.stderr
    return on, np.load(tmp_path / "on.npy"), np.load(tmp_path / "off.npy"), reports, dump


@needs_entry_point
def test_unmodified_script_gets_the_plugin_from_the_environment(tmp_path: Path) -> None:
    import numpy as np

    on, with_plugin, without, reports, dump = run_collectives_script(
        tmp_path, {"XLA_STREAMS_COLLECTIVE_STREAMS": "4"}
    )
    np.testing.assert_array_equal(with_plugin, without)
    # The plugin said what it set, and every module XLA compiled has its report.
    assert (
        "added to XLA_FLAGS: --xla_gpu_experimental_parallel_collective_overlap_limit=4"
        in on.stderr
    )
    jsons = sorted(reports.glob("*.json"))
    assert {json.loads(p.read_text())["module"] for p in jsons} == module_names_in_dump(dump)
    assert {p.with_suffix(".txt").exists() for p in jsons} == {True}
    step = [p for p in jsons if p.name.startswith("jit_step.")]
    assert len(step) == 1
    assert json.loads(step[0].read_text())["schema"] == "xla_streams.assignment.v1"
    assert not [p for p in reports.iterdir() if p.suffix not in (".json", ".txt")]


@needs_entry_point
def test_ffi_mode_from_the_environment_runs_our_custom_calls(tmp_path: Path) -> None:
    """XLA_STREAMS_MODE=ffi: every collective of the unmodified script runs as our
    start/done custom calls on the host runtime, with XLA's results."""
    import numpy as np

    _, with_plugin, without, reports, dump = run_collectives_script(
        tmp_path, {"XLA_STREAMS_COLLECTIVE_STREAMS": "2", "XLA_STREAMS_MODE": "ffi"}
    )
    np.testing.assert_allclose(with_plugin, without, rtol=1e-6)
    (optimized,) = dump.glob("*jit_step*after_optimizations.txt")
    text = optimized.read_text()
    # psum, all_gather, psum_scatter, all_to_all and ppermute: five of our starts.
    assert text.count('custom_call_target="xla_streams_start"') == 5
    assert not re.search(
        r" (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)\(", text
    )
    (report,) = reports.glob("jit_step.*.json")
    summary = json.loads(report.read_text())["summary"]
    # Each collective consumes the one before: none overlap, so one stream is enough.
    assert summary["assigned"] == 5
    assert summary["max_in_flight"] == 1 and summary["streams_used"] == 1


FAIL_FAST_SCRIPT = """
import jax
try:
    print(jax.devices())
except Exception as e:  # a program that swallows errors still stops
    print("CAUGHT", e)
print("REACHED")
"""


@needs_entry_point
@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({"XLA_STREAMS_COLLECTIVE_STREAMS": "four"},
         "XLA_STREAMS_COLLECTIVE_STREAMS='four' is not valid: expected an integer from 1 to 64"),
        ({"XLA_STREAMS_COLLECTIVE_STREAMS": "4", "XLA_STREAMS_MODE": "fast"},
         "XLA_STREAMS_MODE='fast' is not valid; accepted values: native, ffi"),
        ({"XLA_STREAMS_COLLECTIVE_STREAMS": "4", "XLA_STREAMS_POLICY": "lifo"},
         "XLA_STREAMS_POLICY='lifo' is not valid; accepted values: interval, round-robin"),
    ],
)  # fmt: skip
def test_bad_values_stop_the_program_at_start_up(
    tmp_path: Path, variables: dict[str, str], expected: str
) -> None:
    script = tmp_path / "devices.py"
    script.write_text(FAIL_FAST_SCRIPT)
    dump = tmp_path / "dump"
    result = run_python(
        [str(script)],
        tmp_path,
        {**variables, "XLA_FLAGS": f"--xla_dump_to={dump}"},
    )
    assert result.returncode != 0
    assert "REACHED" not in result.stdout and "CAUGHT" not in result.stdout
    assert f"xla_streams: {expected}" in result.stderr
    assert not dump.exists()  # nothing was compiled


STRICT_SCRIPT = """
import jax, jax.numpy as jnp
from dataclasses import dataclass
from xla_streams.pipeline import Compilation, ModulePass, register

@register
@dataclass(frozen=True)
class Explode(ModulePass):
    name = "test-explode"

    def run(self, compilation: Compilation) -> None:
        raise RuntimeError("injected failure")

print(jax.jit(lambda x: x * 2)(jnp.arange(3.0)))
"""


@needs_entry_point
def test_strict_mode_from_the_environment_fails_the_compile(tmp_path: Path) -> None:
    script = tmp_path / "strict.py"
    script.write_text(STRICT_SCRIPT)
    variables = {
        "XLA_STREAMS_PIPELINE": "find-async-pairs,assign-streams{streams=2},test-explode",
        "XLA_STREAMS_STRICT": "1",
    }
    # The pass exists only once the script has registered it, which is before
    # JAX starts: the pipeline is checked then.
    result = run_python([str(script)], tmp_path, variables)
    assert result.returncode != 0
    assert "xla_streams failed on module" in result.stderr
    assert "pass 'test-explode' failed: RuntimeError: injected failure" in result.stderr
    result = run_python([str(script)], tmp_path, {**variables, "XLA_STREAMS_STRICT": "0"})
    assert result.returncode == 0, result.stderr
    assert "[0. 2. 4.]" in result.stdout
    assert "left unchanged: PipelineError: pass 'test-explode' failed" in result.stderr


ABSL_SCRIPT = """
from absl import app
import xla_streams.flags  # noqa: F401

def main(argv):
    import jax, jax.numpy as jnp
    from xla_streams import plugin
    print(jax.jit(lambda x: x + 1)(jnp.ones(2)), plugin.current())

app.run(main)
"""


def test_absl_flags(tmp_path: Path) -> None:
    script = tmp_path / "absl_main.py"
    script.write_text(ABSL_SCRIPT)
    reports = tmp_path / "reports"
    result = run_python(
        [str(script), "--xla_streams_collective_streams=3", f"--xla_streams_report_dir={reports}"],
        tmp_path,
        {"XLA_STREAMS_POLICY": "round-robin"},  # the environment fills what the flags leave
    )
    assert result.returncode == 0, result.stderr
    assert "collective_streams=3, policy='round-robin'" in result.stdout
    assert any(reports.glob("jit__lambda.*.json"))
    result = run_python([str(script), "--xla_streams_collective_streams=99"], tmp_path, {})
    assert result.returncode == 1
    assert "--xla_streams_collective_streams=99 is not valid: expected an integer from 1 to 64" in (
        result.stderr
    )


def test_importing_the_package_does_not_import_jax(tmp_path: Path) -> None:
    code = "import sys, xla_streams, xla_streams.plugin, xla_streams.config; print('jax' in sys.modules)"
    result = run_python(["-c", code], tmp_path, {})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_module_docstring_example_is_current() -> None:
    import xla_streams

    assert set(xla_streams.__all__) >= {"enable", "disable", "collective_streams"}
    assert "xla_streams.enable(collective_streams=4" in textwrap.dedent(xla_streams.__doc__ or "")


def test_quick_check_finds_every_module_with_async_pairs() -> None:
    """The hook skips printing and parsing a module only when it surely has no pair."""
    from jaxlib import _hlo

    from xla_streams.hlo import parse_module
    from xla_streams.passes.find_async_pairs import find_async_pairs

    fixtures = sorted((REPO / "hlo_fixtures").glob("*.hlo"))
    assert fixtures
    for path in fixtures:
        text = path.read_text()
        proto = _hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()
        assert plugin._has_async(proto) == bool(find_async_pairs(parse_module(text))), path.name
    empty = (
        "HloModule m\n\nENTRY %e (p: f32[4]) -> f32[4] {\n  ROOT %p = f32[4]{0} parameter(0)\n}\n"
    )
    assert not plugin._has_async(_hlo.hlo_module_from_text(empty).as_serialized_hlo_module_proto())


def test_hook_is_registered_on_gpu_clients(jax_cpu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """jaxlib reports a CUDA client's platform as "gpu"; the hook must still reach it."""
    from jax._src import xla_bridge, xla_transform

    registered = []
    monkeypatch.setattr(
        xla_transform._xla,
        "register_xla_transform_c_api",
        lambda client, name, stage, callback: registered.append((client.platform, name)),
    )
    hooks_before = len(xla_bridge._backend_initialization_hooks)
    plugin.enable(2)
    new_hooks = xla_bridge._backend_initialization_hooks[hooks_before:]
    assert new_hooks

    class FakeGpuClient:
        platform = "gpu"  # what jaxlib's PyClient says for a CUDA PJRT client

    for hook in new_hooks:
        hook(FakeGpuClient())
    assert ("gpu", plugin.HOOK_NAME) in registered
    # And the compile-only CUDA client of a deviceless topology does say "gpu".
    if importlib.util.find_spec("jax_cuda12_plugin") is not None:
        from xla_streams import aot

        try:
            topology = aot.gpu_topology("h100", 8)
        except aot.GpuAotUnavailable:
            return
        assert topology.devices[0].client.platform == "gpu"
