"""The worker × time diagram of a strategy run, as text and as HTML coloured by batch.

Drawn from the run's own scheduled items (the same object the lowering executes).  A cell reads
``f2`` / ``b2`` (direction and stage); in text the batch follows after a colon (``f2:5``), in
HTML it sets the colour.
"""

from __future__ import annotations

import html

from .simulate import StrategyRun

__all__ = ["to_text", "to_html"]

_PALETTE = ("#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
            "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f")


def _grid(run: StrategyRun) -> list[list[tuple[str, int] | None]]:
    unit = min((i.end - i.start for i in run.items), default=1.0) or 1.0
    cells = int(round(run.latency / unit))
    grid: list[list[tuple[str, int] | None]] = [[None] * cells for _ in range(run.num_workers)]
    for i in run.items:
        for c in range(int(round(i.start / unit)), int(round(i.end / unit))):
            grid[i.workers.compute][c] = (str(i.work), i.work.batch)
    return grid


def to_text(run: StrategyRun) -> str:
    grid = _grid(run)
    width = max(5, len(f"f{run.num_stages - 1}:{run.num_batches - 1}") + 1)
    head = "worker | " + "".join(f"{t:<{width}}" for t in range(len(grid[0]) if grid else 0))
    rows = [head]
    for w, row in enumerate(grid):
        rows.append(f"{w:>6} | " + "".join(f"{(f'{c[0]}:{c[1]}' if c else '.'):<{width}}" for c in row))
    return "\n".join(rows)


def to_html(run: StrategyRun) -> str:
    """A table for notebooks: one row per worker, one column per time unit, colour = batch."""
    grid = _grid(run)
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
