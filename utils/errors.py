"""Short error text for one-line reports (command line, widgets, fallbacks)."""

from __future__ import annotations


def first_line(exc: BaseException, limit: int | None = None) -> str:
    """``"TypeName: first non-empty line of the message"``, or just the type
    name for an empty message; cut to `limit` characters (ending in "...")."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    if limit is not None and len(text) > limit:
        text = text[: max(limit - 3, 0)] + "..."
    return text
