"""The facade's ``Request``: a pending non-blocking call, and mpi4py's ways to complete several —
``Waitall``, ``Waitany``, ``Waitsome``, ``Testall``, ``Testany``, ``Testsome``, each with its
lower-case twin that also returns the received objects.

As in MPI, a request completed once (by any of these, or by its own ``Wait`` or ``Test``) is
*inactive* from then on — mpi4py's ``REQUEST_NULL``, which it then compares equal to and which is
false: waiting on it again returns at once with an empty status (source ``ANY_SOURCE``, tag
``ANY_TAG``) and no object; the ``any`` and ``some`` calls skip it, and if every request of the
list is inactive, ``Waitany``/``Testany`` give index ``UNDEFINED`` and ``Waitsome``/``Testsome``
``None``.  A request to or from ``PROC_NULL`` is active until completed and completes at once.
Of several requests that could complete, ``any`` takes the first in list order and ``some`` takes
all of them (MPI allows any choice; MPICH may report fewer).  ``statuses``, as mpi4py fills it:
for the ``all`` calls entry i is request i's, for the ``some`` calls entry k the k-th completed
one's; a shorter list is extended.

``Waitany`` and ``Waitsome`` block in the device's ``wait_any`` (the device protocol): on the
emulator the device sleeps until something that could complete a request wakes it; under MPI it
polls.  Nothing here calls more than that protocol, so this runs on both backends.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .facade_types import Status, _fill, _SPAN

__all__ = ["Request", "REQUEST_NULL", "UNDEFINED"]

UNDEFINED = -32766  # MPI_UNDEFINED (MPICH's and Open MPI's value)


class Request:
    """A pending facade call; ``Wait`` completes it and fills the receive buffer and ``status``."""

    __hash__ = None  # type: ignore[assignment]  # as mpi4py's: compared by state, so not hashable

    def __init__(self, inner: Any, comm: Any, out: np.ndarray | None = None) -> None:
        # inner None: an operation on PROC_NULL, complete at once with nothing (as MPI's)
        self._inner, self._comm, self._out, self._value, self._done = inner, comm, out, None, inner is None
        self._active = True  # not yet completed by a wait or test (mpi4py: not REQUEST_NULL)

    def __bool__(self) -> bool:
        return self._active

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Request):
            return NotImplemented
        return self is other or not self._active and not other._active

    def _ready(self) -> bool:
        """Could this active request complete now without waiting (progress made)?"""
        return self._done or self._inner.test()

    def wait(self, status: Status | None = None) -> Any:
        """Complete the call; the received object (lower-case ``wait``, as mpi4py's)."""
        if not self._active:
            if status is not None:
                status._empty()
            return None
        if not self._done:
            self._value = self._inner.wait()
            self._done = True
            if self._out is not None and self._value is not self._out and isinstance(self._value, np.ndarray):
                _fill(self._out, self._value)
        self._active = False
        if status is not None:
            st = getattr(self._inner, "status", None)
            if self._inner is None:
                status._from_nowhere()
            elif st is not None:
                status.source, status.tag, status.count = (
                    self._comm._local(st.source),
                    st.tag % _SPAN,
                    st.nbytes,
                )
        value, self._value = self._value, None
        return value

    def Wait(self, status: Status | None = None) -> bool:
        """Complete the call (its buffer is filled); True, as mpi4py's ``Request.Wait``."""
        self.wait(status)
        return True

    def test(self, status: Status | None = None) -> tuple[bool, Any]:
        if not self._active or self._ready():
            return True, self.wait(status)
        return False, None

    def Test(self, status: Status | None = None) -> bool:
        return self.test(status)[0]

    # -- several at once ---------------------------------------------------------------------------
    @staticmethod
    def waitall(requests: Sequence["Request"], statuses: list[Status] | None = None) -> list[Any]:
        _extend(statuses, len(requests))
        return [r.wait(None if statuses is None else statuses[i]) for i, r in enumerate(requests)]

    @staticmethod
    def Waitall(requests: Sequence["Request"], statuses: list[Status] | None = None) -> bool:
        Request.waitall(requests, statuses)
        return True

    @staticmethod
    def testall(requests: Sequence["Request"],
                statuses: list[Status] | None = None) -> tuple[bool, list[Any] | None]:
        """Complete every request if every one could complete now (True, their objects); else none (False,
        None)."""
        if all(not r._active or r._ready() for r in requests):
            return True, Request.waitall(requests, statuses)
        _extend(statuses, len(requests))
        return False, None

    @staticmethod
    def Testall(requests: Sequence["Request"], statuses: list[Status] | None = None) -> bool:
        return Request.testall(requests, statuses)[0]

    @staticmethod
    def waitany(requests: Sequence["Request"], status: Status | None = None) -> tuple[int, Any]:
        """Block until one active request completes: (its index, its object); (UNDEFINED, None) if none is
        active."""
        i = _first(requests, block=True)
        if i is None:
            return UNDEFINED, Request._nothing(status)
        return i, requests[i].wait(status)

    @staticmethod
    def Waitany(requests: Sequence["Request"], status: Status | None = None) -> int:
        return Request.waitany(requests, status)[0]

    @staticmethod
    def testany(requests: Sequence["Request"], status: Status | None = None) -> tuple[int, bool, Any]:
        """(index, True, object) of the first active request that could complete now; (UNDEFINED, False, None)
        if none could; (UNDEFINED, True, None) if none is active."""
        if not any(r._active for r in requests):
            return UNDEFINED, True, Request._nothing(status)
        i = _first(requests, block=False)
        return (UNDEFINED, False, None) if i is None else (i, True, requests[i].wait(status))

    @staticmethod
    def Testany(requests: Sequence["Request"], status: Status | None = None) -> tuple[int, bool]:
        return Request.testany(requests, status)[:2]

    @staticmethod
    def waitsome(requests: Sequence["Request"], statuses: list[Status] | None = None
                 ) -> tuple[list[int] | None, list[Any] | None]:
        """Block until at least one active request completes, then complete every one that can:
        (their indices, their objects); (None, None) if none is active."""
        if _first(requests, block=True) is None:
            return None, None
        return Request._some(requests, statuses)

    @staticmethod
    def Waitsome(requests: Sequence["Request"], statuses: list[Status] | None = None) -> list[int] | None:
        return Request.waitsome(requests, statuses)[0]

    @staticmethod
    def testsome(requests: Sequence["Request"], statuses: list[Status] | None = None
                 ) -> tuple[list[int] | None, list[Any] | None]:
        """Complete every active request that can now: (indices, objects), both empty if none could;
        (None, None) if none is active."""
        if not any(r._active for r in requests):
            return None, None
        return Request._some(requests, statuses)

    @staticmethod
    def Testsome(requests: Sequence["Request"], statuses: list[Status] | None = None) -> list[int] | None:
        return Request.testsome(requests, statuses)[0]

    @staticmethod
    def _some(requests: Sequence["Request"], statuses: list[Status] | None) -> tuple[list[int], list[Any]]:
        ready = [i for i, r in enumerate(requests) if r._active and r._ready()]
        _extend(statuses, len(ready))
        return ready, [requests[i].wait(None if statuses is None else statuses[k]) for k,
                       i in enumerate(ready)]

    @staticmethod
    def _nothing(status: Status | None) -> None:
        if status is not None:
            status._empty()


def _extend(statuses: list[Status] | None, n: int) -> None:
    """Grow a caller's ``statuses`` list to ``n`` entries (mpi4py extends it; it never shrinks it)."""
    if statuses is not None:
        statuses.extend(Status() for _ in range(n - len(statuses)))


def _first(requests: Sequence[Request], block: bool) -> int | None:
    """The index of the first active request that could complete now — with ``block``, waiting in
    the device's ``wait_any`` until one can; None if none is active (or, without ``block``, none can)."""
    active = [i for i, r in enumerate(requests) if r._active]
    for i in active:
        if requests[i]._ready():
            return i
    if not block or not active:
        return None
    # none could complete yet, so none is PROC_NULL's (those complete at once): every one has a device request
    k = requests[active[0]]._comm._dev.wait_any([requests[i]._inner for i in active])
    return active[k]


REQUEST_NULL = Request(None, None)
REQUEST_NULL._active = False
