"""JAX's persistent compilation cache and the plugin's settings.

JAX keys a cached executable by the lowered module, jaxlib, the platform, XLA_FLAGS
and compile options: nothing of what the plugin's compile hook does with the module.
So the plugin adds its settings to the key (``jax._src.cache_key.custom_hook``, through
``jax_compat``), and in ffi mode registers its custom-call targets when it turns on:
an executable loaded from the cache never meets the hook. Every run of a sequence of
fresh processes that share one cache directory, with the plugin off, native or ffi,
interval or round-robin, gets the executable its own settings compile.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before anything imports JAX

from xla_streams import jax_compat, plugin


@pytest.fixture
def cache_key() -> Iterator[Any]:
    """jax's cache_key module, with the plugin off and its hook as JAX left it."""
    from jax._src import cache_key as module

    plugin.disable()
    original = module.custom_hook
    try:
        yield module
    finally:
        plugin.disable()
        module.custom_hook = original


@pytest.mark.slow
def test_the_settings_are_part_of_the_key(cache_key: Any, tmp_path: Path) -> None:
    off = cache_key.custom_hook()
    keys = {}
    for name, settings in {
        "native K=2": dict(collective_streams=2),
        "native K=4": dict(collective_streams=4),
        "round-robin": dict(collective_streams=2, policy="round-robin"),
        "ffi": dict(collective_streams=2, mode="ffi"),
        "ffi round-robin": dict(collective_streams=2, mode="ffi", policy="round-robin"),
        "pipeline": dict(
            pipeline="find-async-pairs,assign-streams{streams=2,policy=interval},"
            "verify-streams,annotate-streams"
        ),
    }.items():
        plugin.enable(**settings)  # type: ignore[arg-type]
        keys[name] = cache_key.custom_hook()
        assert "xla_streams" in keys[name] and plugin.current() is not None
    assert len(set(keys.values())) == len(keys), keys
    assert all(key != off for key in keys.values())
    import xla_streams

    assert f"version={xla_streams.__version__}" in keys["native K=2"]
    # What does not change the executable does not change the key.
    plugin.enable(2, report_dir=tmp_path, log="warning", strict=True, timeout_s=30)
    assert cache_key.custom_hook() == keys["native K=2"]
    # Off again: JAX's own key, and JAX's own hook back.
    plugin.disable()
    assert cache_key.custom_hook() == off
    assert not isinstance(cache_key.custom_hook, jax_compat._KeyComponent)


def test_the_key_component_chains_with_a_hook_already_there(cache_key: Any) -> None:
    def theirs() -> str:
        return "another library"

    cache_key.custom_hook = theirs
    plugin.enable(2)
    key = cache_key.custom_hook()
    assert key.startswith("another library|xla_streams:")
    plugin.enable(3)  # again: replaced, never chained twice
    assert cache_key.custom_hook().count("|xla_streams:") == 1
    plugin.disable()
    assert cache_key.custom_hook is theirs
    # Someone chains on top of ours while it is on: ours stays and passes theirs through.
    plugin.enable(2)
    ours = cache_key.custom_hook

    def on_top() -> str:
        return ours() + "|on top"

    cache_key.custom_hook = on_top
    plugin.disable()
    assert cache_key.custom_hook() == "another library|on top"
    plugin.enable(2)  # the same component is on again, once
    assert cache_key.custom_hook().count("|xla_streams:") == 1


def test_ffi_mode_registers_its_targets_when_it_turns_on(
    cache_key: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not at the first compile only: an executable loaded from the cache meets no hook."""
    from xla_streams import runtime
    from xla_streams.runtime.errors import BuildError

    calls: list[tuple[str, object]] = []
    monkeypatch.setattr(runtime, "register", lambda backend: calls.append(("register", backend)))
    monkeypatch.setattr(runtime, "set_timeout", lambda s: calls.append(("timeout", s)))
    plugin.enable(2, mode="ffi", timeout_s=30)
    assert calls == [("register", "host"), ("timeout", 30.0)]
    calls.clear()
    plugin.enable(2)  # native mode needs no runtime
    assert calls == []

    def no_compiler(backend: str) -> None:
        raise BuildError("xla_streams: no C++ compiler found (install g++)")

    plugin.disable()
    monkeypatch.setattr(runtime, "register", no_compiler)
    with pytest.raises(Exception, match="mode ffi cannot load its runtime: .*no C\\+\\+ compiler"):
        plugin.enable(2, mode="ffi")
    assert plugin.current() is None  # never announced as on


CHILD = r"""
import json, logging, re, sys
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
# An entry that cannot be loaded (say, no FFI handler) fails the run, not a warning.
jax.config.update("jax_raise_persistent_cache_errors", True)
seen = {"lookup": None, "key": None}

class Lookups(logging.Handler):
    def emit(self, record):
        message = record.getMessage()
        if "'jit_step'" in message and " with key " in message:
            seen["lookup"] = "hit" if "cache hit" in message else "miss"
            seen["key"] = message.rsplit(" with key ", 1)[1].strip("'")

compiler_log = logging.getLogger("jax._src.compiler")
compiler_log.setLevel(logging.DEBUG)
compiler_log.addHandler(Lookups())

mesh = Mesh(jax.devices(), ("x",))

def step(v):  # three collectives, each waiting for the one before
    a = jax.lax.psum(v, "x")
    b = jax.lax.psum(a * 2, "x")
    return jax.lax.psum(b + 1, "x")

run = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=P("x"), out_specs=P()))
x = jnp.arange(8 * 4, dtype=jnp.float32).reshape(8, 4)
compiled = run.lower(x).compile()
text = compiled.as_text()
streams = [int(s) for s in re.findall(
    r'custom_call_target="xla_streams_start".*?stream = (\d+)', text)]
expected = 8 * (16 * np.asarray(x).sum(0, keepdims=True) + 1)
from xla_streams import plugin
config = plugin.current()
print("RESULT " + json.dumps({
    **seen, "streams": streams, "ok": bool(np.allclose(np.asarray(compiled(x)), expected)),
    "current": None if config is None else config.describe(),
}))
"""

SETTINGS: dict[str, dict[str, str]] = {
    "off": {},
    "native interval": {"XLA_STREAMS_COLLECTIVE_STREAMS": "2"},
    "native round-robin": {"XLA_STREAMS_COLLECTIVE_STREAMS": "2", "XLA_STREAMS_POLICY": "round-robin"},
    "ffi interval": {"XLA_STREAMS_COLLECTIVE_STREAMS": "2", "XLA_STREAMS_MODE": "ffi"},
    "ffi round-robin": {
        "XLA_STREAMS_COLLECTIVE_STREAMS": "2", "XLA_STREAMS_MODE": "ffi",
        "XLA_STREAMS_POLICY": "round-robin",
    },
}  # fmt: skip
# The stream of each of the three collectives in the executable each setting compiles
# (native mode and off: XLA's own collectives, no custom calls on XLA:CPU).
STREAMS = {
    "off": [],
    "native interval": [],
    "native round-robin": [],
    "ffi interval": [0, 0, 0],  # none overlap: one stream is enough
    "ffi round-robin": [0, 1, 0],
}
DESCRIBED = {
    "off": None,
    "native interval": "2 collective streams, policy interval, mode native",
    "native round-robin": "2 collective streams, policy round-robin, mode native",
    "ffi interval": "2 collective streams, policy interval, mode ffi",
    "ffi round-robin": "2 collective streams, policy round-robin, mode ffi",
}
# Every setting runs first while other settings' entries are there (in both orders
# for each pair of them across the two rounds), then again with all of them there.
ORDER = [
    "ffi round-robin", "ffi interval", "off", "native round-robin", "native interval",
    "native interval", "off", "ffi interval", "native round-robin", "ffi round-robin",
]  # fmt: skip


def run_child(script: Path, cache: Path, settings: dict[str, str]) -> tuple[dict[str, Any], str]:
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("XLA_STREAMS_", "XLA_FLAGS"))
    }
    environ.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8")
    environ.update(settings)
    result = subprocess.run(
        [sys.executable, str(script), str(cache)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT ")), result.stderr


@pytest.mark.slow
def test_runs_with_other_settings_never_share_an_executable(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    cache = tmp_path / "cache"
    keys: dict[str, str] = {}
    for i, name in enumerate(ORDER):
        seen, stderr = run_child(script, cache, SETTINGS[name])
        where = f"run {i} ({name}): {seen}\n{stderr}"
        assert seen["ok"], where
        first = name not in keys
        # Its own executable: a miss the first time, its own entry after that.
        assert seen["lookup"] == ("miss" if first else "hit"), where
        assert seen["key"] == keys.setdefault(name, seen["key"]), where
        assert seen["streams"] == STREAMS[name], where
        # The start-up line announces exactly the settings in effect, or nothing when off.
        assert seen["current"] == DESCRIBED[name], where
        started = [line for line in stderr.splitlines() if line.startswith("xla_streams: on (")]
        if DESCRIBED[name] is None:
            assert started == [], where
        else:
            (line,) = started
            assert line.startswith(f"xla_streams: on ({DESCRIBED[name]}), from the environment")
    assert len(set(keys.values())) == len(SETTINGS), keys


# -- the reports of modules loaded from the cache ---------------------------------------


def read_reports(folder: Path) -> dict[str, str]:
    """The files of a report directory (not its lock) by name."""
    return {p.name: p.read_text() for p in sorted(folder.glob("[!.]*"))}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["native round-robin", "ffi round-robin"])
def test_a_run_on_a_warm_cache_writes_every_module_report(tmp_path: Path, name: str) -> None:
    """No compile hook runs for an executable loaded from the cache: the modules it was
    compiled from are kept beside the entry, and their reports written from them."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    cache = tmp_path / "cache"
    runs = []
    for run in ("cold", "warm"):
        reports = tmp_path / run
        seen, stderr = run_child(
            script, cache, {**SETTINGS[name], "XLA_STREAMS_REPORT_DIR": str(reports)}
        )
        assert seen["lookup"] == ("miss" if run == "cold" else "hit"), stderr
        runs.append((read_reports(reports), stderr))
    (cold, cold_log), (warm, warm_log) = runs
    # The same files, index included, byte for byte; and the line says where it came from.
    assert warm == cold, (cold.keys(), warm.keys())
    assert [re.sub(r"\.[0-9a-f]{16}\.", ".*.", n) for n in warm] == [
        "index.json", "index.txt", "jit_step.*.json", "jit_step.*.txt",
    ]  # fmt: skip
    (line,) = [line for line in warm_log.splitlines() if "module jit_step:" in line]
    assert line.endswith(" (from JAX's persistent compilation cache)"), line
    assert "(from JAX's" not in cold_log and "without the record" not in warm_log


@pytest.mark.slow
def test_a_hit_without_the_kept_modules_says_so(tmp_path: Path) -> None:
    """An entry whose companion is gone (the cache evicted it, or an older xla-streams wrote
    the entry): the run says which module has no report, and how to compile it again."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    cache = tmp_path / "cache"
    settings = SETTINGS["native interval"]
    run_child(script, cache, {**settings, "XLA_STREAMS_REPORT_DIR": str(tmp_path / "cold")})
    (companion,) = cache.glob("jit_step-*-xla_streams-cache")
    companion.unlink()
    seen, stderr = run_child(
        script, cache, {**settings, "XLA_STREAMS_REPORT_DIR": str(tmp_path / "warm")}
    )
    assert seen["lookup"] == "hit"
    assert not list((tmp_path / "warm").glob("jit_step.*"))
    (line,) = [line for line in stderr.splitlines() if "without the record" in line]
    assert line.startswith(
        "xla_streams: module jit_step came from JAX's persistent compilation cache"
    )
    assert f"delete the files named {seen['key']}* in the cache directory" in line


def test_the_kept_modules_read_back_and_damage_is_refused() -> None:
    from xla_streams.plugin import cache

    modules = (cache.CachedModule(b"\x12\x03all", True), cache.CachedModule(b"", False))
    data = cache.encode(modules)
    assert cache.decode(data) == modules and cache.decode(cache.encode(())) == ()
    import zlib

    raw = zlib.decompress(data)
    for broken, reason in [
        (data[:-3], "not compressed as one"),  # a write cut short by another process
        (zlib.compress(raw[:-1]), "truncated"),
        (zlib.compress(b"something else"), "not a record of xla_streams.cached_modules.v1"),
    ]:
        with pytest.raises(ValueError, match=reason):
            cache.decode(broken)
