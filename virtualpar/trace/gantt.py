"""A PNG Gantt chart of a trace (needs matplotlib: ``pip install virtualpar[viz]``).

Two rows per device, top to bottom by rank: ``compute`` and ``comm`` (one, ``comm``, when nothing
in the trace computes).  On the comm row a
collective is a full-height pale bar and the send/recv events inside it are thin bars on top of it
(sends in the upper half, recvs in the lower, so overlapping ones both show), so a ring all_reduce
reads as one block striped by its steps.  Each collective has its own pale tint (one per name, in
order of first appearance, listed in the legend) and a thin outline, so back-to-back collectives
read as separate boxes; a box wide enough for its name carries it (``all_reduce``), a narrower one
its initials (``AR``), compute boxes likewise their op name when it is not plain ``compute``.
Optional flow lines join each
send to its matching recv.  Zero-length events get a minimum width of 1/1000 of the span so that
they stay visible.

matplotlib is imported only inside :func:`to_png`, so this module (and virtualpar) imports without
it.  The figure is drawn with ``matplotlib.figure.Figure`` on an Agg canvas rather than through
pyplot: that writes a PNG without touching the process-wide backend (``matplotlib.use("Agg")``
would switch a notebook user's interactive backend) and without pyplot's global figure registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import os

from virtualpar.trace.event import check_clock
from virtualpar.trace.fmt import seconds

if TYPE_CHECKING:  # the views take a Trace; events.Trace's methods call the views
    from virtualpar.trace.events import Trace

__all__ = ["to_png", "figure", "COLOURS", "TINTS"]

#: Bar colour of each event kind.
COLOURS: dict[str, str] = {"compute": "#4c72b0", "send": "#dd8452", "recv": "#55a868",
                           "collective": "#b8a9d9", "wait": "#bbbbbb"}
_MAX_FLOWS = 2000  # beyond this the arrows hide the bars and cost more than they tell
_MAX_LABELS = 400  # box labels drawn at most (beyond, boxes are too many to read their names anyway)
#: Pale tints for collectives, one per collective name in order of first appearance.
TINTS: tuple[str, ...] = ("#c9b8e8", "#f2c9a0", "#a8d8c8", "#f0b8c8", "#c8d8a0", "#b8cce8", "#e8d8a8",
                          "#d0d0d0")
_CHARS_PER_AXIS = 150  # characters of a 7-point label across the whole x axis of a 12-inch figure
_INSTALL_HINT = 'to_png needs matplotlib, which is not installed: pip install "virtualpar[viz]"'


def _unit(span: float) -> tuple[float, str]:
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if span >= scale:
            return scale, unit
    return 1e-9, "ns"


def to_png(trace: Trace, path: str | os.PathLike[str], clock: str = "model", title: str | None = None,
           flows: bool = True, dpi: int = 120) -> str:
    """Draw ``trace`` on ``clock`` as a Gantt chart and write it to ``path`` as PNG; returns the path.

    Raises ``ImportError`` (with the ``pip install "virtualpar[viz]"`` hint) when matplotlib is missing.
    """
    fig = figure(trace, clock, title, flows, dpi)
    fig.savefig(path, format="png")
    return os.fspath(path)


def figure(trace: Trace, clock: str = "model", title: str | None = None, flows: bool = True, dpi: int = 120):
    """The Gantt chart of ``trace`` as a ``matplotlib.figure.Figure`` (shown by a notebook as is)."""
    check_clock(clock, "to_png")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc

    ranks = trace.ranks
    t0, t1 = trace.bounds(clock)
    scale, unit = _unit(t1 - t0)
    extent = (t1 - t0) / scale or 1.0  # a trace of zero-length events still gets an x axis
    min_w = extent / 1000
    per = 2 if any(e.kind == "compute" for e in trace.events) else 1  # no compute at all: no empty rows
    row = {}  # (rank, "compute" | "comm") -> y of the row's centre
    for k, rank in enumerate(ranks):
        base = per * (len(ranks) - 1 - k)  # rank 0 on top
        if per == 2:
            row[(rank, "compute")] = base + 1.0
        row[(rank, "comm")] = float(base)

    fig = Figure(figsize=(12, max(2.5, 0.55 * per * len(ranks) + 1.2)), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    bars: dict[tuple[str, float, float], list[tuple[float, float]]] = {}
    for e in trace.events:
        x = (e.start(clock) - t0) / scale
        w = max(e.duration(clock) / scale, min_w)
        track = "compute" if e.kind == "compute" else "comm"
        # sends in the upper half of the comm row, recvs in the lower: a ring step's overlapping
        # send and recv both stay visible
        height = 0.8 if e.kind in ("compute", "collective") else 0.34
        y = row[(e.rank, track)] + {"send": 0.2, "recv": -0.2}.get(e.kind, 0.0)
        bars.setdefault((e.kind, y, height), []).append((x, w))
    tints = _tints(trace)
    # collectives first so that the send/recv inside them are drawn on top
    order = {"collective": 0, "wait": 1, "compute": 2, "send": 3, "recv": 4}
    for (kind, y, height), spans in sorted(bars.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
        if kind == "collective":
            continue
        ax.broken_barh(spans, (y - height / 2, height), facecolors=COLOURS[kind], edgecolors="black",
                       linewidth=0.3)
    for name, tint in tints.items():
        spans = [((e.start(clock) - t0) / scale, max(e.duration(clock) / scale, min_w)) for e in trace.events
                 if e.kind == "collective" and e.name == name]
        ys = [row[(e.rank, "comm")] for e in trace.events if e.kind == "collective" and e.name == name]
        for y in sorted(set(ys)):
            mine = [sp for sp, yy in zip(spans, ys) if yy == y]
            ax.broken_barh(mine, (y - 0.4, 0.8), facecolors=tint, edgecolors="#555555", linewidth=0.6,
                           zorder=0.5)
    _label_boxes(ax, trace, clock, t0, scale, extent, row, tints)

    if flows:
        sends = {e.flow: e for e in trace.events if e.kind == "send" and e.flow is not None}
        pairs = [(sends[e.flow], e) for e in trace.events
                 if e.kind == "recv" and e.flow in sends][:_MAX_FLOWS]
        for s, r in pairs:
            ax.annotate("", xy=((r.end(clock) - t0) / scale, row[(r.rank, "comm")] - 0.2),
                        xytext=((s.start(clock) - t0) / scale, row[(s.rank, "comm")] + 0.2),
                        arrowprops={"arrowstyle": "->", "color": "#555555", "lw": 0.5, "alpha": 0.6})

    ticks = sorted(row.items(), key=lambda kv: kv[1])
    ax.set_yticks([y for _, y in ticks])
    ax.set_yticklabels([f"{trace.device_name(rank)}: {track}" if per == 2 else trace.device_name(rank)
                        for (rank, track), _ in ticks], fontsize=8)
    ax.set_ylim(-0.8, per * len(ranks) - 0.2 if ranks else 1)
    ax.set_xlim(0, extent * 1.01)
    ax.set_xlabel(f"{clock} time [{unit}]" + (f" from {seconds(t0)}" if t0 else ""))
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    if not len(trace):
        ax.text(0.5, 0.5, "(no events)", ha="center", va="center", transform=ax.transAxes)
    kinds = [k for k in COLOURS if k != "collective" and any(e.kind == k for e in trace.events)]
    handles = [Patch(facecolor=COLOURS[k], edgecolor="black", linewidth=0.3, label=k) for k in kinds]
    handles += [Patch(facecolor=tint, edgecolor="#555555", linewidth=0.6, label=name)
                for name, tint in tints.items()]
    if handles:
        below = -0.6 / max(fig.get_figheight() - 1.2, 0.8)  # ~0.6 inch down: under the x label
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, below), fontsize=8,
                  ncol=min(len(handles), 8), frameon=False)
    ax.set_title(title or f"virtualpar trace ({clock} clock, span {seconds(t1 - t0)})", loc="left")
    fig.tight_layout()
    return fig


def _tints(trace: Trace) -> dict[str, str]:
    """A pale tint per collective name, in order of first appearance (the palette cycles)."""
    names: dict[str, str] = {}
    collectives = [e for e in trace.events if e.kind == "collective"]
    for e in sorted(collectives, key=lambda e: (e.model_start, e.rank)):
        if e.name not in names:
            names[e.name] = TINTS[len(names) % len(TINTS)]
    return names


def _initials(name: str) -> str:
    """``all_reduce`` → ``AR``, ``reduce_scatter`` → ``RS``, ``matmul`` → ``M``."""
    return "".join(part[:1].upper() for part in name.replace("-", "_").split("_") if part)


def _label_boxes(ax, trace: Trace, clock: str, t0: float, scale: float, extent: float, row: dict,
                 tints: dict[str, str]) -> None:
    """Each collective's name on its box (compute boxes' too when not just "compute"): the full
    name when it fits, else its initials, else nothing (the legend still names the tint)."""
    drawn = 0
    for e in trace.events:
        if drawn >= _MAX_LABELS:
            return
        if e.kind not in ("collective", "compute") or e.kind == "compute" and e.name == "compute":
            continue
        room = e.duration(clock) / scale / extent * _CHARS_PER_AXIS
        text = e.name if len(e.name) <= room else _initials(e.name) if len(_initials(e.name)) <= room else ""
        if not text:
            continue
        x = (e.start(clock) - t0 + e.duration(clock) / 2) / scale
        y = row[(e.rank, "compute" if e.kind == "compute" else "comm")]
        back = "#4c72b0" if e.kind == "compute" else tints.get(e.name, "white")
        ax.text(x, y, text, ha="center", va="center", fontsize=7, clip_on=True, zorder=5,
                color="white" if e.kind == "compute" else "black",
                bbox={"boxstyle": "square,pad=0.15", "facecolor": back, "edgecolor": "none", "alpha": 0.9})
        drawn += 1
