"""xla-streams against XLA's own HLO text tools: parse, print, opt and assign, as ratios.

One run prints one table: for every section, the median of ``--repeat`` timed
runs of ours and of the reference (runs interleaved, after one warm-up each),
and the ratio ours / reference against the section's target::

    python tools/bench.py                      # the largest hlo_fixtures/*.hlo
    python tools/bench.py path/to/module.hlo --repeat 9
    python tools/bench.py --only parse-print --profile parse-print
    python tools/bench.py --list

(``python tools/bench.py text ...`` is the same: this is the default suite.)

Sections (``--only NAME``, repeatable):

  parse-print          in-process: parse_module(text).print() vs
                       jaxlib._hlo.hlo_module_from_text(text).to_string()
  parse-print-process  whole processes: `python -c` parse + print with our front end
                       (which must not import jax) vs the same with jaxlib's parser
  opt                  whole process: `xla-streams opt IN -p ''` (parse, print, write)
                       vs XLA's parse + print whole process (target 0.6)
  assign               whole process: `xla-streams assign IN --streams=4` (module + JSON
                       written) vs XLA's parse + print whole process
  opt-net              the stricter ratio, which measures us against XLA's C++ itself:
                       (`xla-streams opt IN -p ''` - a bare `python -c pass`) /
                       (XLA's parse + print process - a process that only imports
                       jaxlib's _hlo) (target 0.6)
  assign-net           the same for `xla-streams assign IN --streams=4` (target 1.0)

The ``-net`` sections time four processes per round, alternately, and take the
ratio of the differences of their medians. ``--busy`` keeps one more core busy (a
spinning child process) while the sections run, as a loaded machine would be.

jax >= 0.11 prints an async all-reduce with an attribute its own parser rejects
(``output_to_operand_aliasing={{1}: (0, {})}``): XLA is given the text without it.

To add a section, write two ``(Bench) -> Callable[[], None]`` factories (set-up
outside the returned callable, the timed work inside it) and append a
``Section`` to ``SECTIONS``.

``--check`` makes the exit status 1 when a ratio misses its target.
"""

from __future__ import annotations

import compileall
import contextlib
import cProfile
import os
import pstats
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.runner import REPO, interleaved, machine, measure, suite_parser, verdict
from xla_streams.hlo import parse_module, parse_shape

FIXTURES = REPO / "hlo_fixtures"

Timed = Callable[[], None]


@dataclass
class Bench:
    """What every section gets: the input and a scratch directory."""

    path: Path
    text: str
    tmp: Path
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    target: float  # the ratio ours / reference must stay at or below this
    ours: Callable[[Bench], Timed]
    reference: Callable[[Bench], Timed]
    ours_command: Callable[[Bench], str]
    reference_command: Callable[[Bench], str]
    in_process: bool = False  # --profile works only for in-process sections
    # Net sections: each side minus its base (a process that does everything but the
    # work compared), and the ratio is (ours - ours_base) / (reference - reference_base).
    ours_base: Callable[[Bench], Timed] | None = None
    reference_base: Callable[[Bench], Timed] | None = None
    ours_base_command: Callable[[Bench], str] = lambda b: ""
    reference_base_command: Callable[[Bench], str] = lambda b: ""

    @property
    def net(self) -> bool:
        return self.ours_base is not None and self.reference_base is not None


# -- in-process parse + print ---------------------------------------------------------


def _clear_front_end_caches() -> None:
    """Forget shapes seen by earlier runs, so every run parses from cold."""
    cached = getattr(parse_shape, "cache_clear", None)
    if cached is not None:
        cached()


def ours_parse_print(b: Bench) -> Timed:
    text, path = b.text, str(b.path)

    def run() -> None:
        _clear_front_end_caches()
        out = parse_module(text, path).print()
        assert len(out) == len(text)

    return run


def xla_parse_print(b: Bench) -> Timed:
    from jaxlib import _hlo

    text = re.sub(UNPARSABLE, "", b.text)

    def run() -> None:
        _hlo.hlo_module_from_text(text).to_string()

    return run


# -- whole processes ---------------------------------------------------------------------

# Both read the file, parse it and print it to a string; neither writes anything.
OURS_SNIPPET = """\
import sys
from xla_streams.hlo import parse_module
path = sys.argv[1]
with open(path, encoding="utf-8", newline="") as f:
    text = f.read()
out = parse_module(text, path).print()
assert len(out) == len(text)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib", "numpy"))
if heavy:
    sys.exit(f"our parse + print imported {heavy[:5]}")
"""
UNPARSABLE = r", output_to_operand_aliasing=\{\{1\}: \(0, \{\}\)\}"
XLA_SNIPPET = f"""\
import re, sys
from jaxlib import _hlo
with open(sys.argv[1], encoding="utf-8", newline="") as f:
    text = re.sub({UNPARSABLE!r}, "", f.read())
_hlo.hlo_module_from_text(text).to_string()
"""


# The base of XLA's side: the interpreter and jaxlib's _hlo imported, nothing parsed.
XLA_IMPORT_SNIPPET = """\
import re, sys
from jaxlib import _hlo
"""


def _process(argv: list[str], env: dict[str, str]) -> Timed:
    def run() -> None:
        result = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv)} exited {result.returncode}:\n{result.stderr}")

    return run


def _ours_process_argv(b: Bench) -> list[str]:
    return [b.python, "-c", OURS_SNIPPET, str(b.path)]


def _xla_process_argv(b: Bench) -> list[str]:
    return [b.python, "-c", XLA_SNIPPET, str(b.path)]


def _xla_import_argv(b: Bench) -> list[str]:
    return [b.python, "-c", XLA_IMPORT_SNIPPET, str(b.path)]


def _bare_argv(b: Bench) -> list[str]:
    return [b.python, "-c", "pass"]


def xla_import_process(b: Bench) -> Timed:
    return _process(_xla_import_argv(b), b.env)


def bare_process(b: Bench) -> Timed:
    return _process(_bare_argv(b), b.env)


def ours_parse_print_process(b: Bench) -> Timed:
    return _process(_ours_process_argv(b), b.env)


def xla_parse_print_process(b: Bench) -> Timed:
    return _process(_xla_process_argv(b), b.env)


def _snippet_command(argv: list[str], what: str) -> str:
    return f"{shlex.quote(argv[0])} -c <{what}> {shlex.quote(argv[-1])}"


# -- xla-streams assign ---------------------------------------------------------------------


def _assign_argv(b: Bench) -> list[str]:
    out, js = b.tmp / "assign.out.hlo", b.tmp / "assign.out.json"
    return [
        b.python, "-m", "xla_streams", "assign", str(b.path),
        "--streams=4", f"--output={out}", f"--json={js}",
    ]  # fmt: skip


def ours_assign(b: Bench) -> Timed:
    return _process(_assign_argv(b), b.env)


def _opt_argv(b: Bench) -> list[str]:
    out = b.tmp / "opt.out.hlo"
    return [b.python, "-m", "xla_streams", "opt", str(b.path), "-p", "", f"--output={out}"]


def ours_opt(b: Bench) -> Timed:
    return _process(_opt_argv(b), b.env)


def _console_script(b: Bench) -> list[str]:
    """How a user starts us: the ``xla-streams`` console script beside the interpreter
    (run by that interpreter, as its shebang says), else ``python -m xla_streams``."""
    script = Path(b.python).parent / "xla-streams"
    return [b.python, str(script)] if script.is_file() else [b.python, "-m", "xla_streams"]


def _opt_net_argv(b: Bench) -> list[str]:
    out = b.tmp / "opt-net.out.hlo"
    return [*_console_script(b), "opt", str(b.path), "-p", "", f"--output={out}"]


def _assign_net_argv(b: Bench) -> list[str]:
    out, js = b.tmp / "assign-net.out.hlo", b.tmp / "assign-net.out.json"
    return [
        *_console_script(b), "assign", str(b.path), "--streams=4", f"--output={out}",
        f"--json={js}",
    ]  # fmt: skip


def _xla_net_command(b: Bench) -> str:
    return _snippet_command(_xla_process_argv(b), "jaxlib parse+print")


def _xla_net_base_command(b: Bench) -> str:
    return _snippet_command(_xla_import_argv(b), "import jaxlib._hlo")


SECTIONS: list[Section] = [
    Section(
        name="parse-print",
        title="parse + print, in-process",
        target=1.0,
        ours=ours_parse_print,
        reference=xla_parse_print,
        ours_command=lambda b: "xla_streams.hlo.parse_module(text).print()",
        reference_command=lambda b: "jaxlib._hlo.hlo_module_from_text(text).to_string()",
        in_process=True,
    ),
    Section(
        name="parse-print-process",
        title="parse + print, whole process",
        target=1.0,
        ours=ours_parse_print_process,
        reference=xla_parse_print_process,
        ours_command=lambda b: _snippet_command(_ours_process_argv(b), "our parse+print"),
        reference_command=lambda b: _snippet_command(_xla_process_argv(b), "jaxlib parse+print"),
    ),
    Section(
        name="opt",
        title="xla-streams opt -p '' vs XLA parse + print, whole process",
        target=0.6,
        ours=ours_opt,
        reference=xla_parse_print_process,
        ours_command=lambda b: shlex.join(_opt_argv(b)),
        reference_command=lambda b: _snippet_command(_xla_process_argv(b), "jaxlib parse+print"),
    ),
    Section(
        name="assign",
        title="xla-streams assign vs XLA parse + print, whole process",
        target=1.5,
        ours=ours_assign,
        reference=xla_parse_print_process,
        ours_command=lambda b: shlex.join(_assign_argv(b)),
        reference_command=lambda b: _snippet_command(_xla_process_argv(b), "jaxlib parse+print"),
    ),
    Section(
        name="opt-net",
        title="xla-streams opt -p '' - python -c pass vs XLA parse + print - jaxlib import",
        target=0.6,
        ours=lambda b: _process(_opt_net_argv(b), b.env),
        reference=xla_parse_print_process,
        ours_command=lambda b: shlex.join(_opt_net_argv(b)),
        reference_command=_xla_net_command,
        ours_base=bare_process,
        reference_base=xla_import_process,
        ours_base_command=lambda b: shlex.join(_bare_argv(b)),
        reference_base_command=_xla_net_base_command,
    ),
    Section(
        name="assign-net",
        title="xla-streams assign - python -c pass vs XLA parse + print - jaxlib import",
        target=1.0,
        ours=lambda b: _process(_assign_net_argv(b), b.env),
        reference=xla_parse_print_process,
        ours_command=lambda b: shlex.join(_assign_net_argv(b)),
        reference_command=_xla_net_command,
        ours_base=bare_process,
        reference_base=xla_import_process,
        ours_base_command=lambda b: shlex.join(_bare_argv(b)),
        reference_base_command=_xla_net_base_command,
    ),
]


# -- running -------------------------------------------------------------------------------


def largest_fixture() -> Path:
    candidates = sorted(FIXTURES.glob("*.hlo"), key=lambda p: p.stat().st_size, reverse=True)
    if not candidates:
        raise SystemExit(f"no {FIXTURES}/*.hlo: pass the module to benchmark as an argument")
    return candidates[0]


@dataclass
class Result:
    """The timed runs of a section: ours and the reference, and for net sections their
    bases; medians, and the ratio against the target."""

    section: Section
    ours: list[float]
    reference: list[float]
    ours_base: list[float] = field(default_factory=list)
    reference_base: list[float] = field(default_factory=list)

    def median(self, side: str) -> float:
        runs: list[float] = getattr(self, side)
        return statistics.median(runs) if runs else 0.0

    @property
    def ours_net(self) -> float:
        return self.median("ours") - self.median("ours_base")

    @property
    def reference_net(self) -> float:
        return self.median("reference") - self.median("reference_base")

    @property
    def ratio(self) -> float:
        return self.ours_net / self.reference_net

    @property
    def ok(self) -> bool:
        return self.ratio <= self.section.target


def run_section(section: Section, bench: Bench, repeat: int) -> Result:
    sides = {"ours": section.ours(bench), "reference": section.reference(bench)}
    if section.ours_base is not None and section.reference_base is not None:
        sides["ours_base"] = section.ours_base(bench)
        sides["reference_base"] = section.reference_base(bench)
    runs = interleaved({side: lambda fn=fn: measure(fn) for side, fn in sides.items()}, repeat)
    return Result(section, **runs)


@contextlib.contextmanager
def other_core_busy(python: str, busy: bool) -> Iterator[None]:
    """With ``busy``, a child process spins for as long as the block runs."""
    if not busy:
        yield
        return
    spinner = subprocess.Popen([python, "-c", "while True: pass"])
    try:
        time.sleep(0.2)  # let it start spinning before the first timed run
        yield
    finally:
        spinner.kill()
        spinner.wait()


def profile(section: Section, bench: Bench, top: int) -> None:
    fn = section.ours(bench)
    fn()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(3):
        fn()
    profiler.disable()
    print(f"\ncProfile of ours in '{section.name}' (3 runs), by own time:")
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.strip_dirs().sort_stats("tottime").print_stats(top)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.1f}"


def print_table(rows: list[Result], bench: Bench) -> None:
    header = f"{'section':22s} {'ours ms':>9s} {'ref ms':>9s} {'ratio':>7s} {'target':>7s}  ok"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r.section.name:22s} {ms(r.ours_net)} {ms(r.reference_net)} {r.ratio:6.2f}x "
              f"{r.section.target:6.1f}x  {'yes' if r.ok else 'NO'}")  # fmt: skip
    if any(r.section.net for r in rows):
        print("(-net: the median of each side minus the median of its base)")
    print()
    for r in rows:
        section = r.section
        print(f"{section.name}: {section.title}")
        lines = [
            ("ours", section.ours_command(bench), r.ours),
            ("ref", section.reference_command(bench), r.reference),
        ]
        if section.net:
            lines[1:1] = [("- base", section.ours_base_command(bench), r.ours_base)]
            lines.append(("- base", section.reference_base_command(bench), r.reference_base))
        for label, command, runs in lines:
            print(f"  {label + ':':7s} {command}")
            print(f"          runs ms: {' '.join(f'{t * 1e3:.1f}' for t in runs)}"
                  f"  (median {statistics.median(runs) * 1e3:.1f})")  # fmt: skip


def main(argv: list[str]) -> int:
    parser = suite_parser("text", __doc__, check="a ratio misses its target")
    parser.add_argument(
        "hlo", nargs="?", type=Path, help="module to benchmark (default: largest fixture)"
    )
    parser.add_argument(
        "--repeat", type=int, default=7, help="timed runs per side (>= 5; default 7)"
    )
    parser.add_argument(
        "--only", action="append", default=[], metavar="NAME", help="run this section only"
    )
    parser.add_argument("--list", action="store_true", help="list the sections and exit")
    parser.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="NAME",
        help="cProfile our side of this in-process section after timing it",
    )
    parser.add_argument(
        "--busy",
        action="store_true",
        help="keep another core busy (a spinning child process) while timing",
    )
    args = parser.parse_args(argv)

    by_name = {s.name: s for s in SECTIONS}
    if args.list:
        for s in SECTIONS:
            print(f"{s.name:22s} target <= {s.target:.1f}x  {s.title}")
        return 0
    unknown = [n for n in args.only + args.profile if n not in by_name]
    if unknown:
        parser.error(f"unknown section(s) {unknown}; sections: {', '.join(by_name)}")
    if args.repeat < 5:
        parser.error("--repeat must be at least 5 (the table reports medians)")
    chosen = [by_name[n] for n in args.only] if args.only else SECTIONS

    path = (args.hlo or largest_fixture()).resolve()
    text = path.read_bytes().decode("utf-8")
    # Processes start as they do for a user: from compiled bytecode (jax's was compiled
    # when pip installed it; ours is compiled here), whatever this shell says.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for package in ("xla_streams", "passes"):  # passes/ is xla_streams.passes
        compileall.compile_dir(REPO / package, quiet=1)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

    print("command:", shlex.join([sys.executable, *sys.argv]))
    print(f"input:   {path} ({len(text.encode()) / 1e6:.2f} MB, {text.count(chr(10))} lines)")
    print(f"machine: {machine()}")
    print(f"runs:    median of {args.repeat} per side, interleaved, after one warm-up each")
    print(f"load:    {'another core kept busy by a spinning process' if args.busy else 'none'}\n")

    with tempfile.TemporaryDirectory(prefix="xla_streams_bench.") as tmp:
        bench = Bench(path=path, text=text, tmp=Path(tmp), env=env)
        with other_core_busy(sys.executable, args.busy):
            rows = [run_section(section, bench, args.repeat) for section in chosen]
        print_table(rows, bench)
        for name in args.profile:
            section = by_name[name]
            if not section.in_process:
                print(f"\n--profile {name}: not an in-process section; nothing to profile")
                continue
            profile(section, bench, top=20)
    missed = [f"{r.section.name}: {r.ratio:.2f}x, target {r.section.target:.1f}x" for r in rows]
    return verdict([m for m, r in zip(missed, rows, strict=True) if not r.ok], args.check)
