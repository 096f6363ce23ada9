"""The tuner's disk cache of compiled candidates: a second ``xla-streams tune`` of an
unchanged program compiles nothing.

An entry is what one deviceless compile gave (the scheduled module's text, XLA's
memory figures and XLA's own estimate of its step, or XLA's refusal of the options),
stored under a key that is the SHA-256 of everything the compile depends on:

- the program: the SHA-256 of its StableHLO text, the ids of the devices it is
  assigned to and the compiler options ``jax.jit`` was given;
- the target: the SHA-256 of its GpuTargetConfigProto text and the topology shape;
- the compiler: the versions of every installed ``jax*`` distribution (jax, jaxlib,
  the CUDA plugin) and what the process's environment tells XLA and JAX
  (``XLA_FLAGS`` and the ``JAX_*`` settings that change a compile);
- the candidate's options, every searched one spelled out.

Files are ``<folder>/<key[:2]>/<key>.json.gz``, written atomically (a temporary file
beside it, then a rename), so concurrent tuners share a folder safely. An entry
(schema ``xla_streams.tune_cache.v2``) is what :meth:`Compiled.to_json` or
:meth:`Refused.to_json` writes; one that cannot be read is treated as missing (so
is an entry of the first version, which had no XLA estimate).
JAX-free.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import importlib.metadata
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from xla_streams import _json
from xla_streams.environment import CACHE_DIR
from xla_streams.tuning.result import XlaOpinion

CACHE_SCHEMA = "xla_streams.tune_cache.v2"
# JAX settings from the environment that do not change what XLA compiles.
_NEUTRAL_JAX_ENV = frozenset(
    {
        "JAX_PLATFORMS",
        "JAX_DUMP_IR_TO",
        "JAX_DUMP_IR_MODES",
        "JAX_INCLUDE_DEBUG_INFO_IN_DUMPS",
        "JAX_COMPILATION_CACHE_DIR",
        "JAX_ENABLE_COMPILATION_CACHE",
        "JAX_LOGGING_LEVEL",
        "JAX_TRACEBACK_FILTERING",
    }
)


@dataclass(frozen=True)
class Compiled:
    """One candidate's deviceless compile: the scheduled module as ``compiled.as_text()``
    prints it, XLA's memory figures per GPU (argument, output, alias, temp, heap peak),
    the seconds the compile took, XLA's own estimate of its step (None where there is
    none, and ``xla_missing`` says why), whether the cache may keep it (``lasting``:
    not when this package could not read the schedule XLA wrote, which a later version
    may), and whether it came from the cache."""

    text: str
    memory: tuple[int, int, int, int, int]
    compile_s: float
    xla: XlaOpinion | None = None
    xla_missing: str = ""
    lasting: bool = True
    cached: bool = False

    def to_json(self) -> dict[str, object]:
        """This compile's cache entry."""
        xla = self.xla
        return {
            "schema": CACHE_SCHEMA,
            "text": self.text,
            "memory": list(self.memory),
            "compile_s": self.compile_s,
            "xla_estimate": None
            if xla is None
            else {**xla.to_json(), "spans": [list(span) for span in xla.spans]},
            "xla_missing": self.xla_missing,
        }

    @classmethod
    def from_json(cls, doc: _json.Value) -> Compiled:
        """A compile's cache entry, as :meth:`to_json` writes it (``cached`` is the
        reader's to say); the document's error at the field that is wrong."""
        doc.schema(CACHE_SCHEMA)
        memory = [m.integer() for m in doc["memory"].items()]
        if len(memory) != 5:
            doc["memory"].fail("expected 5 integers: argument, output, alias, temp, heap peak")
        argument, output, alias, temp, peak = memory
        figures = (argument, output, alias, temp, peak)
        xla = doc["xla_estimate"].nullable(_xla_estimate)
        missing = doc["xla_missing"].string()
        return cls(doc["text"].string(), figures, doc["compile_s"].number(), xla, missing)


def _xla_estimate(doc: _json.Value) -> XlaOpinion:
    spans = []
    for span in doc["spans"].items():
        parts = span.items()
        if len(parts) != 3:
            span.fail("expected [start, span_us, runs]")
        start, span_us, runs = parts
        spans.append((start.string(), span_us.number(0), runs.integer(0)))
    opinion = XlaOpinion.from_json(doc)
    return dataclasses.replace(opinion, spans=tuple(spans))


class Refused(Exception):
    """XLA refused to compile the program with these options (its first line)."""

    def to_json(self) -> dict[str, object]:
        """This refusal's cache entry."""
        return {"schema": CACHE_SCHEMA, "refused": str(self)}

    @classmethod
    def from_json(cls, doc: _json.Value) -> Refused:
        """A refusal's cache entry, as :meth:`to_json` writes it."""
        doc.schema(CACHE_SCHEMA)
        return cls(doc["refused"].string())


def default_folder() -> Path:
    """``$XLA_STREAMS_CACHE_DIR``, else ``$XDG_CACHE_HOME/xla_streams/tune``, else
    ``~/.cache/xla_streams/tune``."""
    chosen = CACHE_DIR.from_env()
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "xla_streams" / "tune"


def compiler_identity() -> dict[str, object]:
    """What, besides the program and the options, decides what XLA compiles here."""
    versions = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name == "jax" or name.startswith(("jax-", "jaxlib")):
            versions[name] = dist.version
    env = {
        k: v
        for k, v in sorted(os.environ.items())
        if k == "XLA_FLAGS" or (k.startswith("JAX_") and k not in _NEUTRAL_JAX_ENV)
    }
    return {"versions": dict(sorted(versions.items())), "environment": env}


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class CompileCache:
    """Compiled candidates on disk, under ``folder`` (see the module docstring)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.stores = 0

    def key(self, base: Mapping[str, object], options: Mapping[str, object]) -> str:
        """The key of compiling the program ``base`` describes with ``options``."""
        material = {
            "schema": CACHE_SCHEMA,
            "base": base,
            "options": {k: [type(v).__name__, v] for k, v in sorted(options.items())},
        }
        return digest(json.dumps(material, sort_keys=True, default=str))

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json.gz"

    def has(self, key: str) -> bool:
        return self._path(key).is_file()

    def load(self, key: str) -> Compiled | Refused | None:
        """The entry under ``key``: a compile, XLA's refusal, or None (none or unreadable)."""
        path = self._path(key)
        try:
            with gzip.open(path, "rt", encoding="utf-8") as f:
                doc = _json.loads(f.read(), os.fspath(path))
            if doc.get("refused") is not None:
                return Refused.from_json(doc)
            return dataclasses.replace(Compiled.from_json(doc), cached=True)
        except (OSError, EOFError, ValueError):
            return None

    def store(self, key: str, value: Compiled | Refused) -> None:
        """Write ``value`` under ``key``; a folder that cannot be written is skipped (the
        cache only saves time)."""
        data = value.to_json()
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb") as f:
                    f.write(json.dumps(data).encode("utf-8"))
                os.replace(temporary, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise
        except OSError:
            return
        self.stores += 1
