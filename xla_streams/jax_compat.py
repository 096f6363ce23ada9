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
from collections.abc import Callable, Iterable
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


def exclude_from_source_info(path: str) -> None:
    """Leave frames of ``path`` out of the source locations JAX records in HLO metadata
    (for as long as the process lives: JAX has no way to remove one)."""
    source_info_util = _private("jax._src.source_info_util")
    if path not in source_info_util._exclude_paths:
        source_info_util.register_exclusion(path)
