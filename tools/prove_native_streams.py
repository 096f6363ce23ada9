#!/usr/bin/env python3
"""Prove, without a GPU, that XLA runs each collective on the stream our report assigns.

    JAX_PLATFORMS=cpu python tools/prove_native_streams.py [--program transformer_step]
        [--streams 4] [--policy interval] [--out DIR] [--json FILE]

Since jax 0.11 a compile hook registered for ``cuda`` runs during deviceless GPU
compiles, so the proof goes through the real plugin, as a user's program would:

1. the plugin is switched on with :func:`xla_streams.enable` (native mode: it
   puts the overlap limit and K communication streams in ``XLA_FLAGS``, and
   registers its hook) and the embedded program is compiled for its GPUs from
   a GpuTargetConfigProto, with an XLA dump (``annotated``);
2. the plugin is switched off and the same program compiled again (``plain``);
   XLA's options are the same, since XLA reads ``XLA_FLAGS`` once.

Checks: the hook changed the step's module and wrote its report; the schedule
of ``annotated`` equals ``plain``'s (the hook only annotates); in XLA's thunk
sequence of ``annotated`` (``*.thunk_sequence.txt``, thunk names from
``*.thunk_metadata.txt``) every async collective the report puts on stream k
starts on ``communication_stream[k]``, all-reduce included (jax 0.11/0.12 print
it in a form their own text parser rejects, so the hook writes the annotations
into XLA's proto); and ``plain`` runs them all on ``communication_stream[0]``.

Needs the ``gpu-aot`` extra; exits 0 when every check passes, 1 when one
fails, 2 when the proof cannot run here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# None of these imports JAX: the proof starts it itself, after enable().
import xla_streams  # noqa: E402
from xla_streams import aot, programs  # noqa: E402
from xla_streams.aot import GpuAotUnavailable  # noqa: E402
from xla_streams.plugin import hook  # noqa: E402
from xla_streams.xla_dump import read_dump, schedule, schedule_difference  # noqa: E402
from xla_streams.xla_options import MULTI_STREAMING  # noqa: E402


@dataclass
class Row:
    start: str
    kind: str
    stream: int | None  # the report's
    thunk: int | str | None  # where XLA runs it with the plugin on
    plain: int | str | None  # where XLA runs it with the plugin off


@dataclass
class Proof:
    program: str
    streams: int
    policy: str
    report: str = ""
    rows: list[Row] = field(default_factory=list)
    checks: dict[str, str] = field(default_factory=dict)  # name -> "ok" or the failure

    @property
    def streams_used(self) -> list[int]:
        return sorted({r.stream for r in self.rows if r.stream is not None})

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(v == "ok" for v in self.checks.values())


def _compile(program: str, target: str, dump_dir: str, multi_streaming: bool) -> str:
    """Compile ``program`` deviceless with an XLA dump; returns the module's name."""
    spec = programs.PROGRAMS[program]
    topology = aot.gpu_topology(target, spec.num_devices, spec.devices_per_host)
    fn, args = spec.build(topology.devices)
    options = {
        "xla_dump_to": dump_dir,
        "xla_dump_hlo_as_text": True,
        "xla_dump_hlo_pass_re": "",
        MULTI_STREAMING: multi_streaming,
    }
    text = fn.lower(*args).compile(options).as_text()
    return str(text.split(",", 1)[0].removeprefix("HloModule ").strip())


def prove(
    program: str = "transformer_step",
    streams: int = 4,
    policy: str = "interval",
    target: str = "h100",
    out_dir: str | None = None,
    multi_streaming: bool = False,
) -> Proof:
    """Run the proof in this process (which must not have started JAX yet).

    With ``multi_streaming``, XLA's own collective multi-streaming is on in both
    builds: alone, XLA alternates streams 0 and 1; our annotations must still win.
    """
    root = out_dir or tempfile.mkdtemp(prefix="xla_streams_proof_")
    reports = os.path.join(root, "reports")
    proof = Proof(program, streams, policy)

    xla_streams.enable(streams, policy=policy, report_dir=reports, strict=True)
    hook.reset_stats()
    module = _compile(program, target, os.path.join(root, "annotated"), multi_streaming)
    stats = hook.stats()
    xla_streams.disable()
    _compile(program, target, os.path.join(root, "plain"), multi_streaming)

    found = [r for r in stats.reports if os.path.basename(r).startswith(f"{module}.")]
    proof.checks["the hook changed the step's module and wrote its report"] = (
        "ok" if found and stats.changed >= 1 else f"stats: {stats}"
    )
    if not found:
        return proof
    proof.report = found[-1]
    report = json.loads(Path(proof.report).read_text())
    annotated_hlo, annotated = read_dump(os.path.join(root, "annotated"), module)
    plain_hlo, plain = read_dump(os.path.join(root, "plain"), module)

    diff = schedule_difference(schedule(plain_hlo), schedule(annotated_hlo))
    proof.checks["the schedule is XLA's own (plugin on == plugin off)"] = diff or "ok"
    for c in report["collectives"]:
        proof.rows.append(
            Row(
                c["start"], c["kind"], c["stream"], annotated.get(c["start"]), plain.get(c["start"])
            )
        )
    on_streams = [r for r in proof.rows if r.stream is not None]
    wrong = [r.start for r in on_streams if r.thunk != r.stream]
    proof.checks["every collective's thunk is on the report's stream"] = (
        "ok"
        if on_streams and not wrong
        else f"{len(wrong)} of {len(on_streams)} differ: {wrong[:5]}"
    )
    # The report says XLA makes these synchronous (nothing to overlap): no async thunk.
    computed = [r.start for r in proof.rows if r.stream is None]
    async_anyway = [s for s in computed if s in annotated]
    proof.checks["the pairs the report puts on the compute stream run there"] = (
        "ok" if not async_anyway else f"async thunks for {async_anyway[:5]}"
    )
    kinds = sorted({r.kind for r in on_streams})
    alone = {0, 1} if multi_streaming else {0}
    proof.checks[f"without the plugin XLA uses communication streams {sorted(alone)}"] = (
        "ok"
        if {r.plain for r in on_streams} == alone
        else f"plain streams: {sorted({str(r.plain) for r in on_streams})}"
    )
    proof.checks[f"kinds checked: {', '.join(kinds)}"] = "ok" if kinds else "none"
    return proof


def format_proof(proof: Proof) -> str:
    lines = [
        f"program {proof.program}, {proof.streams} streams, policy {proof.policy}",
        f"report: {proof.report}; streams used: {proof.streams_used}",
        "",
        f"{'start':<36} {'kind':<20} {'report':>6}  {'thunk (on)':<26} thunk (off)",
    ]
    for r in proof.rows:
        stream = "-" if r.stream is None else str(r.stream)
        on = f"communication_stream[{r.thunk}]" if isinstance(r.thunk, int) else str(r.thunk)
        off = f"communication_stream[{r.plain}]" if isinstance(r.plain, int) else str(r.plain)
        lines.append(f"{r.start:<36} {r.kind:<20} {stream:>6}  {on:<26} {off}")
    lines.append("")
    lines += [f"{'PASS' if v == 'ok' else 'FAIL'}  {k}" + ("" if v == "ok" else f": {v}")
              for k, v in proof.checks.items()]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--program", default="transformer_step")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--policy", default="interval", choices=("interval", "round-robin"))
    parser.add_argument("--target", default="h100")
    parser.add_argument("--out", default=None, help="keep the dumps and the report here")
    parser.add_argument("--json", default=None, help="write the proof as JSON here")
    parser.add_argument(
        "--multi-streaming",
        action="store_true",
        help="with XLA's own collective multi-streaming on in both builds",
    )
    args = parser.parse_args(argv)
    try:
        proof = prove(
            args.program, args.streams, args.policy, args.target, args.out, args.multi_streaming
        )
    except GpuAotUnavailable as e:
        print(f"cannot run here: {e}", file=sys.stderr)
        return 2
    print(format_proof(proof))
    if args.json:
        record: dict[str, Any] = asdict(proof)
        record["ok"] = proof.ok
        record["streams_used"] = proof.streams_used
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0 if proof.ok else 1


if __name__ == "__main__":
    sys.exit(main())
