"""The passes, one per file. Importing this package registers them all.

The folder sits at the top of the repository so that the pipeline is visible in
the layout; the link ``xla_streams/passes`` makes it ``xla_streams.passes``, and
only that name works (imported as ``passes`` the modules would be a second copy,
with a second registry).
"""

if __name__ != "xla_streams.passes":
    raise ImportError(f"import the passes as 'xla_streams.passes', not as '{__name__}'")

from xla_streams.passes import (
    annotate_streams,
    assign_streams,
    asyncify,
    find_async_pairs,
    lower_to_ffi,
    verify_streams,
)

__all__ = [
    "annotate_streams",
    "assign_streams",
    "asyncify",
    "find_async_pairs",
    "lower_to_ffi",
    "verify_streams",
]
