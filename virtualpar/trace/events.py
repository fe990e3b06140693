"""The event log: the :class:`Trace` that holds one :class:`Event` per thing a device did (``event.py``).

Every event carries two intervals on two clocks:

* ``wall``  -- seconds since the cluster started, measured on this machine;
* ``model`` -- seconds on the virtual hardware (α–β links, FLOPs / peak), as the cost model says.

A device records its events in its own process; the driver merges them into one :class:`Trace`,
which sorts them by ``(rank, model start)`` and hands them to the views (Chrome JSON, a text
timeline, a PNG Gantt chart, a summary with the critical path).

Event kinds (:data:`KINDS`)::

    compute      local work (matmul, add, ...)
    send, recv   one point-to-point message; a matching pair shares a ``flow`` id ("2>5#17"; "2>5#17@1" after
    a reset) collective   a whole collective call; the send/recv events of its algorithm lie inside it
    wait         time spent blocked on something that is not a message (optional)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from numbers import Integral
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from virtualpar._words import plural
from virtualpar.errors import UsageError
from virtualpar.trace.event import KINDS, Event, check_clock

if TYPE_CHECKING:  # the views import this module; import them lazily at call time
    from virtualpar.trace.summary import Summary

__all__ = ["Trace"]

_KIND_SET = frozenset(KINDS)

# At equal intervals the enclosing kind sorts first, so nesting reads outer -> inner.
_NEST_ORDER = {"collective": 0, "wait": 1, "send": 2, "recv": 3, "compute": 4}
_FORMAT = "virtualpar-trace"
_VERSION = 1


def _sort_key(e: Event) -> tuple:
    # Outer events first at equal start (longer first), so an enclosing collective precedes the
    # send/recv nested in it; the remaining fields only make the order total and deterministic.
    return (
        e.rank, e.model_start, -e.model_end, e.wall_start, -e.wall_end,
        _NEST_ORDER[e.kind], e.name, -1 if e.seq is None else e.seq, e.flow or "",
    )


class Trace:
    """An immutable, sorted list of events from every device, with the views on it.

    ``Trace(events, device_names={3: "device 3 (dp=1, tp=1)"})``: events are sorted by
    ``(rank, model start)``, outer before nested at equal start.  Ranks named in ``device_names``
    count as devices even when they recorded nothing (they show as idle rows).
    """

    __slots__ = ("_events", "_names", "_ranks")

    def __init__(self, events: Iterable[Event] = (), device_names: Mapping[int, str] | None = None) -> None:
        evs = list(events)
        for e in evs:
            if not isinstance(e, Event):
                raise UsageError(f"Trace: expected Event objects, got {type(e).__name__}: {e!r}")
        evs.sort(key=_sort_key)
        self._events: tuple[Event, ...] = tuple(evs)
        self._names = MappingProxyType({int(r): str(n) for r, n in (device_names or {}).items()})
        self._ranks = tuple(sorted({e.rank for e in evs} | set(self._names)))

    def __reduce__(self):  # a read-only view of the names does not pickle: rebuild from plain data
        return (Trace, (self._events, dict(self._names)))

    # -- the data -------------------------------------------------------------------------------
    @property
    def events(self) -> tuple[Event, ...]:
        """Every event, sorted by ``(rank, model start)``."""
        return self._events

    @property
    def ranks(self) -> tuple[int, ...]:
        """The sorted ranks of every device (with events or named in ``device_names``)."""
        return self._ranks

    @property
    def device_names(self) -> dict[int, str]:
        """``{rank: label}`` for every device; ``"device {rank}"`` where the runtime gave none."""
        return {r: self.device_name(r) for r in self._ranks}

    def device_name(self, rank: int) -> str:
        """The label of device ``rank``."""
        return self._names.get(rank, f"device {rank}")

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self._events)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        return self._events == other._events and self.device_names == other.device_names

    __hash__ = None  # type: ignore[assignment]  # equal traces compare equal; not meant as keys

    def __repr__(self) -> str:
        return f"Trace({len(self._events)} events on {len(self._ranks)} devices)"

    def by_rank(self) -> dict[int, tuple[Event, ...]]:
        """``{rank: events of that device}`` for every rank (an empty tuple for a silent device)."""
        out: dict[int, list[Event]] = {r: [] for r in self._ranks}
        for e in self._events:
            out[e.rank].append(e)
        return {r: tuple(v) for r, v in out.items()}

    def filter(self, kind: str | Iterable[str] | None = None, rank: int | Iterable[int] | None = None,
               name: str | None = None) -> Trace:
        """The sub-trace of events matching every given criterion (device names are kept)."""
        kinds = None
        if kind is not None:
            kinds = {kind} if isinstance(kind, str) else set(kind)
            bad = sorted(kinds - _KIND_SET)
            if bad:
                raise UsageError(f"Trace.filter: unknown {plural(len(bad), 'kind')} {bad}; "
                                 f"expected some of {KINDS}")
        ranks = None if rank is None else ({int(rank)} if isinstance(rank,
                                                                     Integral) else {int(r) for r in rank})
        kept = [e for e in self._events
                if (kinds is None or e.kind in kinds)
                and (ranks is None or e.rank in ranks)
                and (name is None or e.name == name)]
        return Trace(kept, self._names)

    def bounds(self, clock: str = "model") -> tuple[float, float]:
        """``(earliest start, latest end)`` on ``clock``; ``(0.0, 0.0)`` for an empty trace."""
        check_clock(clock, "Trace.bounds")
        if not self._events:
            return (0.0, 0.0)
        return (min(e.start(clock) for e in self._events), max(e.end(clock) for e in self._events))

    def span(self, clock: str = "model") -> float:
        """The makespan on ``clock``: latest end minus earliest start, in seconds."""
        lo, hi = self.bounds(clock)
        return hi - lo

    # -- the views --------------------------------------------------------------------------------
    def to_chrome(self, clock: str = "model") -> dict[str, Any]:
        """The Chrome trace JSON object (see :func:`virtualpar.trace.chrome.to_chrome`)."""
        from virtualpar.trace.chrome import to_chrome
        return to_chrome(self, clock=clock)

    def write_chrome(self, path: str | os.PathLike[str], clock: str = "model") -> str:
        """Write the Chrome trace JSON to ``path`` (open it in Perfetto or chrome://tracing)."""
        from virtualpar.trace.chrome import write_chrome
        return write_chrome(self, path, clock=clock)

    def to_text(self, clock: str = "model", width: int = 100) -> str:
        """A text timeline, one row per device (see :func:`virtualpar.trace.text.to_text`)."""
        from virtualpar.trace.text import to_text
        return to_text(self, clock=clock, width=width)

    def to_png(self, path: str | os.PathLike[str], clock: str = "model", title: str | None = None,
               flows: bool = True) -> str:
        """A PNG Gantt chart (needs matplotlib: ``pip install virtualpar[viz]``)."""
        from virtualpar.trace.gantt import to_png
        return to_png(self, path, clock=clock, title=title, flows=flows)

    def summary(self, clock: str = "model") -> Summary:
        """Busy / comm / idle time per device, bytes per link and the critical path."""
        from virtualpar.trace.summary import summarize
        return summarize(self, clock=clock)

    # -- raw JSON ---------------------------------------------------------------------------------
    def save_json(self, path: str | os.PathLike[str]) -> str:
        """Write the raw events and device names to ``path`` as JSON; :meth:`load_json` reads it back."""
        doc = {
            "format": _FORMAT,
            "version": _VERSION,
            "device_names": {str(r): n for r, n in sorted(self._names.items())},
            "events": [e.to_dict() for e in self._events],
        }
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=None, separators=(",", ":"))
        return os.fspath(path)

    @classmethod
    def load_json(cls, path: str | os.PathLike[str]) -> Trace:
        """Read a trace written by :meth:`save_json`."""
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
            raise UsageError(f"Trace.load_json: {os.fspath(path)!r} is not a virtualpar trace "
                             f"(expected a JSON object with format={_FORMAT!r})")
        if doc.get("version") != _VERSION:
            raise UsageError(f"Trace.load_json: {os.fspath(path)!r} has version {doc.get('version')!r}; "
                             f"this virtualpar reads version {_VERSION}")
        names = {int(r): n for r, n in doc.get("device_names", {}).items()}
        return cls((Event.from_dict(d) for d in doc["events"]), names)
