"""Regenerate the tables of XLA's measurements the simulator vendors in
``xla_streams/simulate/data/``: the GPU kinds its targets use, taken from XLA's
collective performance table (``collective_perf_table.txtpb``) or its matmul
performance table (``--table=matmul``: ``matmul_perf_table.txtpb``).

    # from an openxla/xla checkout (the file as XLA keeps it; sections copied byte for byte)
    python tools/vendor_perf_table.py \\
        ~/xla/xla/service/gpu/model/default_collective_perf_table.txtpb --commit=<sha>

    # from the tables compiled into the installed jaxlib CUDA plugin
    python tools/vendor_perf_table.py --from-plugin
    python tools/vendor_perf_table.py --from-plugin --table=matmul

    # only compare: does the vendored file hold what the source has? (exit 1 if not)
    python tools/vendor_perf_table.py --from-plugin --table=matmul --check

The output keeps the source's license header (Apache-2.0, The OpenXLA Authors), adds
a note saying where the data came from, then the ``entries { key: "..." ... }``
blocks of the GPU kinds asked for (``--devices``, default: those of
``xla_streams.simulate.targets`` that the table has), in the order the source has
them. From the plugin, the collective table is the binary
``xla.gpu.DeviceHloInstructionProfiles`` XLA embeds as
``default_collective_perf_table.pb``, found by its map entries (``key`` =
``sm_*``/``gfx*``), decoded with the field numbers of ``xla_streams.simulate.measured``
and printed in the layout of XLA's own file (2-space indent; a message of scalars
that fits in 80 columns on one line); the matmul table is embedded as the text file
itself (``default_matmul_perf_table.txtpb``), whose sections are copied byte for byte.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Use this checkout's xla_streams even if another copy is installed.
sys.path.insert(0, str(REPO))

from xla_streams.simulate.matmul import DEFAULT_MATMUL_TABLE_PATH, parse_matmul_table  # noqa: E402
from xla_streams.simulate.measured import (  # noqa: E402
    DEFAULT_TABLE_PATH,
    PERF_TABLE_ENUMS,
    PERF_TABLE_SCHEMA,
    PerfTableError,
    parse_perf_table,
)
from xla_streams.simulate.targets import TARGETS  # noqa: E402
from xla_streams.simulate.textproto import (  # noqa: E402
    Message,
    ProtoError,
    decode_wire,
    format_text,
    read_varint,
)

UPSTREAM_DIR = "xla/service/gpu/model"
LICENSE_HEADER = """\
# Copyright 2026 The OpenXLA Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#    http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

# proto-file: third_party/tensorflow/compiler/xla/service/gpu/model/hlo_op_profile.proto
# proto-message: xla.gpu.DeviceHloInstructionProfiles
"""
_BLOCK = re.compile(r'^entries \{\n\s*key: "([^"\n]+)"\n.*?^\}[ \t]*\n?', re.MULTILINE | re.DOTALL)
# A map entry of the embedded table: key (field 1) then value (field 2), inside a
# top-level field 2. The key's length byte is checked against the match below.
_MAP_KEY = re.compile(rb"\x0a([\x03-\x20])((?:sm_|gfx)[0-9A-Za-z_]{1,29})\x12")


@dataclass(frozen=True)
class Table:
    """One of XLA's tables: its file upstream, where it is vendored, how it is read."""

    upstream: str  # the file in openxla/xla's UPSTREAM_DIR
    out: Path
    # GPU kind -> measurements, of a rendered table (SystemExit if it does not parse)
    count: Callable[[str, str], dict[str, int]]


def _count_collectives(text: str, path: str) -> dict[str, int]:
    table = parse_perf_table(text, path)
    return {d: len(table.device_measurements(d)) for d in table.devices()}


def _count_gemms(text: str, path: str) -> dict[str, int]:
    table = parse_matmul_table(text, path)
    counts = {}
    for device in table.devices():
        found = table.for_device(device)
        counts[device] = sum(len(p) for p in found.measured.values()) if found else 0
    return counts


TABLES = {
    "collective": Table(
        "default_collective_perf_table.txtpb", DEFAULT_TABLE_PATH, _count_collectives
    ),
    "matmul": Table("default_matmul_perf_table.txtpb", DEFAULT_MATMUL_TABLE_PATH, _count_gemms),
}


def default_devices() -> list[str]:
    """The table keys the shipped targets use, in a stable order."""
    return sorted({t.perf_table_key for t in TARGETS.values() if t.perf_table_key})


def text_sections(text: str) -> tuple[str, dict[str, str]]:
    """The leading comment block of an XLA table file and its GPU kinds' blocks."""
    first = _BLOCK.search(text)
    if first is None:
        raise SystemExit("no `entries { key: ... }` block at column 0: not XLA's table layout")
    header = text[: first.start()]
    return header, {m.group(1): m.group(0) for m in _BLOCK.finditer(text)}


def plugin_path() -> Path:
    """The installed jaxlib CUDA plugin (cuda12, else cuda13)."""
    for package in ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13"):
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            for folder in spec.submodule_search_locations:
                so = Path(folder) / "xla_cuda_plugin.so"
                if so.exists():
                    return so
    raise SystemExit("no jax CUDA plugin installed (pip install 'jax[cuda12]')")


def embedded_table(data: bytes) -> bytes:
    """The embedded binary table: the longest run of back-to-back map entries that
    holds ``sm_90``."""
    entries: dict[int, tuple[int, bytes]] = {}  # start -> (end, key)
    for m in _MAP_KEY.finditer(data):
        if m.group(1)[0] != len(m.group(2)):
            continue
        for header in range(2, 7):  # tag byte + 1..5 length bytes
            start = m.start() - header
            if start < 0 or data[start] != 0x12:
                continue
            try:
                length, body = read_varint(data, start + 1, str(m.start()))
            except ProtoError:
                continue  # not a length: the bytes before the key are something else
            if body == m.start() and length > 0:
                entries[start] = (body + length, m.group(2))
                break
    best: tuple[int, int] | None = None
    for start in sorted(entries):
        if any(end == start for end, _ in entries.values()):
            continue  # not the first of a run
        end, keys, at = start, [], start
        while at in entries:
            end, key = entries[at]
            keys.append(key)
            at = end
        if b"sm_90" in keys and (best is None or end - start > best[1] - best[0]):
            best = (start, end)
    if best is None:
        raise SystemExit("no embedded collective performance table with an sm_90 entry found")
    return data[best[0] : best[1]]


def plugin_sections(so: Path) -> dict[str, str]:
    """Each GPU kind of the plugin's embedded table, as XLA's text file prints it."""
    blob = embedded_table(so.read_bytes())
    try:
        root = decode_wire(
            blob, PERF_TABLE_SCHEMA, "DeviceHloInstructionProfiles", PERF_TABLE_ENUMS
        )
    except ProtoError as e:
        raise SystemExit(f"{so}: the embedded table does not decode: {e}") from None
    sections: dict[str, str] = {}
    for entry in root.messages("entries"):
        wrapper = Message(fields=[("entries", entry, 0)])
        sections[entry.string("key")] = format_text(wrapper)
    return sections


def embedded_text(data: bytes, upstream: str) -> str:
    """The text file XLA embeds as ``upstream`` (the matmul table): its license header
    up to the end of the string, found by its ``proto-message`` line."""
    marker = data.find(b"# proto-message: xla.GemmPerfTable\n")
    start = data.rfind(b"# Copyright", 0, marker)
    end = data.find(b"\0", marker)
    if marker < 0 or start < 0 or end < 0 or marker - start > 4096:
        raise SystemExit(f"no embedded {upstream} (xla.GemmPerfTable text) found")
    return data[start:end].decode("utf-8")


def render(header: str, note: list[str], sections: dict[str, str], devices: list[str]) -> str:
    kept = [key for key in sections if key in devices]
    body = "".join(sections[key] for key in kept)
    return header.rstrip("\n") + "\n\n" + "".join(f"# {line}\n" for line in note) + "\n" + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", nargs="?", help=f"XLA's table in {UPSTREAM_DIR} (text)")
    parser.add_argument("--table", choices=sorted(TABLES), default="collective")
    parser.add_argument("--from-plugin", action="store_true", help="read jaxlib's embedded table")
    parser.add_argument("--commit", default="", help="the openxla/xla commit of SOURCE")
    parser.add_argument("--devices", help="table keys (default: those the targets use)")
    parser.add_argument("--out", help="where to write (default: the vendored file)")
    parser.add_argument("--check", action="store_true", help="compare with --out, write nothing")
    args = parser.parse_args(argv)
    table = TABLES[args.table]
    upstream = f"{UPSTREAM_DIR}/{table.upstream}"
    if bool(args.source) == args.from_plugin:
        parser.error("give SOURCE or --from-plugin (one of them)")
    if args.from_plugin:
        so = plugin_path()
        note = ["--- Provenance (added by xla_streams; not part of XLA's file) ---"]
        plugin = f"{so.parent.name}/{so.name} (sha256 {_sha256(so.read_bytes())[:16]})"
        if args.table == "collective":
            sections = plugin_sections(so)
            header = LICENSE_HEADER
            note += [
                "The table XLA compiles into the jax CUDA plugin as",
                "default_collective_perf_table.pb (binary xla.gpu.DeviceHloInstructionProfiles),",
                f"read from {plugin},",
                "decoded and printed in the layout of openxla/xla",
                f"{upstream}.",
            ]
        else:
            text = embedded_text(so.read_bytes(), table.upstream)
            header, sections = text_sections(text)
            note += [
                f"The text XLA compiles into the jax CUDA plugin as {table.upstream},",
                f"read from {plugin} (sha256 of the text {_sha256(text.encode())[:16]}),",
                f"openxla/xla {upstream}; sections copied byte for byte.",
            ]
    else:
        text = Path(args.source).read_text(encoding="utf-8")
        header, sections = text_sections(text)
        note = [
            "--- Provenance (added by xla_streams; not part of XLA's file) ---",
            f"openxla/xla {upstream}",
            f"at commit {args.commit or '(not given)'} (sha256 of the file "
            f"{_sha256(text.encode())[:16]}), sections copied byte for byte.",
        ]
    if args.devices is not None:
        devices = [d.strip() for d in args.devices.split(",") if d.strip()]
        missing = [d for d in devices if d not in sections]
        if missing:
            raise SystemExit(
                f"the source has no {', '.join(missing)}; it has: {', '.join(sections)}"
            )
    else:
        devices = [d for d in default_devices() if d in sections]
        absent = [d for d in default_devices() if d not in sections]
        if absent:
            note.append(f"The table has no {', '.join(absent)} (those targets go without it).")
    note += [
        f"Only the GPU kinds the simulator's targets use: {', '.join(devices)}.",
        "Regenerate with tools/vendor_perf_table.py (see data/README.md).",
        "--- end of provenance ---",
    ]
    target = Path(args.out or table.out)
    out = render(header, note, sections, devices)
    try:
        counts = table.count(out, str(target))
    except PerfTableError as e:
        raise SystemExit(f"the result does not parse: {e}") from None
    if args.check:
        old = text_sections(target.read_text(encoding="utf-8"))[1] if target.exists() else {}
        new = {key: block for key, block in sections.items() if key in devices}
        differ = sorted(key for key in set(old) | set(new) if old.get(key) != new.get(key))
        print(
            f"{target}: "
            + (f"DIFFERS in {', '.join(differ)}" if differ else "the same sections, byte for byte")
            + f" ({counts} measurements)"
        )
        return 1 if differ else 0
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(out, encoding="utf-8")
    print(f"wrote {target} ({len(out.encode()):,} bytes; measurements per GPU kind: {counts})")
    return 0


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


if __name__ == "__main__":
    sys.exit(main())
