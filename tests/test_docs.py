"""The samples in README.md and docs/ are made by the code, here.

A sample is the block right after a line ``<!-- sample: NAME -->``: a fenced block, or
a Markdown table. :data:`SAMPLES` makes each one again (running the command the block
shows, or formatting what the code holds) and the test compares it with the doc. After
a change of output, one command rewrites every sample::

    XLA_STREAMS_UPDATE_DOCS=1 .venv/bin/python -m pytest -q tests/test_docs.py

Only what truly varies between runs is normalized: timings and temporary folders.
Also checked here: the tune doc names every lever and every tuner option, every
relative link in the docs resolves, and no doc points outside the repository.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from test_layers import LAYERS  # tests/ is on the path (pyproject.toml)

from xla_streams import cli
from xla_streams.cli.tune import OPTION_FLAGS
from xla_streams.collectives import StreamModel
from xla_streams.environment import BY_ENV, SETTINGS, VARIABLES
from xla_streams.hlo import parse_module
from xla_streams.simulate.errors import MODEL_ERRORS
from xla_streams.simulate.targets import TARGETS
from xla_streams.streams import find_async_pairs
from xla_streams.tuning.levers import LEVER_NAMES, collective_census, levers
from xla_streams.tuning.options import OPTIONS, TuneOptions
from xla_streams.tuning.result import TuneResult, load_tune_result

REPO = Path(__file__).resolve().parent.parent
DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
UPDATE = os.environ.get("XLA_STREAMS_UPDATE_DOCS") == "1"
# What `xla-streams tune --program=fsdp_tp_mlp_scan ...` wrote with --json (see docs/tune.md).
TUNE_RESULT = REPO / "tests" / "data" / "tune_fsdp_tp_mlp_scan.json"

_MARK = re.compile(r"^<!-- sample: ([a-z0-9-]+) -->\n", re.MULTILINE)
_FENCED = re.compile(r"```[a-z]*\n(.*?)^```\n", re.MULTILINE | re.DOTALL)
_TABLE = re.compile(r"((?:\|.*\n)+)")


class Block(NamedTuple):
    name: str
    start: int  # the body's span in the doc's text
    end: int
    body: str


def blocks(text: str) -> Iterator[Block]:
    """The samples of a doc, in order."""
    for mark in _MARK.finditer(text):
        found = _FENCED.match(text, mark.end()) or _TABLE.match(text, mark.end())
        assert found, f"<!-- sample: {mark[1]} --> is not followed by a fenced block or a table"
        yield Block(mark[1], found.start(1), found.end(1), found[1])


# -- running what a sample shows --------------------------------------------------------


def _environment(**extra: str) -> dict[str, str]:
    """This process's environment without the settings that would change the output."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("XLA_STREAMS_") and k != "XLA_FLAGS"
    }
    return {**env, "JAX_PLATFORMS": "cpu", **extra}


def _run(line: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``line`` (``xla-streams ...`` or ``python ...``) from the repository root, with this
    checkout's interpreter."""
    argv = shlex.split(line)
    program = {"xla-streams": [sys.executable, "-m", "xla_streams"], "python": [sys.executable]}
    done = subprocess.run(
        [*program[argv[0]], *argv[1:]],
        cwd=REPO,
        env=_environment(**env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{line}: exit {done.returncode}\n{done.stderr}"
    return done


def command(line: str) -> str:
    """``$ line`` and what it prints."""
    return f"$ {line}\n{_run(line).stdout}"


# -- the samples ----------------------------------------------------------------------------


def _cell(text: str) -> str:
    """``text`` in a Markdown table cell, as written: ``|`` escaped everywhere, ``<`` and
    ``>`` outside code spans (``<module>`` is not a tag)."""
    spans = re.split(r"(`[^`]*`)", text)
    return "".join(
        span if span.startswith("`") else re.sub(r"([<>])", r"\\\1", span) for span in spans
    ).replace("|", "\\|")


def settings_table() -> str:
    """Every variable the package reads: its name, its keyword (a setting of the plugin),
    what it takes, its default as typed, its help."""
    rows = [
        "| variable | `enable()` keyword | takes | default | what it does |",
        "|---|---|---|---|---|",
    ]
    for v in VARIABLES:
        keyword = f"`{v.name}`" if v in SETTINGS else "-"
        default = v.default_shown()
        rows.append(
            f"| `{v.env}` | {keyword} | {_cell(v.reader.takes)} "
            f"| {'-' if default is None else f'`{default}`'} | {_cell(v.help)} |"
        )
    return "\n".join(rows) + "\n"


@functools.cache
def _demo() -> tuple[str, str]:
    """``xla-streams demo`` without a GPU: its standard output and error, its new
    temporary report folder (``/tmp/xla_streams_demo_<random>``) as
    ``/tmp/xla_streams_demo_XXXXXXXX`` and the module's digest in report names as
    ``DIGEST`` (it hashes the module text, whose source locations name the folder the
    package runs from)."""
    with tempfile.TemporaryDirectory() as tmp:
        done = _run("xla-streams demo", TMPDIR=tmp, CUDA_VISIBLE_DEVICES="")
        folder = re.compile(re.escape(tmp) + r"/xla_streams_demo_\w+")
        digest = re.compile(r"(jit_\w+)\.[0-9a-f]{16}\.")
        out, err = (
            digest.sub(r"\1.DIGEST.", folder.sub("/tmp/xla_streams_demo_XXXXXXXX", s))
            for s in (done.stdout, done.stderr)
        )
    return out, err


def demo() -> str:
    """What ``make demo`` prints (standard output)."""
    return "$ xla-streams demo\n" + _demo()[0]


def demo_end() -> str:
    """The end of what ``make demo`` prints: the predictions, from its heading on."""
    out = _demo()[0]
    return "$ xla-streams demo\n...\n" + out[out.index("What it buys") :]


def plugin_log() -> str:
    """What the plugin prints during the demo's compile (standard error)."""
    return _demo()[1]


@functools.cache
def _gpu_check_dry_run() -> tuple[str, dict[str, object]]:
    """``tools/gpu_check.py --dry-run OUT_DIR``: what it prints (timings as 0.0) and its
    gpu_check.json."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "OUT_DIR")
        printed = _run(f"python tools/gpu_check.py --dry-run {out}").stdout
        record = json.loads((out / "gpu_check.json").read_text())
    printed = printed.replace(f"{tmp}/", "")
    printed = re.sub(r"\[gpu_check +\d+\.\ds\]", "[gpu_check    0.0s]", printed)
    printed = re.sub(r"\(\d+\.\d+ s\)", "(0.0 s)", printed)
    return printed, record


def gpu_check_dry_run() -> str:
    """What the GPU check's dry run prints."""
    return "$ python tools/gpu_check.py --dry-run OUT_DIR\n" + _gpu_check_dry_run()[0]


def gpu_checks_table() -> str:
    """What each check of the GPU check proves, and what it does not, as its records say."""
    checks = _gpu_check_dry_run()[1]["checks"]
    assert isinstance(checks, list)
    rows = ["| check | proves | does not prove |", "|---|---|---|"]
    rows += [
        f"| `{c['name']}` | {_cell(c['proves'])} | {_cell(c['does_not_prove'])} |" for c in checks
    ]
    return "\n".join(rows) + "\n"


def levers_table() -> str:
    """The levers as the tuner builds them for XLA's default compile of fsdp_scan (8 GPUs
    in one NVLink domain): what each sets, the settings it tries, and whether it can act."""
    path = REPO / "hlo_fixtures" / "fsdp_scan.default.text.hlo"
    module = parse_module(path.read_text(), str(path))
    pairs = find_async_pairs(module, StreamModel(overlap_limit=1, sync_on_compute=True))
    census = collective_census(module, pairs, domain_size=8)
    rows = ["| lever | XLA options | settings tried | for fsdp_scan |", "|---|---|---|---|"]
    for lever in levers(census):
        options = ", ".join(f"`{o}`" for o in sorted(lever.options))
        skip = lever.skip(census)
        verdict = f"skipped: {skip}" if skip else "searched"
        rows.append(
            f"| `{lever.name}` | {options} | {_cell(', '.join(lever.labels[1:]))} | {_cell(verdict)} |"
        )
    return "\n".join(rows) + "\n"


def targets_table() -> str:
    """The cost model's GPUs: their datasheet numbers and the sources they cite."""
    rows = [
        "| target | GPU | dense BF16 | HBM | NVLink each way | network per GPU | GPUs per host "
        "| XLA's table | sources |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in TARGETS.values():
        rows.append(
            f"| `{t.name}` | {t.gpu} | {t.matrix_flops['bf16'] / 1e12:g} TFLOP/s "
            f"| {t.memory_bandwidth / 1e12:g} TB/s | {t.nvlink_bandwidth / 1e9:g} GB/s "
            f"| {t.network_bandwidth / 1e9:g} GB/s | {t.devices_per_host} "
            f"| {t.perf_table_key or 'none'} | {_cell('; '.join(t.sources))} |"
        )
    return "\n".join(rows) + "\n"


# The Target fields that are modelling assumptions, not datasheet numbers.
ASSUMPTIONS = (
    "matrix_efficiency",
    "sustained_matrix_fraction",
    "memory_efficiency",
    "link_efficiency",
    "network_efficiency",
    "kernel_overhead",
)


def model_assumptions_table() -> str:
    """The cost model's assumptions, per target."""
    rows = [
        "| field | " + " | ".join(f"`{name}`" for name in TARGETS) + " |",
        "|---|" + "---:|" * len(TARGETS),
    ]
    for field in ASSUMPTIONS:
        values = [getattr(t, field) for t in TARGETS.values()]
        shown = [f"{v * 1e6:g} us" if field == "kernel_overhead" else f"{v:g}" for v in values]
        rows.append(f"| `{field}` | " + " | ".join(shown) + " |")
    return "\n".join(rows) + "\n"


def layers_table() -> str:
    """The layers tests/test_layers.py keeps, lowest first."""
    rows = ["| layer | parts |", "|---:|---|"]
    rows += [
        f"| {i} | {', '.join(f'`{p}`' for p in sorted(layer))} |"
        for i, layer in enumerate(LAYERS, 1)
    ]
    return "\n".join(rows) + "\n"


def _first_sentence(path: Path) -> str:
    """The first sentence of a module's docstring, Sphinx roles as plain code."""
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc, f"{path.relative_to(REPO)} has no docstring"
    paragraph = " ".join(doc.split("\n\n")[0].split())
    sentence = re.match(r"(.+?[.!?])(?:\s|$)", paragraph)
    text = sentence[1] if sentence else paragraph
    # As Sphinx shows them: :mod:`a.b` as `a.b`, :func:`~a.b.c` as `c`.
    text = re.sub(r":[a-z]+:`~(?:[\w.]+\.)?(\w+)`", r"`\1`", text)
    text = re.sub(r":[a-z]+:`([\w.]+)`", r"`\1`", text)
    return text.replace("``", "`")


def files_table() -> str:
    """Every module of the package, every pass and every tool, by its docstring."""
    paths = [
        *sorted((REPO / "xla_streams").rglob("*.py")),
        *sorted((REPO / "passes").glob("*.py")),
        *sorted((REPO / "tools").rglob("*.py")),
    ]
    rows = ["| file | what it is |", "|---|---|"]
    rows += [f"| `{p.relative_to(REPO)}` | {_cell(_first_sentence(p))} |" for p in paths]
    return "\n".join(rows) + "\n"


def tune_options_table() -> str:
    """Every option of TuneOptions: its keyword, its flag, its default as typed there,
    what it takes, its help."""
    flags = {o.name for o in OPTION_FLAGS}
    rows = ["| keyword | flag | default | takes | what it does |", "|---|---|---|---|---|"]
    for option in OPTIONS.values():
        flag = f"`--{option.flag_name}`" if option.name in flags else "-"
        default = option.default_shown()
        rows.append(
            f"| `{option.name}` | {flag} | {'-' if default is None else f'`{default}`'} "
            f"| {_cell(option.reader.takes)} | {_cell(option.help)} |"
        )
    return "\n".join(rows) + "\n"


def error_bounds_table() -> str:
    """The simulator's stated errors, each with its source."""
    rows = ["| input | factor on its time (low - high) | source |", "|---|---|---|"]
    rows += [f"| `{b.name}` | {b.low:g} - {b.high:g} | {_cell(b.source)} |" for b in MODEL_ERRORS]
    return "\n".join(rows) + "\n"


def what_if_table() -> str:
    """`python tools/whatif_table.py`: every fixture on H100 (the table, not its title)."""
    printed = _run("python tools/whatif_table.py").stdout
    return "".join(line for line in printed.splitlines(keepends=True) if line.startswith("|"))


def _tune_result() -> TuneResult:
    return load_tune_result(TUNE_RESULT)


TUNE_COMMAND = (
    "xla-streams tune --program=fsdp_tp_mlp_scan --jobs=1 --cache-dir=none --json=tune.json"
)


def tune_table() -> str:
    """What that command printed (its --json, formatted as the command formats it)."""
    return f"$ {TUNE_COMMAND}\n" + _tune_result().table()


def tune_recommendation() -> str:
    """The same, from its recommendation on (the table of candidates left out)."""
    table = _tune_result().table()
    return f"$ {TUNE_COMMAND}\n...\n" + table[table.index("recommended:") :]


SAMPLES: dict[str, Callable[[], str]] = {
    "cli-help": lambda: command("xla-streams --help"),
    "settings": settings_table,
    "plugin-log": plugin_log,
    "demo": demo,
    "demo-end": demo_end,
    "report": lambda: command(
        "xla-streams report hlo_fixtures/tp_dp_2d.limit4.text.hlo --streams=4"
    ),
    "simulate": lambda: command(
        "xla-streams simulate hlo_fixtures/tp_dp_2d.limit4.text.hlo --streams=1,2,4 "
        "--sync-on-compute"
    ),
    "targets": targets_table,
    "model-assumptions": model_assumptions_table,
    "error-bounds": error_bounds_table,
    "layers": layers_table,
    "files": files_table,
    "what-if": what_if_table,
    "levers": levers_table,
    "tune-options": tune_options_table,
    "tune-help": lambda: command("xla-streams tune --help"),
    "tune": tune_table,
    "tune-recommendation": tune_recommendation,
    "gpu-check-dry-run": gpu_check_dry_run,
    "gpu-checks": gpu_checks_table,
}


# -- the tests ----------------------------------------------------------------------------


def test_every_sample_in_the_docs_is_one_the_code_makes() -> None:
    unknown = [
        (d.name, b.name) for d in DOCS for b in blocks(d.read_text()) if b.name not in SAMPLES
    ]
    assert unknown == []


@pytest.mark.slow
@pytest.mark.parametrize("name", SAMPLES)
def test_the_docs_show_what_the_code_prints(name: str) -> None:
    shown = [d for d in DOCS if any(b.name == name for b in blocks(d.read_text()))]
    assert shown, f"no doc shows the sample {name}"
    made = SAMPLES[name]()
    for doc in shown:
        text = doc.read_text()
        if UPDATE:
            for b in reversed([b for b in blocks(text) if b.name == name]):
                text = text[: b.start] + made + text[b.end :]
            doc.write_text(text)
        else:
            for b in blocks(text):
                if b.name == name:
                    assert b.body == made, (
                        f"{doc.name}: sample {name} is stale; see this file's docstring"
                    )


def test_the_tune_doc_names_every_lever_and_option() -> None:
    doc = (REPO / "docs" / "tune.md").read_text()
    options = [f.name for f in dataclasses.fields(TuneOptions)]
    assert [name for name in (*LEVER_NAMES, *options) if f"`{name}`" not in doc] == []


# A command line of the docs, `xla-streams CMD ...` (up to the end of its code span or
# line), and a flag in it (not XLA's: those are spelled with '_').
_COMMAND = re.compile(r"xla-streams ([a-z]+)([^`\n]*)")
_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9_-]*)")


def test_the_docs_write_only_flags_their_command_has() -> None:
    wrong = []
    for doc in DOCS:
        for line in _COMMAND.finditer(doc.read_text()):
            command = cli.COMMANDS.get(line[1])
            if command is None:
                continue
            known = {o.flag_name for o in command.flags()} | {"help"}
            wrong += [
                f"{doc.name}: xla-streams {line[1]} --{flag}"
                for flag in _FLAG.findall(line[2])
                if "_" not in flag and flag not in known and flag.removeprefix("no") not in known
            ]
    assert wrong == []


def test_the_docs_name_only_variables_of_the_table() -> None:
    """Every XLA_STREAMS_* name the docs write is one the package reads, but this file's
    own (the tests' variables are not the package's)."""
    named = {n for d in DOCS for n in re.findall(r"\bXLA_STREAMS_[A-Z_]*[A-Z]\b", d.read_text())}
    assert named - set(BY_ENV) == {"XLA_STREAMS_UPDATE_DOCS"}


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(doc: Path) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings."""
    headings = re.findall(r"^#+ (.+)$", doc.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_relative_link_resolves(doc: Path) -> None:
    """Every link to a file of the repository names one that exists, and a heading of it
    where it names one."""
    broken = []
    for link in _LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = doc.parent / path if path else doc
        if not target.exists() or (
            anchor and target.suffix == ".md" and anchor not in _anchors(target)
        ):
            broken.append(link)
    assert broken == []


def test_no_doc_points_outside_the_repository() -> None:
    outside = re.compile(r"\.\./shared|/work/")
    assert [d.name for d in DOCS if outside.search(d.read_text())] == []
