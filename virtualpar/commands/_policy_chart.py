"""``virtualpar policies --png``: the policies side by side, in three panels sharing one row per policy.

1. modelled time of one forward, split into the slowest device's compute (its kernels on the
   roofline) and the rest (its collectives, waiting included), with the closed-form estimate the
   explorer ranks by as a tick;
2. bytes each device sent to the others (the most any device sent);
3. peak memory per device (the most any device held).

A policy that cannot apply on this mesh keeps its row, marked "n/a".  matplotlib is imported here
only, through ``matplotlib.figure.Figure`` on an Agg canvas (no pyplot, no global backend switch).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from ..trace.fmt import nbytes, seconds

__all__ = ["draw"]

_COMPUTE, _COMM, _BYTES, _PEAK, _BAD = "#4c72b0", "#dd8452", "#55a868", "#8172b3", "#c44e52"


def _scaled(values: Sequence[float], units: Sequence[tuple[float, str]]) -> tuple[float, str]:
    """The unit (scale, name) in which the largest value reads between 1 and 1000."""
    top = max(values, default=0.0)
    for scale, name in units:
        if top >= scale:
            return scale, name
    return units[-1]


def draw(rows: Sequence[Any], path: str | os.PathLike[str], title: str) -> str:
    """Draw ``rows`` (:class:`~virtualpar.tensor_parallel.table.PolicyRow`) to ``path`` as PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = len(rows)
    fig = Figure(figsize=(13, 1.6 + 0.42 * max(n, 2)), dpi=120)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3, sharey=True, gridspec_kw={"width_ratios": [1.5, 1, 1]})
    ys = list(range(n))[::-1]  # the first row on top
    ok = [not r.error for r in rows]

    shown = [r for r in rows if not r.error]
    tunit = _scaled([r.modelled_s for r in shown] + [r.modelled_closed_form_s for r in shown],
                    [(1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")])
    ax = axes[0]
    comp = [r.modelled_compute_s / tunit[0] if k else 0.0 for r, k in zip(rows, ok)]
    comm = [r.modelled_comm_s / tunit[0] if k else 0.0 for r, k in zip(rows, ok)]
    ax.barh(ys, comp, color=_COMPUTE, height=0.6, label="compute")
    ax.barh(ys, comm, left=comp, color=_COMM, height=0.6, label="communication")
    est = [(y, r.modelled_closed_form_s / tunit[0]) for y, r, k in zip(ys, rows, ok) if k]
    if est:
        ax.scatter([e for _, e in est], [y for y, _ in est], marker="|", s=260, color="black", zorder=3,
                   label="comm+FLOP estimate")
    for y, r, k, c, m in zip(ys, rows, ok, comp, comm):
        ax.text(c + m, y, f" {seconds(r.modelled_s)}" if k else " n/a", va="center", fontsize=8,
                color="black" if k else _BAD)
    ax.set_xlabel(f"modelled time of one forward [{tunit[1]}]")
    ax.set_title("time: compute + communication", fontsize=10, loc="left")
    ax.legend(loc="lower right", fontsize=7, frameon=False)

    for ax, values, colour, what in (
            (axes[1], [r.bytes_device_to_device for r in rows], _BYTES, "bytes sent per device"),
            (axes[2], [r.peak_bytes_per_device for r in rows], _PEAK, "peak memory per device")):
        unit = _scaled([float(v) for v, k in zip(values, ok) if k],
                       [(2.0 ** 30, "GiB"), (2.0 ** 20, "MiB"), (2.0 ** 10, "KiB"), (1.0, "B")])
        shown = [v / unit[0] if k else 0.0 for v, k in zip(values, ok)]
        ax.barh(ys, shown, color=colour, height=0.6)
        for y, v, s, k in zip(ys, values, shown, ok):
            ax.text(s, y, f" {nbytes(v)}" if k else " n/a", va="center", fontsize=8,
                    color="black" if k else _BAD)
        ax.set_xlabel(f"{what} [{unit[1]}]")
        ax.set_title(what, fontsize=10, loc="left")

    for ax in axes:
        ax.grid(axis="x", linestyle=":", linewidth=0.5)
        ax.set_axisbelow(True)
        top = max((p.get_x() + p.get_width() for p in ax.patches), default=0.0)
        ax.set_xlim(0, (top or 1.0) * 1.3)  # room for the value labels; an all-zero panel still has an axis
        ax.tick_params(axis="y", length=0)
    axes[0].set_yticks(ys)
    axes[0].set_yticklabels([r.policy + ("" if r.correct or r.error else "  (WRONG)") for r in rows],
                            fontsize=9)
    axes[0].set_ylim(-0.7, n - 0.3)
    fig.suptitle(title, x=0.01, ha="left", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return os.fspath(path)
