"""docs/formats.md against the code, so that the page cannot go stale: it names every
format the package and the tools write, and in each format's section every field of
the format's dataclasses (followed into the dataclasses its fields hold) and the
dataclasses themselves."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from unittest import mock

import pytest

from xla_streams import report
from xla_streams.plugin import cache as plugin_cache
from xla_streams.simulate import calibration, prediction
from xla_streams.tuning import cache, result

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "formats.md"
SCHEMA_NAME = re.compile(r"xla_streams\.[a-z_]+\.v[0-9]+")


def _tool(name: str) -> ModuleType:
    """tools/<name>.py as a module (its dataclasses look themselves up in sys.modules),
    the environment as it was (tune_grid.py sets JAX_PLATFORMS for its own run)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        with mock.patch.dict(os.environ):
            spec.loader.exec_module(module)
    return sys.modules[name]


# Each format and the dataclass that is its file.
FORMATS: dict[str, Callable[[], type]] = {
    report.SCHEMA: lambda: report.AssignmentReport,
    report.INDEX_SCHEMA: lambda: report.ReportIndex,
    prediction.SCHEMA: lambda: prediction.Prediction,
    result.SCHEMA: lambda: result.TuneResult,
    cache.CACHE_SCHEMA: lambda: cache.Compiled,
    calibration.SCHEMA: lambda: calibration.Calibration,
    "xla_streams.gpu_check.v1": lambda: _tool("gpu_check").GpuCheckReport,
    "xla_streams.published.v2": lambda: _tool("predict_published").PublishedTable,
    "xla_streams.tune_grid.v1": lambda: _tool("tune_grid").TuneGrid,
    "xla_streams.cached_modules.v1": lambda: plugin_cache.CachedModule,
}


def _section(schema: str) -> str:
    """The part of the page under ``## <schema>``."""
    parts = re.split(r"^## ", DOC.read_text(), flags=re.M)
    found = [p for p in parts if p.split("\n", 1)[0].strip() == schema]
    assert found, f"docs/formats.md has no section '## {schema}'"
    return found[0]


def _dataclasses(top: type) -> list[type]:
    """``top`` and every dataclass its fields hold, at any depth (in an optional, a
    tuple, a mapping...), each once."""
    found: list[type] = []
    todo = [top]
    while todo:
        cls = todo.pop()
        if cls in found:
            continue
        found.append(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            stack = [hints[f.name]]
            while stack:
                hint = stack.pop()
                stack.extend(typing.get_args(hint))
                if dataclasses.is_dataclass(hint) and isinstance(hint, type):
                    todo.append(hint)
    return found


def test_every_format_in_the_source_has_its_section() -> None:
    sources = [*(REPO / "xla_streams").rglob("*.py"), *(REPO / "tools").glob("*.py")]
    written = {m for path in sources for m in SCHEMA_NAME.findall(path.read_text())}
    assert written == set(FORMATS), "a format without an entry in FORMATS, or the reverse"
    for schema in sorted(written):
        _section(schema)
        assert f"`{schema}`" in DOC.read_text().split("## ", 1)[0], f"{schema}: not in the table"


@pytest.mark.parametrize("schema", sorted(FORMATS))
def test_the_section_names_the_dataclasses_and_every_field(schema: str) -> None:
    section = _section(schema)
    top = FORMATS[schema]()
    for cls in _dataclasses(top):
        assert f"`{cls.__name__}`" in section or cls is top, f"{schema}: {cls.__name__}"
        missing = [f.name for f in dataclasses.fields(cls) if f"`{f.name}`" not in section]
        assert not missing, f"{schema}: {cls.__name__}'s fields not in docs/formats.md: {missing}"
    table = DOC.read_text().split("## ", 1)[0]
    assert re.search(rf"^\| `{re.escape(schema)}` \| [^|]*\b{top.__name__}`", table, re.M), (
        f"{schema}: the table does not name {top.__name__}"
    )


@pytest.mark.parametrize(
    "path", sorted((REPO / "tests" / "tuning" / "data").glob("grid_*.json")), ids=lambda p: p.name
)
def test_a_recorded_grid_is_what_tune_grid_writes(path: Path) -> None:
    """The grids the search is tested against are files of ``TuneGrid``, byte for byte."""
    tool = _tool("tune_grid")
    data = json.loads(path.read_text())
    assert data.pop("schema") == tool.SCHEMA
    grid = tool.TuneGrid(
        **{
            **data,
            "levers": tuple(data["levers"]),
            "best": tool.GridPoint(**data["best"]),
            "grid": tuple(tool.GridPoint(**point) for point in data["grid"]),
        }
    )
    assert grid.to_json() == path.read_text()
