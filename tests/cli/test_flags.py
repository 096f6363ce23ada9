"""The command line's flag reader: absl's spellings, one table of options per command."""

from __future__ import annotations

from typing import Any

import pytest

from xla_streams import option
from xla_streams.cli import flags
from xla_streams.cli.flags import FlagError
from xla_streams.option import Option

_NAMES = option.sequence(option.text(), takes="names")
TABLE = [
    Option("count", 4, "A number.", option.integer(1, 64)),
    Option("output", None, "A file.", option.path(), short="o"),
    Option("quiet", False, "Say less.", option.boolean(), short="q"),
    Option("progress", None, "Tri-state.", option.optional(option.boolean(), takes="a bool")),
    Option("policy", "interval", "A choice.", option.choice(["interval", "round-robin"])),
    Option("budget_s", 300.0, "Seconds.", option.number(1, takes="at least a second")),
    Option("levers", None, "Names.", option.optional(_NAMES, takes="names")),
]
DEFAULTS = {f.name: f.default for f in TABLE}


@pytest.mark.parametrize(
    ("argv", "changed", "positional"),
    [
        ([], {}, []),
        (["--count=8"], {"count": 8}, []),
        (["--count", "8"], {"count": 8}, []),
        (["-count=8"], {"count": 8}, []),
        (["-o", "out.hlo", "in.hlo"], {"output": "out.hlo"}, ["in.hlo"]),
        (["-o=out.hlo"], {"output": "out.hlo"}, []),
        (["--output", "-"], {"output": "-"}, []),  # a value may look like a flag
        (["--output="], {"output": ""}, []),
        (["--quiet"], {"quiet": True}, []),
        (["-q", "--noquiet"], {"quiet": False}, []),
        (["--quiet", "--no-quiet"], {"quiet": False}, []),
        (["--quiet=false"], {"quiet": False}, []),
        (["--noprogress"], {"progress": False}, []),
        (["--count=2", "--count=3"], {"count": 3}, []),  # the last wins
        (["a", "--count=2", "b"], {"count": 2}, ["a", "b"]),  # flags and arguments interleave
        (["-", "--", "--count=2"], {}, ["-", "--count=2"]),
        (["--policy=round-robin"], {"policy": "round-robin"}, []),
        (["--policy=Round-Robin"], {"policy": "round-robin"}, []),  # a choice in any case
        (["--budget-s=2.5"], {"budget_s": 2.5}, []),  # under its name with dashes
        (["--levers=a, b,,c"], {"levers": ("a", "b", "c")}, []),
        (["--quiet=on", "--count= 8 "], {"quiet": True, "count": 8}, []),
    ],
)
def test_spellings(argv: list[str], changed: dict[str, Any], positional: list[str]) -> None:
    assert flags.parse(argv, TABLE) == (DEFAULTS | changed, positional)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--colour=red"], "unknown flag '--colour'"),
        (["--counts=2"], "unknown flag '--counts'; did you mean --count?"),
        (["--budget=2"], "unknown flag '--budget'; did you mean --budget-s?"),
        (["--noocount"], "unknown flag '--noocount'; did you mean --count?"),
        (["--nocount"], "unknown flag '--nocount'; did you mean --count?"),  # only switches negate
        (["--count"], "flag --count needs a value"),
        (["--count=0"], "--count=0 is not valid: expected an integer from 1 to 64"),
        (["--count=4.0"], "--count=4.0 is not valid: expected an integer from 1 to 64"),
        (
            ["--count=٤"],
            "--count=٤ is not valid: expected an integer from 1 to 64",
        ),  # Arabic-Indic four
        (["--count=+4"], "--count=+4 is not valid: expected an integer from 1 to 64"),
        (
            ["--quiet=maybe"],
            "--quiet=maybe is not valid: expected true or false (or 1, 0, yes, no, on, off)",
        ),
        (
            ["--policy=random"],
            "--policy=random is not valid: expected one of interval, round-robin",
        ),
        (["--budget-s=nan"], "--budget-s=nan is not valid: expected at least a second"),
        (["--budget-s=inf"], "--budget-s=inf is not valid: expected at least a second"),
        (["--budget-s=1_0"], "--budget-s=1_0 is not valid: expected at least a second"),
        (["--budget-s=\u0664"], "--budget-s=\u0664 is not valid: expected at least a second"),
        (["---count=8"], "unknown flag '---count'; did you mean --count?"),
        (["--budget-s=0.5"], "--budget-s=0.5 is not valid: expected at least a second"),
    ],
)
def test_errors_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(FlagError) as caught:
        flags.parse(argv, TABLE)
    assert str(caught.value) == message
