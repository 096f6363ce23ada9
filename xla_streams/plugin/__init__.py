"""The JAX plugin: turning xla_streams on and off in a process.

JAX imports this module through the ``jax_plugins`` entry point and calls
:func:`initialize` when it starts its backends. With
``XLA_STREAMS_COLLECTIVE_STREAMS=K`` in the environment (every setting is in
:mod:`xla_streams.plugin.settings`) an unmodified JAX program then gets, for every
module XLA compiles, the compile hook of :mod:`xla_streams.plugin.hook`.

Turning it on does four things:

1. the XLA options it needs go into ``XLA_FLAGS`` where the user has not set
   them, while XLA has not read it yet: for native mode the overlap limit K
   (without it the scheduler keeps one collective in flight, and there is
   nothing to spread) and K communication streams; from a tune result
   (``XLA_STREAMS_CONFIG``) its options. Each one added is logged. Where
   ``CUDA_DEVICE_MAX_CONNECTIONS=1`` puts every stream on one hardware queue, what
   that costs is said once;
2. the hook is registered for XLA:CPU and the GPU plugins, in a way that
   starts no backend (:mod:`xla_streams.jax_compat`): ``initialize()`` runs
   while JAX holds the lock that backend start-up takes;
3. the settings go into JAX's persistent cache key, and the modules of each
   entry written there are kept beside it, for the reports of a later hit
   (:mod:`xla_streams.plugin.cache`);
4. a bad setting found by ``initialize()`` is raised when JAX creates its first
   backend, as :class:`StartupError` (a ``SystemExit``), since JAX only logs what
   ``initialize()`` raises.

Nothing here imports JAX at module level: ``initialize()`` runs in every JAX
program of an environment where xla-streams is installed, and must be cheap
when the plugin is off.
"""

from __future__ import annotations

import os
import shlex
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from xla_streams import _log, jax_compat, runtime, xla_options
from xla_streams._log import logger
from xla_streams._version import __version__
from xla_streams.collectives import DEFAULT_STREAMS, StreamModel
from xla_streams.environment import unknown
from xla_streams.plugin import cache, hook
from xla_streams.plugin.settings import Config, ConfigError, ignored_env
from xla_streams.runtime.abi import ABI_VERSION

HOOK_NAME = "xla_streams"


class StartupError(SystemExit):
    """A bad setting found when JAX starts: ends the program with the message.

    A ``SystemExit`` because JAX turns any ``Exception`` raised while it starts a
    backend into a warning or into its own error with unrelated advice.
    """

    def __init__(self, message: str) -> None:
        super().__init__(f"xla_streams: {message}")
        self.message = message


# -- state -------------------------------------------------------------------------------


@dataclass
class _State:
    """Everything the plugin changes in this process. A change that spans fields is
    made under ``_lock``: JAX's compile hook and cache key read it from other threads."""

    config: Config | None = None  # the active settings; None while the plugin is off
    source: str = ""  # where ``config`` came from, for the log: "enable()", ...
    # Where XLA runs collectives in this process: the overlap limit in effect.
    model: StreamModel = field(default_factory=lambda: StreamModel(sync_on_compute=True))
    cache_key: str = ""  # the settings' part of JAX's persistent cache key (_cache_key_of)
    generation: int = 0  # bumped by disable(): stale registrations turn into no-ops
    registered_generation: int | None = None  # whose compile hook is registered; None: none
    startup_error: ConfigError | None = None  # raised when JAX starts its first backend
    fail_fast_installed: bool = False  # the check that raises it is installed (once)
    xla_flags_before: str | None = None  # XLA_FLAGS as it was before we added to it
    xla_flags_added: tuple[str, ...] = ()  # the flags we added, removed by disable()
    late_warning_given: bool = False  # XLA_FLAGS read before we could add to it: said once
    untuned_note_given: bool = False  # the overlap limit raised without a tune result: said once
    one_queue_note_given: bool = False  # CUDA_DEVICE_MAX_CONNECTIONS=1's cost: said once


_lock = threading.RLock()
_state = _State()


def current() -> Config | None:
    """The active settings, or None when the plugin is off."""
    return _state.config


# -- turning it on and off -----------------------------------------------------------


def initialize() -> None:
    """The ``jax_plugins`` entry point: read ``XLA_STREAMS_*`` and turn the plugin on.

    Never raises (JAX would only log it, and run the program without the plugin): a
    bad setting, or anything else that goes wrong here, is raised as
    :class:`StartupError` when JAX creates its first backend, which is before
    anything is compiled.
    """
    try:
        _initialize()
    except ConfigError as e:
        _fail_at_backend_start(e)
    except Exception as e:  # a bug, RecursionError, MemoryError: never run on silently
        _fail_at_backend_start(
            ConfigError(
                "",
                f"cannot turn the plugin on from the XLA_STREAMS_* variables: "
                f"{type(e).__name__}: {e}",
            )
        )


def _initialize() -> None:
    config = Config.from_env()  # with the plugin on, an unknown variable is an error
    if config is None:
        for misspelled in unknown().values():
            logger.warning("ignored: %s", misspelled)
        ignored = ignored_env()
        if ignored and _state.config is None:
            logger.warning(
                "%s set but the plugin is off; set XLA_STREAMS_COLLECTIVE_STREAMS=K to turn it on",
                ", ".join(ignored),
            )
        return
    if _state.config is not None:
        if _state.config != config:
            logger.warning(
                "keeping the settings from %s (%s); ignoring the environment's (%s)",
                _state.source,
                _state.config.describe(),
                config.describe(),
            )
        return
    _activate(config, "the environment")  # ConfigError: say, no report directory


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
    perf_table: str | os.PathLike[str] | None = None,
) -> Config:
    """Turn the plugin on in this process; returns the settings now active.

    ``collective_streams`` defaults to ``DEFAULT_STREAMS`` (4), or to what ``pipeline``
    or the tune result ``config`` says. Call it before the first JAX computation so that
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
        "perf_table": perf_table,
    }
    if collective_streams is None and pipeline is None and config is None:
        values["collective_streams"] = DEFAULT_STREAMS
    settings = Config.from_values(values, "keyword")
    assert settings is not None
    return _activate(settings, "enable()")


def enable_config(config: Config, source: str) -> Config:
    """Turn the plugin on with ready-made settings (used by ``xla_streams.plugin.flags``)."""
    return _activate(config, source)


def disable() -> None:
    """Turn the plugin off and remove the compile hook; the next compiles are untouched."""
    with _lock:
        _state.config = None
        _state.source = ""
        _state.generation += 1
        registered = _state.registered_generation is not None
        _state.registered_generation = None
        _restore_xla_flags()
    jax_compat.remove_cache_key_component(HOOK_NAME)
    if registered:
        jax_compat.clear_compile_hook(HOOK_NAME)


@contextmanager
def collective_streams(streams: int | None = DEFAULT_STREAMS, **options: Any) -> Iterator[Config]:
    """``with xla_streams.collective_streams(4): ...``: the plugin on inside the block.

    Takes the options of :func:`enable`; the previous state (off, or other
    settings) comes back on exit.
    """
    with _lock:
        previous, previous_source = _state.config, _state.source
    config = enable(streams, **options)
    try:
        yield config
    finally:
        if previous is None:
            disable()
        else:
            _activate(previous, previous_source)


def _activate(config: Config, source: str) -> Config:
    if config.report_dir is not None:
        try:
            os.makedirs(config.report_dir, exist_ok=True)
        except OSError as e:
            raise ConfigError(
                "report_dir",
                f"cannot create the report directory {config.report_dir}: {e.strerror}",
            ) from None
    _log.configure(config.log)
    _say_one_queue(config)
    if config.mode == "ffi":
        _load_ffi_runtime(config, source)
    with _lock:
        inherited = _inherited_xla_flags()
        _state.config = config
        _state.source = source
        _state.startup_error = None
        added = _apply_xla_options(config)
        _state.cache_key = _cache_key_of(config, _state.model)
    _ensure_registered()
    # What this process compiles with these settings is not what it compiles with
    # others (or off): each gets its own entries in JAX's persistent cache; what it
    # loads from there gets its reports all the same.
    jax_compat.add_cache_key_component(HOOK_NAME, _cache_key_component)
    cache.install(_settings_in_force)
    _say_started(config, source, added, inherited)
    return config


# CUDA's variable for how many hardware queues (connections) a process's CUDA streams
# share; Megatron-style recipes set it to 1.
MAX_CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"


def _say_one_queue(config: Config) -> None:
    """Says once what CUDA_DEVICE_MAX_CONNECTIONS=1 costs K collective streams: one
    hardware queue starts every device's work in its issue order, so collectives still
    run together once started, but an op waiting at the queue's head holds back the
    ones behind it. It cannot deadlock them: an SPMD program issues its collectives in
    the same order on every rank (NCCL's own condition across communicators), which
    the emulated CUDA runtime executes (docs/runtimes.md)."""
    one_queue = os.environ.get(MAX_CONNECTIONS, "").strip() == "1"
    if not one_queue or config.collective_streams == 1 or _state.one_queue_note_given:
        return
    _state.one_queue_note_given = True
    logger.info(
        "%s=1 puts every CUDA stream on one hardware queue: the %d collective streams keep "
        "their collectives running together, but an op waiting at the queue's head holds "
        "back the ones behind it, so they overlap less than with more queues",
        MAX_CONNECTIONS,
        config.collective_streams,
    )


def _load_ffi_runtime(config: Config, source: str) -> None:
    """ffi mode: register the host runtime's custom-call targets (and its timeout) now,
    not at the first compile, so that an executable JAX loads from its persistent
    cache, which no compile hook sees, finds them. The CUDA runtime registers at the
    first GPU compile (it reads the job's GPUs, which needs a started backend)."""
    try:
        runtime.register("host")
        runtime.set_timeout(config.timeout_s)
    except Exception as e:  # BuildError (no C++ compiler), a bad XLA_STREAMS_TIMEOUT_S
        mode = "XLA_STREAMS_MODE=ffi" if source == "the environment" else "mode ffi"
        raise ConfigError("mode", f"{mode} cannot load its runtime: {e}") from None


def _inherited_xla_flags() -> str:
    """XLA_FLAGS as the program set it: without what the plugin added. ConfigError
    naming XLA_FLAGS where it cannot be read (an unclosed quote)."""
    current = os.environ.get("XLA_FLAGS", "")
    try:
        xla_options.options_in(current)  # reads it the way every later step does
        return xla_options.without(current, _state.xla_flags_added).strip()
    except ValueError as e:
        raise ConfigError("XLA_FLAGS", f"XLA_FLAGS={current!r} cannot be read: {e}") from None


def _say_started(config: Config, source: str, added: list[str], inherited: str) -> None:
    """The start-up line: the settings, what went into XLA_FLAGS and what was there
    (in full), then what to know about them."""
    message = f"on ({config.describe()}), from {source}"
    if added:
        message += f"; added to XLA_FLAGS: {' '.join(added)}"
    if inherited:
        message += f"; inherited XLA_FLAGS={shlex.quote(inherited)}"
    logger.info("%s", message)
    raised = any(flag.startswith(f"--{xla_options.OVERLAP_LIMIT}=") for flag in added)
    if (
        raised
        and config.config is None
        and config.collective_streams > xla_options.XLA_DEFAULT_OVERLAP_LIMIT
        and not _state.untuned_note_given
    ):
        _state.untuned_note_given = True
        logger.info(
            "the overlap limit is raised to %d (XLA's default: %d) with no prediction that "
            "it pays for this program: more collectives in flight also take more memory. "
            "To check it: `xla-streams tune train.py --devices=N --json=tune.json`, then "
            "run with XLA_STREAMS_CONFIG=tune.json",
            config.collective_streams,
            xla_options.XLA_DEFAULT_OVERLAP_LIMIT,
        )
    dumps = [
        f"--{name}={value}" if value != "true" else f"--{name}"
        for name, value in xla_options.options_in(inherited).items()
        if name.startswith("xla_dump_")
    ]
    if dumps:
        logger.warning(
            "the inherited XLA_FLAGS dump modules (%s): XLA writes files for every module "
            "it compiles, which slows every compile and can fill the disk; drop them from "
            "XLA_FLAGS unless you want the dumps",
            " ".join(dumps),
        )


def _cache_key_of(config: Config, model: StreamModel) -> str:
    """What decides the executable a compile with ``config`` gives (``model`` is the
    overlap limit in effect), for the persistent cache's key. The same in every
    process of a job: no report directory, no tune file path (its options are in),
    and not what only decides what is logged or whether an error is raised (log,
    strict, the timeout: the runtime's, not the executable's)."""
    pipeline = ",".join(p.spec() for p in config.pipeline.build()) if config.pipeline else ""
    options = ",".join(f"{name}={value!r}" for name, value in sorted(config.xla_options.items()))
    parts = [
        f"version={__version__}",
        f"streams={config.collective_streams}",
        f"policy={config.policy}",
        f"mode={config.mode}",
        f"pipeline={pipeline}",
        f"xla_options={options}",
        f"model={model!r}",
    ]
    if config.mode == "ffi":
        parts.append(f"abi={ABI_VERSION}")
    return ";".join(parts)


def _settings_in_force() -> tuple[Config, StreamModel] | None:
    """The settings and the stream model in force, for the cache's reports; None when off."""
    with _lock:
        return None if _state.config is None else (_state.config, _state.model)


def _cache_key_component() -> str:
    """The plugin's part of JAX's persistent cache key: empty while it is off (then
    keys are JAX's own)."""
    return _state.cache_key if _state.config is not None else ""


def _fail_at_backend_start(error: ConfigError) -> None:
    """Stop the program with ``error`` when JAX starts its first backend (it prints
    the message then, once)."""
    with _lock:
        _state.startup_error = error
        if _state.fail_fast_installed:
            return
        _state.fail_fast_installed = True

    def check() -> None:
        error = _state.startup_error
        if error is not None:
            raise StartupError(str(error))

    try:
        jax_compat.check_before_backend_start(check)
    except Exception as e:  # JAX's internals moved: at least say it, loudly
        logger.error("%s (the plugin is off; it could not stop the program: %s)", error, e)


# -- XLA options ---------------------------------------------------------------------


def _apply_xla_options(config: Config) -> list[str]:
    """Add what ``config`` needs to XLA_FLAGS while XLA has not read it yet; sets the
    stream model from the overlap limit that will be in effect."""
    # A tune result's options win over native mode's defaults (its overlap limit is
    # what its prediction was made with).
    native = xla_options.native_mode(config.collective_streams) if config.mode == "native" else {}
    wanted = {**native, **config.xla_options}
    current_flags = os.environ.get("XLA_FLAGS", "")
    # Ours from an earlier enable() are replaced, not kept as the user's.
    base = xla_options.without(current_flags, _state.xla_flags_added)
    new, added, users = xla_options.with_options(base, wanted)
    # The user's collective performance table: XLA's own scheduler prices collectives
    # from the same measurements as the reports. A path is not the one word
    # with_options takes; the setting has checked that XLA_FLAGS can carry it.
    table_option = "xla_gpu_experimental_collective_perf_table_path"
    if config.perf_table is not None and table_option not in xla_options.options_in(base):
        token = f"--{table_option}={config.perf_table}"
        new = " ".join([new.strip(), token]).strip()
        added = [*added, token]
    started = jax_compat.backends_started()
    # The limit in effect: the user's own where they set one (unreadable: XLA's default),
    # else ours while XLA has not read XLA_FLAGS yet, else XLA's default.
    if xla_options.OVERLAP_LIMIT in users:
        limit = xla_options.overlap_limit_in(base)
        if limit is not None and limit < config.collective_streams:
            logger.warning(
                "XLA_FLAGS sets --%s=%d, below the %d collective streams: at most %d "
                "collectives are in flight at once",
                xla_options.OVERLAP_LIMIT,
                limit,
                config.collective_streams,
                limit,
            )
    elif not started:
        limit = xla_options.overlap_limit_of(wanted.get(xla_options.OVERLAP_LIMIT))
    else:
        limit = None
    _state.model = StreamModel(
        overlap_limit=xla_options.XLA_DEFAULT_OVERLAP_LIMIT if limit is None else limit,
        sync_on_compute=True,
    )
    if started:
        if added and not _state.late_warning_given:
            _state.late_warning_given = True
            logger.warning(
                "JAX has started already and XLA has read XLA_FLAGS, so %s cannot take effect "
                "in this process; set XLA_STREAMS_COLLECTIVE_STREAMS (or call "
                "xla_streams.enable) before the first JAX computation",
                " ".join(added),
            )
        return []
    if _state.xla_flags_before is None:
        _state.xla_flags_before = current_flags
    if new != current_flags:
        os.environ["XLA_FLAGS"] = new
    _state.xla_flags_added = tuple(added)
    return added


def _restore_xla_flags() -> None:
    if _state.xla_flags_before is not None and not jax_compat.backends_started():
        restored = xla_options.without(os.environ.get("XLA_FLAGS", ""), _state.xla_flags_added)
        if restored:
            os.environ["XLA_FLAGS"] = restored
        else:
            os.environ.pop("XLA_FLAGS", None)
    _state.xla_flags_before = None
    _state.xla_flags_added = ()


# -- the hook ------------------------------------------------------------------------


def run_hook(serialized: bytes, *, on_cpu: bool = False) -> bytes | None:
    """What the registered hook does with a module XLA compiles (for tools and tests
    that hold a module outside a compile): None when the plugin is off."""
    config = _state.config
    if config is None:
        return None
    return hook.transform(serialized, on_cpu=on_cpu, config=config, model=_state.model)


def _ensure_registered() -> None:
    """Register the compile hook once (per generation)."""
    with _lock:
        if _state.registered_generation == _state.generation:
            return
        generation = _state.generation
        _state.registered_generation = generation
    # One hook for XLA:CPU and one for the GPU platforms: ffi mode lowers each
    # to its own runtime.
    for on_cpu in (True, False):

        def callback(serialized: bytes, on_cpu: bool = on_cpu) -> bytes | None:
            if generation != _state.generation:
                return None  # left over from before a disable()
            cache.saw_module(serialized, on_cpu=on_cpu)
            return run_hook(serialized, on_cpu=on_cpu)

        platforms = ["cpu"] if on_cpu else list(jax_compat.GPU_PLATFORMS)
        jax_compat.register_compile_hook(HOOK_NAME, callback, platforms)
