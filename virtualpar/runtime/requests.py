"""Handles for non-blocking point-to-point ops, with the device's clocks and trace attached.

A ``Request`` wraps the transport's send or receive and, when completed, does the device-level
bookkeeping: the modelled clock (a receive completes at ``max(now, arrival)``, in *program* order,
so modelled time never depends on which process the OS happened to run first), the trace event and
the flight-recorder entry.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # pragma: no cover
    from ..transport.endpoint import RecvRequest, SendRequest
    from .device import VirtualDevice

__all__ = ["Request"]


class Request:
    """A pending ``isend`` or ``irecv``; ``wait()`` completes it (an irecv returns the array)."""

    __slots__ = ("_dev", "_inner", "_kind", "_peer", "_tag", "_wall0", "_model0", "_deadline", "_on_timeout", "_slot", "_done", "_value", "_flow")

    def __init__(
        self,
        dev: "VirtualDevice",
        inner: "SendRequest | RecvRequest",
        kind: str,
        peer: int,
        tag: int,
        deadline: float,
        on_timeout: Callable[[], Exception],
        slot: int | None = None,
        flow: str | None = None,
    ) -> None:
        self._dev = dev
        self._inner = inner
        self._kind = kind  # "send" or "recv"
        self._peer = peer
        self._tag = tag
        self._wall0 = time.monotonic()
        self._model0 = dev.clock
        self._deadline = deadline
        self._on_timeout = on_timeout
        self._slot = slot  # flight-recorder slot of a user-level op; None inside a collective
        self._done = False
        self._value: Any = None
        self._flow = flow

    def __repr__(self) -> str:
        state = "done" if self._done else "pending"
        arrow = "to" if self._kind == "send" else "from"
        return f"<Request {self._kind} {arrow} {self._peer} tag={self._tag} {state}>"

    def test(self) -> bool:
        """Make progress without blocking; True once the op could complete without waiting."""
        if self._done:
            return True
        self._dev._endpoint.progress()
        return self._inner.done

    def wait(self, timeout: float | None = None) -> Any:
        """Block until complete (at most ``timeout`` s, default: what remains of the op's budget)."""
        if self._done:
            return self._value
        left = self._deadline - time.monotonic() if timeout is None else timeout
        dev = self._dev
        try:
            value = self._inner.wait(max(left, 0.0), self._on_timeout)
        except BaseException:
            if self._slot is not None:
                dev._recorder.finish(self._slot, dev.clock, failed=True)
            raise
        self._done = True
        self._value = value
        dev._complete(self._kind, self._peer, self._inner, self._wall0, self._model0, self._flow)
        if self._slot is not None:
            dev._recorder.finish(self._slot, dev.clock)
        return value
