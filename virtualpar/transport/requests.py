"""Transport-level send and receive requests: the state of one message in flight.

A small send that fits the ring whole is written while it is posted and gets a :class:`SentRequest`,
already done.  Any other :class:`SendRequest` starts in ``SEND_NEW`` until its header is in the
ring.  An eager message then goes ``SEND_STREAM`` (its payload is copied into the ring) and is done
when the last byte is in; a rendezvous offer goes ``SEND_OFFERED`` (out of the send queue, into its
channel's offer slots) and is done when the receiver answers that it copied the payload, or is
queued again, to be streamed, if the receiver could not read the sender's memory (see
rendezvous.py).

A :class:`RecvRequest` is posted by ``irecv``, or created by the progress engine for a message
nobody has asked for yet (an *unexpected* one, which a later ``irecv`` adopts).

Both only hold state: ``Endpoint`` (``endpoint.py``, ``receiving.py``) moves the bytes, and
``wait()`` runs the endpoint's progress engine until the request is done.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .channel import Header
from .payload import byte_view, check_out

if TYPE_CHECKING:  # pragma: no cover
    from .endpoint import Endpoint

__all__ = ["SendRequest", "SentRequest", "RecvRequest", "SEND_NEW", "SEND_OFFERED", "SEND_STREAM"]

SEND_NEW, SEND_OFFERED, SEND_STREAM = 0, 1, 2  # states of a send


class SendRequest:
    """A message on its way out: complete once every byte is in the ring (or, for a rendezvous,
    once the receiver has copied it)."""

    __slots__ = ("endpoint", "dst", "tag", "kind", "dtype", "shape", "seq", "payload", "view", "nbytes",
                 "padded", "written", "state", "token", "done", "stamp")

    def __init__(self, endpoint: "Endpoint", dst: int, tag: int, kind: int, payload: np.ndarray,
                 view: memoryview, dtype: str, shape: tuple[int, ...], seq: int, stamp: float) -> None:
        self.endpoint = endpoint
        self.dst = dst
        self.tag = tag
        self.kind = kind
        self.dtype = dtype
        self.shape = shape
        self.seq = seq
        self.payload = payload  # keeps the bytes alive (and in place, for a rendezvous) until done
        self.nbytes = view.nbytes
        self.view = view if self.nbytes else None  # the payload's bytes, flat
        self.padded = (self.nbytes + 7) & ~7
        self.written = 0  # payload bytes written to the ring, incl. pad
        self.state = SEND_NEW
        self.token = 0
        self.done = False
        self.stamp = stamp

    def wait(self, timeout: float | None = None, on_timeout: Callable[[], Exception] | None = None) -> None:
        if not self.done:
            self.endpoint.wait(lambda: self.done, timeout, on_timeout, self)
        self.payload = self.view = None  # drop the reference to the caller's buffer

    def __str__(self) -> str:  # what a timeout or abort says it waited for (formatted only then)
        return f"send to {self.dst} (tag {self.tag})"


class SentRequest:
    """A send the eager fast path completed while posting it (its whole frame is in the ring):
    what a :class:`SendRequest` shows once done, without the state of a message in flight."""

    __slots__ = ("dst", "tag", "nbytes", "stamp", "seq")
    done = True

    def __init__(self, dst: int, tag: int, nbytes: int, stamp: float, seq: int) -> None:
        self.dst = dst
        self.tag = tag
        self.nbytes = nbytes
        self.stamp = stamp
        self.seq = seq

    def wait(self, timeout: float | None = None, on_timeout: Callable[[], Exception] | None = None) -> None:
        return None


class RecvRequest:
    """A message on its way in; ``wait()`` returns the array (or object)."""

    __slots__ = ("endpoint", "src", "tag", "out", "out_bytes", "header", "target", "buf", "got", "expect",
                 "done", "value", "error", "claimed", "order", "owed")

    def __init__(self, endpoint: "Endpoint", src: int, tag: int, out: np.ndarray | None = None) -> None:
        self.endpoint = endpoint
        self.src = src
        self.tag = tag
        self.out = out
        # out's bytes, if the payload can land in it directly: taken at post time, off the message's path
        direct = out is not None and out.flags.c_contiguous and out.flags.writeable
        self.out_bytes = byte_view(out) if direct else None
        self.header: Header | None = None
        self.target: np.ndarray | None = None  # where the payload lands (uint8, C-contiguous)
        self.buf: memoryview | None = None  # byte view of target
        self.got = 0
        self.expect = 0  # payload bytes (incl. pad) still to come through the ring
        self.done = False
        self.value: Any = None
        self.error: Exception | None = None
        self.claimed = False  # a receive took the message (a posted one, matched; an unexpected one, adopted)
        self.order = 0  # posting order (posted receives) or arrival order (unexpected messages)
        self.owed = 0  # the number of a message whose sender waits to hear it was taken, once it is in whole

    def __str__(self) -> str:  # what a timeout or abort says it waited for (formatted only then)
        src = "any source" if self.src is None else self.src
        return f"recv from {src} (tag {'any' if self.tag is None or type(self.tag) is range else self.tag})"

    @property
    def nbytes(self) -> int:
        return self.header.nbytes if self.header else 0

    @property
    def stamp(self) -> float:
        return self.header.stamp if self.header else 0.0

    def wait(self, timeout: float | None = None, on_timeout: Callable[[], Exception] | None = None) -> Any:
        if not self.done:
            self.endpoint.wait(lambda: self.done, timeout, on_timeout, self)
        if self.error is not None:
            raise self.error
        if self.out is not None and self.value is not self.out:
            check_out(self.out, self.header)  # an unexpected message adopted by a recv with out=
            np.copyto(self.out, self.value)
            self.value = self.out
        return self.value
