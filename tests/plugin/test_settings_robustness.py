"""Settings that must stop the program at start-up, never turn the plugin off silently.

Numbers are ASCII digits only (``int("٤")`` is 4, ``int("²")`` raises); anything that
goes wrong while the settings or a tune file are read (a RecursionError from nested
JSON, a bug) becomes one message naming the variable; a tune file's XLA options never
reach XLA_FLAGS unless each is one valid value. Also what the start-up line says about
XLA_FLAGS: what was inherited, in full, a dump flag in it, and the overlap limit raised
without a tune result.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before anything imports JAX

from xla_streams import plugin, xla_options
from xla_streams.option import Option, Reader
from xla_streams.plugin import settings
from xla_streams.plugin.settings import Config, ConfigError

LIMIT = xla_options.OVERLAP_LIMIT


def env(**values: str) -> dict[str, str]:
    return {f"XLA_STREAMS_{k.upper()}": v for k, v in values.items()}


# -- numbers: ASCII digits only ---------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (dict(collective_streams="\u00b2"), "XLA_STREAMS_COLLECTIVE_STREAMS='\u00b2' is not valid"),
        (dict(collective_streams="\u0664"), "XLA_STREAMS_COLLECTIVE_STREAMS='\u0664' is not valid"),
        (dict(collective_streams="\uff14"), "XLA_STREAMS_COLLECTIVE_STREAMS='\uff14' is not valid"),
        (dict(collective_streams="+4"), "XLA_STREAMS_COLLECTIVE_STREAMS='+4' is not valid"),
        (dict(collective_streams="4_0"), "XLA_STREAMS_COLLECTIVE_STREAMS='4_0' is not valid"),
        (dict(collective_streams="2", timeout_s="\u0664"),
         "XLA_STREAMS_TIMEOUT_S='\u0664' is not valid: expected a number of seconds"),
        (dict(collective_streams="2", timeout_s="\u00b2"), "XLA_STREAMS_TIMEOUT_S='\u00b2'"),
        (dict(collective_streams="2", timeout_s="1_0"), "XLA_STREAMS_TIMEOUT_S='1_0'"),
        (dict(pipeline="find-async-pairs,assign-streams{streams=\u0664}"),
         "XLA_STREAMS_PIPELINE='find-async-pairs,assign-streams{streams=\u0664}' is not valid"),
        (dict(pipeline="find-async-pairs{overlap_limit=\u0664},assign-streams{streams=2}"),
         "overlap_limit=\u0664 is not valid: expected an integer of at least 0"),
        (dict(pipeline="find-async-pairs{overlap_limit=+2},assign-streams{streams=2}"),
         "overlap_limit=+2 is not valid: expected an integer of at least 0"),
        (dict(pipeline="find-async-pairs,assign-streams{streams=\u00b2}"),
         "XLA_STREAMS_PIPELINE="),
    ],
)  # fmt: skip
def test_numbers_are_ascii_digits(values: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        Config.from_env(env(**values))
    assert expected in str(e.value)


def test_ascii_numbers_still_read() -> None:
    config = Config.from_env(env(collective_streams=" 4 ", timeout_s=" 2.5 "))
    assert config is not None and (config.collective_streams, config.timeout_s) == (4, 2.5)
    assert Config.from_env(env(collective_streams="2", timeout_s="1e-3")).timeout_s == 0.001  # type: ignore[union-attr]
    spec = "find-async-pairs{overlap_limit=2},assign-streams{streams=3}"
    config = Config.from_env(env(pipeline=spec))
    assert config is not None and config.collective_streams == 3


def test_flags_and_keywords_take_ascii_digits_only() -> None:
    with pytest.raises(ConfigError, match="--xla_streams_collective_streams=\u0664 is not valid"):
        Config.from_values({"collective_streams": "\u0664"}, "flag")
    with pytest.raises(ConfigError, match="--xla_streams_timeout_s=\u0664"):
        Config.from_values({"collective_streams": "2", "timeout_s": "\u0664"}, "flag")


# -- any error while reading becomes one message naming the variable --------------------


def test_an_unexpected_error_in_a_parser_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def explode(value: Any) -> Any:
        raise RecursionError("maximum recursion depth exceeded")

    policy = settings.BY_NAME["policy"]
    r = policy.reader
    broken = Option(
        policy.name, policy.default, policy.help, Reader(r.takes, explode, r.check, r.metavar),
        env=policy.env, flag=policy.flag,
    )  # fmt: skip
    monkeypatch.setitem(settings.BY_NAME, "policy", broken)
    with pytest.raises(ConfigError) as e:
        Config.from_env(env(collective_streams="2", policy="interval"))
    assert str(e.value) == (
        "XLA_STREAMS_POLICY='interval' cannot be read: RecursionError: "
        "maximum recursion depth exceeded"
    )


def test_deeply_nested_tune_file_names_the_variable(tmp_path: Path) -> None:
    tune = tmp_path / "deep.json"
    tune.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError) as e:
        Config.from_env(env(config=str(tune)))
    message = str(e.value)
    assert message.startswith(f"XLA_STREAMS_CONFIG: {tune}: ")
    assert "RecursionError" in message or "nested" in message or "deep" in message, message


def test_any_error_reading_a_tune_file_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tune = tmp_path / "tune.json"
    tune.write_text("{}")

    def explode(path: object) -> Any:
        raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")

    monkeypatch.setattr(settings, "load_tune_result", explode)
    with pytest.raises(ConfigError) as e:
        Config.from_env(env(config=str(tune)))
    assert str(e.value) == (
        f"XLA_STREAMS_CONFIG: {tune}: cannot read the tune result: RecursionError: "
        "maximum recursion depth exceeded while decoding a JSON array"
    )


@pytest.fixture
def stop_capture(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ConfigError]]:
    """What ``initialize()`` hands to the fail-fast mechanism, instead of arming it."""
    stopped: list[ConfigError] = []
    monkeypatch.setattr(plugin, "_fail_at_backend_start", stopped.append)
    for name in list(os.environ):
        if name.startswith("XLA_STREAMS_"):
            monkeypatch.delenv(name)
    plugin.disable()
    try:
        yield stopped
    finally:
        plugin.disable()


def test_initialize_stops_on_any_error_reading_the_settings(
    monkeypatch: pytest.MonkeyPatch, stop_capture: list[ConfigError]
) -> None:
    def explode(cls: Any, environ: Any = None) -> Any:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(Config, "from_env", classmethod(explode))
    plugin.initialize()  # must not raise: JAX would only log it
    (error,) = stop_capture
    assert "XLA_STREAMS_" in str(error) and "RecursionError" in str(error)
    assert plugin.current() is None


def test_initialize_stops_on_any_error_turning_the_plugin_on(
    monkeypatch: pytest.MonkeyPatch, stop_capture: list[ConfigError]
) -> None:
    monkeypatch.setenv("XLA_STREAMS_COLLECTIVE_STREAMS", "2")

    def explode(config: Config, source: str) -> Config:
        raise KeyError("injected")

    monkeypatch.setattr(plugin, "_activate", explode)
    plugin.initialize()
    (error,) = stop_capture
    assert "XLA_STREAMS_" in str(error) and "KeyError" in str(error)


def test_a_misspelled_variable_stops_the_plugin_when_it_is_on(
    monkeypatch: pytest.MonkeyPatch, stop_capture: list[ConfigError]
) -> None:
    # The user asked for round-robin; running with interval would be another program.
    monkeypatch.setenv("XLA_STREAMS_COLLECTIVE_STREAMS", "2")
    monkeypatch.setenv("XLA_STREAMS_POLCY", "round-robin")
    plugin.initialize()
    (error,) = stop_capture
    assert str(error) == (
        "XLA_STREAMS_POLCY is not a variable of xla_streams; did you mean XLA_STREAMS_POLICY?"
    )
    assert plugin.current() is None
    # A name near none says where they are all listed.
    assert Config.from_env(env(collective_streams="2")) is not None
    with pytest.raises(ConfigError, match=r"^XLA_STREAMS_WHATEVER is not a .* lists them all"):
        Config.from_env(env(collective_streams="2", whatever="1"))
    # A bad value of a variable the runtime reads later stops it now, too.
    with pytest.raises(ConfigError, match=r"^XLA_STREAMS_TRACE='yes' is not valid: .* 0, 1"):
        Config.from_env(env(collective_streams="2", trace="yes"))


def test_a_misspelled_variable_is_warned_about_when_the_plugin_is_off(
    monkeypatch: pytest.MonkeyPatch, stop_capture: list[ConfigError]
) -> None:
    # Most likely the switch itself, misspelled: nothing of the plugin runs, so nothing
    # stops; the warning names the variable meant.
    warned: list[str] = []
    monkeypatch.setattr(plugin.logger, "warning", lambda f, *a: warned.append(f % a))
    monkeypatch.setenv("XLA_STREAMS_COLECTIVE_STREAMS", "2")
    plugin.initialize()
    assert stop_capture == [] and plugin.current() is None
    assert warned == [
        "ignored: XLA_STREAMS_COLECTIVE_STREAMS is not a variable of xla_streams; did you mean "
        "XLA_STREAMS_COLLECTIVE_STREAMS?"
    ]


def test_unreadable_xla_flags_are_named(
    monkeypatch: pytest.MonkeyPatch, stop_capture: list[ConfigError]
) -> None:
    monkeypatch.setenv("XLA_STREAMS_COLLECTIVE_STREAMS", "2")
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to='/tmp/unclosed")
    monkeypatch.setattr(plugin.jax_compat, "backends_started", lambda: False)
    plugin.initialize()
    (error,) = stop_capture
    assert str(error).startswith("XLA_FLAGS=")
    assert plugin.current() is None


# -- tune files: a bad option stops the program, naming the variable and the field -------

TUNE_FILE: dict[str, Any] = {
    "schema": "xla_streams.tune.v1", "program": "train.py", "target": "h100", "devices": 8,
    "devices_per_host": 8,
    "baseline": {"xla_flags": {}, "streams": 1, "policy": "interval", "predicted_step_ms": 2.0,
                 "peak_memory_bytes": 1000},
    "best": {"xla_flags": {LIMIT: 4}, "streams": 2, "policy": "round-robin",
             "predicted_step_ms": 1.5, "peak_memory_bytes": 1100},
    "candidates": [], "command": "python train.py",
}  # fmt: skip

# (the option, its value) in best.xla_flags; each must be refused.
BAD_OPTIONS = [
    pytest.param("xla_gpu_no_such_option", 1, id="unknown-option"),
    pytest.param(LIMIT, "abc", id="abc"),
    pytest.param(LIMIT, 10**30, id="10^30"),
    pytest.param(LIMIT, -5, id="minus-5"),
    pytest.param(LIMIT, "4 --xla_dump_to=DIR", id="injects-a-flag"),
    pytest.param(LIMIT, "4\n--xla_dump_to=DIR", id="newline"),
]


def tune_file(path: Path, option: str, value: object) -> Path:
    data = json.loads(json.dumps(TUNE_FILE))
    data["best"]["xla_flags"] = {option: value}
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("option", "value"), BAD_OPTIONS)
def test_a_bad_tune_option_names_the_variable_and_the_field(
    tmp_path: Path, option: str, value: object
) -> None:
    tune = tune_file(tmp_path / "tune.json", option, value)
    with pytest.raises(ConfigError) as e:
        Config.from_env(env(config=str(tune)))
    message = str(e.value)
    assert message.startswith("XLA_STREAMS_CONFIG"), message
    assert str(tune) in message and option in message and "best" in message, message
    assert "\n" not in message, message  # one line


def test_a_good_tune_file_still_applies(tmp_path: Path) -> None:
    tune = tune_file(tmp_path / "tune.json", LIMIT, 4)
    config = Config.from_env(env(config=str(tune)))
    assert config is not None
    assert (config.collective_streams, config.policy) == (2, "round-robin")
    assert dict(config.xla_options) == {LIMIT: 4}


def test_config_refuses_xla_options_that_are_not_one_value() -> None:
    with pytest.raises(ConfigError, match="is not valid"):
        Config(2, xla_options={LIMIT: "4 --xla_dump_to=/tmp/x"})
    with pytest.raises(ConfigError, match="not an XLA option name"):
        Config(2, xla_options={"xla_a --xla_b": 1})
    # One value each: kept as given, and each reaches XLA_FLAGS as one flag.
    good = {
        LIMIT: 4,
        "xla_gpu_pipeline_all_gather": "ON",
        "xla_gpu_enable_latency_hiding_scheduler": True,
    }
    config = Config(2, xla_options=good)
    assert dict(config.xla_options) == good
    new, added, _ = xla_options.with_options("--xla_dump_to=/tmp/d", config.xla_options)
    expected = [
        f"--{LIMIT}=4",
        "--xla_gpu_pipeline_all_gather=ON",
        "--xla_gpu_enable_latency_hiding_scheduler=true",
    ]
    assert added == expected
    assert shlex.split(new) == ["--xla_dump_to=/tmp/d", *expected]


# -- the program itself: stopped at start-up, one message --------------------------------

DEVICES_SCRIPT = """
import jax
try:
    print(jax.devices())
except Exception as e:  # a program that swallows errors still stops
    print("CAUGHT", e)
print("REACHED")
"""


def run_python(
    args: list[str], cwd: Path, extra_env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("XLA_STREAMS_", "XLA_FLAGS"))
    }
    environ.update(JAX_PLATFORMS="cpu")
    environ.update(extra_env)
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("streams=\u00b2", "XLA_STREAMS_COLLECTIVE_STREAMS='\u00b2' is not valid"),
        ("streams=\u0664", "XLA_STREAMS_COLLECTIVE_STREAMS='\u0664' is not valid"),
        ("timeout=\u0664", "XLA_STREAMS_TIMEOUT_S='\u0664' is not valid"),
        ("nested", "deep.json: "),
        ("injects-a-flag", LIMIT),
    ],
)
def test_bad_settings_stop_the_program_at_start_up(
    tmp_path: Path, case: str, expected: str
) -> None:
    script = tmp_path / "devices.py"
    script.write_text(DEVICES_SCRIPT)
    dump = tmp_path / "dump"
    variables = {"XLA_FLAGS": f"--xla_dump_hlo_as_text --xla_dump_to={dump}"}
    if case.startswith("streams="):
        variables["XLA_STREAMS_COLLECTIVE_STREAMS"] = case.removeprefix("streams=")
    elif case.startswith("timeout="):
        variables.update(
            XLA_STREAMS_COLLECTIVE_STREAMS="2", XLA_STREAMS_TIMEOUT_S=case.removeprefix("timeout=")
        )
    elif case == "nested":
        tune = tmp_path / "deep.json"
        tune.write_text("[" * 100_000 + "]" * 100_000)
        variables["XLA_STREAMS_CONFIG"] = str(tune)
    else:
        injected = tmp_path / "injected"
        tune = tune_file(tmp_path / "tune.json", LIMIT, f"4 --xla_dump_to={injected}")
        variables["XLA_STREAMS_CONFIG"] = str(tune)
    result = run_python([str(script)], tmp_path, variables)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "REACHED" not in result.stdout and "CAUGHT" not in result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("xla_streams: ")]
    assert len(lines) == 1 and expected in lines[0], result.stderr  # one message, said once
    if case in ("nested", "injects-a-flag"):
        assert "XLA_STREAMS_CONFIG" in lines[0]
    assert not dump.exists()  # nothing was compiled
    assert not (tmp_path / "injected").exists()


# -- the start-up line and what follows it ----------------------------------------------


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def startup(monkeypatch: pytest.MonkeyPatch) -> Iterator[Lines]:
    """The plugin's log records of an enable() made as if JAX had not started yet."""
    monkeypatch.setattr(plugin.jax_compat, "backends_started", lambda: False)
    for name in ("xla_flags_before", "xla_flags_added", "model", "untuned_note_given"):
        monkeypatch.setattr(plugin._state, name, getattr(plugin._state, name))
    plugin._state.untuned_note_given = False
    plugin.disable()
    lines = Lines()
    logger = logging.getLogger("xla_streams")
    logger.addHandler(lines)
    try:
        yield lines
    finally:
        logger.removeHandler(lines)
        plugin.disable()


def messages(lines: Lines, level: int | None = None) -> list[str]:
    return [r.getMessage() for r in lines.records if level is None or r.levelno == level]


def test_startup_line_shows_inherited_xla_flags_in_full(
    monkeypatch: pytest.MonkeyPatch, startup: Lines
) -> None:
    inherited = "--xla_force_host_platform_device_count=8 --xla_cpu_enable_fast_math=false"
    monkeypatch.setenv("XLA_FLAGS", inherited)
    plugin.enable(3)
    (line,) = [m for m in messages(startup) if m.startswith("on (")]
    assert f"added to XLA_FLAGS: --{LIMIT}=3" in line
    assert f"inherited XLA_FLAGS='{inherited}'" in line
    assert not messages(startup, logging.WARNING)  # no dump flag there


def test_dump_flags_in_xla_flags_are_warned_about(
    monkeypatch: pytest.MonkeyPatch, startup: Lines, tmp_path: Path
) -> None:
    inherited = f"--xla_dump_to={tmp_path / 'dump'} --xla_dump_hlo_as_text"
    monkeypatch.setenv("XLA_FLAGS", inherited)
    plugin.enable(2)
    (warning,) = messages(startup, logging.WARNING)
    assert f"--xla_dump_to={tmp_path / 'dump'}" in warning and "--xla_dump_hlo_as_text" in warning
    (line,) = [m for m in messages(startup) if m.startswith("on (")]
    assert inherited in line


def test_raising_the_overlap_limit_without_a_tune_file_says_how_to_check_it(
    monkeypatch: pytest.MonkeyPatch, startup: Lines, tmp_path: Path
) -> None:
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    plugin.enable(4)
    said = messages(startup, logging.INFO)
    assert said[0].startswith("on (4 collective streams")
    assert "no XLA_FLAGS" not in said[0] and "inherited" not in said[0]
    note = said[1]  # right after the start-up line
    assert "overlap limit is raised to 4" in note and "no prediction" in note
    assert "xla-streams tune" in note and "XLA_STREAMS_CONFIG=tune.json" in note
    plugin.enable(8)  # said once
    assert sum("no prediction" in m for m in messages(startup)) == 1
    # With a tune result, its prediction is there: no note.
    startup.records.clear()
    plugin._state.untuned_note_given = False
    tune = tune_file(tmp_path / "tune.json", LIMIT, 4)
    plugin.disable()
    plugin.enable(config=str(tune))
    assert not any("no prediction" in m for m in messages(startup))
    # The user's own overlap limit: nothing was raised by us.
    plugin.disable()
    monkeypatch.setenv("XLA_FLAGS", f"--{LIMIT}=2")
    plugin.enable(4)
    assert not any("no prediction" in m for m in messages(startup))
