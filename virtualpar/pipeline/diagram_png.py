"""A :class:`~virtualpar.pipeline.diagram.Diagram` as a PNG (matplotlib, the ``viz`` extra).

The same layout and colours as the SVG (:mod:`.diagram_svg`): ranks as rows from the top, time
along x, boxes coloured by kind and shaded by chunk, labels where they fit, transfers in a thin
lane under each row, the legend under the axis, makespan and bubble in the title.  matplotlib is
imported here only, and drawn through ``matplotlib.figure.Figure`` on an Agg canvas, so the
process-wide backend is untouched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .diagram_labels import fmt_time
from .diagram_svg import COLOURS, legend_entries, plot_width, shade, text_colour, ticks

if TYPE_CHECKING:  # Diagram's methods call this renderer
    from .diagram import Diagram

__all__ = ["to_png", "INSTALL_HINT"]

INSTALL_HINT = "drawing a PNG needs matplotlib, which is not installed: pip install virtualpar[viz]"


def to_png(d: Diagram, path: str, dpi: int = 120) -> str:
    """Write the diagram to ``path`` as a PNG; returns ``path``.  Raises ``ImportError`` naming
    ``pip install virtualpar[viz]`` when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc

    span = d.makespan or 1.0
    lane = 0.16 if any(b.kind == "comm" for b in d.boxes) else 0.0
    # wide enough for the labels of the shortest boxes (8 pt text ~ 7 px per character at 120 dpi)
    width_in = plot_width(d, 7.0 * dpi / 120, 12.9 * dpi, 36 * dpi) / dpi / 0.92
    top_in, bottom_in, rows_in = 0.45, 1.05, min(0.42 * d.ranks * (1 + lane), 20.0)  # <= 20 in of rows
    height_in = top_in + rows_in + bottom_in
    fig = Figure(figsize=(width_in, height_in), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.06, bottom_in / height_in, 0.92, rows_in / height_in))
    pitch = 1.0 + lane
    px_per_unit = width_in * 0.92 * dpi / span
    # one collection per (rank, colour): 65 536 boxes drew in 25 s as single patches, ~1 s as bars
    bars: dict[tuple[int, str, bool], list[tuple[float, float]]] = {}
    t0, thin = d.t0, span * 1e-4
    for b in d.boxes:
        comm = b.kind == "comm"
        fill = COLOURS["comm"] if comm else shade(COLOURS.get(b.kind, "#333333"), b.chunk, d.chunks)
        bars.setdefault((b.rank, fill, comm), []).append((b.start - t0, max(b.end - b.start, thin)))
        w = b.end - b.start
        if not comm and w * px_per_unit >= 7.0 * len(b.label) + 4 and rows_in / d.ranks >= 0.3:
            ax.text(b.start - t0 + w / 2, b.rank * pitch + 0.45, b.label, ha="center", va="center",
                    fontsize=8, color=text_colour(fill))
    for (rank, fill, comm), spans in bars.items():
        y = rank * pitch
        if comm:
            ax.broken_barh(spans, (y + 0.86, lane), facecolors=fill, edgecolor="none")
        else:
            ax.broken_barh(spans, (y + 0.04, 0.8), facecolors=fill, edgecolor="white", linewidth=0.6)
    ax.set_xlim(0, span)
    ax.set_ylim(d.ranks * pitch, -0.1)
    shown = range(0, d.ranks, max(1, -(-d.ranks // 48)))  # a label per row up to 48 rows
    ax.set_yticks([r * pitch + 0.44 for r in shown], [f"{d.row_name} {r}" for r in shown])
    ts = ticks(span)
    ax.set_xticks(ts, [fmt_time(t, d.unit) for t in ts])
    ax.set_xlabel(f"time ({'seconds' if d.unit == 's' else 'cost units'})")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_title(d.heading, fontsize=12, fontweight="bold", loc="left", pad=18 if d.note else 6)
    if d.note:
        ax.text(0, 1.0, d.note, transform=ax.transAxes, fontsize=9, color="#555555", va="bottom",
                ha="left")
    handles = [Patch(facecolor=c, label=t) for c, t in legend_entries(d)]
    fig.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.06, 0.0), ncol=min(len(handles), 8),
               frameon=False, fontsize=9, title=f"gaps are bubbles; {d.label_note}", title_fontsize=8,
               alignment="left")
    fig.savefig(path, format="png")
    return path
