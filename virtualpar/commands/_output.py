"""What the commands share about their output: ``--width`` and whether a picture can be drawn."""

from __future__ import annotations

import argparse
import sys

__all__ = ["table_width", "can_draw", "MIN_WIDTH"]

MIN_WIDTH = 40


def table_width(text: str) -> int:
    """``--width N``: columns of the printed tables and timelines, at least :data:`MIN_WIDTH`."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < MIN_WIDTH:
        raise argparse.ArgumentTypeError(f"width must be an int of at least {MIN_WIDTH} columns, "
                                         f"got {text!r}")
    return n


def can_draw(command: str) -> bool:
    """Whether matplotlib imports; if not, say how to install it on stderr (before the work, not after)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"virtualpar {command}: --png needs matplotlib, which is not installed: "
              'pip install "virtualpar[viz]"',
              file=sys.stderr)
        return False
    return True
