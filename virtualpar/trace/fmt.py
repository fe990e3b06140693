"""The one place that turns numbers into text: time, bytes, rates, counts, and tables that fit.

Every command and every text view (timelines, summaries, policy tables) formats through here, so a
microsecond is spelt ``µs`` everywhere and no raw ``1.6e-05`` or ``np.float64(3.0)`` reaches a
person.  Pure functions, no I/O: the library may format, only ``commands/`` prints.

Rules (each value keeps 4 significant digits, never scientific notation):

* time, seconds → the largest of ``s``, ``ms``, ``µs``, ``ns`` in which it is at least 1
  (``0.0125`` → ``"12.5 ms"``); a value that rounds up to 1000 of a unit moves to the next one
  (``0.99999`` → ``"1 s"``, not ``"1000 ms"``); at or above 1000 s it is whole seconds with
  thousands separators (``"12,346 s"``); below 1 ps it is ``"0 s"`` (float residue of differences);
* bytes → binary units ``B``, ``KiB``, ``MiB``, ``GiB``, ``TiB`` (1 KiB = 1024 B), whole bytes below 1 KiB
  (``1000 KiB`` stays so; what rounds to 1024 of a unit moves up: ``"1 MiB"``);
* rates, bytes per second → decimal ``B/s``, ``kB/s``, ``MB/s``, ``GB/s``, ``TB/s`` (1 GB/s = 1e9 B/s,
  the unit of link datasheets and of the benchmarks);
* counts (FLOPs, elements) → decimal prefixes ``k``, ``M``, ``G``, ``T``, ``P``.

:func:`table` lays out rows in at most ``width`` columns (default :data:`WIDTH` = 100): columns
that would not fit are narrowed by wrapping their cells over several lines, widest first.
"""

from __future__ import annotations

import math
import textwrap
from typing import Any, Iterable, Sequence

__all__ = ["WIDTH", "seconds", "nbytes", "rate", "count", "number", "table", "fit"]

#: Default width of everything printed for a terminal, in columns.
WIDTH = 100

_TIME = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))
_BYTES = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_SI = ("", "k", "M", "G", "T", "P", "E")


def number(x: Any, digits: int = 4) -> str:
    """``x`` with ``digits`` significant digits and no exponent: ``12.35``, ``0.001235``, ``12,346``.
    Integers (and numpy integers) print whole with thousands separators; bools as ``yes``/``no``."""
    if isinstance(x, bool):
        return "yes" if x else "no"
    if hasattr(x, "item") and not isinstance(x, (int, float)):
        x = x.item()  # numpy scalar: no np.float64(...) repr
    if isinstance(x, int):
        return f"{x:,}"
    x = float(x)
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    if abs(x) >= 10 ** digits:
        return f"{x:,.0f}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    text = f"{x:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _scaled(value: float, steps: Sequence[tuple[float, str]], digits: int, base: float = 1000) -> str:
    """``value`` in the largest unit of ``steps`` (scale, name; largest first) where it is >= 1;
    one that rounds up to ``base`` of its unit moves up one unit."""
    a = abs(value)
    for k, (scale, unit) in enumerate(steps):
        if a >= scale or k == len(steps) - 1:
            shown = float(f"{a / scale:.{digits}g}")
            if shown >= base and k > 0:  # 999.99 ms rounds to 1000 ms: say 1 s
                scale, unit = steps[k - 1]
            return f"{number(value / scale, digits)} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover


def seconds(t: float, digits: int = 4) -> str:
    """``t`` seconds, auto-scaled: ``"12.5 ms"``, ``"3 µs"``, ``"2.5 s"``, ``"0 s"`` (see the module doc)."""
    t = float(t)
    if not math.isfinite(t):
        return f"{t} s"
    if abs(t) < 1e-12:
        return "0 s"
    if abs(t) >= 1000:
        return f"{t:,.0f} s"
    return _scaled(t, _TIME, digits)


def nbytes(n: float, digits: int = 4) -> str:
    """``n`` bytes in binary units: ``"512 B"``, ``"1.5 KiB"``, ``"12 MiB"``."""
    n = float(n) if not isinstance(n, int) else n
    if abs(n) < 1024:
        return f"{int(round(n))} B"
    steps = [(1024.0 ** k, u) for k, u in reversed(list(enumerate(_BYTES)))]
    return _scaled(float(n), steps, digits, base=1024)


def rate(bytes_per_second: float, digits: int = 4) -> str:
    """A bandwidth in decimal units: ``"450 MB/s"``, ``"12.5 GB/s"``."""
    r = float(bytes_per_second)
    if r == 0 or not math.isfinite(r):
        return f"{number(r)} B/s"
    steps = [(1000.0 ** k, f"{p}B/s") for k, p in reversed(list(enumerate(_SI[:5])))]
    return _scaled(r, steps, digits)


def count(n: float, unit: str = "", digits: int = 4) -> str:
    """A count with a decimal prefix: ``count(196608, "FLOP")`` → ``"196.6 kFLOP"``; below 1000 as is."""
    x = float(n)
    if abs(x) < 1000:
        text = number(int(x) if x == int(x) else x, digits)
        return f"{text} {unit}" if unit else text
    steps = [(1000.0 ** k, p + unit) for k, p in reversed(list(enumerate(_SI)))]
    text = _scaled(x, steps, digits)
    return text if unit else text.replace(" ", "")


# -- tables ----------------------------------------------------------------------------------------

def _min_width(text: str) -> int:
    """The narrowest a cell may be wrapped to: its longest word, at most 12 (then words break)."""
    return min(12, max((len(w) for w in text.split()), default=1))


def fit(text: str, width: int) -> list[str]:
    """``text`` wrapped into lines of at most ``width`` columns (words kept whole when they fit)."""
    if len(text) <= width:
        return [text]
    return textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]


def table(head: Sequence[str], rows: Iterable[Sequence[Any]], width: int = WIDTH,
          right: Sequence[bool] | None = None, gap: int = 2) -> str:
    """``rows`` under ``head`` as aligned text of at most ``width`` columns per line.

    Cells are ``str`` of what they hold (numbers through :func:`number`).  ``right[i]``: right-align
    column ``i`` (default: columns whose cells all start with a digit).  When the natural widths do
    not fit, the widest column is narrowed one column at a time, down to its longest word (a
    right-aligned cell: down to its whole text, numbers never wrap), and its cells wrap onto further
    lines; if even that does not fit, words break.
    """
    if isinstance(width, bool) or not isinstance(width, int) or width < 20:
        raise ValueError(f"table: width must be an int >= 20 columns, got {width!r}")
    head = [str(h) for h in head]
    cells = [[c if isinstance(c, str) else number(c) for c in row] for row in rows]
    ncol = len(head)
    for row in cells:
        if len(row) != ncol:
            raise ValueError(f"table: a row has {len(row)} cells, the head {ncol}: {row!r}")
    if right is None:
        right = [bool(cells) and all(r[i][:1].isdigit() or r[i][:1] == "-" and r[i][1:2].isdigit()
                                     for r in cells if r[i] not in ("", "-")) for i in range(ncol)]
    widths = [max([len(head[i])] + [len(r[i]) for r in cells]) for i in range(ncol)]
    # a right-aligned (numeric) cell never wraps: "46.31 µs" split over two lines reads as two values
    floors = [max([_min_width(head[i])] + [len(r[i]) if right[i] else _min_width(r[i]) for r in cells])
              for i in range(ncol)]
    budget = width - gap * (ncol - 1)
    for limit in (floors, [3] * ncol):  # first keep words whole, then let them break
        while sum(widths) > budget:
            room = [i for i in range(ncol) if widths[i] > limit[i]]
            if not room:
                break
            i = max(room, key=lambda j: widths[j])
            widths[i] -= 1
    lines: list[str] = []

    def emit(row: Sequence[str], align: Sequence[bool]) -> None:
        parts = [fit(c, w) for c, w in zip(row, widths)]
        for k in range(max(len(p) for p in parts)):
            out = []
            for i, p in enumerate(parts):
                piece = p[k] if k < len(p) else ""
                out.append(piece.rjust(widths[i]) if align[i] else piece.ljust(widths[i]))
            lines.append((" " * gap).join(out).rstrip())

    emit(head, right)
    lines.append((" " * gap).join("-" * w for w in widths))
    for row in cells:
        emit(row, right)
    return "\n".join(lines)
