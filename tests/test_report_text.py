"""The plain-text helpers every table and size goes through (``xla_streams._text``)."""

from __future__ import annotations

from xla_streams._text import aligned, human_bytes


def test_aligned_pads_each_column_to_its_widest_cell() -> None:
    rows = [("name", "n", "note"), ("a", "123", ""), ("longer", "4", "x")]
    assert aligned(rows) == ["name    n    note", "a       123", "longer  4    x"]


def test_aligned_right_columns_indent_and_rule() -> None:
    rows = [("kind", "bytes"), ("all-reduce", "4.0 MiB"), ("send", "12 B")]
    assert aligned(rows, right={1}, indent="  ", rule=True) == [
        "  kind          bytes",
        "  ----------  -------",
        "  all-reduce  4.0 MiB",
        "  send           12 B",
    ]


def test_aligned_without_rows() -> None:
    assert aligned([]) == []


def test_human_bytes_keeps_one_decimal() -> None:
    assert [human_bytes(n) for n in (12, 4 << 20, 1536, 3 << 40)] == [
        "12 B",
        "4.0 MiB",
        "1.5 KiB",
        "3.0 TiB",
    ]
