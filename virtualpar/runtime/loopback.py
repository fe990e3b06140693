"""Messages a device sends to itself, as MPI allows (generic ring code at world size 1 needs them).

They never touch a channel: a send to oneself queues a copy (arrays copied, other objects
pickled and unpickled, so the receiver never aliases the sender's object) under its tag, FIFO,
and a receive from oneself takes the oldest one.  ``irecv`` may be posted before the matching
``isend``; a receive from oneself that finds nothing queued when it must complete would wait
forever, so it raises instead.  No bytes are counted and no modelled time is charged: no link is
crossed.  A message still queued when a run ends is reported like any unreceived message
(``pending``), and a reset drops it (``clear``): it never reaches a later run.
"""

from __future__ import annotations

import pickle
from collections import deque
from typing import Any

import numpy as np

from ..errors import UsageError
from ..transport.payload import plain_array

__all__ = ["SelfRequest", "send_to_self", "recv_from_self", "pending", "clear"]


def _copy(x: Any) -> Any:
    if plain_array(x):  # a subclass (a masked array) is pickled, as a message to a peer would be
        return np.array(x, copy=True)
    return pickle.loads(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL))


def _queue(dev: Any, tag: int) -> deque:
    queues = dev.__dict__.setdefault("_loopback", {})
    return queues.setdefault(tag, deque())


def pending(dev: Any) -> list[tuple[int, int, int, str]]:
    """Messages sent to itself and not received, as (src, dst, tag, description)."""
    return [(dev.rank, dev.rank, tag, (f"array{x.shape} {x.dtype}" if isinstance(x, np.ndarray) else "pickled object")
             + " sent to itself") for tag, q in dev.__dict__.get("_loopback", {}).items() for x in q]


def clear(dev: Any) -> None:
    dev.__dict__.pop("_loopback", None)


def send_to_self(dev: Any, x: Any, tag: int) -> None:
    slot = dev._begin_op(*dev._texts.send(x, dev.rank, tag))
    _queue(dev, tag).append(_copy(x))
    dev._recorder.finish(slot, dev.clock)


def recv_from_self(dev: Any, tag: int, out: np.ndarray | None = None) -> Any:
    slot = dev._begin_op(*dev._texts.recv(dev.rank, tag))
    q = _queue(dev, tag)
    if not q:
        dev._recorder.finish(slot, dev.clock, failed=True)
        raise UsageError(f"{dev.name}: recv from itself (tag {tag}) at op #{dev.op_seq} has no message: no send to "
                         "itself with that tag is queued, so it would wait forever", rank=dev.rank, tag=tag)
    value = q.popleft()
    if out is not None:  # the same rule as a message from a peer: no broadcasting, no casting
        if not isinstance(value, np.ndarray) or value.shape != out.shape or value.dtype != out.dtype:
            dev._recorder.finish(slot, dev.clock, failed=True)
            held = f"shape {value.shape} and dtype {value.dtype}" if isinstance(value, np.ndarray) else "a pickled object"
            raise UsageError(f"{dev.name}: recv buffer has shape {tuple(out.shape)} and dtype {out.dtype}, but the "
                             f"message holds {held} (recv from itself, tag {tag})", rank=dev.rank, tag=tag)
        np.copyto(out, value)
        value = out
    dev._recorder.finish(slot, dev.clock)
    return value


class SelfRequest:
    """What ``isend``/``irecv`` to or from oneself return: a send is complete at once; a receive
    takes its message when waited on (so it may be posted before the send)."""

    def __init__(self, dev: Any, kind: str, tag: int, out: np.ndarray | None = None) -> None:
        self._dev, self._kind, self._tag, self._out = dev, kind, tag, out
        self._done = kind == "send"
        self._value: Any = None

    def test(self) -> bool:
        return self._done or bool(_queue(self._dev, self._tag))

    def wait(self, timeout: float | None = None) -> Any:
        if not self._done:
            self._value = recv_from_self(self._dev, self._tag, self._out)
            self._done = True
        return self._value

    def __repr__(self) -> str:
        return f"<Request {self._kind} self tag={self._tag} {'done' if self._done else 'pending'}>"
