"""What XLA writes with ``xla_dump_to``, read: the optimized module, and the stream each
async collective runs on (the thunk sequence).

A GPU compile with ``xla_dump_to=DIR`` and ``xla_dump_hlo_as_text`` writes, per module,
``*.<module>.*after_optimizations.txt`` (the scheduled HLO),
``*.<module>.thunk_sequence.txt`` (the thunks XLA runs, an async start with its
``stream=communication_stream[k]``) and ``*.<module>.thunk_metadata.txt`` (each thunk's
id and the instruction it runs). The proofs of native mode (``tools/prove_native_streams.py``,
``tools/prove_tune.py``) and the GPU check compare these with the report.
"""

from __future__ import annotations

import re
from pathlib import Path

from xla_streams.hlo import parse_module

_THUNK_START = re.compile(
    r"^\s*(\d+): kAsyncStart\b.*?\bstream=(?:communication_stream\[(\d+)\]|(\S+?))[,\s]"
)
_METADATA = re.compile(r'profile_annotation: "([^"]*)"\s*thunk_id: (\d+)')


def thunk_streams(thunk_sequence: str, thunk_metadata: str) -> dict[str, int | str]:
    """Instruction name -> the communication stream its async start thunk runs on.

    Nested thunks (while bodies) are included. A stream that is not a
    communication stream is given by its printed name.
    """
    names = {int(i): name for name, i in _METADATA.findall(thunk_metadata)}
    result: dict[str, int | str] = {}
    for line in thunk_sequence.splitlines():
        m = _THUNK_START.match(line)
        if m is None:
            continue
        thunk_id = int(m.group(1))
        name = names.get(thunk_id, f"<thunk {thunk_id}>")
        result[name] = int(m.group(2)) if m.group(2) is not None else m.group(3)
    return result


def read_dump(dump_dir: str | Path, module: str) -> tuple[str, dict[str, int | str]]:
    """(the optimized HLO, the thunk streams) of ``module`` from an XLA dump folder;
    FileNotFoundError unless it holds exactly one of each file."""

    def one(suffix: str) -> str:
        found = sorted(Path(dump_dir).glob(f"*.{module}.{suffix}"))
        if len(found) != 1:
            raise FileNotFoundError(
                f"expected one *.{module}.{suffix} in {dump_dir}, found {len(found)}"
            )
        return found[0].read_text()

    hlo = one("*after_optimizations.txt")
    return hlo, thunk_streams(one("thunk_sequence.txt"), one("thunk_metadata.txt"))


def schedule(text: str) -> list[list[str]]:
    """Per computation, the opcodes of its instructions in schedule order: what two
    compiles of one program in one process share (XLA renumbers the names, not the
    opcodes)."""
    return [[i.opcode for i in c.instructions] for c in parse_module(text).computations]


def schedule_difference(a: list[list[str]], b: list[list[str]]) -> str | None:
    """Where two :func:`schedule`\\ s first differ, in words; None where they are equal."""
    if len(a) != len(b):
        return f"{len(a)} vs {len(b)} computations"
    for n, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            i = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), None)
            return f"computation {n}: " + (
                f"position {i}: {x[i]} vs {y[i]}" if i is not None else f"{len(x)} vs {len(y)}"
            )
    return None
