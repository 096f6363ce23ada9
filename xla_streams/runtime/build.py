"""Build the runtime's native libraries from ``csrc/``.

    python -m xla_streams.runtime.build            # host library (and CUDA if found)
    python -m xla_streams.runtime.build --cuda     # CUDA library, or say why not
    python -m xla_streams.runtime.build --print    # paths, compiler, CUDA/NCCL found

Why a build step of our own instead of a compiled extension in the wheel: the
libraries compile against the XLA FFI headers of the *installed* jaxlib
(``jax.ffi.include_dir()``), which a build-isolated ``pip install`` cannot see,
and the CUDA one against whatever CUDA/NCCL the machine has. So the package
ships the sources and compiles them with the system C++17 compiler on first use
(one ``c++`` call per library, about 15 s), into a cache keyed by a digest of the
sources, flags, compiler and jaxlib version. Concurrent processes serialise on a
file lock; a failed or missing compiler is a clear BuildError, never a crash.

The host library needs only the FFI headers. The CUDA library is built when
``cuda_runtime_api.h`` and ``nccl.h`` are found (the ``nvidia-*`` wheels that
``jax[cuda12]`` installs carry both, plus ``libcudart``/``libnccl`` to link
against), and builds without a GPU: it is host code calling the CUDA runtime and
NCCL, so no nvcc is needed.
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from xla_streams.runtime.errors import BuildError

CXX_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-pthread", "-Wall", "-Wextra")


@dataclass(frozen=True)
class CudaPaths:
    """Where the CUDA runtime and NCCL headers and shared libraries are."""

    include_dirs: tuple[Path, ...]
    library_dirs: tuple[Path, ...]
    cudart: Path
    nccl: Path


@dataclass(frozen=True)
class Library:
    name: str
    sources: tuple[str, ...]
    headers: tuple[str, ...]


LIBRARIES = {
    "host": Library("host", ("host_backend.cc", "common_api.cc"), ("common.h",)),
    "cuda": Library("cuda", ("cuda_backend.cc", "common_api.cc"), ("common.h",)),
}


def source_dir() -> Path:
    """``csrc/``: packaged as ``xla_streams/runtime/csrc`` or beside the package in a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "csrc", here.parent.parent / "csrc"):
        if (candidate / "common.h").is_file():
            return candidate
    raise BuildError(
        f"xla_streams: the runtime's C++ sources (csrc/) are missing; looked in {here / 'csrc'} "
        f"and {here.parent.parent / 'csrc'}"
    )


def cache_dir() -> Path:
    """Where built libraries go: ``$XLA_STREAMS_CACHE_DIR`` or ``~/.cache/xla_streams``."""
    if env := os.environ.get("XLA_STREAMS_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "xla_streams"


def compiler() -> str:
    """``$CXX``, else the first of c++, g++, clang++ on PATH."""
    if env := os.environ.get("CXX"):
        found = shutil.which(env)
        if found is None:
            raise BuildError(f"xla_streams: CXX={env} is not an executable on PATH")
        return found
    for name in ("c++", "g++", "clang++"):
        if found := shutil.which(name):
            return found
    raise BuildError(
        "xla_streams: the ffi runtime is compiled on first use and needs a C++17 compiler, "
        "but none of c++, g++, clang++ is on PATH (set CXX, or install g++: "
        "apt-get install g++)"
    )


def ffi_include_dir() -> Path:
    try:
        import jax.ffi
    except ImportError as e:  # pragma: no cover - jax is a dependency
        raise BuildError(f"xla_streams: jax is needed to build the runtime: {e}") from e
    include = Path(jax.ffi.include_dir())
    if not (include / "xla" / "ffi" / "api" / "ffi.h").is_file():
        raise BuildError(f"xla_streams: XLA FFI headers not found under {include}")
    return include


def _site_dirs() -> Iterator[Path]:
    seen: set[Path] = set()
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec else []
    roots += [str(Path(p) / "nvidia") for p in (sysconfig.get_paths()["purelib"],)]
    for root in roots:
        path = Path(root)
        if path.is_dir() and path not in seen:
            seen.add(path)
            yield path


def find_cuda() -> CudaPaths | None:
    """CUDA runtime and NCCL from the nvidia-* wheels, else from $CUDA_HOME or /usr/local/cuda."""
    candidates: list[tuple[list[Path], list[Path]]] = []
    wheel_includes: list[Path] = []
    wheel_libs: list[Path] = []
    for nvidia in _site_dirs():
        for sub in ("cuda_runtime", "nccl", "cuda_nvcc", "cuda_cccl"):
            if (nvidia / sub / "include").is_dir():
                wheel_includes.append(nvidia / sub / "include")
            if (nvidia / sub / "lib").is_dir():
                wheel_libs.append(nvidia / sub / "lib")
    candidates.append((wheel_includes, wheel_libs))
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and Path(home).is_dir():
            candidates.append(
                ([Path(home) / "include"], [Path(home) / "lib64", Path(home) / "lib"])
            )
    # System packages (libnccl-dev): headers in the default include path.
    candidates.append(
        ([Path("/usr/include")], [Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib64")])
    )

    def first(dirs: list[Path], names: tuple[str, ...]) -> Path | None:
        for d in dirs:
            for name in names:
                if (d / name).exists():
                    return d / name
        return None

    all_includes = [d for includes, _ in candidates for d in includes]
    all_libs = [d for _, libs in candidates for d in libs]
    runtime_h = first(all_includes, ("cuda_runtime_api.h",))
    nccl_h = first(all_includes, ("nccl.h",))
    cudart = first(all_libs, ("libcudart.so.12", "libcudart.so"))
    nccl = first(all_libs, ("libnccl.so.2", "libnccl.so"))
    if not (runtime_h and nccl_h and cudart and nccl):
        return None
    # The default include directory must not be passed: -isystem /usr/include breaks libstdc++.
    found = [runtime_h.parent, nccl_h.parent]
    extra = wheel_includes if runtime_h.parent in wheel_includes else []
    include_dirs = tuple(d for d in dict.fromkeys([*found, *extra]) if d != Path("/usr/include"))
    library_dirs = tuple(dict.fromkeys([cudart.parent, nccl.parent]))
    return CudaPaths(include_dirs, library_dirs, cudart, nccl)


def _command(library: Library, output: Path) -> list[str]:
    src = source_dir()
    command = [compiler(), *CXX_FLAGS, "-isystem", str(ffi_include_dir()), f"-I{src}"]
    if library.name == "cuda":
        cuda = find_cuda()
        if cuda is None:
            raise BuildError(
                "xla_streams: the CUDA runtime needs cuda_runtime_api.h, nccl.h, libcudart and "
                "libnccl; install the gpu-aot extra (pip install 'xla-streams[gpu-aot]', which "
                "brings the nvidia-* wheels) or set CUDA_HOME"
            )
        for d in cuda.include_dirs:
            command += ["-isystem", str(d)]
        command += [str(src / s) for s in library.sources]
        for d in cuda.library_dirs:
            command += [f"-L{d}", f"-Wl,-rpath,{d}"]
        command += [f"-l:{cuda.cudart.name}", f"-l:{cuda.nccl.name}"]
    else:
        command += [str(src / s) for s in library.sources]
    return [*command, "-o", str(output)]


def _digest(library: Library, command: list[str]) -> str:
    h = hashlib.sha256()
    src = source_dir()
    for name in (*library.sources, *library.headers):
        h.update(name.encode())
        h.update((src / name).read_bytes())
    h.update(" ".join(command[1:-1]).encode())
    h.update(_compiler_version(command[0]).encode())
    h.update(_jaxlib_version().encode())
    return h.hexdigest()[:16]


def _jaxlib_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jaxlib")
    except PackageNotFoundError:  # pragma: no cover - jaxlib is a dependency
        return ""


@functools.cache
def _compiler_version(path: str) -> str:
    try:
        return subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def library_path(name: str) -> Path:
    """Where library ``name`` (host or cuda) is or will be built."""
    library = LIBRARIES[name]
    placeholder = cache_dir() / "placeholder.so"
    digest = _digest(library, _command(library, placeholder))
    return cache_dir() / f"libxla_streams_{name}-{digest}.so"


def build(name: str, *, force: bool = False, verbose: bool = False) -> Path:
    """Compile library ``name`` unless the cache has it; returns its path."""
    if name not in LIBRARIES:
        raise BuildError(f"xla_streams: unknown runtime library {name!r}; known: {list(LIBRARIES)}")
    target = library_path(name)
    if target.is_file() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file() and not force:
            return target  # another process built it meanwhile
        fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=".so", dir=target.parent)
        os.close(fd)
        command = _command(LIBRARIES[name], Path(tmp))
        if verbose:
            print(" ".join(command), file=sys.stderr)
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.SubprocessError) as e:
            Path(tmp).unlink(missing_ok=True)
            raise BuildError(f"xla_streams: could not run the compiler: {e}") from e
        if result.returncode != 0:
            Path(tmp).unlink(missing_ok=True)
            raise BuildError(
                f"xla_streams: building the {name} runtime failed (exit {result.returncode}):\n"
                f"  {' '.join(command)}\n{result.stderr[-4000:]}"
            )
        os.replace(tmp, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m xla_streams.runtime.build", description=__doc__
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--host", action="store_true", help="build only the host library")
    which.add_argument("--cuda", action="store_true", help="build only the CUDA library")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument(
        "--print", action="store_true", help="show what would be used, build nothing"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="print the compiler command")
    args = parser.parse_args(argv)
    try:
        if args.print:
            cuda = find_cuda()
            print(f"sources:  {source_dir()}")
            print(f"cache:    {cache_dir()}")
            print(f"compiler: {compiler()}")
            print(f"ffi:      {ffi_include_dir()}")
            print(f"cuda:     {cuda if cuda else 'not found'}")
            return 0
        names = ["host"] if args.host else ["cuda"] if args.cuda else ["host"]
        if not (args.host or args.cuda) and find_cuda() is not None:
            names.append("cuda")
        for name in names:
            print(f"{name}: {build(name, force=args.force, verbose=args.verbose)}")
    except BuildError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
