"""The worker × time diagram of a strategy run, as text and as HTML coloured by batch.

Drawn from the run's own scheduled items (the same object the lowering executes).  A cell reads
``f2`` / ``b2`` (direction and stage); in text the batch follows after a colon (``f2:5``), in
HTML it sets the colour.
"""

from __future__ import annotations

import bisect
import html
import math
from fractions import Fraction

from ..trace.fmt import WIDTH, number
from .simulate import StrategyRun

__all__ = ["to_text", "to_html"]

_PALETTE = ("#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
            "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f")


def _columns(run: StrategyRun) -> list[float]:
    """The start time of each column: cells of equal time, the largest unit that divides every
    start and end (so no item shares a cell with another), or — when the times have no such unit
    of reasonable size (costs like 1/3 or 0.1234) — one column per distinct start or end."""
    bounds = sorted({0.0, *(t for i in run.items for t in (i.start, i.end))})
    exact = [Fraction(t).limit_denominator(64) for t in bounds]
    if all(abs(float(f) - t) <= 1e-9 * max(1.0, abs(t)) for f, t in zip(exact, bounds)):
        scale = math.lcm(*(f.denominator for f in exact))
        steps = math.gcd(*(int(f * scale) for f in exact))
        if steps:
            unit = steps / scale
            cells = int(round(bounds[-1] / unit))
            if cells <= max(64, 8 * len(run.items)):
                return [k * unit for k in range(cells)]
    return bounds[:-1]


def _grid(run: StrategyRun) -> tuple[list[float], list[list[tuple[str, int] | None]]]:
    columns = _columns(run)
    grid: list[list[tuple[str, int] | None]] = [[None] * len(columns) for _ in range(run.num_workers)]
    for i in run.items:
        eps = 1e-9 * max(1.0, i.end)
        for c in range(bisect.bisect_left(columns, i.start - eps), bisect.bisect_left(columns, i.end - eps)):
            grid[i.workers.compute][c] = (str(i.work), i.work.batch)
    return columns, grid


def to_text(run: StrategyRun, width: int = WIDTH) -> str:
    """Worker × time: a column per time unit (headed by its start time), ``.`` where a worker idles;
    a diagram wider than ``width`` columns is folded into blocks of whole columns, one under the
    other, each headed by its times, so every line fits."""
    columns, grid = _grid(run)
    times = [number(t) for t in columns]
    cell = max(4, len(f"f{run.num_stages - 1}:{run.num_batches - 1}"), *(len(t) for t in times))
    head = "worker | "
    per_block = max(1, (width - len(head) + 1) // (cell + 1))
    blocks = []
    for first in range(0, max(len(columns), 1), per_block):
        last = first + per_block
        rows = [(head + " ".join(f"{t:<{cell}}" for t in times[first:last])).rstrip()]
        for w, row in enumerate(grid):
            rows.append((f"{w:>6} | " + " ".join(f"{(f'{c[0]}:{c[1]}' if c else '.'):<{cell}}"
                                                 for c in row[first:last])).rstrip())
        blocks.append("\n".join(rows))
    return "\n\n".join(blocks)


def to_html(run: StrategyRun) -> str:
    """A table for notebooks: one row per worker, one column per time unit, colour = batch."""
    _, grid = _grid(run)
    out = ['<table style="border-collapse:collapse;font-family:monospace;font-size:11px">']
    for w, row in enumerate(grid):
        out.append(f"<tr><th style='padding:2px 6px'>worker {w}</th>")
        for c in row:
            if c is None:
                out.append("<td style='border:1px solid #eee;width:22px'></td>")
            else:
                colour = _PALETTE[c[1] % len(_PALETTE)]
                out.append(f"<td title='batch {c[1]}' style='border:1px solid #999;background:{colour};"
                           f"text-align:center;width:22px'>{html.escape(c[0])}</td>")
        out.append("</tr>")
    out.append("</table>")
    return "".join(out)
