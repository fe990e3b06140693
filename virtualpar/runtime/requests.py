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
    from .core import DeviceCore

__all__ = ["Request"]


class Request:
    """A pending ``isend`` or ``irecv``; ``wait()`` completes it (an irecv returns the array).

    ``on_timeout`` builds the exception raised when ``deadline`` passes; None: the device's
    point-to-point timeout error for this op, saying it did not complete within ``budget`` seconds.
    """

    __slots__ = ("_core", "_inner", "_kind", "_peer", "_tag", "_wall0", "_model0", "_deadline", "_on_timeout",
                 "_slot", "_done", "_value", "_flow", "_budget")

    def __init__(
        self,
        core: "DeviceCore",
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
        self._core = core  # the device's (runtime/core.py)
        self._inner = inner
        self._kind = kind  # "send" or "recv"
        self._peer = peer
        self._tag = tag
        if core.trace:  # only trace events show when an op started (a send: before it was posted)
            self._wall0 = time.monotonic() if wall0 is None else wall0
            self._model0 = core.clock.now
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

    @property
    def ready(self) -> bool:
        """Complete, or could complete without waiting, as of the last progress made (none made here)."""
        return self._done or self._inner.done

    def test(self) -> bool:
        """Make progress without blocking; True once the op could complete without waiting."""
        if self._done:
            return True
        self._core.endpoint.progress()
        return self._inner.done

    def wait(self, timeout: float | None = None) -> Any:
        """Block until complete (at most ``timeout`` s, default: what remains of the op's budget)."""
        if self._done:
            return self._value
        core = self._core
        inner = self._inner
        if inner.done:  # e.g. an eager send, complete once posted: no deadline to compute
            value = core.wait(inner, self._slot, 0.0, None)
        elif self._kind == "recv" and (self._peer == core.rank
                                       or self._peer == ANY_SOURCE and core.size == 1):
            # only this device could send it, and it waits here
            if self._slot is not None:
                core.fail(self._slot)
            raise would_wait_forever(core, inner, self._tag)
        else:
            if timeout is not None:  # the wait's own budget, which its timeout error names (0: poll once)
                self._budget = 0.0 if timeout == 0 else core.budget(timeout)
            left = self._deadline - time.monotonic() if timeout is None else self._budget
            value = core.wait(inner, self._slot, max(left, 0.0), self._on_timeout or self._timeout_error)
        self._done = True
        self._value = value
        if self._kind == "send":
            core.sent(self._peer, inner, self._slot, self._wall0, self._flow)
        else:
            core.received(inner, self._slot, self._wall0, self._model0)
        return value

    def _timeout_error(self) -> Exception:
        what = "send to" if self._kind == "send" else "recv from"
        return self._core.p2p_error(what, self._peer, self._tag, self._budget)
