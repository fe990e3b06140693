"""A :class:`~virtualpar.pipeline.diagram.Diagram` as SVG, and as a self-contained HTML page.

No dependency and no external asset: the page is one file with the SVG inline (open it in any
browser, attach it to a report).  Layout: a title line (what ran, makespan, bubble), one row per
rank with its label on the left, compute boxes filling the row, transfers in a thin lane under
it, a time axis, and a legend of the kinds present.  A box shows its label when the label fits;
every box carries a ``<title>`` (the action and its times) that a browser shows on hover.

Colours (also used by the PNG renderer, :data:`COLOURS`) are the Tableau 10 hues, told apart in
print and by most colour-blind readers; a rank's later chunks are drawn darker (ZB-V's and the
interleaved schedule's chunk 1 vs chunk 0).
"""

from __future__ import annotations

import html

from typing import TYPE_CHECKING

from .diagram_labels import KIND_NAMES, fmt_time

if TYPE_CHECKING:  # Diagram's methods call this renderer
    from .diagram import Diagram

__all__ = ["to_svg", "to_html", "COLOURS", "shade", "text_colour", "ticks", "plot_width"]

COLOURS = {"F": "#4e79a7", "B": "#f28e2b", "I": "#59a14f", "W": "#b07aa1", "comm": "#9c9c9c"}

_WIDTH, _LEFT, _RIGHT, _TOP, _ROW, _LANE, _GAP = 1200, 64, 16, 44, 30, 5, 6
_CHAR = 6.6  # px per character of the 11 px label font


def shade(colour: str, chunk: int, chunks: int) -> str:
    """Chunk 0 a light tint of ``colour``, the last chunk the colour itself (one chunk: itself)."""
    if chunks <= 1:
        return colour
    mix = 0.5 * (chunks - 1 - chunk) / (chunks - 1)
    rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * mix):02x}" for c in rgb)


def text_colour(fill: str) -> str:
    """Black on light fills, white on dark ones (relative luminance)."""
    r, g, b = (int(fill[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return "#000000" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.5 else "#ffffff"


def ticks(span: float, target: int = 10) -> list[float]:
    """Round tick positions from 0 to ``span``: steps of 1, 2 or 5 times a power of ten."""
    if span <= 0:
        return [0.0]
    import math

    raw = span / target
    base = 10 ** math.floor(math.log10(raw))
    step = next(m * base for m in (1, 2, 5, 10) if m * base >= raw)
    n = int(span / step + 1e-9)
    return [k * step for k in range(n + 1)]


def plot_width(d: Diagram, char_px: float, low: float, high: float) -> float:
    """Pixels for the time axis: wide enough that the shortest compute box holds the longest
    label (so labels show), within [low, high] (the page scrolls; the PNG stays a sane size)."""
    boxes = [b for b in d.compute if b.end > b.start]
    if not boxes:
        return low
    shortest = min(b.end - b.start for b in boxes)
    longest = max(len(b.label) for b in boxes)
    return max(low, min(high, (char_px * longest + 6) * (d.makespan or 1.0) / shortest))


def to_svg(d: Diagram) -> str:
    """The diagram as one ``<svg>`` element (see the module doc)."""
    span = d.makespan or 1.0
    plot = plot_width(d, _CHAR, _WIDTH - _LEFT - _RIGHT, 3600)
    width = round(plot + _LEFT + _RIGHT)
    # many ranks: thinner rows, so the page stays under ~2400 px tall (labels drop where they do not fit)
    box_h = max(4.0, min(float(_ROW), 2400 / max(d.ranks, 1) - _GAP))
    gap = _GAP if box_h >= 12 else 1
    lane = (_LANE if box_h >= 12 else 0) if any(b.kind == "comm" for b in d.boxes) else 0
    row = box_h + lane
    rows_h = d.ranks * (row + gap)
    every = max(1, -(-d.ranks // 60))  # a rank label on every row up to 60 ranks
    legend_y = _TOP + rows_h + 52
    height = legend_y + 40
    x = lambda t: _LEFT + plot * (t / span)  # noqa: E731 - a local scale
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif">',
           f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
           f'<text x="{_LEFT}" y="24" font-size="15" font-weight="bold">{html.escape(d.heading)}</text>']
    if d.note:
        out.append(f'<text x="{_LEFT}" y="38" font-size="11" fill="#555555">{html.escape(d.note)}</text>')
    for r in range(d.ranks):
        y = _TOP + r * (row + gap)
        out.append(f'<rect x="{_LEFT}" y="{y}" width="{plot}" height="{box_h}" fill="#f4f4f4"/>')
        if r % every == 0:
            out.append(f'<text x="{_LEFT - 8}" y="{y + box_h / 2 + 4}" font-size="12" text-anchor="end">'
                       f'{d.row_name} {r}</text>')
    for t in ticks(span):
        out.append(f'<line x1="{x(t):.2f}" y1="{_TOP - 4}" x2="{x(t):.2f}" y2="{_TOP + rows_h}" '
                   f'stroke="#dddddd" stroke-width="1"/>')
        out.append(f'<text x="{x(t):.2f}" y="{_TOP + rows_h + 14}" font-size="11" text-anchor="middle">'
                   f'{html.escape(fmt_time(t, d.unit))}</text>')
    out.append(f'<text x="{_LEFT + plot / 2}" y="{_TOP + rows_h + 28}" font-size="11" text-anchor="middle">'
               f'time ({"seconds" if d.unit == "s" else "cost units"})</text>')
    for b in d.boxes:
        y = _TOP + b.rank * (row + gap)
        x0, w = x(b.start - d.t0), plot * (b.end - b.start) / span
        tip = html.escape(f"{b.text}: {KIND_NAMES.get(b.kind, b.kind)} of microbatch {b.microbatch}, "
                          f"{fmt_time(b.start, d.unit)} to {fmt_time(b.end, d.unit)}")
        if b.kind == "comm":
            if not lane:
                continue
            out.append(f'<rect x="{x0:.2f}" y="{y + box_h + 1}" '
                       f'width="{max(w, 0.5):.2f}" height="{lane - 1}" '
                       f'fill="{COLOURS["comm"]}"><title>{tip}</title></rect>')
            continue
        fill = shade(COLOURS.get(b.kind, "#333333"), b.chunk, d.chunks)
        out.append(f'<rect x="{x0:.2f}" y="{y}" width="{max(w, 0.5):.2f}" height="{box_h}" fill="{fill}" '
                   f'stroke="#ffffff" stroke-width="0.8"><title>{tip}</title></rect>')
        if w >= _CHAR * len(b.label) + 4 and box_h >= 14:
            out.append(f'<text x="{x0 + w / 2:.2f}" y="{y + box_h / 2 + 4}" font-size="11" '
                       f'text-anchor="middle" fill="{text_colour(fill)}">{html.escape(b.label)}</text>')
    out.append(_legend(d, legend_y))
    out.append("</svg>")
    return "\n".join(out)


def legend_entries(d: Diagram) -> list[tuple[str, str]]:
    """(colour, text) per kind present, and per chunk when a rank holds several."""
    entries = []
    for k in d.kinds:
        if k == "comm" or d.chunks <= 1:
            entries.append((COLOURS[k], f"{k} {KIND_NAMES[k]}" if k != "comm" else "transfer (send/receive)"))
        else:
            entries += [(shade(COLOURS[k], c, d.chunks), f"{k} chunk {c}") for c in range(d.chunks)]
    return entries


def _legend(d: Diagram, y: float) -> str:
    parts, x = ['<g class="legend">'], float(_LEFT)
    for colour, text in legend_entries(d):
        parts.append(f'<rect x="{x:.1f}" y="{y - 11}" width="14" height="14" fill="{colour}"/>')
        parts.append(f'<text x="{x + 19:.1f}" y="{y}" font-size="12">{html.escape(text)}</text>')
        x += 19 + 7.5 * len(text) + 22
    parts.append(f'<text x="{_LEFT}" y="{y + 22}" font-size="12" fill="#555555">gaps are bubbles; '
                 f'{html.escape(d.label_note)}</text>')
    parts.append("</g>")
    return "".join(parts)


def to_html(d: Diagram) -> str:
    """A complete HTML page holding the SVG: no script, no stylesheet, no external asset."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(d.heading)}</title></head>\n"
            "<body style=\"margin:16px;background:#ffffff\">\n"
            f"{to_svg(d)}\n</body></html>\n")
