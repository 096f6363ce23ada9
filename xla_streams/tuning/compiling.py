"""Compiling a program's candidates: deviceless, in this process or in worker processes
(``--jobs``) or on a Ray cluster (``--ray``), each compile looked up in and stored to
the disk cache (:mod:`xla_streams.tuning.cache`).

Every real compile starts from StableHLO text (:class:`ProgramSource`): a
``JAX_DUMP_IR_TO`` file, a saved ``lowered.as_text()``, or a ``jax.stages.Lowered``
turned into its text with source locations and its device assignment
(``jax_compat.lowered_compile_inputs``; the compile is then byte for byte the one
``lowered.compile(compiler_options=...)`` gives). Text travels to other processes,
and its SHA-256 keys the cache. Each process builds the compile-only topology once.
Every compile also writes XLA's latency-hiding schedule, its own estimate of the
step, into a folder of its own (:func:`schedule_dump`), read into an
:class:`~xla_streams.tuning.result.XlaOpinion`.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from xla_streams import aot, jax_compat
from xla_streams.simulate.xla_estimate import (
    ScheduleError,
    XlaEstimate,
    find_schedule,
    read_schedule,
)
from xla_streams.tuning.cache import CompileCache, Compiled, Refused, compiler_identity, digest
from xla_streams.tuning.result import XlaOpinion, first_line

# What one compile may need, for the default number of worker processes.
COMPILE_MEMORY_BYTES = 4 << 30
MAX_DEFAULT_JOBS = 8


def default_jobs() -> int:
    """Worker processes for compiles: one per core, at most one per 4 GiB of available
    memory (a compile of a large model takes a few GiB), at most 8, at least 1.
    (0 jobs compiles in the tuner's own process: no start-up, but a crash of XLA on a
    candidate ends the tuner.)"""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = _available_memory()
    by_memory = memory // COMPILE_MEMORY_BYTES if memory else MAX_DEFAULT_JOBS
    return max(1, min(cores or 1, by_memory, MAX_DEFAULT_JOBS))


def _available_memory() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


@dataclass(frozen=True)
class ProgramSource:
    """A program as its candidates compile it: StableHLO text, the ids of the devices of
    the compile-only topology it is assigned to, in order (() : the first replicas x
    partitions, host-major), the compiler options ``jax.jit`` was given, and the
    topology (:func:`xla_streams.aot.topology_shape`)."""

    text: str
    device_ids: tuple[int, ...]
    jit_options: Mapping[str, object]
    target: str
    devices: int
    devices_per_host: int
    hosts_per_domain: int | None
    fingerprint: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.fingerprint:
            object.__setattr__(self, "fingerprint", digest(self.text))

    @property
    def shape(self) -> str:
        return aot.topology_shape(self.devices, self.devices_per_host, self.hosts_per_domain)

    def cache_base(self) -> dict[str, object]:
        """What, besides the options, decides this program's compiles (the cache key)."""
        return {
            "module": self.fingerprint,
            "device_ids": list(self.device_ids),
            "jit_options": {k: str(v) for k, v in sorted(self.jit_options.items())},
            "target_config": digest(aot.target_config(self.target)),
            "topology": self.shape,
            **compiler_identity(),
        }


class Compiler(Protocol):
    """Compiles option sets: one :class:`Compiled` or :class:`Refused` each, in order."""

    workers: int

    def compile_many(self, options: Sequence[Mapping[str, object]]) -> list[Compiled | Refused]: ...

    def will_compile(self, options: Mapping[str, object]) -> bool:
        """False when ``options`` would come from the cache (free for the budget)."""
        ...

    def close(self) -> None: ...


# -- in this process ------------------------------------------------------------------------


class Topology:
    """The compile-only devices of a source, built once per process."""

    def __init__(self, source: ProgramSource) -> None:
        topology = aot.gpu_topology(
            source.target, source.devices, source.devices_per_host, source.hosts_per_domain
        )
        by_id = {int(d.id): d for d in topology.devices}
        ordered = sorted(topology.devices, key=lambda d: (d.process_index, d.id))
        self.devices = [by_id[i] for i in source.device_ids] if source.device_ids else ordered


# -- XLA's own estimate -----------------------------------------------------------------


def schedule_dump(folder: str) -> dict[str, object]:
    """Compile options that make XLA write its latency-hiding schedule (its estimate of
    every scheduled instruction's time) into ``folder``, and none of its module dumps
    (no module is named by the empty pattern): a second opinion for the cost of a file."""
    return {
        "xla_dump_to": folder,
        "xla_dump_latency_hiding_schedule": True,
        "xla_dump_hlo_module_re": "^$",
    }


def xla_opinion(estimate: XlaEstimate) -> XlaOpinion:
    """What the tuner keeps of XLA's estimate of one compile."""
    return XlaOpinion(
        step_ms=estimate.step_us / 1e3,
        priced_step_ms=estimate.priced_step_us / 1e3,
        exposed_communication_ms=estimate.exposed_communication_us / 1e3,
        placeholders=tuple(p.start for p in estimate.placeholders if not p.collective),
        unpriced=tuple(p.start for p in estimate.placeholders if p.collective),
        spans=tuple((s.start, s.span_us, s.runs) for s in estimate.collectives),
    )


def _read_opinion(folder: str) -> tuple[XlaOpinion | None, str, bool]:
    """XLA's estimate from the schedule a compile wrote into ``folder``, or None and why
    there is none; and whether the cache may keep the compile: not when this package
    could not read the schedule XLA wrote (a later version may)."""
    try:
        path = find_schedule(folder)
    except ScheduleError:
        return None, "XLA wrote no latency-hiding schedule (is its scheduler off?)", True
    try:
        return xla_opinion(read_schedule(path)), "", True
    except ScheduleError as e:
        return None, first_line(e), False


def compile_source(
    source: ProgramSource, devices: Sequence[Any], options: Mapping[str, object]
) -> Compiled | Refused:
    """One deviceless compile of ``source`` with ``options`` (over the jit's own), with
    XLA's own estimate of its step."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="xla_streams_schedule_") as folder:
        try:
            executable = jax_compat.compile_stablehlo(
                source.text, devices, {**source.jit_options, **options, **schedule_dump(folder)}
            )
            text = "\n\n".join(m.to_string() for m in executable.hlo_modules())
        except Exception as e:
            return Refused(first_line(e))
        compile_s = time.perf_counter() - t0
        memory = _memory_of(executable.get_compiled_memory_stats)
        return Compiled(text, memory, compile_s, *_read_opinion(folder))


class LocalCompiler:
    """Compiles in this process, one after the other (``jobs=0``: XLA crashing on a
    candidate ends the process)."""

    workers = 1

    def __init__(self, source: ProgramSource) -> None:
        self.source = source
        self._topology: Topology | None = None

    def compile_many(self, options: Sequence[Mapping[str, object]]) -> list[Compiled | Refused]:
        if self._topology is None:
            self._topology = Topology(self.source)
        return [compile_source(self.source, self._topology.devices, o) for o in options]

    def will_compile(self, options: Mapping[str, object]) -> bool:
        return True

    def close(self) -> None:
        pass


# -- in worker processes --------------------------------------------------------------------


def serve() -> None:
    """A compile worker (``python -c "from xla_streams.tuning.compiling import serve;
    serve()"``): reads a pickled :class:`ProgramSource`, then pickled option sets, from
    standard input, and writes one pickled :class:`Compiled` or :class:`Refused` per
    option set. What JAX or XLA print goes to standard error."""
    reply = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # nothing else may write into the replies
    requests = sys.stdin.buffer
    source: ProgramSource = pickle.load(requests)
    devices: list[Any] | None = None
    while True:
        try:
            options = pickle.load(requests)
        except EOFError:
            return
        if devices is None:
            devices = Topology(source).devices
        pickle.dump(compile_source(source, devices, options), reply)
        reply.flush()


class _Worker:
    """One worker process, started on first use (and again after it died)."""

    def __init__(self, source: ProgramSource) -> None:
        self.source = source
        self.process: subprocess.Popen[bytes] | None = None

    def _start(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        env.pop("JAX_DUMP_IR_TO", None)
        # The worker imports this package from where this process does.
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
        process = subprocess.Popen(
            [sys.executable, "-c", "from xla_streams.tuning.compiling import serve; serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        assert process.stdin is not None
        pickle.dump(self.source, process.stdin)
        process.stdin.flush()
        return process

    def compile(self, options: Mapping[str, object]) -> Compiled | Refused:
        if self.process is None or self.process.poll() is not None:
            self.process = self._start()
        process = self.process
        assert process.stdin is not None and process.stdout is not None
        try:
            pickle.dump(dict(options), process.stdin)
            process.stdin.flush()
            result = pickle.load(process.stdout)
        except (OSError, EOFError, pickle.UnpicklingError):
            code = process.wait()
            self.process = None
            return Refused(f"XLA's compile died: {_death(code)}")
        if not isinstance(result, Compiled | Refused):
            return Refused(f"the compile worker answered {type(result).__name__}")
        return result

    def close(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(OSError):
            assert process.stdin is not None
            process.stdin.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _death(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = "out of memory?" if name == "SIGKILL" else "a crash in XLA on these options"
        return f"the worker was killed by {name} ({why})"
    return f"the worker exited with code {code}"


class PoolCompiler:
    """Compiles in ``jobs`` worker processes (fresh interpreters running :func:`serve`:
    nothing of the calling program is re-run in them), one candidate per worker at a
    time. A compile that crashes XLA (it happens: a segmentation fault on some option
    sets) or runs out of memory kills its worker, not the tuner: that candidate is
    refused, and the next one starts a new worker."""

    def __init__(self, source: ProgramSource, jobs: int) -> None:
        self.source = source
        self.workers = jobs
        self._pool = [_Worker(source) for _ in range(jobs)]

    def compile_many(self, options: Sequence[Mapping[str, object]]) -> list[Compiled | Refused]:
        todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        for i in range(len(options)):
            todo.put(i)
        out: list[Compiled | Refused | None] = [None] * len(options)

        def drain(worker: _Worker) -> None:
            while True:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                out[i] = worker.compile(options[i])

        threads = [
            threading.Thread(target=drain, args=(w,), daemon=True)
            for w in self._pool[: len(options)]
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [r if r is not None else Refused("not compiled") for r in out]

    def will_compile(self, options: Mapping[str, object]) -> bool:
        return True

    def close(self) -> None:
        for worker in self._pool:
            worker.close()


# -- stand-ins and the cache -----------------------------------------------------------------


class CallableCompiler:
    """Compiles with ``compile(options)``, an object's ``compile(compiler_options=...)``
    returning something with ``as_text()`` and ``memory_analysis()`` (a stand-in for a
    Lowered in tests); not cached."""

    workers = 1

    def __init__(self, compile: Callable[[Mapping[str, object]], Any]) -> None:
        self._compile = compile

    def compile_many(self, options: Sequence[Mapping[str, object]]) -> list[Compiled | Refused]:
        out: list[Compiled | Refused] = []
        for o in options:
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix="xla_streams_schedule_") as folder:
                try:
                    compiled = self._compile({**o, **schedule_dump(folder)})
                    text = compiled.as_text()
                except Exception as e:
                    out.append(Refused(first_line(e)))
                    continue
                compile_s = time.perf_counter() - t0
                memory = _memory_of(compiled.memory_analysis)
                out.append(Compiled(text, memory, compile_s, *_read_opinion(folder)))
        return out

    def will_compile(self, options: Mapping[str, object]) -> bool:
        return True

    def close(self) -> None:
        pass


class CachedCompiler:
    """``inner`` behind the disk cache: only what the cache lacks is compiled."""

    def __init__(self, inner: Compiler, cache: CompileCache, base: Mapping[str, object]) -> None:
        self.inner = inner
        self.cache = cache
        self.base = dict(base)
        self.workers = inner.workers

    def compile_many(self, options: Sequence[Mapping[str, object]]) -> list[Compiled | Refused]:
        keys = [self.cache.key(self.base, o) for o in options]
        found: list[Compiled | Refused | None] = [self.cache.load(k) for k in keys]
        todo = [i for i, f in enumerate(found) if f is None]
        if todo:
            fresh = self.inner.compile_many([options[i] for i in todo])
            for i, value in zip(todo, fresh, strict=True):
                found[i] = value
                if not isinstance(value, Compiled) or value.lasting:
                    self.cache.store(keys[i], value)
        return [f for f in found if f is not None]

    def will_compile(self, options: Mapping[str, object]) -> bool:
        return not self.cache.has(self.cache.key(self.base, options))

    def close(self) -> None:
        self.inner.close()


_MEMORY_FIELDS = (
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "alias_size_in_bytes",
    "temp_size_in_bytes",
    "peak_memory_in_bytes",
)


def _memory_of(analysis: Callable[[], Any]) -> tuple[int, int, int, int, int]:
    """XLA's compiled memory statistics, from ``analysis()``, as the fields above: 0
    where it has none, and all 0 where it gives none at all (the search then drops the
    candidate: whether it fits is unknown)."""
    try:
        stats = analysis()
    except Exception:
        return 0, 0, 0, 0, 0
    arguments, outputs, aliased, temporaries, peak = (
        value if isinstance(value := getattr(stats, name, 0), int) else 0 for name in _MEMORY_FIELDS
    )
    return arguments, outputs, aliased, temporaries, peak
