"""Build the runtime's native libraries from ``csrc/`` beside this file.

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
file lock; a failed or missing compiler is a clear BuildError, never a crash. A
cached library is used only if its size and sha256 match those recorded when it
was built; anything else (truncated, emptied, unrecorded) is built again.

The host library needs only the FFI headers. The CUDA library is built when
``cuda_runtime_api.h``, ``nccl.h`` and the libraries to link against are found
(:func:`find_cuda`): in the ``nvidia-*`` wheels that ``jax[cuda12]`` or
``jax[cuda13]`` installs, in ``$CUDA_HOME`` or another toolkit, or in the system's
NCCL package. It builds without a GPU: it is host code calling the CUDA runtime
and NCCL, so no nvcc is needed.
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from xla_streams._log import logger
from xla_streams.environment import CACHE_DIR
from xla_streams.runtime.errors import BuildError

# -O3: the host runtime's reduction loops are vectorised (GCC 12 leaves them alone at -O2).
CXX_FLAGS = ("-std=c++17", "-O3", "-fPIC", "-shared", "-pthread", "-Wall", "-Wextra")


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
    """``xla_streams/runtime/csrc/``, beside this file in a checkout and in the wheel."""
    csrc = Path(__file__).resolve().parent / "csrc"
    if not (csrc / "common.h").is_file():
        raise BuildError(f"xla_streams: the runtime's C++ sources are missing from {csrc}")
    return csrc


def cache_dir() -> Path:
    """Where built libraries go: ``$XLA_STREAMS_CACHE_DIR`` or ``~/.cache/xla_streams``."""
    if env := CACHE_DIR.from_env():
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
    """jaxlib's ``include/`` (``jax.ffi.include_dir()``), found without importing JAX:
    importing it loads JAX's CUDA plugin, and with it the CUDA runtime, which the
    CUDA emulator must be the first to load."""
    spec = importlib.util.find_spec("jaxlib")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - a dependency
        raise BuildError("xla_streams: jaxlib is needed to build the runtime")
    include = Path(next(iter(spec.submodule_search_locations))) / "include"
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


@dataclass(frozen=True)
class CudaInstall:
    """One place that may hold CUDA headers and libraries (``major``: the CUDA
    major version of a wheel layout, None where unknown)."""

    include_dirs: tuple[Path, ...]
    library_dirs: tuple[Path, ...]
    major: int | None = None


def wheel_installs(nvidia: Path) -> list[CudaInstall]:
    """The ``nvidia-*`` wheels under one ``site-packages/nvidia``.

    CUDA 13 wheels (``nvidia-cuda-runtime``, ``-crt``, ``-cccl``, ...) share
    ``cu13/{include,lib}`` (CCCL also under ``include/cccl``); CUDA 12 ones
    (``nvidia-cuda-runtime-cu12``, ...) have a directory per component, and
    ``cuda_runtime_api.h`` needs ``crt/`` from ``cuda_nvcc`` and ``nv/target``
    from ``cuda_cccl``. NCCL is ``nccl/`` for both (``nvidia-nccl-cu12``/``-cu13``).
    """
    installs = [
        CudaInstall((d / "include", d / "include" / "cccl"), (d / "lib",), int(d.name[2:]))
        for d in sorted(nvidia.glob("cu[0-9]*"))
        if d.name[2:].isdigit()
    ]
    cu12 = tuple(nvidia / sub / "include" for sub in ("cuda_runtime", "cuda_nvcc", "cuda_cccl"))
    installs.append(CudaInstall(cu12, (nvidia / "cuda_runtime" / "lib",), 12))
    installs.append(CudaInstall((nvidia / "nccl" / "include",), (nvidia / "nccl" / "lib",)))
    return installs


def home_install(home: Path) -> CudaInstall:
    """A CUDA toolkit (``$CUDA_HOME``; CUDA 13 keeps CCCL in ``include/cccl``) or a
    system prefix such as ``/usr`` (``libnccl-dev``)."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or f"{platform.machine()}-linux-gnu"
    return CudaInstall(
        (home / "include", home / "include" / "cccl"),
        (home / "lib64", home / "lib", home / "lib" / multiarch),
    )


def default_homes() -> list[Path]:
    """``$CUDA_HOME``, ``$CUDA_PATH``, the toolkit of ``nvcc`` on PATH, /usr/local/cuda, /usr."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    if nvcc := shutil.which("nvcc"):
        homes.append(str(Path(nvcc).resolve().parent.parent))
    homes += ["/usr/local/cuda", "/usr"]
    return list(dict.fromkeys(Path(h) for h in homes if h))


@functools.cache
def _jax_cuda_major() -> int | None:
    """The CUDA major version of the installed JAX CUDA plugin (``jax-cudaNN-plugin``);
    the highest if several are installed, None if none is."""
    majors = []
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if match := re.fullmatch(r"jax-cuda(\d+)-(?:plugin|pjrt)", name):
            majors.append(int(match.group(1)))
    return max(majors, default=None)


def find_cuda(
    nvidia_dirs: Iterable[Path] | None = None,
    homes: Iterable[Path] | None = None,
    major: int | None = None,
) -> CudaPaths | None:
    """CUDA runtime and NCCL headers and libraries, or None if one is missing.

    Searched: the nvidia-* wheels under ``nvidia_dirs`` (default: every
    ``site-packages/nvidia``), those for CUDA ``major`` first (default: the
    installed JAX plugin's, so that the library links the CUDA runtime JAX
    loads), then ``homes`` (default: :func:`default_homes`). The CUDA runtime's
    header and library come from one installation, NCCL's from one (maybe
    another: a toolkit has no NCCL).
    """
    preferred = _jax_cuda_major() if major is None else major
    nvidia_dirs = _site_dirs() if nvidia_dirs is None else nvidia_dirs
    wheels = [install for d in nvidia_dirs for install in wheel_installs(d)]
    wheels.sort(key=lambda w: (w.major != preferred, -(w.major or 0)))
    installs = wheels + [home_install(h) for h in (default_homes() if homes is None else homes)]
    runtime = _locate(
        installs, "cuda_runtime_api.h", ("libcudart.so.13", "libcudart.so.12", "libcudart.so")
    )
    nccl = _locate(installs, "nccl.h", ("libnccl.so.2", "libnccl.so"))
    if runtime is None or nccl is None:
        return None
    (runtime_install, runtime_include, cudart), (_, nccl_include, libnccl) = runtime, nccl
    includes = [runtime_include]
    # What cuda_runtime_api.h and nccl.h include from other packages: from the
    # runtime's installation if it has them (CUDA 13 wheels may lack CCCL; a toolkit has it).
    search = [d for install in (runtime_install, *installs) for d in install.include_dirs]
    for header in ("crt/host_defines.h", "nv/target"):
        found = _dir_with(search, header)
        if found is None:
            return None
        includes.append(found)
    includes.append(nccl_include)
    # The default include directory must not be passed: -isystem /usr/include breaks libstdc++.
    include_dirs = tuple(d for d in dict.fromkeys(includes) if d != Path("/usr/include"))
    library_dirs = tuple(dict.fromkeys([cudart.parent, libnccl.parent]))
    return CudaPaths(include_dirs, library_dirs, cudart, libnccl)


def _locate(
    installs: list[CudaInstall], header: str, libraries: tuple[str, ...]
) -> tuple[CudaInstall, Path, Path] | None:
    """The first installation with ``header`` and one of ``libraries``: it, the
    header's directory and the library."""
    for install in installs:
        include = _dir_with(install.include_dirs, header)
        library = _find(install.library_dirs, libraries)
        if include is not None and library is not None:
            return install, include, library
    return None


def _dir_with(dirs: Iterable[Path], header: str) -> Path | None:
    return next((d for d in dirs if (d / header).is_file()), None)


def _find(dirs: Iterable[Path], names: tuple[str, ...]) -> Path | None:
    return next((d / n for d in dirs for n in names if (d / n).is_file()), None)


def _command(library: Library, output: Path, src: Path | None = None) -> list[str]:
    src = src or source_dir()
    command = [compiler(), *CXX_FLAGS, "-isystem", str(ffi_include_dir()), f"-I{src}"]
    if library.name == "cuda":
        cuda = find_cuda()
        if cuda is None:
            raise BuildError(
                "xla_streams: the CUDA runtime needs cuda_runtime_api.h (with crt/host_defines.h "
                "and CCCL's nv/target), nccl.h, libcudart and libnccl; install the nvidia-* "
                "wheels of JAX's CUDA plugin (pip install 'jax[cuda13]' or 'jax[cuda12]', plus "
                "nvidia-cuda-cccl for CCCL) or set CUDA_HOME to a CUDA toolkit"
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
    try:
        return importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - jaxlib is a dependency
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


def record_path(library: Path) -> Path:
    """The size and sha256 of a built library, written beside it by :func:`build`."""
    return library.with_name(library.name + ".sha256")


def _fingerprint(path: Path) -> dict[str, int | str]:
    return {"size": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def is_complete(library: Path) -> bool:
    """Whether ``library`` is what :func:`build` wrote: its size and sha256 match the
    record beside it. A truncated or emptied library kills the process that maps it
    (SIGBUS) instead of failing to load, so nothing is loaded unchecked."""
    try:
        recorded = json.loads(record_path(library).read_text())
        return isinstance(recorded, dict) and recorded == _fingerprint(library)
    except (OSError, ValueError):
        return False


def build(name: str, *, force: bool = False, verbose: bool = False) -> Path:
    """Compile library ``name`` unless the cache has it, complete; returns its path.

    The compiler writes a temporary file that is renamed into place, then its
    record: a process sees a whole library or none, and a library without its
    record (say, the build was killed between the two renames) is built again.
    """
    if name not in LIBRARIES:
        raise BuildError(f"xla_streams: unknown runtime library {name!r}; known: {list(LIBRARIES)}")
    target = library_path(name)
    if not force and is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and is_complete(target):
            return target  # another process built it meanwhile
        fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=".so", dir=target.parent)
        os.close(fd)
        # Once per machine and jaxlib: say why the first ffi compile takes a while.
        logger.info("building the ffi runtime's %s library (about 20 s, once): %s", name, target)
        try:
            _compile(name, Path(tmp), verbose)
            record = json.dumps(_fingerprint(Path(tmp)))
            os.replace(tmp, target)
        finally:
            Path(tmp).unlink(missing_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=".sha256", dir=target.parent)
        with os.fdopen(fd, "w") as f:
            f.write(record)
        os.replace(tmp, record_path(target))
    return target


def compile_from(name: str, sources: Path, output: Path) -> None:
    """Compiles library ``name`` from the sources in ``sources`` (a copy of csrc/, say
    with a change) into ``output`` with the command :func:`build` uses; no cache."""
    _compile(name, output, False, sources)


def _compile(name: str, output: Path, verbose: bool, sources: Path | None = None) -> None:
    command = _command(LIBRARIES[name], output, sources)
    if verbose:
        print(" ".join(command), file=sys.stderr)
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(f"xla_streams: could not run the compiler: {e}") from e
    if result.returncode != 0:
        raise BuildError(
            f"xla_streams: building the {name} runtime failed (exit {result.returncode}):\n"
            f"  {' '.join(command)}\n{result.stderr[-4000:]}"
        )


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
            if cuda is None:
                print("cuda:     not found")
                return 0
            print(f"cudart:   {cuda.cudart}")
            print(f"nccl:     {cuda.nccl}")
            for d in cuda.include_dirs:
                print(f"include:  {d}")
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
