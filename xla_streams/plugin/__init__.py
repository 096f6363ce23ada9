"""The JAX plugin: turning xla_streams on and off in a process.

JAX imports this module through the ``jax_plugins`` entry point and calls
:func:`initialize` when it starts its backends. With
``XLA_STREAMS_COLLECTIVE_STREAMS=K`` in the environment (every setting is in
:mod:`xla_streams.plugin.settings`) an unmodified JAX program then gets, for every
module XLA compiles, the compile hook of :mod:`xla_streams.plugin.hook`.

Turning it on does three things:

1. the XLA options it needs go into ``XLA_FLAGS`` where the user has not set
   them, while XLA has not read it yet: for native mode the overlap limit K
   (without it the scheduler keeps one collective in flight, and there is
   nothing to spread) and K communication streams; from a tune result
   (``XLA_STREAMS_CONFIG``) its options. Each one added is logged;
2. the hook is registered for XLA:CPU and the GPU plugins, in a way that
   starts no backend (:mod:`xla_streams.jax_compat`): ``initialize()`` runs
   while JAX holds the lock that backend start-up takes;
3. a bad setting found by ``initialize()`` is raised when JAX creates its first
   backend, as :class:`StartupError` (a ``SystemExit``), since JAX only logs what
   ``initialize()`` raises.

Nothing here imports JAX at module level: ``initialize()`` runs in every JAX
program of an environment where xla-streams is installed, and must be cheap
when the plugin is off.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from xla_streams import _log, jax_compat, xla_options
from xla_streams._log import logger
from xla_streams.collectives import StreamModel
from xla_streams.plugin import hook
from xla_streams.plugin.settings import Config, ConfigError, ignored_env

HOOK_NAME = "xla_streams"
# XLA's default overlap limit: one async collective in flight.
_XLA_DEFAULT_OVERLAP_LIMIT = 1


class StartupError(SystemExit):
    """A bad setting found when JAX starts: ends the program with the message.

    A ``SystemExit`` because JAX turns any ``Exception`` raised while it starts a
    backend into a warning or into its own error with unrelated advice.
    """

    def __init__(self, message: str) -> None:
        super().__init__(f"xla_streams: {message}")
        self.message = message


# -- state -------------------------------------------------------------------------------

_lock = threading.RLock()
_config: Config | None = None
_model = StreamModel(sync_on_compute=True)  # where XLA runs collectives in this process
_source = ""
_generation = 0  # bumped by disable(): stale registrations turn into no-ops
_registered_generation: int | None = None
_startup_error: ConfigError | None = None
_fail_fast_installed = False
_xla_flags_before: str | None = None  # XLA_FLAGS as it was before we added to it
_xla_flags_added: tuple[str, ...] = ()
_late_warning_given = False  # XLA_FLAGS read before we could add to it: said once


def current() -> Config | None:
    """The active settings, or None when the plugin is off."""
    return _config


# -- turning it on and off -----------------------------------------------------------


def initialize() -> None:
    """The ``jax_plugins`` entry point: read ``XLA_STREAMS_*`` and turn the plugin on.

    Never raises (JAX would only log it): a bad setting is raised as
    :class:`StartupError` when JAX creates its first backend, which is before
    anything is compiled.
    """
    try:
        config = Config.from_env()
    except ConfigError as e:
        _fail_at_backend_start(e)
        return
    if config is None:
        ignored = ignored_env()
        if ignored and _config is None:
            logger.warning(
                "%s set but the plugin is off; set XLA_STREAMS_COLLECTIVE_STREAMS=K to turn it on",
                ", ".join(ignored),
            )
        return
    if _config is not None:
        if _config != config:
            logger.warning(
                "keeping the settings from %s (%s); ignoring the environment's (%s)",
                _source,
                _config.describe(),
                config.describe(),
            )
        return
    try:
        _activate(config, "the environment")
    except ConfigError as e:  # the report directory cannot be created
        _fail_at_backend_start(e)


def enable(
    collective_streams: int | None = None,
    *,
    policy: str | None = None,
    mode: str | None = None,
    pipeline: str | None = None,
    report_dir: str | os.PathLike[str] | None = None,
    report_html: bool | None = None,
    strict: bool | None = None,
    log: str | None = None,
    timeout_s: float | None = None,
    config: str | os.PathLike[str] | None = None,
) -> Config:
    """Turn the plugin on in this process; returns the settings now active.

    ``collective_streams`` defaults to 4 (or to what ``pipeline`` or the tune
    result ``config`` says). Call it before the first JAX computation so that
    the XLA options it needs are read (see the module docstring); later calls
    still annotate every new compile but cannot change XLA's options any more,
    and say so. Raises ConfigError.
    """
    values: dict[str, Any] = {
        "collective_streams": collective_streams,
        "policy": policy,
        "mode": mode,
        "pipeline": pipeline,
        "report_dir": report_dir,
        "report_html": report_html,
        "strict": strict,
        "log": log,
        "timeout_s": timeout_s,
        "config": config,
    }
    if collective_streams is None and pipeline is None and config is None:
        values["collective_streams"] = 4
    settings = Config.from_values(values, "kwarg")
    assert settings is not None
    return _activate(settings, "enable()")


def enable_config(config: Config, source: str) -> Config:
    """Turn the plugin on with ready-made settings (used by ``xla_streams.plugin.flags``)."""
    return _activate(config, source)


def disable() -> None:
    """Turn the plugin off and remove the compile hook; the next compiles are untouched."""
    global _config, _generation, _registered_generation, _source
    with _lock:
        _config = None
        _source = ""
        _generation += 1
        registered = _registered_generation is not None
        _registered_generation = None
        _restore_xla_flags()
    if registered:
        jax_compat.clear_compile_hook(HOOK_NAME)


@contextmanager
def collective_streams(streams: int | None = 4, **options: Any) -> Iterator[Config]:
    """``with xla_streams.collective_streams(4): ...``: the plugin on inside the block.

    Takes the options of :func:`enable`; the previous state (off, or other
    settings) comes back on exit.
    """
    with _lock:
        previous, previous_source = _config, _source
    config = enable(streams, **options)
    try:
        yield config
    finally:
        if previous is None:
            disable()
        else:
            _activate(previous, previous_source)


def _activate(config: Config, source: str) -> Config:
    global _config, _source, _startup_error
    if config.report_dir is not None:
        try:
            os.makedirs(config.report_dir, exist_ok=True)
        except OSError as e:
            raise ConfigError(
                "report_dir",
                f"cannot create the report directory {config.report_dir}: {e.strerror}",
            ) from None
    _log.configure(config.log)
    with _lock:
        _config = config
        _source = source
        _startup_error = None
        added = _apply_xla_options(config)
    _ensure_registered()
    message = f"on ({config.describe()}), from {source}"
    if added:
        logger.info("%s; added to XLA_FLAGS: %s", message, " ".join(added))
    else:
        logger.info("%s", message)
    return config


def _fail_at_backend_start(error: ConfigError) -> None:
    """Stop the program with ``error`` when JAX starts its first backend (it prints
    the message then, once)."""
    global _startup_error, _fail_fast_installed
    with _lock:
        _startup_error = error
        if _fail_fast_installed:
            return
        _fail_fast_installed = True

    def check() -> None:
        error = _startup_error
        if error is not None:
            raise StartupError(str(error))

    jax_compat.check_before_backend_start(check)


# -- XLA options ---------------------------------------------------------------------


def _apply_xla_options(config: Config) -> list[str]:
    """Add what ``config`` needs to XLA_FLAGS while XLA has not read it yet; sets the
    stream model from the overlap limit that will be in effect."""
    global _xla_flags_before, _xla_flags_added, _model, _late_warning_given
    # A tune result's options win over native mode's defaults (its overlap limit is
    # what its prediction was made with).
    native = xla_options.native_mode(config.collective_streams) if config.mode == "native" else {}
    wanted = {**native, **config.xla_options}
    current_flags = os.environ.get("XLA_FLAGS", "")
    # Ours from an earlier enable() are replaced, not kept as the user's.
    base = xla_options.without(current_flags, _xla_flags_added)
    new, added, users = xla_options.with_options(base, wanted)
    started = jax_compat.backends_started()
    limit = users.get(xla_options.OVERLAP_LIMIT)
    if limit is not None and limit.isdigit() and int(limit) < config.collective_streams:
        logger.warning(
            "XLA_FLAGS sets --%s=%s, below the %d collective streams: at most %s collectives "
            "are in flight at once",
            xla_options.OVERLAP_LIMIT,
            limit,
            config.collective_streams,
            limit,
        )
    ours = wanted.get(xla_options.OVERLAP_LIMIT)
    effective = limit if limit is not None else ours if not started else None
    _model = StreamModel(
        overlap_limit=int(str(effective))
        if str(effective).isdigit()
        else _XLA_DEFAULT_OVERLAP_LIMIT,
        sync_on_compute=True,
    )
    if started:
        if added and not _late_warning_given:
            _late_warning_given = True
            logger.warning(
                "JAX has started already and XLA has read XLA_FLAGS, so %s cannot take effect "
                "in this process; set XLA_STREAMS_COLLECTIVE_STREAMS (or call "
                "xla_streams.enable) before the first JAX computation",
                " ".join(added),
            )
        return []
    if _xla_flags_before is None:
        _xla_flags_before = current_flags
    if new != current_flags:
        os.environ["XLA_FLAGS"] = new
    _xla_flags_added = tuple(added)
    return added


def _restore_xla_flags() -> None:
    global _xla_flags_before, _xla_flags_added
    if _xla_flags_before is not None and not jax_compat.backends_started():
        restored = xla_options.without(os.environ.get("XLA_FLAGS", ""), _xla_flags_added)
        if restored:
            os.environ["XLA_FLAGS"] = restored
        else:
            os.environ.pop("XLA_FLAGS", None)
    _xla_flags_before = None
    _xla_flags_added = ()


# -- the hook ------------------------------------------------------------------------


def run_hook(serialized: bytes, *, on_cpu: bool = False) -> bytes | None:
    """What the registered hook does with a module XLA compiles (for tools and tests
    that hold a module outside a compile): None when the plugin is off."""
    config = _config
    if config is None:
        return None
    return hook.transform(serialized, on_cpu=on_cpu, config=config, model=_model)


def _ensure_registered() -> None:
    """Register the compile hook once (per generation)."""
    global _registered_generation
    with _lock:
        if _registered_generation == _generation:
            return
        generation = _generation
        _registered_generation = generation
    # One hook for XLA:CPU and one for the GPU platforms: ffi mode lowers each
    # to its own runtime.
    for on_cpu in (True, False):

        def callback(serialized: bytes, on_cpu: bool = on_cpu) -> bytes | None:
            if generation != _generation:
                return None  # left over from before a disable()
            return run_hook(serialized, on_cpu=on_cpu)

        platforms = ["cpu"] if on_cpu else list(jax_compat.GPU_PLATFORMS)
        jax_compat.register_compile_hook(HOOK_NAME, callback, platforms)
