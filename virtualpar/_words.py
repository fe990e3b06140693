"""Counted nouns for messages users read: "1 message was sent", "2 messages were sent" — not "message(s)"."""

from __future__ import annotations

__all__ = ["counted", "plural"]


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``noun`` for a count of ``n``: as it is for 1, else ``many`` (default: ``noun + "s"``)."""
    return noun if n == 1 else many or noun + "s"


def counted(n: int, noun: str, many: str | None = None) -> str:
    """``n`` and its noun: ``counted(1, "op") == "1 op"``, ``counted(3, "op") == "3 ops"``."""
    return f"{n} {plural(n, noun, many)}"
