#!/usr/bin/env python3
"""Regenerate hlo_fixtures/: real scheduled H100 HLO made by XLA's GPU compiler, deviceless.

    JAX_PLATFORMS=cpu python tools/make_fixtures.py            # rewrite hlo_fixtures/
    JAX_PLATFORMS=cpu python tools/make_fixtures.py --check    # exit 1 if any file differs

Needs the `gpu-aot` extra (jax[cuda12]==0.12.0.1); no GPU. Three forms of each
module: ``text`` is ``compiled.as_text()``; ``dump`` XLA's after-optimizations
dump (wrapped collectives as ``async-start(...), calls=``, tuple operands as
``%x#N``); ``hook`` the module as the plugin's compile hook receives it, before
XLA's post-scheduling passes (which make idle pairs synchronous). The output is
byte-for-byte reproducible for the pinned jax: the HLO metadata holds no source
locations (``aot.without_source_locations``), so the files depend neither on where
the checkout lives nor on the line numbers of the programs' code.
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The compile-only CUDA client needs no GPU; keep jax off real ones. Flags from the
# environment would change the HLO (options are set per job): dropped, before anything
# imports jax, and said in main().
os.environ["JAX_PLATFORMS"] = "cpu"
_IGNORED_XLA_FLAGS = os.environ.pop("XLA_FLAGS", None) is not None

REPO = Path(__file__).resolve().parent.parent
# Import xla_streams from this checkout even if another copy is installed.
sys.path.insert(0, str(REPO))

from xla_streams import aot, jax_compat, programs, xla_options  # noqa: E402
from xla_streams.plugin import xla_module  # noqa: E402

DEFAULT_OUT = REPO / "hlo_fixtures"
MANIFEST = "MANIFEST.json"
TARGET = "h100"
LIMIT = xla_options.OVERLAP_LIMIT

OPTION_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "limit2": {LIMIT: 2},
    "limit4": {LIMIT: 4},
    # Collective pipeliner: moves the first/last iteration's collectives out of
    # scan loops ("is_pipelined":true in the collective backend config).
    "limit4_pipelined": {
        LIMIT: 4,
        **{option: xla_options.PIPELINING_ON for option in xla_options.PIPELINE.values()},
    },
    # Acyclic collective-permutes in while bodies become send/recv pairs
    # tagged _xla_send_recv_pipeline (also _xla_gpu_collective_stream="p2p").
    "limit4_pp_enable": {
        LIMIT: 4,
        "xla_gpu_experimental_pipeline_parallelism_opt_level": (
            "PIPELINE_PARALLELISM_OPT_LEVEL_ENABLE"
        ),
    },
    # The older switch; needs a decomposer threshold (default: never decompose).
    "limit4_pipelined_p2p": {
        LIMIT: 4,
        "xla_gpu_enable_pipelined_p2p": True,
        "xla_gpu_collective_permute_decomposer_threshold": 1024,
    },
}

# Names this script owns in the fixture directory; other files there (expected
# outputs, READMEs) belong to other tools and are left alone.
FIXTURE_NAME = re.compile(r"^[a-z0-9_]+\.[a-z0-9_]+\.(text|dump|hook)\.hlo$")


@dataclass(frozen=True)
class Job:
    program: str
    options: str
    forms: tuple[str, ...]

    def filename(self, form: str) -> str:
        return f"{self.program}.{self.options}.{form}.hlo"


def jobs() -> list[Job]:
    small = [
        "transformer_step",
        "fsdp_unrolled",
        "fsdp_scan",
        "tp_dp_2d",
        "gspmd_step",
        "psum_scatter",
        "moe_all_to_all",
        "ppermute_pipeline",
        "ppermute_scan",
        "multihost_32",
    ]
    out = []
    for name in small:
        out.append(Job(name, "default", ("text",)))
        out.append(Job(name, "limit2", ("text",)))
        out.append(Job(name, "limit4", ("text", "dump", "hook")))
    out.append(Job("fsdp_scan", "limit4_pipelined", ("text", "dump", "hook")))
    out.append(Job("ppermute_scan", "limit4_pp_enable", ("text", "dump")))
    out.append(Job("ppermute_scan", "limit4_pipelined_p2p", ("text",)))
    out.append(Job("large_transformer", "limit4", ("text",)))
    return out


def _shares(all_jobs: list[Job], n: int) -> list[list[Job]]:
    # The large module costs about as much as a third of everything else, so
    # deal jobs greedily by a rough cost to balance the workers.
    def cost(job: Job) -> float:
        return 12.0 if job.program == "large_transformer" else 1.0 + 0.3 * len(job.forms)

    shares: list[list[Job]] = [[] for _ in range(n)]
    loads = [0.0] * n
    for job in sorted(all_jobs, key=cost, reverse=True):
        i = loads.index(min(loads))
        shares[i].append(job)
        loads[i] += cost(job)
    return shares


def run_jobs(my_jobs: list[Job], out: Path) -> None:
    """Compile `my_jobs` in this process and write their files into `out`."""
    seen_by_hook: dict[str, str] = {}

    def capture(serialized: bytes) -> None:
        name, text = xla_module.module_text(serialized)
        seen_by_hook[name] = text

    jax_compat.register_compile_hook("xla_streams_fixtures", capture, ["cuda"])
    topologies: dict[tuple[int, int], Any] = {}
    with aot.without_source_locations():
        for job in my_jobs:
            program = programs.PROGRAMS[job.program]
            key = (program.num_devices, program.devices_per_host)
            if key not in topologies:
                topologies[key] = aot.gpu_topology(TARGET, *key)
            fn, args = program.build(topologies[key].devices)
            seen_by_hook.clear()
            module = aot.compile_for_gpu(
                fn, args, compiler_options=OPTION_SETS[job.options], dump="dump" in job.forms
            )
            name = module.as_text.split(",", 1)[0].removeprefix("HloModule ").strip()
            forms = {
                "text": module.as_text,
                "dump": module.dump_text,
                "hook": seen_by_hook.get(name),
            }
            for form in job.forms:
                text = forms[form]
                if text is None:
                    raise SystemExit(f"{job.filename(form)}: the hook saw no module {name}")
                (out / job.filename(form)).write_text(text, encoding="utf-8")


def write_manifest(out: Path) -> None:
    import jax
    import jaxlib

    files = []
    for job in jobs():
        for form in job.forms:
            data = (out / job.filename(form)).read_bytes()
            files.append(
                {
                    "file": job.filename(form),
                    "program": job.program,
                    "options": job.options,
                    "compiler_options": OPTION_SETS[job.options],
                    "form": form,
                    "lines": data.count(b"\n"),
                    "bytes": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                }
            )
    manifest = {
        "generator": "tools/make_fixtures.py",
        "target": TARGET,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "forms": {
            "text": "compiled.as_text()",
            "dump": "XLA dump (xla_dump_to) *after_optimizations.txt",
            "hook": "the module the POST_SCHEDULER compile hook receives, as it prints it",
        },
        "files": files,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def generate(out: Path, workers: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    all_jobs = jobs()
    if workers <= 1:
        run_jobs(all_jobs, out)
    else:
        # Separate interpreters, not multiprocessing: each worker runs this
        # same script, so the HLO never depends on how work was split.
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker", f"{i}/{workers}", "--out", str(out)]
            )
            for i in range(workers)
        ]
        failed = [p.args for p in procs if p.wait() != 0]
        if failed:
            raise SystemExit(f"fixture worker(s) failed: {failed}")
    write_manifest(out)


def expected_files() -> list[str]:
    return sorted([j.filename(f) for j in jobs() for f in j.forms] + [MANIFEST])


def check(committed: Path, workers: int) -> int:
    with tempfile.TemporaryDirectory(prefix="xla_streams_fixtures_") as tmp:
        fresh = Path(tmp)
        generate(fresh, workers)
        names = expected_files()
        problems = []
        for n in names:
            if not (committed / n).is_file():
                problems.append(f"missing: {n}")
            elif not filecmp.cmp(committed / n, fresh / n, shallow=False):
                problems.append(f"differs: {n}")
        problems += [
            f"not generated: {p.name}"
            for p in sorted(committed.glob("*.hlo"))
            if FIXTURE_NAME.match(p.name) and p.name not in names
        ]
        for line in problems:
            print(line)
        if problems:
            print(f"{len(problems)} fixture file(s) out of date in {committed}; rerun {__file__}")
            return 1
        print(f"all {len(names)} fixture files reproduce byte for byte")
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="fixture directory")
    parser.add_argument(
        "--check", action="store_true", help="regenerate into a temp dir and compare with --out"
    )
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if _IGNORED_XLA_FLAGS and not args.worker:
        print("make_fixtures: ignoring XLA_FLAGS from the environment", file=sys.stderr)
    if args.worker:
        index, count = (int(x) for x in args.worker.split("/"))
        run_jobs(_shares(jobs(), count)[index], args.out)
        return 0
    start = time.monotonic()
    if args.check:
        rc = check(args.out, args.jobs)
    else:
        generate(args.out, args.jobs)
        rc = 0
    print(f"took {time.monotonic() - start:.1f}s", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
