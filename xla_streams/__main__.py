"""``python -m xla_streams`` and the ``xla-streams`` console script: the command line,
:mod:`xla_streams.cli`."""

import gc


def main() -> None:
    # The command line is imported without the cyclic collector: the import makes tens
    # of thousands of objects and no garbage, and each collection on the way would walk
    # them all again. run() turns it back on for a command that imports JAX.
    gc.disable()
    from xla_streams.cli import run

    run()


if __name__ == "__main__":
    main()
