"""What several test files share."""

from __future__ import annotations

import re

# jax >= 0.11 prints an async all-reduce with this attribute, which its own HLO
# text parser then rejects. Tests that need XLA to parse printed text drop it: it
# only records an aliasing XLA re-derives, and the plugin never goes this way (it
# writes XLA's proto).
_UNPARSABLE_ALIASING = re.compile(r", output_to_operand_aliasing=\{\{1\}: \(0, \{\}\)\}")


def xla_parsable(text: str) -> str:
    """``text`` as XLA's own text parser accepts it (see above)."""
    return _UNPARSABLE_ALIASING.sub("", text)
