"""The emulated CUDA runtime and NCCL: the CUDA backend, unchanged, on a machine
without a GPU.

Stand-ins for ``libcudart.so.12`` (or ``.13``) and ``libnccl.so.2`` (``csrc/``)
export the CUDA and NCCL functions the backend calls, compiled against the real
headers and linked with their sonames, so that a process that loads them first
runs ``libxla_streams_cuda`` as it was built. Their devices are host memory, their
streams FIFO queues; their collectives compute exact results; and as work is
issued they check it: a race (two accesses of the same bytes that no event,
wait or host synchronize orders), a deadlock (a cycle of work that can never
run), misuse of the API. docs/runtimes.md ("The emulated CUDA runtime") says what
they model and what they cannot see.

::

    from xla_streams.runtime import emulator
    built = emulator.build()          # once per machine, about 40 s; cached
    built.replay(script)              # xsim-replay: a lowered program on N devices
    checks = emulator.load(built)     # this process: the stand-ins, then the backend
    checks.reports()
    emulator.conformance(built.conformance)  # the stand-ins' rules, checked against themselves

Also what the two harnesses use: ``xsim-replay`` (``csrc/replay.cc``, driven by
:mod:`xla_streams.runtime.emulator.replay`) and the forwarding handler that lets
XLA:CPU call the backend (``csrc/forward.cc``). And ``xsim-conformance``
(``csrc/conformance.cc``): rules the stand-ins model, as expectations that run
against the stand-ins here and, built by :func:`build_conformance`, against the
real CUDA runtime and NCCL on a GPU (``tools/gpu_check.py``).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xla_streams.runtime import build as runtime_build
from xla_streams.runtime.errors import BuildError

SOURCES = Path(__file__).resolve().parent / "csrc"
FLAGS = ("-std=c++17", "-O2", "-g", "-fPIC", "-pthread", "-Wall", "-Wextra")
NCCL_SONAME = "libnccl.so.2"
LOCKS = "libxsim_locks.so"
FORWARD = "libxsim_forward.so"


@dataclass(frozen=True)
class Built:
    """The emulator's files, in one directory of the build cache."""

    directory: Path
    cudart_soname: str  # libcudart.so.12 or .13, as the backend links it

    @property
    def cudart(self) -> Path:
        return self.directory / self.cudart_soname

    @property
    def nccl(self) -> Path:
        return self.directory / NCCL_SONAME

    @property
    def replay_driver(self) -> Path:
        return self.directory / "xsim-replay"

    @property
    def forward(self) -> Path:
        return self.directory / FORWARD

    @property
    def locks(self) -> Path:
        """libxsim_locks, which a process preloads (``LD_PRELOAD``) for the check that
        no two threads call NCCL on one communicator unlocked; xsim-replay links it."""
        return self.directory / LOCKS

    @property
    def conformance(self) -> Path:
        """``xsim-conformance`` linked against the stand-ins."""
        return self.directory / "xsim-conformance"

    def replay(
        self, script: Path, backend: Path, env: dict[str, str] | None = None, timeout: float = 300
    ) -> dict[str, Any]:
        """Runs ``xsim-replay BACKEND SCRIPT``; its JSON result (``errors``,
        ``mismatches``, ``blocked``, ``device_errors``, ``reports``, ``op_log``).
        RuntimeError if it fails to run."""
        return self.replay_job([script], backend, env, timeout)[0]

    def replay_job(
        self,
        scripts: list[Path],
        backend: Path,
        env: dict[str, str] | None = None,
        timeout: float = 300,
    ) -> list[dict[str, Any]]:
        """The processes of one job, one script each, run at once (they meet through
        the key-value directory their scripts name); their JSON results."""
        processes = [
            subprocess.Popen(
                [str(self.replay_driver), str(backend), str(script)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, **(env or {})},
            )
            for script in scripts
        ]
        results = []
        for script, process in zip(scripts, processes, strict=True):
            try:
                out, err = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for p in processes:
                    p.kill()
                raise RuntimeError(f"xsim-replay {script} ran past {timeout} s") from None
            if process.returncode != 0 or not out.strip():
                raise RuntimeError(
                    f"xsim-replay {script} failed (exit {process.returncode}):\n{err[-4000:]}"
                )
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results


def _cuda() -> runtime_build.CudaPaths:
    cuda = runtime_build.find_cuda()
    if cuda is None:
        raise BuildError(
            "xla_streams: the emulator compiles against the real CUDA runtime and NCCL headers, "
            "which were not found (pip install 'jax[cuda12]' or 'jax[cuda13]')"
        )
    return cuda


def _cudart_soname() -> str:
    name = _cuda().cudart.name  # libcudart.so.12, or libcudart.so when unversioned
    return name if name.count(".") >= 2 else "libcudart.so.12"


def _commands(out: Path, soname: str) -> list[list[str]]:
    """The compiler calls, in order (each may use the outputs of those before)."""
    cuda_headers = [arg for d in _cuda().include_dirs for arg in ("-isystem", str(d))]
    ffi_headers = ["-isystem", str(runtime_build.ffi_include_dir())]
    version = soname.rsplit(".", 1)[-1]
    stand_ins = [f"-L{out}", "-Wl,--no-as-needed", f"-l:{soname}", f"-l:{NCCL_SONAME}"]

    def compile(sources: list[str], output: str, *flags: str) -> list[str]:
        return [
            runtime_build.compiler(), *FLAGS, *(str(SOURCES / s) for s in sources), *flags,
            "-Wl,-rpath,$ORIGIN", "-ldl", "-o", str(out / output),
        ]  # fmt: skip

    return [
        compile(["locks.cc"], LOCKS, "-shared"),
        compile(
            ["model.cc", "cudart.cc"],
            soname,
            "-shared",
            *cuda_headers,
            f"-Wl,-soname,{soname}",
            f"-Wl,--version-script={SOURCES / f'cudart{version}.map'}",
        ),
        compile(
            ["nccl.cc", "transport.cc"],
            NCCL_SONAME,
            "-shared",
            *cuda_headers,
            f"-Wl,-soname,{NCCL_SONAME}",
            f"-L{out}",
            f"-l:{soname}",
        ),
        # libxsim_locks first: its pthread functions must come before libc's.
        compile(["replay.cc"], "xsim-replay", *ffi_headers, f"-L{out}", f"-l:{LOCKS}", *stand_ins),
        compile(["forward.cc"], FORWARD, "-shared", *ffi_headers, *cuda_headers, *stand_ins),
        _conformance_command(out / "xsim-conformance", [*stand_ins, "-Wl,-rpath,$ORIGIN"]),
    ]


def _conformance_command(output: Path, link: list[str]) -> list[str]:
    """``xsim-conformance``, compiled against the real headers, linked with ``link``
    (the stand-ins, or the real libraries)."""
    includes = [arg for d in _cuda().include_dirs for arg in ("-isystem", str(d))]
    source = str(SOURCES / "conformance.cc")
    return [runtime_build.compiler(), *FLAGS, *includes, source, "-Wl,--no-as-needed", *link,
            "-ldl", "-o", str(output)]  # fmt: skip


def build_conformance(directory: Path) -> Path:
    """``xsim-conformance`` linked against the real CUDA runtime and NCCL
    (:func:`~xla_streams.runtime.build.find_cuda`), written into ``directory``: on a
    machine with a GPU, the stand-ins' rules checked against what they stand in for.
    BuildError if the headers and libraries are missing or the compiler fails."""
    cuda = _cuda()
    paths = [arg for d in cuda.library_dirs for arg in (f"-L{d}", f"-Wl,-rpath,{d}")]
    link = [*paths, f"-l:{cuda.cudart.name}", f"-l:{cuda.nccl.name}"]
    program = directory / "xsim-conformance"
    command = _conformance_command(program, link)
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise BuildError(
            f"xla_streams: building xsim-conformance failed (exit {result.returncode}):\n"
            f"  {' '.join(command)}\n{result.stderr[-4000:]}"
        )
    return program


def conformance(
    program: Path, timeout: float = 120, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Runs ``xsim-conformance`` (:attr:`Built.conformance` or :func:`build_conformance`);
    its JSON result: ``devices`` and ``checks``, each ``{name, passed, detail, cites}``
    (``passed`` None: skipped). RuntimeError if it prints no result (a crash, a hang
    past ``timeout``)."""
    try:
        result = subprocess.run(
            [str(program)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"{program} did not finish in {timeout:g} s") from e
    lines = result.stdout.strip().splitlines()
    if result.returncode not in (0, 1) or not lines:
        raise RuntimeError(f"{program} failed (exit {result.returncode}):\n{result.stderr[-4000:]}")
    parsed: dict[str, Any] = json.loads(lines[-1])
    return parsed


def _digest(soname: str) -> str:
    h = hashlib.sha256()
    for path in sorted(SOURCES.iterdir()):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    # The commands without the output directory, which the digest names.
    for command in _commands(Path("/OUT"), soname):
        h.update(" ".join(command[1:]).encode())
    h.update(runtime_build._compiler_version(runtime_build.compiler()).encode())
    h.update(runtime_build._jaxlib_version().encode())
    return h.hexdigest()[:16]


def build(*, force: bool = False) -> Built:
    """The emulator's libraries and drivers, compiled on first use into
    ``<cache>/emulator-<digest>/`` (a directory appears whole or not at all)."""
    soname = _cudart_soname()
    target = runtime_build.cache_dir() / f"emulator-{_digest(soname)}"
    built = Built(target, soname)
    if not force and (target / ".complete").is_file():
        return built
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".emulator.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and (target / ".complete").is_file():
            return built
        staging = Path(tempfile.mkdtemp(prefix=".emulator-", dir=target.parent))
        try:
            for command in _commands(staging, soname):
                result = subprocess.run(command, capture_output=True, text=True, timeout=900)
                if result.returncode != 0:
                    raise BuildError(
                        f"xla_streams: building the emulator failed (exit {result.returncode}):\n"
                        f"  {' '.join(command)}\n{result.stderr[-4000:]}"
                    )
            # The drivers find the stand-ins through $ORIGIN: the final directory is
            # only renamed into place, never copied.
            (staging / ".complete").write_text(soname)
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return built


class Checks:
    """The stand-ins loaded in this process: their settings and what they found."""

    def __init__(self, cudart: ctypes.CDLL) -> None:
        self._lib = cudart
        for name in ("xsim_reports", "xsim_op_log"):
            getattr(cudart, name).restype = ctypes.c_size_t
            getattr(cudart, name).argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        cudart.xsim_configure.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        cudart.xsim_inject.argtypes = [ctypes.c_char_p, ctypes.c_int]

    def configure(self, key: str, value: int) -> None:
        if self._lib.xsim_configure(key.encode(), str(value).encode()) != 0:
            raise ValueError(f"the emulator refuses {key}={value}")

    def inject(self, what: str, device: int) -> None:
        if self._lib.xsim_inject(what.encode(), device) != 0:
            raise ValueError(f"the emulator cannot inject {what!r} on device {device}")

    def _json(self, name: str) -> Any:
        read = getattr(self._lib, name)
        size = read(None, 0)
        buffer = ctypes.create_string_buffer(size + 1)
        read(buffer, size + 1)
        return json.loads(buffer.value.decode())

    def reports(self) -> list[dict[str, str]]:
        """What the checks found: ``{"kind": race|deadlock|misuse|mismatch, "message"}``."""
        found: list[dict[str, str]] = self._json("xsim_reports")
        return found

    def op_log(self) -> list[dict[str, Any]]:
        """Every collective that ran: device, stream, stream_label, queue, what."""
        log: list[dict[str, Any]] = self._json("xsim_op_log")
        return log

    def clear(self) -> None:
        self._lib.xsim_clear_reports()


_loaded: Checks | None = None


def load(built: Built | None = None) -> Checks:
    """Loads the stand-ins into this process, before anything loads the real
    libraries, so that the CUDA backend loaded after them binds to them (the
    dynamic loader reuses a loaded soname). RuntimeError if a real CUDA runtime or
    NCCL is mapped already."""
    global _loaded
    if _loaded is not None:
        return _loaded
    built = built or build()
    real = real_libraries_mapped()
    if real:
        raise RuntimeError(
            "xla_streams: the real CUDA runtime or NCCL is loaded in this process already "
            f"({', '.join(real)}); the emulator must be loaded first"
        )
    cudart = ctypes.CDLL(str(built.cudart), mode=ctypes.RTLD_GLOBAL)
    ctypes.CDLL(str(built.nccl), mode=ctypes.RTLD_GLOBAL)
    _loaded = Checks(cudart)
    return _loaded


def real_libraries_mapped() -> list[str]:
    """The real libcudart or libnccl files this process has mapped (from
    /proc/self/maps): none may be, for the emulator to stand in for them."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    found = set()
    for line in maps.splitlines():
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        name = os.path.basename(path)
        if (name.startswith("libcudart.so") or name.startswith("libnccl.so")) and (
            "emulator-" not in path
        ):
            found.add(path)
    return sorted(found)


__all__ = [
    "Built",
    "Checks",
    "build",
    "build_conformance",
    "conformance",
    "load",
    "real_libraries_mapped",
]
