"""Building the runtime: a damaged build cache, and where CUDA and NCCL are found.

The cache tests use a stand-in compiler that copies a real host library to its
``-o`` path (and logs each call), so a rebuild takes no compile; the library is
loaded in a subprocess, so a crash (a truncated library mapped into the process
dies of SIGBUS) fails the test instead of killing pytest.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from xla_streams.runtime import abi, build

FAKE_CXX = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "stand-in c++ of test_runtime_build"; exit 0; fi
while [ $# -gt 1 ]; do
  if [ "$1" = "-o" ]; then out="$2"; fi
  shift
done
echo "$out" >> "{log}"
head -c {keep} "{library}" > "$out"
exit {status}
"""

LOAD = """
from xla_streams import _log, runtime
from xla_streams.runtime import abi, build
_log.configure("info")  # as the plugin does
print(build.library_path("host"), runtime.load("host").xs_abi_version())
"""
BUILDING = "xla_streams: building the ffi runtime's host library (about 20 s, once)"


def fake_compiler(tmp_path: Path, keep: int | None = None, status: int = 0) -> dict[str, str]:
    """The environment of a process whose compiler copies the real host library (its
    first ``keep`` bytes), into a cache of its own."""
    library = build.build("host")
    script = tmp_path / "c++"
    script.write_text(
        FAKE_CXX.format(
            log=tmp_path / "compiles.log",
            library=library,
            keep=library.stat().st_size if keep is None else keep,
            status=status,
        )
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_STREAMS_")}
    env.update(CXX=str(script), XLA_STREAMS_CACHE_DIR=str(tmp_path / "cache"))
    return env


def compiles(tmp_path: Path) -> int:
    log = tmp_path / "compiles.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def load_in_subprocess(env: dict[str, str], *, builds: bool) -> Path:
    result = subprocess.run(
        [sys.executable, "-c", LOAD], capture_output=True, text=True, timeout=600, env=env
    )
    assert result.returncode == 0, (
        f"loading the cached library failed (exit {result.returncode}):\n{result.stderr[-3000:]}"
    )
    assert (BUILDING in result.stderr) == builds, result.stderr  # a build is announced
    path, version = result.stdout.split()
    assert version == str(abi.ABI_VERSION)
    return Path(path)


def damage(library: Path, how: str) -> None:
    if how == "truncated":
        library.write_bytes(library.read_bytes()[: library.stat().st_size // 2])
    elif how == "emptied":
        library.write_bytes(b"")
    elif how == "unrecorded":  # e.g. built by a version that wrote no record
        build.record_path(library).unlink()
    elif how == "misrecorded":
        record = json.loads(build.record_path(library).read_text())
        build.record_path(library).write_text(json.dumps({**record, "sha256": "0" * 64}))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["truncated", "emptied", "unrecorded", "misrecorded"])
def test_damaged_cached_library_is_rebuilt_not_loaded(tmp_path: Path, how: str) -> None:
    env = fake_compiler(tmp_path)
    library = load_in_subprocess(env, builds=True)
    assert compiles(tmp_path) == 1 and build.is_complete(library)
    assert load_in_subprocess(env, builds=False) == library
    assert compiles(tmp_path) == 1  # complete: used as it is

    damage(library, how)
    assert not build.is_complete(library)
    assert load_in_subprocess(env, builds=True) == library
    assert compiles(tmp_path) == 2
    assert build.is_complete(library)


@pytest.mark.slow
def test_failed_build_leaves_no_library_behind(tmp_path: Path) -> None:
    """The compiler writes a temporary file that only a successful build renames into
    place: a compiler that dies halfway leaves neither a library nor a temporary."""
    env = fake_compiler(tmp_path, keep=1000, status=1)
    result = subprocess.run(
        [sys.executable, "-c", LOAD], capture_output=True, text=True, timeout=600, env=env
    )
    assert result.returncode != 0
    assert "building the host runtime failed (exit 1)" in result.stderr
    assert compiles(tmp_path) == 1
    assert list((tmp_path / "cache").iterdir()) == [tmp_path / "cache" / ".host.lock"]


# -- where CUDA and NCCL are found ---------------------------------------------------------


def touch(root: Path, *files: str) -> Path:
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    return root


def cu13_wheels(site: Path, cccl: bool = True) -> Path:
    """``pip install 'jax[cuda13]'``: nvidia-cuda-runtime, -crt and -cccl share
    ``nvidia/cu13``; nvidia-nccl-cu13 is ``nvidia/nccl``."""
    nvidia = touch(
        site / "nvidia",
        "cu13/include/cuda_runtime_api.h",
        "cu13/include/crt/host_defines.h",
        "cu13/lib/libcudart.so.13",
        "nccl/include/nccl.h",
        "nccl/lib/libnccl.so.2",
    )
    return touch(nvidia, "cu13/include/nv/target") if cccl else nvidia


def cu12_wheels(site: Path) -> Path:
    """``pip install 'jax[cuda12]'``: a directory per nvidia-*-cu12 wheel."""
    return touch(
        site / "nvidia",
        "cuda_runtime/include/cuda_runtime_api.h",
        "cuda_runtime/lib/libcudart.so.12",
        "cuda_nvcc/include/crt/host_defines.h",
        "cuda_cccl/include/nv/target",
        "nccl/include/nccl.h",
        "nccl/lib/libnccl.so.2",
    )


def test_cuda_13_wheels_are_found(tmp_path: Path) -> None:
    nvidia = cu13_wheels(tmp_path)
    assert build.find_cuda([nvidia], homes=[], major=13) == build.CudaPaths(
        include_dirs=(nvidia / "cu13/include", nvidia / "nccl/include"),
        library_dirs=(nvidia / "cu13/lib", nvidia / "nccl/lib"),
        cudart=nvidia / "cu13/lib/libcudart.so.13",
        nccl=nvidia / "nccl/lib/libnccl.so.2",
    )
    # Also when the JAX plugin installed is another one (or none).
    assert build.find_cuda([nvidia], homes=[], major=12) is not None


def test_cuda_12_wheels_are_found(tmp_path: Path) -> None:
    nvidia = cu12_wheels(tmp_path)
    assert build.find_cuda([nvidia], homes=[], major=12) == build.CudaPaths(
        include_dirs=(
            nvidia / "cuda_runtime/include",
            nvidia / "cuda_nvcc/include",
            nvidia / "cuda_cccl/include",
            nvidia / "nccl/include",
        ),
        library_dirs=(nvidia / "cuda_runtime/lib", nvidia / "nccl/lib"),
        cudart=nvidia / "cuda_runtime/lib/libcudart.so.12",
        nccl=nvidia / "nccl/lib/libnccl.so.2",
    )


def test_wheels_of_the_jax_plugins_cuda_come_first(tmp_path: Path) -> None:
    """Both wheel sets in one environment (say, after moving from jax[cuda12] to
    jax[cuda13]): link the CUDA runtime that the installed JAX plugin loads."""
    nvidia = cu13_wheels(tmp_path)
    cu12_wheels(tmp_path)
    for major in (12, 13):
        found = build.find_cuda([nvidia], homes=[], major=major)
        assert found is not None and found.cudart.name == f"libcudart.so.{major}"


def test_cuda_13_wheels_without_cccl_take_it_from_a_toolkit(tmp_path: Path) -> None:
    """nccl.h includes cuda_fp16.h, which includes CCCL's nv/target: jax[cuda13] does not
    bring nvidia-cuda-cccl, a CUDA 13 toolkit has it in include/cccl."""
    nvidia = cu13_wheels(tmp_path / "site", cccl=False)
    assert build.find_cuda([nvidia], homes=[], major=13) is None
    toolkit = touch(tmp_path / "cuda-13.0", "include/cccl/nv/target")
    found = build.find_cuda([nvidia], homes=[toolkit], major=13)
    assert found is not None
    assert found.include_dirs == (
        nvidia / "cu13/include",
        toolkit / "include/cccl",
        nvidia / "nccl/include",
    )
    assert found.cudart == nvidia / "cu13/lib/libcudart.so.13"


def test_cuda_toolkit_and_system_nccl(tmp_path: Path) -> None:
    """No wheels: $CUDA_HOME's runtime, NCCL from another prefix (libnccl-dev)."""
    toolkit = touch(
        tmp_path / "cuda",
        "include/cuda_runtime_api.h",
        "include/crt/host_defines.h",
        "include/cccl/nv/target",
        "lib64/libcudart.so",
    )
    prefix = touch(tmp_path / "usr", "include/nccl.h", "lib64/libnccl.so.2")
    found = build.find_cuda([], homes=[toolkit, prefix])
    assert found is not None
    assert found.include_dirs == (
        toolkit / "include",
        toolkit / "include/cccl",
        prefix / "include",
    )
    assert (found.cudart, found.nccl) == (
        toolkit / "lib64/libcudart.so",
        prefix / "lib64/libnccl.so.2",
    )


def test_toolkits_searched_begin_with_cuda_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toolkit = tmp_path / "cuda"
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    assert build.default_homes()[0] == toolkit
    assert build.default_homes()[-2:] == [Path("/usr/local/cuda"), Path("/usr")]


def test_nothing_is_found_without_nccl(tmp_path: Path) -> None:
    nvidia = cu13_wheels(tmp_path)
    for library in (nvidia / "nccl/lib").iterdir():
        library.unlink()
    assert build.find_cuda([nvidia], homes=[], major=13) is None
