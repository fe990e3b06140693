"""The text grid of a pipeline step as it ran: :func:`format_timeline`, from the actions' times;
:class:`Timeline`, that text with the step's :class:`~virtualpar.pipeline.diagram.Diagram` for
``.to_png(path)`` and ``.to_html(path)``."""

from __future__ import annotations

from typing import Callable

from .actions import Action, Schedule
from .diagram import Diagram
from .validate import format_grid

__all__ = ["format_timeline", "Timeline"]


class Timeline(str):
    """What :meth:`PipelinedOperation.timeline` returns: the text grid (a ``str``, printed as
    before) that also draws the step — ``.to_png(path)`` (matplotlib) and ``.to_html(path)`` (a
    self-contained page with inline SVG) — from ``.diagram``, the boxes of the same records, built
    on first use (printing a huge step's text never builds them)."""

    def __new__(cls, text: str, diagram: "Diagram | Callable[[], Diagram]") -> "Timeline":
        obj = super().__new__(cls, text)
        obj._diagram = diagram
        return obj

    @property
    def diagram(self) -> Diagram:
        if not isinstance(self._diagram, Diagram):
            self._diagram = self._diagram()
        return self._diagram

    def to_png(self, path: str, dpi: int = 120) -> str:
        return self.diagram.to_png(path, dpi)

    def to_html(self, path: str | None = None) -> str:
        return self.diagram.to_html(path)


def format_timeline(rows: dict[int, list[tuple[Action, tuple[float, float]]]], compute_only: bool = True,
                    max_cells: int = 60) -> str:
    """Text grid of executed actions, one cell per the shortest compute action (or per 1/max_cells
    of the run when that would be wider).  If two actions of a rank would share a cell (wall-clock
    times vary), the grid orders them instead: one column per distinct start, so every action that
    ran is shown."""
    spans = [(a, s, e) for acts in rows.values() for a, (s, e) in acts if a.is_compute and e > s]
    if not spans:
        return "(nothing ran)"
    t0 = min(s for _, s, _ in spans)
    end = max(e for _, s, e in spans)
    unit = max(min(e - s for _, s, e in spans), (end - t0) / max_cells)
    cells = max(1, int(round((end - t0) / unit)))
    grid: Schedule = {}
    shown = 0
    for p, acts in rows.items():
        line: list[Action | None] = [None] * cells
        for a, (s, e) in acts:
            if compute_only and not a.is_compute:
                continue
            first = min(cells - 1, int((s - t0) / unit))
            if line[first] is not None:
                continue
            for c in range(first, max(first + 1, int(round((e - t0) / unit)))):
                if c < cells and (line[c] is None or c > first):
                    line[c] = a
        grid[p] = line
    for p, line in grid.items():
        shown += len({a for a in line if a is not None})
    wanted = sum(1 for acts in rows.values() for a, _ in acts if a.is_compute or not compute_only)
    if shown < wanted:  # some action would be hidden: lay them out by order of start instead
        # a column per (start, k): the k-th action of a rank to start at that time (one that took
        # no time, a W of cost 0, starts with the next), so no two actions of a rank share a column
        keyed: dict[int, list[tuple[tuple[float, int], Action]]] = {}
        for p, acts in rows.items():
            seen: dict[float, int] = {}
            for a, (s, _) in acts:
                if a.is_compute or not compute_only:
                    keyed.setdefault(p, []).append(((s, seen.get(s, 0)), a))
                    seen[s] = seen.get(s, 0) + 1
        column = {k: i for i, k in enumerate(sorted({k for line in keyed.values() for k, _ in line}))}
        grid = {p: [None] * len(column) for p in rows}
        for p, line in keyed.items():
            for k, a in line:
                grid[p][column[k]] = a
        return "(columns in order of start)\n" + format_grid(_compress(grid))
    return format_grid(grid)


def _compress(grid: Schedule) -> Schedule:
    """Drop columns where no rank does anything."""
    keep = [c for c in range(len(next(iter(grid.values()), []))) if any(line[c] is not None for line in grid.values())]
    return {p: [line[c] for c in keep] for p, line in grid.items()}
