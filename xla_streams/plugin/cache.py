"""The reports of modules whose executables JAX loads from its persistent compilation cache.

An executable loaded from the cache meets no compile hook, so a run with a report
directory would get no report for it, and no word why. So while the plugin is on, each
entry JAX writes to its cache gets a companion entry in the same cache, under
``<key>-xla_streams``: the modules the hook was handed while that executable compiled,
as XLA serialized them (compressed). On a hit the hook's pipeline runs again over them
(:func:`xla_streams.plugin.hook.report_cached`: the same module and settings give the
same streams, and the settings are part of the key) and their reports are written,
each line saying that the module came from the cache. A hit whose companion is missing
or unreadable (the cache evicted it, or an earlier xla-streams wrote the entry) is said
once per entry, with how to compile it again.

XLA runs the hook on the thread that compiles, between the cache lookup that misses and
the write of the entry (both reported by :func:`xla_streams.jax_compat.watch_persistent_cache`):
a record kept per thread ties the modules to the key.
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xla_streams import jax_compat
from xla_streams._log import logger
from xla_streams.collectives import StreamModel
from xla_streams.plugin import hook

if TYPE_CHECKING:
    from xla_streams.plugin.settings import Config

SUFFIX = "-xla_streams"  # a companion's key: the entry's key and this
_MAGIC = b"xla_streams.cached_modules.v1\n"
_HEADER = struct.Struct("<?Q")  # per module: compiled for XLA:CPU, the size of its proto
# The platforms the hook is registered on (plugin._ensure_registered).
_PLATFORMS = ("cpu", *jax_compat.GPU_PLATFORMS)

Settings = Callable[[], "tuple[Config, StreamModel] | None"]  # those in force; None: off


@dataclass(frozen=True)
class CachedModule:
    """A module the hook was handed while a cached executable compiled."""

    serialized: bytes  # the HloModuleProto, as XLA handed it over
    on_cpu: bool


def encode(modules: Sequence[CachedModule]) -> bytes:
    """A companion entry's bytes."""
    parts = [_HEADER.pack(m.on_cpu, len(m.serialized)) + m.serialized for m in modules]
    return zlib.compress(_MAGIC + b"".join(parts), 1)  # fastest: it sits beside a compile


def decode(data: bytes) -> tuple[CachedModule, ...]:
    """The modules of a companion entry; ValueError for bytes that are not one."""
    try:
        raw = zlib.decompress(data)
    except zlib.error as e:
        raise ValueError(f"not compressed as one ({e})") from None
    if not raw.startswith(_MAGIC):
        raise ValueError("not a record of xla_streams.cached_modules.v1")
    modules, i = [], len(_MAGIC)
    while i < len(raw):
        if i + _HEADER.size > len(raw):
            raise ValueError("truncated")
        on_cpu, size = _HEADER.unpack_from(raw, i)
        i += _HEADER.size
        if i + size > len(raw):
            raise ValueError("truncated")
        modules.append(CachedModule(raw[i : i + size], on_cpu))
        i += size
    return tuple(modules)


class _Compiling(threading.local):
    """What this thread compiles: the key whose lookup missed, until its entry is written."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.hook_calls = 0  # modules without collectives included
        self.modules: list[CachedModule] = []


_compiling = _Compiling()
_lock = threading.Lock()
_said: set[str] = set()  # the keys whose missing companion has been said


def saw_module(serialized: bytes, *, on_cpu: bool) -> None:
    """The hook was handed ``serialized``: kept while this thread compiles for the cache."""
    if _compiling.key is None:
        return
    _compiling.hook_calls += 1
    if hook.has_collective(serialized):  # the others have nothing to report
        _compiling.modules.append(CachedModule(serialized, on_cpu))


def install(settings: Settings) -> None:
    """Keep the modules of every entry JAX writes to its persistent cache, and write their
    reports on a hit, while ``settings()`` (those in force) is not None. Once per process."""

    def looked_up(key: str, backend: Any, hit: bool) -> None:
        _compiling.key = None
        in_force = settings()
        if in_force is None or backend.platform not in _PLATFORMS:
            return
        if hit:
            _report(key, backend, *in_force)
        else:
            _compiling.key, _compiling.hook_calls, _compiling.modules = key, 0, []

    def written(key: str, module_name: str, backend: Any) -> None:
        compiled = _compiling.key == key and _compiling.hook_calls > 0
        modules, _compiling.key = _compiling.modules, None
        if not compiled or settings() is None:
            return
        try:
            cache = jax_compat.persistent_cache(backend)
            if cache is not None:
                cache.put(key + SUFFIX, encode(modules))
        except Exception as e:  # a full disk: the executable is cached all the same
            logger.warning(
                "cannot keep the modules of %s beside its cache entry (their reports on a "
                "later cache hit): %s: %s",
                module_name,
                type(e).__name__,
                e,
            )

    jax_compat.watch_persistent_cache(looked_up, written)


def _report(key: str, backend: Any, config: Config, model: StreamModel) -> None:
    """The reports of the modules of the entry ``key`` that JAX just loaded, or once, why
    there are none."""
    if config.report_dir is None:
        return
    try:
        cache = jax_compat.persistent_cache(backend)
        data = cache.get(key + SUFFIX) if cache is not None else None
        if data is None:
            raise ValueError("none was written beside it")
        modules = decode(data)
    except Exception as e:
        with _lock:
            first = key not in _said
            _said.add(key)
        if first:
            logger.warning(
                "module %s came from JAX's persistent compilation cache without the record of "
                "its modules that xla_streams keeps beside the entry (%s): no report for it; "
                "to compile it again, delete the files named %s* in the cache directory",
                key.rsplit("-", 1)[0],  # JAX's keys are <module name>-<hash>
                e,
                key,
            )
        return
    for module in modules:
        hook.report_cached(module.serialized, on_cpu=module.on_cpu, config=config, model=model)
