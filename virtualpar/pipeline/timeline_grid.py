"""The text grid of a pipeline step as it ran: :func:`format_timeline`, from the actions' times;
:class:`Timeline`, that text with the step's :class:`~virtualpar.pipeline.diagram.Diagram` for
``.to_png(path)`` and ``.to_html(path)``."""

from __future__ import annotations

from typing import Callable

from ..trace.fmt import WIDTH, fit, number, seconds
from ..trace.text import time_axis
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
                    width: int = WIDTH, unit: str = "s") -> str:
    """The text of a step as it ran, every line at most ``width`` columns, every action named once.

    When every start and end falls on a grid of cells as long as the shortest action (unit costs,
    the textbook picture) and no action would hide another, it is the rank × step grid of
    :func:`format_grid`, one cell per step, folded into blocks of steps that fit the width.
    Otherwise time runs along x, scaled to fit: ``cols = width - 7`` columns of ``(t1 - t0) / cols``
    each; an action covers the columns its ``[start, end)`` rounds to (at least one) and is drawn
    as its label followed by ``-`` when it is at least one column longer than the label, else as
    its kind letter (``+`` where several share a column).  Each action whose label is not in the
    grid is named below it, per rank in the order they ran.  Under the grid, a time axis from the
    first compute start (``unit``: ``"s"`` for seconds, else the clock's own unit, e.g. cost
    units).  Transfers (``compute_only=False``) draw ``>`` (send) and ``<`` (receive) in the
    columns compute leaves free.
    """
    shown = {p: sorted(((a, s, e) for a, (s, e) in acts if a.is_compute or not compute_only),
                       key=lambda x: (x[1], x[2])) for p, acts in rows.items()}
    spans = [(s, e) for acts in shown.values() for a, s, e in acts if a.is_compute]
    if not spans:
        return "(nothing ran)"
    t0, t1 = min(s for s, _ in spans), max(e for _, e in spans)
    cells = _on_cells(shown, t0, t1)
    if cells is not None:
        return format_grid(cells, line_width=width)
    return _on_time_axis(shown, t0, t1, width, unit)


def _on_cells(shown: dict[int, list[tuple[Action, float, float]]], t0: float, t1: float,
              most: int = 400) -> Schedule | None:
    """The actions as a grid of equal cells, one per the shortest action, if every start and end
    falls on a cell boundary, there are at most ``most`` cells, and each action gets cells of its
    own (a B of twice F's cost spans two cells: ``0B0 0B0``)."""
    span = t1 - t0
    if span <= 0 or any(not a.is_compute for acts in shown.values() for a, _, _ in acts):
        return None
    cell = min(e - s for acts in shown.values() for _, s, e in acts)
    if cell <= 0 or span / cell > most + 1e-9:
        return None
    n = round(span / cell)
    for acts in shown.values():
        for _, s, e in acts:
            if any(abs((t - t0) / cell - round((t - t0) / cell)) > 1e-9 * n for t in (s, e)):
                return None
    grid: Schedule = {}
    for p, acts in shown.items():
        line: list[Action | None] = [None] * n
        for a, s, e in acts:
            first, last = round((s - t0) / cell), round((e - t0) / cell)
            if last <= first or any(line[c] is not None for c in range(first, last)):
                return None  # an action of no time, or two in one cell: the time axis shows both
            line[first:last] = [a] * (last - first)
        grid[p] = line
    return grid


def _on_time_axis(shown: dict[int, list[tuple[Action, float, float]]], t0: float, t1: float, width: int,
                  unit: str) -> str:
    """The time-axis picture of :func:`format_timeline` (see there)."""
    cols = max(width - 7, 10)  # "   0 |" + grid + "|"
    col = (t1 - t0) / cols or 1.0
    lines, unlabelled = [], {}
    for p, acts in shown.items():
        chars = ["."] * cols
        owner: list[int | None] = [None] * cols
        boxes: list[tuple[Action, int, int]] = []
        for a, s, e in acts:
            if not a.is_compute:
                continue
            first = min(max(round((s - t0) / col), 0), cols - 1)
            last = min(max(round((e - t0) / col) - 1, first), cols - 1)
            free = [c for c in range(first, last + 1) if owner[c] is None]
            if not free:
                chars[first] = "+"
                unlabelled.setdefault(p, []).append(a)
                continue
            c0 = c1 = free[0]
            while c1 + 1 <= last and owner[c1 + 1] is None:
                c1 += 1
            owner[c0:c1 + 1] = [len(boxes)] * (c1 + 1 - c0)
            boxes.append((a, c0, c1))
        for a, c0, c1 in boxes:
            text, room = str(a), c1 - c0 + 1
            if room > len(text):
                chars[c0:c1 + 1] = text + "-" * (room - len(text))
            else:
                if chars[c0] != "+":
                    chars[c0] = a.kind
                chars[c0 + 1:c1 + 1] = "-" * (room - 1)
                unlabelled.setdefault(p, []).append(a)
        for a, s, e in acts:  # transfers, where compute left the column free
            if a.is_compute:
                continue
            first = min(max(round((s - t0) / col), 0), cols - 1)
            for c in range(first, min(max(round((e - t0) / col) - 1, first), cols - 1) + 1):
                if owner[c] is None and chars[c] == ".":
                    chars[c] = ">" if a.kind.startswith("S") else "<"
        lines.append(f"{p:>4} |{''.join(chars)}|")
    label = seconds if unit == "s" else number
    marks, ticks = time_axis(0.0, t1 - t0, cols, label)  # from the step's first compute, as the diagram
    lines += ["     " + marks, ("     " + ticks)[:width]]
    per = seconds(col) if unit == "s" else f"{number(col)} {unit}"
    legend = (f"1 column = {per}; a box is its action's label then '-', or its kind letter when shorter "
              f"than the label ('+': several in one column); '.' idle")
    if any(not a.is_compute for acts in shown.values() for a, _, _ in acts):
        legend += "; > send, < receive"
    lines += fit(legend, width)
    if unlabelled:
        lines += fit("too short for their label, in the order each rank ran them:", width)
        for p in shown:
            if p in unlabelled:
                names = " ".join(str(a) for a in sorted(unlabelled[p], key=_order(shown[p])))
                lines += [f"{p:>4}: {part}" if k == 0 else f"      {part}"
                          for k, part in enumerate(fit(names, width - 6))]
    return "\n".join(lines)


def _order(acts: list[tuple[Action, float, float]]) -> Callable[[Action], int]:
    index = {a: k for k, (a, _, _) in enumerate(acts)}
    return lambda a: index[a]
