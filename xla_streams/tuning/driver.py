"""The JAX side of the tuner: get a program's StableHLO (from its builder, a
``jax.stages.Lowered``, JAX's own dump or a saved file), compile it deviceless for a
compile-only GPU topology under each candidate's options (:mod:`~xla_streams.tuning.compiling`),
and run the search (:mod:`xla_streams.tuning.search`). :func:`tune` is ``xla_streams.tune``.

Four ways in, one search:

- :func:`tune`: ``build(devices)`` gets the topology's GPUs in host-major order
  (device d is on host d // devices_per_host) and returns either
  ``(jitted_fn, abstract_args)`` (the contract of :mod:`xla_streams.programs`;
  ``abstract_args`` are ``jax.ShapeDtypeStruct``\\ s sharded over the devices) or
  a ``jax.stages.Lowered`` (``jax.jit(step).lower(...)``, e.g. of a Flax NNX
  ``nnx.jit`` step on ``nnx.eval_shape`` state under ``jax.set_mesh``);
- :func:`tune_lowered`: a ``jax.stages.Lowered`` already lowered for the topology;
- :func:`tune_stablehlo`: StableHLO text (``lowered.as_text()``, a dump file);
- :func:`tune_path`: a ``JAX_DUMP_IR_TO`` folder or a StableHLO file
  (:mod:`~xla_streams.tuning.sources`): no Python of the program needed.

The topology mimics the cluster: ``devices_per_host`` GPUs per host, and
``hosts_per_domain`` hosts per NVLink (scale-up) domain: 1 on H100/H200 HGX
clusters (each host its own partition, as a real job's topology has it), more
on multi-node NVLink systems (GB200 NVL72); None: every host in one domain.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from xla_streams import aot, jax_compat
from xla_streams.simulate import (
    CalibrationError,
    PerfTableError,
    Profile,
    ProfileError,
    Target,
    get_target,
    load_calibration,
    load_perf_table,
    load_profile,
    with_perf_table,
)
from xla_streams.tuning.cache import CompileCache, default_folder
from xla_streams.tuning.cluster import RayCompiler
from xla_streams.tuning.compiling import (
    CachedCompiler,
    CallableCompiler,
    Compiler,
    LocalCompiler,
    PoolCompiler,
    ProgramSource,
    default_jobs,
)
from xla_streams.tuning.levers import Lever, levers
from xla_streams.tuning.options import TuneOptions
from xla_streams.tuning.recommendation import recommend
from xla_streams.tuning.result import TuneError, TuneResult, first_line
from xla_streams.tuning.search import exhaustive, search
from xla_streams.tuning.session import ProgressBar, Session
from xla_streams.tuning.sources import parse_stablehlo, read_program

DEFAULT_BUILDER = "build"

Builder = Callable[[Sequence[Any]], Any]


# -- targets --------------------------------------------------------------------------------


def hbm_bytes(target: str) -> int:
    """The per-GPU memory of ``target``: ``device_memory_size`` of its XLA target config."""
    match = re.search(r"device_memory_size: (\d+)", aot.target_config(target))
    if match is None:
        raise TuneError(f"no device_memory_size in the target config of {target}")
    return int(match.group(1))


def _simulation_target(
    target: str,
    calibration: str | os.PathLike[str] | None,
    perf_table: str | os.PathLike[str] | None,
) -> Target:
    chosen = get_target(target)
    if perf_table is not None:
        try:
            chosen = with_perf_table(chosen, load_perf_table(os.fspath(perf_table)))
        except (OSError, PerfTableError, ValueError) as e:
            raise TuneError(f"perf table: {e}") from None
    if calibration is None:
        return chosen
    try:
        calibrated: Target = load_calibration(os.fspath(calibration)).apply(chosen)
    except (OSError, CalibrationError, ValueError) as e:
        raise TuneError(f"calibration: {e}") from None
    return calibrated


def _profile(path: str | os.PathLike[str] | None) -> Profile | None:
    if path is None:
        return None
    try:
        return load_profile(os.fspath(path))
    except (OSError, ProfileError, ValueError) as e:
        raise TuneError(f"profile: {e}") from None


def ensure_deviceless() -> None:
    """Deviceless compiles need JAX_PLATFORMS=cpu before JAX starts its backends."""
    platforms = os.environ.get("JAX_PLATFORMS")
    if platforms == "cpu":
        return
    if platforms is None and not jax_compat.backends_started():
        os.environ["JAX_PLATFORMS"] = "cpu"
        return
    raise TuneError(
        "tune compiles without a GPU and needs JAX_PLATFORMS=cpu before JAX starts "
        f"(it is {platforms!r}); run it in a process of its own"
    )


# -- the program --------------------------------------------------------------------------


def load_builder(spec: str) -> tuple[str, Builder]:
    """``PROGRAM.py[:BUILDER]`` -> (a name for reports, the builder function)."""
    path, name = spec, DEFAULT_BUILDER
    head, sep, tail = spec.rpartition(":")
    if sep and head and re.fullmatch(r"[A-Za-z_]\w*", tail):
        path, name = head, tail
    file = Path(path)
    if not file.is_file():
        why = "no such file" if not file.exists() else "not a file"
        raise TuneError(f"cannot read program '{path}': {why}")
    module_name = f"_xla_streams_tune_{re.sub(r'[^0-9A-Za-z_]', '_', file.stem)}"
    loader_spec = importlib.util.spec_from_file_location(module_name, file)
    if loader_spec is None or loader_spec.loader is None:
        raise TuneError(f"cannot load program '{path}' as Python")
    module = importlib.util.module_from_spec(loader_spec)
    folder = str(file.resolve().parent)
    sys.path.insert(0, folder)
    sys.modules[module_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:
        sys.modules.pop(module_name, None)
        raise TuneError(f"program '{path}' failed to load: {first_line(e)}") from None
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
    builder = getattr(module, name, None)
    if builder is None:
        defined = sorted(
            n
            for n, v in vars(module).items()
            if callable(v)
            and not n.startswith("_")
            and getattr(v, "__module__", None) == module_name
        )
        listed = f" (it defines: {', '.join(defined)})" if defined else ""
        raise TuneError(f"program '{path}' defines no '{name}'{listed}")
    if not callable(builder):
        raise TuneError(f"'{name}' in '{path}' is not a function")
    return f"{file.name}:{name}", builder


def _is_lowered(value: Any) -> bool:
    """A ``jax.stages.Lowered`` (or anything that prints StableHLO and compiles)."""
    return callable(getattr(value, "as_text", None)) and callable(getattr(value, "compile", None))


def _build(builder: Builder, devices: Sequence[Any], name: str) -> Any:
    """What ``builder(devices)`` returns, lowered: a ``jax.stages.Lowered``."""
    try:
        built = builder(devices)
    except (Exception, SystemExit) as e:
        raise TuneError(f"{name}(devices) raised {first_line(e)}") from None
    if _is_lowered(built):
        return built
    if not isinstance(built, tuple | list) or len(built) != 2:
        got = type(built).__name__ + (
            f" of {len(built)}" if isinstance(built, tuple | list) else ""
        )
        raise TuneError(
            f"{name}(devices) must return (jitted_fn, abstract_args) or a "
            f"jax.stages.Lowered, got {got}"
        )
    fn, args = built
    if not callable(fn):
        raise TuneError(f"{name}(devices) returned {type(fn).__name__} as its function")
    if not isinstance(args, tuple | list):
        raise TuneError(
            f"{name}(devices) must return its abstract arguments as a tuple, got "
            f"{type(args).__name__}"
        )
    import jax  # only here: `xla-streams tune --help` and a tune file need no JAX

    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    try:
        return jitted.lower(*args)
    except Exception as e:
        raise TuneError(
            f"lowering the function {name}(devices) returned failed: {first_line(e)}"
        ) from None


# -- tune ---------------------------------------------------------------------------------


def tune(build: Builder, *, options: TuneOptions | None = None, **keywords: Any) -> TuneResult:
    """Search XLA's overlap levers and the collective streams for ``build``'s program.

    ``build(devices)`` gets the ``devices`` GPUs of a compile-only ``target`` topology
    (``devices_per_host`` per host, ``hosts_per_domain`` hosts per NVLink domain), in
    host-major order, and returns ``(jitted_fn, abstract_args)`` or a
    ``jax.stages.Lowered``. The keywords are the fields of :class:`TuneOptions`, whose
    help says what each does (``devices=32, target="h200", levers=[...]``); given with
    ``options``, they replace its fields. Raises :class:`TuneError` for bad input. See
    docs/tune.md for the method.
    """
    start = time.perf_counter()
    chosen = _merged(options, keywords)
    devices, per_host, per_domain = chosen.topology()
    if not callable(build):
        raise TuneError(f"build must be a function of the devices, not {type(build).__name__}")
    name = chosen.program or str(getattr(build, "__name__", "build"))
    ensure_deviceless()
    say = ProgressBar(chosen.progress, chosen.budget_s, start)
    say(f"{name}: {devices} GPUs ({per_host} per host) of {chosen.target}")
    try:
        topology = aot.gpu_topology(chosen.target, devices, per_host, per_domain)
    except (aot.GpuAotUnavailable, ValueError) as e:
        raise TuneError(str(e)) from None
    gpus = sorted(topology.devices, key=lambda d: (d.process_index, d.id))
    lowered = _build(build, gpus, getattr(build, "__name__", "build"))
    return tune_lowered(lowered, options=dataclasses.replace(chosen, program=name), start=start)


def tune_lowered(
    lowered: Any, *, options: TuneOptions | None = None, start: float | None = None, **keywords: Any
) -> TuneResult:
    """:func:`tune` for a program already lowered for the compile-only topology of
    ``devices`` (``jax.jit(f).lower(*abstract_args)``, a ``jax.stages.Lowered``, with
    its arguments on that topology's devices: :func:`xla_streams.aot.gpu_topology` with
    the same ``devices_per_host`` and ``hosts_per_domain``); ``program`` names it. Its
    StableHLO and device assignment are what every candidate compiles (in this or
    worker processes, cached on disk), byte for byte what
    ``lowered.compile(compiler_options=...)`` gives.

    Anything else with ``compile(compiler_options=...)`` returning an object with
    ``as_text()`` and ``memory_analysis()`` is compiled through that, in this process
    and uncached (a stand-in for tests). ``start`` is when the budget began (default:
    now); the options are :func:`tune`'s."""
    start = time.perf_counter() if start is None else start
    chosen = _merged(options, keywords)
    devices, per_host, per_domain = chosen.topology()
    _required(chosen.program, "program", "the program's name in the result")
    source = None
    if _is_lowered(lowered) and hasattr(lowered, "_lowering"):
        text, ids, jit_options = jax_compat.lowered_compile_inputs(lowered)
        source = ProgramSource(text, ids, jit_options, chosen.target, devices, per_host, per_domain)
        compiler: Compiler | None = None
    elif callable(getattr(lowered, "compile", None)):
        compiler = CallableCompiler(lambda o: lowered.compile(compiler_options=o))
    else:
        raise TuneError(f"expected a jax.stages.Lowered, got {type(lowered).__name__}")
    return _tune(source, compiler, chosen, start)


def tune_stablehlo(
    text: str,
    *,
    options: TuneOptions | None = None,
    start: float | None = None,
    notes: Sequence[str] = (),
    **keywords: Any,
) -> TuneResult:
    """:func:`tune` for StableHLO text (``lowered.as_text()``, a ``JAX_DUMP_IR_TO`` file),
    named by ``program``: its partitions are assigned to the first devices of the
    topology, host-major. ``devices`` defaults to the module's replicas x partitions,
    and must equal them when given; ``devices_per_host`` is at most ``devices``. The
    options are :func:`tune`'s; ``notes`` go into the result."""
    start = time.perf_counter() if start is None else start
    chosen = _merged(options, keywords)
    program = _required(chosen.program, "program", "the program's name in the result")
    module = parse_stablehlo(text, Path(program))
    devices = module.devices if chosen.devices is None else chosen.devices
    if devices != module.devices:
        raise TuneError(
            f"{program}: the module runs on {module.devices} devices ({module.replicas} "
            f"replica(s) x {module.partitions} partition(s)), not --devices={devices}"
        )
    given = chosen.devices_per_host
    per_host = None if given is None else min(given, devices)
    chosen = dataclasses.replace(chosen, devices=devices, devices_per_host=per_host)
    source = ProgramSource(text, (), {}, chosen.target, *chosen.topology())
    return _tune(source, None, chosen, start, notes)


def tune_path(
    path: str | os.PathLike[str], *, options: TuneOptions | None = None, **keywords: Any
) -> TuneResult:
    """:func:`tune` for a ``JAX_DUMP_IR_TO`` folder (its training step: the largest module
    with a matrix multiply; the others are listed in the notes) or a StableHLO file
    (:mod:`~xla_streams.tuning.sources`). The options are :func:`tune`'s."""
    start = time.perf_counter()
    chosen = _merged(options, keywords)
    step, others = read_program(path)
    notes = []
    if others:
        shown = "; ".join(m.words() for m in others[:8])
        more = f" and {len(others) - 8} more" if len(others) > 8 else ""
        notes.append(
            f"tuned {step.words()}, the largest module with a dot_general; the folder's "
            f"other modules: {shown}{more}"
        )
    notes.append(
        "compiled from StableHLO without the program: partition p on GPU p of the "
        "topology (host-major); a dump of a CPU run was lowered with CPU rules"
    )
    name = f"{Path(path).name}:{step.name}" if Path(path).is_dir() else Path(path).name
    return tune_stablehlo(
        step.text,
        options=dataclasses.replace(chosen, program=chosen.program or name),
        start=start,
        notes=notes,
    )


def _merged(options: TuneOptions | None, keywords: Mapping[str, Any]) -> TuneOptions:
    """``options`` with the fields ``keywords`` give (TypeError for one it lacks)."""
    if options is None:
        return TuneOptions(**keywords)
    return dataclasses.replace(options, **keywords)


def _required[T](value: T | None, name: str, what: str) -> T:
    if value is None:
        raise TuneError(f"{name} is required: {what}")
    return value


def _tune(
    source: ProgramSource | None,
    compiler: Compiler | None,
    options: TuneOptions,
    start: float,
    notes: Sequence[str] = (),
) -> TuneResult:
    """The search, for a program whose ``options`` name it and say its devices."""
    plugin = sys.modules.get("xla_streams.plugin")
    if plugin is not None and getattr(plugin, "current", lambda: None)() is not None:
        raise TuneError(
            "the xla_streams plugin is on in this process and would annotate every "
            "candidate's module; tune in a process without it (no XLA_STREAMS_* settings)"
        )
    devices, per_host, per_domain = options.topology()
    sim_target = _simulation_target(options.target, options.calibration, options.perf_table)
    profile = _profile(options.profile)
    say = ProgressBar(options.progress, options.budget_s, start)
    cache: CompileCache | None = None
    if source is not None:
        compiler, cache = _compiler(source, options, say)
    assert compiler is not None
    hbm = hbm_bytes(options.target)
    try:
        sync_on_compute = jax_compat.jax_version() >= (0, 11)
    except ImportError:
        sync_on_compute = True
    hosts = devices // per_host
    domain = per_host * (hosts if per_domain is None else per_domain)
    session = Session(
        compiler=compiler,
        options=options,
        target=sim_target,
        domain_size=domain,
        hbm=hbm,
        start=start,
        say=say,
        sync_on_compute=sync_on_compute,
        profile=profile,
    )
    try:
        session.start_baseline()
        chosen, skipped = _levers(session)
        outcome = exhaustive(session, chosen) if options.exhaustive else search(session, chosen)
    finally:
        compiler.close()
    extra = list(notes)
    if cache is not None:
        extra.append(
            f"compile cache {cache.folder}: {session.cache_hits} hit(s), "
            f"{cache.stores} new entr{'y' if cache.stores == 1 else 'ies'}"
        )
    result = recommend(
        session,
        outcome,
        levers=chosen,
        skipped=skipped,
        notes=extra,
        topology=aot.topology_shape(devices, per_host, per_domain),
    )
    say(f"done: {result.verdict}")
    return result


def _compiler(
    source: ProgramSource, options: TuneOptions, say: Callable[[str], None]
) -> tuple[Compiler, CompileCache | None]:
    """The compiler ``options`` ask for (workers, Ray), behind the disk cache."""
    inner: Compiler
    if options.ray:
        inner = RayCompiler(source, options.ray, options.jobs)
        say(f"compiling on the Ray cluster {options.ray} ({inner.workers} worker(s))")
    else:
        jobs = default_jobs() if options.jobs is None else options.jobs
        inner = LocalCompiler(source) if jobs == 0 else PoolCompiler(source, jobs)
    cache_dir = options.cache_dir
    if cache_dir is False or cache_dir == "":
        return inner, None
    folder = default_folder() if cache_dir is None or cache_dir is True else Path(cache_dir)
    cache = CompileCache(folder)
    return CachedCompiler(inner, cache, source.cache_base()), cache


def _levers(session: Session) -> tuple[list[Lever], list[str]]:
    """The levers to search, in order, and those skipped with the reason."""
    assert session.census is not None
    options = session.options
    every = {lv.name: lv for lv in levers(session.census, max(options.streams))}
    wanted = list(every) if options.levers is None else list(options.levers)
    chosen, skipped = [], []
    for name in wanted:
        lever = every[name]
        why = lever.skip(session.census)
        missing = sorted(lever.options & session.unavailable)
        if missing:
            settings = tuple(s for s in lever.settings if not set(s) & session.unavailable)
            labels = tuple(
                lb for s, lb in zip(lever.settings, lever.labels, strict=True) if s in settings
            )
            lever = dataclasses.replace(lever, settings=settings, labels=labels)
            if len(settings) < 2:
                why = why or f"this XLA has no option {', '.join(missing)}"
        if why is None and len(lever.settings) < 2:
            why = "no setting to try besides XLA's default"
        if why is not None:
            skipped.append(f"{name}: {why}")
            continue
        chosen.append(lever)
    return chosen, skipped
