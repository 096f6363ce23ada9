#!/usr/bin/env python3
"""Prove, without a GPU, that a tune result's recommendation does what the tuner predicted.

    JAX_PLATFORMS=cpu python tools/prove_tune.py TUNE.json --program fsdp_scan
        [--expected-hlo TUNED.hlo] [--out DIR] [--json FILE]

Runs the recommendation the way its ``command`` says a user runs it, in this
fresh process: ``XLA_FLAGS`` from ``best.xla_flags`` (as XLA_FLAGS spells them)
and the plugin on with ``best.streams`` and ``best.policy`` before JAX starts
(what ``XLA_STREAMS_COLLECTIVE_STREAMS=K`` does), then compiles the embedded
program deviceless with an XLA dump. Checks:

- the schedule XLA produced from XLA_FLAGS is the one the tuner predicted from
  (compiled with the same options as ``compile(compiler_options=...)``), when
  ``--expected-hlo`` gives that module: the same opcodes in the same order in
  every computation (names are renumbered from one compile to the next);
- the hook annotated the step and wrote its report;
- the collectives the simulator counts as overlapped (their predicted transfers
  intersect in time, on the recommended streams) really are in flight together
  in the scheduled module: the start of each comes before the done of the other
  (``find-async-pairs`` positions), and at least one such pair exists when K > 1;
- in XLA's thunk sequence every async collective the report puts on stream k
  starts on ``communication_stream[k]``, and the overlapped pairs that the
  assignment splits run on two different streams.

Exits 0 when every check passes, 1 when one fails, 2 when it cannot run here.
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

import xla_streams  # noqa: E402
from xla_streams import aot, programs, xla_options  # noqa: E402
from xla_streams.collectives import StreamModel  # noqa: E402
from xla_streams.hlo import parse_module  # noqa: E402
from xla_streams.plugin import hook  # noqa: E402
from xla_streams.simulate import Simulator, get_target  # noqa: E402
from xla_streams.streams import assign_streams, find_async_pairs  # noqa: E402
from xla_streams.tuning.result import load_tune_result  # noqa: E402
from xla_streams.xla_dump import read_dump, schedule, schedule_difference  # noqa: E402


@dataclass
class TuneProof:
    tune_file: str
    program: str
    streams: int
    policy: str
    xla_flags: dict[str, Any]
    overlapped: list[list[str]] = field(default_factory=list)  # [start a, start b, streams]
    checks: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(v == "ok" for v in self.checks.values())


def simulated_overlaps(
    text: str, streams: int, policy: str, overlap_limit: int, target: str = "h100"
) -> tuple[list[tuple[str, str, int, int]], dict[str, Any]]:
    """Pairs of collectives whose predicted transfers intersect in time on the
    recommended streams: (start a, start b, stream a, stream b); and the pairs by start."""
    module = parse_module(text)
    pairs = find_async_pairs(module, StreamModel(overlap_limit, sync_on_compute=True))
    simulator = Simulator(module, get_target(target), pairs)
    result = simulator.run(assign_streams(pairs, streams, policy), record=True)  # type: ignore[arg-type]
    by_start = {p.start: p for p in pairs}
    spans = [
        (s.name, s.lane, s.start, s.start + s.duration)
        for s in result.slices or []
        if s.lane >= 0 and s.name in by_start and s.duration > 0
    ]
    found: dict[tuple[str, str], tuple[int, int]] = {}
    for i, (a, lane_a, begin_a, end_a) in enumerate(spans):
        for b, lane_b, begin_b, end_b in spans[i + 1 :]:
            if a == b:
                continue
            overlap = min(end_a, end_b) - max(begin_a, begin_b)
            if overlap > 1e-9 * max(end_a, end_b):
                key = (min(a, b), max(a, b))
                found.setdefault(key, (lane_a, lane_b) if a <= b else (lane_b, lane_a))
    return [(a, b, la, lb) for (a, b), (la, lb) in sorted(found.items())], by_start


def prove(
    tune_file: str,
    program: str,
    expected_hlo: str | None = None,
    out_dir: str | None = None,
    target: str = "h100",
) -> TuneProof:
    """Run the proof in this process (which must not have started JAX yet)."""
    best = load_tune_result(tune_file).best
    proof = TuneProof(tune_file, program, best.streams, best.policy, dict(best.xla_flags))
    root = out_dir or tempfile.mkdtemp(prefix="xla_streams_tune_proof_")
    reports, dump = os.path.join(root, "reports"), os.path.join(root, "dump")
    # What the command sets: XLA_FLAGS, and the plugin (XLA_STREAMS_COLLECTIVE_STREAMS=K).
    os.environ["XLA_FLAGS"] = " ".join(xla_options.as_xla_flags(best.xla_flags))
    if best.streams > 1:
        xla_streams.enable(best.streams, policy=best.policy, report_dir=reports, strict=True)
        hook.reset_stats()
    spec = programs.PROGRAMS[program]
    topology = aot.gpu_topology(target, spec.num_devices, spec.devices_per_host)
    fn: Any
    fn, args = spec.build(topology.devices)
    options = {"xla_dump_to": dump, "xla_dump_hlo_as_text": True, "xla_dump_hlo_pass_re": ""}
    text = fn.lower(*args).compile(options).as_text()
    module_name = text.split(",", 1)[0].removeprefix("HloModule ").strip()
    dumped, thunks = read_dump(dump, module_name)

    if expected_hlo is not None:
        # Opcodes per computation, in schedule order: XLA renumbers names from one
        # compile to the next in a process, and the tuner compiled many.
        expected = schedule(Path(expected_hlo).read_text())
        got = schedule(text)
        proof.checks["XLA_FLAGS give the schedule the tuner compiled with compile options"] = (
            schedule_difference(expected, got) or "ok"
        )
    limit = best.xla_flags.get(xla_options.OVERLAP_LIMIT)
    if not isinstance(limit, int):  # XLA's default where the tune result sets none
        limit = xla_options.XLA_DEFAULT_OVERLAP_LIMIT
    overlaps, by_start = simulated_overlaps(dumped, best.streams, best.policy, int(limit), target)
    proof.overlapped = [[a, b, f"{la},{lb}"] for a, b, la, lb in overlaps]
    not_in_flight = [(a, b) for a, b, _, _ in overlaps if not by_start[a].overlaps(by_start[b])]
    proof.checks["every pair the simulator overlaps is in flight together in the schedule"] = (
        "ok"
        if overlaps and not not_in_flight
        else f"{len(not_in_flight)} of {len(overlaps)} are not: {not_in_flight[:3]}"
        if overlaps
        else "the simulator overlaps no collectives"
    )
    if best.streams <= 1:
        return proof
    stats = hook.stats()
    found = [r for r in stats.reports if os.path.basename(r).startswith(f"{module_name}.")]
    proof.checks["the hook annotated the step and wrote its report"] = (
        "ok" if found and stats.changed >= 1 else f"stats: {stats}"
    )
    if not found:
        return proof
    report = json.loads(Path(found[-1]).read_text())
    on_streams = {c["start"]: c["stream"] for c in report["collectives"] if c["stream"] is not None}
    wrong = [s for s, k in on_streams.items() if thunks.get(s) != k]
    proof.checks["every collective's thunk runs on the report's stream"] = (
        "ok" if on_streams and not wrong else f"{len(wrong)} of {len(on_streams)}: {wrong[:5]}"
    )
    split = [(a, b) for a, b, la, lb in overlaps if la != lb]
    apart = [(a, b) for a, b in split if thunks.get(a) != thunks.get(b)]
    proof.checks["overlapped pairs on different streams run on different thunk streams"] = (
        "ok"
        if split and len(apart) == len(split)
        else f"{len(apart)} of {len(split)} split pairs run apart"
    )
    return proof


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("tune_file")
    parser.add_argument("--program", default="fsdp_scan")
    parser.add_argument("--expected-hlo", default=None)
    parser.add_argument("--target", default="h100")
    parser.add_argument("--out", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    try:
        proof = prove(args.tune_file, args.program, args.expected_hlo, args.out, args.target)
    except aot.GpuAotUnavailable as e:
        print(f"cannot run here: {e}", file=sys.stderr)
        return 2
    for name, value in proof.checks.items():
        print(
            f"{'PASS' if value == 'ok' else 'FAIL'}  {name}"
            + ("" if value == "ok" else f": {value}")
        )
    print(f"{len(proof.overlapped)} overlapped pairs, e.g. {proof.overlapped[:3]}")
    if args.json:
        record = asdict(proof)
        record["ok"] = proof.ok
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0 if proof.ok else 1


if __name__ == "__main__":
    sys.exit(main())
