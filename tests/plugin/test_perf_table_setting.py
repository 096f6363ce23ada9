"""The plugin's ``perf_table`` setting: a user's collective performance table.

``XLA_STREAMS_PERF_TABLE`` / ``--xla_streams_perf_table`` / ``perf_table=``: checked
at start-up (a file that parses as XLA's table and that XLA itself can read), put in
XLA_FLAGS as ``--xla_gpu_experimental_collective_perf_table_path`` unless the user
set that (so XLA's own scheduler prices collectives from the same measurements),
and used by the HTML reports' simulation.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before anything imports JAX

from xla_streams import jax_compat, plugin
from xla_streams._wire import encode_varint, field
from xla_streams.hlo import parse_module
from xla_streams.passes.base import Compilation
from xla_streams.pipeline import PassManager
from xla_streams.plugin import hook
from xla_streams.plugin.settings import BY_NAME, Config, ConfigError
from xla_streams.simulate.visual import write_visual_report

REPO = Path(__file__).resolve().parents[2]
OPTION = "xla_gpu_experimental_collective_perf_table_path"
# Ten all-reduces inside one host: 8 MiB over groups of 4, 16 MiB over groups of 2.
TP_DP = REPO / "hlo_fixtures" / "tp_dp_2d.limit4.text.hlo"


def entry(dims: int, group: int, throughput: int = 1_000_000_000) -> str:
    """One measured all-reduce (f32[dims] over one group of ``group`` devices) in the form
    collective_perf_table_gen writes, which XLA reads."""
    return f"""\
    entries {{
      instruction {{
        opcode: "all-reduce"
        shape {{ element_type: F32 dimensions: {dims} }}
        iota_collective_device_list {{
          num_replica_groups: 1 num_devices_per_group: {group}
          iota_reshape_dims: {group} iota_transpose_perm: 0
        }}
      }}
      network_throughput_bytes_per_sec: {throughput}
    }}
"""


# TP_DP's all-reduces at a slow 1 GB/s.
SLOW = 'entries {\n  key: "sm_90"\n  value {\n' + entry(2097152, 4) + entry(4194304, 2) + "  }\n}\n"


def write(tmp_path: Path, text: str, name: str = "table.txtpb") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def env(**values: str) -> dict[str, str]:
    return {"XLA_STREAMS_COLLECTIVE_STREAMS": "2"} | {
        f"XLA_STREAMS_{k.upper()}": v for k, v in values.items()
    }


# -- the setting ------------------------------------------------------------------------


def test_one_setting_row_in_every_spelling(tmp_path: Path) -> None:
    table = write(tmp_path, SLOW)
    assert "collective_perf_table" in BY_NAME["perf_table"].help
    config = Config.from_env(env(perf_table=str(table)))
    assert config is not None and config.perf_table == str(table)
    assert f"collective perf table {table}" in config.describe()
    flag = Config.from_values({"collective_streams": "2", "perf_table": str(table)}, "flag")
    kwarg = Config.from_values({"collective_streams": 2, "perf_table": table}, "keyword")
    assert flag == kwarg == config
    # Relative paths become absolute: XLA reads the file from wherever it runs.
    relative = os.path.relpath(table)
    config = Config.from_env(env(perf_table=relative))
    assert config is not None and config.perf_table == str(table)
    # Off by default.
    assert Config(2).perf_table is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (SLOW.replace('opcode: "all-reduce"', 'opcode: "sort"', 1),
         r"table\.txtpb:5: sm_90: unsupported opcode 'sort'"),
        (SLOW[: SLOW.rindex("}")], r"table\.txtpb:1: '\{' opened here is never closed"),
        ("# nothing\n", r"table\.txtpb:1: no measurements"),
        # The simulator reads this one; jax 0.12's XLA aborts on it (array.h check).
        (SLOW.replace(
            "iota_collective_device_list {\n          num_replica_groups: 1 "
            "num_devices_per_group: 4\n          iota_reshape_dims: 4 iota_transpose_perm: 0"
            "\n        }",
            "replica_groups { replica_ids: [0, 1, 2, 3] }", 1),
         r"table\.txtpb:8: sm_90: the all-reduce's devices are written as replica_groups, "
         r"which XLA aborts on"),
    ],
)  # fmt: skip
def test_a_table_that_cannot_be_used_stops_start_up(
    tmp_path: Path, text: str, message: str
) -> None:
    table = write(tmp_path, text)
    with pytest.raises(
        ConfigError, match=r"^XLA_STREAMS_PERF_TABLE='.*' is not valid: .*" + message
    ):
        Config.from_env(env(perf_table=str(table)))
    with pytest.raises(
        ConfigError, match=r"^--xla_streams_perf_table=.* is not valid: .*" + message
    ):
        Config.from_values({"collective_streams": "2", "perf_table": str(table)}, "flag")
    with pytest.raises(ConfigError, match=r"^perf_table='.*' is not valid") as caught:
        Config.from_values({"collective_streams": 2, "perf_table": str(table)}, "keyword")
    assert caught.value.setting == "perf_table"


def test_a_missing_file_or_an_unsafe_path_stops_start_up(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="XLA_STREAMS_PERF_TABLE=.* no such file"):
        Config.from_env(env(perf_table=str(tmp_path / "missing.txtpb")))
    spaced = write(tmp_path, SLOW, "my table.txtpb")
    with pytest.raises(ConfigError, match="XLA_FLAGS cannot carry a path with spaces"):
        Config.from_env(env(perf_table=str(spaced)))
    with pytest.raises(ConfigError, match="perf_table=.* is not valid: no such file"):
        Config(2, perf_table=str(tmp_path / "missing.txtpb"))


def test_a_binary_table_is_accepted(tmp_path: Path) -> None:
    shape = field(2, 11) + field(3, encode_varint(262144))  # F32[262144]
    iota = field(1, 1) + field(2, 8) + field(3, encode_varint(8)) + field(4, encode_varint(0))
    instruction = field(2, b"all-reduce") + field(3, shape) + field(92, iota)
    profile = field(1, instruction) + field(6, 10_000_000_000)
    path = tmp_path / "table.pb"
    path.write_bytes(field(2, field(1, b"sm_90") + field(2, field(1, profile))))
    config = Config.from_env(env(perf_table=str(path)))
    assert config is not None and config.perf_table == str(path)
    # The same with the deprecated replica_groups instead: refused.
    groups = field(49, b"".join(field(1, d) for d in range(8)))
    legacy = field(1, field(2, b"all-reduce") + field(3, shape) + groups) + field(6, 10**10)
    path.write_bytes(field(2, field(1, b"sm_90") + field(2, field(1, legacy))))
    with pytest.raises(ConfigError, match="table.pb: sm_90: .* replica_groups"):
        Config.from_env(env(perf_table=str(path)))


# -- XLA's options ----------------------------------------------------------------------


@pytest.fixture
def flags_state(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The plugin's XLA_FLAGS bookkeeping, restored afterwards; XLA not started."""
    monkeypatch.setattr(jax_compat, "backends_started", lambda: False)
    for name in ("xla_flags_before", "xla_flags_added", "model", "late_warning_given"):
        monkeypatch.setattr(plugin._state, name, getattr(plugin._state, name))
    return monkeypatch


def test_xla_gets_the_table_where_the_user_has_not_set_one(
    tmp_path: Path, flags_state: pytest.MonkeyPatch
) -> None:
    table = write(tmp_path, SLOW)
    config = Config(2, perf_table=str(table))
    flags_state.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/d")
    added = plugin._apply_xla_options(config)
    assert f"--{OPTION}={table}" in added
    assert os.environ["XLA_FLAGS"].split() == ["--xla_dump_to=/tmp/d", *added]
    # Turned off: XLA_FLAGS as it was.
    plugin._restore_xla_flags()
    assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/d"
    # The user's own table wins.
    flags_state.setenv("XLA_FLAGS", f"--{OPTION}=/theirs.txtpb")
    added = plugin._apply_xla_options(config)
    assert not any(OPTION in a for a in added)
    assert f"--{OPTION}=/theirs.txtpb" in os.environ["XLA_FLAGS"]
    assert os.environ["XLA_FLAGS"].count(OPTION) == 1
    plugin._restore_xla_flags()
    # Without the setting, nothing about tables.
    flags_state.delenv("XLA_FLAGS")
    assert not any(OPTION in a for a in plugin._apply_xla_options(Config(2)))
    plugin._restore_xla_flags()


def _cuda_plugin_library() -> Path | None:
    """The PJRT CUDA plugin's shared library (jax[cuda12] or jax[cuda13]), if installed."""
    for module in ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13"):
        try:
            spec = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            continue
        if spec is not None and spec.submodule_search_locations:
            found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.so"))
            if found:
                return found[0]
    return None


@pytest.mark.slow
def test_jaxs_cuda_plugin_has_the_option() -> None:
    """What ``strings xla_cuda_plugin.so | grep`` shows: the option is a DebugOptions
    field of the XLA that jax's CUDA plugin carries."""
    library = _cuda_plugin_library()
    if library is None:
        pytest.skip("JAX's CUDA plugin is not installed")
    data = library.read_bytes()
    assert OPTION.encode() in data
    assert f"xla.DebugOptions.{OPTION}".encode() in data


COMPILE = textwrap.dedent(
    """
    import hashlib, os
    from xla_streams.aot import compile_for_gpu, gpu_topology
    from xla_streams.programs import PROGRAMS
    devices = gpu_topology("h100", 8, 8).devices
    fn, args = PROGRAMS["tp_dp_2d"].build(devices)
    text = compile_for_gpu(fn, args, dump=False).as_text
    print("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    print("SCHEDULE", hashlib.sha256(text.encode()).hexdigest())
    """
)


@pytest.mark.slow
def test_xlas_own_scheduler_reads_the_table(tmp_path: Path) -> None:
    """An unmodified deviceless compile for 8 H100s with the setting in the environment:
    XLA gets the option, reads the table (no abort) and schedules by it (a slow
    all-reduce table gives another schedule than XLA's own table)."""
    if jax_compat.cuda_plugin_module() is None:
        pytest.skip("deviceless GPU compiles need JAX's CUDA plugin")
    table = write(tmp_path, SLOW)
    script = write(tmp_path, COMPILE, "compile.py")

    def run(**settings: str) -> dict[str, str]:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("XLA_")}
        environ |= {"JAX_PLATFORMS": "cpu", **env(**settings)}
        result = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, env=environ,
            timeout=300, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        return dict(re.findall(r"^(XLA_FLAGS|SCHEDULE) (.*)$", result.stdout, re.M))

    mine, xlas = run(perf_table=str(table)), run()
    assert f"--{OPTION}={table}" in mine["XLA_FLAGS"].split()
    assert OPTION not in xlas["XLA_FLAGS"]
    assert mine["SCHEDULE"] != xlas["SCHEDULE"]


# -- the reports ------------------------------------------------------------------------


def _compilation() -> Compilation:
    compilation = Compilation(parse_module(TP_DP.read_text(), str(TP_DP)))
    PassManager.from_spec("find-async-pairs,assign-streams{streams=2},verify-streams").run(
        compilation
    )
    return compilation


def _predicted_ms(trace: Path) -> list[float]:
    events = json.loads(trace.read_text())["traceEvents"]
    labels = [e["args"]["labels"] for e in events if e["name"] == "process_labels"]
    return [float(re.search(r"predicted step ([0-9.]+) ms", label).group(1)) for label in labels]  # type: ignore[union-attr]


@pytest.mark.slow
def test_the_html_report_prices_collectives_from_the_table(tmp_path: Path) -> None:
    table = write(tmp_path, SLOW)
    c = _compilation()
    vendored, _ = write_visual_report(c.module, c.pairs, tmp_path / "a", "m")
    mine, page = write_visual_report(c.module, c.pairs, tmp_path / "b", "m", perf_table=table)
    # Ten all-reduces at 1 GB/s: over 100 ms of collectives, against XLA's NVLink times.
    assert min(_predicted_ms(mine)) > max(_predicted_ms(vendored)) + 50
    # XLA's own multi-streaming is drawn beside the stream counts.
    assert "XLA multi-streaming" in page.read_text()


def test_the_hook_uses_the_setting_and_falls_back_when_the_gpu_is_missing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = TP_DP.read_text()
    slow = write(tmp_path, SLOW)

    def reports(table: Path, where: str) -> list[float]:
        config = Config(
            2, report_dir=str(tmp_path / where), report_html=True, perf_table=str(table)
        )
        paths = hook.write_module_reports(_compilation(), text, config, html=True)
        trace = next(p for p in paths if p.endswith(".trace.json"))
        return _predicted_ms(Path(trace))

    c = _compilation()
    plain, _ = write_visual_report(c.module, c.pairs, tmp_path / "plain", "m")
    assert min(reports(slow, "slow")) > max(_predicted_ms(plain)) + 50
    # A table without H100's measurements: the report is still written, from XLA's
    # own table, and the log says so.
    b200 = write(tmp_path, SLOW.replace('"sm_90"', '"sm_100_B200"'), "b200.txtpb")
    with caplog.at_level(logging.INFO, logger="xla_streams"):
        fallback = reports(b200, "b200")
    assert fallback == _predicted_ms(plain)
    assert "price collectives from XLA's own table instead" in caplog.text
    assert "no measurements for 'sm_90'" in caplog.text


def test_enable_takes_the_table(tmp_path: Path, flags_state: pytest.MonkeyPatch) -> None:
    table = write(tmp_path, SLOW)
    flags_state.delenv("XLA_FLAGS", raising=False)
    try:
        config = plugin.enable(2, perf_table=table)
        assert config.perf_table == str(table)
        assert f"--{OPTION}={table}" in os.environ.get("XLA_FLAGS", "")
    finally:
        plugin.disable()
