"""What every renderer of a schedule diagram writes: the names of the action kinds, and times in
the one spelling of :mod:`virtualpar.trace.fmt` (the box model, :mod:`.diagram`, and its
renderers, :mod:`.diagram_svg` and :mod:`.diagram_png`, all read them from here)."""

from __future__ import annotations

from ..trace.fmt import number, seconds

__all__ = ["KIND_NAMES", "fmt_time"]

KIND_NAMES = {"F": "forward", "B": "backward", "I": "backward (input)", "W": "backward (weights)",
              "comm": "transfer"}


def fmt_time(t: float, unit: str) -> str:
    """``t`` for a title or a tick, in the one spelling of :mod:`virtualpar.trace.fmt`: seconds
    scaled to s/ms/µs/ns (``"46.3 µs"``) when ``unit`` is ``"s"``, else a plain number of model units."""
    return seconds(t) if unit == "s" else number(t)
