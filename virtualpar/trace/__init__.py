"""Events recorded by the devices and the views on them.

Every device records :class:`Event` objects timed on two clocks (``wall``: this machine,
``model``: the virtual hardware); the driver merges them into a :class:`Trace`, which renders as

* Chrome trace JSON for Perfetto / chrome://tracing (:func:`to_chrome`, :func:`write_chrome`),
* a text timeline for terminals and error messages, on a time axis, within a width (:func:`to_text`),
* a PNG Gantt chart, each collective named on its boxes (:func:`to_png`, needs
  ``pip install "virtualpar[viz]"``),
* a :class:`Summary`: busy / comm / idle time, bytes per link, the critical path (:func:`summarize`).

Every text view formats through :mod:`virtualpar.trace.fmt` (time in ``s``/``ms``/``µs``/``ns``,
bytes in ``B``/``KiB``/``MiB``, rates in ``GB/s``, tables that fit a width), as do the commands.
Everything here is pure: no processes, no numpy required.
"""

from __future__ import annotations

from virtualpar.trace.chrome import to_chrome, write_chrome
from virtualpar.trace.event import CLOCKS, KINDS, Event, check_clock
from virtualpar.trace.events import Trace
from virtualpar.trace.gantt import to_png
from virtualpar.trace.summary import Summary, critical_path, format_bytes, summarize
from virtualpar.trace.text import format_seconds, to_text

__all__ = [
    "Event",
    "Trace",
    "KINDS",
    "CLOCKS",
    "check_clock",
    "to_chrome",
    "write_chrome",
    "to_text",
    "to_png",
    "Summary",
    "summarize",
    "critical_path",
    "format_seconds",
    "format_bytes",
]
