"""The JAX plugin: settings, the compile hook, reports, failing fast, strict mode.

Unit tests run without JAX. The hook is exercised for real: in this process
(one CPU device, the Python API) and in subprocesses with 8 CPU host devices
(``--xla_force_host_platform_device_count=8``), where an unmodified script gets
the plugin from the environment alone, through the ``jax_plugins`` entry point.
"""

from __future__ import annotations

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
from conftest import xla_parsable

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before anything imports JAX

from xla_streams import plugin, xla_options
from xla_streams.collectives import StreamModel
from xla_streams.environment import BY_ENV
from xla_streams.plugin import hook
from xla_streams.plugin.settings import Config, ConfigError, ignored_env

REPO = Path(__file__).resolve().parents[2]
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
    passes = hook.pipeline_for(config, on_cpu=False, model=StreamModel(3, True))
    assert ",".join(p.spec() for p in passes) == (
        "find-async-pairs{overlap_limit=3,sync_on_compute=true,ffi=false},"
        "assign-streams{streams=3,policy=round-robin},verify-streams,annotate-streams"
    )


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (dict(collective_streams="abc"), "XLA_STREAMS_COLLECTIVE_STREAMS='abc' is not valid: "
         "expected an integer from 1 to 64"),
        (dict(collective_streams="0"), "XLA_STREAMS_COLLECTIVE_STREAMS='0'"),
        (dict(collective_streams="65"), "from 1 to 64"),
        (dict(collective_streams="4", policy="fifo"),
         "XLA_STREAMS_POLICY='fifo' is not valid: expected one of interval, round-robin"),
        (dict(collective_streams="4", mode="fast"),
         "XLA_STREAMS_MODE='fast' is not valid: expected one of native, ffi"),
        (dict(collective_streams="4", strict="maybe"),
         "XLA_STREAMS_STRICT='maybe' is not valid: expected true or false (or 1, 0, yes, no, on, off)"),
        (dict(pipeline="find-async-pairs,nope"), "unknown pass 'nope'"),
        (dict(pipeline="find-async-pairs"), "has no assign-streams pass"),
        (dict(collective_streams="4", mode="native",
              pipeline="find-async-pairs,assign-streams,verify-streams,lower-to-ffi"),
         "XLA_STREAMS_PIPELINE has lower-to-ffi, which needs mode ffi, but XLA_STREAMS_MODE=native"),
        (dict(collective_streams="4", timeout_s="inf"),
         "XLA_STREAMS_TIMEOUT_S='inf' is not valid: expected a number of seconds"),
        (dict(collective_streams="4", timeout_s="1e-9"), "XLA_STREAMS_TIMEOUT_S='1e-9'"),
        (dict(collective_streams="4", timeout_s="abc"), "XLA_STREAMS_TIMEOUT_S='abc'"),
        (dict(collective_streams="4", timeout_s="-1"), "XLA_STREAMS_TIMEOUT_S='-1'"),
        (dict(collective_streams="4", timeout_s="nan"), "XLA_STREAMS_TIMEOUT_S='nan'"),
        (dict(collective_streams="4", log="loud"),
         "XLA_STREAMS_LOG='loud' is not valid: expected one of warning, info, debug"),
        (dict(config="/nonexistent/tune.json"), "XLA_STREAMS_CONFIG='/nonexistent/tune.json' is not valid: no such file"),
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
    assert config.pipeline is not None
    assert (config.collective_streams, config.policy, config.pipeline.text) == (
        2,
        "round-robin",
        spec,
    )


def test_options_a_pipeline_does_not_write_come_from_the_settings() -> None:
    config = Config.from_env(
        env(collective_streams="3", pipeline="find-async-pairs,assign-streams,lower-to-ffi")
    )
    assert config is not None and config.mode == "ffi"  # what lower-to-ffi needs
    find, assign, lower = hook.pipeline_for(
        config, on_cpu=True, model=StreamModel(2, True), devices=(0, 1)
    )
    assert assign.spec() == "assign-streams{streams=3,policy=interval}"
    assert find.spec() == "find-async-pairs{overlap_limit=2,sync_on_compute=true,ffi=true}"
    assert lower.spec() == "lower-to-ffi{backend=host,devices=0:1}"


def test_report_dir_must_be_a_directory(tmp_path: Path) -> None:
    a_file = tmp_path / "f"
    a_file.write_text("")
    with pytest.raises(ConfigError, match="XLA_STREAMS_REPORT_DIR=.* not a directory"):
        Config.from_env(env(collective_streams="2", report_dir=str(a_file)))
    config = Config.from_env(env(collective_streams="2", report_dir=str(tmp_path / "new")))
    assert config is not None and config.report_dir == str(tmp_path / "new")


def test_keyword_and_flag_spellings() -> None:
    with pytest.raises(ConfigError, match=r"^policy='x' is not valid"):
        Config.from_values({"collective_streams": 2, "policy": "x"}, "keyword")
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
    wanted = xla_options.native_mode(4)
    new, added, users = xla_options.with_options("", wanted)
    assert added == [
        "--xla_gpu_experimental_parallel_collective_overlap_limit=4",
        "--xla_gpu_executable_num_communication_streams=4",
    ]
    assert new == " ".join(added) and users == {}
    current = "--xla_force_host_platform_device_count=8 --xla_gpu_experimental_parallel_collective_overlap_limit=2"
    new, added, users = xla_options.with_options(current, wanted)
    assert added == ["--xla_gpu_executable_num_communication_streams=4"]
    assert new == current + " --xla_gpu_executable_num_communication_streams=4"
    assert users == {"xla_gpu_experimental_parallel_collective_overlap_limit": "2"}


def test_overlap_limit_read_as_a_number() -> None:
    limit = xla_options.OVERLAP_LIMIT
    assert xla_options.overlap_limit_in(f"--a=1 --{limit}=8") == 8
    assert xla_options.overlap_limit_in("--a=1") is None
    assert xla_options.overlap_limit_in(f"--{limit}=many") is None
    assert xla_options.overlap_limit_in(f"--{limit}=-2") is None
    assert xla_options.overlap_limit_of(4) == 4 and xla_options.overlap_limit_of("4") == 4
    assert xla_options.overlap_limit_of(True) is None and xla_options.overlap_limit_of(-1) is None


@pytest.mark.parametrize(
    ("xla_flags", "started", "expected"),
    [
        ("", False, 4),  # ours: native mode's K
        ("--{limit}=2", False, 2),  # the user's wins
        ("--{limit}=two", False, 1),  # the user's, unreadable: XLA's default
        ("", True, 1),  # XLA has read XLA_FLAGS: ours came too late
        ("--{limit}=2", True, 2),
    ],
)
def test_stream_model_takes_the_overlap_limit_in_effect(
    monkeypatch: pytest.MonkeyPatch, xla_flags: str, started: bool, expected: int
) -> None:
    monkeypatch.setenv("XLA_FLAGS", xla_flags.format(limit=xla_options.OVERLAP_LIMIT))
    monkeypatch.setattr(plugin.jax_compat, "backends_started", lambda: started)
    for name in ("xla_flags_before", "xla_flags_added", "model", "late_warning_given"):
        monkeypatch.setattr(plugin._state, name, getattr(plugin._state, name))
    plugin._apply_xla_options(Config(4))
    assert plugin._state.model.overlap_limit == expected


# -- the module the hook sees ----------------------------------------------------------


def native(text: str, streams: int = 4) -> Any:
    """The native pipeline the hook runs, on ``text``."""
    passes = hook.pipeline_for(Config(streams), on_cpu=False, model=StreamModel(streams, True))
    return hook.run_pipeline(text, passes)


def test_the_pipeline_annotates_and_the_reports_describe_it(tmp_path: Path) -> None:
    from xla_streams.report import build_report, format_report, write_reports

    text = FIXTURE.read_text()
    compilation = native(text)
    out = compilation.module.print()
    assert compilation.module.changed and out.count('_xla_stream_annotation="1"') >= 2
    digest = hook.fingerprint(text)
    json_path, txt_path = write_reports(compilation, str(tmp_path), digest)
    assert Path(json_path).name == f"{compilation.module.name}.{digest}.json"
    report = build_report(compilation)
    assert Path(json_path).read_text() == report.to_json()
    assert Path(txt_path).read_text() == format_report(report)
    assert sorted(os.listdir(tmp_path)) == sorted(
        [Path(json_path).name, Path(txt_path).name, "index.json", "index.txt", ".index.lock"]
    )
    index = json.loads((tmp_path / "index.json").read_text())
    assert index["schema"] == "xla_streams.index.v1"
    assert [e["report"] for e in index["modules"]] == [Path(json_path).name]
    assert Path(json_path).name in (tmp_path / "index.txt").read_text()
    # The same text gives the same bytes (what every process of a job computes).
    assert native(text).module.print() == out


def test_report_html_adds_a_trace_and_a_timeline(tmp_path: Path) -> None:
    config = Config.from_env(
        {
            "XLA_STREAMS_COLLECTIVE_STREAMS": "4",
            "XLA_STREAMS_REPORT_DIR": str(tmp_path),
            "XLA_STREAMS_REPORT_HTML": "1",
        }
    )
    assert config is not None and config.report_html
    text = FIXTURE.read_text()
    json_path, _, trace_path, html_path = hook.write_module_reports(
        native(text), text, config, html=True
    )
    stem = Path(json_path).name.removesuffix(".json")
    assert Path(trace_path).name == f"{stem}.trace.json"
    assert json.loads(Path(trace_path).read_text())["traceEvents"]
    assert Path(html_path).name == f"{stem}.html"
    assert "<svg" in Path(html_path).read_text()
    with pytest.raises(ConfigError, match="XLA_STREAMS_REPORT_HTML='maybe'"):
        Config.from_env({"XLA_STREAMS_COLLECTIVE_STREAMS": "4", "XLA_STREAMS_REPORT_HTML": "maybe"})
    with pytest.raises(
        ConfigError, match="XLA_STREAMS_REPORT_HTML .* needs XLA_STREAMS_REPORT_DIR"
    ):
        Config.from_env({"XLA_STREAMS_COLLECTIVE_STREAMS": "4", "XLA_STREAMS_REPORT_HTML": "1"})


def test_reports_appear_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each report file comes into existence whole, by a rename of a finished file."""
    from xla_streams.report import write_reports

    compilation = native(FIXTURE.read_text(), 2)
    real_replace = os.replace
    seen = []

    def replace(src: str, dst: str) -> None:
        assert os.path.dirname(os.path.abspath(src)) == os.path.dirname(os.path.abspath(dst))
        content = Path(src).read_text()
        if dst.endswith(".json"):
            json.loads(content)  # complete before it becomes visible
        seen.append(os.path.basename(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    paths = write_reports(compilation, str(tmp_path), "0")
    assert sorted(seen) == sorted(
        [*(os.path.basename(p) for p in paths), "index.json", "index.txt"]
    )
    assert sorted(os.listdir(tmp_path)) == sorted([*seen, ".index.lock"])  # no temporary file left


# -- the hook inside a real compile (this process, one CPU device) ----------------------


@pytest.fixture
def jax_cpu() -> Iterator[Any]:
    import jax

    plugin.disable()
    hook.reset_stats()
    try:
        yield jax
    finally:
        plugin.disable()


def compile_n(jax: Any, n: int) -> list[Any]:
    import jax.numpy as jnp

    x = jax.ShapeDtypeStruct((64,), jnp.float32)
    return [jax.jit(lambda v, i=i: jnp.sin(v) * (i + 2)).lower(x).compile() for i in range(n)]


def test_hook_runs_once_for_every_compile(
    jax_cpu: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin.enable(2, report_dir=tmp_path)
    plugin.enable(3, report_dir=tmp_path)  # enabling again replaces, never registers twice
    compile_n(jax_cpu, 3)
    stats = hook.stats()
    assert (stats.calls, stats.failed) == (3, 0)
    assert stats.reports == []  # no collective in these modules: nothing to report
    # A module the byte scan lets through is parsed and reported.
    monkeypatch.setattr(hook, "has_collective", lambda serialized: True)
    compile_n(jax_cpu, 1)
    (report,) = hook.stats().reports
    assert json.loads(Path(report).read_text())["streams"] == 3
    plugin.disable()
    compile_n(jax_cpu, 2)
    assert hook.stats().calls == 4
    plugin.enable(2)
    compile_n(jax_cpu, 1)
    assert hook.stats().calls == 5


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
    assert hook.stats().calls == 2
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
    # The byte scan would skip these modules (no collective): let them through.
    monkeypatch.setattr(hook, "has_collective", lambda serialized: True)
    plugin.enable(2, report_dir=tmp_path)
    with caplog.at_level("WARNING"):
        out = jax_cpu.jit(lambda v: jnp.cos(v) + 1)(jnp.arange(4.0))
    assert out.tolist() == (jnp.cos(jnp.arange(4.0)) + 1).tolist()
    assert hook.stats().failed >= 1
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
    monkeypatch.setattr(hook, "has_collective", lambda serialized: True)
    plugin.enable(2, strict=True, report_dir=tmp_path)
    with pytest.raises(Exception, match=r"xla_streams failed on module jit__lambda.*injected"):
        jax_cpu.jit(lambda v: jnp.tan(v) * 3)(jnp.arange(4.0))


def test_changed_module_round_trips_with_large_constants(
    jax_cpu: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A module the pipeline restructures goes back to XLA through its text parser
    whole, large constants included (the default ``to_string()`` would print them as
    ``{...}`` and lose them)."""
    import numpy as np

    from xla_streams.passes.annotate_streams import AnnotateStreams

    def restructure(self: object, compilation: Any) -> None:
        compilation.module.entry.root.set_frontend_attribute("_xla_streams_test", "1")
        compilation.module.restructured = True  # as lower-to-ffi would: take the text route

    monkeypatch.setattr(AnnotateStreams, "run", restructure)
    monkeypatch.setattr(hook, "has_collective", lambda serialized: True)
    constant = np.random.RandomState(0).rand(4000).astype(np.float32)
    f = jax_cpu.jit(lambda v: v * constant + 1)
    plugin.enable(2, report_dir=tmp_path)
    out = np.asarray(f(np.ones(4000, np.float32)))
    stats = hook.stats()
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
# What runs (jax 0.11 writes XLA:CPU's after-optimizations dump before the hook).
with open(sys.argv[1] + ".hlo", "w") as out:
    out.write(f.lower(x).compile().as_text())
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


@pytest.mark.slow
@needs_entry_point
def test_unmodified_script_gets_the_plugin_from_the_environment(tmp_path: Path) -> None:
    import numpy as np

    on, with_plugin, without, reports, dump = run_collectives_script(
        tmp_path, {"XLA_STREAMS_COLLECTIVE_STREAMS": "4"}
    )
    np.testing.assert_array_equal(with_plugin, without)
    # The plugin said what it set, and the module with collectives has its report
    # (XLA:CPU's are synchronous: the report says so, and where to go for streams).
    assert (
        "added to XLA_FLAGS: --xla_gpu_experimental_parallel_collective_overlap_limit=4"
        in on.stderr
    )
    assert "module jit_step: 0 async pairs, 5 synchronous collectives; report" in on.stderr
    assert "XLA:CPU runs collectives synchronously" in on.stderr  # and what to do about it
    assert on.stderr.count("XLA:CPU runs collectives synchronously") == 1
    (step,) = reports.glob("jit_step.*.json")
    assert json.loads(step.read_text())["schema"] == "xla_streams.assignment.v2"
    assert "XLA_STREAMS_MODE=ffi runs them on streams" in step.with_suffix(".txt").read_text()
    index = json.loads((reports / "index.json").read_text())
    assert [e["report"] for e in index["modules"]] == [step.name]
    assert "jit_step" in module_names_in_dump(dump)


@pytest.mark.slow
@needs_entry_point
def test_ffi_mode_from_the_environment_runs_our_custom_calls(tmp_path: Path) -> None:
    """XLA_STREAMS_MODE=ffi: every collective of the unmodified script runs as our
    start/done custom calls on the host runtime, with XLA's results."""
    import numpy as np

    _, with_plugin, without, reports, _ = run_collectives_script(
        tmp_path, {"XLA_STREAMS_COLLECTIVE_STREAMS": "2", "XLA_STREAMS_MODE": "ffi"}
    )
    np.testing.assert_allclose(with_plugin, without, rtol=1e-6)
    text = (tmp_path / "on.npy.hlo").read_text()
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


@pytest.mark.slow
@needs_entry_point
@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({"XLA_STREAMS_COLLECTIVE_STREAMS": "four"},
         "XLA_STREAMS_COLLECTIVE_STREAMS='four' is not valid: expected an integer from 1 to 64"),
        ({"XLA_STREAMS_COLLECTIVE_STREAMS": "4", "XLA_STREAMS_MODE": "fast"},
         "XLA_STREAMS_MODE='fast' is not valid: expected one of native, ffi"),
        ({"XLA_STREAMS_COLLECTIVE_STREAMS": "4", "XLA_STREAMS_POLICY": "lifo"},
         "XLA_STREAMS_POLICY='lifo' is not valid: expected one of interval, round-robin"),
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
    assert result.stderr.count(expected) == 1, result.stderr  # said once
    assert f"xla_streams: {expected}" in result.stderr
    assert not dump.exists()  # nothing was compiled


STRICT_SCRIPT = """
import jax, jax.numpy as jnp
from dataclasses import dataclass
from xla_streams.passes.base import Compilation, ModulePass
from xla_streams.pipeline import register

@register
@dataclass(frozen=True)
class Explode(ModulePass):
    name = "test-explode"

    def run(self, compilation: Compilation) -> None:
        raise RuntimeError("injected failure")

mesh = jax.sharding.Mesh(jax.devices(), ("d",))
psum = jax.shard_map(lambda x: jax.lax.psum(x, "d"), mesh=mesh, in_specs=jax.P("d"), out_specs=jax.P())
print(jax.jit(psum)(jnp.arange(8.0)))
"""


@pytest.mark.slow
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
    assert "[28.]" in result.stdout
    assert "left unchanged: PipelineError: pass 'test-explode' failed" in result.stderr


ABSL_SCRIPT = """
from absl import app
import xla_streams.plugin.flags  # noqa: F401

def main(argv):
    import jax, jax.numpy as jnp
    from xla_streams import plugin
    mesh = jax.sharding.Mesh(jax.devices(), ("d",))
    psum = jax.shard_map(lambda x: jax.lax.psum(x, "d"), mesh=mesh, in_specs=jax.P("d"), out_specs=jax.P())
    print(jax.jit(psum)(jnp.ones(8)), plugin.current())

app.run(main)
"""


@pytest.mark.slow
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
    assert any(reports.glob("jit__lambda.*.json")), sorted(p.name for p in reports.iterdir())
    result = run_python([str(script), "--xla_streams_collective_streams=99"], tmp_path, {})
    assert result.returncode == 1
    assert "--xla_streams_collective_streams=99 is not valid: expected an integer from 1 to 64" in (
        result.stderr
    )


def test_importing_the_package_does_not_import_jax(tmp_path: Path) -> None:
    code = "import sys, xla_streams, xla_streams.plugin, xla_streams.plugin.settings; print('jax' in sys.modules)"
    result = run_python(["-c", code], tmp_path, {})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_module_docstring_example_is_current() -> None:
    import xla_streams

    assert set(xla_streams.__all__) >= {"enable", "disable", "collective_streams"}
    assert "xla_streams.enable(collective_streams=4" in textwrap.dedent(xla_streams.__doc__ or "")


@pytest.mark.slow
def test_byte_scan_finds_every_module_with_collectives() -> None:
    """The hook skips printing and parsing a module only when it surely has no collective."""
    from jaxlib import _hlo

    from xla_streams.collectives import COLLECTIVE_OPCODES as COLLECTIVES
    from xla_streams.hlo import parse_module

    fixtures = sorted((REPO / "hlo_fixtures").glob("*.hlo"))
    assert fixtures
    for path in fixtures:
        text = path.read_text()
        proto = _hlo.hlo_module_from_text(xla_parsable(text)).as_serialized_hlo_module_proto()
        opcodes = {i.opcode.removesuffix("-start") for i in parse_module(text).instructions()}
        assert hook.has_collective(proto) == bool(opcodes & COLLECTIVES), path.name
    empty = (
        "HloModule m\n\nENTRY %e (p: f32[4]) -> f32[4] {\n  ROOT %p = f32[4]{0} parameter(0)\n}\n"
    )
    assert not hook.has_collective(
        _hlo.hlo_module_from_text(empty).as_serialized_hlo_module_proto()
    )


def test_the_hook_reaches_gpu_plugins_without_starting_a_backend(
    jax_cpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Registration goes through JAX's per-plugin callback, which jax calls for each
    loaded PJRT plugin (here the CUDA one, without a GPU), and never through
    backends(), which would hang inside initialize()."""
    from jax._src import xla_bridge
    from jax._src.lib import _xla

    from xla_streams import jax_compat

    jax_cpu.devices()  # JAX has loaded its plugins: the callback runs at once
    registered = []
    monkeypatch.setattr(
        _xla,
        "register_xla_transform_c_api",
        lambda c_api, name, stage, callback: registered.append(
            (jax_compat._platform_of(c_api), name)
        ),
    )
    monkeypatch.setattr(xla_bridge, "backends", _raise)
    jax_compat.register_compile_hook("xla_streams_test", lambda b: None, ["cuda", "rocm"])
    assert registered == [("cuda", "xla_streams_test")]
    jax_compat.register_compile_hook("xla_streams_test", lambda b: None, ["rocm"])
    assert registered == [("cuda", "xla_streams_test")]  # no ROCm plugin here


def test_every_variable_the_package_names_is_in_the_table() -> None:
    """The Python and the C++ of the package name no XLA_STREAMS_* variable that the table
    of every variable (which the README shows) does not hold."""
    named = set()
    for path in [
        *(REPO / "xla_streams").rglob("*.py"),
        *(REPO / "xla_streams").rglob("*.h"),
        *(REPO / "xla_streams").rglob("*.cc"),
        *(REPO / "passes").glob("*.py"),
    ]:
        named |= set(re.findall(r"\bXLA_STREAMS_[A-Z_]*[A-Z]\b", path.read_text()))
    assert named - set(BY_ENV) == set()
    assert {"XLA_STREAMS_TRACE", "XLA_STREAMS_CACHE_DIR"} <= named  # read by C++, the caches


TUNE_FILE = {
    "schema": "xla_streams.tune.v1", "program": "train.py", "target": "h100", "devices": 8,
    "devices_per_host": 8,
    "baseline": {"xla_flags": {}, "streams": 1, "policy": "interval", "predicted_step_ms": 2.0,
                 "peak_memory_bytes": 1000},
    "best": {"xla_flags": {"xla_gpu_experimental_parallel_collective_overlap_limit": 4,
                           "xla_gpu_pipeline_all_gather": "COLLECTIVE_PIPELINING_MODE_ON",
                           "xla_gpu_enable_while_loop_double_buffering": True},
             "streams": 2, "policy": "round-robin", "predicted_step_ms": 1.5,
             "peak_memory_bytes": 1100},
    "candidates": [],
    "command": "python train.py",
}  # fmt: skip

TUNED_SCRIPT = """
import os
import jax, jax.numpy as jnp
from xla_streams import plugin
print(jax.jit(lambda x: x + 1)(jnp.ones(2)))
config = plugin.current()
print("K", config.collective_streams, config.policy)
print("XLA_FLAGS", os.environ["XLA_FLAGS"])
"""


@pytest.mark.slow
def test_a_tune_file_sets_k_the_policy_and_xla_options(tmp_path: Path) -> None:
    """XLA_STREAMS_CONFIG on an unmodified program: the tune result's K and policy, and its
    XLA options in XLA_FLAGS (its overlap limit over native mode's, enums in the short
    spelling XLA_FLAGS takes), except where the user set them."""
    tune = tmp_path / "tune.json"
    tune.write_text(json.dumps(TUNE_FILE))
    script = tmp_path / "tuned.py"
    script.write_text(TUNED_SCRIPT)
    user = "--xla_force_host_platform_device_count=8 --xla_gpu_enable_while_loop_double_buffering=false"
    result = run_python(
        [str(script)], tmp_path, {"XLA_STREAMS_CONFIG": str(tune), "XLA_FLAGS": user}
    )
    assert result.returncode == 0, result.stderr
    assert "K 2 round-robin" in result.stdout
    (flags_line,) = [line for line in result.stdout.splitlines() if line.startswith("XLA_FLAGS")]
    flags = flags_line.split()[1:]
    assert "--xla_gpu_experimental_parallel_collective_overlap_limit=4" in flags
    assert "--xla_gpu_executable_num_communication_streams=2" in flags
    assert "--xla_gpu_pipeline_all_gather=ON" in flags
    assert "--xla_gpu_enable_while_loop_double_buffering=false" in flags  # the user's stays
    assert "--xla_gpu_enable_while_loop_double_buffering=true" not in flags
    assert f"tuned by {tune}" in result.stderr
    # A setting beside the file wins; a broken file stops the program naming it.
    result = run_python(
        [str(script)], tmp_path,
        {"XLA_STREAMS_CONFIG": str(tune), "XLA_STREAMS_COLLECTIVE_STREAMS": "3"},
    )  # fmt: skip
    assert "K 3 round-robin" in result.stdout, result.stderr
    tune.write_text(json.dumps({**TUNE_FILE, "best": {**TUNE_FILE["best"], "streams": 0}}))
    result = run_python([str(script)], tmp_path, {"XLA_STREAMS_CONFIG": str(tune)})
    assert result.returncode != 0
    assert "XLA_STREAMS_CONFIG" in result.stderr and "best.streams" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("level", "shown"), [("warning", False), ("info", True)])
def test_log_level_decides_what_the_plugin_prints(tmp_path: Path, level: str, shown: bool) -> None:
    script = tmp_path / "quiet.py"
    script.write_text(TUNED_SCRIPT)
    result = run_python(
        [str(script)], tmp_path,
        {"XLA_STREAMS_COLLECTIVE_STREAMS": "2", "XLA_STREAMS_LOG": level,
         "XLA_STREAMS_REPORT_DIR": str(tmp_path / "reports")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert ("xla_streams: on (2 collective streams" in result.stderr) == shown, result.stderr


# -- CUDA_DEVICE_MAX_CONNECTIONS=1 ----------------------------------------------------------
# Megatron-style recipes set it: every CUDA stream on one hardware queue. Collectives on K
# streams still run together once started, and cannot deadlock (every rank of an SPMD
# program issues them in one order: tests/runtime/emulated/test_deadlocks.py), but overlap
# less: the plugin keeps K and says what one queue costs, once.

ONE_QUEUE = "CUDA_DEVICE_MAX_CONNECTIONS=1 puts every CUDA stream on one hardware queue"


@pytest.fixture
def one_queue(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """CUDA_DEVICE_MAX_CONNECTIONS=1, the plugin off, and its message not said yet."""
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    monkeypatch.setattr(plugin._state, "one_queue_note_given", False)
    plugin.disable()
    try:
        yield
    finally:
        plugin.disable()


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    messages = [r.getMessage() for r in caplog.records]
    return [m for m in messages if "CUDA_DEVICE_MAX_CONNECTIONS" in m]


def test_one_hardware_queue_keeps_k_streams_and_says_what_it_costs_once(
    one_queue: None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xla_streams._log import logger

    # The plugin's logger does not propagate to the root, where caplog listens (pytest adds
    # caplog's handler to a logger that does not propagate, where it finds one at set-up).
    if caplog.handler not in logger.handlers:
        monkeypatch.setattr(logger, "handlers", [*logger.handlers, caplog.handler])
    caplog.set_level("INFO", logger=logger.name)
    assert plugin.enable(4).collective_streams == 4
    with plugin.collective_streams(2) as config:  # again, and back: said once
        assert config.collective_streams == 2
    (message,) = said(caplog)
    assert message.startswith(ONE_QUEUE)
    assert "the 4 collective streams keep their collectives running together" in message
    assert "holds back the ones behind it" in message
    spec = "find-async-pairs,assign-streams{streams=4},verify-streams,annotate-streams"
    assert plugin.enable(pipeline=spec).collective_streams == 4
    assert plugin.enable(1).collective_streams == 1
    assert len(said(caplog)) == 1


@pytest.mark.slow
def test_an_unmodified_script_keeps_its_streams_on_one_hardware_queue(tmp_path: Path) -> None:
    """ffi mode, round-robin over 4 streams, five collectives one after the other: on
    streams 0, 1, 2, 3, 0 with CUDA_DEVICE_MAX_CONNECTIONS=1 as without it."""
    script = tmp_path / "collectives.py"
    script.write_text(COLLECTIVES_SCRIPT)
    settings = {
        "XLA_STREAMS_COLLECTIVE_STREAMS": "4",
        "XLA_STREAMS_MODE": "ffi",
        "XLA_STREAMS_POLICY": "round-robin",
        "XLA_STREAMS_LOG": "info",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    }
    out = tmp_path / "out.npy"
    done = run_python([str(script), str(out)], tmp_path, settings, timeout=300)
    assert done.returncode == 0, done.stderr
    text = Path(f"{out}.hlo").read_text()
    streams = re.findall(r'custom_call_target="xla_streams_start".*?stream = (\d+)', text)
    assert streams == ["0", "1", "2", "3", "0"]
    assert len([line for line in done.stderr.splitlines() if ONE_QUEUE in line]) == 1
