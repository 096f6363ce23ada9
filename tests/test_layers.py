"""The layers of the package hold: each module imports only modules of its own layer or
below, the import graph has no loop, and the compile hook never reaches the CLI.

Read from the source (``ast``), every import counted, those inside functions too.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "xla_streams"

# Lowest first. A module may import its own layer and the layers before it.
LAYERS: list[set[str]] = [
    {"hlo"},  # the IR: imports nothing of ours
    {"collectives", "_io", "_log", "xla_options", "jax_compat", "xla_module", "cli_flags"},
    {"pipeline"},
    {"passes"},
    {"report", "simulate", "runtime"},
    {"config", "hook", "aot", "programs", "tuning"},
    {"plugin", "flags", "demo"},
    {"cli", "__main__"},
]
# The one import upwards: the pass registry and default_pipeline load the pass
# modules on first use (the passes import the pipeline's base class).
ALLOWED_UPWARDS = {("pipeline", "passes")}


def _part(module: str) -> str:
    """``xla_streams.simulate.html`` -> ``simulate``: the layer part of a module name."""
    return module.split(".")[1] if module.count(".") else module


def _imports() -> dict[str, set[str]]:
    """Each module of the package (dotted) -> the xla_streams modules it imports."""
    files = {
        ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
        for p in sorted(PACKAGE.rglob("*.py"))
    }
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found |= {f"{node.module}.{a.name}" for a in node.names}  # submodules
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[name] = {m for m in found if m in files and m != "xla_streams"}
    return graph


def _layer(module: str) -> int:
    part = _part(module)
    for i, layer in enumerate(LAYERS):
        if part in layer:
            return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def test_every_import_goes_down_the_layers() -> None:
    upwards = []
    for module, imported in _imports().items():
        if module == "xla_streams":
            continue  # the package's lazy public names (PEP 562)
        for target in imported:
            edge = (_part(module), _part(target))
            if _layer(target) > _layer(module) and edge not in ALLOWED_UPWARDS:
                upwards.append(f"{module} imports {target}")
    assert upwards == []


def test_the_import_graph_has_no_loop_between_layers_parts() -> None:
    graph: dict[str, set[str]] = {}
    for module, imported in _imports().items():
        if module != "xla_streams":
            graph.setdefault(_part(module), set()).update(
                _part(t) for t in imported if _part(t) != _part(module)
            )
    for start in graph:
        if (start, "passes") in ALLOWED_UPWARDS:
            graph[start].discard("passes")
    seen: set[str] = set()
    stack: list[str] = []

    def visit(node: str) -> None:
        assert node not in stack, f"import loop: {' -> '.join([*stack, node])}"
        if node in seen:
            return
        stack.append(node)
        for child in sorted(graph.get(node, ())):
            visit(child)
        stack.pop()
        seen.add(node)

    for node in sorted(graph):
        visit(node)


def test_the_compile_hook_never_reaches_the_cli() -> None:
    graph = _imports()
    reached: set[str] = set()
    todo = ["xla_streams.hook", "xla_streams.plugin"]
    while todo:
        module = todo.pop()
        if module in reached:
            continue
        reached.add(module)
        todo.extend(t for t in graph.get(module, ()) if t in graph)
    assert not {m for m in reached if _part(m) in ("cli", "demo")}
