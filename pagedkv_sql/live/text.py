"""Engine-supplied strings in text output (no dependencies: the CLI imports it at start-up)."""

from __future__ import annotations


def escape(text: str) -> str:
    """Control characters shown escaped (ESC as \\x1b, a newline as \\n): a request id or a
    hash from an engine cannot clear the screen or forge a line. Data formats keep them."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
