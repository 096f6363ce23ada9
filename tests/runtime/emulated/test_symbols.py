"""The stand-ins export exactly the CUDA and NCCL functions the backend imports, under
the symbol version it asks for: a new call in the backend fails here until the
emulator models it (and says where its rule comes from)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from xla_streams.runtime import emulator


def symbols(library: Path, *flags: str) -> set[str]:
    out = subprocess.run(
        ["nm", "-D", *flags, str(library)], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[-1] for line in out.splitlines() if re.search(r" (cuda|nccl)\w*", line)}


def test_the_stand_ins_export_exactly_what_the_backend_imports(
    built: emulator.Built, backend: Path
) -> None:
    imported = symbols(backend, "--undefined-only")
    exported = symbols(built.cudart, "--defined-only") | symbols(built.nccl, "--defined-only")
    exported = {name.replace("@@", "@") for name in exported}
    assert imported, "nm found no CUDA or NCCL import: the test reads the wrong library"
    assert imported == exported, (
        f"imported, not modelled: {sorted(imported - exported)}; "
        f"modelled, not imported: {sorted(exported - imported)}"
    )
    # The CUDA functions carry the CUDA runtime's version, as the backend's references do.
    assert all(f"@{built.cudart_soname}" in name for name in imported if name.startswith("cuda"))
