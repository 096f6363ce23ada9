"""The command line's flag reader: absl's spellings, one table per command."""

from __future__ import annotations

from typing import Any

import pytest

from xla_streams.cli import flags
from xla_streams.cli.flags import FlagError

TABLE = [
    flags.integer("count", 4, "A number.", lower=1, upper=64),
    flags.string("output", None, "A file.", short="o"),
    flags.boolean("quiet", False, "Say less.", short="q"),
    flags.boolean("progress", None, "Tri-state."),
    flags.enum("policy", "interval", ["interval", "round-robin"], "A choice."),
    flags.real("budget", 300.0, "Seconds.", lower=1.0),
    flags.names("levers", None, "Names."),
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
        (["--budget=2.5"], {"budget": 2.5}, []),
        (["--levers=a, b,,c"], {"levers": ["a", "b", "c"]}, []),
    ],
)
def test_spellings(argv: list[str], changed: dict[str, Any], positional: list[str]) -> None:
    assert flags.parse(argv, TABLE) == (DEFAULTS | changed, positional)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--colour=red"], "unknown flag '--colour'"),
        (["--noocount"], "unknown flag '--noocount'"),
        (["--nocount"], "unknown flag '--nocount'"),  # only booleans negate
        (["--count"], "flag --count needs a value"),
        (["--count=0"], "flag --count=0: expected a number at least 1 and at most 64"),
        (["--count=4.0"], "flag --count=4.0: expected an integer"),
        (["--count=٤"], "flag --count=٤: expected an integer"),  # Arabic-Indic four
        (["--quiet=maybe"], "flag --quiet=maybe: expected true or false"),
        (["--policy=random"], "flag --policy=random: expected one of interval, round-robin"),
        (["--budget=nan"], "flag --budget=nan: expected a finite number"),
        (["--budget=1_0"], "flag --budget=1_0: expected a number"),
        (["--budget=\u0664"], "flag --budget=\u0664: expected a number"),
        (["---count=8"], "unknown flag '---count'"),
        (["--budget=0.5"], "flag --budget=0.5: expected a number at least 1.0"),
    ],
)
def test_errors_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(FlagError) as caught:
        flags.parse(argv, TABLE)
    assert str(caught.value) == message
