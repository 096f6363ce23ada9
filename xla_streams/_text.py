"""Plain text for people, one way each: tables with aligned columns and byte sizes.

Reports, tables and command-line output print through these, so that their
columns line up and their sizes read alike wherever they appear.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


def aligned(
    rows: Sequence[Sequence[str]],
    *,
    right: Collection[int] = (),
    indent: str = "",
    rule: bool = False,
) -> list[str]:
    """``rows`` as lines of cells two spaces apart, each column as wide as its widest
    cell: left-aligned, or right-aligned for the column indexes in ``right``.

    Each line starts with ``indent`` and has no trailing spaces. With ``rule``, a
    line of dashes as wide as each column follows the first row (the header).
    """
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append((indent + "  ".join(cells)).rstrip())
        if rule and n == 0:
            lines.append(indent + "  ".join("-" * width for width in widths))
    return lines


def counted(n: int, noun: str) -> str:
    """``counted(1, "pair")`` -> ``1 pair``, ``counted(2, "pair")`` -> ``2 pairs``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def human_bytes(n: int) -> str:
    """``4194304`` -> ``4.0 MiB``: one decimal in the largest binary unit below 1024 of
    it (TiB at most); below 1 KiB the exact count (``12 B``)."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"
