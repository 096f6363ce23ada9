"""xla_streams: run overlapping async collectives on several collective streams."""
