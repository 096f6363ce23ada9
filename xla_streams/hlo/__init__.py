"""HLO text front end: parse a module, inspect and edit it, print it back."""

from xla_streams.hlo.errors import HloError
from xla_streams.hlo.module import Computation, Instruction, Module
from xla_streams.hlo.reader import parse_module
from xla_streams.hlo.shape import Shape, parse_shape

__all__ = [
    "Computation",
    "HloError",
    "Instruction",
    "Module",
    "Shape",
    "parse_module",
    "parse_shape",
]
