"""What several test files share."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# jax >= 0.11 prints an async all-reduce with this attribute, which its own HLO
# text parser then rejects. Tests that need XLA to parse printed text drop it: it
# only records an aliasing XLA re-derives, and the plugin never goes this way (it
# writes XLA's proto).
_UNPARSABLE_ALIASING = re.compile(r", output_to_operand_aliasing=\{\{1\}: \(0, \{\}\)\}")


def xla_parsable(text: str) -> str:
    """``text`` as XLA's own text parser accepts it (see above)."""
    return _UNPARSABLE_ALIASING.sub("", text)


# The reducer the tests' all-reduces and reduce-scatters apply (``to_apply=%add``).
ADD_REDUCER = """\
%add (lhs: f32[], rhs: f32[]) -> f32[] {
  %lhs = f32[] parameter(0)
  %rhs = f32[] parameter(1)
  ROOT %sum = f32[] add(%lhs, %rhs)
}
"""


def hlo_module(header: str, body: str) -> str:
    """The text of a module: its ``HloModule`` line, a blank line, :data:`ADD_REDUCER`, a
    blank line, then ``body`` (its ENTRY and other computations). The layout is fixed,
    so a test may name the line of an instruction: the reducer takes lines 3 to 7."""
    return f"{header}\n\n{ADD_REDUCER}\n{body}"


# One module in the layouts XLA's parser accepts: tabs, comment and blank lines inside
# computations, `)->` without spaces (tests/test_hlo_roundtrip.py checks each against
# jaxlib's parser); REPLICA_GROUPS stands for a spelling of the groups.
LAYOUT_MODULE = """\
HloModule m, num_partitions=8

%add (a: f32[], b: f32[])->f32[]{
\t%a = f32[] parameter(0)
\t%b = f32[] parameter(1)
\tROOT\t%s = f32[] add(%a, %b)
}

ENTRY %main (p: f32[8]) -> f32[8] {
  // a comment line, then a blank line, then one of whitespace

  \t
  %p = f32[8]{0} parameter(0)
  // %fake = f32[8]{0} negate(%p): a comment, not an instruction
  %ar = f32[8]{0} all-reduce(%p), channel_id=1, replica_groups=REPLICA_GROUPS, use_global_device_ids=true, to_apply=%add
  ROOT %n = f32[8]{0} negate(%ar)
  // after the ROOT
}
"""


@contextmanager
def alarm(seconds: int) -> Iterator[None]:
    """Raise TimeoutError in this (main) thread after ``seconds``: a hang fails, not stalls."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def busy_cores() -> Iterator[list[float]]:
    """A process spinning on every core for as long as the block runs. The list it
    yields is filled on exit with the CPU seconds each spinner got, so a test can
    check that the machine really was busy."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 1)
    ]
    spun: list[float] = []
    try:
        yield spun
    finally:
        for spinner in spinners:
            spun.append(_cpu_seconds(spinner.pid))
            spinner.kill()
            spinner.wait()


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of a running process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CompiledStandIn:
    """jax's Compiled as the tuner reads it: the HLO text of a real compile, and a memory
    analysis of ``temp`` bytes of temporaries above ``resident`` bytes each of
    arguments, outputs and aliases."""

    def __init__(self, text: str, temp: int, resident: int = 0) -> None:
        self.text, self.temp, self.resident = text, temp, resident

    def as_text(self) -> str:
        return self.text

    def memory_analysis(self) -> SimpleNamespace:
        return SimpleNamespace(
            argument_size_in_bytes=self.resident,
            output_size_in_bytes=self.resident,
            alias_size_in_bytes=self.resident,
            temp_size_in_bytes=self.temp,
            peak_memory_in_bytes=self.temp + self.resident,
        )


def profiler_trace(kernels: Iterable[tuple[int, str, float, float]]) -> dict[str, Any]:
    """A trace as jax.profiler writes it (Chrome format): a GPU (pid 1) with a compute
    stream (tid 7) and two collective streams (13, 14), and ``kernels`` (tid, hlo_op,
    start and duration in us) on them; each kernel again on the GPU's derived "XLA Ops"
    line and as the host's launch (pid 9), which a reader must leave out."""
    meta = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "name": "process_name", "pid": 9, "args": {"name": "/host:CPU"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #7(Compute)"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 13, "args": {"name": "Stream #13"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 14, "args": {"name": "Stream #14"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 900, "args": {"name": "XLA Ops"}},
    ]  # fmt: skip
    events = []
    for tid, op, ts, dur in kernels:
        for pid, line in ((1, tid), (1, 900), (9, 0)):
            events.append({"ph": "X", "pid": pid, "tid": line, "name": f"k_{op}", "ts": ts,
                           "dur": dur if pid == 1 else 5.0, "args": {"hlo_op": op}})  # fmt: skip
    return {"traceEvents": meta + events}
