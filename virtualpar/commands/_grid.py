"""Fold a wide rank × step text grid into blocks of columns that fit a terminal.

The grids of ``pipeline`` timelines (``rank |   0F0   0F1 ...``) and of the strategies
(``worker | f0:0 f0:1 ...``) have one label column, a bar, then cells of one fixed period.  A long
step no longer runs off a 100-column terminal: its steps are shown ``k`` at a time, each block with
its own header row of step numbers, blocks one under the other.
"""

from __future__ import annotations

from ..trace.fmt import WIDTH

__all__ = ["fold_grid"]


def _period(header: str) -> int | None:
    """The cell period of a grid's header body ``"    0     1 ..."`` or ``"0    1    ..."``: the
    distance between the steps 0 and 1 (both one digit, so either alignment gives it)."""
    zero, one = header.find("0"), header.find("1")
    return one - zero if 0 <= zero < one else None


def fold_grid(text: str, width: int = WIDTH) -> str:
    """``text`` with every grid wider than ``width`` folded into blocks of whole cells; lines
    that are not grid rows (titles, notes) are kept as they are."""
    lines = text.split("\n")
    rows = [i for i, line in enumerate(lines) if " | " in line]
    if not rows or max(len(lines[i].rstrip()) for i in rows) <= width:
        return text
    bar = lines[rows[0]].index(" | ") + 3
    period = _period(lines[rows[0]][bar:])
    if period is None or period < 1 or any(lines[i].index(" | ") + 3 != bar for i in rows):
        return text
    per_block = max(1, (width - bar) // period)
    longest = max(len(lines[i]) - bar for i in rows)
    span = per_block * period
    blocks = ["\n".join((lines[i][:bar] + lines[i][bar + start:bar + start + span]).rstrip() for i in rows)
              for start in range(0, longest, span)]
    grid = "\n\n".join(blocks)
    return "\n".join(lines[:rows[0]] + [grid] + lines[rows[-1] + 1:])
