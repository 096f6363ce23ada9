"""The tuner's options in one place: ``TuneOptions`` is the keywords of ``tune`` and the
flags of ``xla-streams tune``, each option checked once; and each lever's names, on the
lever itself. No compile.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import shlex

import pytest

import xla_streams
from xla_streams import cli, xla_options
from xla_streams.cli import flags
from xla_streams.cli.tune import FLAGS, OPTION_FLAGS, option_values
from xla_streams.collectives import MAX_STREAMS
from xla_streams.tuning import driver
from xla_streams.tuning.levers import LEVER_ALIASES, LEVER_NAMES, CollectiveCensus, describe, levers
from xla_streams.tuning.options import DEFAULT_DEVICES_PER_HOST, OPTIONS, TuneOptions
from xla_streams.tuning.result import TuneError

# The flags of `xla-streams tune` that are not options of the tuner.
COMMAND_OWN_FLAGS = {"program", "json", "hlo", "progress"}
CENSUS = CollectiveCensus(8, 8, frozenset({"all-gather", "reduce-scatter", "all-reduce"}), frozenset(),
              True, 0, kind_bytes=(("all-reduce", 1 << 30), ("all-gather", 1 << 30)),
              layer_bytes=(("all-gather", 100 << 20),))  # fmt: skip


def _cli_options(*argv: str) -> TuneOptions:
    """The options the command line ``argv`` gives, read as ``xla-streams tune`` reads them."""
    values, _ = flags.parse(argv, FLAGS)
    return TuneOptions(**option_values(values.__getitem__))


# -- one definition, three front ends -------------------------------------------------------


def test_the_keywords_of_tune_are_the_fields_of_tune_options() -> None:
    for function in (driver.tune, driver.tune_lowered, driver.tune_stablehlo, driver.tune_path):
        keywords = inspect.signature(function).parameters
        assert "options" in keywords
        assert [p.kind for p in keywords.values()][-1] is inspect.Parameter.VAR_KEYWORD
        # No option is a parameter of its own: each is a field, and only there.
        assert not set(OPTIONS) & set(keywords), function.__name__
    assert xla_streams.TuneOptions is TuneOptions
    # Every field is a keyword, with the field's default; nothing else is.
    every = {o.name: o.default for o in OPTIONS.values()}
    assert dataclasses.asdict(TuneOptions(**every)) == dataclasses.asdict(TuneOptions())
    with pytest.raises(TypeError, match="no_such_option"):
        xla_streams.tune(lambda d: None, devices=8, no_such_option=1)
    # Keywords over a whole TuneOptions.
    base = TuneOptions(devices=16, budget_s=30)
    assert driver._merged(base, {"budget_s": 60}) == TuneOptions(devices=16, budget_s=60)


def test_each_option_has_its_help_its_range_and_its_flag() -> None:
    for option in OPTIONS.values():
        assert option.help.endswith(".") and option.reader.takes, option.name
        assert option.check(option.default) == option.default, option.name  # one of its values
    # Every option is a flag of `xla-streams tune`, the same declaration, but the two the
    # command finds itself.
    table = {f.name: f for f in FLAGS}
    assert set(table) == {o.name for o in OPTION_FLAGS} | COMMAND_OWN_FLAGS
    assert all(table[o.name] is o for o in OPTION_FLAGS)
    assert set(OPTIONS) - {o.name for o in OPTION_FLAGS} == {"program", "progress"}
    help_text = io.StringIO()
    assert cli.main(["tune", "--help"], stdout=help_text, stderr=io.StringIO()) == 0
    assert all(f"  {f.usage()}\n" in help_text.getvalue() for f in FLAGS)


def test_tune_help_shows_values_as_typed() -> None:
    help_text = io.StringIO()
    assert cli.main(["tune", "--help"], stdout=help_text, stderr=io.StringIO()) == 0
    shown = help_text.getvalue()
    for typed in (
        "[--budget-compiles=200]",
        "--budget-s=SECONDS",
        "Default: 3600.",
        "Default: 1,2,4,8.",
        "--streams=K,...",
        "--target=h100|h200|a100|b200",
    ):
        assert typed in shown, typed
    # Every default shown reads back, typed as shown in a shell, as the default itself.
    for flag in FLAGS:
        default = flag.default_shown()
        if default is not None:
            assert f"Default: {default}." in shown, flag.name
            (typed,) = shlex.split(default)
            assert flag.read(typed) == flag.default, flag.name


def test_the_spellings_of_today_still_work() -> None:
    given = _cli_options(
        "--devices=32", "--devices-per-host=4", "--hosts-per-nvlink-domain=0", "--target=h200",
        "--budget-s=60", "--budget-compiles=40", "--headroom=0.2",
        "--levers=scale-up-overlap,overlap-limit",
        "--calibration=cal.json", "--perf-table=t.pbtxt", "--profile=p.pbtxt", "--jobs=2",
        "--cache-dir=none", "--ray=auto", "--script=python step.py",
    )  # fmt: skip
    assert given == TuneOptions(
        devices=32, devices_per_host=4, hosts_per_domain=None, target="h200", budget_s=60.0,
        budget_compiles=40, headroom=0.2, levers=("scale-up-overlap-limit", "overlap-limit"),
        calibration="cal.json", perf_table="t.pbtxt", profile="p.pbtxt", jobs=2,
        cache_dir=False, ray="auto", script="python step.py",
    )  # fmt: skip
    assert _cli_options("--cache-dir=") == TuneOptions(cache_dir=False)
    assert _cli_options("--streams=1,2", "--exhaustive") == TuneOptions(
        streams=(1, 2), exhaustive=True
    )
    assert _cli_options() == TuneOptions()  # the flags' defaults are the options'


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"budget_s": 0}, "budget_s=0 is not valid: expected a positive number of seconds"),
        ({"budget_compiles": 0}, "budget_compiles=0 is not valid: expected a positive integer"),
        ({"budget_compiles": 2.5}, "budget_compiles=2.5 is not valid: expected a positive integer"),
        ({"headroom": 1.0}, "headroom=1.0 is not valid: expected a fraction from 0 to 1"),
        ({"jobs": -1}, "jobs=-1 is not valid: expected an integer from 0 to 256"),
        (
            {"streams": (0,)},
            f"streams=(0,) is not valid: expected integers from 1 to {MAX_STREAMS}",
        ),
        ({"streams": ()}, "streams=() is not valid: expected integers from 1 to"),
        (
            {"levers": ["warp"]},
            "levers=['warp'] is not valid: expected distinct names from: overlap-limit, ",
        ),
        ({"levers": ["overlap-limit", "overlap-limit"]}, "expected distinct names"),
        ({"levers": "overlap-limit"}, "expected distinct names"),
        ({"target": "tpu"}, "target='tpu' is not valid: expected one of h100, h200, a100, b200"),
        ({"devices": 0}, "devices=0 is not valid: expected a positive integer"),
        ({"devices": 70_000}, "at most 65536"),
        ({"devices": 8, "devices_per_host": 16}, "devices_per_host=16 is more than devices=8"),
        ({"devices": 12}, "devices=12 is not a multiple of devices_per_host=8"),
        ({"devices": 24, "hosts_per_domain": 2}, "hosts_per_domain=2 does not divide the 3"),
        ({"hosts_per_domain": 0}, "hosts_per_domain=0 is not valid: expected a positive integer"),
        ({"cache_dir": 3}, "cache_dir=3 is not valid: expected a path, or False (no cache)"),
    ],
)
def test_a_bad_option_is_one_tune_error_naming_it(
    keywords: dict[str, object], message: str
) -> None:
    with pytest.raises(TuneError) as e:
        TuneOptions(**keywords)  # type: ignore[arg-type]
    assert message in str(e.value), str(e.value)


def test_a_bad_flag_is_named_as_the_command_line_spells_it() -> None:
    with pytest.raises(flags.FlagError, match=r"^--budget-s=0 is not valid: expected a positive"):
        _cli_options("--budget-s=0")
    with pytest.raises(flags.FlagError, match=r"^--streams=1,100 is not valid: expected integers"):
        _cli_options("--streams=1,100")
    with pytest.raises(flags.FlagError, match=r"^--hosts-per-nvlink-domain=-1 is not valid"):
        _cli_options("--hosts-per-nvlink-domain=-1")
    with pytest.raises(flags.FlagError, match=r"^unknown flag '--budget'; did you mean --budget-s"):
        _cli_options("--budget=60")


def test_devices_per_host_defaults_to_eight_or_every_device() -> None:
    assert TuneOptions(devices=32).topology() == (32, DEFAULT_DEVICES_PER_HOST, 1)
    assert TuneOptions(devices=4).topology() == (4, 4, 1)
    assert TuneOptions(devices=16, hosts_per_domain=None).topology() == (16, 8, None)
    with pytest.raises(TuneError, match="devices is required"):
        TuneOptions().topology()


# -- the levers' names ------------------------------------------------------------------------


def test_a_lever_carries_its_names_and_the_words_of_its_options() -> None:
    every = levers(CENSUS)
    assert tuple(lv.name for lv in every) == LEVER_NAMES
    assert len(set(LEVER_NAMES) | set(LEVER_ALIASES)) == len(LEVER_NAMES) + len(LEVER_ALIASES)
    for lever in every:
        # Each option a lever sets has its word, and the word is the lever's own.
        assert lever.options <= set(lever.words), lever.name
        for setting in lever.settings[1:]:
            assert describe(setting).split("=")[0] in lever.words.values(), lever.name
    # The lever of the scale-up overlap limit is named as its option is worded.
    scale_up = next(lv for lv in every if xla_options.SCALE_UP_OVERLAP_LIMIT in lv.words)
    assert scale_up.name == scale_up.words[xla_options.SCALE_UP_OVERLAP_LIMIT]
    assert dict(LEVER_ALIASES) == {"scale-up-overlap": scale_up.name}  # its name up to 0.2.0
    assert describe({xla_options.SCALE_UP_OVERLAP_LIMIT: 4}) == "scale-up-overlap-limit=4"
