"""``python -m xla_streams``: the ``xla-streams`` command line."""

from xla_streams.cli import run

run()
