"""The JAX internals this package relies on, in one place, for jax 0.11.2 to 0.12.

Everything else in the package uses JAX's public API. What is here is needed
because JAX loads plugins (our ``initialize()``) while it holds the lock that
``jax.extend.xla.register_hlo_module_transformation`` itself takes: since
jax 0.11 that function starts every backend first, so calling it from
``initialize()`` hangs the program. So the hook is registered the way that
function does it underneath, without starting anything:

- XLA:CPU takes the transformation directly;
- a PJRT plugin (``cuda``, ``rocm``) takes it once JAX has loaded the plugin,
  through the callback JAX runs for each plugin after loading them all and
  before creating any client (``register_plugin_callbacks``).

JAX catches and only logs what ``initialize()`` raises, so a bad setting is
raised later, when JAX creates its first backend (:func:`check_before_backend_start`).

Nothing here imports JAX at module level: the plugin must cost nothing when off.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

Transformation = Callable[[bytes], "bytes | None"]
POST_SCHEDULER = 1  # jax.extend.xla.PipelineStage.POST_SCHEDULER
# The PJRT plugins that compile for GPUs, by the name JAX gives them.
GPU_PLATFORMS = ("cuda", "rocm")
# The deviceless-compile plugins, newest CUDA first (the gpu-aot extra installs one).
CUDA_PLUGIN_MODULES = ("jax_cuda13_plugin", "jax_cuda12_plugin")

_lock = threading.Lock()
_registered_on: dict[str, list[Any]] = {}  # hook name -> the PJRT C APIs it is registered on


def register_compile_hook(
    name: str, callback: Transformation, platforms: Iterable[str], stage: int = POST_SCHEDULER
) -> None:
    """Run ``callback`` on every module XLA compiles for ``platforms``, at ``stage``.

    Safe to call from a plugin's ``initialize()``: starts no backend. A PJRT
    platform that is not installed is skipped.
    """
    xla_bridge, _xla = _private("jax._src.xla_bridge"), _private("jax._src.lib")._xla
    wanted = set(platforms)
    if "cpu" in wanted:
        _xla.register_xla_transform(name, stage, callback)

    def on_plugin(c_api: Any) -> None:
        if _platform_of(c_api) not in wanted:
            return
        with _lock:
            apis = _registered_on.setdefault(name, [])
            if any(api is c_api for api in apis):
                return
            apis.append(c_api)
        _xla.register_xla_transform_c_api(c_api, name, stage, callback)

    if wanted - {"cpu"}:
        xla_bridge.register_plugin_callbacks(on_plugin)


def clear_compile_hook(name: str, stage: int = POST_SCHEDULER) -> None:
    """Remove every registration of hook ``name`` made by :func:`register_compile_hook`."""
    _xla = _private("jax._src.lib")._xla
    _xla.clear_xla_transform(name, stage)
    with _lock:
        apis = _registered_on.pop(name, [])
    for c_api in apis:
        _xla.clear_xla_transform_c_api(c_api, name, stage)


def check_before_backend_start(check: Callable[[], None]) -> None:
    """Call ``check()`` before JAX creates each backend; what it raises stops the start.

    ``check`` should raise a ``SystemExit``: JAX turns an ``Exception`` from a
    backend factory into a warning or its own error with unrelated advice.
    Wraps every backend factory: those registered now (CPU) and, once JAX has
    loaded the PJRT plugins, theirs.
    """
    xla_bridge = _private("jax._src.xla_bridge")

    def wrap_all(c_api: Any = None) -> None:
        for platform, registration in list(xla_bridge._backend_factories.items()):
            if getattr(registration.factory, "_xla_streams_checked", False):
                continue
            xla_bridge._backend_factories[platform] = dataclasses.replace(
                registration, factory=_checked(registration.factory, check)
            )

    wrap_all()
    xla_bridge.register_plugin_callbacks(wrap_all)


def _checked(factory: Callable[[], Any], check: Callable[[], None]) -> Callable[[], Any]:
    def checked_factory() -> Any:
        check()
        return factory()

    checked_factory._xla_streams_checked = True  # type: ignore[attr-defined]
    return checked_factory


def _platform_of(c_api: Any) -> str | None:
    for platform, registration in _private("jax._src.xla_bridge")._backend_factories.items():
        if registration.c_api is c_api:
            return str(platform)
    return None


def _private(module: str) -> Any:
    """A JAX-internal module, untyped: what this file relies on is stated in its docstring."""
    return importlib.import_module(module)


def cuda_plugin_module() -> str | None:
    """The installed JAX CUDA plugin's module (the one deviceless GPU compiles use), if any."""
    for module in CUDA_PLUGIN_MODULES:
        if importlib.util.find_spec(module) is not None:
            return module
    return None


def jax_version() -> tuple[int, ...]:
    """The installed jax's version as numbers, e.g. (0, 12, 0, 1)."""
    version = importlib.import_module("jax").__version__
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def backends_started() -> bool:
    """True once JAX has created a backend (XLA has then parsed XLA_FLAGS)."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    return bridge is not None and bool(bridge.backends_are_initialized())


def distributed_client() -> Any:
    """The client of ``jax.distributed`` (its key-value store), or None in one process."""
    return _private("jax._src.distributed").global_state.client


def hlo_bindings() -> Any:
    """jaxlib's HLO bindings: XLA's own text parser and printer."""
    return _private("jaxlib._hlo")


# -- the persistent compilation cache's key ------------------------------------------


class _KeyComponent:
    """What ``jax._src.cache_key.custom_hook`` is set to: the hook that was there before
    (JAX's, which returns "", or another library's), then ``|name:component()`` while
    ``component`` is set."""

    def __init__(self, name: str, previous: Callable[[], str]) -> None:
        self.name = name
        self.previous = previous
        self.component: Callable[[], str] | None = None

    def __call__(self) -> str:
        base = self.previous()
        component = self.component
        if component is None:
            return base
        return f"{base}|{self.name}:{component()}"


_key_components: dict[str, _KeyComponent] = {}  # name -> our hook, installed once per name


def add_cache_key_component(name: str, component: Callable[[], str]) -> bool:
    """Hash ``component()`` into the key of every executable JAX's persistent
    compilation cache stores or looks up from now on, after whatever hook is there
    (``jax._src.cache_key.custom_hook``, which ``cache_key.get`` looks up by name on each
    call; jax 0.11.2 and 0.12 have it). ``component`` is called once per lookup: it must
    be cheap, and the same in every process of a job (no paths, no process ids).
    Adding ``name`` again replaces its component. Returns False where JAX has no hook."""
    cache_key = _private("jax._src.cache_key")
    if not callable(getattr(cache_key, "custom_hook", None)):
        return False
    with _lock:
        ours = _key_components.get(name)
        if ours is None:
            ours = _KeyComponent(name, cache_key.custom_hook)
            _key_components[name] = ours
            cache_key.custom_hook = ours
        ours.component = component
    return True


def remove_cache_key_component(name: str) -> None:
    """Undo :func:`add_cache_key_component`: keys are JAX's own again (or what the hook
    installed before ours gives). Where another hook has been chained on top of ours
    since, ours stays in the chain and only passes the previous one's value through."""
    cache_key: Any = sys.modules.get("jax._src.cache_key")
    with _lock:
        ours = _key_components.get(name)
        if ours is None:
            return
        ours.component = None
        if cache_key is not None and cache_key.custom_hook is ours:
            cache_key.custom_hook = ours.previous
            del _key_components[name]


# -- the persistent compilation cache's lookups and writes -----------------------------

_cache_watched = False  # the wrappers of watch_persistent_cache are installed


def watch_persistent_cache(
    looked_up: Callable[[str, Any, bool], None], written: Callable[[str, str, Any], None]
) -> None:
    """Call ``looked_up(key, backend, hit)`` after every lookup in JAX's persistent
    compilation cache and ``written(key, module_name, backend)`` after every executable
    JAX writes there, on the thread that compiles; once per process (later calls change
    nothing). ``jax._src.compiler`` calls ``compilation_cache.get_executable_and_time``
    and ``put_executable_and_time`` through their module (jax 0.11.2 to 0.12), so wrappers
    set there are what it calls."""
    global _cache_watched
    compilation_cache = _private("jax._src.compilation_cache")
    with _lock:
        if _cache_watched:
            return
        _cache_watched = True
        get = compilation_cache.get_executable_and_time
        put = compilation_cache.put_executable_and_time

        def get_executable_and_time(
            cache_key: str, compile_options: Any, backend: Any, *args: Any, **kwargs: Any
        ) -> Any:
            found = get(cache_key, compile_options, backend, *args, **kwargs)
            looked_up(cache_key, backend, found[0] is not None)
            return found

        def put_executable_and_time(
            cache_key: str, module_name: str, executable: Any, backend: Any, *args: Any,
            **kwargs: Any,
        ) -> None:  # fmt: skip
            put(cache_key, module_name, executable, backend, *args, **kwargs)
            written(cache_key, module_name, backend)

        compilation_cache.get_executable_and_time = get_executable_and_time
        compilation_cache.put_executable_and_time = put_executable_and_time


def persistent_cache(backend: Any) -> Any:
    """The cache (``get(key)``, ``put(key, value)``) in which JAX keeps the executables of
    ``backend``, or None; under the one ``jax_compilation_cache_check_contents`` adds,
    which would compare what is put with an executable, the cache it wraps."""
    cache = _private("jax._src.compilation_cache")._get_cache(backend)
    return getattr(cache, "_base_cache", cache)


# -- the devices of a job ------------------------------------------------------------


def device_processes(platform: str) -> dict[int, int] | None:
    """``{device id: process index}`` for every device of ``platform``'s backend in the
    job (all processes of a ``jax.distributed`` job), or None if JAX has not created
    that backend. Reads JAX's table of backends: safe inside a compile hook, starts
    nothing."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    client = getattr(bridge, "_backends", {}).get(platform) if bridge is not None else None
    if client is None:
        return None
    return {int(d.id): int(d.process_index) for d in client.devices()}


def gpu_device_kinds() -> set[str] | None:
    """The ``device_kind`` of every device of the GPU backends JAX has created (all
    processes of a job), or None if it has created none. Safe inside a compile hook,
    as :func:`device_processes` is."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    backends = getattr(bridge, "_backends", {}) if bridge is not None else {}
    clients = [backends[p] for p in GPU_PLATFORMS if p in backends]
    if not clients:
        return None
    return {str(d.device_kind) for client in clients for d in client.devices()}


# -- deviceless recompiles of StableHLO text (xla-streams tune) -------------------------


def lowered_compile_inputs(lowered: Any) -> tuple[str, tuple[int, ...], dict[str, object]]:
    """What ``lowered.compile()`` compiles, in a form another process can compile again
    (:func:`compile_stablehlo`): the StableHLO text with its source locations (so the
    compiled module's names are the ones ``lowered.compile()`` gives), the ids of the
    devices it is assigned to, in order, and the compiler options ``jax.jit`` was given.
    The device ids are () where the lowering does not say them."""
    text = str(lowered.as_text(debug_info=True))
    lowering = getattr(lowered, "_lowering", None)
    device_list = getattr(lowering, "_device_list", None)
    ids = tuple(int(d.id) for d in device_list) if device_list is not None else ()
    kvs = getattr(lowering, "_compiler_options_kvs", ()) or ()
    return text, ids, dict(kvs)


def compile_stablehlo(text: str, devices: Sequence[Any], options: Mapping[str, object]) -> Any:
    """Compile StableHLO ``text`` (a ``JAX_DUMP_IR_TO`` file, ``lowered.as_text()``) for
    ``devices`` of a compile-only topology with XLA ``options`` (``DebugOptions`` fields),
    as ``jax.jit``'s ``lowered.compile(compiler_options=options)`` does: replicas x
    partitions from the module, assigned to the first of ``devices`` in order, sharding
    propagation allowed to the arguments and results that have no sharding or an
    unconstrained one. Returns XLA's executable (``hlo_modules()``,
    ``get_compiled_memory_stats()``). Writes no ``JAX_DUMP_IR_TO`` dump and uses no
    persistent compilation cache. Raises ValueError for text that does not parse or
    too few devices."""
    import numpy as np

    compiler = _private("jax._src.compiler")
    mlir = _private("jax._src.interpreters.mlir")
    ir = mlir.ir
    jaxlib = _private("jax._src.lib")._jax
    with mlir.make_ir_context():
        try:
            module = ir.Module.parse(text)
        except Exception as e:  # MLIRError: its first line says where
            raise ValueError(f"not StableHLO text: {str(e).strip().splitlines()[0]}") from None
        attributes = module.operation.attributes

        def get(name: str) -> int:
            return int(ir.IntegerAttr(attributes[name]).value) if name in attributes else 1

        replicas, partitions = get("mhlo.num_replicas"), get("mhlo.num_partitions")
        if replicas * partitions > len(devices):
            raise ValueError(
                f"the module runs on {replicas * partitions} devices ({replicas} replicas x "
                f"{partitions} partitions), the topology has {len(devices)}"
            )
        assigned = np.array(list(devices[: replicas * partitions]), dtype=object)
        assigned = assigned.reshape(replicas, partitions)
        client = assigned.flat[0].client
        compile_options = compiler.get_compile_options(
            num_replicas=replicas,
            num_partitions=partitions,
            device_assignment=assigned,
            env_options_overrides=dict(options),
            backend=client,
        )
        to_parameters, to_output = _propagation(module, ir)
        build = compile_options.executable_build_options
        build.allow_spmd_sharding_propagation_to_parameters = to_parameters or [False]
        build.allow_spmd_sharding_propagation_to_output = to_output or [False]
        return compiler.backend_compile_and_load(
            client, module, jaxlib.DeviceList(tuple(assigned.flat)), compile_options, []
        )


def _propagation(module: Any, ir: Any) -> tuple[list[bool], list[bool]]:
    """Per argument and per result of ``main``: may XLA choose its sharding (it has none,
    or an unconstrained one, ``?``), as ``jax.jit`` allows for unspecified shardings."""
    main = None
    for op in module.body.operations:
        if "sym_name" in op.attributes and ir.StringAttr(op.attributes["sym_name"]).value == "main":
            main = op
    if main is None:
        return [], []

    def allowed(name: str) -> list[bool]:
        if name not in main.attributes:
            return []
        out = []
        for entry in ir.ArrayAttr(main.attributes[name]):
            attrs = ir.DictAttr(entry)
            sharding = next(
                (str(attrs[k]) for k in ("sdy.sharding", "mhlo.sharding") if k in attrs), None
            )
            out.append(sharding is None or "?" in sharding)
        return out

    return allowed("arg_attrs"), allowed("res_attrs")
