"""One :class:`Event`: a thing a device did, timed on two clocks (see ``events.py`` for the log).

``wall`` is seconds since the cluster started, measured on this machine; ``model`` is seconds on
the virtual hardware.  Events are frozen and JSON-friendly (:func:`jsonable`), so a trace can be
saved, loaded and compared.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from virtualpar.errors import UsageError

__all__ = ["Event", "KINDS", "CLOCKS", "check_clock", "jsonable"]

#: The kinds of event a device records.
KINDS: tuple[str, ...] = ("compute", "send", "recv", "collective", "wait")
#: The two clocks every event is timed on.
CLOCKS: tuple[str, ...] = ("model", "wall")

_KIND_SET = frozenset(KINDS)


def check_clock(clock: str, where: str = "trace") -> str:
    """Return ``clock`` if it is ``"model"`` or ``"wall"``, else raise a ``ValueError`` saying so."""
    if clock == "model" or clock == "wall":
        return clock
    raise UsageError(
        f"{where}: unknown clock {clock!r}; expected one of {CLOCKS} "
        "('model' = modelled time on the virtual hardware, 'wall' = time on this machine)",
        clock=clock,
    )


def jsonable(value: Any) -> Any:
    """Turn ``value`` into plain JSON types: numpy scalars -> Python numbers, tuples/arrays -> lists.

    Anything else that JSON cannot hold becomes its ``str`` so that a view never fails on an odd arg.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [jsonable(v) for v in items]
    if hasattr(value, "tolist"):  # numpy arrays and scalars (np.float32(1).tolist() -> 1.0)
        return jsonable(value.tolist())
    if hasattr(value, "item"):
        return jsonable(value.item())
    return str(value)


def _tupled(value: Any) -> Any:
    """Inverse of :func:`jsonable` for containers: lists back to (hashable) tuples."""
    if isinstance(value, list):
        return tuple(_tupled(v) for v in value)
    return value


@dataclass(frozen=True, slots=True)
class Event:
    """One thing one device did, timed on both clocks (seconds).

    ``peer`` is the other device of a send/recv, ``seq`` the device's op sequence number, ``group``
    the ranks of a collective, ``flow`` an id shared by a send and its matching recv, and ``args``
    extra ``(key, value)`` pairs (a tuple, so that events stay hashable).
    """

    rank: int
    kind: str
    name: str
    wall_start: float
    wall_end: float
    model_start: float
    model_end: float
    nbytes: int = 0
    peer: int | None = None
    seq: int | None = None
    group: tuple[int, ...] | None = None
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    flow: str | None = None
    args: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in _KIND_SET:
            raise UsageError(
                f"Event on rank {self.rank} ({self.name!r}): unknown kind {self.kind!r}; "
                f"expected one of {KINDS}",
                rank=self.rank,
                kind=self.kind,
            )

    def start(self, clock: str = "model") -> float:
        """Start time on ``clock`` ("model" or "wall"), in seconds."""
        if clock == "wall":
            return self.wall_start
        if clock != "model":
            check_clock(clock, "Event.start")  # raises
        return self.model_start

    def end(self, clock: str = "model") -> float:
        """End time on ``clock`` ("model" or "wall"), in seconds."""
        if clock == "wall":
            return self.wall_end
        if clock != "model":
            check_clock(clock, "Event.end")  # raises
        return self.model_end

    def duration(self, clock: str = "model") -> float:
        """``end(clock) - start(clock)`` in seconds."""
        return self.end(clock) - self.start(clock)

    def arg(self, key: str, default: Any = None) -> Any:
        """The value of extra arg ``key``, or ``default``."""
        for k, v in self.args:
            if k == key:
                return v
        return default

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field (``args`` as a list of ``[key, value]`` pairs)."""
        return {f.name: jsonable(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Event:
        """Inverse of :meth:`to_dict` (lists become tuples again)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(f"Event.from_dict: unknown fields {unknown}; expected a "
                             f"subset of {sorted(known)}")
        values = {k: _tupled(v) for k, v in data.items()}
        if "args" in values:
            values["args"] = tuple((str(k), v) for k, v in values["args"])
        return cls(**values)
