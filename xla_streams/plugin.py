"""The JAX plugin: run the stream-assignment pipeline inside XLA's compile.

JAX imports this module through the ``jax_plugins`` entry point and calls
:func:`initialize` when it starts its backends. With
``XLA_STREAMS_COLLECTIVE_STREAMS=K`` in the environment (see
:mod:`xla_streams.config` for every setting) an unmodified JAX program then
gets, for every module XLA compiles:

1. XLA's scheduled module (``PipelineStage.POST_SCHEDULER``) as a serialized
   ``HloModuleProto``, printed to HLO text with large constants in full;
2. the pipeline ``find-async-pairs,assign-streams{streams=K},verify-streams,
   annotate-streams`` run over it, which writes ``_xla_stream_annotation="k"``
   on each collective's start and done;
3. the text parsed back by XLA and handed on, or nothing (module unchanged)
   when no instruction changed;
4. with ``XLA_STREAMS_REPORT_DIR``, ``<module>.<fingerprint>.json`` (schema
   ``xla_streams.assignment.v1``) and ``.txt`` written atomically.

Native mode needs two XLA options, which :func:`initialize` (or
:func:`enable` before JAX starts) adds to ``XLA_FLAGS`` unless the user set
them: ``--xla_gpu_experimental_parallel_collective_overlap_limit=K`` (without
it the scheduler keeps one collective in flight, and there is nothing to
spread) and ``--xla_gpu_executable_num_communication_streams=K`` (the
executable borrows at least K communication streams, so ``communication_stream[k]``
exists for every k < K).

An internal error never breaks a compile: it is logged with the module's name
and the module goes on unchanged; ``XLA_STREAMS_STRICT=1`` makes it fail the
compile instead. A bad setting stops the program when JAX starts its backends
(JAX only logs what ``initialize()`` raises, so the error is raised from a
backend-initialization hook as :class:`StartupError`, a ``SystemExit``, which
JAX does not catch).

Nothing here imports JAX at module level: ``initialize()`` runs in every JAX
program of an environment where xla-streams is installed, and must be cheap
when the plugin is off.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from absl import logging

from xla_streams import xla_module
from xla_streams.config import Config, ConfigError, ignored_env

if TYPE_CHECKING:
    from xla_streams.pipeline import Compilation

HOOK_NAME = "xla_streams"
# jax registers a hook on a plugin client when `client.platform` is in this list, and
# jaxlib 0.10.2 reports CUDA and ROCm clients as "gpu" (a compatibility shim: the
# compile-only CUDA client says 'gpu' too), so "cuda"/"rocm" alone would never match
# them; clearing, on the other hand, looks the backend up by its name, "cuda".
PLATFORMS = ("cpu", "cuda", "rocm", "gpu")
OVERLAP_LIMIT_FLAG = "xla_gpu_experimental_parallel_collective_overlap_limit"
COMMUNICATION_STREAMS_FLAG = "xla_gpu_executable_num_communication_streams"
NATIVE_XLA_FLAGS = (OVERLAP_LIMIT_FLAG, COMMUNICATION_STREAMS_FLAG)
_FINGERPRINT_CHARS = 16


class StartupError(SystemExit):
    """A bad setting found when JAX starts: ends the program with the message.

    A ``SystemExit`` because JAX turns any ``Exception`` raised while it starts a
    backend into a warning or into its own error with unrelated advice.
    """

    def __init__(self, message: str) -> None:
        super().__init__(f"xla_streams: {message}")
        self.message = message


class PluginError(RuntimeError):
    """Raised from inside XLA's compile in strict mode; XLA reports it as the compile's error."""


@dataclass
class Stats:
    """What the hook has done in this process (for tests and the demo)."""

    calls: int = 0
    changed: int = 0
    unchanged: int = 0
    failed: int = 0
    reports: list[str] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)
    seconds: float = 0.0  # time spent in the hook


@dataclass(frozen=True)
class Processed:
    """The outcome of the pipeline on one module's text."""

    name: str
    text: str | None  # the new module text; None when nothing changed
    compilation: Compilation
    fingerprint: str
    reports: tuple[str, ...] = ()


# -- state -------------------------------------------------------------------------------

_lock = threading.RLock()
_config: Config | None = None
_source = ""
_generation = 0  # bumped by disable(): stale registrations turn into no-ops
_registered_generation: int | None = None
_startup_error: ConfigError | None = None
_fail_fast_installed = False
_stats = Stats()
_xla_flags_before: str | None = None  # XLA_FLAGS as it was before we added to it
_xla_flags_added: tuple[str, ...] = ()
_late_warning_given = False


def current() -> Config | None:
    """The active settings, or None when the plugin is off."""
    return _config


def stats() -> Stats:
    """A copy of the hook's counters."""
    with _lock:
        return Stats(
            _stats.calls,
            _stats.changed,
            _stats.unchanged,
            _stats.failed,
            list(_stats.reports),
            list(_stats.modules),
            _stats.seconds,
        )


def reset_stats() -> None:
    global _stats
    with _lock:
        _stats = Stats()


# -- turning it on and off -----------------------------------------------------------


def initialize() -> None:
    """The ``jax_plugins`` entry point: read ``XLA_STREAMS_*`` and turn the plugin on.

    Never raises (JAX would only log it): a bad setting is logged now and
    raised as :class:`StartupError` when JAX initializes its first backend,
    which is before anything is compiled.
    """
    global _startup_error
    try:
        config = Config.from_env()
    except ConfigError as e:
        with _lock:
            _startup_error = e
        logging.error("xla_streams: %s", e)
        _install_fail_fast()
        return
    if config is None:
        ignored = ignored_env()
        if ignored and _config is None:
            logging.warning(
                "xla_streams: %s set but the plugin is off; set "
                "XLA_STREAMS_COLLECTIVE_STREAMS=K to turn it on",
                ", ".join(ignored),
            )
        return
    if _config is not None:
        if _config != config:
            logging.warning(
                "xla_streams: keeping the settings from %s (%s); ignoring the environment's (%s)",
                _source,
                _config.describe(),
                config.describe(),
            )
        return
    try:
        _activate(config, "the environment")
    except ConfigError as e:  # the report directory cannot be created
        with _lock:
            _startup_error = e
        logging.error("xla_streams: %s", e)
        _install_fail_fast()


def enable(
    collective_streams: int | None = None,
    *,
    policy: str | None = None,
    mode: str | None = None,
    pipeline: str | None = None,
    report_dir: str | os.PathLike[str] | None = None,
    report_html: bool | None = None,
    strict: bool | None = None,
) -> Config:
    """Turn the plugin on in this process; returns the settings now active.

    ``collective_streams`` defaults to 4 (or to what ``pipeline`` says). Call it
    before the first JAX computation so that the XLA options it needs are read
    (see the module docstring); later calls still annotate every new compile but
    cannot change XLA's options any more, and say so. Raises ConfigError.
    """
    values: dict[str, Any] = {
        "collective_streams": collective_streams,
        "policy": policy,
        "mode": mode,
        "pipeline": pipeline,
        "report_dir": report_dir,
        "report_html": report_html,
        "strict": strict,
    }
    if collective_streams is None and pipeline is None:
        values["collective_streams"] = 4
    config = Config.from_values(values, "kwarg")
    assert config is not None
    return _activate(config, "enable()")


def enable_config(config: Config, source: str) -> Config:
    """Turn the plugin on with ready-made settings (used by ``xla_streams.flags``)."""
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
        _clear_hook()


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
    with _lock:
        _config = config
        _source = source
        _startup_error = None
        added = _apply_xla_flags(config)
    _ensure_registered()
    message = f"xla_streams: on ({config.describe()}), from {source}"
    if added:
        logging.warning("%s; added to XLA_FLAGS: %s", message, " ".join(added))
    else:
        logging.info("%s", message)
    return config


# -- XLA options ---------------------------------------------------------------------


def native_xla_flags(streams: int) -> dict[str, str]:
    """The XLA options native mode needs for ``streams`` collective streams."""
    return {OVERLAP_LIMIT_FLAG: str(streams), COMMUNICATION_STREAMS_FLAG: str(streams)}


def xla_flags_with(
    current_flags: str, wanted: Mapping[str, str]
) -> tuple[str, list[str], dict[str, str]]:
    """``current_flags`` with each ``--name=value`` of ``wanted`` the user has not set.

    Returns the new XLA_FLAGS, the flags added, and the user's own values for
    the wanted names they did set.
    """
    tokens = shlex.split(current_flags) if current_flags.strip() else []
    present: dict[str, str] = {}
    for token in tokens:
        match = re.fullmatch(r"--?([A-Za-z0-9_]+)(?:=(.*))?", token)
        if match:
            present[match.group(1)] = match.group(2) if match.group(2) is not None else "true"
    added = [f"--{name}={value}" for name, value in wanted.items() if name not in present]
    users = {name: present[name] for name in wanted if name in present}
    new = " ".join([current_flags.strip(), *added]).strip() if added else current_flags
    return new, added, users


def _apply_xla_flags(config: Config) -> list[str]:
    """Add the native-mode options to XLA_FLAGS while XLA has not read it yet."""
    global _xla_flags_before, _xla_flags_added, _late_warning_given
    wanted = native_xla_flags(config.collective_streams)
    current_flags = os.environ.get("XLA_FLAGS", "")
    # Ours from an earlier enable() are replaced, not kept as the user's.
    base = _without(current_flags, _xla_flags_added)
    new, added, users = xla_flags_with(base, wanted)
    low = users.get(OVERLAP_LIMIT_FLAG)
    if low is not None and low.isdigit() and int(low) < config.collective_streams:
        logging.warning(
            "xla_streams: XLA_FLAGS sets --%s=%s, below the %d collective streams: at most %s "
            "collectives are in flight at once",
            OVERLAP_LIMIT_FLAG,
            low,
            config.collective_streams,
            low,
        )
    if _backends_started():
        if added and not _late_warning_given:
            _late_warning_given = True
            logging.warning(
                "xla_streams: JAX has started already and XLA has read XLA_FLAGS, so %s cannot "
                "take effect in this process; set XLA_STREAMS_COLLECTIVE_STREAMS (or call "
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
    if _xla_flags_before is not None and not _backends_started():
        current_flags = os.environ.get("XLA_FLAGS", "")
        restored = _without(current_flags, _xla_flags_added)
        if restored:
            os.environ["XLA_FLAGS"] = restored
        else:
            os.environ.pop("XLA_FLAGS", None)
    _xla_flags_before = None
    _xla_flags_added = ()


def _without(flags_text: str, ours: tuple[str, ...]) -> str:
    if not ours:
        return flags_text
    tokens = shlex.split(flags_text) if flags_text.strip() else []
    return " ".join(shlex.quote(t) for t in tokens if t not in ours)


def _backends_started() -> bool:
    """True once JAX has created a backend (XLA has then parsed XLA_FLAGS)."""
    import sys

    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is None:
        return False
    started: Callable[[], bool] | None = getattr(bridge, "backends_are_initialized", None)
    return bool(started()) if started is not None else bool(getattr(bridge, "_backends", None))


# -- the hook ------------------------------------------------------------------------


def _ensure_registered() -> None:
    """Register the compile hook once (per generation)."""
    global _registered_generation
    with _lock:
        if _registered_generation == _generation:
            return
        generation = _generation
        _registered_generation = generation
    from jax.extend.xla import PipelineStage, register_hlo_module_transformation

    # One hook for XLA:CPU and one for the GPU platforms: ffi mode lowers each
    # to its own runtime.
    for on_cpu in (True, False):

        def callback(serialized: bytes, on_cpu: bool = on_cpu) -> bytes | None:
            if generation != _generation:
                return None  # left over from before a disable()
            return transform(serialized, on_cpu)

        platforms = ["cpu"] if on_cpu else [p for p in PLATFORMS if p != "cpu"]
        register_hlo_module_transformation(
            callback, name=HOOK_NAME, stage=PipelineStage.POST_SCHEDULER, platforms=platforms
        )


def _clear_hook() -> None:
    from jax.extend.xla import PipelineStage, clear_hlo_module_transformation

    # Clearing other platforms asks JAX for its backends, which would start them.
    platforms = list(PLATFORMS) if _backends_started() else ["cpu"]
    clear_hlo_module_transformation(
        HOOK_NAME, stage=PipelineStage.POST_SCHEDULER, platforms=platforms
    )


def _install_fail_fast() -> None:
    global _fail_fast_installed
    with _lock:
        if _fail_fast_installed:
            return
        _fail_fast_installed = True
    from jax._src import xla_bridge

    def check(client: Any) -> None:
        error = _startup_error
        if error is not None:
            raise StartupError(str(error))

    xla_bridge.register_backend_initialization_hook(check)


# How an async start's opcode is stored in an HloInstructionProto (field 2, a string).
_ASYNC_OPCODES = tuple(
    b"\x12" + bytes([len(op)]) + op
    for op in (
        b"all-reduce-start",
        b"all-gather-start",
        b"collective-permute-start",
        b"async-start",
        b"send",
        b"recv",
    )
)


def _has_async(serialized: bytes) -> bool:
    """Whether a serialized module may hold an async collective (false positives are fine)."""
    return any(op in serialized for op in _ASYNC_OPCODES)


def transform(serialized: bytes, on_cpu: bool = False) -> bytes | None:
    """The compile hook: a serialized HloModuleProto in, the changed one (or None) out."""
    config = _config
    if config is None:
        return None
    begin = time.perf_counter()
    try:
        return _transform(serialized, config, on_cpu)
    finally:
        with _lock:
            _stats.seconds += time.perf_counter() - begin


def _transform(serialized: bytes, config: Config, on_cpu: bool) -> bytes | None:
    name = "<unparsed module>"
    with _lock:
        _stats.calls += 1
    skippable = config.mode == "native" and config.report_dir is None and config.pipeline is None
    if skippable and not _has_async(serialized):
        with _lock:
            _stats.unchanged += 1
        return None  # nothing to assign and no report to write: skip printing and parsing
    try:
        name, text = xla_module.module_text(serialized)
        spec = config.pipeline_spec(on_cpu)
        if config.mode == "ffi":
            from xla_streams import runtime

            # Before XLA emits the custom calls, their targets must be registered.
            runtime.register("host" if on_cpu else "cuda")
            assignment = xla_module.device_assignment(serialized)
            devices = assignment.device_ids if assignment is not None else ()
            spec = spec.replace("{devices}", ":".join(map(str, devices)))
        processed = process_text(text, config, name=name, write=False, spec=spec)
        out = xla_module.to_proto(processed.text) if processed.text is not None else None
        # Only once XLA has read the module back: a report describes what runs.
        if config.report_dir is not None:
            _reports_or_warn(processed.compilation, name, processed.fingerprint, config)
    except Exception as e:
        with _lock:
            _stats.failed += 1
        reason = f"{type(e).__name__}: {e}"
        if config.strict:
            raise PluginError(f"xla_streams failed on module {name}: {reason}") from e
        logging.warning("xla_streams: module %s left unchanged: %s", name, reason)
        return None
    with _lock:
        _stats.modules.append(name)
        if out is None:
            _stats.unchanged += 1
        else:
            _stats.changed += 1
    return out


def process_text(
    text: str,
    config: Config,
    *,
    name: str | None = None,
    write: bool = True,
    spec: str | None = None,
) -> Processed:
    """Run ``config``'s pipeline on one module's HLO text; with ``write``, write its reports.

    Pure apart from the reports: the same text and settings give the same
    output and the same report bytes in every process.
    """
    from xla_streams.hlo import parse_module
    from xla_streams.pipeline import Compilation, PassManager

    module = parse_module(text, f"<module {name}>" if name else "<module>")
    name = module.name
    pipeline = spec if spec is not None else config.pipeline_spec()
    compilation = PassManager.from_spec(pipeline).run(Compilation(module))
    out = module.print()
    digest = fingerprint(text)
    reports: tuple[str, ...] = ()
    if write and config.report_dir is not None:
        reports = _reports_or_warn(compilation, name, digest, config)
    return Processed(name, out if out != text else None, compilation, digest, reports)


def fingerprint(text: str) -> str:
    """A stable short hash of a module's text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:_FINGERPRINT_CHARS]


def report_paths(report_dir: str, module_name: str, digest: str) -> tuple[str, str]:
    """``<dir>/<module>.<fingerprint>.json`` and ``.txt``."""
    safe = re.sub(r"[^A-Za-z0-9_.\-]", "_", module_name) or "module"
    base = os.path.join(report_dir, f"{safe}.{digest}")
    return base + ".json", base + ".txt"


def write_reports(compilation: Compilation, report_dir: str, digest: str) -> tuple[str, str]:
    """Write the v1 JSON report and the text table of ``compilation``, atomically."""
    from xla_streams._io import atomic_write_many
    from xla_streams.report import build_report, format_report, to_json

    report = build_report(compilation)
    json_path, text_path = report_paths(report_dir, compilation.module.name, digest)
    os.makedirs(report_dir, exist_ok=True)
    atomic_write_many([(json_path, to_json(report)), (text_path, format_report(report))])
    return json_path, text_path


def _reports_or_warn(
    compilation: Compilation, name: str, digest: str, config: Config
) -> tuple[str, ...]:
    assert config.report_dir is not None
    if compilation.assignment is None:
        logging.info("xla_streams: no report for module %s: the pipeline assigns no streams", name)
        return ()
    try:
        paths = write_reports(compilation, config.report_dir, digest)
    except OSError as e:
        if config.strict:
            raise
        logging.warning("xla_streams: cannot write the report of module %s: %s", name, e)
        return ()
    logging.info("xla_streams: module %s: report %s", name, paths[0])
    with _lock:
        _stats.reports.append(paths[0])
    if config.report_html:
        return paths + _visual_report_or_warn(compilation, name, paths[0], config)
    return paths


def _visual_report_or_warn(
    compilation: Compilation, name: str, json_path: str, config: Config
) -> tuple[str, ...]:
    """The Perfetto trace and HTML timeline beside the JSON report (optional extras:
    a failure here is logged, never a failed compile unless strict)."""
    from xla_streams.simulate.command import write_visual_report

    stem = os.path.basename(json_path).removesuffix(".json")
    try:
        trace, page = write_visual_report(compilation, os.path.dirname(json_path), stem)
    except Exception as e:
        if config.strict:
            raise
        logging.warning("xla_streams: no trace/HTML for module %s: %s", name, e)
        return ()
    logging.info("xla_streams: module %s: timeline %s", name, page)
    return str(trace), str(page)
