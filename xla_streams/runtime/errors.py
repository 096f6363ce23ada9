"""Errors of the runtime package (kept apart so importing them builds nothing)."""


class BuildError(RuntimeError):
    """A native library could not be built or loaded; the message says why and what to do."""
