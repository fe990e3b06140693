"""The requests of ``MPIDevice``'s non-blocking sends and receives (virtualpar/mpi/device.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from ..runtime.status import ANY_SOURCE, ANY_TAG, Status
from .waiting import wait_for

if TYPE_CHECKING:  # pragma: no cover
    from .device import MPIDevice

__all__ = ["SendRequest", "RecvRequest"]


class SendRequest:
    """An ``isend`` under MPI: its header and array in flight; ``wait()`` completes both (or times out)."""

    def __init__(self, dev: "MPIDevice", reqs: list[Any], dst: int, nbytes: int, stamp: float, t0: tuple,
                 tag: int = 0) -> None:
        self._dev, self._reqs, self._dst, self._nbytes, self._stamp, self._t0 = (
            dev,
            reqs,
            dst,
            nbytes,
            stamp,
            t0,
        )
        self._tag, self._done = tag, False

    def wait(self, timeout: float | None = None) -> None:
        if not self._done:
            budget, deadline = self._dev._deadline(timeout)
            wait_for(self.test, deadline,
                     lambda: self._dev._p2p_timeout("send to", self._dst, self._tag, budget))
            if self._done:  # completed inside test(): a message to ourselves it took waited on this send
                return
            self._dev._clock.on_send_done(self._dst, self._nbytes, self._stamp)
            self._dev._record("send", "send", *self._t0, self._nbytes, peer=self._dst)
            self._done = True

    def test(self) -> bool:
        if self._done:
            return True
        if self._dev._posted:  # MPI progresses posted receives while a process tests a send (MPIDevice._wait)
            self._dev._match()
            if self._done:
                return True
        return all(r.Test() for r in self._reqs if not isinstance(r, np.ndarray))


class RecvRequest:
    """An ``irecv`` under MPI, pending on its device until a message is matched to it.  Messages go
    to pending receives as MPI matches them: each to the earliest posted receive whose source and
    tag it fits (a blocking ``recv`` is one posted and waited on at once), whichever request is
    waited on or tested — so two receives of one source and tag get its messages in posting order
    even when the second is waited on first, as on the emulator."""

    def __init__(self, dev: "MPIDevice", src: int, tag: int, out: np.ndarray | None,
                 timeout: float | None) -> None:
        self._dev, self.src, self.tag, self.out, self._timeout = dev, src, tag, out, timeout
        self.which = dict(source=MPI.ANY_SOURCE if src == ANY_SOURCE else src,
                          tag=MPI.ANY_TAG if tag == ANY_TAG else tag)
        self.done, self.value, self.error = False, None, None
        # as on the emulator, the event starts when the receive is posted
        self.t0 = (dev.wall, dev._clock.now)
        self._status = Status()

    def fits(self, source: int, tag: int) -> bool:
        return self.src in (source, ANY_SOURCE) and self.tag in (tag, ANY_TAG)

    @property
    def status(self) -> Status | None:
        """Who sent the message, with which tag and size, once it arrived (as the emulator's)."""
        return self._status if self.done else None

    def wait(self, timeout: float | None = None) -> Any:
        if not self.done:
            self._dev._complete(self, self._timeout if timeout is None else timeout)
        if self.error is not None:  # raised by the receive it belongs to, whichever wait took its message
            raise self.error
        return self.value

    def test(self) -> bool:
        if not self.done:
            self._dev._match()
        return self.done
