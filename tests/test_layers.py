"""The architecture as a test: each module imports only its own layer or those below,
no import loop runs between the parts of the package, the simulator and the tuner
call the stream analyses and never a pass, the package imports its own modules at
the top of a module unless a reason is written down, the compile hook never reaches
the CLI, JAX's internals are touched in ``jax_compat.py`` alone, and the tools use
the package as any user's program would.

Read from the source (``ast``), every import counted, those inside functions too.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Lowest first. A module may import its own layer and the layers before it. An entry
# is a part of the package (a subpackage or a top-level module) or, where one module
# of a part sits elsewhere than the rest, that module.
LAYERS: list[set[str]] = [
    # nothing of ours; option: how every option is declared and read; _version: the
    # version, which the plugin and the CLI read
    {"_io", "_json", "_log", "_text", "_version", "_wire", "xla_options", "jax_compat", "option"},
    {"hlo"},  # the IR
    # what a collective is; what the ffi runtime runs; every environment variable we
    # read; what XLA's dumps say it ran
    {"collectives", "runtime.abi", "environment", "xla_dump"},
    {"streams"},  # the analyses: pairs, the deadlock rule, the assignment, verification
    {"simulate", "runtime", "aot", "programs"},  # the simulator calls the analyses
    {"tuning"},  # JAX-free but for the compiles of its candidates
    {"passes"},  # each pass a thin ModulePass over streams, and their shared base
    {"pipeline"},  # the registry, specs, the manager
    {"report"},  # a compilation's assignment, as JSON and text
    {"plugin"},  # reads tune results through tuning.result
    {"cli", "__main__"},
]
# Parts that reach the analyses directly and never through a pass.
WITHOUT_PASSES = ("simulate", "tuning")
# Imports of the package's own modules inside a function, (importer, imported) -> why
# it cannot sit at the top of the importer: the command line's start-up (an offline
# command loads only what it runs; tests/cli checks that none loads JAX), the compile
# hook's (it runs in every JAX process with the plugin on, most without reports), or
# a cycle.
LAZY_IMPORTS: dict[tuple[str, str], str] = {
    ("xla_streams.cli", "xla_streams.aot"): "start-up: the demo's flags only",
    ("xla_streams.cli", "xla_streams.programs"): "start-up: the demo's flags only",
    ("xla_streams.cli", "xla_streams.cli.demo"): "start-up: JAX, for the demo only",
    ("xla_streams.cli", "xla_streams.cli.simulate"): "start-up: the simulator, for simulate",
    ("xla_streams.cli", "xla_streams.cli.calibrate"): "start-up: the simulator, for calibrate",
    ("xla_streams.cli", "xla_streams.cli.tune"): "start-up: the tuner, for tune",
    ("xla_streams.cli.opt", "xla_streams.report"): "start-up: opt writes no report (10 ms)",
    ("xla_streams.__main__", "xla_streams.cli"): "start-up: imported with the collector off",
    ("xla_streams.cli", "xla_streams.streams"): (
        "start-up: the analyses (and dataclasses), when a command failed verification only"
    ),
    ("xla_streams.pipeline", "xla_streams.streams"): (
        "start-up: the analyses (and dataclasses), when a pass failed verification only"
    ),
    ("xla_streams.plugin.hook", "xla_streams.report"): "reports: with a report directory only",
    ("xla_streams.plugin.hook", "xla_streams.simulate.measured"): "the simulator: HTML only",
    ("xla_streams.plugin.hook", "xla_streams.simulate.visual"): "the simulator: HTML only",
    ("xla_streams.plugin.hook", "xla_streams.simulate.targets"): (
        "the simulator: on a GPU only, for the target of its kind"
    ),
    ("xla_streams.plugin.settings", "xla_streams.simulate.measured"): (
        "the simulator: only with the perf_table setting"
    ),
    ("xla_streams.hlo.reader", "xla_streams.hlo.layout"): (
        "the reader of hand-written layouts: only when XLA's own printing does not parse"
    ),
    ("xla_streams.runtime", "xla_streams.runtime.build"): (
        "the C++ build (argparse, sysconfig, subprocess): only when a library is missing"
    ),
}
_JAX_INTERNALS = ("jax._src", "jaxlib.")


def _modules() -> dict[str, Path]:
    """Every module of the package (dotted name -> file); passes/ is ``xla_streams.passes``
    through the link ``xla_streams/passes``, which ``rglob`` does not follow."""
    found = {}
    for root, package in (
        (REPO / "xla_streams", "xla_streams"),
        (REPO / "passes", "xla_streams.passes"),
    ):
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join((package, *parts)).removesuffix(".__init__")] = path
    return found


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}  # submodules
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


@functools.cache  # read once for every test here
def _graph() -> dict[str, set[str]]:
    """Each module of the package -> the modules of the package it imports. The package
    itself is left out: it only names the public API, loaded on first use (PEP 562)."""
    modules = _modules()
    del modules["xla_streams"]
    return {m: {t for t in _imported(p) if t in modules and t != m} for m, p in modules.items()}


def _entry(module: str) -> str:
    """The LAYERS entry a module belongs to: the longest one that names it."""
    inner = module.removeprefix("xla_streams.")
    entries = [e for layer in LAYERS for e in layer if inner == e or inner.startswith(e + ".")]
    assert entries, f"{module} is in no layer: add it to LAYERS"
    return max(entries, key=len)


def _layer(module: str) -> int:
    entry = _entry(module)
    return next(i for i, layer in enumerate(LAYERS) if entry in layer)


def test_every_import_goes_down_the_layers() -> None:
    upwards = [
        f"{module} imports {target}"
        for module, targets in _graph().items()
        for target in targets
        if _layer(target) > _layer(module)
    ]
    assert upwards == []


def test_no_import_loop_between_parts() -> None:
    graph: dict[str, set[str]] = {}
    for module, targets in _graph().items():
        graph.setdefault(_entry(module), set()).update(
            _entry(t) for t in targets if _entry(t) != _entry(module)
        )
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
    graph = _graph()
    reached: set[str] = set()
    todo = ["xla_streams.plugin.hook", "xla_streams.plugin"]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo.extend(graph.get(module, ()))
    assert not {m for m in reached if _entry(m) in ("cli", "__main__")}


def test_jax_internals_are_touched_in_jax_compat_alone() -> None:
    touching = set()
    for module, path in _modules().items():
        text = path.read_text()
        if module != "xla_streams.jax_compat" and any(name in text for name in _JAX_INTERNALS):
            touching.add(module)
    assert touching == set()


def test_tools_import_the_package_at_the_top_and_nothing_private() -> None:
    private = []
    for path in sorted((REPO / "tools").rglob("*.py")):
        tree = ast.parse(path.read_text())
        top_level = set(map(id, tree.body))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            ours = [n for n in names if n.split(".")[0] == "xla_streams"]
            if ours and id(node) not in top_level:
                private.append(f"{path.relative_to(REPO)}:{node.lineno} imports inside a function")
            private += [
                f"{path.relative_to(REPO)}:{node.lineno} {n}"
                for n in ours
                if any(part.startswith("_") for part in n.split(".")[1:])
            ]
    assert private == []


def test_the_simulator_and_the_tuner_import_no_pass() -> None:
    reaching = sorted(
        f"{module} imports {target}"
        for module, targets in _graph().items()
        if _entry(module).split(".")[0] in WITHOUT_PASSES
        for target in targets
        if _entry(target) == "passes"
    )
    assert reaching == []


def _function_level_imports(path: Path, modules: set[str]) -> set[str]:
    """The package's own modules that ``path`` imports inside a function."""
    found = set()
    for function in ast.walk(ast.parse(path.read_text())):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names]
                found |= {n for n in names if n in modules} or {node.module}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
    return {m for m in found if m.split(".")[0] == "xla_streams"}


def test_the_package_imports_itself_at_the_top_unless_a_reason_is_written() -> None:
    modules = _modules()
    lazy = {
        (module, target)
        for module, path in modules.items()
        for target in _function_level_imports(path, set(modules))
    }
    assert sorted(lazy - LAZY_IMPORTS.keys()) == []  # move it up, or say why not
    assert sorted(LAZY_IMPORTS.keys() - lazy) == []  # an entry nothing needs
