"""One way to declare an option: :class:`Option`, and the :class:`Reader` of its values.

An option is declared once: its name (the Python keyword, and its name in a pipeline
spec), default, help, reader (its type and range) and its other spellings, an
environment variable and a command-line flag. The plugin's settings and the
runtime's variables (:mod:`xla_streams.environment`), ``TuneOptions``, every
command's flags and every pass's options are declared so; the commands' help and
usage lines and the docs' tables are made from the declarations, and show values
as a user types them (``1,2,4,8``, ``3600``, ``none``).

A reader takes a value two ways: as text a user typed (an environment variable, a
flag, a pipeline spec: ASCII digits only, so ``٤``, ``+4`` and ``1_0`` are no
number) and as a Python value (a keyword: ``True`` is no integer). Either way a
value it refuses is one :class:`OptionError` naming the value as the user spelled it
and what the option takes::

    XLA_STREAMS_POLICY='fifo' is not valid: expected one of interval, round-robin
    --budget-s=0 is not valid: expected a positive number of seconds
    streams=0 is not valid: expected an integer from 1 to 64

Options of a dataclass (``TuneOptions``, a pass) are its fields, declared with
:func:`option` and checked by :func:`check_fields`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal

# Where a value comes from: the source decides how the option is spelled and how
# the value is shown in an error.
Source = Literal["env", "flag", "keyword", "spec"]


class OptionError(ValueError):
    """A value an option does not take; the message names it as the user spelled it."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


class Reader[T]:
    """How an option's values are read (``read``: text as typed) and checked
    (``check``: a Python value), each returning the value in its one spelling (a
    tuple for a sequence, a choice in lower case) or raising ValueError saying what
    was expected; ``takes`` says it in words, ``metavar`` stands for a value in
    usage lines, ``show`` writes a value as a user types it; ``switch``: a flag that
    needs no value (--name, --noname).

    Readers and options are made once, at import, and never changed. Plain classes,
    not dataclasses: ``xla-streams opt`` declares its flags with them and starts
    without loading ``dataclasses``, which loads ``inspect``: about 8 ms of every start.
    """

    __slots__ = ("check", "metavar", "read", "show", "switch", "takes")

    def __init__(
        self,
        takes: str,
        read: Callable[[str], T],
        check: Callable[[Any], T],
        metavar: str,
        show: Callable[[Any], str] = str,
        switch: bool = False,
    ) -> None:
        self.takes = takes
        self.read = read
        self.check = check
        self.metavar = metavar
        self.show = show
        self.switch = switch


def ascii_integer(text: str, *, signed: bool = True, most_digits: int = 18) -> int:
    """The integer ``text`` writes in ASCII decimal digits, with a '-' first where
    ``signed``; ValueError otherwise. ``int()`` alone also reads '٤', '²', '+4', '1_0'
    and ' 4', and spends its time on 4300 digits."""
    digits = text.removeprefix("-") if signed else text
    if not (digits.isascii() and digits.isdigit()) or len(digits) > most_digits:
        raise ValueError(f"expected ASCII digits, not {text!r}")
    return int(text)


def _expected(takes: str) -> ValueError:
    return ValueError(f"expected {takes}")


def integer(
    lowest: int | None = None,
    highest: int | None = None,
    *,
    takes: str | None = None,
    metavar: str = "N",
) -> Reader[int]:
    """An integer in ``lowest..highest`` (either end open where None)."""
    if takes is None:
        if lowest is not None and highest is not None:
            takes = f"an integer from {lowest} to {highest}"
        elif lowest == 1:
            takes = "a positive integer"
        elif lowest is not None:
            takes = f"an integer of at least {lowest}"
        else:
            takes = "an integer" if highest is None else f"an integer of at most {highest}"

    def check(value: Any) -> int:
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or (lowest is not None and value < lowest)
            or (highest is not None and value > highest)
        ):
            raise _expected(takes)
        return value

    def read(text: str) -> int:
        try:
            return check(ascii_integer(text.strip()))
        except ValueError:
            raise _expected(takes) from None

    return Reader(takes, read, check, metavar)


_INFINITY = float("inf")  # not math's: math is one more module at every start


def number(
    lowest: float = -_INFINITY,
    highest: float = _INFINITY,
    *,
    takes: str,
    above: bool = False,
    below: bool = False,
    metavar: str = "X",
) -> Reader[float]:
    """A finite real number from ``lowest`` to ``highest``: ``above`` leaves ``lowest``
    out, ``below`` leaves ``highest`` out."""

    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _expected(takes)
        if not (
            -_INFINITY < value < _INFINITY  # finite: NaN compares false
            and (lowest < value if above else lowest <= value)
            and (value < highest if below else value <= highest)
        ):
            raise _expected(takes)
        return float(value)

    def read(text: str) -> float:
        # float() also reads '٤', '1_0', 'inf' and 'nan': a number here is ASCII, finite.
        stripped = text.strip()
        if not stripped.isascii() or "_" in stripped:
            raise _expected(takes)
        try:
            return check(float(stripped))
        except ValueError:
            raise _expected(takes) from None

    return Reader(takes, read, check, metavar, _show_number)


def _show_number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def boolean() -> Reader[bool]:
    """True or false: ``true``, ``1``, ``yes``, ``on`` or their opposites, in any case."""
    takes = "true or false (or 1, 0, yes, no, on, off)"

    def check(value: Any) -> bool:
        if not isinstance(value, bool):
            raise _expected(takes)
        return value

    def read(text: str) -> bool:
        word = text.strip().lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
        raise _expected(takes)

    return Reader(takes, read, check, "true|false", lambda v: str(v).lower(), switch=True)


def choice(
    values: Sequence[str], *, aliases: Mapping[str, str] | None = None, metavar: str | None = None
) -> Reader[str]:
    """One of ``values`` (written in lower case), in any case; an alias stands for the
    value it names."""
    names = dict(aliases or {}) | {v: v for v in values}
    takes = f"one of {', '.join(values)}"

    def check(value: Any) -> str:
        found = names.get(value.lower()) if isinstance(value, str) else None
        if found is None:
            raise _expected(takes)
        return found

    return Reader(takes, lambda text: check(text.strip()), check, metavar or "|".join(values))


def text(*, metavar: str = "TEXT", takes: str = "text") -> Reader[str]:
    """Any text, as typed."""

    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise _expected(takes)
        return value

    return Reader(takes, check, check, metavar)


def path(
    *,
    must_be: Literal["file", "directory"] | None = None,
    absolute: bool = False,
    metavar: str = "PATH",
) -> Reader[Any]:
    """A path (text or ``os.PathLike``): with ``must_be="file"``, of an existing file;
    with ``"directory"``, of a directory or of nothing yet; ``absolute``: made absolute
    (``~`` expanded)."""

    def check(value: Any) -> Any:
        if not isinstance(value, str | os.PathLike):
            raise _expected("a path")
        if not absolute and must_be is None:
            return value
        resolved = os.path.abspath(os.path.expanduser(os.fspath(value)))
        if must_be == "file" and not os.path.isfile(resolved):
            raise ValueError("no such file")
        if must_be == "directory" and os.path.exists(resolved) and not os.path.isdir(resolved):
            raise ValueError("not a directory")
        return resolved if absolute else value

    takes = {
        None: "a path",
        "file": "the path of a file",
        "directory": "the path of a directory (made where missing)",
    }[must_be]
    return Reader(takes, check, check, metavar, os.fspath)


def sequence[T](
    item: Reader[T],
    *,
    takes: str,
    separator: str = ",",
    distinct: bool = False,
    empty: bool = False,
) -> Reader[tuple[T, ...]]:
    """Several values of ``item``, written ``a,b,c`` (spaces and empty items ignored);
    a tuple in Python (any sequence but a string). ``distinct``: no value twice;
    ``empty``: none at all is a value too."""

    def checked(values: tuple[T, ...]) -> tuple[T, ...]:
        if (not values and not empty) or (distinct and len(set(values)) != len(values)):
            raise _expected(takes)
        return values

    def check(value: Any) -> tuple[T, ...]:
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise _expected(takes)
        try:
            return checked(tuple(item.check(v) for v in value))
        except ValueError:
            raise _expected(takes) from None

    def read(text: str) -> tuple[T, ...]:
        parts = [part.strip() for part in text.split(separator)]
        try:
            return checked(tuple(item.read(part) for part in parts if part))
        except ValueError:
            raise _expected(takes) from None

    def show(value: Any) -> str:
        return separator.join(item.show(v) for v in value)

    return Reader(takes, read, check, f"{item.metavar}{separator}...", show)


def optional[T](
    reader: Reader[T],
    *,
    takes: str,
    words: Mapping[str, object] | None = None,
    also: Collection[object] = (None,),
) -> Reader[Any]:
    """``reader``'s values, and those of ``also`` (None, False: compared by identity) in
    Python; on the command line, ``words`` stand for them (``none``: False)."""
    words = dict(words or {})

    def check(value: Any) -> Any:
        if any(value is special for special in also):
            return value
        try:
            return reader.check(value)
        except ValueError:
            raise _expected(takes) from None

    def read(text: str) -> Any:
        if text.strip().lower() in words:
            return words[text.strip().lower()]
        try:
            return reader.read(text)
        except ValueError:
            raise _expected(takes) from None

    def show(value: Any) -> str:
        word = next((w for w, v in words.items() if v is value and w), None)
        return word if word is not None else reader.show(value)

    return Reader(takes, read, check, reader.metavar, show, reader.switch)


# -- the declaration ------------------------------------------------------------------


class Option[T]:
    """One option: ``name`` (its keyword, and its name in a pipeline spec), its
    default, its help (a sentence), its reader, and where it has them its environment
    variable (``env``), its command-line flag (``flag``, without dashes; "": the name
    with dashes) and that flag's one-letter name (``short``)."""

    __slots__ = ("default", "env", "flag", "help", "name", "reader", "short")

    def __init__(
        self,
        name: str,
        default: T,
        help: str,
        reader: Reader[T],
        env: str | None = None,
        flag: str = "",
        short: str | None = None,
    ) -> None:
        self.name = name
        self.default = default
        self.help = help
        self.reader = reader
        self.env = env
        self.flag = flag
        self.short = short

    def __repr__(self) -> str:
        return f"Option({self.name!r}, default={self.default!r})"

    @property
    def flag_name(self) -> str:
        """Its command-line flag without the dashes: ``budget-s``."""
        return self.flag or self.name.replace("_", "-")

    def spelled(self, source: Source) -> str:
        """``XLA_STREAMS_POLICY``, ``--budget-s``, ``policy``: this option in ``source``."""
        if source == "env" and self.env:
            return self.env
        if source == "flag":
            return f"--{self.flag_name}"
        return self.name

    def shown(self, value: Any, source: Source) -> str:
        """``value`` as the user wrote it for this option: a variable's text quoted (it
        may hold spaces), a keyword's value as Python writes it."""
        if source == "env":
            return f"{self.spelled(source)}={str(value)!r}"
        if source == "keyword":
            return f"{self.name}={value!r}"
        return f"{self.spelled(source)}={value}"

    def read(self, text: str, source: Source = "flag") -> T:
        """``text`` as typed in ``source``; OptionError naming it unless the option
        takes it."""
        try:
            return self.reader.read(text)
        except ValueError as e:
            raise self.invalid(text, source, e) from None

    def check(self, value: Any, spelled: str | None = None) -> T:
        """A Python ``value`` (a keyword's), in its one spelling; OptionError naming it
        (as ``spelled`` where given: ``best.streams`` in a tune file) unless the
        option takes it."""
        try:
            return self.reader.check(value)
        except ValueError as e:
            if spelled is None:
                raise self.invalid(value, "keyword", e) from None
            raise OptionError(self.name, f"{spelled}={value!r} is not valid: {e}") from None

    def invalid(self, value: Any, source: Source, reason: ValueError | str) -> OptionError:
        return OptionError(self.name, f"{self.shown(value, source)} is not valid: {reason}")

    def from_env(self, environ: Mapping[str, str] | None = None) -> T:
        """The value of this option's variable; its default where that is unset or empty."""
        assert self.env is not None, f"{self.name} has no environment variable"
        found = (os.environ if environ is None else environ).get(self.env, "").strip()
        return self.read(found, "env") if found else self.default

    def usage(self, value: Any = None) -> str:
        """``--budget-s=SECONDS``, ``--budget-s=3600`` (with ``value``) or ``--[no]quiet``."""
        if self.reader.switch:
            return f"--[no]{self.flag_name}"
        shown = self.metavar if value is None else self.reader.show(value)
        return f"--{self.flag_name}={shown}"

    @property
    def metavar(self) -> str:
        return self.reader.metavar

    def default_shown(self) -> str | None:
        """The default as a user types it in a shell (``'python train.py'``); None where
        the option has none to type (None: the help says what happens)."""
        import shlex  # for help and docs only: not at start-up

        return None if self.default is None else shlex.quote(self.reader.show(self.default))

    def help_line(self) -> str:
        """The help, then the default as a user types it: a flag's help."""
        shown = self.default_shown()
        return self.help if shown is None else f"{self.help} Default: {shown}."


def suggestion(name: str, known: Collection[str], prefix: str = "") -> str:
    """``; did you mean --streams?``: the name of ``known`` nearest to ``name``, if one is
    near, compared without the ``prefix`` both are spelled with."""
    import difflib  # only for a misspelling: not at start-up

    bare = name.removeprefix(prefix)
    near = difflib.get_close_matches(bare, [k.removeprefix(prefix) for k in known], n=1)
    return f"; did you mean {prefix}{near[0]}?" if near else ""


# -- options as the fields of a dataclass ---------------------------------------------
# (``dataclasses`` is imported where it is used: see Reader.)

_OPTION = "xla_streams.option"


def option[T](default: T, reader: Reader[T], help: str, *, flag: str = "") -> Any:
    """A dataclass field that is an option (its name is the field's)."""
    import dataclasses

    declared = Option("", default, help, reader, flag=flag)
    return dataclasses.field(default=default, metadata={_OPTION: declared})


_OPTIONS_OF: dict[type, dict[str, Option[Any]]] = {}


def options_of(cls: type) -> dict[str, Option[Any]]:
    """The options of a dataclass declared with :func:`option`, by name, in order;
    TypeError for a field declared otherwise."""
    found = _OPTIONS_OF.get(cls)
    if found is None:
        import dataclasses

        found = {}
        for f in dataclasses.fields(cls):
            declared = f.metadata.get(_OPTION)
            if declared is None:
                raise TypeError(f"{cls.__name__}.{f.name} is not declared with option()")
            found[f.name] = Option(
                f.name, declared.default, declared.help, declared.reader, flag=declared.flag
            )
        _OPTIONS_OF[cls] = found
    return found


def check_fields(instance: Any) -> None:
    """Check every option of a frozen dataclass instance and keep each in its one
    spelling; OptionError naming the first that its option does not take."""
    for name, declared in options_of(type(instance)).items():
        object.__setattr__(instance, name, declared.check(getattr(instance, name)))


__all__ = [
    "Option",
    "OptionError",
    "Reader",
    "Source",
    "ascii_integer",
    "boolean",
    "check_fields",
    "choice",
    "integer",
    "number",
    "option",
    "optional",
    "options_of",
    "path",
    "sequence",
    "suggestion",
    "text",
]
