"""The runtime's timeout: XLA_STREAMS_TIMEOUT_S, set_timeout() and the C++ side's bounds.

A timeout must be a finite number of seconds from 1 ms to 7 days. Before, ``inf`` and
``1e-9`` reached the runtime (a deadline of -9.2e15 s, and 0 ms: every collective
timed out at once) and ``abc``, ``-1``, ``0`` and ``nan`` silently became 300 s.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from xla_streams import runtime
from xla_streams.environment import TIMEOUT_S
from xla_streams.plugin.settings import Config, ConfigError
from xla_streams.runtime import abi

WEEK_MS = 7 * 24 * 3600 * 1000


@pytest.fixture
def restore_timeout() -> Iterator[None]:
    before = runtime.timeout()
    yield
    runtime.set_timeout(before)


@pytest.mark.parametrize(
    ("text", "seconds"), [("30", 30.0), (" 2.5 ", 2.5), ("1e-3", 0.001), ("604800", 604800.0)]
)
def test_the_timeout_takes_seconds_from_1_ms_to_7_days(text: str, seconds: float) -> None:
    assert TIMEOUT_S.from_env({"XLA_STREAMS_TIMEOUT_S": text}) == seconds


@pytest.mark.parametrize(
    "text",
    ["abc", "-1", "0", "nan", "inf", "-inf", "1e-9", "0.0009", "604801", "1e300", "1_000"],
)
def test_the_timeout_refuses_the_rest_naming_the_variable(text: str) -> None:
    expected = (
        f"XLA_STREAMS_TIMEOUT_S={text!r} is not valid: expected a number of seconds from "
        "0.001 to 604800 (7 days)"
    )
    with pytest.raises(ValueError) as error:
        TIMEOUT_S.from_env({"XLA_STREAMS_TIMEOUT_S": text})
    assert str(error.value) == expected


@pytest.mark.usefixtures("restore_timeout")
def test_set_timeout_takes_the_same_range_in_whole_milliseconds() -> None:
    lib = runtime.load("host")
    runtime.set_timeout(12.5)
    assert runtime.timeout() == 12.5
    assert lib.xs_get_timeout_ms() == 12500
    runtime.set_timeout(0.001)
    assert lib.xs_get_timeout_ms() == 1
    runtime.set_timeout(7 * 24 * 3600)
    assert lib.xs_get_timeout_ms() == WEEK_MS
    for bad in (0, -1, 1e-9, float("inf"), float("nan"), 1e9, True):
        with pytest.raises(ValueError) as error:
            runtime.set_timeout(bad)
        assert str(error.value) == (
            f"timeout_s={bad!r} is not valid: expected a number of seconds from 0.001 to "
            "604800 (7 days)"
        )
    assert lib.xs_get_timeout_ms() == WEEK_MS


@pytest.mark.usefixtures("restore_timeout")
def test_native_timeout_is_clamped_so_deadlines_cannot_overflow() -> None:
    """A caller of the C entry point that skips Python's check still gets 1 ms .. 7 days."""
    lib = runtime.load("host")
    lib.xs_set_timeout_ms(ctypes.c_int64(2**62))
    assert lib.xs_get_timeout_ms() == WEEK_MS
    lib.xs_set_timeout_ms(ctypes.c_int64(-(2**63)))
    assert lib.xs_get_timeout_ms() == 1


LOAD = """
from xla_streams import runtime
try:
    lib = runtime.load("host")
except ValueError as e:
    print("ValueError:", e)
else:
    print("ms", lib.xs_get_timeout_ms(), "s", runtime.timeout())
"""


def load_with(value: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_STREAMS_")}
    env["XLA_STREAMS_TIMEOUT_S"] = value
    result = subprocess.run(
        [sys.executable, "-c", LOAD], capture_output=True, text=True, timeout=600, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip()


@pytest.mark.slow
@pytest.mark.parametrize("value", ["abc", "inf", "1e-9", "0", "nan"])
def test_bad_environment_timeout_fails_loading_the_runtime(value: str) -> None:
    assert load_with(value) == (
        f"ValueError: XLA_STREAMS_TIMEOUT_S={value!r} is not valid: expected a number of "
        "seconds from 0.001 to 604800 (7 days)"
    )


@pytest.mark.slow
def test_environment_timeout_reaches_the_runtime() -> None:
    assert load_with("0.25") == "ms 250 s 0.25"
    assert load_with("") == "ms 300000 s 300.0"  # empty: unset


def test_config_takes_numbers_from_the_same_range() -> None:
    assert Config(collective_streams=2).timeout_s == abi.DEFAULT_TIMEOUT_S
    assert Config(collective_streams=2, timeout_s=0.001).timeout_s == 0.001
    for bad in (0, True, "30", float("inf"), 604801):
        with pytest.raises(ConfigError, match=r"^timeout_s=.* is not valid: expected a number of"):
            Config(collective_streams=2, timeout_s=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("written", ["٤", "٤.5", "²"])
def test_timeout_numbers_are_ascii(written: str) -> None:
    # float() reads Arabic-Indic digits; the variable takes ASCII only.
    with pytest.raises(ValueError, match="expected a number of seconds"):
        TIMEOUT_S.from_env({"XLA_STREAMS_TIMEOUT_S": written})
