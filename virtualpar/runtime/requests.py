"""Handles for non-blocking point-to-point ops, with the device's clocks and trace attached.

A ``Request`` wraps the transport's send or receive and, when completed, does the device-level
bookkeeping: the modelled clock (a receive completes at ``max(now, arrival)``, in *program* order,
so modelled time never depends on which process the OS happened to run first), the trace event and
the flight-recorder entry.

Cost: every op pays for this bookkeeping, so it is kept to the work its result needs: the wall and
modelled start times are read only when tracing (only trace events show them), and the timeout
error of a user-level op is built only if the op actually times out.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from .loopback import would_wait_forever
from .status import ANY_SOURCE

if TYPE_CHECKING:  # pragma: no cover
    from ..transport.requests import RecvRequest, SendRequest
    from .device import VirtualDevice

__all__ = ["Request"]


class Request:
    """A pending ``isend`` or ``irecv``; ``wait()`` completes it (an irecv returns the array).

    ``on_timeout`` builds the exception raised when ``deadline`` passes; None: the device's
    point-to-point timeout error for this op, saying it did not complete within ``budget`` seconds.
    """

    __slots__ = ("_dev", "_inner", "_kind", "_peer", "_tag", "_wall0", "_model0", "_deadline", "_on_timeout", "_slot",
                 "_done", "_value", "_flow", "_budget")

    def __init__(
        self,
        dev: "VirtualDevice",
        inner: "SendRequest | RecvRequest",
        kind: str,
        peer: int,
        tag: int,
        deadline: float,
        on_timeout: Callable[[], Exception] | None,
        slot: int | None = None,
        flow: tuple[int, int, int, int] | None = None,
        budget: float = 0.0,
        wall0: float | None = None,
    ) -> None:
        self._dev = dev
        self._inner = inner
        self._kind = kind  # "send" or "recv"
        self._peer = peer
        self._tag = tag
        if dev._trace:  # only trace events show when an op started (a send: before it was posted)
            self._wall0 = time.monotonic() if wall0 is None else wall0
            self._model0 = dev._clock.now
        else:
            self._wall0 = self._model0 = 0.0
        self._deadline = deadline
        self._on_timeout = on_timeout
        self._slot = slot  # flight-recorder slot of a user-level op; None inside a collective
        self._done = False
        self._value: Any = None
        self._flow = flow
        self._budget = budget

    def __repr__(self) -> str:
        state = "done" if self._done else "pending"
        arrow = "to" if self._kind == "send" else "from"
        return f"<Request {self._kind} {arrow} {self._peer} tag={self._tag} {state}>"

    @property
    def status(self) -> Any:
        """Source, tag and size of a completed receive (:class:`~virtualpar.runtime.status.Status`)."""
        from .status import Status

        return Status().fill(self._inner) if self._kind == "recv" and self._done else None

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
        dev = self._dev
        inner = self._inner
        if inner.done:  # e.g. an eager send, complete once posted: no deadline to compute
            value = dev._await(inner, self._slot, 0.0, None)
        elif self._kind == "recv" and (self._peer == dev.rank or self._peer == ANY_SOURCE and dev.size == 1):
            # only this device could send it, and it waits here
            if self._slot is not None:
                dev._recorder.finish(self._slot, dev._clock.now, failed=True)
            raise would_wait_forever(dev, inner, self._tag)
        else:
            if timeout is not None:  # the wait's own budget, which its timeout error then names (0: poll once)
                self._budget = 0.0 if timeout == 0 else dev._timeout(timeout)
            left = self._deadline - time.monotonic() if timeout is None else self._budget
            value = dev._await(inner, self._slot, max(left, 0.0), self._on_timeout or self._timeout_error)
        self._done = True
        self._value = value
        if self._kind == "send":
            dev._sent(self._peer, inner, self._slot, self._wall0, self._flow)
        else:
            dev._received(self._peer, inner, self._slot, self._wall0, self._model0)
        return value

    def _timeout_error(self) -> Exception:
        what = "send to" if self._kind == "send" else "recv from"
        return self._dev._p2p_error(what, self._peer, self._tag, self._budget)
