"""The stream analyses, as plain functions over a parsed module; the passes in
``passes/`` are thin wrappers over them, and the simulator and the tuner call them
directly.

- :mod:`~xla_streams.streams.pairs`: the async pairs of a module and when each is
  in flight (:func:`find_async_pairs`, :class:`AsyncPair`);
- :mod:`~xla_streams.streams.rule`: the deadlock rule (:func:`must_share_stream`)
  and the pairs it ties to one stream (:func:`tied_units`);
- :mod:`~xla_streams.streams.assignment`: the policies that place them on K
  streams (:func:`assign_streams`, :func:`assign_each` for several K and policies at
  once, :class:`StreamAssignment`);
- :mod:`~xla_streams.streams.verify`: the independent check of an assignment
  (:func:`verify_streams`, :class:`VerificationError`).
"""

from xla_streams.streams.assignment import StreamAssignment, assign_each, assign_streams
from xla_streams.streams.pairs import AsyncPair, find_async_pairs, max_in_flight
from xla_streams.streams.rule import RuleWorkExceeded, must_share_stream, tied_units
from xla_streams.streams.verify import VerificationError, verify_streams

__all__ = [
    "AsyncPair",
    "RuleWorkExceeded",
    "StreamAssignment",
    "VerificationError",
    "assign_each",
    "assign_streams",
    "find_async_pairs",
    "max_in_flight",
    "must_share_stream",
    "tied_units",
    "verify_streams",
]
