"""One declaration of an option, read the same from every source: its readers take ASCII
text and Python values, refuse with one message naming the value as the user spelled
it, and show a value as the user types it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from xla_streams import option
from xla_streams.option import Option, OptionError

STREAMS = option.integer(1, 64)


@pytest.mark.parametrize(
    ("reader", "text", "value"),
    [
        (STREAMS, " 8 ", 8),
        (option.integer(), "-3", -3),
        (option.number(0, takes="x", above=True), "1e-3", 0.001),
        (option.boolean(), "Yes", True),
        (option.boolean(), "off", False),
        (option.choice(["interval", "round-robin"]), "Round-Robin", "round-robin"),
        (option.choice(["a-long-name"], aliases={"short": "a-long-name"}), "short", "a-long-name"),
        (option.sequence(STREAMS, takes="x"), "8, 1,,2", (8, 1, 2)),
        (option.sequence(option.integer(0), takes="x", separator=":", empty=True), "", ()),
        (option.optional(STREAMS, takes="x", words={"0": None}), "0", None),
    ],
)
def test_text_reads_as_typed(reader: option.Reader[Any], text: str, value: object) -> None:
    assert reader.read(text) == value


@pytest.mark.parametrize(
    "text", ["0", "65", "٤", "²", "\uff14", "+4", "4_0", "4.0", "0x4", "", "1" * 30, "four"]
)
def test_an_integer_is_ascii_digits_in_its_range(text: str) -> None:
    # int() reads several of these ('٤', fullwidth 4, '+4', '4_0'): the reader takes none.
    with pytest.raises(ValueError, match="^expected an integer from 1 to 64$"):
        STREAMS.read(text)


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1_0", "٤", "0", "", "1e999"])
def test_a_number_is_ascii_finite_and_in_its_range(text: str) -> None:
    with pytest.raises(ValueError, match="^expected a positive number$"):
        option.number(0, takes="a positive number", above=True).read(text)


@pytest.mark.parametrize(
    ("reader", "value"),
    [(STREAMS, True), (STREAMS, 4.0), (STREAMS, "4"), (option.boolean(), 1),
     (option.number(takes="x"), math.nan), (option.number(takes="x"), False),
     (option.sequence(STREAMS, takes="x"), "12"), (option.sequence(STREAMS, takes="x"), ()),
     (option.sequence(STREAMS, takes="x", distinct=True), (1, 1)), (option.text(), b"x")],
)  # fmt: skip
def test_a_python_value_is_of_its_type(reader: option.Reader[Any], value: object) -> None:
    with pytest.raises(ValueError, match="^expected "):
        reader.check(value)


def test_show_writes_what_read_reads_back() -> None:
    for reader, value in [
        (option.number(takes="x"), 3600.0),
        (option.sequence(STREAMS, takes="x"), (1, 2, 4, 8)),
        (option.sequence(option.integer(0), takes="x", separator=":"), (3, 1, 2)),
        (option.boolean(), False),
        (option.optional(option.path(), takes="x", words={"none": False}, also=(False,)), False),
    ]:
        shown = reader.show(value)
        assert reader.read(shown) == value, shown
    assert option.number(takes="x").show(3600.0) == "3600"
    assert option.sequence(STREAMS, takes="x").show((1, 2, 4, 8)) == "1,2,4,8"


def test_a_path_must_be_what_the_option_says(tmp_path: Path) -> None:
    a_file = tmp_path / "f"
    a_file.write_text("")
    assert option.path(must_be="file").read(str(a_file)) == str(a_file)
    assert option.path(must_be="directory", absolute=True).check(tmp_path / "new") == str(
        tmp_path / "new"
    )
    with pytest.raises(ValueError, match="^no such file$"):
        option.path(must_be="file").read(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="^not a directory$"):
        option.path(must_be="directory").read(str(a_file))


POLICY = Option(
    "policy", "interval", "How.", option.choice(["interval", "round-robin"]),
    env="XLA_STREAMS_POLICY", flag="xla_streams_policy",
)  # fmt: skip


def test_an_error_names_the_value_as_each_source_spells_it() -> None:
    expected = "is not valid: expected one of interval, round-robin"
    cases = [
        (lambda: POLICY.read("fifo", "env"), f"XLA_STREAMS_POLICY='fifo' {expected}"),
        (lambda: POLICY.read("fifo", "flag"), f"--xla_streams_policy=fifo {expected}"),
        (lambda: POLICY.read("fifo", "spec"), f"policy=fifo {expected}"),
        (lambda: POLICY.check("fifo"), f"policy='fifo' {expected}"),
        (lambda: POLICY.check(3, "best.policy"), f"best.policy=3 {expected}"),
        (lambda: POLICY.from_env({"XLA_STREAMS_POLICY": " fifo "}), f"XLA_STREAMS_POLICY='fifo' {expected}"),
    ]  # fmt: skip
    for call, message in cases:
        with pytest.raises(OptionError) as e:
            call()
        assert (str(e.value), e.value.option) == (message, "policy")
    assert POLICY.from_env({"XLA_STREAMS_POLICY": "  "}) == "interval"  # empty: unset
    assert POLICY.usage() == "--xla_streams_policy=interval|round-robin"
    assert POLICY.help_line() == "How. Default: interval."


def test_a_misspelling_gets_the_nearest_name() -> None:
    assert option.suggestion("--stream", ["--streams", "--policy"], "--") == (
        "; did you mean --streams?"
    )
    assert option.suggestion("XLA_STREAMS_POLCY", ["XLA_STREAMS_POLICY"], "XLA_STREAMS_") == (
        "; did you mean XLA_STREAMS_POLICY?"
    )
    assert option.suggestion("--colour", ["--count"], "--") == ""


@dataclass(frozen=True)
class _Options:
    streams: tuple[int, ...] = option.option((1, 2), option.sequence(STREAMS, takes="Ks"), "Ks.")
    name: str = option.option("A", option.choice(["a", "b"]), "A name.", flag="the-name")

    def __post_init__(self) -> None:
        option.check_fields(self)


def test_a_dataclass_declares_its_options_as_fields() -> None:
    declared = option.options_of(_Options)
    assert list(declared) == ["streams", "name"]
    assert declared["name"].flag_name == "the-name" and declared["streams"].flag_name == "streams"
    # Each field checked when made, and kept in its one spelling.
    assert _Options(streams=[4, 2], name="B") == _Options(streams=(4, 2), name="b")  # type: ignore[arg-type]
    with pytest.raises(OptionError, match=r"^streams=\[0\] is not valid: expected Ks$"):
        _Options(streams=[0])  # type: ignore[arg-type]

    @dataclass(frozen=True)
    class Plain:
        x: int = 0

    with pytest.raises(TypeError, match="Plain.x is not declared with option"):
        option.options_of(Plain)
