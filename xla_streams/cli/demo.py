"""``xla-streams demo``: compile a sharded transformer step, show its collectives spread
over collective streams, what the simulator predicts that buys, and what ``tune``
would change.

The program is compiled with the plugin on, so the assignment is made inside
XLA's compile by the same hook an unmodified program gets from
``XLA_STREAMS_COLLECTIVE_STREAMS``: for this machine's GPUs when it has enough,
else for 8 H100s with no GPU at all (XLA's GPU compiler against a compile-only
topology, the ``gpu-aot`` extra; since jax 0.11 the hook runs there too). The
table of the assignment is printed, and the JSON report (schema
``xla_streams.assignment.v2``), the table and the index are written to a report
folder (a new temporary one unless ``--report-dir`` says where).

Then the story's end, predicted by the simulator for ``--target``: the compiled
module on one stream and on the K streams the plugin gave it (and why, where K
buys nothing), against XLA's defaults and the pick of ``xla_streams.tune`` over
the levers that create overlap and can act on the program (its joint move: the
overlap limit, start-early and, for loops holding collectives, the pipeliners
and double buffering), compiled without a GPU in worker processes and kept in
tune's disk cache, so a second demo compiles nothing. The last line is the
predicted effect of what the demo turned on.
"""

from __future__ import annotations

import glob
import os
import tempfile
from typing import Any, Literal, TextIO

from xla_streams import aot, jax_compat, plugin, xla_options
from xla_streams.collectives import Policy, StreamModel
from xla_streams.hlo import Module, parse_module
from xla_streams.plugin import hook
from xla_streams.programs import PROGRAMS, Program
from xla_streams.simulate import WhatIf, get_target, what_if
from xla_streams.streams import find_async_pairs
from xla_streams.tuning.driver import tune
from xla_streams.tuning.levers import collective_census, levers
from xla_streams.tuning.result import TuneError, TuneResult

Mode = Literal["auto", "gpu", "aot"]
# Where XLA runs sync pairs from jax 0.11 on (every version the package supports):
# on the compute stream, whatever the overlap limit.
MODEL = StreamModel(sync_on_compute=True)


class Unavailable(Exception):
    """The demo cannot run here as asked; the message says why and what to do."""


def run(
    program_name: str,
    streams: int,
    policy: Policy,
    *,
    report_dir: str | None = None,
    mode: Mode = "auto",
    target: str = "h100",
    out: TextIO,
) -> None:
    """Compile ``program_name`` with the plugin on and print its assignment. Raises Unavailable."""
    program = PROGRAMS[program_name]
    if mode == "auto":
        enough = visible_gpus() >= program.num_devices
        mode = "gpu" if enough and jax_compat.cuda_plugin_module() is not None else "aot"
    if mode == "aot":
        # The compile-only client needs no GPU; JAX must not try to open one.
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    report_dir = os.path.abspath(report_dir or tempfile.mkdtemp(prefix="xla_streams_demo_"))
    # Before JAX starts, so that the XLA options native mode needs take effect.
    plugin.enable(streams, policy=policy, report_dir=report_dir)
    limit = xla_options.overlap_limit_in(os.environ.get("XLA_FLAGS", ""))
    hook.reset_stats()
    if mode == "gpu":
        devices, where = _gpus(program)
    else:
        devices, where = _compile_only(program, target)
    fn, args = program.build(devices)
    compiled: Any = fn.lower(*args).compile()  # type: ignore[attr-defined]
    text = compiled.as_text()
    name = text.split(",", 1)[0].removeprefix("HloModule ").strip()
    mine = [p for p in hook.stats().reports if os.path.basename(p).startswith(name + ".")]
    if not mine:
        raise Unavailable(f"the plugin wrote no report for module {name}; see the log above")
    json_path = mine[-1]
    text_path = json_path.removesuffix(".json") + ".txt"
    with open(text_path, encoding="utf-8") as f:
        table = f.read()
    out.write(
        f"{program.name}: {program.description.strip()}\n"
        f"compiled for {where}; {streams} collective streams, policy {policy}\n\n"
        f"{table}\n"
        f"report (JSON, schema xla_streams.assignment.v2): {json_path}\n"
        f"table: {text_path}\n"
        f"index of every module: {os.path.join(report_dir, 'index.txt')}\n"
        f"To do this inside any JAX program: XLA_STREAMS_COLLECTIVE_STREAMS={streams} "
        f"XLA_STREAMS_REPORT_DIR={report_dir} python your_program.py\n"
    )
    plugin.disable()  # tune compiles its candidates as XLA leaves them
    module = parse_module(text, name)
    predicted = what_if(module, get_target(target), sorted({1, streams}), [policy], model=MODEL)
    names = overlap_levers(module, program)
    out.write(
        f"\nWhat it buys, predicted by the simulator for {target} (xla-streams simulate), and "
        f"what tune would change: searching {', '.join(names)} (the levers that create "
        "overlap and can act on this program), compiled without a GPU ...\n"
    )
    out.flush()
    try:
        tuned: TuneResult | str = tune(
            program.build,
            devices=program.num_devices,
            devices_per_host=program.devices_per_host,
            target=target,
            program=program.name,
            levers=names,
        )
    except TuneError as e:
        tuned = str(e)
    out.write(story(predicted, streams, policy, limit, tuned, program.name))


def overlap_levers(module: Module, program: Program) -> list[str]:
    """The levers of tune's joint move (those that create overlap) that can act on
    ``module``: the overlap limit and start-early, and for loops holding collectives
    the pipeliners and double buffering."""
    facts = collective_census(module, find_async_pairs(module, MODEL), program.devices_per_host)
    return [lv.name for lv in levers(facts) if lv.together is not None and not lv.skip(facts)]


def story(
    what: WhatIf, streams: int, policy: str, limit: int | None, tuned: TuneResult | str, name: str
) -> str:
    """The predicted steps: XLA's defaults (tune's baseline), the demo's compile on one
    stream and on its K streams, tune's pick; why K buys what it buys; the predicted
    effect of what the demo turned on, last. Without a tune result (``tuned`` then says
    why), against the demo's compile on one stream."""
    compiled = f"overlap limit {limit}" if limit is not None else "as compiled"
    turned_on = what.result(streams, policy).step_time * 1e3
    rows = [(f"what the demo turned on: {compiled}, {_streams(streams)}, {policy}", turned_on)]
    if streams > 1:
        one = what.result(1, policy).step_time * 1e3
        rows.insert(0, (f"the demo's compile ({compiled}), 1 stream", one))
    against = "the demo's compile on one stream"
    if isinstance(tuned, TuneResult):
        best = tuned.best
        against = "XLA's defaults"
        rows.insert(0, (f"{against}: overlap limit 1, 1 stream", tuned.baseline.predicted_step_ms))
        pick = f"tune's pick: {best.settings or against}, {_streams(best.streams)}, {best.policy}"
        rows.append((pick, best.predicted_step_ms))
    base_ms = rows[0][1]
    width = max(len(label) for label, _ in rows)
    lines = [f"  {label:<{width}}  {ms:8.3f} ms  {base_ms / ms:.3f}x" for label, ms in rows]
    if streams > 1:
        lines.append(f"why {streams} streams: {_why(what, streams, policy)}")
    if isinstance(tuned, TuneResult):
        lines.append(f"to run tune's pick: {tuned.command}")
    else:
        lines.append(f"tune could not run here: {tuned}")
    lines.append(
        f"every lever, and a file the plugin applies: xla-streams tune --program={name} "
        "--json=tune.json"
    )
    lines.append(
        f"Predicted effect of what the demo turned on ({compiled}, {_streams(streams)}): "
        f"{base_ms / turned_on:.3f}x of {against} on this program ({turned_on:.3f} ms a step "
        f"against {base_ms:.3f} ms)."
    )
    return "\n".join(lines) + "\n"


def _streams(k: int) -> str:
    return f"{k} collective stream{'s' if k > 1 else ''}"


def _why(what: WhatIf, streams: int, policy: str) -> str:
    """What K streams change against one, in words: the simulator's explanation where
    K is slower; else what they hide, or why they change nothing."""
    explained = what.explanations.get((streams, policy))
    if explained is not None:
        return explained
    one, spread = what.result(1, policy), what.result(streams, policy)
    hidden = one.exposed_communication - spread.exposed_communication
    if spread.step_time < one.step_time:
        return (
            f"they hide {hidden * 1e3:.3f} ms of the communication one stream leaves exposed "
            f"({one.exposed_communication * 1e3:.3f} ms)"
        )
    assignment = what.assignments[(streams, policy)]
    if assignment.streams_used <= 1 and assignment.serialized_by_rule:
        return (
            "every collective stays on one stream: those in flight together share two or "
            "more devices, and the deadlock rule keeps them on one stream"
        )
    if assignment.streams_used <= 1:
        return "every collective stays on one stream: no two are in flight at once"
    return "the collectives they run side by side are not the ones the compute stream waits for"


def _gpus(program: Any) -> tuple[list[Any], str]:
    import jax

    devices = jax.devices()
    if devices[0].platform != "gpu" or len(devices) < program.num_devices:
        raise Unavailable(
            f"{program.name} needs {program.num_devices} GPUs, JAX sees "
            f"{len(devices)} {devices[0].platform} device(s); use --mode=aot"
        )
    kind = getattr(devices[0], "device_kind", "GPU")
    return devices[: program.num_devices], f"{program.num_devices} x {kind} (this machine)"


def _compile_only(program: Any, target: str) -> tuple[list[Any], str]:
    try:
        topology = aot.gpu_topology(target, program.num_devices, program.devices_per_host)
    except aot.GpuAotUnavailable as e:
        raise Unavailable(
            f"no GPU here, and {e}. Install with: pip install -e '.[gpu-aot]'"
        ) from None
    where = (
        f"{program.num_devices} x {target.upper()} without a GPU "
        "(XLA's GPU compiler, compile-only topology)"
    )
    return list(topology.devices), where


def visible_gpus() -> int:
    """NVIDIA GPUs this process may use, counted without starting CUDA or JAX."""
    found = len(glob.glob("/proc/driver/nvidia/gpus/*"))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip().lower() not in ("", "all"):
        found = min(found, len([d for d in visible.split(",") if d.strip()]))
    elif visible is not None and visible.strip() == "":
        found = 0
    return found
